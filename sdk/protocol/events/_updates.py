"""The ACP update inside a ``session_update`` event, as frozen msgspec Structs clients read.

A ``session_update``'s ACP update is a tagged union on its ``sessionUpdate`` field
(:data:`AcpUpdate`): a Struct per kind clients use (text chunks, tool calls, plans, ...); kinds
without a Struct here, or an update whose typed fields do not fit, pass through as
:class:`RawUpdate`, the update as sent. Wire names are camelCase; unknown keys are ignored.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final, TypeAlias

import msgspec

from sdk.protocol.constants import RECORD_ID_META_KEY

__all__ = [
    "AcpUpdate",
    "AgentMessageChunk",
    "AgentThoughtChunk",
    "AvailableCommandsUpdate",
    "ContentChunk",
    "CurrentModeUpdate",
    "Plan",
    "QwenTranscript",
    "RawUpdate",
    "ToolCall",
    "ToolCallUpdate",
    "TypedSessionUpdate",
    "TypedUpdate",
    "UpdateMeta",
    "UserMessageChunk",
    "finite_number",
    "update_from_dict",
]


def finite_number(value: object) -> float | None:
    """``value`` as a float when it is a finite JSON number (booleans are not numbers)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


class QwenTranscript(msgspec.Struct, frozen=True, kw_only=True, rename="camel", gc=False):
    """``update._meta.qwenTranscript``: the transcript records a compacted event came from."""

    source_record_ids: list[Any] = msgspec.field(default_factory=list)


class UpdateMeta(msgspec.Struct, frozen=True, kw_only=True, rename="camel", gc=False):
    """The keys of ``update._meta`` clients read (agents and the daemon add others)."""

    server_timestamp: Any = None
    timestamp: Any = None
    source: str | None = None
    followup_suggestion: Any = None
    prompt_id: str | None = None
    parent_tool_call_id: str | None = None
    record_id: str | None = msgspec.field(default=None, name=RECORD_ID_META_KEY)
    qwen_transcript: QwenTranscript | None = None

    @property
    def record_ids(self) -> tuple[str, ...]:
        """``qwen.session.recordId``, then ``qwenTranscript.sourceRecordIds`` (non-empty
        strings, each once)."""
        ids: list[str] = []
        if self.record_id:
            ids.append(self.record_id)
        if self.qwen_transcript is not None:
            ids.extend(
                s
                for s in self.qwen_transcript.source_record_ids
                if isinstance(s, str) and s and s not in ids
            )
        return tuple(ids)


class ContentChunk(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """An ACP content block of a message chunk (``{type: "text", text}`` for text)."""

    type: str
    text: Any = None
    # A ``resource_link`` block's target and its label (absent for text).
    uri: Any = None
    name: Any = None

    @property
    def display_text(self) -> str:
        """The text of a text block; ``[<type>]`` for any other kind of content."""
        if self.type == "text" and isinstance(self.text, str):
            return self.text
        return f"[{self.type}]"


class _HasMeta(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """An ACP update's ``_meta`` and ``timestamp``, and what clients read from them."""

    meta: UpdateMeta | None = msgspec.field(default=None, name="_meta")
    timestamp: Any = None

    @property
    def agent_timestamp(self) -> float | None:
        """``update.timestamp``, else ``update._meta.timestamp`` (finite numbers only)."""
        stamp = self.timestamp
        meta = self.meta
        if stamp is None and meta is None:
            return None  # the common case, answered without a call
        typed = finite_number(stamp)
        if typed is None and meta is not None:
            typed = finite_number(meta.timestamp)
        return typed

    @property
    def record_ids(self) -> tuple[str, ...]:
        return () if self.meta is None else self.meta.record_ids


class _Update(_HasMeta, frozen=True, rename="camel", tag_field="sessionUpdate"):
    pass


class _Chunk(_Update, frozen=True):
    content: ContentChunk | None = None

    @property
    def text(self) -> str:
        return "" if self.content is None else self.content.display_text


class UserMessageChunk(_Chunk, frozen=True, tag="user_message_chunk"):
    pass


class AgentMessageChunk(_Chunk, frozen=True, tag="agent_message_chunk"):
    pass


class AgentThoughtChunk(_Chunk, frozen=True, tag="agent_thought_chunk"):
    pass


class _ToolFields(_Update, frozen=True):
    tool_call_id: str = ""
    title: str | None = None
    status: str | None = None
    kind: str | None = None
    content: list[Any] | None = None
    locations: list[Any] | None = None
    raw_input: Any = None
    raw_output: Any = None


class ToolCall(_ToolFields, frozen=True, tag="tool_call"):
    pass


class ToolCallUpdate(_ToolFields, frozen=True, tag="tool_call_update"):
    pass


class Plan(_Update, frozen=True, tag="plan"):
    entries: list[dict[str, Any]] = msgspec.field(default_factory=list)

    @property
    def completed(self) -> bool:
        """Every entry is ``completed`` (and there is at least one)."""
        return bool(self.entries) and all(e.get("status") == "completed" for e in self.entries)

    @property
    def checklist(self) -> tuple[tuple[bool, str], ...]:
        """Each entry as ``(completed, its content)``; entries that are not objects are skipped."""
        return tuple((e.get("status") == "completed", str(e.get("content")))
                     for e in self.entries if isinstance(e, dict))


class AvailableCommandsUpdate(_Update, frozen=True, tag="available_commands_update"):
    available_commands: list[Any] = msgspec.field(default_factory=list)


class CurrentModeUpdate(_Update, frozen=True, tag="current_mode_update"):
    current_mode_id: str | None = None


class RawUpdate(_HasMeta, frozen=True):
    """An update of a kind this package does not type, or whose typed fields do not fit:
    ``kind`` is its ``sessionUpdate`` (when a string), ``data`` the update as sent, ``meta``
    its ``_meta`` when that fits :class:`UpdateMeta`."""

    kind: str | None
    data: dict[str, Any]

    @property
    def typed_kind(self) -> bool:
        """The kind has a Struct here (so this update did not fit it: it is malformed)."""
        return self.kind in _TYPED_KINDS


TypedUpdate: TypeAlias = (
    UserMessageChunk
    | AgentMessageChunk
    | AgentThoughtChunk
    | ToolCall
    | ToolCallUpdate
    | Plan
    | AvailableCommandsUpdate
    | CurrentModeUpdate
)
AcpUpdate: TypeAlias = TypedUpdate | RawUpdate



class TypedSessionUpdate(msgspec.Struct, gc=False):
    """``{update}`` of one of the typed kinds: what a frame decoder reads a ``session_update``
    into in one pass (a Struct around the union, since msgspec caches a Struct's type info and
    not a bare union's)."""

    update: TypedUpdate


_TYPED_KINDS: Final = frozenset(
    {
        "user_message_chunk",
        "agent_message_chunk",
        "agent_thought_chunk",
        "tool_call",
        "tool_call_update",
        "plan",
        "available_commands_update",
        "current_mode_update",
    }
)


def _raw_update(update: dict[str, Any]) -> RawUpdate:
    kind = update.get("sessionUpdate")
    meta: UpdateMeta | None = None
    raw_meta = update.get("_meta")
    if isinstance(raw_meta, dict):
        try:
            meta = msgspec.convert(raw_meta, UpdateMeta)
        except msgspec.ValidationError:
            meta = None
    return RawUpdate(
        kind=kind if isinstance(kind, str) else None,
        data=update,
        meta=meta,
        timestamp=update.get("timestamp"),
    )


# The typed kinds by their tag: an update built in code is converted straight to its kind's
# Struct (the tag picks it; msgspec checks the tag again), without the union around it.
_UPDATE_BY_KIND: Final[Mapping[str, type[TypedUpdate]]] = {
    cls.__struct_config__.tag: cls  # type: ignore[misc]
    for cls in (
        UserMessageChunk,
        AgentMessageChunk,
        AgentThoughtChunk,
        ToolCall,
        ToolCallUpdate,
        Plan,
        AvailableCommandsUpdate,
        CurrentModeUpdate,
    )
}
assert _UPDATE_BY_KIND.keys() == _TYPED_KINDS


def update_from_dict(update: dict[str, Any]) -> AcpUpdate:
    kind = update.get("sessionUpdate")
    cls = _UPDATE_BY_KIND.get(kind) if isinstance(kind, str) else None
    if cls is None:
        return _raw_update(update)
    try:
        typed: TypedUpdate = msgspec.convert(update, cls)
    except msgspec.ValidationError:
        return _raw_update(update)
    return typed
