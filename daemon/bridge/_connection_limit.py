"""``--max-connections``: refusing connections as they are accepted. Trio shell around
:class:`daemon.core.admission.ConnectionGate`.

``daemon.sockets`` asks :func:`admit` about every connection Hypercorn accepts, before Hypercorn
reads a byte of it. Under the cap it is served. Over the cap it never reaches Hypercorn: it is
answered ``503 connection_limit`` with ``Connection: close`` and ``Retry-After`` (no request
read), read off and discarded until its peer closes (so the answer is not lost to a reset) for
at most :data:`LINGER_S`, then closed (at once with too many being refused already); an
established connection is never touched. One
exception keeps a loopback health probe working at the cap: a loopback connection whose first
bytes (peeked, not consumed) are ``GET /health`` is served in a reserve slot, which the server
closes after that answer (the ASGI layer adds ``Connection: close``) or after
:data:`RESERVE_LIFETIME_S` at most. Refusals are logged one line a minute at most, with a count.
"""

from __future__ import annotations

import logging
import socket
import struct
from typing import Any

import trio

from sdk.protocol.http import ErrorBody

from ..core.admission import Admission, ConnectionGate, asks_for_health, is_loopback_peer
from ..core.json_codec import encode_json
from ..core.throttle import LogThrottle

log = logging.getLogger("daemon.connection_limit")

LINGER_S = 1.0  # a refused connection is read off this long at most before it is closed
DRAIN_BYTES = 64 * 1024  # and this many of its bytes at most
PEEK_S = 1.0  # how long a loopback connection over the cap gets to send its request line
PEEK_POLL_S = 0.01  # between peeks at a request line that is still a prefix of /health
RESERVE_LIFETIME_S = 5.0
RETRY_AFTER_S = 1
LOG_INTERVAL_S = 60.0

gate = ConnectionGate()
_refusals = LogThrottle(LOG_INTERVAL_S)
_refusal_bytes = b""


def configure(cap: int) -> None:
    """Set the cap (0: none). Called by ``daemon.server`` before it serves anything."""
    global _refusal_bytes
    gate.cap = cap
    body = encode_json(ErrorBody(error=f"Too many connections (the daemon serves {cap} at most)",
                                 code="connection_limit", limit=cap))
    _refusal_bytes = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
                      b"connection: close\r\nretry-after: %d\r\ncontent-length: %d\r\n\r\n"
                      % (RETRY_AFTER_S, len(body))) + body


def _note_refusal(peer: str) -> None:
    count = _refusals.note(trio.current_time())
    if count is not None:
        _log_refusals(count, peer)


def _log_refusals(count: int, peer: str | None) -> None:
    log.warning("event=connections_refused count=%d total=%d limit=%d open=%d last_peer=%s",
                count, gate.refused, gate.cap, gate.served, peer or "-")


async def report_refusals() -> None:
    """Log the refusals not logged yet, once a minute at most (runs for the daemon's life)."""
    while True:
        await trio.sleep(LOG_INTERVAL_S)
        count = _refusals.flush(trio.current_time())
        if count is not None:
            _log_refusals(count, None)


def _peer(sock: Any) -> tuple[str, str]:
    """(host, "host:port") of the connection's peer; ("", "?") when it is already gone."""
    try:
        name = sock.getpeername()
    except OSError:
        return "", "?"
    return str(name[0]), f"{name[0]}:{name[1]}"


async def admit(stream: Any, sock: Any) -> bool | None:
    """Decide on a connection just accepted: ``False`` serve it, ``True`` serve it in the
    reserve slot, ``None`` it was refused (and is closed). Call :func:`leave` with the answer
    when a connection served ends."""
    if gate.cap == 0 or sock is None:
        gate.enter()
        return False
    host, peer = _peer(sock)
    decision = gate.admit(is_loopback_peer(host))
    if decision is Admission.PEEK:
        decision = gate.after_peek(await _asks_for_health(sock))
    if decision is Admission.SERVE:
        gate.enter()
        return False
    if decision is Admission.RESERVE:
        gate.enter(reserve=True)
        return True
    if decision is Admission.DROP:
        _note_refusal(peer)
        _reset(sock)
        await stream.aclose()
        return None
    gate.hold()
    try:
        await _refuse(stream, sock)
    finally:
        gate.release()
        _note_refusal(peer)
    return None


def leave(reserve: bool) -> None:
    gate.leave(reserve)


async def serve_reserved(run: Any, sock: Any) -> None:
    """Run the server on a reserve connection, cut after :data:`RESERVE_LIFETIME_S` at most."""

    async def expire() -> None:
        await trio.sleep(RESERVE_LIFETIME_S)
        try:
            sock.shutdown(socket.SHUT_RDWR)  # the server's reads end and it closes the socket
        except OSError:
            pass

    async with trio.open_nursery() as nursery:
        nursery.start_soon(expire)
        await run()
        nursery.cancel_scope.cancel()


async def _asks_for_health(sock: Any) -> bool:
    """Peek at the connection's first bytes (they stay for the server to read) until they tell
    whether it is a ``GET /health``, for :data:`PEEK_S` at most."""
    with trio.move_on_after(PEEK_S):
        while True:
            try:
                head = await sock.recv(64, socket.MSG_PEEK)
            except OSError:
                return False
            if not head:
                return False
            answer = asks_for_health(head)
            if answer is not None:
                return answer
            await trio.sleep(PEEK_POLL_S)  # more of the line is on its way: peeking again
    return False


async def _refuse(stream: Any, sock: Any) -> None:
    """Answer 503 without reading the request, then read off what the peer sends until it
    closes (bounded), so the answer reaches it rather than a reset; then close."""
    clean = False
    with trio.move_on_after(LINGER_S):
        try:
            await stream.send_all(_refusal_bytes)
            await stream.send_eof()
            drained = 0
            while drained < DRAIN_BYTES:
                data = await stream.receive_some(16384)
                if not data:
                    clean = True
                    break
                drained += len(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, AttributeError):
            pass
    if not clean:
        _reset(sock)
    with trio.CancelScope(shield=True):
        await stream.aclose()


def _reset(sock: Any) -> None:
    """Close with a reset rather than linger: nothing of the connection stays behind."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
