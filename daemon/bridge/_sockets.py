"""Cutting off a connection whose writes are stalled.

Hypercorn shields its socket writes from cancellation, so a response blocked on a peer that
stopped reading cannot be interrupted from the application. When the slow-client rules evict
such a subscriber, the daemon shuts the TCP connection down instead: the blocked write then
fails, Hypercorn sees the connection closed, and the stream's task ends. The socket is then
closed with a reset, so the descriptor and the unread buffers are freed at once.

The daemon knows its own transport: :func:`install` makes Hypercorn's per-connection server
register the connection's socket here when the connection starts, keyed by its (local, peer)
address pair (the ASGI scope's ``server`` and ``client``), and remove it when the connection
ends. The registry holds exactly the open connections; finding one is a dict lookup, and no
descriptor other than that connection's own is ever touched. It also notes which connections
are plain TCP (no TLS layer between the server and the socket): only those may have a response
body written straight to their socket (:mod:`daemon.direct_body`); and which one is a reserve
connection over ``--max-connections`` (:mod:`daemon.connection_limit` decides, before Hypercorn
reads a byte of a connection, whether it is served at all).
"""

from __future__ import annotations

import logging
import socket
import struct
from collections.abc import Sequence
from typing import Any, Protocol

import trio

from . import _connection_limit as connection_limit

log = logging.getLogger("daemon.sockets")

Addr = tuple[str, int]
Key = tuple[Addr, Addr]


class _Shutdownable(Protocol):
    def shutdown(self, how: int, /) -> None: ...
    def setsockopt(self, level: int, option: int, value: bytes, /) -> None: ...
    def close(self) -> None: ...
    def fileno(self) -> int: ...


class ConnectionRegistry:
    """Open connections by (local, peer) address. Pure bookkeeping: no I/O of its own."""

    __slots__ = ("_open",)

    def __init__(self) -> None:
        # key -> (socket, plain: the server writes to it as it is, with no TLS layer,
        #         reserve: a loopback health probe served over --max-connections,
        #         send lock: the lock the server holds while it writes to the socket)
        self._open: dict[Key, tuple[_Shutdownable, bool, bool, trio.Semaphore | None]] = {}

    def __len__(self) -> int:
        return len(self._open)

    def add(self, key: Key, sock: _Shutdownable, *, plain: bool = False,
            reserve: bool = False, send_lock: trio.Semaphore | None = None) -> None:
        """Register ``sock`` under ``key``; ``plain``: the server writes to it as it is (no
        TLS layer), so bytes written to it are what the peer reads; ``reserve``: it is served
        over ``--max-connections`` for one health probe; ``send_lock``: held by the server
        for each of its writes to the socket (a writer beside it holds it too)."""
        self._open[key] = (sock, plain, reserve, send_lock)

    def remove(self, key: Key, sock: _Shutdownable) -> None:
        """Forget ``key`` if it still names ``sock`` (a newer connection may reuse the pair)."""
        entry = self._open.get(key)
        if entry is not None and entry[0] is sock:
            del self._open[key]

    def get(self, key: Key) -> _Shutdownable | None:
        entry = self._open.get(key)
        return entry[0] if entry is not None else None

    def plain(self, key: Key) -> _Shutdownable | None:
        """The socket of ``key`` if it is open and plain TCP, else ``None``."""
        entry = self._open.get(key)
        return entry[0] if entry is not None and entry[1] else None

    def plain_locked(self, key: Key) -> tuple[_Shutdownable, trio.Semaphore] | None:
        """The socket of ``key`` and the server's send lock if it is open, plain TCP and was
        registered with its lock, else ``None``."""
        entry = self._open.get(key)
        if entry is None or not entry[1] or entry[3] is None:
            return None
        return entry[0], entry[3]

    def reserve(self, key: Key) -> bool:
        """Whether ``key`` is open in a reserve slot (``GET /health`` only, then closed)."""
        entry = self._open.get(key)
        return entry is not None and entry[2]


registry = ConnectionRegistry()
_installed = False


def addr(value: Sequence[object] | None) -> Addr | None:
    """``(host, port)`` of a socket address or an ASGI scope's ``server``/``client``."""
    if value is None or len(value) < 2:
        return None
    host, port = value[0], value[1]
    if not isinstance(host, str) or not isinstance(port, int):
        return None
    return host, port


def is_reserve(server: Sequence[object] | None, client: Sequence[object] | None) -> bool:
    """Whether the connection an ASGI scope names (``server``, ``client``) is served in a
    reserve slot over ``--max-connections``."""
    local, peer = addr(server), addr(client)
    return local is not None and peer is not None and registry.reserve((local, peer))


def shutdown_connection(server: Sequence[object] | None, client: Sequence[object] | None) -> bool:
    """Shut down the TCP connection whose local address is ``server`` and peer is ``client``
    (the ASGI scope's values). Returns True if it was open."""
    local, peer = addr(server), addr(client)
    if local is None or peer is None:
        return False
    sock = registry.get((local, peer))
    if sock is None:
        log.info("event=connection_not_found local=%s peer=%s", f"{local[0]}:{local[1]}",
                 f"{peer[0]}:{peer[1]}")
        return False
    try:
        sock.shutdown(socket.SHUT_RDWR)
        # Reset rather than linger: what the peer left unread is dropped at once, and the
        # descriptor is released now, not when the server's last task for the connection
        # ends (a WebSocket's pinger sleeps up to a ping interval first).
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        return False  # already gone
    finally:
        sock.close()  # Trio wakes the tasks waiting on it; Hypercorn then ends the connection
    log.info("event=connection_cut local=%s peer=%s", f"{local[0]}:{local[1]}",
             f"{peer[0]}:{peer[1]}")
    return True


def _transport_socket(stream: Any) -> Any:
    """The socket under a Trio SocketStream, or under the SocketStream of an SSLStream."""
    inner = getattr(stream, "transport_stream", stream)
    return getattr(inner, "socket", None)


def _is_plain(stream: Any) -> bool:
    """True for a bare Trio SocketStream: what is written to its socket reaches the peer as
    it is (an SSLStream, or any other wrapper, encrypts or frames it first)."""
    return type(stream) is trio.SocketStream


def _key_of(sock: Any) -> Key | None:
    try:
        local, peer = addr(sock.getsockname()), addr(sock.getpeername())
    except OSError:
        return None  # the peer is already gone
    return (local, peer) if local is not None and peer is not None else None


def install() -> bool:
    """Make Hypercorn's Trio worker register every connection it serves (idempotent).

    Hypercorn's ``worker_serve`` builds one ``TCPServer(app, config, context, state, stream)``
    per accepted connection, naming the class through its module; it is replaced by a subclass
    whose ``run`` registers the stream's socket for the lifetime of the connection. Checks the
    shape it relies on first; otherwise it logs and leaves Hypercorn alone (stalled writes then
    cannot be cut, everything else works).
    """
    global _installed
    if _installed:
        return True
    try:
        from hypercorn.trio import run as hyper_run
    except ImportError:  # pragma: no cover - a dependency
        return False
    base = getattr(hyper_run, "TCPServer", None)
    if not isinstance(base, type) or not callable(getattr(base, "run", None)) or not hasattr(
            base, "__await__") or not callable(getattr(hyper_run, "worker_serve", None)):
        log.warning("event=connection_registry_unavailable reason=unexpected_hypercorn_version")
        return False

    class TrackedTCPServer(base):  # type: ignore[valid-type,misc]
        """Hypercorn's TCPServer, with its socket in :data:`registry` while it runs, run only
        if ``--max-connections`` admits the connection."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            # Hypercorn holds its send lock for each of its writes (``async with``, nothing
            # else); in its place a lock no task owns, so that a direct WebSocket write the
            # delivery loop began may be finished and let go by the stream's task
            # (daemon.bridge._direct_ws).
            self.send_lock = trio.Semaphore(1, max_value=1)

        async def run(self) -> None:
            stream = getattr(self, "stream", None)
            sock = _transport_socket(stream)
            reserve = await connection_limit.admit(stream, sock)
            if reserve is None:
                return  # refused: answered and closed
            key = _key_of(sock) if sock is not None else None
            if key is not None:
                lock = getattr(self, "send_lock", None)
                registry.add(key, sock, plain=_is_plain(stream), reserve=reserve,
                             send_lock=lock if isinstance(lock, trio.Semaphore) else None)
            try:
                if reserve:
                    await connection_limit.serve_reserved(super().run, sock)
                else:
                    await super().run()
            finally:
                if key is not None:
                    registry.remove(key, sock)
                connection_limit.leave(reserve)

        async def _read_data(self) -> None:
            try:
                await super()._read_data()
            finally:
                # The peer closed (or the read failed): the connection is over. Hypercorn would
                # still wait out the keep-alive timer (30 s) of a connection gone idle, now or
                # when its last stream ends, before closing the socket and ending; its
                # descriptor and its --max-connections slot go now.
                self._tk_read_over = True
                await self.idle_task.stop()

        async def _idle_timeout(self) -> None:
            if not getattr(self, "_tk_read_over", False):
                await super()._idle_timeout()

    setattr(hyper_run, "TCPServer", TrackedTCPServer)  # noqa: B010 - patching a library module
    _installed = True
    return True
