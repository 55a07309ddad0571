"""Slow clients (SPEC §4.3): a subscriber that stops reading — a raw socket with a small
receive buffer, not a sleep — is warned, then evicted, while another subscriber receives every
event in order and the publisher publishes all of them."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import httpx
import pytest
import trio

from sdk.events import DaemonEvent
from sdk.sse import SSEParser
from tests.harness import RunningDaemon, running_daemon
from tests.sse_client import follow_until, is_terminal_for

CHUNKS = 12_000


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    with running_daemon(tmp_path_factory.mktemp("slow"), ["--no-persistence"]) as d:
        yield d


def open_stalled_subscriber(url: str, sid: str) -> socket.socket:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(10)
    sock.connect((host, int(port)))
    sock.sendall(f"GET /session/{sid}/events?maxQueued=2048 HTTP/1.1\r\n"
                 "Host: 127.0.0.1\r\n\r\n".encode())
    head = b""
    while b"retry: 3000\n\n" not in head:
        head += sock.recv(1024)
    assert head.startswith(b"HTTP/1.1 200")
    return sock  # from here on the test never reads it until the turn is over


def drain(sock: socket.socket) -> tuple[bytes, bool]:
    """Read until the response ends: its last chunk (the connection may stay open for keep-alive)
    or EOF (the daemon cut a connection whose write stayed stalled). Returns (data, cut)."""
    data = b""
    while True:
        chunk = sock.recv(1 << 16)
        if not chunk:
            return data, True
        data += chunk
        if data.endswith(b"\r\n0\r\n\r\n"):
            return data, False


async def test_stalled_subscriber_is_warned_then_evicted(daemon: RunningDaemon) -> None:
    async with httpx.AsyncClient(base_url=daemon.url) as client, trio.open_nursery() as nursery:
        sid = (await client.post("/session", json={"sessionScope": "thread"})).json()["sessionId"]
        stalled = open_stalled_subscriber(daemon.url, sid)
        pid_box: list[str] = []
        result: list[tuple[list[DaemonEvent], int]] = []

        async def healthy() -> None:
            # A well-behaved reader: if a starved test process ever falls behind the caps it is
            # evicted too, and resumes from its cursor like any client (never from scratch).
            result.append(await follow_until(
                client, sid, lambda e: bool(pid_box) and is_terminal_for(pid_box[0])(e)))

        nursery.start_soon(healthy)
        pid_box.append((await client.post(f"/session/{sid}/prompt", json={"prompt": [
            {"type": "text", "text": f"mock:chunks={CHUNKS} mock:bytes=700 mock:delay_ms=0"}]}
        )).json()["promptId"])
    async with httpx.AsyncClient(base_url=daemon.url) as client:
        status = (await client.get(f"/session/{sid}/status")).json()
    events, reconnects = result[0]
    terminal = events[-1]

    # The publisher published everything and the healthy subscriber got all of it, in order,
    # with no gap and no duplicate across its connections.
    assert terminal.id is not None and terminal.type == "turn_complete"
    ids = [e.id for e in events if e.id is not None]
    assert ids == list(range(1, terminal.id + 1))
    assert terminal.id >= CHUNKS + 2
    assert not [e for e in events if e.type == "state_resync_required"]
    # The stalled one was warned, then evicted, and no longer counts as a subscriber.
    assert status["slowClientWarnings"] >= 1
    assert status["clientsEvicted"] == 1 + reconnects
    # (The healthy reader may still be registered while its disconnect is noticed.)
    assert status["subscribers"] <= 1
    log = daemon.stderr()
    assert "event=slow_client_warning" in log and "event=client_evicted" in log
    assert "reason=queue_" in log

    # Its stream was ended by the daemon: once this reader drains its socket it finds either
    # the client_evicted frame and the end of the response (its write had completed), or EOF
    # (its write stayed stalled past the grace period and the connection was cut). What it did
    # get before that is an in-order prefix of the stream with no gap.
    stalled.settimeout(15)
    data, cut = drain(stalled)
    stalled.close()
    parser = SSEParser()
    got = []
    # (The response head was read when the stream opened.) Undo HTTP chunked framing loosely:
    # SSE frames never contain CRLF or CRLF-delimited hex lines.
    for line in data.split(b"\r\n"):
        if line and all(c in b"0123456789abcdefABCDEF" for c in line):
            continue
        got.extend(parser.feed(line))
    ids = [e.id for e in got if e.id is not None]
    assert ids and ids == list(range(ids[0], ids[0] + len(ids)))
    assert ids[-1] < terminal.id
    types = [e.type for e in got]
    if not cut:
        assert types[-1] == "client_evicted"
        evicted = got[-1].data
        assert evicted["reason"] in ("queue_overflow", "queue_bytes_overflow")
        assert evicted["droppedAfter"] == ids[-1]
        assert evicted["maxQueued"] == 2048
