"""The live-journal acceptance checks (a mid-turn marker and tail, the compacted turn after
the terminal, merging under the event cap alone) and the durable transcript, against the real daemon, the real mock agent
and a real SQLite file. The turn is held open with the mock's gate file, never a sleep."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import trio

from sdk.protocol.envelope import decode_events
from tests.harness import RunningDaemon, running_daemon
from tests.sse_client import Subscriber, chunk_kind, is_terminal_for, text_of

pytestmark = pytest.mark.processes  # starts processes: not in make unit-fast


@pytest.fixture(scope="module")
def tight_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    base = tmp_path_factory.mktemp("spec7")
    with running_daemon(base, ["--max-journal-events", "3", "--max-journal-bytes", "300"]) as d:
        yield d


@pytest.fixture(scope="module")
def merge_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    base = tmp_path_factory.mktemp("spec7merge")
    with running_daemon(base, ["--max-journal-events", "3"]) as d:
        yield d


async def create(client: httpx.AsyncClient) -> dict[str, object]:
    resp = await client.post("/session", json={"sessionScope": "thread"})
    assert resp.status_code == 200, resp.text
    return resp.json()  # type: ignore[no-any-return]


async def test_live_marker_then_complete_turn_after_terminal(tight_daemon: RunningDaemon) -> None:
    async with httpx.AsyncClient(base_url=tight_daemon.url) as a, \
            httpx.AsyncClient(base_url=tight_daemon.url) as b, trio.open_nursery() as nursery:
        created = await create(a)
        sid = created["sessionId"]
        watcher = Subscriber(b, f"/session/{sid}/events", {"Last-Event-ID": "0"})
        await nursery.start(watcher.run)
        resp = await a.post(f"/session/{sid}/prompt", json={"prompt": [
            {"type": "text", "text": "twenty please mock:chunks=20 mock:gate=spec7a"}]},
            headers={"X-Qwen-Client-Id": str(created["clientId"])})
        assert resp.status_code == 202
        prompt_id = resp.json()["promptId"]
        await watcher.wait_for(lambda e: text_of(e) == "chunk-19")

        # Item 1: a second client's load during the turn shows the live marker.
        mid = (await b.post(f"/session/{sid}/load", json={})).json()
        assert mid["hasActivePrompt"] is True
        live = mid["liveJournal"]
        marker = live[0]
        assert marker["type"] == "history_truncated" and "id" not in marker
        assert marker["promptId"] == prompt_id
        assert marker["data"]["scope"] == "live_journal"
        assert marker["data"]["maxEvents"] == 3
        assert marker["data"]["maxBytes"] == 300
        assert marker["data"]["fullTranscriptAvailable"] is True
        assert marker["data"]["truncatedEvents"] > 0
        tail_texts = [text_of(e) for e in decode_events(live[1:])]
        assert "chunk-0" not in tail_texts
        assert tail_texts[-1] == "chunk-19"
        assert marker["data"]["retainedEvents"] == len(live) - 1
        assert mid["lastEventId"] >= live[-1]["id"]

        # Item 2: after the terminal the compacted turn is whole and unmarked.
        tight_daemon.open_gate("spec7a")
        await watcher.wait_for(is_terminal_for(prompt_id))
        after = (await b.post(f"/session/{sid}/load", json={})).json()
        assert after["liveJournal"] == []
        assert after["hasActivePrompt"] is False
        events = decode_events(after["compactedReplay"])
        assert all(e.type != "history_truncated" for e in events)
        echo = [e for e in events if chunk_kind(e) == "user_message_chunk"]
        assert [e.prompt_id for e in echo] == [prompt_id]
        terminal = events[-1]
        assert terminal.type == "turn_complete" and terminal.data["promptId"] == prompt_id
        text = "".join(text_of(e) for e in events if chunk_kind(e) == "agent_message_chunk")
        assert text == "".join(f"chunk-{i}" for i in range(20))
        nursery.cancel_scope.cancel()


async def test_merged_chunks_show_no_marker(merge_daemon: RunningDaemon) -> None:
    async with httpx.AsyncClient(base_url=merge_daemon.url) as a, trio.open_nursery() as nursery:
        created = await create(a)
        sid = created["sessionId"]
        watcher = Subscriber(a, f"/session/{sid}/events", {"Last-Event-ID": "0"})
        await nursery.start(watcher.run)
        resp = await a.post(f"/session/{sid}/prompt", json={"prompt": [
            {"type": "text", "text": "mock:chunks=20 mock:gate=spec7merge"}]})
        prompt_id = resp.json()["promptId"]
        await watcher.wait_for(lambda e: text_of(e) == "chunk-19")
        mid = (await a.post(f"/session/{sid}/load", json={})).json()
        live = decode_events(mid["liveJournal"])
        assert [e.type for e in live] == ["session_update", "session_update"]
        assert chunk_kind(live[0]) == "user_message_chunk"
        assert text_of(live[1]) == "".join(f"chunk-{i}" for i in range(20))
        merge_daemon.open_gate("spec7merge")
        await watcher.wait_for(is_terminal_for(prompt_id))
        nursery.cancel_scope.cancel()


async def test_transcript_page_holds_the_whole_turn(tight_daemon: RunningDaemon) -> None:
    async with httpx.AsyncClient(base_url=tight_daemon.url) as a, trio.open_nursery() as nursery:
        created = await create(a)
        sid = created["sessionId"]
        watcher = Subscriber(a, f"/session/{sid}/events", {"Last-Event-ID": "0"})
        await nursery.start(watcher.run)
        resp = await a.post(f"/session/{sid}/prompt", json={"prompt": [
            {"type": "text", "text": "mock:chunks=20 mock:delay_ms=0"}]})
        prompt_id = resp.json()["promptId"]
        await watcher.wait_for(is_terminal_for(prompt_id))
        page = (await a.get(f"/session/{sid}/transcript")).json()
        assert page["v"] == 1 and page["sessionId"] == sid and page["hasMore"] is False
        events = decode_events(page["events"])
        assert events[-1].type == "turn_complete"
        text = "".join(text_of(e) for e in events if chunk_kind(e) == "agent_message_chunk")
        assert text == "".join(f"chunk-{i}" for i in range(20))
        record_ids = [e.data["update"]["_meta"]["qwen.session.recordId"]
                      for e in events if e.type == "session_update"]
        assert len(set(record_ids)) == len(record_ids)
        status = (await a.get(f"/session/{sid}/status")).json()
        assert status["durableEventId"] == status["lastEventId"] == watcher.ids()[-1]
        nursery.cancel_scope.cancel()


def test_sqlite_file_is_real(tight_daemon: RunningDaemon) -> None:
    path = Path(tight_daemon.data_dir) / "transcript.sqlite3"
    assert path.exists() and path.read_bytes()[:16] == b"SQLite format 3\x00"
