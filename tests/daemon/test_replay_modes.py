"""Memory replay vs configured replay, the replay-window marker and its paging
anchor, and transcript pages over HTTP."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
import trio

from sdk.protocol.envelope import decode_events
from tests.harness import RunningDaemon, running_daemon
from tests.sse_client import Subscriber, chunk_kind, is_terminal_for, text_of

pytestmark = pytest.mark.processes  # starts processes: not in make unit-fast


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    # A replay window that holds about two of these turns.
    with running_daemon(tmp_path_factory.mktemp("replay"),
                        ["--compacted-replay-max-bytes", "2500"]) as d:
        yield d


async def five_turns(client: httpx.AsyncClient) -> tuple[str, list[str]]:
    sid = (await client.post("/session", json={"sessionScope": "thread"})).json()["sessionId"]
    pids = []
    async with trio.open_nursery() as nursery:
        sub = Subscriber(client, f"/session/{sid}/events", {"Last-Event-ID": "0"})
        await nursery.start(sub.run)
        for i in range(5):
            pid = (await client.post(f"/session/{sid}/prompt", json={"prompt": [
                {"type": "text", "text": f"turn {i} mock:chunks=3 mock:bytes=150 mock:delay_ms=0"}
            ]})).json()["promptId"]
            await sub.wait_for(is_terminal_for(pid))
            pids.append(pid)
        nursery.cancel_scope.cancel()
    return sid, pids


def turn_texts(events: list) -> list[str]:  # type: ignore[type-arg]
    return [text_of(e) for e in events if chunk_kind(e) == "user_message_chunk"]


async def test_replay_window_marker_anchors_paging_to_the_dropped_turns(
        daemon: RunningDaemon) -> None:
    async with httpx.AsyncClient(base_url=daemon.url) as client:
        sid, _pids = await five_turns(client)
        body = (await client.post(f"/session/{sid}/load", json={})).json()
        replay = decode_events(body["compactedReplay"])
        marker = replay[0]
        assert marker.type == "history_truncated" and marker.id is None
        assert marker.prompt_id is None and "scope" not in marker.data
        kept = turn_texts(replay[1:])
        dropped = 5 - len(kept)
        assert 1 <= dropped < 5
        assert marker.data["truncatedTurns"] == dropped
        assert marker.data["retainedEvents"] == len(replay) - 1
        assert marker.data["maxBytes"] == 2500
        assert marker.data["fullTranscriptAvailable"] is True
        assert body["historyHasMore"] is True
        anchor = marker.data["recordId"]
        first_kept = replay[1].data["update"]["_meta"]["qwen.session.recordId"]
        assert anchor == first_kept
        # A page before the anchor returns exactly the dropped turns, in order.
        page = (await client.get(f"/session/{sid}/transcript",
                                 params={"beforeRecordId": anchor, "limit": 500})).json()
        paged = decode_events(page["events"])
        assert turn_texts(paged) == [f"turn {i} mock:chunks=3 mock:bytes=150 mock:delay_ms=0"
                                     for i in range(dropped)]
        assert page["hasMore"] is False
        assert marker.data["truncatedEvents"] == len(paged)


async def test_configured_replay_and_cursor_paging(daemon: RunningDaemon) -> None:
    async with httpx.AsyncClient(base_url=daemon.url) as client:
        sid, pids = await five_turns(client)
        body = (await client.post(f"/session/{sid}/load", json={"historyPageSize": 4})).json()
        assert body["liveJournal"] == []
        records = decode_events(body["compactedReplay"])
        assert len(records) == 4 and body["historyHasMore"] is True
        assert records[-1].type == "turn_complete" and records[-1].data["promptId"] == pids[-1]
        # Walk back with cursors: every record once, chronological inside each page.
        seen = []
        page = (await client.get(f"/session/{sid}/transcript", params={"limit": 4})).json()
        while True:
            seen[:0] = page["events"]
            if not page["hasMore"]:
                break
            page = (await client.get(f"/session/{sid}/transcript",
                                     params={"limit": 4, "cursor": page["nextCursor"]})).json()
        events = decode_events(seen)
        ids = [e.data["update"]["_meta"]["qwen.session.recordId"] if e.type == "session_update"
               else None for e in events]
        real = [i for i in ids if i is not None]
        assert len(real) == len(set(real))
        assert [e.data["promptId"] for e in events if e.type == "turn_complete"] == pids


async def test_configured_replay_falls_back_to_memory_while_a_prompt_runs(
        daemon: RunningDaemon) -> None:
    async with httpx.AsyncClient(base_url=daemon.url) as client, trio.open_nursery() as nursery:
        sid = (await client.post("/session", json={"sessionScope": "thread"})).json()["sessionId"]
        sub = Subscriber(client, f"/session/{sid}/events", {"Last-Event-ID": "0"})
        await nursery.start(sub.run)
        pid = (await client.post(f"/session/{sid}/prompt", json={"prompt": [
            {"type": "text", "text": "mock:chunks=2 mock:gate=fallback"}]})).json()["promptId"]
        await sub.wait_for(lambda e: text_of(e) == "chunk-1")
        body = (await client.post(f"/session/{sid}/load", json={"historyPageSize": 10})).json()
        assert body["hasActivePrompt"] is True
        live = decode_events(body["liveJournal"])
        assert [e.prompt_id for e in live] == [pid, pid]
        assert body["lastEventId"] == live[-1].id
        daemon.open_gate("fallback")
        await sub.wait_for(is_terminal_for(pid))
        nursery.cancel_scope.cancel()


async def test_summary_mode_is_served_from_its_own_journal(daemon: RunningDaemon) -> None:
    async with httpx.AsyncClient(base_url=daemon.url) as client, trio.open_nursery() as nursery:
        sid = (await client.post("/session", json={"sessionScope": "thread"})).json()["sessionId"]
        sub = Subscriber(client, f"/session/{sid}/events", {"Last-Event-ID": "0"})
        await nursery.start(sub.run)
        pid = (await client.post(f"/session/{sid}/prompt", json={"prompt": [
            {"type": "text", "text": "mock:chunks=2 mock:gate=summary"}]})).json()["promptId"]
        await sub.wait_for(lambda e: text_of(e) == "chunk-1")
        full = (await client.post(f"/session/{sid}/load", json={})).json()
        summary = (await client.post(f"/session/{sid}/load",
                                     json={"liveReplayMode": "summary"})).json()
        # The mock sends no subagent frames: both modes agree here.
        assert full["liveJournal"] == summary["liveJournal"]
        daemon.open_gate("summary")
        await sub.wait_for(is_terminal_for(pid))
        nursery.cancel_scope.cancel()
