"""The delivery loop (daemon.delivery) writes caught-up WebSocket subscribers too, under the
connection's send lock, and never lets a frame of the server's into one of its own.

On real socket pairs through ``serve_ws`` (the daemon's end registered as a plain connection
with its send lock, as Hypercorn's connection is): the WebSockets of many sessions that published
in one scheduler pass are written by one pass of the loop, their own tasks asleep, the bytes
wsproto's framing of one message per event; a write the socket does not take whole keeps the
send lock held until the stream's task has written the rest, so a frame the server writes
meanwhile (a pong) lands after it, whole; a connection whose server is mid-write goes back to
its task; a stalled WebSocket is evicted by the slow-client rules (``client_evicted`` and close
1008 once it reads again; cut, its lock let go, when it never does). The real daemon's side is
in ``test_ws_loop_wire.py``.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from typing import Any

import pytest
import trio
import trio.testing
from wsproto import ConnectionType
from wsproto.connection import Connection
from wsproto.events import Pong, TextMessage

from daemon.bridge import DirectWebSocket, _direct_ws, _ws_limits
from daemon.bridge._direct_body import write_all
from daemon.bridge._sockets import registry
from daemon.bus import SessionBus
from daemon.delivery import Delivery
from daemon.streams import Subscription, serve_ws
from tests.builders.sse_gather import new_bus, publish

PONG = bytes(Connection(ConnectionType.SERVER).send(Pong(payload=b"pong!")))


@pytest.fixture(autouse=True)
def _direct_ws_enabled(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing ran the start-up probe in this process: enable the direct path as it would
    (and as the daemon's WebSocket limits make every connection: no extension agreed)."""
    monkeypatch.setattr(_direct_ws, "_enabled", True)
    monkeypatch.setattr(_ws_limits, "installed", lambda: True)


def wsproto_frames(texts: list[str]) -> bytes:
    """What wsproto (Hypercorn's WebSocket library) writes for these messages, one each."""
    server = Connection(ConnectionType.SERVER)
    return b"".join(bytes(server.send(TextMessage(data=text))) for text in texts)


def parse(wire: bytes, *, arriving: bool = False) -> tuple[list[str], list[bytes]]:
    """The whole text messages and the pongs a strict client (wsproto) reads from ``wire``;
    fails on anything else (a protocol error closes wsproto's connection) or an unfinished
    message (unless more is ``arriving``)."""
    client = Connection(ConnectionType.CLIENT)
    client.receive_data(wire)
    texts: list[str] = []
    pongs: list[bytes] = []
    partial = ""
    for event in client.events():
        if isinstance(event, TextMessage):
            partial += event.data
            if event.message_finished:
                texts.append(partial)
                partial = ""
        elif isinstance(event, Pong):
            pongs.append(bytes(event.payload))
        else:
            raise AssertionError(f"not a message or a pong: {event!r}")
    assert arriving or partial == "", f"an unfinished message: {partial[-80:]!r}"
    return texts, pongs


def ids_of(texts: list[str]) -> list[int]:
    return [json.loads(text)["id"] for text in texts]


class _WsPeer:
    """One WebSocket subscriber's connection: the daemon's end registered as plain with its
    send lock (the server's), the peer's end read by the test; the ASGI side records what
    the stream sends through the server."""

    def __init__(self, port: int, *, small: bool = False) -> None:
        ours, self.sock = socket.socketpair()
        if small:
            ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.sock.setblocking(False)
        self.ours = trio.socket.from_stdlib_socket(ours)
        self.lock = trio.Semaphore(1, max_value=1)
        self.local, self.peer = ("127.0.0.1", 4171), ("127.0.0.1", port)
        registry.add((self.local, self.peer), self.ours, plain=True, send_lock=self.lock)
        self.received = bytearray()
        self.through_server: list[MutableMapping[str, Any]] = []
        self._connected = False
        self.done = trio.Event()

    def start(self, nursery: trio.Nursery, bus: SessionBus, query: bytes = b"") -> None:
        scope = {"type": "websocket", "http_version": "1.1", "scheme": "ws",
                 "server": self.local, "client": self.peer, "query_string": query}

        async def run() -> None:
            try:
                await serve_ws(scope, self.receive, self.send, bus, {}, 3600.0)
            finally:
                self.done.set()

        nursery.start_soon(run)

    async def receive(self) -> MutableMapping[str, Any]:
        if not self._connected:
            self._connected = True
            return {"type": "websocket.connect"}
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    async def send(self, message: MutableMapping[str, Any]) -> None:
        self.through_server.append(message)

    def read_now(self) -> bool:
        """Read what is there; False once the connection is over."""
        while True:
            try:
                data = self.sock.recv(1 << 20)
            except BlockingIOError:
                return True
            except ConnectionError:
                return False
            if not data:
                return False
            self.received += data

    async def read_forever(self) -> None:
        while True:
            await trio.lowlevel.wait_readable(self.sock)
            if not self.read_now():
                return

    async def read_until(self, count: int) -> list[str]:
        """The messages once ``count`` of them arrived whole."""
        while True:
            texts, _ = parse(bytes(self.received), arriving=True)
            if len(texts) >= count:
                return texts
            await trio.lowlevel.wait_readable(self.sock)
            assert self.read_now(), "the connection ended"

    @contextmanager
    def cut_on_failure(self) -> Iterator[None]:
        """A failing check inside the stream's nursery shuts the peer's end down, so a write
        the daemon's side waits on (shielded) ends and the test fails instead of hanging."""
        try:
            yield
        except BaseException:
            self.sock.shutdown(socket.SHUT_RDWR)
            raise

    def close(self) -> None:
        registry.remove((self.local, self.peer), self.ours)
        self.ours.close()
        self.sock.close()


def _subscription(bus: SessionBus) -> Subscription:
    (sub,) = bus.subscribers
    assert isinstance(sub, Subscription)
    return sub


def _ring_texts(bus: SessionBus) -> list[str]:
    return [event.raw.decode() for event in bus.ring.since(0)]


async def test_a_write_the_socket_takes_in_part_keeps_the_servers_lock_until_the_rest(
) -> None:
    """:class:`DirectWebSocket`'s non-blocking write, as the loop uses it: nothing while the
    server holds the lock; a partial write leaves it held (the server cannot write) until
    ``write_rest``, from another task, has written the rest."""
    ours, theirs = socket.socketpair()
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    theirs.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    ours.setblocking(False)
    theirs.setblocking(False)
    lock = trio.Semaphore(1, max_value=1)
    writer = DirectWebSocket(ours, lock)
    texts = ["y" * 300 + str(i) for i in range(400)]
    frames = wsproto_frames(texts)
    received = bytearray()
    try:
        lock.acquire_nowait()  # the server is writing
        assert writer.write_nowait(frames) == [frames]
        lock.release()
        rest = writer.write_nowait(frames)
        assert rest and 0 < sum(map(len, rest)) < len(frames)  # cut inside a frame
        with pytest.raises(trio.WouldBlock):
            lock.acquire_nowait()  # held for the rest: the server cannot write now

        async def read() -> None:
            while len(received) < len(frames):
                await trio.lowlevel.wait_readable(theirs)
                received.extend(theirs.recv(1 << 20))

        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(read)
                # Another task than the one that took the lock writes the rest and lets it go
                # (as the stream's task does for the loop's write).
                nursery.start_soon(writer.write_rest, rest)
        assert lock.value == 1
        assert bytes(received) == frames
        assert writer.write_nowait(frames[:10]) == [] and lock.value == 1
    finally:
        ours.close()
        theirs.close()


async def test_the_websockets_of_every_session_that_published_are_written_in_one_pass(
) -> None:
    buses = [new_bus() for _ in range(8)]
    peers = [_WsPeer(52000 + i) for i in range(2 * len(buses))]
    try:
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                for index, peer in enumerate(peers):
                    peer.start(nursery, buses[index // 2])
                await trio.testing.wait_all_tasks_blocked()
                delivery = Delivery.running()
                assert delivery is not None
                assert delivery.parked == len(peers)  # every caught-up stream waits there
                passes = delivery.passes
                for bus in buses:  # one scheduler pass publishes on every session
                    publish(bus, 3)
                await trio.testing.wait_all_tasks_blocked()
                # One pass of the loop wrote all 16 streams; none of them left it.
                assert delivery.passes == passes + 1
                assert delivery.parked == len(peers)
                for peer in peers:
                    assert ids_of(await peer.read_until(3)) == [1, 2, 3]
                for bus in buses:
                    publish(bus, 2, text_bytes=300)  # 16-bit lengths too
                await trio.testing.wait_all_tasks_blocked()
                assert delivery.passes == passes + 2
                for peer in peers:
                    assert ids_of(await peer.read_until(5)) == [1, 2, 3, 4, 5]
                assert not any(sub.sending for bus in buses for sub in bus.subscribers)
                nursery.cancel_scope.cancel()
    finally:
        for peer in peers:
            peer.close()
    for index, peer in enumerate(peers):
        # Byte for byte what wsproto writes: one message per event, nothing else.
        assert bytes(peer.received) == wsproto_frames(_ring_texts(buses[index // 2]))
        assert peer.through_server == [{"type": "websocket.accept",
                                        "headers": peer.through_server[0]["headers"]}]


async def test_a_partial_write_holds_the_send_lock_until_its_frame_is_whole() -> None:
    bus = new_bus()
    peer = _WsPeer(52100, small=True)
    try:
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                with peer.cut_on_failure():
                    peer.start(nursery, bus)
                    await trio.testing.wait_all_tasks_blocked()
                    delivery = Delivery.running()
                    assert delivery is not None and delivery.parked == 1
                    sub = _subscription(bus)
                    # Far more than the socket buffers take: the loop's write is cut short, in
                    # the middle of a frame, and the stream's task takes the rest over.
                    publish(bus, 200, text_bytes=500)
                    await trio.testing.wait_all_tasks_blocked()
                    assert sub.sending and delivery.parked == 0
                    assert peer.lock.value == 0  # still held for the rest of the frame

                    async def server_pong() -> None:  # Hypercorn's own write, as it does it
                        async with peer.lock:
                            await write_all(peer.ours, [PONG])

                    nursery.start_soon(server_pong)
                    await trio.testing.wait_all_tasks_blocked()
                    assert len(await peer.read_until(200)) == 200
                    while not bytes(peer.received).endswith(PONG):
                        await trio.lowlevel.wait_readable(peer.sock)
                        peer.read_now()
                    await trio.testing.wait_all_tasks_blocked()
                    assert not sub.sending and delivery.parked == 1  # caught up: parked again
                    assert peer.lock.value == 1  # let go
                    publish(bus, 5)
                    assert len(await peer.read_until(205)) == 205
                    nursery.cancel_scope.cancel()
    finally:
        peer.close()
    texts = [event.raw.decode() for event in bus.ring.since(0)]
    # The pong went after the last frame the loop had begun, whole: no byte of it in a frame.
    assert bytes(peer.received) == wsproto_frames(texts[:200]) + PONG + wsproto_frames(
        texts[200:])
    assert parse(bytes(peer.received))[1] == [b"pong!"]


async def test_a_connection_whose_server_is_writing_goes_back_to_its_stream() -> None:
    bus = new_bus()
    peer = _WsPeer(52200)
    try:
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                with peer.cut_on_failure():
                    peer.start(nursery, bus)
                    await trio.testing.wait_all_tasks_blocked()
                    delivery = Delivery.running()
                    assert delivery is not None and delivery.parked == 1
                    sub = _subscription(bus)
                    peer.lock.acquire_nowait()  # the server is writing a frame of its own
                    publish(bus, 4)
                    await trio.testing.wait_all_tasks_blocked()
                    # The loop wrote nothing: the stream's task waits for the lock.
                    assert sub.sending and delivery.parked == 0
                    assert peer.read_now() and not peer.received
                    peer.lock.release()
                    assert ids_of(await peer.read_until(4)) == [1, 2, 3, 4]
                    await trio.testing.wait_all_tasks_blocked()
                    assert not sub.sending and delivery.parked == 1
                    nursery.cancel_scope.cancel()
    finally:
        peer.close()
    assert bytes(peer.received) == wsproto_frames(_ring_texts(bus))


async def test_an_evicted_websocket_that_reads_again_gets_client_evicted_and_1008() -> None:
    bus = new_bus()
    peer = _WsPeer(52300, small=True)
    try:
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                with peer.cut_on_failure():
                    peer.start(nursery, bus, b"maxQueued=16")
                    await trio.testing.wait_all_tasks_blocked()
                    sub = _subscription(bus)
                    publish(bus, 200, text_bytes=500)  # fills the socket: a write in flight
                    await trio.testing.wait_all_tasks_blocked()
                    assert sub.sending
                    publish(bus, 40)  # past its caps while that write is in flight
                    await trio.testing.wait_all_tasks_blocked()
                    assert bus.clients_evicted == 1 and sub.evicted.is_set()
                    async with trio.open_nursery() as reading:  # it reads again
                        reading.start_soon(peer.read_forever)
                        await peer.done.wait()  # the stream ended
                        reading.cancel_scope.cancel()
                    peer.read_now()
    finally:
        peer.close()
    texts, _ = parse(bytes(peer.received))
    ids = ids_of(texts)
    assert ids == list(range(1, len(ids) + 1)) and len(ids) >= 200  # whole frames, in order
    kinds = [message["type"] for message in peer.through_server]
    assert kinds == ["websocket.accept", "websocket.send", "websocket.close"]
    assert json.loads(peer.through_server[1]["text"])["type"] == "client_evicted"
    assert peer.through_server[2]["code"] == 1008


async def test_a_stalled_websocket_is_evicted_cut_and_its_send_lock_let_go() -> None:
    bus = new_bus()
    peer = _WsPeer(52400, small=True)
    try:
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                peer.start(nursery, bus, b"maxQueued=16")
                await trio.testing.wait_all_tasks_blocked()
                sub = _subscription(bus)
                publish(bus, 200, text_bytes=500)
                await trio.testing.wait_all_tasks_blocked()
                assert sub.sending and peer.lock.value == 0
                publish(bus, 40)
                await trio.testing.wait_all_tasks_blocked()
                assert bus.clients_evicted == 1
                # It never reads: after the grace period the connection is cut, the write in
                # flight fails, the lock it held is let go and the stream ends.
                await peer.done.wait()
        assert peer.lock.value == 1
        assert peer.ours.fileno() == -1  # cut and closed
        assert [m["type"] for m in peer.through_server] == ["websocket.accept"]
    finally:
        peer.close()
