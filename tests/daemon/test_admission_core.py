"""The ``--max-connections`` rules (``daemon.core.admission``) and the log throttle's flush,
without a server."""

from __future__ import annotations

import pytest

from daemon.core.admission import (
    MAX_PENDING,
    RESERVE_SLOTS,
    Admission,
    ConnectionGate,
    asks_for_health,
    is_loopback_peer,
)
from daemon.core.throttle import LogThrottle


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.8.9.10", True), ("::1", True), ("::ffff:127.0.0.1", True),
    ("10.0.0.1", False), ("::ffff:10.0.0.1", False), ("fe80::1%eth0", False),
    ("192.168.1.5", False), ("", False), ("not an address", False),
])
def test_loopback_peers(host: str, loopback: bool) -> None:
    assert is_loopback_peer(host) is loopback


@pytest.mark.parametrize(("head", "answer"), [
    (b"GET /health HTTP/1.1\r\n", True), (b"GET /health?x=1 HTTP/1.1", True),
    (b"GET /health ", True), (b"", None), (b"G", None), (b"GET /heal", None),
    (b"GET /health", None), (b"GET /healthz HTTP/1.1", False), (b"POST /health", False),
    (b"GET /session/x/events", False), (b"get /health ", False), (b"PRI * HTTP/2.0", False),
])
def test_health_request_lines(head: bytes, answer: bool | None) -> None:
    assert asks_for_health(head) is answer


def test_no_cap_serves_everything() -> None:
    gate = ConnectionGate(0)
    for _ in range(5000):
        assert gate.admit(loopback=False) is Admission.SERVE
        gate.enter()
    assert gate.refused == 0


def test_at_the_cap_loopback_is_peeked_and_others_refused() -> None:
    gate = ConnectionGate(2)
    for _ in range(2):
        assert gate.admit(loopback=False) is Admission.SERVE
        gate.enter()
    assert gate.admit(loopback=False) is Admission.REFUSE
    assert gate.admit(loopback=True) is Admission.PEEK
    assert gate.after_peek(health=False) is Admission.REFUSE
    for _ in range(RESERVE_SLOTS):
        assert gate.after_peek(health=True) is Admission.RESERVE
        gate.enter(reserve=True)
    assert gate.after_peek(health=True) is Admission.REFUSE  # the reserve is full
    gate.leave(reserve=True)
    assert gate.after_peek(health=True) is Admission.RESERVE
    gate.leave()  # a served connection ended: the next one is served, peeked or not
    assert gate.admit(loopback=False) is Admission.SERVE
    assert gate.after_peek(health=False) is Admission.SERVE


def test_refusals_under_way_are_bounded() -> None:
    gate = ConnectionGate(1)
    gate.enter()
    for _ in range(MAX_PENDING):
        assert gate.admit(loopback=False) is Admission.REFUSE
        gate.hold()
    assert gate.admit(loopback=False) is Admission.DROP
    assert gate.after_peek(health=False) is Admission.DROP
    assert gate.refused == 2  # the two dropped
    gate.release()
    assert gate.refused == 3 and gate.pending == MAX_PENDING - 1
    assert gate.admit(loopback=False) is Admission.REFUSE


def test_log_throttle_flush_reports_the_tail_of_a_burst() -> None:
    throttle = LogThrottle(60)
    assert throttle.flush(0) is None  # nothing happened
    assert throttle.note(0) == 1  # the first is logged at once
    assert throttle.note(1) is None and throttle.note(2) is None
    assert throttle.flush(30) is None  # within the interval of the last line
    assert throttle.flush(61) == 2  # the two suppressed, a minute on
    assert throttle.flush(200) is None  # nothing new
    assert throttle.note(201) == 1
    assert throttle.total == 4
