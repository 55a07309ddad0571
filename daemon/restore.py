"""Cold restore of a persisted session (SPEC §6.2): the pure half.

Two steps happen before a restored session goes live again:

1. Every prompt the ledger still shows ``in_flight`` is closed, so that every turn ends with
   exactly one terminal: the durable raw events of the unfinished turn are compacted (§3.1) into
   records, followed by a ``turn_error {code: "interrupted"}`` record. Prompts that were queued
   and never ran get just their terminal record.
2. The replay window is seeded from the newest stored turns; seeded events get fresh ids on the
   new bus (they are not in its ring).

No I/O, no clock and no randomness here: the caller supplies ``now_ms`` and ``new_record_id``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .compactor import TurnCompactor, stamp_record
from .envelope import Event, JsonObject, decode_json, encode_json
from .replay_window import Record
from .transcript_store import FinishTurn

INTERRUPTED_MESSAGE = "Prompt interrupted by daemon restart"


def interrupted_terminal(session_id: str, prompt_id: str, now_ms: int) -> JsonObject:
    return {
        "v": 1,
        "type": "turn_error",
        "data": {"sessionId": session_id, "message": INTERRUPTED_MESSAGE,
                 "code": "interrupted", "promptId": prompt_id},
        "promptId": prompt_id,
        "_meta": {"serverTimestamp": now_ms},
    }


def _records(envs: Sequence[JsonObject], new_record_id: Callable[[], str]
             ) -> list[tuple[str, bytes]]:
    out = []
    for env in envs:
        record_id = new_record_id()
        out.append((record_id, encode_json(stamp_record(env, record_id))))
    return out


def close_interrupted(
    session_id: str,
    raw_events: Sequence[bytes],
    in_flight: Sequence[str],
    *,
    now_ms: int,
    new_record_id: Callable[[], str],
) -> list[FinishTurn]:
    """The transcript ops that close every interrupted prompt (apply them in one batch)."""
    compactor = TurnCompactor()
    running: str | None = None
    pending = set(in_flight)
    for raw in raw_events:
        try:
            env = decode_json(raw)
            event = Event.from_env(env)
        except Exception:  # a damaged row must not block the restore of the rest
            continue
        compactor.add(event)
        if event.prompt_id in pending:
            running = event.prompt_id
    ops: list[FinishTurn] = []
    if compactor.pending_events:
        if running is not None:
            terminal = Event.from_env(interrupted_terminal(session_id, running, now_ms))
            envs = compactor.finish(terminal)
        else:
            # Events between turns with no prompt to close: keep them as records.
            marker = Event.from_env({"v": 1, "type": "restore_boundary", "data": None})
            envs = compactor.finish(marker)[:-1]
        ops.append(FinishTurn(session_id, running, "interrupted", None, now_ms,
                              _records(envs, new_record_id)))
    for prompt_id in in_flight:
        if prompt_id == running:
            continue
        ops.append(FinishTurn(session_id, prompt_id, "interrupted", None, now_ms, _records(
            [interrupted_terminal(session_id, prompt_id, now_ms)], new_record_id)))
    return ops


def seed_segments(turns: Sequence[Sequence[tuple[str, bytes]]], first_id: int
                  ) -> tuple[list[list[Record]], int]:
    """Stored turns as replay-window segments with fresh ids from ``first_id``; returns the
    segments and the next free id."""
    next_id = first_id
    segments: list[list[Record]] = []
    for turn in turns:
        segment: list[Record] = []
        for record_id, raw in turn:
            try:
                env: Any = decode_json(raw)
            except Exception:
                continue
            if not isinstance(env, dict) or not isinstance(env.get("type"), str):
                continue
            env = {"id": next_id, **{k: v for k, v in env.items() if k != "id"}}
            seeded = Event.from_env(env)
            seeded.release()
            segment.append(Record(seeded, record_id))
            next_id += 1
        if segment:
            segments.append(segment)
    return segments, next_id
