"""Transcript faults against the real daemon and a real SQLite file.

A write failure is injected from outside, the way a full disk causes it: the test lowers the
running daemon's file-size limit (``RLIMIT_FSIZE`` via ``prlimit``; CPython ignores
``SIGXFSZ``, so SQLite's writes past it fail with ``EFBIG``) to the WAL's current size while a
turn streams, and raises it again later. The daemon must keep streaming, finish the turn, latch
that session as degraded (markers say ``fullTranscriptAvailable: false``, the status routes say
why) and keep persisting the other sessions once the disk has room again. Nothing outside the
daemon can lock the database any more (it holds SQLite's lock exclusively), and a stray
``-shm`` file cannot kill it with SIGBUS (it maps none). A corrupt or too-new database makes
``python -m daemon`` refuse to start without touching the file.
"""

from __future__ import annotations

import os
import resource
import sqlite3
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from daemon.server import TRANSCRIPT_FILE
from tests.harness import RunningDaemon, running_daemon
from tests.sse_client import Subscriber, is_terminal_for, text_of

pytestmark = pytest.mark.processes  # starts processes: not in make unit-fast

TIMEOUT_S = 20.0
POLL_S = 0.02


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[RunningDaemon]:
    # Small caps so that both markers appear: one chunk is over the live byte cap, and a few
    # compacted turns overflow the replay window.
    args = ["--max-journal-events", "3", "--max-journal-bytes", "300",
            "--compacted-replay-max-bytes", "3000"]
    with running_daemon(tmp_path, args) as d:
        yield d


async def wait_until(probe: Callable[[], Awaitable[bool]], what: str) -> None:
    """Poll an observable condition (the daemon exposes no push for it), bounded."""
    with trio.move_on_after(TIMEOUT_S):
        while not await probe():
            await trio.sleep(POLL_S)
        return
    raise AssertionError(f"timed out waiting for {what}")


async def create(client: httpx.AsyncClient) -> tuple[str, str]:
    resp = await client.post("/session", json={"sessionScope": "thread"})
    assert resp.status_code == 200, resp.text
    return resp.json()["sessionId"], resp.json()["clientId"]


async def prompt(client: httpx.AsyncClient, sid: str, text: str) -> str:
    resp = await client.post(f"/session/{sid}/prompt",
                             json={"prompt": [{"type": "text", "text": text}]})
    assert resp.status_code == 202, resp.text
    return str(resp.json()["promptId"])


async def full_turn(client: httpx.AsyncClient, sid: str, text: str) -> None:
    status = (await client.get(f"/session/{sid}/status")).json()
    async with trio.open_nursery() as nursery:
        sub = Subscriber(client, f"/session/{sid}/events",
                         {"Last-Event-ID": str(status["lastEventId"]),
                          "X-Qwen-Event-Epoch": status["eventEpoch"]})
        await nursery.start(sub.run)
        pid = await prompt(client, sid, text)
        terminal = await sub.wait_for(is_terminal_for(pid), timeout=TIMEOUT_S)
        assert terminal.type == "turn_complete", terminal.data
        nursery.cancel_scope.cancel()


def markers(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e.get("type") == "history_truncated"]


def set_file_size_limit(daemon: RunningDaemon, limit: int | None) -> None:
    """The disk is full past ``limit`` bytes of any file the daemon writes (``None``: room)."""
    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.prlimit(daemon.proc.pid, resource.RLIMIT_FSIZE,
                     (hard if limit is None else limit, hard))


async def test_full_disk_degrades_one_session_and_never_stalls_it(
        daemon: RunningDaemon) -> None:
    wal = daemon.data_dir / (TRANSCRIPT_FILE + "-wal")
    async with httpx.AsyncClient(base_url=daemon.url, timeout=TIMEOUT_S) as client, \
            trio.open_nursery() as nursery:
        victim, _ = await create(client)
        bystander, _ = await create(client)
        await full_turn(client, bystander, "before mock:chunks=50 mock:bytes=4000")
        # A transcript read waits for every earlier write: nothing of either session is still
        # queued when the disk fills, so only what the victim writes next can fail.
        for sid in (victim, bystander):
            assert (await client.get(f"/session/{sid}/transcript")).status_code == 200

        sub = Subscriber(client, f"/session/{victim}/events", {"Last-Event-ID": "0"})
        await nursery.start(sub.run)
        # The WAL only grows (no checkpoint this early): its next frame is past the limit.
        assert daemon.stderr_path.stat().st_size < wal.stat().st_size
        set_file_size_limit(daemon, wal.stat().st_size)
        try:
            pid = await prompt(client, victim, "full mock:chunks=20 mock:gate=held")
            # The stream is not held up by the failing writes.
            await sub.wait_for(lambda e: text_of(e) == "chunk-19", timeout=TIMEOUT_S)

            async def victim_degraded() -> bool:
                status = (await client.get(f"/session/{victim}/status")).json()
                return bool(status["transcriptDegraded"])

            await wait_until(victim_degraded, "the victim's transcript to be marked degraded")
            status = (await client.get(f"/session/{victim}/status")).json()
            assert status["fullTranscriptAvailable"] is False
            assert status["hasActivePrompt"] is True
            bystander_status = (await client.get(f"/session/{bystander}/status")).json()
            assert bystander_status["transcriptDegraded"] is False

            daemon_status = (await client.get("/daemon/status")).json()
            transcript = daemon_status["transcript"]
            assert transcript["enabled"] is True and transcript["degraded"] is True
            assert transcript["failedSessions"] == [victim]
            assert "disk" in transcript["lastError"], transcript["lastError"]

            # Mid-turn load: the live marker no longer promises a full transcript.
            mid = (await client.post(f"/session/{victim}/load", json={})).json()
            live_marker = markers(mid["liveJournal"])
            assert len(live_marker) == 1 and live_marker[0]["data"]["scope"] == "live_journal"
            assert live_marker[0]["data"]["fullTranscriptAvailable"] is False
            assert live_marker[0]["promptId"] == pid

            # The terminal does not wait for a store that cannot commit.
            daemon.open_gate("held")
            terminal = await sub.wait_for(is_terminal_for(pid), timeout=TIMEOUT_S)
            assert terminal.type == "turn_complete"
            assert terminal.data["stopReason"] == "end_turn"
            assert [text_of(e) for e in sub.events if text_of(e).startswith("chunk-")] == \
                [f"chunk-{i}" for i in range(20)]
        finally:
            set_file_size_limit(daemon, None)
        nursery.cancel_scope.cancel()

        # The disk has room again, but the victim's latch holds until it gets a new bus.
        for i in range(3):
            await full_turn(client, victim, f"after {i} mock:chunks=20")
        after = (await client.post(f"/session/{victim}/load", json={})).json()
        replay_marker = markers(after["compactedReplay"])
        assert len(replay_marker) == 1 and "scope" not in replay_marker[0]["data"]
        assert replay_marker[0]["data"]["fullTranscriptAvailable"] is False
        assert (await client.get(f"/session/{victim}/status")).json()["transcriptDegraded"]

        # Other sessions keep their durability all along.
        await full_turn(client, bystander, "after mock:chunks=2")
        page = (await client.get(f"/session/{bystander}/transcript")).json()
        texts = [e["data"]["update"]["content"]["text"] for e in page["events"]
                 if e["type"] == "session_update"]
        assert "before mock:chunks=50 mock:bytes=4000" in texts and "after mock:chunks=2" in texts
        assert sum(e["type"] == "turn_complete" for e in page["events"]) == 2
        final = (await client.get("/daemon/status")).json()["transcript"]
        assert final["failedSessions"] == [victim]
        assert (await client.get("/health")).json() == {"status": "ok"}

    failures = [line for line in daemon.stderr().splitlines()
                if "event=transcript_write_failed" in line]
    assert failures and all(victim in line for line in failures)
    assert any("disk" in line for line in failures)
    assert daemon.proc.poll() is None


async def test_a_tampered_shm_file_cannot_kill_the_daemon(daemon: RunningDaemon) -> None:
    """SQLite maps a WAL database's ``-shm`` file; truncating it (or a full disk under a
    sparse one) used to kill the daemon with SIGBUS and no log line. The store keeps the WAL
    index in its own memory, so there is no mapped file to break: an outside process that
    plants an unwritable, empty ``-shm`` changes nothing."""
    shm = daemon.data_dir / (TRANSCRIPT_FILE + "-shm")
    async with httpx.AsyncClient(base_url=daemon.url, timeout=TIMEOUT_S) as client:
        sid, _ = await create(client)
        await full_turn(client, sid, "before mock:chunks=5")
        assert (await client.get(f"/session/{sid}/transcript")).status_code == 200
        assert not shm.exists()
        # What the original probe did to the mapped file: empty it and make it unwritable.
        shm.touch()
        os.truncate(shm, 0)
        shm.chmod(0)
        await full_turn(client, sid, "after mock:chunks=5")
        page = (await client.get(f"/session/{sid}/transcript")).json()
        assert sum(e["type"] == "turn_complete" for e in page["events"]) == 2
        status = (await client.get(f"/session/{sid}/status")).json()
        assert status["transcriptDegraded"] is False
        assert status["durableEventId"] == status["lastEventId"]
    assert daemon.proc.poll() is None
    assert "transcript_write_failed" not in daemon.stderr()


# --- refusing to start ------------------------------------------------------------------------


def start_daemon_expecting_refusal(base: Path) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "daemon", "--hostname", "127.0.0.1", "--port", "0",
            "--data-dir", str(base / "data"), "--workspace", str(base)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=base)


def assert_refused(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode != 0
    assert "listening" not in result.stdout
    message = result.stderr.strip()
    assert "\n" not in message and "Traceback" not in message, result.stderr
    for needle in needles:
        assert needle in message, message


def test_corrupt_database_refuses_to_start_and_is_left_alone(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    db = data / TRANSCRIPT_FILE
    garbage = b"this is not an SQLite database\x00\xff" * 4096
    db.write_bytes(garbage)
    result = start_daemon_expecting_refusal(tmp_path)
    assert_refused(result, str(db), "corrupt")
    assert db.read_bytes() == garbage
    assert not (data / (TRANSCRIPT_FILE + "-wal")).exists()


def test_newer_schema_refuses_to_start_and_is_left_alone(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    db = data / TRANSCRIPT_FILE
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE from_the_future (x)")
    conn.execute("PRAGMA user_version = 999")
    conn.commit()
    conn.close()
    before = db.read_bytes()
    result = start_daemon_expecting_refusal(tmp_path)
    assert_refused(result, str(db), "999")
    assert db.read_bytes() == before
    assert not (data / (TRANSCRIPT_FILE + "-wal")).exists()
