"""Slow clients: a subscriber that stops reading — a raw socket with a small receive
buffer, never a sleep — is warned, evicted, and its stalled connection cut within the bound,
while a healthy subscriber on the same session is never evicted and receives every event in
order.

Deterministic whatever the machine's speed: the session publishes turns of 1,502 events and
1.77 MB, under the healthy reader's caps (2,048 frames, 2 MiB) even if it read nothing until the
turn's terminal, and the next turn starts only once the healthy reader has that terminal. So the
healthy reader cannot be evicted however slowly this process runs, while the stalled socket's
buffers (about 3 MB on loopback) fill within a few turns, and its lag then passes the caps.
Every wait is on the daemon's state (its status, its descriptor table) or on received frames."""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from functools import partial

import httpx
import pytest
import trio

from sdk.protocol.envelope import DaemonEvent
from sdk.protocol.sse import SSEParser
from tests.harness import RunningDaemon, running_daemon
from tests.sse_client import Subscriber, is_terminal_for
from tests.stalls import TURN_TEXT, holds_connection, host_port, open_stalled_sse, poll, status

pytestmark = pytest.mark.processes  # starts processes: not in make unit-fast

MAX_TURNS = 10  # the stalled socket is full after ~2; a turn more evicts it
# Without the cut the stalled connection is held for good (its reader never reads), so a deadline
# far past the 1 s grace period tells "cut" from "held" on any machine; how soon the cut comes is
# measured by `python -m benchmarks stall_cut`, not asserted here.
CUT_DEADLINE_S = 30.0


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    with running_daemon(tmp_path_factory.mktemp("slow"), ["--no-persistence"]) as d:
        yield d


def drain(sock: socket.socket) -> tuple[bytes, bool]:
    """Read what the daemon had written before it cut the connection. Returns (data, cut):
    cut is True when the connection ended with EOF or a reset rather than the end of the
    chunked response."""
    data = b""
    while True:
        try:
            chunk = sock.recv(1 << 16)
        except ConnectionResetError:
            return data, True
        if not chunk:
            return data, True
        data += chunk
        if data.endswith(b"\r\n0\r\n\r\n"):
            return data, False


def parse_sse_body(data: bytes) -> list[DaemonEvent]:
    """SSE events of a chunked response body (framing undone loosely: SSE frames never
    contain CRLF-delimited hex lines)."""
    parser = SSEParser()
    got: list[DaemonEvent] = []
    for line in data.split(b"\r\n"):
        if line and all(c in b"0123456789abcdefABCDEF" for c in line):
            continue
        got.extend(parser.feed(line))
    return got


async def _subscribers(client: httpx.AsyncClient, sid: str, n: int) -> bool:
    return bool((await status(client, sid))["subscribers"] == n)


async def test_stalled_subscriber_is_cut_and_the_healthy_one_loses_nothing(
        daemon: RunningDaemon) -> None:
    pid, port = daemon.proc.pid, host_port(daemon.url)[1]
    async with httpx.AsyncClient(base_url=daemon.url, timeout=30) as client, \
            trio.open_nursery() as nursery:
        sid = (await client.post("/session", json={})).json()["sessionId"]
        healthy = Subscriber(client, f"/session/{sid}/events?maxQueued=2048",
                             {"Last-Event-ID": "0"})
        await nursery.start(healthy.run)
        stalled = open_stalled_sse(daemon.url, sid)  # live only, maxQueued=2048
        stalled_port = stalled.getsockname()[1]
        await poll(partial(_subscribers, client, sid, 2), 10, "both subscribers")
        evicted_at: list[float] = []

        async def watch_eviction() -> None:
            async def evicted() -> bool:
                return bool((await status(client, sid))["clientsEvicted"] >= 1)
            await poll(evicted, 120, "the eviction", interval=0.01)
            evicted_at.append(trio.current_time())

        nursery.start_soon(watch_eviction)
        prompt_ids: list[str] = []
        for _ in range(MAX_TURNS):
            resp = await client.post(f"/session/{sid}/prompt", json={"prompt": [
                {"type": "text", "text": TURN_TEXT}]})
            assert resp.status_code == 202, resp.text
            prompt_ids.append(resp.json()["promptId"])
            # The next turn only once the healthy reader has this one's terminal.
            await healthy.wait_for(is_terminal_for(prompt_ids[-1]), timeout=60)
            if evicted_at:
                break
        assert evicted_at, f"the stalled subscriber was not evicted in {MAX_TURNS} turns"
        # Its write stays stalled, so its connection is cut: the daemon closes its descriptor.
        await poll(lambda: not holds_connection(pid, port, stalled_port), CUT_DEADLINE_S,
                   "the stalled connection to be cut")
        # One more turn after the eviction: the healthy reader is unaffected.
        resp = await client.post(f"/session/{sid}/prompt", json={"prompt": [
            {"type": "text", "text": TURN_TEXT}]})
        prompt_ids.append(resp.json()["promptId"])
        terminal = await healthy.wait_for(is_terminal_for(prompt_ids[-1]), timeout=60)
        final = await status(client, sid)
        nursery.cancel_scope.cancel()

    # The healthy reader: one connection, never evicted, every event in order, no gap, no
    # duplicate, ending with the last turn's terminal.
    types = [e.type for e in healthy.events]
    assert "client_evicted" not in types and "state_resync_required" not in types
    assert terminal.id is not None and terminal.type == "turn_complete"
    assert healthy.ids() == list(range(1, terminal.id + 1))
    assert [e for e in healthy.events if e.id is not None][-1] is terminal
    assert len(prompt_ids) >= 2 and terminal.id >= 1500 * len(prompt_ids)
    # The daemon evicted exactly one subscriber (the stalled one), after warning it.
    assert final["clientsEvicted"] == 1
    assert final["slowClientWarnings"] >= 1
    assert final["subscribers"] == 1
    log = daemon.stderr()
    assert "event=client_evicted" in log and "reason=queue_" in log
    assert re.search(rf"event=connection_cut .*peer=127\.0\.0\.1:{stalled_port}\b", log)

    # What the stalled reader did get before the cut is an in-order prefix with no gap, and the
    # connection ended without the response's end: it was cut, not closed politely.
    stalled.settimeout(15)
    data, cut = drain(stalled)
    stalled.close()
    assert cut
    ids = [e.id for e in parse_sse_body(data) if e.id is not None]
    assert ids == list(range(ids[0], ids[0] + len(ids))) if ids else True
    assert not ids or ids[-1] < terminal.id
