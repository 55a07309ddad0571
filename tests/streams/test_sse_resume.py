"""SSE resume against the real daemon: cursor inside the ring, before the ring,
wrong epoch, and no gap or duplicate while events keep flowing during the replay."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
import trio

from tests.harness import RunningDaemon, running_daemon
from tests.sse_client import Subscriber, is_terminal_for, text_of

pytestmark = pytest.mark.processes  # starts processes: not in make unit-fast


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    with running_daemon(tmp_path_factory.mktemp("resume")) as d:
        yield d


@pytest.fixture(scope="module")
def small_ring(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    with running_daemon(tmp_path_factory.mktemp("ring"), ["--event-ring-size", "20"]) as d:
        yield d


async def run_turn(client: httpx.AsyncClient, text: str) -> tuple[str, str, int]:
    """Create a session, run one ungated turn to its terminal; (session, epoch, last id).

    Follows the stream the way a client must: a subscriber evicted because its next event left
    a tiny ring reconnects from its cursor."""
    sid = (await client.post("/session", json={"sessionScope": "thread"})).json()["sessionId"]
    pid: str | None = None
    cursor, epoch = 0, None
    while True:
        headers = {"Last-Event-ID": str(cursor)}
        if epoch is not None:
            headers["X-Qwen-Event-Epoch"] = epoch
        async with trio.open_nursery() as nursery:
            sub = Subscriber(client, f"/session/{sid}/events", headers)
            await nursery.start(sub.run)
            assert sub.response_headers is not None
            epoch = sub.response_headers["x-qwen-event-epoch"]
            if pid is None:
                pid = (await client.post(f"/session/{sid}/prompt", json={
                    "prompt": [{"type": "text", "text": text}]})).json()["promptId"]
            try:
                terminal = await sub.wait_for(is_terminal_for(pid))
            except AssertionError:
                # Evicted (with client_evicted, or cut off if its write stalled): resume.
                cursor = max(sub.ids(), default=cursor)
                continue
            finally:
                nursery.cancel_scope.cancel()
        assert terminal.id is not None
        return sid, epoch, terminal.id


async def replay(client: httpx.AsyncClient, sid: str, headers: dict[str, str]) -> Subscriber:
    async with trio.open_nursery() as nursery:
        sub = Subscriber(client, f"/session/{sid}/events", headers)
        await nursery.start(sub.run)
        await sub.wait_for(lambda e: e.type == "replay_complete")
        nursery.cancel_scope.cancel()
    return sub


async def test_cursor_inside_ring_gets_exactly_the_missed_frames(daemon: RunningDaemon) -> None:
    async with httpx.AsyncClient(base_url=daemon.url) as client:
        sid, epoch, last = await run_turn(client, "mock:chunks=10 mock:delay_ms=0")
        sub = await replay(client, sid, {"Last-Event-ID": "5", "X-Qwen-Event-Epoch": epoch})
    types = [e.type for e in sub.events]
    assert types[-1] == "replay_complete"
    assert "state_resync_required" not in types
    assert sub.ids() == list(range(6, last + 1))
    done = sub.events[-1].data
    assert done == {"lastReplayedEventId": last, "lastEventId": last,
                    "replayedCount": last - 5}
    assert sub.raw.startswith(b"retry: 3000\n\n")


async def test_cursor_before_ring_reports_ring_evicted(small_ring: RunningDaemon) -> None:
    async with httpx.AsyncClient(base_url=small_ring.url) as client:
        sid, epoch, last = await run_turn(client, "mock:chunks=60 mock:delay_ms=0")
        sub = await replay(client, sid, {"Last-Event-ID": "2", "X-Qwen-Event-Epoch": epoch})
    first = last - 19
    resync = sub.events[0]
    assert resync.type == "state_resync_required" and resync.id is None
    assert resync.data == {"reason": "ring_evicted", "lastDeliveredId": 2,
                           "earliestAvailableId": first}
    assert sub.ids() == list(range(first, last + 1))
    assert sub.events[-1].data["replayedCount"] == 20


async def test_wrong_epoch_resets_and_replays_whole_ring(daemon: RunningDaemon) -> None:
    async with httpx.AsyncClient(base_url=daemon.url) as client:
        sid, _epoch, last = await run_turn(client, "mock:chunks=3 mock:delay_ms=0")
        sub = await replay(client, sid, {"Last-Event-ID": "2", "X-Qwen-Event-Epoch": "stale-epoch"})
    resync = sub.events[0]
    assert resync.type == "state_resync_required"
    assert resync.data == {"reason": "epoch_reset", "detail": "epoch_mismatch",
                           "lastDeliveredId": 2, "earliestAvailableId": 1}
    assert sub.ids() == list(range(1, last + 1))


async def test_cursor_beyond_head_is_an_epoch_reset_without_detail(daemon: RunningDaemon) -> None:
    async with httpx.AsyncClient(base_url=daemon.url) as client:
        sid, epoch, last = await run_turn(client, "mock:chunks=1 mock:delay_ms=0")
        sub = await replay(client, sid, {"Last-Event-ID": str(last + 50),
                                         "X-Qwen-Event-Epoch": epoch})
    assert sub.events[0].data == {"reason": "epoch_reset", "lastDeliveredId": last + 50,
                                  "earliestAvailableId": 1}
    assert sub.ids() == list(range(1, last + 1))


async def test_no_cursor_is_live_only(daemon: RunningDaemon) -> None:
    async with httpx.AsyncClient(base_url=daemon.url) as client, trio.open_nursery() as nursery:
        sid, _epoch, last = await run_turn(client, "mock:chunks=2 mock:delay_ms=0")
        sub = Subscriber(client, f"/session/{sid}/events")
        await nursery.start(sub.run)
        pid = (await client.post(f"/session/{sid}/prompt", json={"prompt": [
            {"type": "text", "text": "mock:chunks=2 mock:delay_ms=0"}]})).json()["promptId"]
        await sub.wait_for(is_terminal_for(pid))
        nursery.cancel_scope.cancel()
    assert "replay_complete" not in [e.type for e in sub.events]
    assert sub.ids()[0] == last + 1


async def test_resume_while_events_flow_has_no_gap_and_no_duplicate(
        daemon: RunningDaemon) -> None:
    # No reader here may be evicted, however slow this machine is: each turn is 1,500 chunks,
    # the first held at a gate until the live reader has all of it, so neither reader can ever
    # be more than ~1,505 events (about 0.5 MB) behind the head, under the 2,048-frame queue
    # (and the 2 MiB byte cap) they ask for. The second turn is published at full speed while
    # the late reader resumes from a cursor well inside the ring.
    chunks = 1500
    async with httpx.AsyncClient(base_url=daemon.url) as client, trio.open_nursery() as nursery:
        sid = (await client.post("/session", json={"sessionScope": "thread"})).json()["sessionId"]
        live = Subscriber(client, f"/session/{sid}/events?maxQueued=2048",
                          {"Last-Event-ID": "0"})
        await nursery.start(live.run)
        first = (await client.post(f"/session/{sid}/prompt", json={"prompt": [
            {"type": "text", "text": f"mock:chunks={chunks} mock:gate=resume-flow"}]})).json()
        second = (await client.post(f"/session/{sid}/prompt", json={"prompt": [
            {"type": "text", "text": f"mock:chunks={chunks} mock:delay_ms=0"}]})).json()
        pid, epoch = second["promptId"], first["eventEpoch"]
        last_chunk = f"chunk-{chunks - 1}"
        await live.wait_for(lambda e: e.prompt_id == first["promptId"]
                            and text_of(e) == last_chunk)
        daemon.open_gate("resume-flow")
        await live.wait_for(lambda e: e.prompt_id == pid and text_of(e) == "chunk-0")
        late = Subscriber(client, f"/session/{sid}/events?maxQueued=2048",
                          {"Last-Event-ID": "150", "X-Qwen-Event-Epoch": epoch})
        await nursery.start(late.run)
        terminal = await late.wait_for(is_terminal_for(pid), timeout=60)
        await live.wait_for(is_terminal_for(pid), timeout=60)
        nursery.cancel_scope.cancel()
    assert terminal.id is not None
    evicted = [e for e in (*live.events, *late.events) if e.type == "client_evicted"]
    assert evicted == []
    # Each stream's ids are contiguous (no gap, no duplicate), and both reach the terminal.
    late_ids, live_ids = late.ids(), live.ids()
    assert late_ids == list(range(151, 151 + len(late_ids))) and terminal.id in late_ids
    assert live_ids == list(range(1, 1 + len(live_ids))) and terminal.id in live_ids
    assert [e.type for e in late.events].count("replay_complete") == 1
    assert "state_resync_required" not in [e.type for e in late.events]
    for prompt_id in (first["promptId"], pid):
        texts = [text_of(e) for e in live.events
                 if e.prompt_id == prompt_id and text_of(e).startswith("chunk-")]
        assert texts == [f"chunk-{i}" for i in range(chunks)]
    # From its cursor to the terminal, the late reader got exactly the live reader's frames.
    assert [(e.id, e.type, text_of(e)) for e in late.events
            if e.id is not None and e.id <= terminal.id] == \
        [(e.id, e.type, text_of(e)) for e in live.events if 150 < (e.id or 0) <= terminal.id]


async def test_replay_past_the_byte_budget_is_cut_and_announced(daemon: RunningDaemon) -> None:
    async with httpx.AsyncClient(base_url=daemon.url) as client:
        # About 10 MB of events, all still in the 8,000-event ring: more than the 8 MiB budget.
        sid, epoch, last = await run_turn(client, "mock:chunks=7000 mock:bytes=1200 mock:delay_ms=0")
        sub = await replay(client, sid, {"Last-Event-ID": "0", "X-Qwen-Event-Epoch": epoch})
    cut = [e for e in sub.events if e.type == "state_resync_required"]
    assert len(cut) == 1 and cut[0].data["reason"] == "replay_budget_exceeded"
    replayed = sub.ids()
    assert replayed == list(range(1, len(replayed) + 1)) and replayed[-1] < last
    assert cut[0].data["lastDeliveredId"] == replayed[-1]
    assert cut[0].data["earliestAvailableId"] == last + 1
    # Event size = the encoded envelope, i.e. the frame's data line.
    replayed_bytes = sum(len(frame.split(b"\ndata: ", 1)[1])
                         for frame in bytes(sub.raw).split(b"\n\n") if frame.startswith(b"id: "))
    assert replayed_bytes <= 8 * 1024 * 1024
    done = sub.events[-1]
    assert done.type == "replay_complete" and done.data["replayedCount"] == len(replayed)
