"""Builders shared by the tests of webui store."""

from __future__ import annotations

from typing import Any

from sdk.protocol.envelope import DaemonEvent

P1 = "prompt-1"


def update(session_kind: str, /, *, prompt: str | None = P1, text: str | None = None, id: int | None = None, **fields: Any) -> DaemonEvent:
    body: dict[str, Any] = {"sessionUpdate": session_kind, **fields}
    if text is not None:
        body["content"] = {"type": "text", "text": text}
    return DaemonEvent(type="session_update", id=id, prompt_id=prompt, data={"sessionId": "s", "update": body})

