"""Builders shared by the tests of live journal."""

from __future__ import annotations

from typing import Any

from daemon.core.envelope import Event, JsonObject

SESSION = "d4c9c4f5-679d-488a-ab06-94a8c2fb6803"


PROMPT = "4b4d6d19-07db-4710-98d1-89d044580c3a"


CLIENT = "client_7e1fbf2e-4191-4753-bf7d-8e8db953a38e"


NOW = 1_796_204_678_669


def chunk_env(
    event_id: int,
    text: str,
    *,
    kind: str = "agent_message_chunk",
    update_meta: JsonObject | None = None,
) -> JsonObject:
    update: JsonObject = {"sessionUpdate": kind, "content": {"type": "text", "text": text}}
    if update_meta is not None:
        update["_meta"] = update_meta
    return {
        "id": event_id,
        "v": 1,
        "type": "session_update",
        "data": {"sessionId": SESSION, "update": update},
        "promptId": PROMPT,
        "originatorClientId": CLIENT,
        "_meta": {"serverTimestamp": NOW + event_id},
    }


def chunk(event_id: int, text: str | None = None, **kwargs: Any) -> Event:
    return Event.from_env(chunk_env(event_id, f"t{event_id}" if text is None else text, **kwargs))

