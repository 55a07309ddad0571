"""Writing an event stream's WebSocket messages straight to its connection's socket. Trio shell.

Hypercorn sends each ASGI ``websocket.send`` through its WebSocket stream, wsproto (which
encodes the text again, copies it into a new frame) and its connection's send lock, once per
message and once per subscriber: that cost ten times what an SSE subscriber's write does, so
a fast turn's WebSocket subscribers fell behind and were evicted. Once Hypercorn has accepted
the connection, a stream's messages go to the socket directly instead, framed as wsproto frames
them (:func:`daemon.core.frame_codec.ws_frames`: a text frame per message, unmasked, no
extension), built once per wake-up for every subscriber and written in one vectored ``writev``.

Hypercorn still owns the connection: it answers pings, sends its own pings and the close frame.
It writes each of those under its connection's send lock, and so does this writer, so a frame
of either is never cut into by the other: a write of this writer's (whole frames) holds the lock
until the kernel has all of it. The delivery loop (:mod:`daemon.delivery`) takes the lock
without waiting (:meth:`DirectWebSocket.write_nowait`); when the socket takes only part of its
write, the lock stays held and the stream's task writes the rest (:meth:`DirectWebSocket.
write_rest`) before letting it go. That is why the lock is one no task owns
(:mod:`daemon.bridge._sockets` gives each connection a ``trio.Semaphore(1)`` in place of
Hypercorn's ``trio.Lock``, which only the task that took it may release). wsproto keeps no
state for a finished outgoing message, so its view of the connection is the same whoever
wrote the messages.

Only where that holds: an HTTP/1.1 WebSocket (not one over HTTP/2) on a plain TCP connection
the connection registry knows with its send lock, only with the WebSocket limits installed (no
extension is ever agreed, so no frame is compressed), and only once the start-up probe
(:mod:`daemon.bridge._probe`) saw this Hypercorn write the same bytes as the direct writer
does. Anywhere else :func:`direct_ws` returns ``None`` and the stream sends through ASGI.
Writes are shielded and fail with :class:`~daemon.bridge.BodyGone`, as a direct body's do.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import trio

from ..core.transport_frames import Buffer
from . import _ws_limits as ws_limits
from ._direct_body import _Socket, write_all
from ._sockets import addr, registry

__all__ = ["DirectWebSocket", "direct_ws", "enable", "enabled", "find_direct_ws"]

# Set by the start-up probe once it proved the bytes identical (see daemon.bridge._probe).
_enabled = False


def enable(on: bool) -> None:
    """Let :func:`direct_ws` hand out writers (``on``), or stop it."""
    global _enabled
    _enabled = on


def enabled() -> bool:
    return _enabled


class DirectWebSocket:
    """Writes ready-framed WebSocket messages to one connection's socket, under the lock the
    server holds for its own writes to it."""

    __slots__ = ("_held", "_lock", "_sock")

    def __init__(self, sock: _Socket, lock: trio.Semaphore) -> None:
        self._sock = sock
        self._lock = lock
        self._held = False  # the lock is held for a write write_nowait left unfinished

    async def write(self, frames: bytes) -> None:
        """Write ``frames`` (whole frames, not empty); returns once the kernel has all of them.
        Raises :class:`~daemon.bridge.BodyGone` if the connection is closed or broken."""
        await self._write_locked([frames])

    async def _write_locked(self, buffers: list[Buffer]) -> None:
        with trio.CancelScope(shield=True):
            async with self._lock:
                await write_all(self._sock, buffers)

    def write_nowait(self, frames: bytes) -> list[Buffer]:
        """Write ``frames`` (whole frames, not empty) as far as the socket takes it now,
        without waiting: what is left (``[]`` once the kernel has all of it), to be written
        next with :meth:`write_rest` before anything else. Nothing is written while the
        server holds the send lock (all of it is left); when part of a frame is written the
        lock stays held until :meth:`write_rest` has written the rest. A closed or broken
        connection takes nothing here; :meth:`write_rest` then raises
        :class:`~daemon.bridge.BodyGone`."""
        lock = self._lock
        try:
            lock.acquire_nowait()
        except trio.WouldBlock:  # the server is writing a frame of its own
            return [frames]
        sent = 0
        try:
            fd = self._sock.fileno()
            if fd >= 0:
                sent = os.write(fd, frames)
        except OSError:  # would block, or the connection is gone (write_rest says which)
            pass
        if sent == len(frames) or not sent:
            lock.release()
            return [] if sent else [frames]
        self._held = True  # the rest of a frame is still to come: nothing may go before it
        return [memoryview(frames)[sent:]]

    async def write_rest(self, buffers: list[Buffer]) -> None:
        """Write what :meth:`write_nowait` left, under the send lock (still held from
        :meth:`write_nowait` when it wrote part of a frame, let go here whatever happens);
        returns once the kernel has all of it. Raises :class:`~daemon.bridge.BodyGone` if the
        connection is closed or broken."""
        if not self._held:
            await self._write_locked(buffers)
            return
        try:
            await write_all(self._sock, buffers)
        finally:
            self._held = False
            self._lock.release()


def direct_ws(scope: Mapping[str, Any]) -> DirectWebSocket | None:
    """A :class:`DirectWebSocket` for this WebSocket's connection, or ``None`` where its
    messages must go through the server (see the module docstring). Call it only after the
    server has accepted the WebSocket."""
    return find_direct_ws(scope) if _enabled else None


def find_direct_ws(scope: Mapping[str, Any]) -> DirectWebSocket | None:
    """:func:`direct_ws` whether or not the probe enabled it (the probe itself uses it)."""
    if (scope.get("type") != "websocket" or scope.get("http_version") != "1.1"
            or scope.get("scheme") != "ws" or not ws_limits.installed()):
        return None
    local, peer = addr(scope.get("server")), addr(scope.get("client"))
    if local is None or peer is None:
        return None
    found = registry.plain_locked((local, peer))
    if found is None:
        return None
    return DirectWebSocket(*found)
