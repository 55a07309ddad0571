"""Every event payload the daemon emits and clients read, as frozen msgspec Structs.

Wire names are camelCase (``rename="camel"``). Unknown keys are ignored by the Structs and kept
in :attr:`~sdk.protocol.envelope.DaemonEvent.data`, which is always the complete payload.

:func:`decode_payload` picks one decoder by the envelope's ``type`` and decodes the frame's raw
``data`` bytes straight into its Struct. A ``session_update``'s ACP update is a tagged union on
its ``sessionUpdate`` field (:data:`AcpUpdate`); kinds without a Struct here — or an update
whose typed fields do not fit — pass through as :class:`RawUpdate`. An unknown event type, or a
payload that does not fit its Struct, has no typed payload (``None``): the frame is kept and
counted (:class:`UnknownEventCounter`), never raised.

``history_truncated`` follows its own stricter rules (:class:`DaemonHistoryTruncatedData`):
counts written as ``3.0`` are 3, booleans are not numbers, a non-string ``recordId`` is absent,
a ``null`` or empty ``scope`` is malformed; ``msgspec.convert(payload,
DaemonHistoryTruncatedData)`` applies them to a wire payload directly.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final, Literal, TypeAlias, TypeVar

import msgspec

from sdk.protocol.constants import LIVE_JOURNAL_SCOPE, RECORD_ID_META_KEY, REPLAY_WINDOW_EXCEEDED

__all__ = [
    "KNOWN_EVENT_TYPES",
    "PAYLOAD_TYPES",
    "AcpUpdate",
    "AgentMessageChunk",
    "AgentThoughtChunk",
    "AvailableCommandsUpdate",
    "ClientEvictedData",
    "ContentChunk",
    "CurrentModeUpdate",
    "DaemonHistoryTruncatedData",
    "EventPayload",
    "KnownEventData",
    "PendingPromptAddedData",
    "PendingPromptCompletedData",
    "PendingPromptStartedData",
    "PermissionOption",
    "PermissionRequestData",
    "PermissionResolvedData",
    "PermissionToolCall",
    "Plan",
    "PromptCancelledData",
    "QwenTranscript",
    "RawUpdate",
    "ReplayCompleteData",
    "SessionClosedData",
    "SessionDiedData",
    "SessionSnapshotData",
    "SessionUpdateData",
    "SlowClientWarningData",
    "StateResyncRequiredData",
    "StreamErrorData",
    "ToolCall",
    "ToolCallUpdate",
    "TurnCompleteData",
    "TurnErrorData",
    "UpdateMeta",
    "UserMessageChunk",
    "decode_payload",
    "event_type_of",
    "finite_number",
    "payload_from_data",
]


def finite_number(value: object) -> float | None:
    """``value`` as a float when it is a finite JSON number (booleans are not numbers)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


_S = TypeVar("_S", bound=msgspec.Struct)


# --- the ACP update inside session_update ---------------------------------------------------------


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


_TypedUpdate: TypeAlias = (
    UserMessageChunk
    | AgentMessageChunk
    | AgentThoughtChunk
    | ToolCall
    | ToolCallUpdate
    | Plan
    | AvailableCommandsUpdate
    | CurrentModeUpdate
)
AcpUpdate: TypeAlias = _TypedUpdate | RawUpdate



class _TypedSessionUpdate(msgspec.Struct, gc=False):
    # A Struct around the union: msgspec caches a Struct's type info, not a bare union's
    # (converting to the union itself re-examined it on every call, ~25 us).
    update: _TypedUpdate


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
_UPDATE_BY_KIND: Final[Mapping[str, type[_TypedUpdate]]] = {
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


def _update_from_dict(update: dict[str, Any]) -> AcpUpdate:
    kind = update.get("sessionUpdate")
    cls = _UPDATE_BY_KIND.get(kind) if isinstance(kind, str) else None
    if cls is None:
        return _raw_update(update)
    try:
        typed: _TypedUpdate = msgspec.convert(update, cls)
    except msgspec.ValidationError:
        return _raw_update(update)
    return typed


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
            typed = cache["acp"] = _update_from_dict(self.update)
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


# --- history_truncated ----------------------------------------------------------------------------

if TYPE_CHECKING:
    _Count: TypeAlias = int
    _OptionalCount: TypeAlias = int | None
    _Scope: TypeAlias = str | None
    _LooseStr: TypeAlias = str | None
else:
    # What msgspec checks on the wire; __post_init__ narrows to the declared types above.
    _Count = int | float
    # The optional fields default to None but do not accept ``null``: a null scope or count
    # is malformed, an absent one is None (and, encoded, None is left out again).
    _OptionalCount = int | float
    _Scope = str
    _LooseStr = Any

_MARKER_KEYS: Final = frozenset(
    {
        "reason",
        "scope",
        "truncatedEvents",
        "retainedEvents",
        "maxBytes",
        "maxEvents",
        "truncatedTurns",
        "recordId",
        "fullTranscriptAvailable",
    }
)


def _count(name: str, value: object, *, optional: bool) -> int | None:
    if value is None and optional:
        return None
    if isinstance(value, bool):
        raise ValueError(f"history_truncated {name} must be an integer >= 0")
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or value < 0:
        raise ValueError(f"history_truncated {name} must be an integer >= 0")
    return value


class DaemonHistoryTruncatedData(
    msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True
):
    """A validated ``history_truncated`` payload (counts are plain ``int``).

    Decodes straight from the wire (``msgspec.convert(payload, DaemonHistoryTruncatedData)``,
    a ``ValidationError`` when malformed) with the rules of the module docstring; direct
    construction enforces the same invariants and raises ``ValueError``. ``extra`` holds the
    keys this type does not name (:func:`sdk._truncation.parse_truncation` fills it).

    The daemon builds its markers from this type; encoded, the fields are in the wire order
    and the ones that are None (or an empty ``extra``) are left out.
    """

    reason: Literal["replay_window_exceeded"]
    scope: _Scope = None
    truncated_events: _Count
    retained_events: _Count
    max_bytes: _Count
    max_events: _OptionalCount = None
    truncated_turns: _OptionalCount = None
    record_id: _LooseStr = None
    full_transcript_available: bool
    extra: dict[str, Any] = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.reason != REPLAY_WINDOW_EXCEEDED:
            raise ValueError(f"history_truncated reason must be {REPLAY_WINDOW_EXCEEDED!r}")
        force = msgspec.structs.force_setattr
        scope: object = self.scope
        if scope is not None and (not isinstance(scope, str) or not scope):
            raise ValueError("history_truncated scope must be a non-empty string when present")
        for name in ("truncated_events", "retained_events", "max_bytes"):
            force(self, name, _count(name, getattr(self, name), optional=False))
        for name in ("max_events", "truncated_turns"):
            force(self, name, _count(name, getattr(self, name), optional=True))
        if not isinstance(self.full_transcript_available, bool):
            raise ValueError("history_truncated fullTranscriptAvailable must be a boolean")
        if not isinstance(self.record_id, str):
            force(self, "record_id", None)

    @property
    def is_live(self) -> bool:
        """True for the live-turn marker (``scope == "live_journal"``)."""
        return self.scope == LIVE_JOURNAL_SCOPE

    @property
    def is_recoverable_live(self) -> bool:
        """A live-turn marker whose complete turn the transcript promises to hold."""
        return self.is_live and self.full_transcript_available


def parse_truncation(data: Any) -> DaemonHistoryTruncatedData | None:
    """Validate a ``history_truncated`` payload; ``None`` when malformed (never raises).

    Keys the type does not name are kept in ``extra`` (and never make a payload malformed).
    """
    if not isinstance(data, dict):
        return None
    known = {k: v for k, v in data.items() if k in _MARKER_KEYS}
    try:
        marker = msgspec.convert(known, DaemonHistoryTruncatedData)
    except msgspec.ValidationError:
        return None
    extra = {k: v for k, v in data.items() if k not in _MARKER_KEYS}
    if extra:
        msgspec.structs.force_setattr(marker, "extra", extra)
    return marker


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

_FRAME_DECODERS: Final[Mapping[str, msgspec.json.Decoder[Any]]] = {
    kind: msgspec.json.Decoder(
        msgspec.defstruct(f"_{cls.__name__}Frame", [("data", cls | None, None)], gc=False)
    )
    for kind, cls in PAYLOAD_TYPES.items()
}


# Frame decoders: each reads a whole frame's bytes and types only its ``data`` (msgspec skips
# the envelope's other fields without building them).


class _SessionUpdateFrame(msgspec.Struct, gc=False):
    # The common case in one pass: data = {sessionId, update} with an update of a typed kind.
    data: _TypedSessionUpdate


class _PageShapeFrame(msgspec.Struct, gc=False):
    # The reference daemon's transcript pages: data is the update itself.
    data: _TypedUpdate


_session_update_frame: Final = msgspec.json.Decoder(_SessionUpdateFrame)
_page_shape_frame: Final = msgspec.json.Decoder(_PageShapeFrame)


def _session_update(data: Any, typed: AcpUpdate | None) -> SessionUpdateData | None:
    if not isinstance(data, dict):
        return None
    update = data.get("update")
    if not isinstance(update, dict):
        if "update" in data or not isinstance(data.get("sessionUpdate"), str):
            return None
        update = data  # the reference daemon's page shape: data is the update itself
    sid = data.get("sessionId")
    payload = SessionUpdateData(update=update, session_id=sid if isinstance(sid, str) else None)
    payload.__dict__["acp"] = typed if typed is not None else _update_from_dict(update)
    return payload


Frame: TypeAlias = bytes | bytearray | memoryview | msgspec.Raw | str
"""One frame's JSON, as the decoders accept it."""


def decode_payload(event_type: str, frame: Frame, data: Any) -> EventPayload | None:
    """The typed payload of a frame, decoded from the frame's bytes by its type's decoder
    (``data`` = the same payload as plain values, already decoded with the envelope).
    ``None`` when there is none."""
    if event_type == "session_update":
        typed: AcpUpdate | None = None
        try:
            if isinstance(data, dict) and "update" not in data:
                typed = _page_shape_frame.decode(frame).data
            else:
                typed = _session_update_frame.decode(frame).data.update
        except msgspec.ValidationError:
            typed = None  # an untyped kind, or typed fields that do not fit: kept raw
        return _session_update(data, typed)
    if event_type == "history_truncated":
        return parse_truncation(data)
    decoder = _FRAME_DECODERS.get(event_type)
    if decoder is None:
        return None
    try:
        payload: EventPayload | None = decoder.decode(frame).data
    except msgspec.ValidationError:
        return None
    return payload


def payload_from_data(event_type: str, data: Any) -> EventPayload | None:
    """The typed payload of a frame built in code (``data`` as plain values)."""
    if event_type == "session_update":
        return _session_update(data, None)
    if event_type == "history_truncated":
        return parse_truncation(data)
    payload_type = PAYLOAD_TYPES.get(event_type)
    if payload_type is None or not isinstance(data, dict):
        return None
    try:
        payload: EventPayload = msgspec.convert(data, payload_type)  # type: ignore[assignment]
    except msgspec.ValidationError:
        return None
    return payload
