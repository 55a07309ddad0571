"""HTTP/1.1 chunked transfer coding of a response body written piece by piece. Pure.

A body piece of ``n`` bytes goes on the wire as one chunk: its size in hex, CRLF, the bytes,
CRLF. :func:`chunk` gives the three parts as separate buffers, so a vectored write
(``writev``/``sendmsg``) sends them without joining (copying) the piece; :func:`advance` drops
what a partial write already sent. The body's last chunk (size 0) is not written here: the HTTP
server that sent the response head also ends the body.
"""

from __future__ import annotations

from typing import Final

__all__ = ["CRLF", "advance", "chunk"]

CRLF: Final = b"\r\n"

Buffer = bytes | memoryview


def chunk(data: bytes) -> list[Buffer]:
    """The buffers that carry ``data`` as one chunk. ``data`` must not be empty: a chunk of
    size 0 ends the body."""
    if not data:
        raise ValueError("an empty chunk would end the body")
    return [b"%x\r\n" % len(data), data, CRLF]


def advance(buffers: list[Buffer], sent: int) -> list[Buffer]:
    """``buffers`` less their first ``sent`` bytes (what a partial write took), in place; an
    empty list once everything was sent."""
    if sent < 0:
        raise ValueError(f"sent must not be negative, got {sent}")
    while sent:
        if not buffers:
            raise ValueError("sent more bytes than the buffers hold")
        first = buffers[0]
        if sent < len(first):
            buffers[0] = memoryview(first)[sent:]
            break
        sent -= len(first)
        del buffers[0]
    return buffers
