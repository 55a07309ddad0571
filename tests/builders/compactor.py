"""Builders shared by the tests of compactor."""

from __future__ import annotations

from typing import Any

from daemon.core.compactor import TurnCompactor
from daemon.core.envelope import Event, JsonObject, make_event

SID = "sess-1"


PID = "prompt-1"


CID = "client-1"


class Feed:
    """Publishes events with consecutive ids into a compactor, like the bus does."""

    def __init__(self) -> None:
        self.compactor = TurnCompactor()
        self.next_id = 1
        self.clock = 1_000

    def publish(
        self,
        event_type: str,
        data: Any,
        *,
        prompt_id: str | None = PID,
        originator: str | None = CID,
    ) -> Event:
        self.clock += 1
        event = make_event(
            self.next_id,
            event_type,
            data,
            now_ms=self.clock,
            prompt_id=prompt_id,
            originator_client_id=originator,
        )
        assert event is not None
        self.next_id += 1
        self.compactor.add(event)
        return event

    def update(self, update: JsonObject, **kwargs: Any) -> Event:
        return self.publish("session_update", {"sessionId": SID, "update": update}, **kwargs)

    def chunk(
        self, text: str, kind: str = "agent_message_chunk", meta: JsonObject | None = None,
        **kwargs: Any,
    ) -> Event:
        update: JsonObject = {"sessionUpdate": kind, "content": {"type": "text", "text": text}}
        if meta is not None:
            update["_meta"] = meta
        return self.update(update, **kwargs)

    def terminal(self) -> Event:
        return self.publish(
            "turn_complete", {"sessionId": SID, "stopReason": "end_turn", "promptId": PID}
        )

    def finish(self) -> list[JsonObject]:
        return self.compactor.finish(self.terminal())


def upd(env: JsonObject) -> JsonObject:
    update: JsonObject = env["data"]["update"]
    return update


def text_of(env: JsonObject) -> str:
    text: str = upd(env)["content"]["text"]
    return text


def kinds(out: list[JsonObject]) -> list[str]:
    return [upd(e)["sessionUpdate"] if e["type"] == "session_update" else e["type"] for e in out]

