"""Cold restore of a persisted session: the pure half.

Two steps happen before a restored session goes live again:

1. Every prompt the ledger still shows ``in_flight`` is closed, so that every turn ends with
   exactly one terminal: the durable raw events of the unfinished turn are compacted (as at a turn boundary) into
   records, followed by a ``turn_error {code: "interrupted"}`` record. Prompts that were queued
   and never ran get just their terminal record. A turn whose own terminal is durable (only the
   boundary after it was lost) keeps that terminal and its ledger state.
2. The replay window is seeded from the newest stored turns; seeded events get fresh ids on the
   new bus (they are not in its ring).

No I/O, no clock and no randomness here: the caller supplies ``now_ms`` and ``new_record_id``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sdk.protocol.acp import EnvelopeView, view
from sdk.protocol.constants import TERMINAL_TYPES
from sdk.protocol.envelope import envelope_fields, event_from_mapping
from sdk.protocol.terminals import (
    DEFAULT_STOP_REASON,
    INTERRUPTED,
    STOP_CANCELLED,
    terminal_fields,
    turn_error,
)

from .compactor import TurnCompactor, stamp_record
from .envelope import Event, JsonObject, decode_json, encode_json
from .replay_window import Record
from .transcript_ops import FinishTurn, TerminalState

INTERRUPTED_MESSAGE = "Prompt interrupted by daemon restart"


def interrupted_terminal(session_id: str, prompt_id: str, now_ms: int) -> JsonObject:
    """The id-less envelope of the ``turn_error interrupted`` a restore closes a prompt with."""
    return envelope_fields(
        "turn_error", turn_error(session_id, prompt_id, INTERRUPTED, INTERRUPTED_MESSAGE),
        prompt_id=prompt_id, meta={"serverTimestamp": now_ms})


def _records(envs: Sequence[JsonObject], new_record_id: Callable[[], str]
             ) -> list[tuple[str, bytes]]:
    out = []
    for env in envs:
        record_id = new_record_id()
        out.append((record_id, encode_json(stamp_record(env, record_id))))
    return out


def _ledger_state(event: Event) -> tuple[TerminalState, str | None]:
    """The ledger terminal a published terminal event stands for (as the runner wrote it)."""
    if event.type == "turn_error":
        return "error", None
    frame = event_from_mapping(event.env)
    stop = (None if frame is None else terminal_fields(frame).stop_reason) or DEFAULT_STOP_REASON
    return ("cancelled" if stop == STOP_CANCELLED else "completed"), stop


def close_interrupted(
    session_id: str,
    raw_events: Sequence[bytes],
    in_flight: Sequence[str],
    *,
    now_ms: int,
    new_record_id: Callable[[], str],
) -> list[FinishTurn]:
    """The transcript ops that close every interrupted prompt (apply them in one batch).

    A turn whose terminal event is among the durable raw events did end: its terminal was
    committed, only the turn boundary after it was not (it failed, or the daemon died between
    the two). That turn is closed with its own terminal and ledger state, never relabelled
    ``interrupted``. Only a turn whose terminal is truly missing gets the ``interrupted``
    terminal, after its durable events; in-flight prompts with no durable event at all get
    just that terminal record.
    """
    compactor = TurnCompactor()
    running: str | None = None
    pending = set(in_flight)
    closed: set[str] = set()
    ops: list[FinishTurn] = []
    for raw in raw_events:
        try:
            env = decode_json(raw)
            event = Event.from_env(env)
        except Exception:  # a damaged row must not block the restore of the rest
            continue
        if event.type in TERMINAL_TYPES and event.prompt_id is not None:
            if event.prompt_id in closed:
                continue  # one terminal per prompt, whatever a damaged table holds
            state, stop = _ledger_state(event)
            ops.append(FinishTurn(session_id, event.prompt_id, state, stop, now_ms,
                                  _records(compactor.finish(event), new_record_id)))
            closed.add(event.prompt_id)
            pending.discard(event.prompt_id)
            running = None
            continue
        compactor.add(event)
        if event.prompt_id in pending:
            running = event.prompt_id
    if compactor.pending_events:
        if running is not None:
            terminal = Event.from_env(interrupted_terminal(session_id, running, now_ms))
            envs = compactor.finish(terminal)
        else:
            # Events between turns with no prompt to close: keep them as records.
            marker = Event.from_env(envelope_fields("restore_boundary", None))
            envs = compactor.finish(marker)[:-1]
        ops.append(FinishTurn(session_id, running, "interrupted", None, now_ms,
                              _records(envs, new_record_id)))
    for prompt_id in in_flight:
        if prompt_id == running or prompt_id in closed:
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
            head = view(env, EnvelopeView)
            if head is None or not isinstance(head.type, str):
                continue
            env = {"id": next_id, **{k: v for k, v in env.items() if k != "id"}}
            seeded = Event.from_env(env)
            seeded.release()
            segment.append(Record(seeded, record_id))
            next_id += 1
        if segment:
            segments.append(segment)
    return segments, next_id
