"""Builders shared by the tests of restore."""

from __future__ import annotations

from typing import Any

from daemon.core.envelope import make_event


def raw(event_id: int, event_type: str, data: dict[str, Any], prompt_id: str) -> bytes:
    event = make_event(event_id, event_type, data, now_ms=0, prompt_id=prompt_id)
    assert event is not None
    return event.raw


def chunk(event_id: int, text: str, prompt_id: str) -> bytes:
    return raw(event_id, "session_update", {"sessionId": "s", "update": {
        "sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}},
        prompt_id)


def done(event_id: int, prompt_id: str, stop: str = "end_turn") -> bytes:
    return raw(event_id, "turn_complete",
               {"sessionId": "s", "stopReason": stop, "promptId": prompt_id}, prompt_id)

