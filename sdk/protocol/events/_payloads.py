"""Every event payload the daemon emits and clients read, as frozen msgspec Structs, and the
event ``type`` each is published as. Wire names are camelCase; unknown keys are ignored (the
complete payload stays in :attr:`~sdk.protocol.envelope.DaemonEvent.data`). Pure: no I/O, no
clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, TypeAlias, TypeVar

import msgspec

from sdk.protocol.events._history_truncated import DaemonHistoryTruncatedData
from sdk.protocol.events._updates import AcpUpdate, update_from_dict

__all__ = [
    "KNOWN_EVENT_TYPES",
    "PAYLOAD_TYPES",
    "ClientEvictedData",
    "EventPayload",
    "KnownEventData",
    "PendingPromptAddedData",
    "PendingPromptCompletedData",
    "PendingPromptStartedData",
    "PermissionOption",
    "PermissionRequestData",
    "PermissionResolvedData",
    "PermissionToolCall",
    "PromptCancelledData",
    "ReplayCompleteData",
    "SessionClosedData",
    "SessionDiedData",
    "SessionSnapshotData",
    "SessionUpdateData",
    "SlowClientWarningData",
    "StateResyncRequiredData",
    "StreamErrorData",
    "TurnCompleteData",
    "TurnErrorData",
    "event_type_of",
]

_S = TypeVar("_S", bound=msgspec.Struct)


# --- payloads -------------------------------------------------------------------------------------


class _Payload(msgspec.Struct, frozen=True, kw_only=True, rename="camel", gc=False):
    """Base of typed payloads: wire names are camelCase, unknown keys are ignored.

    ``gc=False``: payloads hold no reference cycles, and a client keeps many of them (a
    transcript of 100,000 events), so the collector need not scan them."""


class SessionUpdateData(_Payload, frozen=True, kw_only=True, dict=True, gc=True):
    """``{sessionId, update}``; :attr:`acp` is the update as its typed ACP Struct."""

    session_id: str | None = None
    update: dict[str, Any]

    @property
    def kind(self) -> str | None:
        """The ACP ``sessionUpdate`` discriminator (``agent_message_chunk`` …)."""
        value = self.update.get("sessionUpdate")
        return value if isinstance(value, str) else None

    @property
    def acp(self) -> AcpUpdate:
        """The update typed by its kind (decoded with the payload when it came off the wire)."""
        cache = self.__dict__
        typed: AcpUpdate | None = cache.get("acp")
        if typed is None:
            typed = cache["acp"] = update_from_dict(self.update)
        return typed


# Every payload's fields are in the daemon's wire order: the daemon publishes these Structs,
# encoded by msgspec (fields in definition order), and its frames must stay byte for byte what
# they were. A payload whose optional fields the daemon leaves out when absent is
# ``omit_defaults`` (a field it always sends, even at its default, then uses a
# ``default_factory``, which omit_defaults never drops); the others send ``null`` for None.
# UNSET fields are always left out.


class TurnCompleteData(_Payload, frozen=True, kw_only=True):
    session_id: str | None = None
    stop_reason: str = "end_turn"
    prompt_id: str


class TurnErrorData(_Payload, frozen=True, kw_only=True):
    session_id: str | None = None
    message: str = ""
    code: str | None = None
    prompt_id: str
    error_kind: str | msgspec.UnsetType = msgspec.UNSET


class PromptCancelledData(_Payload, frozen=True, omit_defaults=True):
    session_id: str | None = None
    reason: str | None = None


class PendingPromptAddedData(_Payload, frozen=True, kw_only=True):
    session_id: str | None = None
    prompt_id: str
    text: str | None = None
    queued_at: Any = None


class PendingPromptStartedData(_Payload, frozen=True, kw_only=True):
    session_id: str | None = None
    prompt_id: str
    text: str | None = None


class PendingPromptCompletedData(_Payload, frozen=True, kw_only=True):
    session_id: str | None = None
    prompt_id: str
    state: str


class PermissionOption(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """One answer an agent offers for a permission request (ACP ``PermissionOption``)."""

    option_id: str
    name: str | None = None
    kind: str | None = None
    """``allow_once``, ``allow_always``, ``reject_once``, ``reject_always``, or the agent's own."""

    @property
    def label(self) -> str:
        """``name [kind]``; the option id when there is no name."""
        label = self.name if self.name else self.option_id
        return f"{label} [{self.kind}]" if self.kind is not None else label


class PermissionToolCall(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """The parts of a permission request's ``toolCall`` a client shows."""

    tool_call_id: str | None = None
    title: str | None = None
    kind: str | None = None


def _loose(value: Any, cls: type[_S]) -> _S | None:
    try:
        return msgspec.convert(value, cls)
    except msgspec.ValidationError:
        return None


class PermissionRequestData(_Payload, frozen=True):
    """``options`` and ``toolCall`` are kept as the agent sent them (shown and echoed back
    whole); :attr:`answers` and :attr:`tool` are their typed views."""

    request_id: str = ""
    session_id: str | None = None
    tool_call: dict[str, Any] | None = None
    options: list[dict[str, Any]] = msgspec.field(default_factory=list)

    @property
    def answers(self) -> list[PermissionOption]:
        """The options that carry a string ``optionId`` (others cannot be voted for)."""
        return [o for o in (_loose(raw, PermissionOption) for raw in self.options) if o]

    @property
    def tool(self) -> PermissionToolCall:
        typed = None if self.tool_call is None else _loose(self.tool_call, PermissionToolCall)
        return typed if typed is not None else PermissionToolCall()


class PermissionResolvedData(_Payload, frozen=True):
    """``outcome`` is what the agent was answered; ``reason`` (absent for a client's vote)
    says why the daemon answered by itself (``constants.PERMISSION_RESOLVED_REASONS``)."""

    request_id: str
    outcome: Any = None
    reason: str | msgspec.UnsetType = msgspec.UNSET


class SessionClosedData(_Payload, frozen=True):
    session_id: str | None = None
    reason: str | None = None


class SessionDiedData(_Payload, frozen=True):
    session_id: str | None = None
    reason: str | None = None
    exit_code: int | None = None
    signal_code: str | int | None = None


class ReplayCompleteData(_Payload, frozen=True, omit_defaults=True):
    """The ids are left out when nothing was replayed; ``replayedCount`` is always sent."""

    last_replayed_event_id: int | None = None
    last_event_id: int | None = None
    replayed_count: int = msgspec.field(default_factory=int)


class StateResyncRequiredData(_Payload, frozen=True, omit_defaults=True):
    reason: str
    detail: str | None = None
    last_delivered_id: int | None = None
    earliest_available_id: int | None = None


class SlowClientWarningData(_Payload, frozen=True):
    queue_size: int
    max_queued: int
    last_event_id: int | None = None
    queued_bytes: int | None = None
    max_queued_bytes: int | None = None
    threshold: str | None = None


class ClientEvictedData(_Payload, frozen=True):
    reason: str
    dropped_after: int | None = None
    queue_size: int | None = None
    max_queued: int | None = None
    queued_bytes: int | None = None
    max_queued_bytes: int | None = None


class StreamErrorData(_Payload, frozen=True):
    error: str | None = None
    message: str | None = None
    code: str | None = None


class SessionSnapshotData(_Payload, frozen=True):
    session_id: str | None = None


# --- the decoders -----------------------------------------------------------------------------------

KnownEventData: TypeAlias = (
    SessionUpdateData
    | TurnCompleteData
    | TurnErrorData
    | PromptCancelledData
    | PendingPromptAddedData
    | PendingPromptStartedData
    | PendingPromptCompletedData
    | PermissionRequestData
    | PermissionResolvedData
    | SessionClosedData
    | SessionDiedData
    | ReplayCompleteData
    | StateResyncRequiredData
    | SlowClientWarningData
    | ClientEvictedData
    | StreamErrorData
    | SessionSnapshotData
    | DaemonHistoryTruncatedData
)
EventPayload: TypeAlias = KnownEventData

PAYLOAD_TYPES: Final[Mapping[str, type[_Payload]]] = {
    "session_update": SessionUpdateData,
    "turn_complete": TurnCompleteData,
    "turn_error": TurnErrorData,
    "prompt_cancelled": PromptCancelledData,
    "pending_prompt_added": PendingPromptAddedData,
    "pending_prompt_started": PendingPromptStartedData,
    "pending_prompt_completed": PendingPromptCompletedData,
    "permission_request": PermissionRequestData,
    "permission_resolved": PermissionResolvedData,
    "session_closed": SessionClosedData,
    "session_died": SessionDiedData,
    "replay_complete": ReplayCompleteData,
    "state_resync_required": StateResyncRequiredData,
    "slow_client_warning": SlowClientWarningData,
    "client_evicted": ClientEvictedData,
    "stream_error": StreamErrorData,
    "session_snapshot": SessionSnapshotData,
}

KNOWN_EVENT_TYPES: Final = frozenset({*PAYLOAD_TYPES, "history_truncated"})

_EVENT_TYPE_OF: Final[Mapping[type, str]] = {
    **{cls: kind for kind, cls in PAYLOAD_TYPES.items()},
    DaemonHistoryTruncatedData: "history_truncated",
}


def event_type_of(payload: EventPayload) -> str:
    """The event ``type`` a payload Struct is published as (``TurnCompleteData`` →
    ``turn_complete``)."""
    return _EVENT_TYPE_OF[type(payload)]
