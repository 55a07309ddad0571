"""Builders shared by the tests of repair commit."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sdk.protocol.envelope import DaemonEvent
from webui_model import (
    Checkpoint,
    HistoryPage,
    MessageBlock,
    TranscriptStore,
    apply_history_page,
    mirror_page,
    mirror_status,
    replay_snapshot,
    take_checkpoint,
)

SID = "session-1"


P1, P2, P3 = "prompt-1", "prompt-2", "prompt-3"


def su(update: dict[str, Any], *, id: int | None = None, prompt: str | None = None, record: str | None = None) -> DaemonEvent:
    if record is not None:
        update = {**update, "_meta": {"qwen.session.recordId": record, "qwenTranscript": {"sourceRecordIds": [record]}}}
    return DaemonEvent(type="session_update", id=id, prompt_id=prompt, data={"sessionId": SID, "update": update})


def text(kind: str, body: str, **kw: Any) -> DaemonEvent:
    return su({"sessionUpdate": kind, "content": {"type": "text", "text": body}}, **kw)


def echo(body: str, prompt: str, **kw: Any) -> DaemonEvent:
    event = text("user_message_chunk", body, prompt=prompt, **kw)
    event.data["update"].setdefault("_meta", {})["source"] = "bridge-echo"
    return event


def tool(call_id: str, status: str, **kw: Any) -> DaemonEvent:
    return su({"sessionUpdate": "tool_call", "toolCallId": call_id, "title": call_id, "status": status}, **kw)


def commands(id: int) -> DaemonEvent:
    return su({"sessionUpdate": "available_commands_update", "availableCommands": [{"name": f"c{id}"}]}, id=id)


def terminal(kind: str, prompt: str, id: int) -> DaemonEvent:
    if kind == "turn_error":
        return DaemonEvent(type="turn_error", id=id, prompt_id=prompt, data={"sessionId": SID, "message": "agent failed", "code": "-32603", "promptId": prompt})
    return DaemonEvent(type="turn_complete", id=id, prompt_id=prompt, data={"sessionId": SID, "stopReason": kind, "promptId": prompt})


def live_marker(prompt: str | None, truncated: int = 30) -> DaemonEvent:
    return DaemonEvent(
        type="history_truncated",
        prompt_id=prompt,
        data={"reason": "replay_window_exceeded", "scope": "live_journal", "truncatedEvents": truncated, "retainedEvents": 3, "maxBytes": 300, "maxEvents": 3, "fullTranscriptAvailable": True},
    )


def p1_turn() -> list[DaemonEvent]:
    return [echo("q1", P1, id=1, record="r1"), text("agent_message_chunk", "a1", id=2, prompt=P1, record="r2"), terminal("end_turn", P1, 3)]


@dataclass
class Episode:
    store: TranscriptStore
    checkpoint: Checkpoint
    observed: set[int]
    watermark: int
    highest_live: int
    history_blocks: tuple[Any, ...]
    status_block: MessageBlock


def mounted_episode(terminal_kind: str = "end_turn", *, configured: int = 100) -> Episode:
    """Load mid-turn with a live marker, page in history, add a provider status, see the terminal."""
    live = [live_marker(P2), commands(38), text("agent_message_chunk", "chunk-4", id=39, prompt=P2), tool("t9", "in_progress", id=40, prompt=P2)]
    result = replay_snapshot(p1_turn(), live, configured_max_blocks=configured, pagination_enabled=True, history_has_more=True)
    checkpoint = take_checkpoint(result)
    assert checkpoint is not None
    store = TranscriptStore(max_blocks=configured)
    store.reset(result.state)

    page = HistoryPage(events=[echo("q0", "p0", record="r0a"), text("agent_message_chunk", "a0", prompt="p0", record="r0b")], has_more=True)
    outcome = apply_history_page(store.snapshot_state(), page, configured_max_blocks=configured)
    store.reset(outcome.state)
    checkpoint = mirror_page(checkpoint, outcome.page_blocks, pagination=outcome.state.pagination)

    status = store.add_status("Commands are temporarily unavailable.")
    checkpoint = mirror_status(checkpoint, status)

    for event in [text("agent_message_chunk", " chunk-5", id=41, prompt=P2), su({"sessionUpdate": "current_mode_update", "currentModeId": "auto"}, id=42), terminal(terminal_kind, P2, 43)]:
        store.dispatch(event)
    return Episode(store, checkpoint, observed={38, 39, 40}, watermark=40, highest_live=43, history_blocks=outcome.page_blocks, status_block=status)

