"""A transcript as Markdown, one event at a time (``GET /session/{id}/export?format=markdown``).
Pure: bytes in, text out.

Each event of the transcript (a stored record or an event of the unfinished turn) becomes a
few lines or none: the user's prompt and the agent's answer as text under a heading per turn,
thoughts as quotes, plans as task lists, tool calls as one line each with their status,
permission decisions and turn ends as one line. Consecutive chunks of one kind join into one
paragraph, so :class:`MarkdownTranscript` keeps the kind of the last block it wrote.
"""

from __future__ import annotations

import msgspec

from sdk.protocol.acp import EnvelopeView, PermissionOptionView, view
from sdk.protocol.events import (
    AcpUpdate,
    AgentMessageChunk,
    AgentThoughtChunk,
    ContentChunk,
    PermissionResolvedData,
    Plan,
    SessionUpdateData,
    ToolCall,
    ToolCallUpdate,
    TurnCompleteData,
    TurnErrorData,
    UserMessageChunk,
    payload_from_data,
)

__all__ = ["MarkdownTranscript"]

_decode_envelope = msgspec.json.Decoder(EnvelopeView)


def _text(content: ContentChunk | None) -> str:
    if content is None:
        return ""
    if isinstance(content.text, str):
        return content.text
    if content.type == "resource_link":
        return f"[{content.name or content.uri}]({content.uri})"
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
        try:
            envelope = _decode_envelope.decode(raw)
        except msgspec.ValidationError:
            return ""  # not an envelope object
        kind = envelope.type
        if not isinstance(kind, str):
            return ""
        payload = payload_from_data(kind, envelope.data)
        if kind == "session_update":
            return self._update(payload.acp) if isinstance(payload, SessionUpdateData) else ""
        self._block = None
        if isinstance(payload, TurnCompleteData):
            return f"\n*Turn ended: {payload.stop_reason}.*\n"
        if isinstance(payload, TurnErrorData):
            return f"\n*Turn failed: {payload.code or payload.message or 'error'}.*\n"
        if isinstance(payload, PermissionResolvedData):
            option = view(payload.outcome, PermissionOptionView)
            chosen = option.option_id if option is not None else payload.outcome
            return f"\n*Permission: {chosen or 'resolved'}.*\n"
        return ""

    def _update(self, update: AcpUpdate) -> str:
        if isinstance(update, UserMessageChunk):
            if self._block != "user":
                self._turns += 1
            head = self._open("user", f"## Turn {self._turns}\n\n**User**")
            return head + _text(update.content)
        if isinstance(update, AgentMessageChunk):
            return self._open("agent", "**Agent**") + _text(update.content)
        if isinstance(update, AgentThoughtChunk):
            text = _text(update.content).replace("\n", "\n> ")
            if self._block == "thought":
                return text
            self._block = "thought"
            return "\n\n> " + text
        self._block = None
        if isinstance(update, Plan):
            lines = [f"- [{'x' if done else ' '}] {content}" for done, content in update.checklist]
            return "\n\n**Plan**\n\n" + "\n".join(lines) + "\n" if lines else ""
        if isinstance(update, (ToolCall, ToolCallUpdate)):
            title = update.title or update.tool_call_id or "tool call"
            status = update.status
            return f"\n\n- Tool: {title}" + (f" ({status})" if status else "") + "\n"
        return ""
