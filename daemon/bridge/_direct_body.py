"""Writing an event stream's response body straight to its connection's socket. Trio shell.

Hypercorn writes each body piece through the ASGI message, its HTTP/1.1 protocol object, h11's
chunked framing (which copies the piece into a new bytes object with its chunk head and CRLF),
a send lock and a Trio stream. For an SSE subscriber that is paid on every write, once per
subscriber, and it cost the daemon more than the socket send itself. Once Hypercorn has sent the
response head and the first body piece, the stream's later pieces go to the socket directly,
framed as the same chunks (:mod:`daemon.core.frame_codec`): one vectored ``writev`` per write, the
shared frames never copied. Hypercorn still owns the connection and ends the body (its last
chunk): it writes on a connection only when its application asks it to, so nothing else writes
to the socket while the stream's task does.

Only where the bytes on the socket are the bytes the peer reads: a GET over HTTP/1.1 (chunked)
on a plain TCP connection (no TLS layer) that the connection registry knows, and only once the
start-up probe (:mod:`daemon.bridge._probe`) saw this Hypercorn write the same bytes as a
direct write does. Anywhere else :func:`direct_body` returns ``None`` and the stream writes
through ASGI.

A write is shielded from cancellation, as Hypercorn's are: a chunk is never left half-sent by
a cancelled task. A write that cannot finish (the peer stopped reading) is ended as Hypercorn's
is, by cutting the connection (:func:`daemon.sockets.shutdown_connection`): the write then fails
with :class:`BodyGone`. The descriptor's number is read from the socket object before every
system call, with no checkpoint in between, so a descriptor closed meanwhile is never written:
its number may already belong to another connection or file.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Protocol

import trio

from ..core.transport_frames import Buffer, advance, chunk
from ._sockets import addr, registry

__all__ = ["BodyGone", "DirectBody", "direct_body", "enable", "enabled", "find_direct_body",
           "write_all"]

# Set by the start-up probe once it proved the bytes identical (see daemon.bridge._probe).
_enabled = False


def enable(on: bool) -> None:
    """Let :func:`direct_body` hand out writers (``on``), or stop it."""
    global _enabled
    _enabled = on


def enabled() -> bool:
    return _enabled


class BodyGone(Exception):
    """The connection can no longer be written: the peer went away or the daemon cut it."""


class _Socket(Protocol):
    def fileno(self) -> int: ...


class DirectBody:
    """Writes body pieces as HTTP/1.1 chunks to one connection's socket."""

    __slots__ = ("_sock",)

    def __init__(self, sock: _Socket) -> None:
        self._sock = sock

    async def write(self, data: bytes) -> None:
        """Write ``data`` (not empty) as one chunk; returns once the kernel has all of it.
        Raises :class:`BodyGone` if the connection is closed or broken."""
        await write_all(self._sock, chunk(data))

    def write_nowait(self, data: bytes) -> list[Buffer]:
        """Write ``data`` (not empty) as one chunk, as far as the socket takes it now, without
        waiting: what is left of the chunk (``[]`` once the kernel has all of it), to be
        written next with :meth:`write_rest` before anything else. A closed or broken
        connection takes nothing here; :meth:`write_rest` then raises :class:`BodyGone`."""
        buffers = chunk(data)
        fd = self._sock.fileno()
        if fd < 0:
            return buffers
        try:
            sent = os.writev(fd, buffers)
        except OSError:  # would block, or the connection is gone (write_rest says which)
            return buffers
        if sent == len(buffers[0]) + len(data) + 2:
            return []
        return advance(buffers, sent)

    async def write_rest(self, buffers: list[Buffer]) -> None:
        """Write what :meth:`write_nowait` left; returns once the kernel has all of it.
        Raises :class:`BodyGone` if the connection is closed or broken."""
        await write_all(self._sock, buffers)


async def write_all(sock: _Socket, buffers: list[Buffer]) -> None:
    """Write ``buffers`` to ``sock`` in vectored writes, shielded from cancellation; returns
    once the kernel has all of them. Raises :class:`BodyGone` if the connection is closed or
    broken."""
    left = sum(map(len, buffers))
    with trio.CancelScope(shield=True):
        while True:
            fd = sock.fileno()
            if fd < 0:
                raise BodyGone("the connection was closed")
            try:
                sent = os.writev(fd, buffers)
            except BlockingIOError:
                try:
                    await trio.lowlevel.wait_writable(fd)
                except (trio.ClosedResourceError, OSError) as exc:
                    raise BodyGone(f"the connection was closed: {exc!r}") from exc
                continue
            except OSError as exc:
                raise BodyGone(f"the connection broke: {exc!r}") from exc
            left -= sent
            if not left:
                return
            advance(buffers, sent)  # a partial write: the rest goes next


def direct_body(scope: Mapping[str, Any]) -> DirectBody | None:
    """A :class:`DirectBody` for this request's connection, or ``None`` where its body must go
    through the server (the start-up probe did not prove it safe, not a plain-TCP HTTP/1.1
    GET, or a connection the registry does not know). Call it only after the server has
    written the response head."""
    return find_direct_body(scope) if _enabled else None


def find_direct_body(scope: Mapping[str, Any]) -> DirectBody | None:
    """:func:`direct_body` whether or not the probe enabled it (the probe itself uses it)."""
    if (scope.get("type") != "http" or scope.get("http_version") != "1.1"
            or scope.get("scheme") != "http" or scope.get("method") != "GET"):
        return None
    local, peer = addr(scope.get("server")), addr(scope.get("client"))
    if local is None or peer is None:
        return None
    sock = registry.plain((local, peer))
    if sock is None:
        return None
    return DirectBody(sock)
