"""WebSocket subscribers written by the delivery loop, against a real daemon on loopback: what a
strict client (wsproto) reads is wsproto's own framing, byte for byte, of one message per event
with the server's control frames whole between them, and the slow-client rules still apply.

- A reader that reads in small pieces through a small receive buffer (so the daemon's writes are
  cut short and finished by the stream's task, holding the connection's send lock) and sends
  pings all along: every pong Hypercorn writes, and every ping of its own keepalive, arrives
  whole between whole messages; the ids run from the first to the terminal.
- A WebSocket that stops reading while it waits in the loop is evicted and its connection cut,
  while a reader of the same session gets every message.

The loop's own rules on socket pairs: ``test_ws_delivery_loop.py``.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import httpx
import pytest
import trio
from wsproto import ConnectionType, WSConnection
from wsproto.connection import Connection
from wsproto.events import (
    AcceptConnection,
    Ping,
    Pong,
    Request,
    TextMessage,
)

from tests.harness import RunningDaemon, running_daemon
from tests.stalls import TURN_TEXT, holds_connection, host_port, open_stalled_ws, poll, status

pytestmark = pytest.mark.processes  # starts processes: not in make unit-fast

PING_MS = 1000  # the daemon's own pings: a few during a turn, never two missed by a reader
READ_BYTES = 4096  # the slow reader's piece


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    with running_daemon(tmp_path_factory.mktemp("wsloop"), ["--ws-ping-ms", str(PING_MS)]) as d:
        yield d


class StrictReader:
    """A WebSocket client that parses everything with wsproto and keeps the raw bytes after
    the handshake, with what it read in order: ("text", message), ("ping", payload) for the
    server's pings, ("pong", payload) for the answers to its own."""

    def __init__(self, daemon: RunningDaemon, sid: str, query: str) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, READ_BYTES)
        self.sock.settimeout(30)
        self.sock.connect(host_port(daemon.url))
        self.ws = WSConnection(ConnectionType.CLIENT)
        self.sock.sendall(self.ws.send(Request(host="127.0.0.1",
                                               target=f"/session/{sid}/ws?{query}")))
        self.raw = bytearray()
        self.read: list[tuple[str, str | bytes]] = []
        self.pings_sent = 0
        self.turn_done = False  # the turn's terminal was read
        self._text = ""
        self._head = bytearray()
        while not self.read_some(accepting=True):
            pass

    def read_some(self, *, accepting: bool = False) -> bool:
        """One read (at most READ_BYTES) and its events; True once accepted (``accepting``)."""
        data = self.sock.recv(READ_BYTES)
        assert data, "the daemon closed the connection"
        if accepting:
            self._head += data
            end = self._head.find(b"\r\n\r\n")
            if end >= 0:
                self.raw += self._head[end + 4:]
        else:
            self.raw += data
        self.ws.receive_data(data)
        accepted = False
        for event in self.ws.events():
            if isinstance(event, AcceptConnection):
                accepted = True
            elif isinstance(event, TextMessage):
                self._text += event.data
                if event.message_finished:
                    self.read.append(("text", self._text))
                    self.turn_done |= '"type":"turn_complete"' in self._text[:200]
                    self._text = ""
            elif isinstance(event, Ping):  # the daemon's keepalive: answer it at once
                self.read.append(("ping", bytes(event.payload)))
                self.sock.sendall(self.ws.send(event.response()))
            elif isinstance(event, Pong):
                self.read.append(("pong", bytes(event.payload)))
            else:  # a close (a protocol error included) or anything else
                raise AssertionError(f"unexpected {event!r} after {len(self.read)} items")
        return accepted

    def ping(self) -> None:
        self.pings_sent += 1
        self.sock.sendall(self.ws.send(Ping(payload=b"c%d" % self.pings_sent)))

    def messages(self) -> list[dict[str, object]]:
        return [json.loads(item) for kind, item in self.read if kind == "text"]

    def pongs(self) -> list[bytes]:
        return [item for kind, item in self.read if kind == "pong"]  # type: ignore[misc]

    def rebuilt(self) -> bytes:
        """What wsproto's server writes for everything read, in the order read."""
        server = Connection(ConnectionType.SERVER)
        out = bytearray()
        for kind, item in self.read:
            if kind == "text":
                assert isinstance(item, str)
                out += server.send(TextMessage(data=item))
            else:
                assert isinstance(item, bytes)
                out += server.send(Ping(payload=item) if kind == "ping" else Pong(payload=item))
        return bytes(out)


def test_a_slow_reader_that_pings_reads_whole_pongs_between_whole_messages(
        daemon: RunningDaemon) -> None:
    with httpx.Client(base_url=daemon.url, timeout=30) as client:
        sid = client.post("/session", json={}).raise_for_status().json()["sessionId"]
        reader = StrictReader(daemon, sid, "maxQueued=2048")
        try:
            # The turn stays under the widest caps even for a reader that took nothing until
            # its end (tests.stalls), so this reader is never evicted however slow it is.
            client.post(f"/session/{sid}/prompt", json={"prompt": [
                {"type": "text", "text": TURN_TEXT}]}).raise_for_status()
            reads = 0
            while not reader.turn_done:
                reader.read_some()
                reads += 1
                if reads % 3 == 0:
                    reader.ping()  # Hypercorn answers it under the connection's send lock
            while len(reader.pongs()) < reader.pings_sent:
                reader.read_some()
        finally:
            reader.sock.close()
    frames = reader.messages()
    ids = [frame["id"] for frame in frames if "id" in frame]
    assert ids == list(range(1, len(ids) + 1)) and len(ids) >= 1500
    assert frames[-1]["type"] == "turn_complete"
    # Every pong whole and in order, one per ping; and the bytes are wsproto's own framing of
    # what was read: no frame cut into, nothing between frames but frames.
    assert reader.pongs() == [b"c%d" % n for n in range(1, reader.pings_sent + 1)]
    assert reader.pings_sent >= 20
    assert bytes(reader.raw) == reader.rebuilt()


async def test_a_websocket_that_stops_reading_in_the_loop_is_evicted_and_cut(
        daemon: RunningDaemon) -> None:
    pid, port = daemon.proc.pid, host_port(daemon.url)[1]
    async with httpx.AsyncClient(base_url=daemon.url, timeout=30) as client:
        sid = (await client.post("/session", json={})).json()["sessionId"]
        # Upgraded, then never read again (it never answers a ping either): caught up, it
        # waits in the delivery loop until the turn fills its socket.
        stalled = open_stalled_ws(daemon.url, sid, query="maxQueued=64")
        reader = await trio.to_thread.run_sync(StrictReader, daemon, sid, "maxQueued=2048")
        try:
            answer = await client.post(f"/session/{sid}/prompt", json={
                "prompt": [{"type": "text", "text": TURN_TEXT}]})
            assert answer.status_code == 202, answer.text

            def read_turn() -> None:
                while not reader.turn_done:
                    reader.read_some()

            with trio.fail_after(60):
                await trio.to_thread.run_sync(read_turn)

            async def evicted() -> bool:
                return bool((await status(client, sid))["clientsEvicted"] >= 1)

            await poll(evicted, 20, "the stalled WebSocket's eviction")
            stalled_port = stalled.getsockname()[1]
            await poll(lambda: not holds_connection(pid, port, stalled_port), 20,
                       "the stalled WebSocket's connection to be cut")
        finally:
            reader.sock.close()
            stalled.close()
    frames = reader.messages()
    ids = [frame["id"] for frame in frames if "id" in frame]
    assert ids == list(range(ids[0], ids[0] + len(ids))) and len(ids) >= 1500
    assert frames[-1]["type"] == "turn_complete"
    assert all(frame["type"] != "client_evicted" for frame in frames)
    assert bytes(reader.raw) == reader.rebuilt()

