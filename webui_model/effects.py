"""The side effects the reducer asks for, as values.

The reducer never performs a side effect: it returns these, and the provider performs them
(notices to the notice board, the rest to the side channels) — or drops them, when a rebuild
replays events the client has already acted on.

Pure: no I/O.
"""

from __future__ import annotations

from typing import Any, Literal, TypeAlias

import msgspec

__all__ = [
    "ConnectionMetadata",
    "FollowUpSuggestion",
    "InjectedMessage",
    "Notice",
    "PendingPromptPublication",
    "SideEffect",
    "WorkspaceSignal",
]


class Notice(msgspec.Struct, frozen=True, kw_only=True):
    """A user-visible notice; the provider keeps a list deduplicated by ``id``."""

    id: str
    code: str
    message: str
    severity: Literal["info", "warning", "error"] = "warning"
    category: str = "connection"
    operation: str | None = None
    recoverable: bool = True
    debug_message: str | None = None
    event_id: int | None = None
    data: Any = None


class WorkspaceSignal(msgspec.Struct, frozen=True, kw_only=True):
    """The workspace changed: ``kind`` is the ``sessionUpdate`` kind, ``data`` the update."""

    kind: str
    data: Any = None
    event_id: int | None = None


class PendingPromptPublication(msgspec.Struct, frozen=True, kw_only=True):
    """A queued prompt was added, started or completed (``type`` is the event type)."""

    type: str
    prompt_id: str | None = None
    data: Any = None
    event_id: int | None = None


class FollowUpSuggestion(msgspec.Struct, frozen=True, kw_only=True):
    """The agent suggested a follow-up prompt (``update._meta.followupSuggestion``)."""

    suggestion: Any
    prompt_id: str | None = None
    event_id: int | None = None


class InjectedMessage(msgspec.Struct, frozen=True, kw_only=True):
    """A user message that arrived mid-turn from somewhere other than the daemon's echo."""

    text: str
    prompt_id: str | None = None
    event_id: int | None = None


class ConnectionMetadata(msgspec.Struct, frozen=True, kw_only=True):
    """Stream bookkeeping from a synthetic frame (``type`` is the event type)."""

    type: str
    data: Any = None
    event_id: int | None = None


SideEffect: TypeAlias = (
    Notice
    | WorkspaceSignal
    | PendingPromptPublication
    | FollowUpSuggestion
    | InjectedMessage
    | ConnectionMetadata
)
