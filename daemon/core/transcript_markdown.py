"""A transcript as Markdown, one event at a time (``GET /session/{id}/export?format=markdown``).
Pure: bytes in, text out.

Each event of the transcript (a stored record or an event of the unfinished turn) becomes a
few lines or none: the user's prompt and the agent's answer as text under a heading per turn,
thoughts as quotes, plans as task lists, tool calls as one line each with their status,
permission decisions and turn ends as one line. Consecutive chunks of one kind join into one
paragraph, so :class:`MarkdownTranscript` keeps the kind of the last block it wrote.
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = ["MarkdownTranscript"]

_decode = msgspec.json.Decoder()


def _text(content: Any) -> str:
    if isinstance(content, dict) and isinstance(content.get("text"), str):
        return str(content["text"])
    if isinstance(content, dict) and content.get("type") == "resource_link":
        return f"[{content.get('name') or content.get('uri')}]({content.get('uri')})"
    return ""


class MarkdownTranscript:
    """Feed it events in transcript order with :meth:`event`; each call returns the Markdown
    to append (maybe empty). :meth:`header` is the document's first lines."""

    def __init__(self) -> None:
        self._block: str | None = None  # kind of the open text block
        self._turns = 0

    @staticmethod
    def header(session_id: str, workspace_cwd: str | None) -> str:
        where = f"\n\nWorkspace: `{workspace_cwd}`" if workspace_cwd else ""
        return f"# Session {session_id}{where}\n"

    def _open(self, kind: str, heading: str) -> str:
        if self._block == kind:
            return ""
        self._block = kind
        return f"\n\n{heading}\n\n"

    def event(self, raw: bytes) -> str:
        envelope = _decode.decode(raw)
        if not isinstance(envelope, dict):
            return ""
        kind = envelope.get("type")
        found = envelope.get("data")
        data: dict[str, Any] = found if isinstance(found, dict) else {}
        if kind == "session_update":
            return self._update(data.get("update"))
        self._block = None
        if kind == "turn_complete":
            return f"\n*Turn ended: {data.get('stopReason', 'end_turn')}.*\n"
        if kind == "turn_error":
            return f"\n*Turn failed: {data.get('code') or data.get('message') or 'error'}.*\n"
        if kind == "permission_resolved":
            outcome = data.get("outcome")
            chosen = outcome.get("optionId") if isinstance(outcome, dict) else outcome
            return f"\n*Permission: {chosen or 'resolved'}.*\n"
        return ""

    def _update(self, update: Any) -> str:
        if not isinstance(update, dict):
            return ""
        kind = update.get("sessionUpdate")
        if kind == "user_message_chunk":
            if self._block != "user":
                self._turns += 1
            head = self._open("user", f"## Turn {self._turns}\n\n**User**")
            return head + _text(update.get("content"))
        if kind == "agent_message_chunk":
            return self._open("agent", "**Agent**") + _text(update.get("content"))
        if kind == "agent_thought_chunk":
            text = _text(update.get("content")).replace("\n", "\n> ")
            if self._block == "thought":
                return text
            self._block = "thought"
            return "\n\n> " + text
        self._block = None
        if kind == "plan":
            listed = update.get("entries")
            entries: list[Any] = listed if isinstance(listed, list) else []
            lines = [f"- [{'x' if e.get('status') == 'completed' else ' '}] {e.get('content')}"
                     for e in entries if isinstance(e, dict)]
            return "\n\n**Plan**\n\n" + "\n".join(lines) + "\n" if lines else ""
        if kind in ("tool_call", "tool_call_update"):
            title = update.get("title") or update.get("toolCallId") or "tool call"
            status = update.get("status")
            return f"\n\n- Tool: {title}" + (f" ({status})" if status else "") + "\n"
        return ""
