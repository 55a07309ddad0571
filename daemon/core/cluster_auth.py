"""Node-to-node requests carry proof: an HMAC-SHA256, keyed with the cluster secret, over the
request's method, target (path and query), the sending node, a timestamp, a nonce and the hash
of its body. Pure: the shell passes the time in.

A node answers a request for a session it does not run by forwarding it to the owner; the owner
must not forward it again (a stale directory would bounce it between nodes) and must be able to
tell such a request from a client's, since a forwarded request is served without the routing
checks a client's gets. The header alone proves nothing (any client can send it), so the
forwarder signs: ``X-Turnkeeper-Forwarded: <sending node id>`` and ``X-Turnkeeper-Signature:
t=<unix ms>,n=<nonce>,s=<hex HMAC>``. The receiver accepts it when the HMAC matches, the
timestamp is within :data:`MAX_SKEW_MS` of its own clock and the nonce was not seen in that
window (:class:`NonceWindow`), so a recorded request cannot be replayed either. Anything else is
a client's request, routed as one.

Headers other than these are not signed: they are carried through unchanged (the client's
``Authorization``, checked again by the owner's guard, ``X-Qwen-Client-Id``,
``Idempotency-Key``, ...).
"""

from __future__ import annotations

import hashlib
import hmac
from collections import deque
from dataclasses import dataclass, field
from typing import Final

from sdk.protocol import headers

# The headers' names as ASGI hands them over (lower-case).
FORWARDED_HEADER: Final = headers.lower(headers.CLUSTER_FORWARDED)
SIGNATURE_HEADER: Final = headers.lower(headers.CLUSTER_SIGNATURE)
# How far the sender's clock may be from the receiver's (and how long a nonce is remembered).
MAX_SKEW_MS: Final = 30_000
# The shortest cluster secret accepted (16 bytes of entropy as hex is 32 characters; a
# passphrase shorter than this is too easy to guess offline from one signed request).
MIN_SECRET_CHARS: Final = 16
# At most this many nonces are remembered (a flood of valid requests beyond it within the
# window is refused rather than let the memory grow).
MAX_NONCES: Final = 100_000


def _message(method: str, target: str, node_id: str, at_ms: int, nonce: str,
             body: bytes) -> bytes:
    digest = hashlib.sha256(body).hexdigest()
    return "\n".join((method.upper(), target, node_id, str(at_ms), nonce, digest)).encode()


def sign(secret: bytes, method: str, target: str, node_id: str, at_ms: int, nonce: str,
         body: bytes) -> str:
    """The ``X-Turnkeeper-Signature`` value of a request forwarded by ``node_id``."""
    mac = hmac.new(secret, _message(method, target, node_id, at_ms, nonce, body),
                   hashlib.sha256).hexdigest()
    return f"t={at_ms},n={nonce},s={mac}"


@dataclass(frozen=True, slots=True)
class Signed:
    """A signature header's parts."""

    at_ms: int
    nonce: str
    mac: str


def parse(value: str) -> Signed | None:
    parts: dict[str, str] = {}
    for item in value.split(","):
        key, sep, val = item.strip().partition("=")
        if not sep or key in parts:
            return None
        parts[key] = val
    try:
        at_ms = int(parts["t"])
        nonce, mac = parts["n"], parts["s"]
    except (KeyError, ValueError):
        return None
    if not (8 <= len(nonce) <= 64 and nonce.isalnum() and len(mac) == 64):
        return None
    return Signed(at_ms, nonce, mac)


@dataclass
class NonceWindow:
    """The nonces of accepted signatures, each remembered for ``window_ms`` (a signature is
    only valid that long anyway, so older ones need not be remembered)."""

    window_ms: int = MAX_SKEW_MS * 2
    limit: int = MAX_NONCES
    _seen: set[str] = field(default_factory=set)
    _order: deque[tuple[int, str]] = field(default_factory=deque)

    def add(self, nonce: str, now_ms: int) -> bool:
        """Remember ``nonce``; False if it was seen within the window (a replay) or the
        window is full."""
        order = self._order
        while order and order[0][0] <= now_ms - self.window_ms:
            self._seen.discard(order.popleft()[1])
        if nonce in self._seen or len(self._seen) >= self.limit:
            return False
        self._seen.add(nonce)
        order.append((now_ms, nonce))
        return True


def verify(secret: bytes, method: str, target: str, node_id: str, header: str, body: bytes,
           now_ms: int, nonces: NonceWindow) -> str | None:
    """``None`` when the request is a genuine forward from ``node_id``; else why not (a word
    for the log: ``malformed``, ``skew``, ``signature``, ``replay``)."""
    signed = parse(header)
    if signed is None:
        return "malformed"
    if abs(now_ms - signed.at_ms) > MAX_SKEW_MS:
        return "skew"
    want = hmac.new(secret, _message(method, target, node_id, signed.at_ms, signed.nonce, body),
                    hashlib.sha256).hexdigest()
    if not hmac.compare_digest(want, signed.mac):
        return "signature"
    if not nonces.add(signed.nonce, now_ms):
        return "replay"
    return None
