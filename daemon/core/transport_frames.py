"""The transport's own framing of bytes the daemon writes past its HTTP server: HTTP/1.1
chunks and WebSocket frame heads. No event in here (the event formats are
:mod:`daemon.core.frame_codec`, which frames its WebSocket messages with :func:`ws_frame_head`),
so the direct writers (``daemon.bridge``) and the start-up probe that proves them load without
the protocol's event types. Pure.

- **HTTP/1.1 chunks.** A body piece written straight to the socket (``daemon.bridge``'s direct
  body) goes as one chunk: its size in hex, CRLF, the bytes, CRLF. :func:`chunk` gives the
  three parts as separate buffers, so a vectored write (``writev``/``sendmsg``) sends them
  without joining (copying) the piece; :func:`advance` drops what a partial write already
  sent. The body's last chunk (size 0) is not written here: the HTTP server that sent the
  response head also ends the body.
- **WebSocket frame heads.** A server's text message as one unmasked frame (FIN, opcode 1),
  its payload length in the shortest of the protocol's three forms: the bytes wsproto writes
  before a finished text message with no extension.
"""

from __future__ import annotations

from struct import Struct
from typing import Final

__all__ = ["CRLF", "Buffer", "advance", "chunk", "ws_frame_head"]


# --- WebSocket frame heads --------------------------------------------------------------------

#: FIN set, no reserved bit (no extension is ever agreed), opcode 1 (text).
_WS_TEXT: Final = 0x81
_WS_SHORT: Final = tuple(bytes((_WS_TEXT, n)) for n in range(126))  # payloads of 0-125 bytes
_WS_MEDIUM: Final = Struct("!BBH").pack  # 126, then a 16-bit length
_WS_LONG: Final = Struct("!BBQ").pack  # 127, then a 64-bit length


def ws_frame_head(size: int) -> bytes:
    """The head of a server's (unmasked) WebSocket text frame carrying ``size`` payload bytes,
    the whole message in one frame."""
    if size < 126:
        if size < 0:
            raise ValueError(f"a payload cannot have {size} bytes")
        return _WS_SHORT[size]
    if size < 0x10000:
        return _WS_MEDIUM(_WS_TEXT, 126, size)
    return _WS_LONG(_WS_TEXT, 127, size)


# --- HTTP/1.1 chunks --------------------------------------------------------------------------

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
