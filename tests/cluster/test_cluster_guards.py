"""The pure rules behind cluster mode's fault handling (daemon/core/cluster_lease.py,
cluster_auth.py, cluster_identity.py), without Redis or a clock: when a node is sure it owns a
session, the grace after Redis comes back, the signature of forwarded requests, and who holds
a node id."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from daemon.core.cluster_auth import (
    MAX_SKEW_MS,
    NonceWindow,
    parse,
    sign,
    verify,
)
from daemon.core.cluster_identity import Holder, join_result, refusal
from daemon.core.cluster_lease import GRACE_LEASES, LEASE_SAFETY, LeaseClock, RedisLink

KEY = b"k" * 32


def test_the_lease_clock_trusts_a_confirmed_lease_a_little_less_than_the_lease() -> None:
    clock = LeaseClock(10.0)
    assert not clock.valid("s", 0.0)  # never confirmed: not this node's
    clock.confirmed("s", 100.0)
    assert clock.valid("s", 100.0)
    assert clock.valid("s", 100.0 + 10 * LEASE_SAFETY - 0.001)
    assert not clock.valid("s", 100.0 + 10 * LEASE_SAFETY)  # in doubt from here
    assert clock.remaining("s", 105.0) == pytest.approx(10 * LEASE_SAFETY - 5)
    clock.confirmed("s", 99.0)  # an older renewal answered late: changes nothing
    assert not clock.valid("s", 100.0 + 10 * LEASE_SAFETY)
    clock.confirmed("s", 120.0)
    assert clock.valid("s", 125.0)
    clock.forget("s")
    assert not clock.valid("s", 125.0) and clock.remaining("s", 125.0) == 0


def test_the_grace_starts_when_redis_answers_after_a_failure() -> None:
    link = RedisLink(2.0)
    assert link.up and not link.in_grace(0.0)
    assert not link.answered(1.0)  # no outage: no grace
    assert not link.in_grace(1.0)
    assert link.failed(5.0)  # an outage starts
    assert not link.failed(6.0)  # still the same outage
    assert not link.up and link.failures == 2
    assert not link.in_grace(6.5)  # no grace while Redis is away
    assert link.answered(9.0)  # back: the grace starts
    assert link.up
    assert link.in_grace(9.0) and link.in_grace(9.0 + 2.0 * GRACE_LEASES - 0.01)
    assert link.grace_left(10.0) == pytest.approx(2.0 * GRACE_LEASES - 1.0)
    assert not link.in_grace(9.0 + 2.0 * GRACE_LEASES)
    assert link.grace_left(100.0) == 0.0


def _signed(method: str = "POST", target: str = "/session/s/prompt?x=1", node: str = "A",
            at: int = 1_000_000, nonce: str = "abcdef0123456789", body: bytes = b"{}") -> str:
    return sign(KEY, method, target, node, at, nonce, body)


def test_a_signed_forward_verifies_once() -> None:
    nonces = NonceWindow()
    header = _signed()
    assert verify(KEY, "POST", "/session/s/prompt?x=1", "A", header, b"{}", 1_000_500,
                  nonces) is None
    # The very same request again (recorded, replayed): refused.
    assert verify(KEY, "POST", "/session/s/prompt?x=1", "A", header, b"{}", 1_000_600,
                  nonces) == "replay"


@pytest.mark.parametrize(("change", "why"), [
    ({"method": "GET"}, "signature"),
    ({"target": "/session/s/prompt?x=2"}, "signature"),
    ({"target": "/session/t/prompt?x=1"}, "signature"),
    ({"node": "B"}, "signature"),
    ({"body": b'{"prompt": []}'}, "signature"),
    ({"key": b"another cluster's secret"}, "signature"),
    ({"now": 1_000_000 + MAX_SKEW_MS + 1}, "skew"),
    ({"now": 1_000_000 - MAX_SKEW_MS - 1}, "skew"),
])
def test_anything_changed_is_refused(change: dict[str, object], why: str) -> None:
    header = _signed()
    args = {"key": KEY, "method": "POST", "target": "/session/s/prompt?x=1", "node": "A",
            "body": b"{}", "now": 1_000_000, **change}
    assert verify(args["key"], args["method"], args["target"], args["node"],  # type: ignore[arg-type]
                  header, args["body"], args["now"], NonceWindow()) == why  # type: ignore[arg-type]


@pytest.mark.parametrize("header", [
    "", "1", "t=1", "t=x,n=abcdefgh,s=" + "0" * 64, "t=1,n=short,s=" + "0" * 64,
    "t=1,n=abcdefgh,s=00", "t=1,t=2,n=abcdefgh,s=" + "0" * 64, "t=1,n=abc-defgh,s=" + "0" * 64,
])
def test_a_malformed_signature_is_refused(header: str) -> None:
    assert parse(header) is None
    assert verify(KEY, "POST", "/x", "A", header, b"", 1, NonceWindow()) == "malformed"


@given(st.binary(max_size=64), st.text(max_size=40), st.integers(0, 2**41))
def test_sign_and_verify_round_trip(body: bytes, target: str, at: int) -> None:
    header = sign(KEY, "PUT", target, "node-1", at, "0123456789abcdef", body)
    assert verify(KEY, "PUT", target, "node-1", header, body, at, NonceWindow()) is None


def test_the_nonce_window_forgets_old_nonces_and_is_bounded() -> None:
    window = NonceWindow(window_ms=100, limit=2)
    assert window.add("a", 0) and not window.add("a", 50)
    assert window.add("b", 60)
    assert not window.add("c", 70)  # full: refused rather than grown
    assert window.add("a", 100)  # "a" is older than the window now: forgotten
    assert window.add("c", 161)  # "b" left too


def test_who_holds_a_node_id() -> None:
    assert join_result([1]) is None
    holder = join_result([0, b"http://h:1", b"inst1", b"7"])
    assert holder == Holder("http://h:1", "inst1", "7")
    line = refusal("A", holder)
    assert "'A'" in line and "http://h:1" in line and "\n" not in line
