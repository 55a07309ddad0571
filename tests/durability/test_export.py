"""Export: GET /session/{id}/export and `turnkeeper export` against a real daemon and its real
SQLite file. The round trip: the exported JSON Lines are exactly the events the paged transcript
route returns, paged back to the first, in order (finished turns and the unfinished one); the
same after a restart, for a session that was never loaded again. In process: the export reads
the transcript a page at a time (never all of it at once)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from daemon.export import export_body
from daemon.transcript_store import FinishTurn, TranscriptDatabase, UpsertSession
from daemon.transcript_writer import TranscriptWriter
from tests.harness import RunningDaemon, running_daemon, start_daemon
from tests.stalls import poll, run_turn

pytestmark = pytest.mark.processes  # starts processes: not in make unit-fast


def paged_transcript(client: httpx.Client, sid: str, limit: int = 3) -> list[Any]:
    """Every event of the paged route: newest page first, each page oldest first."""
    pages: list[list[Any]] = []
    params: dict[str, Any] = {"limit": limit}
    while True:
        page = client.get(f"/session/{sid}/transcript", params=params)
        assert page.status_code == 200, page.text
        body = page.json()
        pages.append(body["events"])
        if not body["hasMore"]:
            break
        params = {"limit": limit, "cursor": body["nextCursor"]}
    return [event for page in reversed(pages) for event in page]


def exported(client: httpx.Client, sid: str, fmt: str = "jsonl") -> httpx.Response:
    resp = client.get(f"/session/{sid}/export", params={"format": fmt})
    assert resp.status_code == 200, resp.text
    return resp


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    with running_daemon(tmp_path_factory.mktemp("export")) as d:
        yield d


async def test_round_trip_finished_and_unfinished_turns(daemon: RunningDaemon) -> None:
    async with httpx.AsyncClient(base_url=daemon.url, timeout=30) as client:
        sid = (await client.post("/session", json={"sessionScope": "thread"})).json()[
            "sessionId"]
        await run_turn(client, sid, "first mock:chunks=5")
        await run_turn(client, sid, "second mock:rich=1")
        await run_turn(client, sid, "third mock:chunks=40 mock:bytes=300")
        # A fourth turn held open: its events are the unfinished turn's raw events.
        prompt = await client.post(f"/session/{sid}/prompt", json={"prompt": [
            {"type": "text", "text": "held mock:chunks=3 mock:gate=export-held"}]})
        assert prompt.status_code == 202

        async def durable() -> bool:
            status = (await client.get(f"/session/{sid}/status")).json()
            return bool(status["durableEventId"] == status["lastEventId"]
                        and status["hasActivePrompt"])
        await poll(durable, 30, "the held turn's events to be durable")
    with httpx.Client(base_url=daemon.url, timeout=30) as client:
        paged = paged_transcript(client, sid)
        lines = exported(client, sid).content.splitlines()
        markdown = exported(client, sid, "markdown").text
    daemon.open_gate("export-held")
    assert [json.loads(line) for line in lines] == paged
    types = [event["type"] for event in paged]
    assert types.count("turn_complete") == 3
    texts = [e["data"]["update"]["content"]["text"] for e in paged
             if e["type"] == "session_update"
             and e["data"]["update"]["sessionUpdate"] == "user_message_chunk"]
    assert any(text.startswith("held") for text in texts), "the unfinished turn is exported"
    assert "## Turn 1" in markdown and "## Turn 4" in markdown
    assert "**User**\n\nfirst mock:chunks=5" in markdown
    assert "- Tool: Read README.md (completed)" in markdown
    assert "*Turn ended: end_turn.*" in markdown


def test_errors(daemon: RunningDaemon) -> None:
    with httpx.Client(base_url=daemon.url, timeout=30) as client:
        missing = client.get("/session/00000000-0000-4000-8000-000000000000/export")
        assert (missing.status_code, missing.json()["code"]) == (404, "session_not_found")
        sid = client.post("/session", json={"sessionScope": "thread"}).json()["sessionId"]
        bad = client.get(f"/session/{sid}/export", params={"format": "pdf"})
        assert (bad.status_code, bad.json()["code"]) == (400, "invalid_export_format")


def test_a_stored_session_exports_without_being_loaded_and_the_cli_agrees(
        tmp_path: Path) -> None:
    first = start_daemon(tmp_path, tag="a")
    try:
        with httpx.Client(base_url=first.url, timeout=30) as client:
            sid = client.post("/session", json={"sessionScope": "thread"}).json()["sessionId"]
            for text in ("one mock:chunks=3", "two mock:chunks=7"):
                client.post(f"/session/{sid}/prompt",
                            json={"prompt": [{"type": "text", "text": text}]})
            trio.run(_wait_idle, first.url, sid)
            before = exported(client, sid).content
    finally:
        first.stop()
    second = start_daemon(tmp_path, tag="b", data_dir=first.data_dir)
    try:
        with httpx.Client(base_url=second.url, timeout=30) as client:
            after = exported(client, sid).content
            sessions = client.get("/daemon/status").json()["sessions"]
            assert sid not in {s["sessionId"] for s in sessions}, "exported without a restore"
        cli = subprocess.run([sys.executable, "-m", "sdk", "--url", second.url, "export", sid],
                             capture_output=True, timeout=60)
        assert cli.returncode == 0, cli.stderr
    finally:
        second.stop()
    assert after.startswith(before)
    extra = [json.loads(line) for line in after[len(before):].splitlines()]
    # The stop added what it published: the session's close, stored like any event.
    assert [(e["type"], e["data"]["reason"]) for e in extra] == [
        ("session_closed", "daemon_shutdown")]
    assert cli.stdout == after
    assert len(before.splitlines()) >= 2 * 3  # echo, answer, terminal per turn


async def _wait_idle(url: str, sid: str) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        async def idle() -> bool:
            status = (await client.get(f"/session/{sid}/status")).json()
            return not status["hasActivePrompt"] and status["pendingPrompts"] == 0
        await poll(idle, 30, "the turns to end")


async def test_the_export_reads_a_page_at_a_time(tmp_path: Path) -> None:
    store = TranscriptDatabase(tmp_path / "t.sqlite3")
    writer = TranscriptWriter(store)
    reads = 0
    real_read = writer.read

    async def counting_read(fn: Any, **kw: Any) -> Any:
        nonlocal reads
        reads += 1
        return await real_read(fn, **kw)

    writer.read = counting_read  # type: ignore[method-assign]
    sid = "s-1"
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        writer.submit(UpsertSession(sid, "/w", 1))
        for turn in range(10):
            writer.submit(FinishTurn(sid, f"p{turn}", "completed", "end_turn", turn, [
                (f"r{turn}-{i}", b'{"id":%d,"type":"x"}' % (turn * 3 + i)) for i in range(3)]))
        chunks = [chunk async for chunk in export_body(writer, sid, "jsonl", "/w", page=4)]
        await writer.aclose()
    store.close()
    ids = [json.loads(line)["id"] for chunk in chunks for line in chunk.splitlines()]
    assert ids == list(range(30))
    # 30 records, 4 a read: 8 reads with records and one that finds the end.
    assert reads == 9
    assert max(len(chunk.splitlines()) for chunk in chunks) == 4
