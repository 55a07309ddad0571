"""Subscribers that stall while replaying are evicted like live ones, over SSE and
WebSocket alike (issue: 64 subscribers replaying a full ring and never reading held every
subscriber slot for good, and every new subscriber got 429).

A stalled replayer is a raw socket with a small receive buffer that sends ``Last-Event-ID: 0``
to a ring holding more bytes than the loopback buffers take, then never reads. Once the session
publishes again, the replayers' lag passes the caps (and their next replay event leaves the
ring): each is evicted, its stalled write is cut after the grace period, and a new subscriber is
served again."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from functools import partial

import httpx
import pytest

from daemon.streams import MAX_SUBSCRIBERS
from tests.harness import RunningDaemon, running_daemon
from tests.stalls import (
    holds_connection,
    host_port,
    open_stalled_sse,
    open_stalled_ws,
    poll,
    run_turn,
    status,
)

pytestmark = pytest.mark.processes  # starts processes: not in make unit-fast

RING = 4000
FILL = f"fill: mock:chunks={RING} mock:bytes=1000 mock:delay_ms=0"  # ~4.8 MB in the ring
MORE = "more: mock:chunks=600 mock:bytes=100 mock:delay_ms=0"  # past the default 256 frames
# Without the cut a stalled connection is held for good, so a deadline far past the 1 s grace
# period tells "cut" from "held" on any machine; how soon it comes is measured by
# `python -m benchmarks stall_cut`, not asserted here.
CUT_DEADLINE_S = 30.0


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    with running_daemon(tmp_path_factory.mktemp("replay-stall"),
                        ["--no-persistence", "--event-ring-size", str(RING)]) as d:
        yield d


def _none_held(pid: int, port: int, peers: list[int]) -> bool:
    return not any(holds_connection(pid, port, peer) for peer in peers)


async def _subscribe_status(client: httpx.AsyncClient, path: str) -> int:
    async with client.stream("GET", path, headers={"Last-Event-ID": "0"}) as resp:
        return resp.status_code


@pytest.mark.parametrize("transport", ["sse", "ws"])
async def test_stalled_replayers_are_evicted_and_free_their_slots(
        daemon: RunningDaemon, transport: str) -> None:
    pid, port = daemon.proc.pid, host_port(daemon.url)[1]
    stalled: list[socket.socket] = []
    async with httpx.AsyncClient(base_url=daemon.url, timeout=30) as client:
        sid = (await client.post("/session", json={})).json()["sessionId"]
        await run_turn(client, sid, FILL)
        assert (await status(client, sid))["lastEventId"] > RING  # the ring is full
        try:
            for _ in range(MAX_SUBSCRIBERS):
                if transport == "sse":
                    stalled.append(open_stalled_sse(daemon.url, sid, query="",
                                                    headers={"Last-Event-ID": "0"}))
                else:
                    stalled.append(open_stalled_ws(daemon.url, sid, query="lastEventId=0"))
            await poll(partial(_count_is, client, sid, MAX_SUBSCRIBERS), 20, "64 subscribers")
            events = f"/session/{sid}/events"
            assert await _subscribe_status(client, events) == 429  # every slot is held
            evicted_before = (await status(client, sid))["clientsEvicted"]

            await run_turn(client, sid, MORE)
            await poll(partial(_count_is, client, sid, 0), CUT_DEADLINE_S, "the evictions")
            after = await status(client, sid)
            assert after["clientsEvicted"] - evicted_before == MAX_SUBSCRIBERS
            # Their writes stayed stalled: every connection is cut within the bound.
            peers = [sock.getsockname()[1] for sock in stalled]
            await poll(partial(_none_held, pid, port, peers), CUT_DEADLINE_S, "the cuts")
            assert await _subscribe_status(client, events) == 200
        finally:
            for sock in stalled:
                sock.close()


async def _count_is(client: httpx.AsyncClient, sid: str, n: int) -> bool:
    return bool((await status(client, sid))["subscribers"] == n)


# Long enough that all 64 subscribers are open before the first is cut, even when opening
# them is slow on a loaded machine (the count of 64 is what proves the slots were full).
PING_MS = 4000
STALLED_WRITE_MS = 4000


@pytest.fixture(scope="module")
def quiet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    """Short keepalive and stalled-write timers, for sessions that publish nothing."""
    with running_daemon(tmp_path_factory.mktemp("replay-stall-quiet"),
                        ["--no-persistence", "--event-ring-size", str(RING),
                         "--ws-ping-ms", str(PING_MS),
                         "--stalled-write-ms", str(STALLED_WRITE_MS)]) as d:
        yield d


async def test_stalled_sse_replayers_in_a_quiet_session_are_cut(quiet: RunningDaemon) -> None:
    """Nothing is published, so no lag builds up: a write that makes no progress for
    --stalled-write-ms is cut instead, and the slots are free again."""
    pid, port = quiet.proc.pid, host_port(quiet.url)[1]
    stalled: list[socket.socket] = []
    async with httpx.AsyncClient(base_url=quiet.url, timeout=30) as client:
        sid = (await client.post("/session", json={})).json()["sessionId"]
        await run_turn(client, sid, FILL)
        cuts_before = quiet.stderr().count("event=stalled_write_cut")
        try:
            for _ in range(MAX_SUBSCRIBERS):
                stalled.append(open_stalled_sse(quiet.url, sid, query="",
                                                headers={"Last-Event-ID": "0"}))
            await poll(partial(_count_is, client, sid, MAX_SUBSCRIBERS), 20, "64 subscribers")
            events = f"/session/{sid}/events"
            assert await _subscribe_status(client, events) == 429
            last_id = (await status(client, sid))["lastEventId"]
            # Cut 4-4.5 s after their writes stalled; the bound is generous.
            await poll(partial(_count_is, client, sid, 0), 30, "the stalled-write cuts")
            peers = [sock.getsockname()[1] for sock in stalled]
            await poll(partial(_none_held, pid, port, peers), CUT_DEADLINE_S, "the cuts")
            assert await _subscribe_status(client, events) == 200
            assert (await status(client, sid))["lastEventId"] == last_id  # nothing published
        finally:
            for sock in stalled:
                sock.close()
    assert quiet.stderr().count("event=stalled_write_cut") - cuts_before == MAX_SUBSCRIBERS


async def test_stalled_ws_replayers_in_a_quiet_session_fail_keepalive_and_are_cut(
        quiet: RunningDaemon) -> None:
    """Nothing is published, so no lag builds up: the WebSocket keepalive cuts them instead.
    Their pings cannot even be written (the replay write ahead of them is stalled), and two
    intervals without a pong end the connection."""
    pid, port = quiet.proc.pid, host_port(quiet.url)[1]
    stalled: list[socket.socket] = []
    async with httpx.AsyncClient(base_url=quiet.url, timeout=30) as client:
        sid = (await client.post("/session", json={})).json()["sessionId"]
        await run_turn(client, sid, FILL)
        failures_before = quiet.stderr().count("event=ws_keepalive_failed")
        failures_stalled_before = quiet.stderr().lower().count("stalled=true")
        try:
            for _ in range(MAX_SUBSCRIBERS):
                stalled.append(open_stalled_ws(quiet.url, sid, query="lastEventId=0"))
            await poll(partial(_count_is, client, sid, MAX_SUBSCRIBERS), 20, "64 subscribers")
            assert await _subscribe_status(client, f"/session/{sid}/events") == 429
            last_id = (await status(client, sid))["lastEventId"]
            # Two missed pongs take 8-12 s here; the bound is generous.
            await poll(partial(_count_is, client, sid, 0), 40, "the keepalive cuts")
            peers = [sock.getsockname()[1] for sock in stalled]
            await poll(partial(_none_held, pid, port, peers), CUT_DEADLINE_S, "the cuts")
            assert await _subscribe_status(client, f"/session/{sid}/events") == 200
            assert (await status(client, sid))["lastEventId"] == last_id  # nothing published
        finally:
            for sock in stalled:
                sock.close()
    log = quiet.stderr()
    assert log.count("event=ws_keepalive_failed") - failures_before == MAX_SUBSCRIBERS
    assert log.lower().count("stalled=true") - failures_stalled_before == MAX_SUBSCRIBERS
