"""What a WebSocket client may send: uncompressed messages of a few KiB, nothing else.

The daemon's WebSockets carry events one way; a client's only useful frames are control frames
(close, ping, pong). Hypercorn as shipped would agree to ``permessage-deflate`` and inflate each
client frame in full before checking its 16 MiB message cap, then keep buffering a message past
that cap (an 1 MiB frame inflating to 1 GiB added ~1 GiB of RSS), and it parks unfinished
fragments up to that cap on every connection. This module makes its WebSocket stream:

- agree to no extension, so a compressed frame (RSV1 set) is a protocol error: the connection is
  closed with 1002 before any of its payload is inflated, or even read past its header;
- cap a client message, fragments included, at :data:`MAX_CLIENT_MESSAGE_BYTES` (Hypercorn's
  ``websocket_max_message_size``, set by ``daemon.server``): past it the connection is closed
  with 1009 and the partial message dropped at once, and nothing more it sends is read.

Each refusal is logged, one line a minute at most with a count (a client can cause them at
will). Installed by :mod:`daemon.server_patches`, which checks Hypercorn's shape first.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from ..core.throttle import LogThrottle

log = logging.getLogger("daemon.ws_limits")

#: The largest message a WebSocket client may send (fragments of one message add up).
MAX_CLIENT_MESSAGE_BYTES = 4096
REFUSAL_LOG_INTERVAL_S = 60.0

CLOSE_PROTOCOL_ERROR = 1002
CLOSE_MESSAGE_TOO_BIG = 1009

_refusals = LogThrottle(REFUSAL_LOG_INTERVAL_S)
_installed = False


def installed() -> bool:
    """Whether the limits are active (then no WebSocket ever has an extension agreed)."""
    return _installed


def refusals() -> int:
    """WebSocket connections closed for what their client sent, since the daemon started."""
    return _refusals.total


def _log_refusal(stream: Any, reason: str, code: int) -> None:
    count = _refusals.note(time.monotonic())
    if count is not None:
        client = stream.client or ("?", 0)
        log.warning("event=ws_client_refused reason=%s close_code=%d count=%d total=%d "
                    "max_message_bytes=%d last_peer=%s", reason, code, count, _refusals.total,
                    MAX_CLIENT_MESSAGE_BYTES, f"{client[0]}:{client[1]}")


def install() -> bool:
    """Patch Hypercorn's WebSocket handshake and event handling (idempotent); returns whether
    the limits are active. ``daemon.server_patches`` has checked the shape first."""
    global _installed
    if _installed:
        return True
    try:
        from hypercorn.protocol import ws_stream
        from hypercorn.protocol.events import StreamClosed
        from wsproto.connection import ConnectionState
        from wsproto.events import CloseConnection, Message, Ping
    except ImportError:  # pragma: no cover - dependencies
        return False
    handshake_cls, stream_cls = ws_stream.Handshake, ws_stream.WSStream
    too_large = ws_stream.FrameTooLargeError
    original_accept = handshake_cls.accept

    def accept(self: Any, subprotocol: Any, additional_headers: Any) -> Any:
        # Hypercorn negotiates only what the client offered: with no offer, no extension is
        # agreed, and wsproto then refuses any frame with a reserved bit set.
        self.extensions = None
        return original_accept(self, subprotocol, additional_headers)

    async def refuse(self: Any, code: int, reason: str) -> None:
        """Close the connection for what its client sent: drop the partial message, send the
        close frame, end the stream (the server closes the connection, and the stream ignores
        anything that arrives meanwhile)."""
        self.buffer.clear()
        _log_refusal(self, reason, code)
        await self._send_wsproto_event(CloseConnection(code=code))
        await self.send(StreamClosed(stream_id=self.stream_id))

    async def _handle_events(self: Any) -> None:
        for event in self.connection.events():
            if isinstance(event, Message):
                try:
                    self.buffer.extend(event)
                except too_large:
                    await refuse(self, CLOSE_MESSAGE_TOO_BIG, "message_too_big")
                    return
                if event.message_finished:
                    await self.app_put(self.buffer.to_message())
                    self.buffer.clear()
            elif isinstance(event, Ping):
                await self._send_wsproto_event(event.response())
            elif isinstance(event, CloseConnection):
                state = self.connection.state
                if state == ConnectionState.OPEN:
                    # wsproto could not parse a frame (a compressed one among them): it reports
                    # that as a close from the peer without changing the connection's state.
                    await refuse(self, event.code, "protocol_error")
                    return
                if state == ConnectionState.REMOTE_CLOSING:
                    await self._send_wsproto_event(event.response())
                await self.send(StreamClosed(stream_id=self.stream_id))

    setattr(handshake_cls, "accept", accept)  # noqa: B010 - patching a library class
    setattr(stream_cls, "_handle_events", _handle_events)  # noqa: B010
    _installed = True
    return True
