"""Builders shared by the tests of transcript store."""

from __future__ import annotations

import uuid

import msgspec

from daemon.transcript_store import (
    AppendEvent,
    FinishTurn,
)

S1 = "11111111-1111-4111-8111-111111111111"


S2 = "22222222-2222-4222-8222-222222222222"


def ev(event_id: int, text: str = "x", prompt_id: str | None = None) -> bytes:
    env: dict[str, object] = {"id": event_id, "v": 1, "type": "session_update", "data": text}
    if prompt_id is not None:
        env["promptId"] = prompt_id
    return msgspec.json.encode(env)


def append(sid: str, event_id: int, prompt_id: str | None = None, text: str = "x") -> AppendEvent:
    return AppendEvent(sid, event_id, prompt_id, ev(event_id, text, prompt_id))


def rec(n: int, size: int = 0) -> tuple[str, bytes]:
    """A record whose id encodes ``n`` and whose raw is exactly ``size`` bytes when given."""
    record_id = str(uuid.UUID(int=n))
    raw = msgspec.json.encode({"n": n})
    if size:
        base = len(msgspec.json.encode({"n": n, "p": ""}))
        raw = msgspec.json.encode({"n": n, "p": "x" * (size - base)})
        assert len(raw) == size
    return record_id, raw


def finish(
    sid: str,
    prompt_id: str | None,
    records: list[tuple[str, bytes]],
    terminal: str = "completed",
    stop_reason: str | None = "end_turn",
    at_ms: int = 1000,
) -> FinishTurn:
    return FinishTurn(sid, prompt_id, terminal, stop_reason, at_ms, records)  # type: ignore[arg-type]

