"""``turnkeeper-daemon prune [--dry-run]``: retention with the daemon stopped.

Takes the data directory's lock (a running daemon prunes by itself: this refuses), removes the
sessions the running daemon's retention would (closed ones; with ``--retain-days``, those idle
longer; with ``--retain-bytes``, the least recently active while the transcript is bigger),
then rewrites the file with SQLite's ``VACUUM`` so it shrinks to what it holds (an older file
also gets ``auto_vacuum=INCREMENTAL`` then, so the running daemon can give space back from then
on). ``--dry-run`` only says what it would remove. Exit status 0, 1 when the data directory is
locked or holds no transcript, 2 for a bad flag.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from .config import ConfigError, _retain_bytes, _retain_days, default_data_dir, env_var
from .core.retention import RetentionPolicy, by_bytes_order, expired
from .transcript_retention import delete_step, stored_sessions, used_bytes
from .transcript_store import TranscriptDatabase

__all__ = ["run_prune"]

TRANSCRIPT_FILE = "transcript.sqlite3"


def _parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"{prog} prune", description=(
        "Remove closed sessions and those the retention flags let go from a stopped daemon's "
        "transcript, then shrink the file."))
    p.add_argument("--data-dir", default=os.environ.get(env_var("--data-dir")),
                   help="the daemon's data directory (default: $TURNKEEPER_DATA_DIR, else "
                        "the daemon's default)")
    p.add_argument("--retain-days", default=os.environ.get(env_var("--retain-days")),
                   help="also remove sessions idle more than N days (default: "
                        "$TURNKEEPER_RETAIN_DAYS, else off)")
    p.add_argument("--retain-bytes", default=os.environ.get(env_var("--retain-bytes")),
                   help="also remove the least recently active sessions while the transcript "
                        "is bigger than SIZE (default: $TURNKEEPER_RETAIN_BYTES, else off)")
    p.add_argument("--dry-run", action="store_true",
                   help="say what would be removed, change nothing (default: off)")
    p.add_argument("--now-ms", default=None, help=argparse.SUPPRESS)  # tests: the clock
    return p


def _session_bytes(store: TranscriptDatabase) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for table in ("records", "raw_events"):
        for session_id, size in store.connection.execute(
                f"SELECT session_id, sum(length(raw)) FROM {table} GROUP BY session_id"):
            sizes[session_id] = sizes.get(session_id, 0) + int(size or 0)
    return sizes


def run_prune(argv: Sequence[str], prog: str, out: TextIO = sys.stdout) -> int:
    from .server import DaemonStartError, acquire_lock

    args = _parser(prog).parse_args(list(argv))
    try:
        policy = RetentionPolicy(_retain_days(args.retain_days), _retain_bytes(args.retain_bytes))
    except ConfigError as exc:
        print(f"{prog} prune: {exc}", file=sys.stderr)
        return 2
    data_dir = Path(args.data_dir) if args.data_dir else default_data_dir()
    path = data_dir / TRANSCRIPT_FILE
    if not path.is_file():
        print(f"{prog} prune: no transcript in {data_dir}", file=sys.stderr)
        return 1
    try:
        lock = acquire_lock(data_dir)
    except DaemonStartError as exc:
        print(f"{prog} prune: {exc} (a running daemon prunes by itself)", file=sys.stderr)
        return 1
    try:
        store = TranscriptDatabase(path)
        try:
            return _prune(store, path, policy, args, out)
        finally:
            store.close()
    finally:
        lock.close()


def _prune(store: TranscriptDatabase, path: Path, policy: RetentionPolicy,
           args: argparse.Namespace, out: TextIO) -> int:
    now = int(args.now_ms) if args.now_ms else int(time.time() * 1000)
    sessions = stored_sessions(store)
    doomed = expired(sessions, (), policy, now)
    if policy.retain_bytes is not None:
        sizes = _session_bytes(store)
        left = sum(sizes.get(s.session_id, 0) for s in sessions
                   if s.session_id not in doomed)
        for session_id in by_bytes_order(sessions, ()):
            if left <= policy.retain_bytes:
                break
            if session_id not in doomed:
                doomed.append(session_id)
                left -= sizes.get(session_id, 0)
    before = os.stat(path).st_size
    verb = "would remove" if args.dry_run else "removed"
    for session_id in doomed:
        if not args.dry_run:
            while not delete_step(store, session_id, 4096):
                pass
        print(f"{verb} session {session_id}", file=out)
    if args.dry_run:
        print(f"{len(doomed)} of {len(sessions)} sessions would be removed; "
              f"{used_bytes(store)} bytes in use now", file=out)
        return 0
    conn = store.connection
    conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
    conn.execute("VACUUM")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    after = os.stat(path).st_size
    print(f"{len(doomed)} of {len(sessions)} sessions removed; transcript {before} -> {after} "
          "bytes", file=out)
    return 0
