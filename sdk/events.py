"""Typed daemon events (CLIENT-SPEC §1).

CORE CONTRACT (the WebUI model depends on these names; the SDK work extends this module):

    class DaemonEvent(msgspec.Struct):      # the envelope, wire names via renames
        id: int | None = None
        v: int = 1
        type: str = ""
        data: Any = None                    # the raw JSON payload (dict for every known type)
        prompt_id: str | None = None        # wire "promptId"
        originator_client_id: str | None = None   # wire "originatorClientId"
        meta: dict[str, Any] | None = None  # wire "_meta"

    def event_prompt_id(event) -> str | None   # envelope promptId, else data.promptId

Around that core: :func:`decode_event` (the frame-validity rules every decoder shares),
typed payload Structs for the known types with :func:`typed_data` (``None`` for an unknown type
or a payload that does not fit, never an exception), :class:`UnknownEventCounter` (unknown or
malformed frames are counted and kept, never raised) and :func:`normalize_page_event` (the two
transcript-page shapes). Pure: no I/O.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any, Final, TypeAlias

import msgspec

from sdk.truncation import DaemonHistoryTruncatedData, parse_truncation


class DaemonEvent(msgspec.Struct, omit_defaults=True):
    """One frame from the daemon: SSE, load snapshot or transcript page."""

    type: str
    v: int = 1
    id: int | None = None
    data: Any = None
    prompt_id: str | None = msgspec.field(default=None, name="promptId")
    originator_client_id: str | None = msgspec.field(default=None, name="originatorClientId")
    meta: dict[str, Any] | None = msgspec.field(default=None, name="_meta")


def event_prompt_id(event: DaemonEvent) -> str | None:
    """The prompt an event belongs to: the envelope ``promptId``, else ``data.promptId``."""
    if isinstance(event.prompt_id, str) and event.prompt_id:
        return event.prompt_id
    data = event.data
    if isinstance(data, dict):
        pid = data.get("promptId")
        if isinstance(pid, str) and pid:
            return pid
    return None


# --- decoding ---------------------------------------------------------------------------------

MAX_EVENT_ID: Final = 2**53 - 1

_json_decode = msgspec.json.Decoder().decode


def _valid_id(value: object) -> int | None:
    # JSON has one number type (a JS daemon may write 7.0); booleans are never ids.
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        ident = value
    elif isinstance(value, float) and value.is_integer():
        ident = int(value)
    else:
        return None
    return ident if 1 <= ident <= MAX_EVENT_ID else None


def event_from_mapping(obj: Any) -> DaemonEvent | None:
    """Build an envelope from an already-parsed JSON value; ``None`` if it is not a valid frame.

    Valid = a JSON object, ``v == 1`` (not ``true``), a string ``type`` and, when the ``id`` key
    is present, an integer in 1..2^53−1. Other envelope fields of the wrong JSON type are
    treated as absent rather than rejecting the frame.
    """
    if not isinstance(obj, dict):
        return None
    version = obj.get("v")
    if isinstance(version, bool) or not isinstance(version, int | float) or version != 1:
        return None
    kind = obj.get("type")
    if not isinstance(kind, str):
        return None
    ident: int | None = None
    if "id" in obj:
        ident = _valid_id(obj["id"])
        if ident is None:
            return None
    prompt_id = obj.get("promptId")
    originator = obj.get("originatorClientId")
    meta = obj.get("_meta")
    return DaemonEvent(
        type=kind,
        v=1,
        id=ident,
        data=obj.get("data"),
        prompt_id=prompt_id if isinstance(prompt_id, str) else None,
        originator_client_id=originator if isinstance(originator, str) else None,
        meta=meta if isinstance(meta, dict) else None,
    )


def decode_event(raw: bytes | bytearray | memoryview | str | dict[str, Any]) -> DaemonEvent | None:
    """Decode one frame (JSON text or an already-parsed object); ``None`` if it must be skipped."""
    if isinstance(raw, dict):
        return event_from_mapping(raw)
    try:
        obj = _json_decode(raw)
    except (msgspec.DecodeError, UnicodeDecodeError):
        return None
    return event_from_mapping(obj)


def decode_events(items: Iterable[Any]) -> list[DaemonEvent]:
    """Decode a list of parsed frames (a load snapshot), dropping the invalid ones."""
    out: list[DaemonEvent] = []
    for item in items:
        event = event_from_mapping(item)
        if event is not None:
            out.append(event)
    return out


# --- typed payloads ---------------------------------------------------------------------------


class _Payload(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """Base of typed payloads: wire names are camelCase, unknown keys are ignored."""


class SessionUpdateData(_Payload, frozen=True):
    update: dict[str, Any]
    session_id: str | None = None

    @property
    def kind(self) -> str | None:
        """The ACP ``sessionUpdate`` discriminator (``agent_message_chunk`` …)."""
        value = self.update.get("sessionUpdate")
        return value if isinstance(value, str) else None


class TurnCompleteData(_Payload, frozen=True):
    prompt_id: str
    stop_reason: str = "end_turn"
    session_id: str | None = None


class TurnErrorData(_Payload, frozen=True):
    prompt_id: str
    message: str = ""
    code: str | None = None
    error_kind: str | None = None
    session_id: str | None = None


class PromptCancelledData(_Payload, frozen=True):
    session_id: str | None = None
    reason: str | None = None


class PendingPromptAddedData(_Payload, frozen=True):
    prompt_id: str
    text: str | None = None
    queued_at: Any = None
    session_id: str | None = None


class PendingPromptStartedData(_Payload, frozen=True):
    prompt_id: str
    text: str | None = None
    session_id: str | None = None


class PendingPromptCompletedData(_Payload, frozen=True):
    prompt_id: str
    state: str
    session_id: str | None = None


class PermissionRequestData(_Payload, frozen=True):
    request_id: str
    options: list[dict[str, Any]] = msgspec.field(default_factory=list)
    tool_call: dict[str, Any] | None = None
    session_id: str | None = None


class PermissionResolvedData(_Payload, frozen=True):
    request_id: str
    outcome: Any = None


class SessionClosedData(_Payload, frozen=True):
    session_id: str | None = None
    reason: str | None = None


class SessionDiedData(_Payload, frozen=True):
    session_id: str | None = None
    reason: str | None = None
    exit_code: int | None = None
    signal_code: str | int | None = None


class ReplayCompleteData(_Payload, frozen=True):
    replayed_count: int = 0
    last_replayed_event_id: int | None = None
    last_event_id: int | None = None


class StateResyncRequiredData(_Payload, frozen=True):
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

TERMINAL_TYPES: Final = frozenset({"turn_complete", "turn_error"})


def typed_data(event: DaemonEvent) -> KnownEventData | None:
    """The payload as its typed Struct; ``None`` for an unknown type or a payload that does not
    fit (wrong shape, wrong field types). Never raises."""
    if event.type == "history_truncated":
        return parse_truncation(event.data)
    payload_type = PAYLOAD_TYPES.get(event.type)
    if payload_type is None or not isinstance(event.data, dict):
        return None
    try:
        result: KnownEventData = msgspec.convert(event.data, payload_type)  # type: ignore[assignment]
    except msgspec.ValidationError:
        return None
    return result


class UnknownEventCounter:
    """Counts frames the client cannot interpret (unknown type or malformed payload).

    A new event type must never crash a client, so such frames are counted per type and the
    most recent ``keep`` of them are kept whole for diagnostics.
    """

    def __init__(self, keep: int = 64) -> None:
        if keep < 0:
            raise ValueError(f"keep must be >= 0, got {keep}")
        self.total = 0
        self.by_type: dict[str, int] = {}
        self.recent: deque[DaemonEvent] = deque(maxlen=keep)

    def observe(self, event: DaemonEvent) -> KnownEventData | None:
        """Return the typed payload, or count and keep the frame when there is none."""
        typed = typed_data(event)
        if typed is None:
            self.record(event)
        return typed

    def record(self, event: DaemonEvent) -> None:
        self.total += 1
        self.by_type[event.type] = self.by_type.get(event.type, 0) + 1
        self.recent.append(event)


# --- transcript pages ---------------------------------------------------------------------------


def normalize_page_event(obj: Any, session_id: str | None = None) -> DaemonEvent | None:
    """A transcript-page event in the bus shape (``data = {sessionId, update}``).

    The reference daemon puts the ACP update itself in ``data``; such a ``session_update`` is
    wrapped. ``obj`` is a parsed frame or a :class:`DaemonEvent`; invalid frames give ``None``.
    """
    event = obj if isinstance(obj, DaemonEvent) else event_from_mapping(obj)
    if event is None or event.type != "session_update":
        return event
    data = event.data
    if not isinstance(data, dict) or "update" in data or "sessionUpdate" not in data:
        return event
    wrapped: dict[str, Any] = {"update": data}
    sid = session_id if session_id is not None else data.get("sessionId")
    if isinstance(sid, str):
        wrapped = {"sessionId": sid, "update": data}
    return msgspec.structs.replace(event, data=wrapped)
