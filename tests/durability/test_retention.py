"""Retention against real daemons and their real SQLite files.

- DELETE /session/{id} removes the session's rows, and the pages they held are reused by the
  next sessions: over delete/create cycles the file stays flat; a kept session's history,
  durableEventId and restore are untouched.
- A live turn streams every event, in order, and stays durable while a prune runs.
- --retain-bytes removes the least recently active stored sessions until the transcript fits;
  `turnkeeper-daemon prune` removes by age (and --dry-run changes nothing).
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from daemon.core.retention import (
    RetentionPolicy,
    StoredSession,
    by_bytes_order,
    expired,
    parse_size,
)
from tests.harness import RunningDaemon, running_daemon, start_daemon
from tests.stalls import poll, run_turn

pytestmark = pytest.mark.processes  # starts processes: not in make unit-fast

BIG_TURN = "mock:chunks=400 mock:bytes=2500"  # about 1 MB of records a turn


def on_disk(daemon: RunningDaemon) -> int:
    total = 0
    for name in ("transcript.sqlite3", "transcript.sqlite3-wal"):
        path = Path(daemon.data_dir) / name
        if path.exists():
            total += path.stat().st_size
    return total


async def metric(client: httpx.AsyncClient, name: str) -> float:
    for line in (await client.get("/metrics")).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


async def new_session(client: httpx.AsyncClient) -> str:
    resp = await client.post("/session", json={"sessionScope": "thread"})
    assert resp.status_code == 200, resp.text
    return str(resp.json()["sessionId"])


def rows_of(db: Path, session_ids: set[str]) -> dict[str, int]:
    conn = sqlite3.connect(db)
    try:
        marks = ",".join("?" * len(session_ids))
        return {table: conn.execute(f"SELECT count(*) FROM {table} WHERE session_id IN "
                                    f"({marks})", tuple(session_ids)).fetchone()[0]
                for table in ("sessions", "records", "raw_events", "prompts")}
    finally:
        conn.close()


async def test_deleted_sessions_leave_the_file_and_their_pages_are_reused(
        tmp_path: Path) -> None:
    cycles = 6
    deleted: set[str] = set()
    sizes: list[int] = []
    with running_daemon(tmp_path) as daemon:
        async with httpx.AsyncClient(base_url=daemon.url, timeout=60) as client:
            kept = await new_session(client)
            await run_turn(client, kept, "kept mock:chunks=20")
            kept_export = (await client.get(f"/session/{kept}/export")).content
            kept_durable = (await client.get(f"/session/{kept}/status")).json()[
                "durableEventId"]
            for cycle in range(1, cycles + 1):
                sid = await new_session(client)
                await run_turn(client, sid, BIG_TURN)
                assert (await client.delete(f"/session/{sid}")).status_code == 204
                deleted.add(sid)

                async def removed(n: int = cycle) -> bool:
                    return await metric(client, "turnkeeper_retention_sessions_removed_total") \
                        >= n
                await poll(removed, 60, f"cycle {cycle}'s session to be removed")
                sizes.append(on_disk(daemon))
            assert (await client.get(f"/session/{kept}/export")).content == kept_export
            status = (await client.get(f"/session/{kept}/status")).json()
            assert status["durableEventId"] == kept_durable
    # Each cycle stores about 1 MB and frees it: after the first cycles the file no longer
    # grows (without the removal it would grow by about 1 MB a cycle).
    # (The WAL's size moves by up to a few MiB between checkpoints: a bound of 2 MiB over the
    # second cycle's size, where four more cycles without the removal add about 4 MB.)
    assert max(sizes[2:]) <= sizes[1] + 2 * 1024 * 1024, sizes
    db = Path(daemon.data_dir) / "transcript.sqlite3"
    assert rows_of(db, deleted) == {"sessions": 0, "records": 0, "raw_events": 0, "prompts": 0}
    # Restore of the kept session from the pruned file: the same history.
    with running_daemon(tmp_path, data_dir=Path(daemon.data_dir), tag="again") as again:
        with httpx.Client(base_url=again.url, timeout=60) as client:
            loaded = client.post(f"/session/{kept}/load", json={})
            assert loaded.status_code == 200, loaded.text
            assert client.get(f"/session/{kept}/export").content.startswith(kept_export)
            gone = client.post(f"/session/{next(iter(deleted))}/load", json={})
            assert gone.status_code == 404


async def test_a_live_turn_streams_without_a_gap_during_a_prune(tmp_path: Path) -> None:
    with running_daemon(tmp_path) as daemon:
        async with httpx.AsyncClient(base_url=daemon.url, timeout=60) as client:
            doomed = await new_session(client)
            for _ in range(3):
                await run_turn(client, doomed, BIG_TURN)
            live = await new_session(client)
            ids: list[int] = []
            chunks = 0
            terminal: dict[str, Any] = {}
            removed_at_terminal = -1.0
            async with client.stream("GET", f"/session/{live}/events") as stream:
                resp = await client.post(f"/session/{live}/prompt", json={"prompt": [
                    {"type": "text", "text": "live mock:chunks=3000 mock:bytes=300 "
                                             "mock:gate=prune-live"}]})
                assert resp.status_code == 202
                deleted = False
                buffer = b""
                async for piece in stream.aiter_bytes():
                    buffer += piece
                    *frames, buffer = buffer.split(b"\n\n")
                    for frame in frames:
                        data = [line[6:] for line in frame.split(b"\n")
                                if line.startswith(b"data: ")]
                        if not data:
                            continue
                        event = json.loads(data[0])
                        if event.get("id") is not None:
                            ids.append(event["id"])
                        assert event["type"] not in ("client_evicted", "state_resync_required",
                                                     "slow_client_warning"), event
                        update = event.get("data", {}).get("update", {})
                        if update.get("sessionUpdate") == "agent_message_chunk":
                            chunks += 1
                            if not deleted:  # the prune starts while the turn streams
                                deleted = True
                                gone = await client.delete(f"/session/{doomed}")
                                assert gone.status_code == 204
                            if chunks == 3000:
                                async def pruned() -> bool:
                                    return await metric(
                                        client, "turnkeeper_retention_sessions_removed_total"
                                    ) >= 1
                                await poll(pruned, 60, "the prune to finish")
                                daemon.open_gate("prune-live")
                        if event["type"] in ("turn_complete", "turn_error"):
                            terminal = event
                            removed_at_terminal = await metric(
                                client, "turnkeeper_retention_sessions_removed_total")
                    if terminal:
                        break

            async def durable() -> dict[str, Any] | None:
                status = (await client.get(f"/session/{live}/status")).json()
                return status if status["durableEventId"] == status["lastEventId"] else None
            status = await poll(durable, 30, "every event of the live turn to be durable")
    assert terminal["type"] == "turn_complete", terminal
    assert chunks == 3000
    assert ids == list(range(ids[0], ids[0] + len(ids))), "no event skipped"
    assert removed_at_terminal >= 1, "the prune ran while the turn was open"
    assert status["lastEventId"] == ids[-1]
    assert rows_of(Path(daemon.data_dir) / "transcript.sqlite3", {doomed})["records"] == 0


async def test_retain_bytes_removes_the_least_recently_active_stored_sessions(
        tmp_path: Path) -> None:
    # Four sessions of about 1 MB each on about 1 MB of schema and free-page overhead: two
    # sessions take about 3.0 MB and three about 4.0, so a cap halfway between keeps two.
    args = ["--retain-bytes", "3.5M", "--retention-interval-ms", "300",
            "--session-idle-ms", "300"]
    with running_daemon(tmp_path, args) as daemon:
        async with httpx.AsyncClient(base_url=daemon.url, timeout=60) as client:
            order = []
            for _ in range(4):
                sid = await new_session(client)
                await run_turn(client, sid, BIG_TURN)
                order.append(sid)
                await trio.sleep(0.01)  # distinct activity times (ms), oldest first

            async def two_removed() -> bool:
                return await metric(client, "turnkeeper_retention_sessions_removed_total") >= 2
            await poll(two_removed, 60, "the two oldest sessions to be removed")
            passes = await metric(client, "turnkeeper_retention_passes_total")

            async def two_more_passes() -> bool:
                return await metric(client, "turnkeeper_retention_passes_total") >= passes + 2
            await poll(two_more_passes, 30, "two more passes")
            removed = await metric(client, "turnkeeper_retention_sessions_removed_total")
    left = rows_of(Path(daemon.data_dir) / "transcript.sqlite3", set(order[2:]))
    gone = rows_of(Path(daemon.data_dir) / "transcript.sqlite3", set(order[:2]))
    assert removed == 2
    assert gone["sessions"] == 0 and gone["records"] == 0
    assert left["sessions"] == 2 and left["records"] > 0


def test_prune_offline_by_age_and_dry_run(tmp_path: Path) -> None:
    first = start_daemon(tmp_path, tag="a")
    try:
        with httpx.Client(base_url=first.url, timeout=60) as client:
            sids = []
            for text in ("old mock:chunks=3", "new mock:chunks=3"):
                sid = client.post("/session", json={"sessionScope": "thread"}).json()[
                    "sessionId"]
                client.post(f"/session/{sid}/prompt",
                            json={"prompt": [{"type": "text", "text": text}]})
                trio.run(_idle, first.url, sid)
                sids.append(sid)
    finally:
        first.stop()
    db = Path(first.data_dir) / "transcript.sqlite3"
    conn = sqlite3.connect(db)
    activity = dict(conn.execute(
        "SELECT session_id, max(coalesce(ended_at, admitted_at)) FROM prompts GROUP BY "
        "session_id").fetchall())
    conn.close()
    old, new = sids
    assert activity[new] > activity[old]
    # A clock at which the old session is just past 5 days idle and the new one is not.
    now = activity[old] + 5 * 86_400_000 + (activity[new] - activity[old]) // 2
    base = [sys.executable, "-m", "daemon", "prune", "--data-dir", str(first.data_dir),
            "--retain-days", "5", "--now-ms", str(now)]
    dry = subprocess.run([*base, "--dry-run"], capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr
    assert f"would remove session {old}" in dry.stdout and new not in dry.stdout
    assert rows_of(db, {old})["sessions"] == 1
    done = subprocess.run(base, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert f"removed session {old}" in done.stdout
    assert rows_of(db, {old}) == {"sessions": 0, "records": 0, "raw_events": 0, "prompts": 0}
    assert rows_of(db, {new})["records"] > 0


async def _idle(url: str, sid: str) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        async def idle() -> bool:
            status = (await client.get(f"/session/{sid}/status")).json()
            return not status["hasActivePrompt"] and status["pendingPrompts"] == 0
        await poll(idle, 30, "the turn to end")


def test_the_policy() -> None:
    sessions = [StoredSession("a", False, 100), StoredSession("b", True, 500),
                StoredSession("c", False, 300), StoredSession("d", False, 50)]
    assert expired(sessions, {"d"}, RetentionPolicy(), 10_000) == ["b"]
    day = 86_400_000
    policy = RetentionPolicy(retain_days=1)
    assert expired(sessions, {"d"}, policy, day + 200) == ["b", "a"]
    assert expired(sessions, set(), policy, day + 200) == ["b", "d", "a"]
    assert by_bytes_order(sessions, {"a"}) == ["d", "c", "b"]
    assert parse_size("2.5M") == 2_500_000 and parse_size("1GiB") == 1 << 30
    assert parse_size("4096") == 4096


class _NoSessionsLoaded:
    def __init__(self) -> None:
        self.sessions: dict[str, object] = {}

    async def retire(self, session_id: str) -> bool:
        raise AssertionError("only closed sessions here")


async def test_a_commit_cuts_a_retention_step_which_is_taken_again(
        tmp_path: Path, monkeypatch: Any) -> None:
    """In process, on a real file: a commit arriving while a (deliberately large) deletion
    step runs interrupts it; the step rolls back whole, the commit lands, and the step is taken
    again until the session is gone."""
    from daemon import retention as retention_module
    from daemon.retention import Retention
    from daemon.transcript_store import (
        AppendEvent,
        FinishTurn,
        MarkClosed,
        TranscriptDatabase,
        UpsertSession,
    )
    from daemon.transcript_writer import TranscriptWriter

    monkeypatch.setattr(retention_module, "DELETE_ROWS", 10**7)  # one step: the whole session
    deleting: list[bool] = []
    real_delete = retention_module.delete_step

    def delete_step(store: TranscriptDatabase, session_id: str, rows: int) -> bool:
        deleting.append(True)  # read by the commit below, from the event loop's thread
        return real_delete(store, session_id, rows)

    monkeypatch.setattr(retention_module, "delete_step", delete_step)
    store = TranscriptDatabase(tmp_path / "t.sqlite3")
    writer = TranscriptWriter(store)
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        writer.submit(UpsertSession("doomed", "/w", 1))
        writer.submit(UpsertSession("live", "/w", 1))
        for turn in range(40):
            writer.submit(FinishTurn("doomed", f"p{turn}", "completed", "end_turn", 2, [
                (f"r{turn}-{i}", b'{"id":1,"type":"x","pad":"' + b"." * 200 + b'"}')
                for i in range(5000)]))
        writer.submit(MarkClosed("doomed"))
        assert await writer.wait_flushed()
        retention = Retention(writer, _NoSessionsLoaded(),  # type: ignore[arg-type]
                              RetentionPolicy(), interval_s=3600)
        committed: list[bool] = []

        async def commit_during_the_step() -> None:
            while not deleting:
                await trio.sleep(0)
            seq = writer.submit(AppendEvent("live", 1, None, b'{"id":1,"type":"x"}'))
            committed.append(await writer.wait_committed(seq))

        nursery.start_soon(commit_during_the_step)
        assert await retention.run_pass() == 1
        await writer.aclose()
    assert committed == [True]
    assert retention.stats.steps_cut >= 1
    assert store.record_count("doomed") == 0, retention.stats
    assert not store.has_session("doomed"), (retention.stats, store.get_session("doomed"))
    assert store.raw_events("live") == [b'{"id":1,"type":"x"}']
    store.close()


@pytest.mark.parametrize("auto_vacuum", ["incremental", "none"])
async def test_a_deleted_session_leaves_none_of_its_bytes_in_the_file(
        tmp_path: Path, auto_vacuum: str) -> None:
    """After DELETE /session and the removal, no byte of the session's text is left in the
    database file: not in its rows' pages, not in the pages its finished turns' raw events were
    freed from at each turn boundary. A kept session's text stays. ``none``: a file made by an
    earlier version (no auto_vacuum), whose free pages are reused, never given back."""
    data = tmp_path / "data"
    if auto_vacuum == "none":
        with running_daemon(tmp_path, data_dir=data, tag="made"):
            pass
        conn = sqlite3.connect(data / "transcript.sqlite3")
        conn.execute("PRAGMA auto_vacuum=NONE")
        conn.execute("VACUUM")
        assert conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 0
        conn.close()
    secret, keep = b"NEEDLE-SECRET-71c9", b"NEEDLE-KEPT-5e02"
    with running_daemon(tmp_path, data_dir=data) as daemon:
        async with httpx.AsyncClient(base_url=daemon.url, timeout=60) as client:
            kept = await new_session(client)
            await run_turn(client, kept, f"{keep.decode()} mock:chunks=5")
            sid = await new_session(client)
            for n in range(3):  # each turn boundary frees pages of raw events holding it
                await run_turn(client, sid, f"{secret.decode()} {n} mock:chunks=200 "
                               "mock:bytes=600")
            assert (await client.delete(f"/session/{sid}")).status_code == 204

            async def pass_done() -> bool:  # logged once the pass (wipe included) is over
                return "event=retention_pass removed=1" in daemon.stderr()
            await poll(pass_done, 60, "the pass that removes the session")
    db = data / "transcript.sqlite3"
    assert not Path(f"{db}-wal").exists()  # the stop checkpointed everything into the file
    content = db.read_bytes()
    assert rows_of(db, {sid}) == {"sessions": 0, "records": 0, "raw_events": 0, "prompts": 0}
    assert keep in content
    assert content.count(secret) == 0, f"{content.count(secret)} copies left"
