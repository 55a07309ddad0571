"""A damaged transcript is found, not served: real daemons on real SQLite files damaged from
outside.

A module fixture builds a transcript with a real daemon (sessions, finished turns, the mock
agent) and stops it; a second daemon on a copy gives the expected answers. Each test damages
another copy the way a disk or a careless copy does and starts a daemon on it. Which sessions
were altered is decided without the daemon: the damaged copy's rows are read with a plain
SQLite connection and compared with the clean copy's.

- Single bits flipped inside row payloads (an event record, a stored raw event, a session's
  workspace, a prompt's stop reason): SQLite's own checks pass; the row checksums find each one
  and the session answers a JSON 500 ``transcript_damaged``; every other session is served as
  before.
- 200 random byte flips anywhere in the file: the daemon refuses to start with one line naming
  the recovery command, or starts and never answers a body that is not JSON nor a page that
  differs from the clean one; ``--recover`` then keeps only intact rows and the daemon serves
  them.
- An index entry changed so that ``quick_check`` passes: the background ``integrity_check``
  finds it and the session's pages are refused instead of served without the row.
- An empty file, a truncated file, a log without its database: refused at start.
"""

from __future__ import annotations

import json
import random
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from benchmarks.launcher import LaunchError
from daemon.server import TRANSCRIPT_FILE
from tests.harness import RunningDaemon, start_daemon

pytestmark = pytest.mark.processes  # starts processes: not in make unit-fast

TIMEOUT_S = 30.0
POLL_S = 0.02
TABLES = ("sessions", "prompts", "records", "raw_events")
RowKey = tuple[str, int]


@dataclass
class Built:
    """A clean transcript and what a daemon answers on it."""

    base: Path
    clean: Path  # the clean transcript file, kept aside
    workspace: str
    sessions: list[str]
    pages: dict[str, list[dict[str, Any]]]  # session -> its newest page's events


def wait_until(probe: Callable[[], bool], what: str) -> None:
    """Poll an observable condition (the daemon pushes none for these), bounded."""
    deadline = time.monotonic() + TIMEOUT_S
    while not probe():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(POLL_S)


@contextmanager
def daemon_on(base: Path, data: Path, tag: str) -> Iterator[RunningDaemon]:
    daemon = start_daemon(base, data_dir=data, tag=tag)
    try:
        yield daemon
    finally:
        daemon.stop()


def copy_into_data_dir(base: Path, db: Path, tag: str) -> Path:
    data = base / f"{tag}-data"
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir(parents=True)
    shutil.copyfile(db, data / TRANSCRIPT_FILE)
    return data


def body(resp: httpx.Response) -> Any:
    """The JSON of an answer; every answer the daemon gives is JSON."""
    try:
        return json.loads(resp.content)
    except ValueError:
        raise AssertionError(f"{resp.request.url} answered {resp.status_code} with a body that "
                             f"is not JSON: {resp.content[:200]!r}") from None


@dataclass
class Answer:
    load: int
    load_body: Any
    page: int | None = None
    events: list[dict[str, Any]] | None = None


def read_sessions(client: httpx.Client, sids: list[str]) -> dict[str, Answer]:
    """Load (which restores) every session, then read its newest page after a 200."""
    out = {}
    for sid in sids:
        load = client.post(f"/session/{sid}/load", json={})
        answer = Answer(load.status_code, body(load))
        if load.status_code == 200:
            page = client.get(f"/session/{sid}/transcript", params={"limit": 500})
            answer.page = page.status_code
            if page.status_code == 200:
                answer.events = body(page)["events"]
        out[sid] = answer
    return out


def wait_for_full_check(client: httpx.Client) -> dict[str, Any]:
    def done() -> bool:
        return body(client.get("/daemon/status"))["transcript"]["check"]["full"] != "running"

    wait_until(done, "the background check of the transcript")
    transcript: dict[str, Any] = body(client.get("/daemon/status"))["transcript"]
    return transcript


def stored_rows(db: Path, scratch: Path) -> dict[RowKey, tuple[Any, ...]] | None:
    """Every row of a copy of ``db`` read with plain SQLite, by (table, rowid): rowid, session
    id, then every column; ``None`` when SQLite cannot read all of it."""
    copy = scratch / f"rows-{time.monotonic_ns()}.sqlite3"
    shutil.copyfile(db, copy)
    try:
        conn = sqlite3.connect(copy)
        try:
            return {(table, row[0]): tuple(row) for table in TABLES
                    for row in conn.execute(f"SELECT rowid, session_id, * FROM {table}")}
        finally:
            conn.close()
    except sqlite3.DatabaseError:
        return None


def altered_sessions(clean: dict[RowKey, tuple[Any, ...]],
                     damaged: dict[RowKey, tuple[Any, ...]]) -> set[str]:
    """Sessions with a row that is missing or changed in ``damaged`` (by the session the
    clean row names)."""
    return {row[1] for key, row in clean.items() if damaged.get(key) != row}


def assert_refused(daemon_stderr: str) -> None:
    lines = [line for line in daemon_stderr.strip().splitlines()
             if line.startswith("python -m daemon:")]
    assert len(lines) == 1, daemon_stderr
    assert "--recover --data-dir" in lines[0], lines[0]
    assert "Traceback" not in daemon_stderr


def start_expecting_refusal(base: Path, data: Path) -> str:
    argv = [sys.executable, "-m", "daemon", "--hostname", "127.0.0.1", "--port", "0",
            "--data-dir", str(data), "--workspace", str(base)]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=base)
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "listening" not in result.stdout
    assert_refused(result.stderr)
    return result.stderr


def recover(data: Path) -> str:
    result = subprocess.run([sys.executable, "-m", "daemon", "--recover", "--data-dir",
                             str(data)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, (result.stdout, result.stderr)
    return result.stdout


def flip_in(data: bytearray, fragment: bytes, at: int, bit: int = 0) -> None:
    """Flip one bit of the byte ``at`` bytes into the one occurrence of ``fragment``."""
    assert data.count(fragment) == 1, f"{fragment!r} occurs {data.count(fragment)} times"
    data[data.index(fragment) + at] ^= 1 << bit


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    base = tmp_path_factory.mktemp("damage")
    first = start_daemon(base, tag="build")
    sids: list[str] = []
    try:
        with httpx.Client(base_url=first.url, timeout=TIMEOUT_S) as client:
            for n in range(12):
                sid = client.post("/session", json={"sessionScope": "thread"}).json()["sessionId"]
                sids.append(sid)
                for t in range(2):
                    resp = client.post(f"/session/{sid}/prompt", json={"prompt": [
                        {"type": "text", "text": f"session {n} turn {t} mock:chunks=3"}]})
                    assert resp.status_code == 202, resp.text
            for sid in sids:
                def finished(sid: str = sid) -> bool:
                    status = body(client.get(f"/session/{sid}/status"))
                    return not status["hasActivePrompt"] and status["pendingPrompts"] == 0
                wait_until(finished, f"session {sid}'s turns")
            workspace = body(client.get(f"/session/{sids[0]}/status"))["workspaceCwd"]
    finally:
        assert first.stop() == 0
    clean = base / "clean.sqlite3"
    shutil.copyfile(first.data_dir / TRANSCRIPT_FILE, clean)
    assert not (first.data_dir / (TRANSCRIPT_FILE + "-wal")).exists()  # all in the file
    data = copy_into_data_dir(base, clean, "expected")
    with daemon_on(base, data, "expected") as daemon, \
            httpx.Client(base_url=daemon.url, timeout=TIMEOUT_S) as client:
        answers = read_sessions(client, sids)
    pages = {}
    for sid, answer in answers.items():
        assert answer.load == 200 and answer.events is not None, answer
        pages[sid] = answer.events
    return Built(base, clean, workspace, sids, pages)


# --- bits flipped inside rows -------------------------------------------------------------


def test_single_bit_flips_in_row_payloads_are_found_when_read(built: Built,
                                                               tmp_path: Path) -> None:
    data = copy_into_data_dir(tmp_path, built.clean, "flipped")
    db = data / TRANSCRIPT_FILE
    raw = bytearray(db.read_bytes())
    record_s, event_s, session_s, prompt_s = built.sessions[:4]
    # A compacted event: the key of its record stamp ("sourceRecordIds" -> "rourceRecordIds").
    stamped = next(e for e in built.pages[record_s]
                   if e.get("data", {}).get("update", {}).get("_meta", {}).get("qwenTranscript"))
    record_id = stamped["data"]["update"]["_meta"]["qwenTranscript"]["sourceRecordIds"][0]
    flip_in(raw, b'"sourceRecordIds":["' + record_id.encode(), 1)
    # A raw event of the unfinished turn: the session_closed the daemon's stop stored.
    closed = b'"sessionId":"%s","reason":"' % event_s.encode()
    flip_in(raw, closed + b'daemon_shutdown"', len(closed) + 3)
    # A session's row: the last byte of its agent session id (a column no index holds, so
    # SQLite's own check cannot see it; the workspace path is in the listing's index).
    conn = sqlite3.connect(f"file:{built.clean}?mode=ro", uri=True)
    (agent_session,) = conn.execute("SELECT agent_session_id FROM sessions WHERE "
                                    "session_id = ?", (session_s,)).fetchone()
    conn.close()
    flip_in(raw, agent_session.encode(), len(agent_session) - 1)
    # A prompt's ledger row: its stop reason ("end_turn" -> "dnd_turn").
    prompt_id = next(e["promptId"] for e in built.pages[prompt_s] if e["type"] == "turn_complete")
    flip_in(raw, (prompt_s + prompt_id + "completedend_turn").encode(),
            len(prompt_s + prompt_id + "completed"))
    db.write_bytes(bytes(raw))

    # Ground truth, without the daemon: SQLite finds nothing, yet four sessions' rows changed.
    shutil.copyfile(db, tmp_path / "check.sqlite3")
    conn = sqlite3.connect(tmp_path / "check.sqlite3")
    assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    conn.close()
    clean_rows = stored_rows(built.clean, tmp_path)
    damaged_rows = stored_rows(db, tmp_path)
    assert clean_rows is not None and damaged_rows is not None
    damaged = {record_s, event_s, session_s, prompt_s}
    assert altered_sessions(clean_rows, damaged_rows) == damaged

    with daemon_on(tmp_path, data, "flipped") as daemon, \
            httpx.Client(base_url=daemon.url, timeout=TIMEOUT_S) as client:
        answers = read_sessions(client, built.sessions)
        for sid, answer in answers.items():
            if sid in damaged:
                assert answer.load == 500, (sid, answer)
                assert answer.load_body["code"] == "transcript_damaged"
                assert answer.load_body["sessionId"] == sid
            else:
                assert answer.load == 200 and answer.events == built.pages[sid], (sid, answer)
        transcript = wait_for_full_check(client)
        assert transcript["check"] == {"quick": "ok", "full": "damaged"}
        assert transcript["degraded"] is True
        assert transcript["damagedSessions"] == sorted(damaged)
        # Still refused after the check, and still JSON.
        again = client.post(f"/session/{record_s}/load", json={})
        assert again.status_code == 500 and body(again)["code"] == "transcript_damaged"
    logged = [line for line in daemon.stderr().splitlines() if "event=transcript_damaged" in line]
    assert {sid for sid in damaged if any(sid in line for line in logged)} == damaged


# --- random damage anywhere ---------------------------------------------------------------


@pytest.mark.parametrize("seed", [1, 2])
def test_random_byte_flips_are_refused_or_found_and_never_served(built: Built, tmp_path: Path,
                                                                 seed: int) -> None:
    data = copy_into_data_dir(tmp_path, built.clean, "random")
    db = data / TRANSCRIPT_FILE
    raw = bytearray(db.read_bytes())
    rng = random.Random(seed)
    for _ in range(200):
        raw[rng.randrange(len(raw))] = rng.randrange(256)
    damaged_bytes = bytes(raw)
    db.write_bytes(damaged_bytes)
    clean_rows = stored_rows(built.clean, tmp_path)
    assert clean_rows is not None
    damaged_rows = stored_rows(db, tmp_path)
    altered = None if damaged_rows is None else altered_sessions(clean_rows, damaged_rows)

    try:
        daemon = start_daemon(tmp_path, data_dir=data, tag="random")
    except LaunchError as exc:
        assert_refused(str(exc))
        assert db.read_bytes() == bytes(raw)  # refused without touching it
    else:
        try:
            with httpx.Client(base_url=daemon.url, timeout=TIMEOUT_S) as client:
                answers = read_sessions(client, built.sessions)
                for sid, answer in answers.items():
                    if answer.load != 200:
                        assert answer.load_body["code"] in ("transcript_damaged",
                                                            "session_not_found"), answer
                    elif answer.events is not None:
                        assert answer.events == built.pages[sid], sid
                    if altered is not None and sid in altered:
                        assert answer.events is None, f"altered session {sid} was served"
                transcript = wait_for_full_check(client)
                if altered:
                    assert transcript["check"]["full"] == "damaged"
                    assert transcript["degraded"] is True
        finally:
            daemon.stop()

    # Recovery of the file as damaged (not as the daemon above left it, with its own writes).
    db.write_bytes(damaged_bytes)
    report = recover(data)
    assert "recover:" in report
    if "nothing to recover" not in report:
        assert list(data.glob(TRANSCRIPT_FILE + ".damaged-*")), report
    recovered_rows = stored_rows(db, tmp_path)
    assert recovered_rows is not None
    for key, row in recovered_rows.items():  # nothing kept that is not as it was written
        assert clean_rows.get(key) == row, (key, row)
    with daemon_on(tmp_path, data, "recovered") as daemon, \
            httpx.Client(base_url=daemon.url, timeout=TIMEOUT_S) as client:
        kept = sorted({row[1] for (table, _), row in recovered_rows.items()
                       if table == "sessions"})
        assert set(kept) <= set(built.sessions)
        for sid, answer in read_sessions(client, kept).items():
            assert answer.load == 200 and answer.events is not None, (sid, answer)
            expected = iter(built.pages[sid])
            for event in answer.events:  # in order, each as it was
                assert any(event == old for old in expected), (sid, event)
        transcript = wait_for_full_check(client)
        assert transcript["check"]["full"] == "ok" and transcript["degraded"] is False


# --- damage SQLite's quick check does not see ---------------------------------------------


def test_an_index_entry_changed_is_found_by_the_background_check(built: Built,
                                                                  tmp_path: Path) -> None:
    data = copy_into_data_dir(tmp_path, built.clean, "index")
    db = data / TRANSCRIPT_FILE
    conn = sqlite3.connect(db)
    root = conn.execute("SELECT rootpage FROM sqlite_master "
                        "WHERE name = 'records_by_session'").fetchone()[0]
    page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    conn.close()
    raw = bytearray(db.read_bytes())
    start = (root - 1) * page_size
    page = raw[start:start + page_size]
    assert page[0] == 0x0A  # the whole index is one leaf page
    cells = int.from_bytes(page[3:5], "big")
    last_cell = int.from_bytes(page[8 + 2 * (cells - 1):8 + 2 * cells], "big")
    # The logically last entry is the greatest session id's newest record: one more at the end
    # of its session id keeps the index in order (quick_check passes), but that record is no
    # longer found through the index, so a page of the session would silently lack it.
    victim = max(built.sessions)
    at = start + page.index(victim.encode(), last_cell) + len(victim) - 1
    raw[at] = ord("z")
    db.write_bytes(bytes(raw))
    shutil.copyfile(db, tmp_path / "copy.sqlite3")
    check = sqlite3.connect(tmp_path / "copy.sqlite3")
    assert check.execute("PRAGMA quick_check").fetchall() == [("ok",)]
    assert check.execute("PRAGMA integrity_check").fetchall() != [("ok",)]
    check.close()

    with daemon_on(tmp_path, data, "index") as daemon, \
            httpx.Client(base_url=daemon.url, timeout=TIMEOUT_S) as client:
        transcript = wait_for_full_check(client)
        answers = read_sessions(client, built.sessions)
        for sid, answer in answers.items():
            if sid == victim:
                assert answer.load == 500 and answer.load_body["code"] == "transcript_damaged"
            else:
                assert answer.load == 200 and answer.events == built.pages[sid]
        assert transcript["check"] == {"quick": "ok", "full": "damaged"}
        assert transcript["damagedSessions"] == [victim]
        assert any("missing from index records_by_session" in line
                   for line in transcript["damage"]), transcript["damage"]
    assert "event=transcript_damaged" in daemon.stderr()


def test_a_damaged_page_is_refused_at_start(built: Built, tmp_path: Path) -> None:
    """A page SQLite cannot parse, in a table the daemon does not read while starting: its
    quick_check at start finds it, so the daemon refuses instead of starting to serve."""
    data = copy_into_data_dir(tmp_path, built.clean, "page")
    db = data / TRANSCRIPT_FILE
    conn = sqlite3.connect(db)
    root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'records'").fetchone()[0]
    page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    conn.close()
    raw = bytearray(db.read_bytes())
    assert raw[(root - 1) * page_size] == 0x0D  # a table leaf
    raw[(root - 1) * page_size] = 0x07  # no such page type
    db.write_bytes(bytes(raw))
    stderr = start_expecting_refusal(tmp_path, data)
    assert "quick_check" in stderr, stderr
    assert db.read_bytes() == bytes(raw)


# --- files that are not a transcript any more ---------------------------------------------


def test_an_empty_transcript_file_is_refused_not_started_as_an_empty_store(
        tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / TRANSCRIPT_FILE).write_bytes(b"")
    stderr = start_expecting_refusal(tmp_path, data)
    assert "empty (0 bytes)" in stderr
    assert (data / TRANSCRIPT_FILE).read_bytes() == b""
    assert not (data / (TRANSCRIPT_FILE + "-wal")).exists()


def test_a_log_without_its_database_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / (TRANSCRIPT_FILE + "-wal")).write_bytes(b"\x37\x7f\x06\x82" + b"\x00" * 28)
    stderr = start_expecting_refusal(tmp_path, data)
    assert "write-ahead log" in stderr
    assert not (data / TRANSCRIPT_FILE).exists()


def test_a_truncated_transcript_is_refused_then_recovered(built: Built, tmp_path: Path) -> None:
    data = copy_into_data_dir(tmp_path, built.clean, "truncated")
    db = data / TRANSCRIPT_FILE
    whole = db.read_bytes()
    cut = whole[:len(whole) * 2 // 3]
    db.write_bytes(cut)
    stderr = start_expecting_refusal(tmp_path, data)
    assert "quick_check" in stderr or "malformed" in stderr, stderr
    assert db.read_bytes() == cut

    report = recover(data)
    assert "was damaged" in report and "kept" in report, report
    kept_copy = list(data.glob(TRANSCRIPT_FILE + ".damaged-*"))
    assert len(kept_copy) == 1 and kept_copy[0].read_bytes() == cut
    clean_rows = stored_rows(built.clean, tmp_path)
    rows = stored_rows(db, tmp_path)
    assert clean_rows is not None and rows is not None and rows
    for key, row in rows.items():
        assert clean_rows[key] == row, key
    with daemon_on(tmp_path, data, "recovered") as daemon, \
            httpx.Client(base_url=daemon.url, timeout=TIMEOUT_S) as client:
        kept = sorted(row[1] for (table, _), row in rows.items() if table == "sessions")
        for sid, answer in read_sessions(client, kept).items():
            assert answer.load == 200 and answer.events is not None
            expected = iter(built.pages[sid])
            for event in answer.events:
                assert any(event == old for old in expected), (sid, event)


# --- a file from before checksums ---------------------------------------------------------


def test_a_version_2_transcript_is_upgraded_in_place_and_served_as_before(
        built: Built, tmp_path: Path) -> None:
    """The clean transcript written back in the schema-version-2 layout (no checksums, no
    idempotency columns), as a daemon of that version left it: the daemon upgrades it in place
    (every row gets its checksum) and serves every session exactly as before."""
    from tests.transcript_v2 import V2_SCHEMA

    old = tmp_path / "v2.sqlite3"
    conn = sqlite3.connect(old, isolation_level=None)
    conn.execute("PRAGMA page_size=65536")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.executescript(V2_SCHEMA)
    conn.execute("ATTACH ? AS new", (str(built.clean),))
    for table, columns in (
            ("sessions", "session_id, workspace_cwd, created_at, agent_session_id, closed"),
            ("raw_events", "seq, session_id, event_id, prompt_id, raw"),
            ("records", "seq, session_id, record_id, turn, prompt_id, raw"),
            ("prompts", "session_id, prompt_id, state, stop_reason, admitted_at, ended_at, "
                        "terminal_seq")):
        conn.execute(f"INSERT INTO main.{table} ({columns}) SELECT {columns} FROM new.{table}")
    conn.execute("DETACH new")
    conn.execute("PRAGMA user_version=2")
    conn.close()

    data = copy_into_data_dir(tmp_path, old, "v2")
    with daemon_on(tmp_path, data, "v2") as daemon, \
            httpx.Client(base_url=daemon.url, timeout=TIMEOUT_S) as client:
        for sid, answer in read_sessions(client, built.sessions).items():
            assert answer.load == 200 and answer.events == built.pages[sid], sid
        transcript = wait_for_full_check(client)
        assert transcript["check"] == {"quick": "ok", "full": "ok"}
    conn = sqlite3.connect(data / TRANSCRIPT_FILE)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 3
    for table in TABLES:
        assert conn.execute(f"SELECT count(*) FROM {table} WHERE crc IS NULL").fetchone()[0] == 0
    conn.close()
