"""What the command line prints: readable lines, or JSON objects one per line.

``--json`` prints events exactly as the daemon sends them (the envelope with its ``v``, keys in
the daemon's order); the readable form leaves out the protocol's own bookkeeping frames
(``replay_complete``, ``session_snapshot``), which say nothing about the session.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from typing import Any, Final, TextIO

import msgspec

from sdk._truncation import status_text
from sdk.protocol.envelope import DaemonEvent, encode_envelope, event_prompt_id
from sdk.protocol.events import (
    AgentMessageChunk,
    AgentThoughtChunk,
    DaemonHistoryTruncatedData,
    SessionUpdateData,
    ToolCall,
    ToolCallUpdate,
    UserMessageChunk,
)
from sdk.protocol.terminals import terminal_fields

_encode = msgspec.json.Encoder().encode

#: Frames the daemon sends for the protocol's own sake: hidden from the readable output.
BOOKKEEPING: Final = frozenset({"replay_complete", "session_snapshot"})


class Output:
    def __init__(self, as_json: bool, out: TextIO | None = None,
                 err: TextIO | None = None) -> None:
        self.as_json = as_json
        self.out = out if out is not None else sys.stdout
        self.err = err if err is not None else sys.stderr

    def json(self, obj: Any) -> None:
        self.out.write(_encode(obj).decode() + "\n")
        self.out.flush()

    def raw_json(self, data: bytes) -> None:
        self.out.write(data.decode() + "\n")
        self.out.flush()

    def line(self, text: str) -> None:
        self.out.write(text + "\n")
        self.out.flush()

    def text(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()

    def error(self, text: str) -> None:
        self.err.write(f"turnkeeper: {text}\n")
        self.err.flush()

    def error_raw(self, text: str) -> None:
        """Write to stderr as is (a question and its prompt)."""
        self.err.write(text)
        self.err.flush()

    def event(self, event: DaemonEvent) -> None:
        """One event: its wire JSON, or one readable line (nothing for bookkeeping frames)."""
        if self.as_json:
            self.raw_json(wire_bytes(event))
        elif event.type not in BOOKKEEPING:
            self.line(describe(event))


def wire_bytes(event: DaemonEvent) -> bytes:
    """The event's envelope as the daemon encodes it (``v`` included)."""
    return encode_envelope(event.type, event.data, event_id=event.id, prompt_id=event.prompt_id,
                           originator_client_id=event.originator_client_id, meta=event.meta)


def chunk_text(event: DaemonEvent) -> str | None:
    """The text of an agent message chunk (the answer), else None."""
    payload = event.payload
    if not isinstance(payload, SessionUpdateData):
        return None
    update = payload.acp
    if not isinstance(update, AgentMessageChunk) or update.content is None:
        return None
    text = update.content.text
    return text if isinstance(text, str) else None


def describe(event: DaemonEvent) -> str:
    """One readable line for an event."""
    ident = f"#{event.id}" if event.id is not None else "#-"
    parts = [ident, event.type]
    payload = event.payload
    detail = ""
    if isinstance(payload, SessionUpdateData):
        if payload.kind is not None:
            parts.append(payload.kind)
        update = payload.acp
        if isinstance(update, UserMessageChunk | AgentMessageChunk | AgentThoughtChunk):
            if update.content is not None and isinstance(update.content.text, str):
                detail = _encode(update.content.text).decode()
        elif isinstance(update, ToolCall | ToolCallUpdate) and update.title is not None:
            detail = update.title
    elif event.type == "turn_complete":
        stop = terminal_fields(event).stop_reason
        detail = f"stopReason={stop if stop is not None else 'end_turn'}"
    elif event.type == "turn_error":
        fields = terminal_fields(event)
        code = fields.code
        detail = (f"[{code}] " if code is not None else "") + (fields.message or "")
    elif event.type == "history_truncated":
        marker = payload if isinstance(payload, DaemonHistoryTruncatedData) else None
        detail = status_text(marker) if marker is not None else "malformed payload"
    else:
        reason = getattr(payload, "reason", None)
        if isinstance(reason, str):
            detail = f"reason={reason}"
    prompt_id = event_prompt_id(event)
    if prompt_id:
        parts.append(f"prompt={prompt_id[:8]}")
    line = " ".join(parts)
    return f"{line} {detail}" if detail else line


def ago(iso: str | None, now: datetime | None = None) -> str:
    """``12 s ago``, ``4 min ago``, ``3 h ago``, ``2 d ago``; ``?`` for no or a bad time."""
    if not iso:
        return "?"
    try:
        at = datetime.fromisoformat(iso.replace("Z", "+00:00"))
    except ValueError:
        return "?"
    seconds = max(0, int(((now or datetime.now(UTC)) - at).total_seconds()))
    if seconds < 60:
        return f"{seconds} s ago"
    if seconds < 3600:
        return f"{seconds // 60} min ago"
    if seconds < 86400:
        return f"{seconds // 3600} h ago"
    return f"{seconds // 86400} d ago"


def table(rows: list[list[str]]) -> list[str]:
    """Rows as left-aligned columns (the last column is not padded)."""
    if not rows:
        return []
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return ["  ".join([*(cell.ljust(widths[i]) for i, cell in enumerate(row[:-1])), row[-1]])
            for row in rows]
