"""Transcript blocks: the immutable records the WebUI model renders.

Every block is a frozen msgspec Struct. A change never mutates a block: the reducer builds a
new block with :func:`msgspec.structs.replace` and swaps it into the list. That is what lets a
repair checkpoint, a store snapshot and the live store hold the *same* block objects without
one of them seeing the others' later edits.

Block ids are ``"<kind>-<ordinal>"`` with one ordinal counter per kind.

Timestamps are server times in epoch milliseconds taken from the events (never a local
clock): ``server_timestamp`` is the envelope ``_meta.serverTimestamp`` of the event that
created the block, ``updated_at`` that of the latest event that changed it, and ``timestamp``
the agent-side ``update.timestamp`` (or ``update._meta.timestamp``) when the agent sent one.
"""

from __future__ import annotations

from typing import Any, Final, Literal, TypeAlias

import msgspec

BlockKind: TypeAlias = Literal[
    "user",
    "assistant",
    "thought",
    "tool",
    "permission",
    "status",
    "error",
    "debug",
    "prompt_cancelled",
]

BLOCK_KINDS: Final[tuple[BlockKind, ...]] = (
    "user",
    "assistant",
    "thought",
    "tool",
    "permission",
    "status",
    "error",
    "debug",
    "prompt_cancelled",
)

TEXT_KINDS: Final[frozenset[str]] = frozenset({"user", "assistant", "thought"})
MESSAGE_KINDS: Final[frozenset[str]] = frozenset({"status", "error", "debug", "prompt_cancelled"})

# Tool statuses after which a tool is no longer "in flight" (cannot be cancelled by a turn end).
TERMINAL_TOOL_STATUSES: Final[frozenset[str]] = frozenset({"completed", "failed", "cancelled"})


class _Block(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """The fields every block kind carries.

    ``gc=False``: a block holds strings, numbers and the JSON values an event carried (a
    tool's merged fields, a message's payload), which cannot refer back to it, so blocks take
    no part in reference cycles and the collector need not track them. A store keeps up to
    200,000 of them, and every full collection would otherwise walk each one.
    """

    id: str
    event_id: int | None = None
    last_event_id: int | None = None
    prompt_id: str | None = None
    server_timestamp: float | None = None
    updated_at: float | None = None
    timestamp: float | None = None
    source_record_ids: tuple[str, ...] = ()


class TextBlock(_Block, frozen=True, kw_only=True):
    """A user, assistant or thought message built from streamed chunks."""

    kind: Literal["user", "assistant", "thought"]
    text: str = ""
    streaming: bool = False
    # Thought blocks start collapsed in the UI; the flag is kept on the block so a view can
    # toggle it with a copy-on-write replace like any other change.
    collapsed: bool = False


class ToolBlock(_Block, frozen=True, kw_only=True):
    """A tool call (upserted by ``tool_call_id``) or an agent plan (``tool_call_id="plan"``)."""

    id: str
    kind: Literal["tool"] = "tool"
    tool_call_id: str
    title: str = ""
    status: str = "pending"
    # The merged ACP tool-call fields (wire names: kind, content, locations, rawInput,
    # rawOutput, entries for plans): later non-null values win, like the daemon's compactor.
    data: dict[str, Any] = msgspec.field(default_factory=dict)


class PermissionBlock(_Block, frozen=True, kw_only=True):
    """A permission request; ``permission_resolved`` fills ``outcome`` and sets ``resolved``,
    and ``reason`` when the daemon answered it by itself (``timeout``, ``turn_ended``, ...)."""

    kind: Literal["permission"] = "permission"
    request_id: str
    tool_call: dict[str, Any] = msgspec.field(default_factory=dict)
    options: tuple[Any, ...] = ()
    resolved: bool = False
    outcome: Any = None
    reason: str | None = None


class MessageBlock(_Block, frozen=True, kw_only=True):
    """A ``status``, ``error``, ``debug`` or ``prompt_cancelled`` line.

    ``source`` says what produced it (``history_truncated``, ``turn_error``, ``provider``, the
    event type, ...); ``data`` keeps the complete daemon payload unmodified.
    """

    kind: Literal["status", "error", "debug", "prompt_cancelled"]
    text: str = ""
    code: str | None = None
    source: str | None = None
    data: Any = None


Block: TypeAlias = TextBlock | ToolBlock | PermissionBlock | MessageBlock


def block_id(kind: str, ordinal: int) -> str:
    """The id of the ``ordinal``-th block of ``kind``."""
    return f"{kind}-{ordinal}"


def parse_block_id(value: str) -> tuple[str, int]:
    """Split a block id into ``(kind, ordinal)``; raises ``ValueError`` on a foreign id."""
    kind, sep, ordinal = value.rpartition("-")
    if not sep or kind not in BLOCK_KINDS or not ordinal.isdigit():
        raise ValueError(f"not a transcript block id: {value!r}")
    return kind, int(ordinal)
