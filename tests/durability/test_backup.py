"""``turnkeeper-daemon backup DEST`` against real daemons on loopback and their real files.

- While a daemon runs and streams a turn, the backup (taken by the daemon from its own
  connection, a step at a time) is a whole SQLite file that a second daemon serves: every
  finished turn, and every event that was durable when the backup started, of a turn still
  running; the streaming session's commits went on between the backup's steps.
- With the daemon stopped, the file is copied directly.
- Clear refusals: DEST exists, DEST cannot be written, the daemon unreachable, no token.
"""

from __future__ import annotations

import json
import os
import re
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.harness import RunningDaemon, running_daemon, start_daemon
from tests.stalls import poll, run_turn

pytestmark = pytest.mark.processes  # starts processes: not in make unit-fast

TOKEN = "backup-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def backup(dest: Path, *args: str, token: str | None = TOKEN, url_env: str | None = None
           ) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("QWEN_SERVER_TOKEN", "TURNKEEPER_URL", "TURNKEEPER_DATA_DIR")}
    if url_env is not None:
        env["TURNKEEPER_URL"] = url_env
    if token is not None:
        env["QWEN_SERVER_TOKEN"] = token
    return subprocess.run([sys.executable, "-m", "daemon", "backup", str(dest), *args],
                          capture_output=True, text=True, timeout=120, env=env)


def lines(export: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in export.splitlines() if line.strip()]


def text_of(events: list[dict[str, Any]]) -> str:
    """The agent's answer text of an export, in order (chunks and merged records alike)."""
    out = []
    for event in events:
        update = event.get("data", {}).get("update", {})
        if update.get("sessionUpdate") == "agent_message_chunk":
            out.append(update.get("content", {}).get("text", ""))
    return "".join(out)


async def status(client: httpx.AsyncClient, sid: str) -> dict[str, Any]:
    resp = await client.get(f"/session/{sid}/status")
    assert resp.status_code == 200, resp.text
    result: dict[str, Any] = resp.json()
    return result


def serve_copy(base: Path, copy: Path, tag: str) -> RunningDaemon:
    data = base / f"{tag}-data"
    data.mkdir()
    os.rename(copy, data / "transcript.sqlite3")
    return start_daemon(base, data_dir=data, tag=tag)


async def test_a_backup_taken_while_a_turn_streams_is_served_by_a_second_daemon(
        tmp_path: Path) -> None:
    live_copy, stopped_copy = tmp_path / "live.sqlite3", tmp_path / "stopped.sqlite3"
    daemon = start_daemon(tmp_path, env={"QWEN_SERVER_TOKEN": TOKEN}, tag="first")
    try:
        async with httpx.AsyncClient(base_url=daemon.url, timeout=60, headers=AUTH) as client:
            sid = (await client.post("/session", json={"sessionScope": "thread"})).json()["sessionId"]
            other = (await client.post("/session", json={"sessionScope": "thread"})).json()["sessionId"]
            # Some megabytes of finished turns: the backup takes several steps.
            for n in range(6):
                await run_turn(client, other, f"filler {n} mock:chunks=400 mock:bytes=2500")
            await run_turn(client, sid, "alpha mock:chunks=30 mock:bytes=200")
            finished = (await client.get(f"/session/{sid}/export")).content
            # A turn that streams its chunks, then waits at a gate: in flight during the backup.
            resp = await client.post(f"/session/{sid}/prompt", json={"prompt": [
                {"type": "text", "text": "bravo mock:chunks=200 mock:bytes=300 "
                                         "mock:gate=bravo"}]})
            assert resp.status_code == 202

            async def bravo_durable() -> bool:
                s = await status(client, sid)
                return s["hasActivePrompt"] and s["lastEventId"] >= 200 and \
                    s["durableEventId"] == s["lastEventId"]
            await poll(bravo_durable, 60, "bravo's chunks to be durable")
            result = backup(live_copy, "--url", daemon.url)
            assert result.returncode == 0, result.stderr
            assert "taken by the daemon" in result.stdout

            # A turn streaming in another session for the whole backup (asked of the route
            # itself, without the command's start-up time): its commits go on between steps.
            resp = await client.post(f"/session/{other}/prompt", json={"prompt": [
                {"type": "text", "text": "charlie mock:chunks=2000000 mock:bytes=64"}]})
            assert resp.status_code == 202

            async def charlie_streams() -> bool:
                return (await status(client, other))["durableEventId"] > 1000
            await poll(charlie_streams, 60, "charlie to stream")
            durable_before = (await status(client, other))["durableEventId"]
            streamed = await client.post("/daemon/backup")
            assert streamed.status_code == 200, streamed.text
            assert streamed.headers["content-type"] == "application/vnd.sqlite3"
            assert (await status(client, other))["hasActivePrompt"], \
                f"charlie ended before the backup did: make it longer {await status(client, other)}"
            # Long enough to outlast the backup on a fast machine (a few seconds there); it has
            # done its part once the backup is in hand.
            assert (await client.post(f"/session/{other}/cancel", json={})).status_code < 300
            during = tmp_path / "during.sqlite3"
            during.write_bytes(streamed.content)
            conn = sqlite3.connect(during)
            assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
            # Every event of charlie durable when the backup was asked for is in the copy.
            stored = conn.execute("SELECT max(event_id) FROM raw_events WHERE session_id = ?",
                                  (other,)).fetchone()[0]
            conn.close()
            assert stored >= durable_before, (stored, durable_before)

            # Refusals, while the daemon runs.
            exists = backup(live_copy, "--url", daemon.url)
            assert exists.returncode == 2 and "exists; refusing to overwrite" in exists.stderr
            blocked = backup(live_copy / "under-a-file", "--url", daemon.url)
            assert blocked.returncode == 2 and "cannot write" in blocked.stderr
            no_token = backup(tmp_path / "x.sqlite3", "--url", daemon.url, token=None)
            assert no_token.returncode == 1, no_token.stderr
            assert "refused no token (401" in no_token.stderr
            assert "QWEN_SERVER_TOKEN" in no_token.stderr
            # The data directory is locked: the daemon at $TURNKEEPER_URL is asked.
            locked = backup(tmp_path / "y.sqlite3", "--data-dir", str(daemon.data_dir),
                            url_env=daemon.url)
            assert locked.returncode == 0 and "taken by the daemon" in locked.stdout, \
                locked.stderr
            assert not list(tmp_path.glob("*.partial")) and not (tmp_path / "x.sqlite3").exists()

            daemon.open_gate("bravo")

            async def idle() -> bool:
                s = await status(client, sid)
                return not s["hasActivePrompt"]
            await poll(idle, 60, "bravo to end")
            whole_bravo = text_of(lines((await client.get(f"/session/{sid}/export")).content))
        taken = [line for line in daemon.stderr().splitlines() if "event=backup_taken" in line]
        assert len(taken) == 3, daemon.stderr()
        fields = dict(re.findall(r"(\w+)=(\S+)", taken[1]))  # the one during charlie
        assert int(fields["steps"]) > 3, taken  # the copy was taken a step at a time ...
        assert int(fields["commits_between"]) > 0, taken  # ... with commits between steps
        assert not list(daemon.data_dir.glob(".backup-*")), "the daemon left its copy behind"
    finally:
        assert daemon.stop() == 0

    # The daemon is stopped: the file is copied directly (the lock is free).
    direct = backup(stopped_copy, "--data-dir", str(daemon.data_dir))
    assert direct.returncode == 0, direct.stderr
    assert "the daemon is stopped" in direct.stdout

    for copy in (live_copy, stopped_copy):
        conn = sqlite3.connect(copy)
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        conn.close()

    second = serve_copy(tmp_path, live_copy, "second")
    try:
        with httpx.Client(base_url=second.url, timeout=60) as client:
            loaded = client.post(f"/session/{sid}/load", json={})
            assert loaded.status_code == 200, loaded.text
            exported = client.get(f"/session/{sid}/export").content
            # The finished turn whole, as the first daemon exported it before the backup ...
            assert exported.startswith(finished)
            # ... and the turn in flight: every chunk durable before the backup, closed as
            # interrupted by the restore (its terminal came after the backup).
            rest = lines(exported[len(finished):])
            bravo = text_of(rest)
            assert bravo and whole_bravo.endswith(bravo)
            assert bravo.count("chunk-") == 200
            assert rest[-1]["type"] == "turn_error"
            assert rest[-1]["data"]["code"] == "interrupted"
            assert client.post(f"/session/{other}/load", json={}).status_code == 200
    finally:
        assert second.stop() == 0

    third = serve_copy(tmp_path, stopped_copy, "third")
    try:
        with httpx.Client(base_url=third.url, timeout=60) as client:
            assert client.post(f"/session/{sid}/load", json={}).status_code == 200
            stopped_text = text_of(lines(client.get(f"/session/{sid}/export").content))
            assert stopped_text.endswith(whole_bravo[len(whole_bravo) - 50:])
    finally:
        assert third.stop() == 0


def test_unreachable_daemon_and_missing_transcript(tmp_path: Path) -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    gone = backup(tmp_path / "a.sqlite3", "--url", f"http://127.0.0.1:{port}")
    assert gone.returncode == 1 and "unreachable" in gone.stderr, gone.stderr
    empty = tmp_path / "empty-data"
    empty.mkdir()
    none = backup(tmp_path / "b.sqlite3", "--data-dir", str(empty))
    assert none.returncode == 1 and "no transcript" in none.stderr, none.stderr
    assert not list(tmp_path.glob("*.sqlite3*"))


def test_no_persistence_daemon_has_nothing_to_back_up(tmp_path: Path) -> None:
    with running_daemon(tmp_path, ["--no-persistence"]) as daemon:
        result = backup(tmp_path / "c.sqlite3", "--url", daemon.url, token=None)
    assert result.returncode == 1 and "transcript_unavailable" in result.stderr, result.stderr


def test_a_stopped_daemons_log_is_part_of_the_direct_copy(tmp_path: Path) -> None:
    """A daemon that died leaves its committed rows in the write-ahead log only: the direct
    copy holds them."""
    data = tmp_path / "data"
    data.mkdir()
    writer = ("import os, sys\n"
              "from daemon.transcript_store import AppendEvent, TranscriptDatabase, UpsertSession\n"
              "store = TranscriptDatabase(sys.argv[1])\n"
              "store.apply([UpsertSession('s1', '/w', 1)])\n"
              "store.apply([AppendEvent('s1', n, None, b'{\"id\":%d}' % n) for n in range(1, 50)])\n"
              "os._exit(0)\n")  # no close: nothing is checkpointed into the file
    subprocess.run([sys.executable, "-c", writer, str(data / "transcript.sqlite3")], check=True,
                   timeout=60)
    assert (data / "transcript.sqlite3-wal").stat().st_size > 0
    result = backup(tmp_path / "copy.sqlite3", "--data-dir", str(data))
    assert result.returncode == 0, result.stderr
    conn = sqlite3.connect(tmp_path / "copy.sqlite3")
    assert conn.execute("SELECT count(*), max(event_id) FROM raw_events").fetchone() == (1, 49)
    conn.close()
