"""A transcript file as a daemon of schema version 1 or 2 wrote it, for the in-place upgrade
tests: the schema those versions created (copied here as it was, so later versions of the store
cannot change it) and rows written the way they wrote them (no checksums, no idempotency key)."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path

# The schema versions 1 and 2 created (they differ only in what a raw_events row may hold).
V2_SCHEMA = """
CREATE TABLE sessions (
    session_id       TEXT PRIMARY KEY,
    workspace_cwd    TEXT NOT NULL,
    created_at       INTEGER NOT NULL,
    agent_session_id TEXT,
    closed           INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE raw_events (
    seq        INTEGER PRIMARY KEY,
    session_id TEXT NOT NULL,
    event_id   INTEGER NOT NULL,
    prompt_id  TEXT,
    raw        BLOB NOT NULL
);
CREATE INDEX raw_events_by_session ON raw_events (session_id, seq);
CREATE TABLE records (
    seq        INTEGER PRIMARY KEY,
    session_id TEXT NOT NULL,
    record_id  TEXT NOT NULL UNIQUE,
    turn       INTEGER NOT NULL,
    prompt_id  TEXT,
    raw        BLOB NOT NULL
);
CREATE INDEX records_by_session ON records (session_id, seq);
CREATE INDEX records_by_turn ON records (session_id, turn);
CREATE TABLE prompts (
    session_id   TEXT NOT NULL,
    prompt_id    TEXT NOT NULL,
    state        TEXT NOT NULL CHECK (state IN
                     ('in_flight', 'completed', 'cancelled', 'error', 'interrupted')),
    stop_reason  TEXT,
    admitted_at  INTEGER,
    ended_at     INTEGER,
    terminal_seq INTEGER,
    PRIMARY KEY (session_id, prompt_id)
);
CREATE INDEX prompts_by_terminal ON prompts (session_id, terminal_seq);
"""


class OldTranscript:
    """Writes a version-1 or -2 file the way those daemons did (WAL, 64 KiB pages)."""

    def __init__(self, path: Path, version: int = 2) -> None:
        self.conn = sqlite3.connect(path, isolation_level=None)
        self.conn.execute("PRAGMA page_size=65536")
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.executescript(V2_SCHEMA)
        self.conn.execute(f"PRAGMA user_version={version}")

    def session(self, session_id: str, cwd: str, created_at: int = 1,
                agent_session_id: str | None = "acp-1") -> None:
        self.conn.execute("INSERT INTO sessions (session_id, workspace_cwd, created_at, "
                          "agent_session_id) VALUES (?, ?, ?, ?)",
                          (session_id, cwd, created_at, agent_session_id))

    def raw(self, session_id: str, events: Sequence[bytes], prompt_id: str | None,
            last_id: int) -> None:
        self.conn.execute("INSERT INTO raw_events (session_id, event_id, prompt_id, raw) "
                          "VALUES (?, ?, ?, ?)",
                          (session_id, last_id, prompt_id, b"\n".join(events)))

    def record(self, session_id: str, record_id: str, turn: int, prompt_id: str | None,
               raw: bytes) -> None:
        self.conn.execute("INSERT INTO records (session_id, record_id, turn, prompt_id, raw) "
                          "VALUES (?, ?, ?, ?, ?)", (session_id, record_id, turn, prompt_id, raw))

    def prompt(self, session_id: str, prompt_id: str, state: str = "in_flight",
               admitted_at: int = 5, stop_reason: str | None = None,
               ended_at: int | None = None, terminal_seq: int | None = None) -> None:
        self.conn.execute("INSERT INTO prompts (session_id, prompt_id, state, stop_reason, "
                          "admitted_at, ended_at, terminal_seq) VALUES (?, ?, ?, ?, ?, ?, ?)",
                          (session_id, prompt_id, state, stop_reason, admitted_at, ended_at,
                           terminal_seq))

    def close(self) -> None:
        self.conn.close()
