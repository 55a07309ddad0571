"""The start-up proof that a body written straight to the socket is what Hypercorn writes.

:mod:`daemon.bridge._direct_body` frames an event stream's body pieces itself (HTTP/1.1 chunks)
and writes them past Hypercorn. That is only correct while Hypercorn, on this machine, frames
and buffers a body exactly so: a Hypercorn (or h11) that framed its chunks differently, kept
bytes back, or counted what it wrote would see its connection corrupted silently. So before
the daemon serves anything, :func:`probe` serves the same response both ways from a private
Hypercorn on a loopback port, with the daemon's patches and connection registry in place:

- ``GET /asgi`` writes every piece through ASGI;
- ``GET /direct`` writes the first piece through ASGI (Hypercorn writes the head with it) and
  the others straight to the socket, then ends the body through ASGI, as an SSE stream does.

Each is followed, on the same keep-alive connection, by ``GET /asgi`` with
``Connection: close``, so a direct write that left Hypercorn's view of the connection out of
step shows in the next answer. The two byte streams must be identical (bar the ``date``
header's clock). Only then does :func:`daemon.bridge.direct_body` hand out writers; otherwise
every stream writes through ASGI, and the daemon logs why.

:func:`probe_ws` does the same for :mod:`daemon.bridge._direct_ws`: a WebSocket (its client
offering ``permessage-deflate``, which must not be agreed) at ``/asgi`` sends every message
through ASGI, one at ``/direct`` the first through ASGI and the others in one direct write,
each behind the frame head the daemon's streams write
(:func:`daemon.core.transport_frames.ws_frame_head`, as
:func:`daemon.core.frame_codec.ws_frames` does); both then close through ASGI (1000). The
bytes each client reads, from the handshake's answer to the close frame, must be identical;
only then does :func:`daemon.bridge.direct_ws` hand out writers.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, MutableMapping
from functools import partial
from typing import Any

import msgspec
import trio

from ..core.transport_frames import ws_frame_head
from ._direct_body import find_direct_body
from ._direct_ws import find_direct_ws

PROBE_TIMEOUT_S = 5.0
#: The pieces of the probe's body: an SSE opening frame, then sizes around the chunk head's
#: width changes (one, two, three and five hex digits) and one larger than a socket buffer.
#: As (letter, size) pairs, made into bytes only while the probe runs (:func:`pieces`): held
#: as constants they would stay in the daemon's memory for its whole life.
PIECE_SIZES: tuple[tuple[str, int], ...] = (("a", 9), ("b", 10), ("c", 255), ("d", 4095),
                                            ("e", 70_000), ("f", 300_001))
#: The probe's WebSocket messages: around the frame head's three length forms (7, 16 and 64
#: bits), one larger than a socket buffer, and (the last) text that is not ASCII.
WS_PIECE_SIZES: tuple[tuple[str, int], ...] = (
    ("a", 9), ("b", 1), ("c", 125), ("d", 126), ("e", 127), ("f", 65535), ("g", 65536),
    ("h", 300_001), ("\u00e9\u4e2d\U0001f600", 50))
SSE_OPENING = b"retry: 3000\n\n"


def pieces() -> list[bytes]:
    """The probe's SSE body pieces, the opening frame first."""
    return [SSE_OPENING, *(letter.encode() * size for letter, size in PIECE_SIZES)]


def ws_pieces() -> list[str]:
    """The probe's WebSocket messages."""
    return [text * size for text, size in WS_PIECE_SIZES]


#: What a server's close frame with code 1000 is on the wire (the probe's messages never
#: hold these bytes: their text is letters and three non-ASCII characters).
WS_CLOSE_1000 = b"\x88\x02\x03\xe8"
_WS_KEY = "dGhlIHNhbXBsZSBub25jZQ=="
_DATE = re.compile(rb"\r\ndate: [^\r\n]*", re.IGNORECASE)

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class ProbeResult(msgspec.Struct, frozen=True):
    identical: bool
    reason: str  # "identical", or what differed / why the probe could not run


async def _app(found: list[bool], scope: Scope, receive: Receive, send: Send) -> None:
    """The probe's ASGI application (see the module docstring); ``found`` gets, for each
    ``GET /direct``, whether its connection could be written directly."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            kind = message["type"].rsplit(".", 1)[-1]
            await send({"type": f"lifespan.{kind}.complete"})
            if kind == "shutdown":
                return
    if scope["type"] == "websocket":
        await _ws_app(found, scope, receive, send)
        return
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/event-stream")]})
    body = pieces()
    await send({"type": "http.response.body", "body": body[0], "more_body": True})
    direct = None
    if scope["path"] == "/direct":
        direct = find_direct_body(scope)
        found.append(direct is not None)
    for piece in body[1:]:
        if direct is not None:
            await direct.write(piece)
        else:
            await send({"type": "http.response.body", "body": piece, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _ws_app(found: list[bool], scope: Scope, receive: Receive, send: Send) -> None:
    if (await receive())["type"] != "websocket.connect":
        return
    await send({"type": "websocket.accept"})
    messages = ws_pieces()
    await send({"type": "websocket.send", "text": messages[0]})
    direct = None
    if scope["path"] == "/direct":
        direct = find_direct_ws(scope)
        found.append(direct is not None)
    if direct is not None:
        raws = [piece.encode() for piece in messages[1:]]
        await direct.write(b"".join(ws_frame_head(len(raw)) + raw for raw in raws))
    else:
        for piece in messages[1:]:
            await send({"type": "websocket.send", "text": piece})
    await send({"type": "websocket.close", "code": 1000})


class _Unavailable(Exception):
    pass


async def _exchange(port: int, first: str) -> bytes:
    """``GET first`` and then ``GET /asgi`` (closing) on one connection: all bytes received."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    received = bytearray()
    async with stream:
        await stream.send_all(f"GET {first} HTTP/1.1\r\nhost: probe\r\n\r\n".encode())
        # The pieces are letters, so the last chunk (size 0) is the only "\r\n0\r\n\r\n".
        while not received.endswith(b"\r\n0\r\n\r\n"):
            data = await stream.receive_some(65536)
            if not data:
                raise _Unavailable(f"the connection ended during GET {first}")
            received += data
        await stream.send_all(b"GET /asgi HTTP/1.1\r\nhost: probe\r\nconnection: close\r\n\r\n")
        while data := await stream.receive_some(65536):
            received += data
    return bytes(received)


async def _ws_exchange(port: int, path: str) -> bytes:
    """A WebSocket at ``path``: every byte read, from the handshake's answer to the close."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    received = bytearray()
    async with stream:
        await stream.send_all(
            f"GET {path} HTTP/1.1\r\nhost: probe\r\nupgrade: websocket\r\n"
            f"connection: Upgrade\r\nsec-websocket-key: {_WS_KEY}\r\n"
            f"sec-websocket-version: 13\r\nsec-websocket-extensions: permessage-deflate\r\n"
            f"\r\n".encode())
        while not received.endswith(WS_CLOSE_1000):
            data = await stream.receive_some(65536)
            if not data:
                raise _Unavailable(f"the connection ended during the WebSocket at {path}")
            received += data
    return bytes(received)


def _compare(through_server: bytes, direct: bytes) -> str | None:
    """None when the two exchanges are the same bytes (bar the date), else what differs."""
    a, b = _DATE.sub(b"", through_server), _DATE.sub(b"", direct)
    if a == b:
        return None
    at = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
              min(len(a), len(b)))
    return (f"bytes differ at offset {at} of {len(a)}/{len(b)}: "
            f"server {a[max(0, at - 8):at + 16]!r} direct {b[max(0, at - 8):at + 16]!r}")


async def _run(config: Any, exchange: Callable[[int], Awaitable[tuple[bytes, bytes]]]
               ) -> ProbeResult:
    """Serve the probe's application from a private Hypercorn (``config`` is a Hypercorn
    config; its bind becomes a loopback port, without TLS), run ``exchange`` (the bytes read
    through ASGI and through the direct writer) against it and compare them."""
    from hypercorn.trio import serve

    config.bind = ["127.0.0.1:0"]
    # The direct writers serve plain connections only (a TLS stream always writes through
    # ASGI), so the probe compares plain bytes even when the daemon serves TLS.
    config.certfile = None
    config.keyfile = None
    config.accesslog = None
    config.errorlog = None  # its "Running on" line would name a port nobody may use
    # A ping of the server's own would land between the messages at a moment of its choosing.
    config.websocket_ping_interval = None
    stop = trio.Event()
    found: list[bool] = []
    try:
        with trio.fail_after(PROBE_TIMEOUT_S):
            async with trio.open_nursery() as nursery:
                binds: list[str] = await nursery.start(
                    lambda task_status: serve(partial(_app, found), config, shutdown_trigger=stop.wait,
                                              task_status=task_status))
                port = int(binds[0].rsplit(":", 1)[1])
                try:
                    reference, direct = await exchange(port)
                finally:
                    stop.set()
    except trio.TooSlowError:
        return ProbeResult(False, f"no answer within {PROBE_TIMEOUT_S:g} s")
    except Exception as exc:  # any failure leaves the ASGI path on
        return ProbeResult(False, f"the probe failed: {exc!r}")
    if found != [True]:
        return ProbeResult(False, "the connection registry does not know the probe's "
                                  "connection (Hypercorn's connection class changed?)")
    differs = _compare(reference, direct)
    return ProbeResult(differs is None, differs or "identical")


async def probe(config: Any) -> ProbeResult:
    """Serve :func:`pieces` both ways as an SSE body and compare the bytes (see the module
    docstring; ``config``: a Hypercorn config, its bind replaced)."""

    async def exchange(port: int) -> tuple[bytes, bytes]:
        return await _exchange(port, "/asgi"), await _exchange(port, "/direct")

    return await _run(config, exchange)


async def probe_ws(config: Any) -> ProbeResult:
    """Send :func:`ws_pieces` both ways on a WebSocket and compare the bytes."""

    async def exchange(port: int) -> tuple[bytes, bytes]:
        return await _ws_exchange(port, "/asgi"), await _ws_exchange(port, "/direct")

    return await _run(config, exchange)
