"""The delivery loop (daemon.delivery): caught-up SSE subscribers of every session written by one
task, without waking their own.

On real socket pairs through ``serve_sse``: the subscribers of many sessions that published in
one scheduler pass are written by one pass of the loop, their own tasks asleep; a write the
socket does not take whole goes back to the stream's task, which writes the rest first (the
subscriber is *sending* meanwhile, as the slow-client rules need) and parks again once caught
up; a parked stream still sends its heartbeat when nothing is written. On a real daemon: several
sessions' turns at once reach every subscriber whole while a stalled subscriber of one of them
is evicted as before.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import h11
import httpx
import pytest
import trio
import trio.testing

from daemon.bridge._direct_body import enable
from daemon.bridge._sockets import registry
from daemon.bus import SessionBus
from daemon.delivery import Delivery
from daemon.streams import Subscription, serve_sse
from tests.builders.sse_gather import ID_LINE, new_bus, publish
from tests.harness import start_daemon
from tests.stalls import TURN_TEXT, host_port, open_stalled_sse, poll, status

pytestmark = pytest.mark.processes  # the last test starts a daemon and its agent


@pytest.fixture(autouse=True)
def _direct_body_enabled() -> Iterator[None]:
    """Nothing ran the start-up probe in this process: enable the direct path as it would."""
    enable(True)
    yield
    enable(False)


def _dechunk(wire: bytes) -> bytes:
    """The body h11 decodes from ``wire`` (chunks, without the last one)."""
    client = h11.Connection(h11.CLIENT)
    client.send(h11.Request(method="GET", target="/", headers=[("Host", "x")]))
    client.receive_data(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + wire
                        + b"0\r\n\r\n")
    body = bytearray()
    while True:
        event = client.next_event()
        if isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            return bytes(body)
        elif event is h11.NEED_DATA:
            raise AssertionError(f"incomplete chunked body: {wire[-40:]!r}")


class _Server:
    """The ASGI side of one stream (the head and the first frame go through it)."""

    async def send(self, message: MutableMapping[str, Any]) -> None:
        pass

    async def receive(self) -> MutableMapping[str, Any]:
        await trio.sleep_forever()
        raise AssertionError("unreachable")


class _Peer:
    """One subscriber's connection: the daemon's end registered as plain, the peer's read."""

    def __init__(self, port: int, *, small: bool = False) -> None:
        ours, self.sock = socket.socketpair()
        if small:
            ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.sock.setblocking(False)
        self.ours = trio.socket.from_stdlib_socket(ours)
        self.local, self.peer = ("127.0.0.1", 4170), ("127.0.0.1", port)
        registry.add((self.local, self.peer), self.ours, plain=True)
        self.received = bytearray()

    def start(self, nursery: trio.Nursery, bus: SessionBus, heartbeat_s: float = 3600.0
              ) -> None:
        scope = {"type": "http", "http_version": "1.1", "scheme": "http", "method": "GET",
                 "server": self.local, "client": self.peer, "query_string": b""}
        server = _Server()
        nursery.start_soon(serve_sse, scope, server.receive, server.send, bus, {}, heartbeat_s)

    def read_now(self) -> None:
        while True:
            try:
                data = self.sock.recv(1 << 20)
            except BlockingIOError:
                return
            if not data:
                return
            self.received += data

    async def read_until_ids(self, count: int) -> list[int]:
        """The event ids of the whole body once it holds ``count`` of them (whole chunks)."""
        while True:
            if len(ID_LINE.findall(self.received)) >= count:
                try:
                    return [int(i) for i in ID_LINE.findall(_dechunk(bytes(self.received)))]
                except AssertionError:
                    pass  # the last chunk is still on its way
            await trio.lowlevel.wait_readable(self.sock)
            self.read_now()

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


async def test_the_subscribers_of_every_session_that_published_are_written_in_one_pass(
) -> None:
    buses = [new_bus() for _ in range(12)]
    peers = [_Peer(51000 + i) for i in range(2 * len(buses))]
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
                # One pass of the loop wrote all 24 streams; none of them left it.
                assert delivery.passes == passes + 1
                assert delivery.parked == len(peers)
                for peer in peers:
                    assert await peer.read_until_ids(3) == [1, 2, 3]
                assert not any(sub.sending for bus in buses for sub in bus.subscribers)
                for bus in buses:  # and again: the streams stayed parked
                    publish(bus, 2)
                await trio.testing.wait_all_tasks_blocked()
                assert delivery.passes == passes + 2
                for peer in peers:
                    assert await peer.read_until_ids(5) == [1, 2, 3, 4, 5]
                nursery.cancel_scope.cancel()
    finally:
        for peer in peers:
            peer.close()


async def test_a_publisher_holding_the_loop_writes_what_it_published_before_it_yields(
) -> None:
    """The agent reader's way: between ``hold`` and ``deliver_held`` a read's publishes mark
    their buses without waking the loop, and ``deliver_held`` writes every parked subscriber
    of them at once, in the publisher's task: one pass, the loop's task never woken."""
    buses = [new_bus() for _ in range(6)]
    peers = [_Peer(51050 + i) for i in range(2 * len(buses))]
    try:
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                for index, peer in enumerate(peers):
                    peer.start(nursery, buses[index // 2])
                await trio.testing.wait_all_tasks_blocked()
                delivery = Delivery.running()
                assert delivery is not None and delivery.parked == len(peers)
                passes = delivery.passes
                delivery.hold()
                for bus in buses:
                    publish(bus, 3)
                assert delivery.passes == passes  # nothing written yet
                delivery.deliver_held()
                assert delivery.passes == passes + 1
                for peer in peers:  # in the sockets already, before this task yields
                    peer.read_now()
                    assert len(ID_LINE.findall(peer.received)) == 3
                await trio.testing.wait_all_tasks_blocked()
                assert delivery.passes == passes + 1  # the loop had nothing left to do
                assert delivery.parked == len(peers)
                for peer in peers:
                    assert await peer.read_until_ids(3) == [1, 2, 3]
                for bus in buses:  # without a hold the loop writes them, as before
                    publish(bus, 2)
                await trio.testing.wait_all_tasks_blocked()
                assert delivery.passes == passes + 2
                for peer in peers:
                    assert await peer.read_until_ids(5) == [1, 2, 3, 4, 5]
                nursery.cancel_scope.cancel()
    finally:
        for peer in peers:
            peer.close()


async def test_a_write_the_socket_does_not_take_whole_is_finished_by_the_stream_first(
) -> None:
    bus = new_bus()
    peer = _Peer(51100, small=True)
    try:
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                with peer.cut_on_failure():
                    peer.start(nursery, bus)
                    await trio.testing.wait_all_tasks_blocked()
                    delivery = Delivery.running()
                    assert delivery is not None and delivery.parked == 1
                    sub = _subscription(bus)
                    # Far more than the socket buffers take: the loop's write is cut short and the
                    # stream's task takes the rest over, its write in flight (sending) until the
                    # peer reads.
                    publish(bus, 200, text_bytes=500)
                    await trio.testing.wait_all_tasks_blocked()
                    assert sub.sending
                    assert delivery.parked == 0
                    assert await peer.read_until_ids(200) == list(range(1, 201))
                    await trio.testing.wait_all_tasks_blocked()
                    assert not sub.sending and delivery.parked == 1  # caught up: parked again
                    publish(bus, 5)
                    assert await peer.read_until_ids(205) == list(range(1, 206))
                    nursery.cancel_scope.cancel()
    finally:
        peer.close()
    frames = _dechunk(bytes(peer.received))
    assert frames.count(b"event: session_update\n") == 205


async def test_a_parked_stream_sends_its_heartbeat_when_nothing_is_written() -> None:
    bus = new_bus()
    peer = _Peer(51200)
    try:
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                peer.start(nursery, bus, heartbeat_s=0.2)
                await trio.testing.wait_all_tasks_blocked()
                delivery = Delivery.running()
                assert delivery is not None and delivery.parked == 1
                while b":" not in _dechunk(bytes(peer.received)).replace(b"retry:", b""):
                    await trio.lowlevel.wait_readable(peer.sock)
                    peer.read_now()
                await trio.testing.wait_all_tasks_blocked()
                assert delivery.parked == 1  # and waits in the loop again
                publish(bus, 2)
                assert await peer.read_until_ids(2) == [1, 2]
                nursery.cancel_scope.cancel()
    finally:
        peer.close()


async def test_sessions_stream_whole_at_once_while_a_stalled_subscriber_is_evicted(
        tmp_path: Path) -> None:
    """A real daemon: four sessions' turns at once, two reading subscribers each (raw sockets,
    every frame checked), and on one session a third that never reads: it is evicted
    (``client_evicted`` counted by the daemon), the others get their turns whole."""
    daemon = start_daemon(tmp_path)
    try:
        async with httpx.AsyncClient(base_url=daemon.url, timeout=30) as client:
            sids = [(await client.post("/session", json={"sessionScope": "thread"}))
                    .json()["sessionId"] for _ in range(4)]
            stalled = open_stalled_sse(daemon.url, sids[0], query="maxQueued=64")
            host, port = host_port(daemon.url)
            readers: list[tuple[str, trio.SocketStream]] = []
            for sid in sids:
                for _ in range(2):
                    stream = await trio.open_tcp_stream(host, port)
                    await stream.send_all(
                        f"GET /session/{sid}/events?maxQueued=2048 HTTP/1.1\r\n"
                        f"Host: {host}\r\n\r\n".encode())
                    readers.append((sid, stream))
            bodies: dict[int, bytearray] = {i: bytearray() for i in range(len(readers))}

            async def read(index: int, stream: trio.SocketStream) -> None:
                while b"event: turn_complete" not in bodies[index]:
                    data = await stream.receive_some(1 << 16)
                    assert data, "the stream ended before its terminal"
                    bodies[index].extend(data)

            with trio.fail_after(60):
                async with trio.open_nursery() as nursery:
                    for index, (_, stream) in enumerate(readers):
                        nursery.start_soon(read, index, stream)
                    for index, sid in enumerate(sids):
                        # The stalled subscriber's session runs a turn that fills its socket.
                        text = TURN_TEXT if index == 0 else ("mock:chunks=400 mock:bytes=600 "
                                                             "mock:delay_ms=0")
                        answer = await client.post(f"/session/{sid}/prompt", json={
                            "prompt": [{"type": "text", "text": text}]})
                        assert answer.status_code == 202, answer.text

            async def evicted() -> bool:
                return bool((await status(client, sids[0]))["clientsEvicted"] >= 1)

            await poll(evicted, 20, "the stalled subscriber's eviction")
            for _, stream in readers:
                await stream.aclose()
        stalled.close()
    finally:
        daemon.stop()
    for index, (sid, _) in enumerate(readers):
        head, _, body = bytes(bodies[index]).partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head[:100]
        # Every write carries whole frames, so the chunk heads sit between frames.
        ids = [int(i) for i in ID_LINE.findall(body)]
        assert ids == list(range(ids[0], ids[0] + len(ids))), f"{sid}: ids not contiguous"
        assert body.count(b"event: session_update\n") >= 400
        assert b"event: turn_complete" in body and b"client_evicted" not in body
