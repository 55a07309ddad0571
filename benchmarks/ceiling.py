"""The machine's ceiling for SSE fan-out on this stack: bare Hypercorn on Trio, no daemon.

Run as ``python -m benchmarks.ceiling --chunks N``: a raw ASGI app under Hypercorn's Trio worker
(the daemon's HTTP server, with nothing of the daemon in front of it) that answers every
``GET`` with an SSE stream and, once ``POST /start`` arrives, writes to each open stream the
frames the daemon would write for a turn of ``N`` mock chunks: ids 1..N of ``session_update``
envelopes spliced exactly as the daemon splices them (``daemon.core.frame_codec``), framed by
``daemon.core.frame_codec``, pre-built before the start, published one dispatch group at a
time (a quarter of ``--max-queued``, at most ``daemon.core.flow_control.DISPATCH_GROUP_MAX`` frames; 64 for
``maxQueued=2048``; ``--group`` overrides it) and written as the daemon writes them: one send
per wake-up, a small one gathered over a few scheduler passes first (``daemon.streams``); then
a ``turn_complete`` frame with id N+1. Its first stdout line is ``listening
on http://127.0.0.1:PORT``. Nothing else runs in it: no agent to read, no ring,
journals, compactor or transcript, every frame built before the clock starts; so it is an
upper bound on the daemon's delivered rate with the same write pattern, not a model of it.

The e2e benchmark reads it with the same load generator as the daemon (same ids check, the
terminal last), so the daemon's rate over this one is how close the daemon comes to what
Hypercorn, Trio, Python and the client allow on this machine; no daemon can beat it.

``--server trio`` serves the same app with no HTTP server at all: a Trio TCP listener that
reads each request's head, answers it, and frames the same response as Hypercorn frames it
(status line and the app's headers, each body chunk-encoded, the last chunk ``0``). That
is the floor of the stack below Hypercorn and h11: what Trio's socket streams, Python and the
kernel's loopback cost per delivery, which no HTTP server written on Trio can go under.
"""

from __future__ import annotations

import argparse
import itertools
import socket
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any, Literal

import trio

from daemon.core.envelope import Event, encode_json
from daemon.core.flow_control import GATHER_PASSES, dispatch_group_lines, worth_gathering
from daemon.core.frame_codec import EnvelopeSplicer, sse_frames

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

def daemon_group(max_queued: int) -> int:
    """Frames per wake-up of a daemon subscriber with ``max_queued`` (the daemon's rule)."""
    return dispatch_group_lines((max_queued,))


def turn_segments(chunks: int, group: int) -> list[bytes]:
    """The SSE bytes of a ``chunks``-chunk turn as the daemon frames them, one per wake-up."""
    session, prompt, client = str(uuid.uuid4()), str(uuid.uuid4()), "client_" + "0" * 8
    splicer = EnvelopeSplicer(session, prompt, client, int(time.time() * 1000))
    segments: list[bytes] = []
    for start in range(0, chunks, group):
        count = min(group, chunks - start)
        updates = [encode_json({"sessionUpdate": "agent_message_chunk",
                                "content": {"type": "text", "text": f"chunk-{start + i}"}})
                   for i in range(count)]
        raws = splicer.envelopes(start + 1, updates)
        segments.append(sse_frames([Event.spliced(raw, start + 1 + i, "session_update", prompt)
                                   for i, raw in enumerate(raws)]))
    terminal = Event.from_env({"id": chunks + 1, "v": 1, "type": "turn_complete",
                               "data": {"sessionId": session, "stopReason": "end_turn"},
                               "promptId": prompt})
    segments.append(sse_frames([terminal]))
    return segments


class _Reader:
    """One SSE stream of the ceiling server: its cursor (segments handed to the transport) and
    whether a write is in flight."""

    __slots__ = ("cursor", "idle", "sending")

    def __init__(self) -> None:
        self.cursor = 0
        self.sending = False
        self.idle = trio.Event()


class CeilingApp:
    """Writes the pre-built segments to every open stream, paced as the daemon paces its
    subscribers: one segment is *published* per scheduling round (the daemon's publisher
    yields once per dispatch group), every idle stream is woken and writes everything it has
    not written yet in one send, and the publisher waits for a stream whose write is in flight
    while it is half its ``max_queued`` frames behind (the daemon's flow control). Unpaced,
    every stream would race the others to the end of the turn and fill the kernel's socket
    buffers, which is slower with many streams than the daemon itself, so no ceiling."""

    def __init__(self, segments: list[bytes], group: int, max_queued: int) -> None:
        self.segments = segments
        self.ends = list(itertools.accumulate(map(len, segments)))  # bytes up to segment k
        self.group = group
        self.max_queued = max_queued
        self.started = trio.Event()
        self.available = 0  # segments published
        self.readers: set[_Reader] = set()
        self.lot = trio.lowlevel.ParkingLot()

    async def publish(self) -> None:
        behind_frames = self.max_queued // 2
        for k in range(len(self.segments)):
            for reader in list(self.readers):
                if reader.sending and (k - reader.cursor) * self.group >= behind_frames:
                    await reader.idle.wait()
            self.available = k + 1
            self.lot.unpark_all()
            await trio.lowlevel.checkpoint()

    def worth_gathering(self, reader: _Reader) -> bool:
        """``daemon.streams.EventPump.worth_gathering`` for this reader."""
        available, cursor = self.available, reader.cursor
        if available >= len(self.segments):
            return False  # the turn is all published
        pending = self.ends[available - 1] - (self.ends[cursor - 1] if cursor else 0)
        return worth_gathering(pending, (available - cursor) * self.group, self.max_queued)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        if scope["method"] == "POST":
            await send({"type": "http.response.start", "status": 204, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            self.started.set()
            await self.publish()
            return
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]})
        await send({"type": "http.response.body", "body": b"retry: 3000\n\n",
                    "more_body": True})
        reader = _Reader()
        self.readers.add(reader)
        segments, total = self.segments, len(self.segments)
        try:
            await self.started.wait()
            while reader.cursor < total:
                available = self.available
                if reader.cursor >= available:
                    await self.lot.park()
                    continue
                # A small write first lets the publisher run a few more passes, bounded as the
                # daemon bounds it (daemon.core.flow_control.GATHER_BYTES), so the sends are as large.
                for _ in range(GATHER_PASSES):
                    if not self.worth_gathering(reader):
                        break
                    await trio.lowlevel.checkpoint()
                available = self.available
                body = (segments[reader.cursor] if available == reader.cursor + 1
                        else b"".join(segments[reader.cursor:available]))
                reader.cursor = available
                reader.sending = True
                reader.idle = trio.Event()
                await send({"type": "http.response.body", "body": body, "more_body": True})
                reader.sending = False
                reader.idle.set()
        finally:
            self.readers.discard(reader)
        await send({"type": "http.response.body", "body": b"", "more_body": False})


ServerKind = Literal["hypercorn", "trio"]
SERVERS: tuple[ServerKind, ...] = ("hypercorn", "trio")
_HEAD_END = b"\r\n\r\n"
_HEAD_LIMIT = 65536
_REASONS = {200: b"OK", 204: b"No Content"}


class _TrioSocketHttp:
    """The ASGI ``send`` of one HTTP/1.1 response written straight to a Trio stream, framed as
    Hypercorn frames it (h11's chunked encoding when the response has a body and no length);
    the response head goes out with the first body chunk, as h11 sends it."""

    __slots__ = ("_chunked", "_head", "_stream")

    def __init__(self, stream: trio.SocketStream) -> None:
        self._stream = stream
        self._head = b""
        self._chunked = False

    async def send(self, message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.start":
            status = int(message["status"])
            head = b"HTTP/1.1 %d %b\r\n" % (status, _REASONS.get(status, b""))
            head += b"".join(b"%b: %b\r\n" % (name, value) for name, value in message["headers"])
            self._chunked = status != 204
            self._head = head + (b"transfer-encoding: chunked\r\n\r\n" if self._chunked
                                 else b"\r\n")
            return
        body: bytes = message.get("body", b"")
        more = bool(message.get("more_body", False))
        out = self._head
        self._head = b""
        if self._chunked:
            if body:
                out += b"%x\r\n%b\r\n" % (len(body), body)
            if not more:
                out += b"0\r\n\r\n"
        if out:
            await self._stream.send_all(out)


async def _read_head(stream: trio.SocketStream) -> bytes | None:
    """The request's head (request line and headers), or ``None`` when the peer closed or sent
    more than a head may hold. The ceiling's requests carry no body."""
    data = b""
    while _HEAD_END not in data:
        if len(data) > _HEAD_LIMIT:
            return None
        more = await stream.receive_some(_HEAD_LIMIT)
        if not more:
            return None
        data += more
    return data


async def _never() -> MutableMapping[str, Any]:
    await trio.sleep_forever()
    raise AssertionError("unreachable")  # pragma: no cover


async def serve_on_trio_socket(app: CeilingApp, sock: socket.socket) -> None:
    """``app`` served from ``sock`` with no HTTP server: one request per connection."""
    listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))

    async def connection(stream: trio.SocketStream) -> None:
        async with stream:
            head = await _read_head(stream)
            if head is None:
                return
            method = head.split(b" ", 1)[0].decode("ascii", "replace")
            http = _TrioSocketHttp(stream)
            try:
                await app({"type": "http", "method": method}, _never, http.send)
            except trio.BrokenResourceError:
                return  # the client went away mid-stream

    await trio.serve_listeners(connection, [listener])


def main(argv: Sequence[str] | None = None) -> int:
    from hypercorn.config import Config
    from hypercorn.trio import serve

    parser = argparse.ArgumentParser(prog="python -m benchmarks.ceiling", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chunks", type=int, required=True)
    parser.add_argument("--max-queued", type=int, default=2048,
                        help="the subscribers' maxQueued, which sets the daemon's wake-up size")
    parser.add_argument("--group", type=int, default=None,
                        help="frames per send (default: the daemon's wake-up size)")
    parser.add_argument("--server", choices=SERVERS, default="hypercorn",
                        help="hypercorn (the daemon's HTTP server) or trio (no HTTP server: "
                             "the floor below it)")
    args = parser.parse_args(argv)
    group = args.group or daemon_group(args.max_queued)
    app = CeilingApp(turn_segments(args.chunks, group), group, args.max_queued)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    print(f"listening on http://127.0.0.1:{sock.getsockname()[1]}", flush=True)
    sys.setswitchinterval(0.001)  # as the daemon runs
    if args.server == "trio":
        trio.run(serve_on_trio_socket, app, sock)
        return 0
    sock.set_inheritable(True)
    config = Config()
    config.bind = [f"fd://{sock.fileno()}"]
    config.accesslog = None
    config.errorlog = None
    config.keep_alive_timeout = 30
    trio.run(serve, app, config)  # type: ignore[arg-type]
    return 0


if __name__ == "__main__":
    sys.exit(main())
