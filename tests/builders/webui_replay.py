"""Builders shared by the tests of webui replay."""

from __future__ import annotations

from typing import Any

from sdk.protocol.envelope import DaemonEvent
from webui_model import (
    StoreState,
    replay_snapshot,
)

SID = "a2256628-5fe5-4cde-adc9-494eddf80516"


def chunk(
    kind: str,
    text: str,
    *,
    id: int | None = None,
    prompt: str | None = None,
    record: str | None = None,
    meta_style: str = "both",
) -> DaemonEvent:
    update: dict[str, Any] = {"sessionUpdate": kind, "content": {"type": "text", "text": text}}
    if record is not None:
        meta: dict[str, Any] = {}
        if meta_style in ("both", "record"):
            meta["qwen.session.recordId"] = record
        if meta_style in ("both", "sources"):
            meta["qwenTranscript"] = {"sourceRecordIds": [record]}
        update["_meta"] = meta
    return DaemonEvent(
        type="session_update", id=id, prompt_id=prompt, data={"sessionId": SID, "update": update}
    )


def user(text: str, record: str, **kw: Any) -> DaemonEvent:
    return chunk("user_message_chunk", text, record=record, **kw)


def agent(text: str, record: str | None = None, **kw: Any) -> DaemonEvent:
    return chunk("agent_message_chunk", text, record=record, **kw)


def done(prompt: str, id: int | None = None) -> DaemonEvent:
    return DaemonEvent(
        type="turn_complete", id=id, prompt_id=prompt,
        data={"sessionId": SID, "stopReason": "end_turn", "promptId": prompt},
    )


def replay_marker(**extra: Any) -> DaemonEvent:
    data = {
        "reason": "replay_window_exceeded", "truncatedEvents": 7, "retainedEvents": 5,
        "maxBytes": 3000, "fullTranscriptAvailable": True, **extra,
    }
    return DaemonEvent(type="history_truncated", data=data)


def live_marker(prompt: str | None = "p-live", **extra: Any) -> DaemonEvent:
    data = {
        "reason": "replay_window_exceeded", "scope": "live_journal", "truncatedEvents": 35,
        "retainedEvents": 9, "maxBytes": 4096, "maxEvents": 4, "fullTranscriptAvailable": True,
        **extra,
    }
    return DaemonEvent(type="history_truncated", prompt_id=prompt, data=data)


def _paged_state(configured: int = 100) -> StoreState:
    compacted = [replay_marker(recordId="r10"), user("q10", "r10", prompt="p10"), agent("a10", "r11", prompt="p10"), done("p10")]
    return replay_snapshot(compacted, [], configured_max_blocks=configured, pagination_enabled=True).state

