"""WebSocket keepalive: a ping every interval, and close 1011 after two missed pongs.

Hypercorn sends pings when ``websocket_ping_interval`` is set but ignores the pongs, and ASGI
gives an application no access to either. This module adds the missing half to Hypercorn's
WebSocket stream: pongs are noted as the connection's events are read, and the pinger closes a
connection whose peer let two pings in a row go unanswered. A peer that stopped reading
altogether cannot even be sent its ping (the write ahead of it is stalled): the count goes on
regardless, and such a connection is cut (``daemon.sockets``), since no close frame would get
through either. It checks the stream class has the shape it expects before touching it;
otherwise it logs and leaves Hypercorn's plain pinging.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from . import _sockets as sockets

log = logging.getLogger("daemon.ws_keepalive")

MISSED_PONGS_LIMIT = 2
CLOSE_KEEPALIVE_FAILED = 1011

_installed = False


class _PongWatch:
    """Proxy for a wsproto connection that records pongs as its events are consumed."""

    def __init__(self, connection: Any, stream: Any) -> None:
        self._connection = connection
        self._stream = stream

    def events(self) -> Iterator[Any]:
        from wsproto.events import Pong

        for event in self._connection.events():
            if isinstance(event, Pong):
                self._stream._tk_pong_seen = True
            yield event

    def __getattr__(self, name: str) -> Any:
        return getattr(self._connection, name)


def install() -> bool:
    """Patch Hypercorn's WebSocket stream once; returns whether keepalive checks are active."""
    global _installed
    if _installed:
        return True
    try:
        from hypercorn.protocol import ws_stream
        from wsproto.events import CloseConnection, Ping
    except ImportError:  # pragma: no cover - both are dependencies
        return False
    stream_cls = ws_stream.WSStream
    needed = ("_accept", "_send_pings", "_send_wsproto_event", "_handle_events")
    if not all(hasattr(stream_cls, name) for name in needed) or not hasattr(
            ws_stream, "StreamClosed"):
        log.warning("event=ws_keepalive_unavailable reason=unexpected_hypercorn_version")
        return False
    stream_closed = ws_stream.StreamClosed
    original_accept = stream_cls._accept

    async def _accept(self: Any, message: Any) -> None:
        self._tk_pong_seen = True
        await original_accept(self, message)
        connection = getattr(self, "connection", None)
        if connection is not None:
            self.connection = _PongWatch(connection, self)

    async def _send_ping(self: Any) -> None:
        try:
            await self._send_wsproto_event(Ping())
        finally:
            self._tk_ping_pending = False

    async def _send_pings(self: Any) -> None:
        missed = 0
        while not self.closed:
            self._tk_pong_seen = False
            # Sent from a task of its own: a ping stuck behind a stalled write (a peer that
            # stopped reading) must not stop the count of missed pongs.
            if not getattr(self, "_tk_ping_pending", False):
                self._tk_ping_pending = True
                self.task_group.spawn(self._tk_send_ping)
            await self.context.sleep(self.config.websocket_ping_interval)
            if self.closed:
                return
            missed = 0 if self._tk_pong_seen else missed + 1
            if missed >= MISSED_PONGS_LIMIT:
                stalled = bool(getattr(self, "_tk_ping_pending", False))
                log.info("event=ws_keepalive_failed missed_pongs=%d stalled=%s", missed, stalled)
                if stalled:  # no close frame can get through: cut the connection
                    sockets.shutdown_connection(self.server, self.client)
                    return
                await self._send_wsproto_event(CloseConnection(code=CLOSE_KEEPALIVE_FAILED))
                await self.send(stream_closed(stream_id=self.stream_id))
                return

    setattr(stream_cls, "_accept", _accept)  # noqa: B010 - patching a library class
    setattr(stream_cls, "_send_pings", _send_pings)  # noqa: B010
    setattr(stream_cls, "_tk_send_ping", _send_ping)  # noqa: B010
    _installed = True
    return True
