"""Builders shared by the tests of repair."""

from __future__ import annotations

from typing import Any

from sdk._repair import (
    EpisodeRegistry,
    RepairEpisode,
    find_repair_target,
)
from sdk.protocol.envelope import DaemonEvent

SID = "sess-1"


P = "prompt-A"


def marker(prompt_id: str | None = P, **data_overrides: Any) -> DaemonEvent:
    data: dict[str, Any] = {
        "reason": "replay_window_exceeded",
        "scope": "live_journal",
        "truncatedEvents": 24,
        "retainedEvents": 2,
        "maxBytes": 4096,
        "maxEvents": 4,
        "fullTranscriptAvailable": True,
    }
    data.update(data_overrides)
    return DaemonEvent(type="history_truncated", data=data, prompt_id=prompt_id)


def chunk(ident: int | None, prompt_id: str | None, *, in_data: bool = False) -> DaemonEvent:
    data: dict[str, Any] = {
        "sessionId": SID,
        "update": {
            "sessionUpdate": "agent_message_chunk",
            "content": {"type": "text", "text": "x"},
        },
    }
    if in_data and prompt_id is not None:
        data["promptId"] = prompt_id
        prompt_id = None
    return DaemonEvent(type="session_update", id=ident, data=data, prompt_id=prompt_id)


def user(ident: int | None, prompt_id: str) -> DaemonEvent:
    return DaemonEvent(
        type="session_update",
        id=ident,
        prompt_id=prompt_id,
        data={
            "sessionId": SID,
            "update": {
                "sessionUpdate": "user_message_chunk",
                "content": {"type": "text", "text": "q"},
            },
        },
    )


def done(
    ident: int | None, prompt_id: str, stop: str = "end_turn", *, envelope: bool = True
) -> DaemonEvent:
    return DaemonEvent(
        type="turn_complete",
        id=ident,
        prompt_id=prompt_id if envelope else None,
        data={"sessionId": SID, "stopReason": stop, "promptId": prompt_id},
    )


def make_episode(registry: EpisodeRegistry | None = None) -> RepairEpisode:
    target = find_repair_target(SID, [marker(P), chunk(25, P), chunk(26, P)], 26, False)
    assert target is not None
    if registry is not None:
        return registry.new_episode(SID, target, [25, 26], 26)
    return RepairEpisode(SID, target, [25, 26], 26)

