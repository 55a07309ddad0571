"""An event stream's body written straight to its connection's socket (daemon.bridge).

The chunk framing is checked against h11's own decoder, the writer on real socket pairs (a
peer that reads slowly, a connection cut while a write waits, a descriptor closed and its number
reused), the transport choice on the ASGI scopes that must and must not take it, and the whole
path on a real daemon: a raw HTTP/1.1 client parses the stream with h11 and gets every event,
and the live frames are seen to leave through the socket rather than through the server. The
start-up probe enables it only on a Hypercorn seen to write the same bytes: a Hypercorn whose
chunk framing differs leaves a real daemon's streams on the ASGI path, and says so in its log.
"""

from __future__ import annotations

import socket
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from functools import partial
from pathlib import Path
from typing import Any

import h11
import httpx
import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st
from msgspec.structs import replace

from daemon.bridge._direct_body import BodyGone, DirectBody, direct_body, enable
from daemon.bridge._sockets import install as sockets_install
from daemon.bridge._sockets import registry
from daemon.bus import SessionBus
from daemon.core.transport_frames import advance, chunk
from daemon.streams import serve_sse
from tests.builders.sse_gather import ID_LINE, new_bus, publish
from tests.harness import answer_lifespan, start_daemon
from tests.stalls import host_port, run_turn

pytestmark = pytest.mark.processes  # starts processes: not in make unit-fast


@pytest.fixture(autouse=True)
def _direct_body_enabled() -> Iterator[None]:
    """In this process nothing ran the start-up probe: these tests enable the direct path as
    a passing probe does (the probe's own tests below say when it does)."""
    enable(True)
    yield
    enable(False)


def _dechunk(wire: bytes) -> list[bytes]:
    """The body pieces h11 decodes from ``wire`` (a chunked body, without its last chunk)."""
    client = h11.Connection(h11.CLIENT)
    client.send(h11.Request(method="GET", target="/", headers=[("Host", "x")]))
    client.receive_data(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + wire
                        + b"0\r\n\r\n")
    pieces: list[bytes] = []
    while True:
        event = client.next_event()
        if isinstance(event, h11.Data):
            pieces.append(bytes(event.data))
        elif isinstance(event, h11.EndOfMessage):
            return pieces
        elif event is h11.NEED_DATA:
            raise AssertionError(f"incomplete chunked body: {wire[-40:]!r}")


# --- the pure framing -----------------------------------------------------------------------

@given(st.lists(st.binary(min_size=1, max_size=5000), min_size=1, max_size=8),
       st.lists(st.integers(min_value=1, max_value=7000), max_size=40))
def test_chunks_sent_in_any_cuts_decode_to_the_pieces(pieces: list[bytes], cuts: list[int]
                                                      ) -> None:
    wire = bytearray()
    for piece in pieces:
        buffers = chunk(piece)
        for cut in [*cuts, 1 << 30]:  # partial writes of arbitrary sizes, then the rest
            total = sum(len(b) for b in buffers)
            if not total:
                break
            sent = min(cut, total)
            wire += b"".join(bytes(b) for b in buffers)[:sent]
            advance(buffers, sent)
        assert buffers == []
    assert b"".join(_dechunk(bytes(wire))) == b"".join(pieces)


def test_chunk_refuses_an_empty_piece_and_advance_refuses_impossible_counts() -> None:
    with pytest.raises(ValueError, match="end the body"):
        chunk(b"")
    with pytest.raises(ValueError, match="more bytes"):
        advance(chunk(b"abc"), 9)  # 3 + 3 + 2 bytes
    with pytest.raises(ValueError, match="negative"):
        advance(chunk(b"abc"), -1)
    assert [bytes(b) for b in advance(chunk(b"abc"), 4)] == [b"bc", b"\r\n"]


# --- the writer on real sockets -------------------------------------------------------------

def _pair() -> tuple[trio.socket.SocketType, socket.socket]:
    """A connected stream socket pair: the daemon's end (Trio, non-blocking) and the peer's."""
    ours, theirs = socket.socketpair()
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    theirs.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    return trio.socket.from_stdlib_socket(ours), theirs


async def test_a_write_larger_than_the_socket_buffers_waits_for_the_reader() -> None:
    ours, theirs = _pair()
    theirs.setblocking(False)
    pieces = [bytes([65 + i]) * size for i, size in enumerate((1, 300_000, 17, 70_000))]
    received = bytearray()

    async def read_all(expected: int) -> None:
        while len(received) < expected:
            await trio.lowlevel.wait_readable(theirs)
            received.extend(theirs.recv(65536))

    expected = sum(len(b"".join(bytes(x) for x in chunk(p))) for p in pieces)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_all, expected)
            writer = DirectBody(ours)
            for piece in pieces:
                await writer.write(piece)
    assert _dechunk(bytes(received)) == pieces
    ours.close()
    theirs.close()


async def test_cutting_the_connection_ends_a_write_that_waits_on_a_peer_that_never_reads(
) -> None:
    ours, theirs = _pair()
    outcome: list[BaseException] = []

    async def write_forever() -> None:
        try:
            await DirectBody(ours).write(b"x" * 4_000_000)  # far more than the buffers hold
        except BodyGone as exc:
            outcome.append(exc)

    with trio.fail_after(10):
        await _close_while_blocked(write_forever, ours, outcome)
    assert len(outcome) == 1 and "closed" in str(outcome[0])
    theirs.close()


async def _close_while_blocked(write: Callable[[], Awaitable[None]],
                               ours: trio.socket.SocketType, outcome: list[BaseException]
                               ) -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(write)
        await trio.testing.wait_all_tasks_blocked()
        assert not outcome  # the write is parked on the full socket
        ours.close()  # what daemon.bridge's shutdown_connection does after its shutdown()


async def test_a_cancelled_task_never_leaves_half_a_chunk_on_the_wire() -> None:
    """Cancelling the stream's task while its write waits does not cut the chunk short (a
    half-written chunk would corrupt every later byte of the response): the write finishes
    once the peer reads, and only then does the cancellation take effect."""
    ours, theirs = _pair()
    theirs.setblocking(False)
    piece = b"y" * 500_000
    finished: list[bool] = []

    async def write() -> None:
        await DirectBody(ours).write(piece)
        finished.append(True)
        await trio.lowlevel.checkpoint()  # the cancellation lands here, after the chunk

    received = bytearray()
    with trio.fail_after(10):
        await _cancel_while_writing(write, theirs, received, piece)
    assert finished == [True]
    assert _dechunk(bytes(received)) == [piece]
    ours.close()
    theirs.close()


async def _cancel_while_writing(write: Callable[[], Awaitable[None]], theirs: socket.socket,
                                received: bytearray, piece: bytes) -> None:
    """Start ``write``, cancel it once it waits on the full socket, then read what arrives
    until the writer's task is over (however it ended)."""
    over = trio.Event()

    async def writer() -> None:
        try:
            await write()
        finally:
            over.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer)
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()  # cancels the writer while it waits on the full socket
        with trio.CancelScope(shield=True):
            while not over.is_set():
                try:
                    received.extend(theirs.recv(1 << 20))
                except BlockingIOError:
                    await trio.lowlevel.checkpoint()  # the writer's turn
    while True:
        try:
            received.extend(theirs.recv(1 << 20))
        except BlockingIOError:
            return


async def test_a_closed_connection_is_never_written_even_when_its_number_was_reused() -> None:
    ours, theirs = _pair()
    number = ours.fileno()
    writer = DirectBody(ours)
    ours.close()
    theirs.close()
    # The next descriptors the process opens take the lowest free numbers: the closed one first.
    reused_a, reused_b = socket.socketpair()
    try:
        stale = reused_a if reused_a.fileno() == number else reused_b
        assert stale.fileno() == number, "the closed number was not reused; the test needs it"
        other = reused_b if stale is reused_a else reused_a
        with pytest.raises(BodyGone, match="closed"):
            await writer.write(b"frames for a connection that is gone")
        other.setblocking(False)
        stale.setblocking(False)
        with pytest.raises(BlockingIOError):
            other.recv(100)  # nothing arrived on the socket that now has the old number
    finally:
        reused_a.close()
        reused_b.close()


async def test_a_peer_that_went_away_ends_the_write_with_body_gone() -> None:
    ours, theirs = _pair()
    theirs.close()
    with pytest.raises(BodyGone, match="broke"):
        for _ in range(3):  # the first write may still be accepted by the kernel
            await DirectBody(ours).write(b"x" * 10_000)
    ours.close()


# --- which requests take it ---------------------------------------------------------------------

class _FakeSock:
    def __init__(self) -> None:
        self.closed = False

    def shutdown(self, how: int, /) -> None: ...
    def setsockopt(self, level: int, option: int, value: bytes, /) -> None: ...
    def close(self) -> None: ...
    def fileno(self) -> int:
        return 99


LOCAL, PEER = ("127.0.0.1", 4170), ("127.0.0.1", 50123)
PLAIN_SCOPE = {"type": "http", "http_version": "1.1", "scheme": "http", "method": "GET",
               "server": LOCAL, "client": PEER}


@pytest.mark.parametrize("change", [
    {"scheme": "https"}, {"http_version": "2"}, {"http_version": "1.0"}, {"method": "HEAD"},
    {"type": "websocket"}, {"client": None}, {"server": ["/run/x.sock", None]},
    {"client": ("127.0.0.1", 1)},  # a connection the registry does not know
])
def test_only_a_plain_http11_get_on_a_known_connection_is_written_directly(
        change: dict[str, Any]) -> None:
    sock = _FakeSock()
    registry.add((LOCAL, PEER), sock, plain=True)
    try:
        assert isinstance(direct_body(PLAIN_SCOPE), DirectBody)
        assert direct_body({**PLAIN_SCOPE, **change}) is None
    finally:
        registry.remove((LOCAL, PEER), sock)
    assert direct_body(PLAIN_SCOPE) is None  # the connection ended


def test_a_connection_registered_as_not_plain_is_never_written_directly() -> None:
    sock = _FakeSock()
    registry.add((LOCAL, PEER), sock, plain=False)  # e.g. TLS: the socket carries ciphertext
    try:
        assert registry.get((LOCAL, PEER)) is sock  # still there to be cut when stalled
        assert direct_body(PLAIN_SCOPE) is None
    finally:
        registry.remove((LOCAL, PEER), sock)


async def test_a_tls_stream_is_not_plain_and_a_bare_socket_stream_is() -> None:
    import ssl

    from daemon.bridge._sockets import _is_plain

    ours, theirs = _pair()
    bare = trio.SocketStream(ours)
    tls = trio.SSLStream(bare, ssl.create_default_context(), server_side=False)
    assert _is_plain(bare)
    assert not _is_plain(tls)
    assert not _is_plain(None)
    await bare.aclose()
    theirs.close()


# --- serve_sse: live frames leave through the socket ---------------------------------------

class _Server:
    """The ASGI side of one SSE stream: what went through the server."""

    def __init__(self) -> None:
        self.messages: list[MutableMapping[str, Any]] = []

    async def send(self, message: MutableMapping[str, Any]) -> None:
        self.messages.append(message)

    async def receive(self) -> MutableMapping[str, Any]:
        await trio.sleep_forever()
        raise AssertionError("unreachable")


async def _start_stream(nursery: trio.Nursery, server: _Server, bus: SessionBus,
                        local: tuple[str, int], peer: tuple[str, int]) -> None:
    """``serve_sse`` for the connection ``local``/``peer``, parked for its first live event."""
    nursery.start_soon(serve_sse, {**PLAIN_SCOPE, "server": local, "client": peer,
                                   "query_string": b""},
                       server.receive, server.send, bus, {}, 3600.0)
    await trio.testing.wait_all_tasks_blocked()


async def test_serve_sse_sends_the_head_and_first_frame_through_the_server_then_the_socket(
) -> None:
    ours, theirs = _pair()
    theirs.setblocking(False)
    local, peer = ("127.0.0.1", 4170), ("127.0.0.1", 50124)
    registry.add((local, peer), ours, plain=True)
    server = _Server()
    bus = new_bus()
    received = bytearray()
    try:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                await _start_stream(nursery, server, bus, local, peer)
                publish(bus, 50)
                while len(ID_LINE.findall(received)) < 50:
                    await trio.lowlevel.wait_readable(theirs)
                    received.extend(theirs.recv(1 << 20))
                nursery.cancel_scope.cancel()
    finally:
        registry.remove((local, peer), ours)
    kinds = [m["type"] for m in server.messages]
    assert kinds[:2] == ["http.response.start", "http.response.body"]
    assert server.messages[1]["body"].startswith(b"retry:")
    # Every event frame went to the socket, framed as chunks; none went through the server.
    assert not any(ID_LINE.search(m.get("body", b"")) for m in server.messages)
    frames = b"".join(_dechunk(bytes(received)))
    assert [int(i) for i in ID_LINE.findall(frames)] == list(range(1, 51))
    ours.close()
    theirs.close()


async def test_serve_sse_writes_through_the_server_where_the_socket_may_not_be_used() -> None:
    server = _Server()
    bus = new_bus()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve_sse, {**PLAIN_SCOPE, "scheme": "https", "query_string": b""},
                           server.receive, server.send, bus, {}, 3600.0)
        await trio.testing.wait_all_tasks_blocked()
        publish(bus, 5)
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    ids = [int(i) for m in server.messages for i in ID_LINE.findall(m.get("body", b""))]
    assert ids == [1, 2, 3, 4, 5]


async def test_serve_sse_ends_quietly_and_cuts_the_connection_when_the_socket_breaks(
        monkeypatch: pytest.MonkeyPatch) -> None:
    ours, theirs = _pair()
    local, peer = ("127.0.0.1", 4170), ("127.0.0.1", 50125)
    registry.add((local, peer), ours, plain=True)
    cut: list[tuple[object, object]] = []
    monkeypatch.setattr("daemon.streams._sse.shutdown_connection",
                        lambda server, client: cut.append((server, client)))
    server = _Server()
    bus = new_bus()
    theirs.close()  # the peer is gone before the first live frame
    try:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                await _start_stream(nursery, server, bus, local, peer)
                for _ in range(3):  # the kernel may take the first write before it notices
                    publish(bus, 200, text_bytes=500)
                    await trio.testing.wait_all_tasks_blocked()
    finally:
        registry.remove((local, peer), ours)
    assert cut == [(local, peer)]  # the stream ended by itself and cut its connection
    assert not bus.subscribers
    # Nothing more went through the server after the first frame: no closing frames on a
    # connection whose chunk framing may have been broken mid-write.
    assert [m["type"] for m in server.messages] == ["http.response.start", "http.response.body"]
    ours.close()


# --- a real daemon --------------------------------------------------------------------------

async def test_a_real_daemons_stream_is_valid_chunked_http_with_every_event_and_its_end(
        tmp_path: Path) -> None:
    """h11, as the client, parses the whole response of a real daemon: the head and the first
    frame Hypercorn wrote, a 3,000-chunk turn written straight to the socket, and the last
    chunk Hypercorn writes when the session is deleted. A chunk framed wrongly, a frame lost or
    a body never ended fails it."""
    daemon = start_daemon(tmp_path)
    try:
        assert "event=direct_body_enabled" in daemon.stderr()
        async with httpx.AsyncClient(base_url=daemon.url) as client:
            sid = (await client.post("/session", json={})).json()["sessionId"]
            host, port = host_port(daemon.url)
            stream = await trio.open_tcp_stream(host, port)
            conn = h11.Connection(h11.CLIENT)
            await stream.send_all(conn.send(h11.Request(
                method="GET", target=f"/session/{sid}/events?maxQueued=2048",
                headers=[("Host", host), ("Accept", "text/event-stream")])))
            await stream.send_all(conn.send(h11.EndOfMessage()))
            body = bytearray()
            head: h11.Response | None = None
            ended = False
            opened, completed = trio.Event(), trio.Event()

            async def read() -> None:
                nonlocal head, ended
                while True:
                    event = conn.next_event()
                    if event is h11.NEED_DATA:
                        conn.receive_data(await stream.receive_some(1 << 20))
                    elif isinstance(event, h11.Response):
                        head = event
                    elif isinstance(event, h11.Data):
                        body.extend(event.data)
                        if body.startswith(b"retry:"):
                            opened.set()
                        if b"event: turn_complete" in body[-4096:]:
                            completed.set()
                    elif isinstance(event, h11.EndOfMessage):
                        ended = True
                        return
                    else:
                        raise AssertionError(f"unexpected {event!r}")

            with trio.fail_after(60):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(read)
                    await opened.wait()
                    await run_turn(client, sid,
                                   "mock:chunks=3000 mock:bytes=200 mock:delay_ms=0")
                    await completed.wait()
                    assert (await client.delete(f"/session/{sid}")).status_code < 300
            await stream.aclose()
        assert head is not None and head.status_code == 200
        assert (b"transfer-encoding", b"chunked") in list(head.headers)
        ids = [int(i) for i in ID_LINE.findall(bytes(body))]
        assert ids == list(range(ids[0], ids[0] + len(ids))) and len(ids) >= 3002  # echo + terminal
        assert ended
    finally:
        daemon.stop()


async def test_hypercorn_connections_are_registered_as_plain(tmp_path: Path) -> None:
    """The registry's plain mark comes from the stream type Hypercorn serves a plain TCP
    connection with: a Hypercorn upgrade that wraps it differently turns the direct path off
    (this fails) rather than writing to a socket under another layer."""
    from hypercorn.config import Config as HyperConfig
    from hypercorn.trio import serve

    assert sockets_install()
    seen: list[bool] = []

    async def app(scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await answer_lifespan(receive, send)
            return
        seen.append(direct_body(scope) is not None)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    hconf = HyperConfig()
    hconf.bind = ["127.0.0.1:0"]
    hconf.accesslog = None
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(partial(serve, app, hconf, shutdown_trigger=stop.wait))
        async with httpx.AsyncClient(base_url=binds[0]) as client:
            assert (await client.get("/")).text == "ok"
        stop.set()
    assert seen == [True]



# --- the start-up probe ---------------------------------------------------------------------

def _upper_hex_chunks(self: Any, data: bytes, write: Callable[[bytes], object]) -> None:
    """h11's chunk writer, but with upper-case hex sizes: valid HTTP/1.1, other bytes."""
    if data:
        write(b"%X\r\n" % len(data))
        write(data)
        write(b"\r\n")


def _probe_config() -> Any:
    from hypercorn.config import Config as HyperConfig

    hconf = HyperConfig()
    hconf.accesslog = None
    return hconf


async def test_the_probe_finds_this_hypercorn_writes_what_a_direct_write_does() -> None:
    from daemon.bridge import _probe

    assert sockets_install()
    result = await _probe.probe(_probe_config())
    assert result.identical, result.reason


async def test_a_hypercorn_that_frames_chunks_otherwise_fails_the_probe_and_keeps_asgi(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from daemon.bridge import _patches, _probe

    assert sockets_install()
    monkeypatch.setattr(h11._writers.ChunkedWriter, "send_data", _upper_hex_chunks)
    result = await _probe.probe(_probe_config())
    assert not result.identical and "bytes differ" in result.reason, result.reason
    monkeypatch.setattr(_patches, "_status", replace(_patches.status(), connection_registry=True))
    with caplog.at_level("INFO", logger="daemon.bridge"):
        assert not await _patches.probe_direct_body(_probe_config())
    assert any("event=direct_body_disabled" in r.getMessage() and "path=asgi" in r.getMessage()
               for r in caplog.records)
    sock = _FakeSock()
    registry.add((LOCAL, PEER), sock, plain=True)
    try:
        assert direct_body(PLAIN_SCOPE) is None  # the connection is known, the path is off
    finally:
        registry.remove((LOCAL, PEER), sock)


def _chunk_heads(raw: bytes) -> list[bytes]:
    """The chunk-size lines of an HTTP/1.1 chunked response as they were on the wire."""
    heads: list[bytes] = []
    at = raw.index(b"\r\n\r\n") + 4
    while True:
        end = raw.index(b"\r\n", at)
        head = raw[at:end]
        size = int(head, 16)
        heads.append(head)
        if size == 0:
            return heads
        at = end + 2 + size + 2


async def test_a_real_daemon_whose_probe_fails_serves_streams_through_asgi_and_logs_it(
        tmp_path: Path) -> None:
    """A daemon on a Hypercorn whose chunk heads differ from what a direct write sends (h11
    patched, through ``sitecustomize``, to write them in upper case) logs
    ``direct_body_disabled`` and writes every frame through Hypercorn: every chunk head of a
    3,000-chunk turn is Hypercorn's spelling, and the stream is whole."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import h11._writers\n\n\n"
        "def send_data(self, data, write):\n"
        "    if data:\n"
        "        write(b'%X\\r\\n' % len(data))\n"
        "        write(data)\n"
        "        write(b'\\r\\n')\n\n\n"
        "h11._writers.ChunkedWriter.send_data = send_data\n")
    daemon = start_daemon(tmp_path, env={"PYTHONPATH": str(site)})
    try:
        assert "event=direct_body_disabled" in daemon.stderr()
        assert "path=asgi" in daemon.stderr()
        async with httpx.AsyncClient(base_url=daemon.url) as client:
            sid = (await client.post("/session", json={})).json()["sessionId"]
            host, port = host_port(daemon.url)
            stream = await trio.open_tcp_stream(host, port)
            raw = bytearray()
            completed = trio.Event()
            await stream.send_all(f"GET /session/{sid}/events?maxQueued=2048 HTTP/1.1\r\n"
                                  f"Host: {host}\r\n\r\n".encode())

            async def read() -> None:
                while not raw.endswith(b"\r\n0\r\n\r\n"):
                    data = await stream.receive_some(1 << 20)
                    if not data:
                        return
                    raw.extend(data)
                    if b"event: turn_complete" in raw[-8192:]:
                        completed.set()

            with trio.fail_after(60):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(read)
                    await run_turn(client, sid,
                                   "mock:chunks=3000 mock:bytes=200 mock:delay_ms=0")
                    await completed.wait()
                    assert (await client.delete(f"/session/{sid}")).status_code < 300
            await stream.aclose()
    finally:
        daemon.stop()
    heads = _chunk_heads(bytes(raw))
    lettered = [h for h in heads if any(c in b"abcdefABCDEF" for c in h)]
    assert lettered and all(h == h.upper() for h in lettered), lettered[:10]
    body = b"".join(_dechunk(bytes(raw[raw.index(b"\r\n\r\n") + 4:-5])))
    ids = [int(i) for i in ID_LINE.findall(body)]
    assert ids == list(range(ids[0], ids[0] + len(ids))) and len(ids) >= 3002
