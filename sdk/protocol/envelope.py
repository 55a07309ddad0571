"""The event envelope: its Struct, the frame validity rules, and its one encoding.

Every frame — SSE, WebSocket, load answers, transcript pages — is one JSON object::

    {"id": 3, "v": 1, "type": "session_update", "data": {...}, "promptId": "...",
     "originatorClientId": "...", "_meta": {"serverTimestamp": 1796204622728}}

:class:`DaemonEvent` is the one definition of that object: its fields are in wire order, and
encoding one gives the daemon's bytes (``id``, ``promptId``, ``originatorClientId`` and
``_meta`` left out when absent; ``v``, ``type`` and ``data`` always there, ``data`` as
``null`` when there is none). Everything else that writes an envelope derives from it:
:func:`envelope_fields` (the daemon's envelope as a dict, for its journals),
:func:`envelope_template` (the bytes around the holes a writer fills in later: the daemon
splices agent updates into these without encoding them again).

Decoding: one :class:`msgspec.json.Decoder` reads the frame's envelope fields typed and ``data``
as plain values (the payload as sent, unknown keys included, because a client must keep frames
it does not understand whole); a frame whose envelope fields have other JSON types is read into
plain values and checked field by field, with the same result. The typed payload (:attr:`DaemonEvent.payload`) is
decoded from the frame's bytes by the decoder of the frame's ``type`` (see
:mod:`sdk.protocol.events`), on first use — never converted from the already-built dict, and
never at all for a consumer that does not look at it. (Not a first decoder with ``data`` as
:class:`msgspec.Raw` and then a plain decode of ``data``: that scans the payload bytes twice
before any typed decode.)

Validity (both sides apply the same rules): a JSON object, ``v == 1`` (``true`` is not 1), a
string ``type``, and, when the ``id`` key is present, an integer in 1..2^53−1 (``7.0`` is 7).
Other envelope fields of the wrong JSON type are treated as absent. A frame failing the rules is
not an event: decoders answer ``None`` and the caller skips it.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Any, Final

import msgspec

from sdk.protocol.constants import ENVELOPE_VERSION, MAX_EVENT_ID
from sdk.protocol.events import (
    EventPayload,
    SessionUpdateData,
    decode_payload,
    finite_number,
    payload_from_data,
)

__all__ = [
    "HOLE",
    "DaemonEvent",
    "UnknownEventCounter",
    "decode_event",
    "decode_events",
    "encode_envelope",
    "envelope_fields",
    "envelope_template",
    "event_from_mapping",
    "event_prompt_id",
    "names_prompt",
    "normalize_page_event",
    "read_payload",
    "record_ids_of",
    "server_timestamp",
    "typed_data",
    "valid_event_id",
]


def _version() -> int:
    return ENVELOPE_VERSION


def _no_data() -> Any:
    return None


class DaemonEvent(msgspec.Struct, kw_only=True, omit_defaults=True, dict=True):
    """One frame from the daemon: SSE, WebSocket, load snapshot or transcript page.

    ``data`` is the payload as plain JSON values (the complete daemon payload, unknown keys
    included); :attr:`payload` is the same payload as its typed Struct.

    The members are the envelope's, in wire order: ``v``, ``type`` and ``data`` always,
    the others only when present.
    """

    # v and data default through a default_factory, which omit_defaults never drops: they are
    # always encoded; the members that default to None are left out when absent.
    id: int | None = None
    v: int = msgspec.field(default_factory=_version)
    type: str
    data: Any = msgspec.field(default_factory=_no_data)
    prompt_id: str | None = msgspec.field(default=None, name="promptId")
    originator_client_id: str | None = msgspec.field(default=None, name="originatorClientId")
    meta: dict[str, Any] | None = msgspec.field(default=None, name="_meta")

    @property
    def payload(self) -> EventPayload | None:
        """The payload as its typed Struct (:mod:`sdk.protocol.events`); ``None`` for an
        unknown type or a payload that does not fit. Never raises.

        A decoded frame decodes it from the frame's raw bytes (once, on first use); a frame
        built in code converts ``data``. The result is kept (a plain dict slot, not
        ``functools.cached_property``, whose lock costs more than the decode on Python 3.11).
        """
        cache = self.__dict__
        if "_payload" in cache:
            payload: EventPayload | None = cache["_payload"]
            return payload
        raw = cache.pop("_raw_frame", None)
        if raw is not None:
            payload = decode_payload(self.type, raw, self.data)
        else:
            payload = payload_from_data(self.type, self.data)
        cache["_payload"] = payload
        return payload


def read_payload(event: DaemonEvent) -> EventPayload | None:
    """The typed payload, as :attr:`DaemonEvent.payload` gives it, without keeping it.

    For a reader that looks at each of many events once (a snapshot replay of 200,000
    events): keeping a typed copy of every payload on its event costs more than the decode,
    because the collector has to scan each kept copy again and again. A payload already kept
    is returned; a decoded frame keeps its raw bytes for later reads.
    """
    kept: Any = getattr(event, "_payload", _MISSING)
    if kept is not _MISSING:
        payload: EventPayload | None = kept
        return payload
    raw = getattr(event, "_raw_frame", None)
    if raw is not None:
        payload = decode_payload(event.type, raw, event.data)
    else:
        payload = payload_from_data(event.type, event.data)
    return payload


class _Missing:
    __slots__ = ()


_MISSING: Final = _Missing()


def typed_data(event: DaemonEvent) -> EventPayload | None:
    """The payload as its typed Struct (:attr:`DaemonEvent.payload`); ``None`` for an unknown
    type or a payload that does not fit. Never raises."""
    return event.payload


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


def names_prompt(event: DaemonEvent, prompt_id: str) -> bool:
    """The event names ``prompt_id`` in its envelope ``promptId`` or in ``data.promptId``."""
    if event.prompt_id == prompt_id:
        return True
    data = event.data
    return isinstance(data, dict) and data.get("promptId") == prompt_id


def valid_event_id(value: object) -> int | None:
    """``value`` as an event id (an integer in 1..2^53−1, ``7.0`` counting as 7), else None.

    JSON has one number type (a JavaScript daemon may write ``7.0``); booleans are never ids.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        ident = value
    elif isinstance(value, float) and value.is_integer():
        ident = int(value)
    else:
        return None
    return ident if 1 <= ident <= MAX_EVENT_ID else None


_json_decoder: Final = msgspec.json.Decoder()


def _validated(
    ident: object, version: object, kind: object, prompt_id: object, originator: object,
    meta: object, *, has_id: bool,
) -> DaemonEvent | None:
    if isinstance(version, bool) or not isinstance(version, int | float) or version != 1:
        return None
    if not isinstance(kind, str):
        return None
    event_id: int | None = None
    if has_id:
        event_id = valid_event_id(ident)
        if event_id is None:
            return None
    return DaemonEvent(
        id=event_id,
        v=ENVELOPE_VERSION,
        type=kind,
        data=None,
        prompt_id=prompt_id if isinstance(prompt_id, str) else None,
        originator_client_id=originator if isinstance(originator, str) else None,
        meta=meta if isinstance(meta, dict) else None,
    )


def event_from_mapping(obj: Any) -> DaemonEvent | None:
    """An envelope from an already-parsed JSON value; ``None`` if it is not a valid frame."""
    if not isinstance(obj, dict):
        return None
    event = _validated(
        obj.get("id"), obj.get("v"), obj.get("type"), obj.get("promptId"),
        obj.get("originatorClientId"), obj.get("_meta"), has_id="id" in obj,
    )
    if event is not None:
        event.data = obj.get("data")
    return event


class _WireFrame(msgspec.Struct, gc=False):
    # The envelope as the common, well-formed frame has it: one typed pass builds no dict for
    # the envelope itself. Any field of another JSON type (``v: true``, ``id: null``, a numeric
    # ``promptId``, a non-object frame) fails this type and the frame takes the general path,
    # which applies the rules field by field.
    type: str
    v: int | float
    id: int | float | msgspec.UnsetType = msgspec.UNSET
    data: Any = None
    prompt_id: str | None = msgspec.field(default=None, name="promptId")
    originator_client_id: str | None = msgspec.field(default=None, name="originatorClientId")
    meta: dict[str, Any] | None = msgspec.field(default=None, name="_meta")


_wire_frame: Final = msgspec.json.Decoder(_WireFrame).decode


def decode_event(
    raw: bytes | bytearray | memoryview | msgspec.Raw | str | dict[str, Any],
) -> DaemonEvent | None:
    """Decode one frame (JSON text or an already-parsed object); ``None`` if it must be skipped."""
    if isinstance(raw, dict):
        return event_from_mapping(raw)
    try:
        frame = _wire_frame(raw)
    except msgspec.ValidationError:
        return _decode_general(raw)
    except (msgspec.DecodeError, UnicodeDecodeError):
        return None
    if frame.v != 1:
        return None
    ident = frame.id
    event_id: int | None
    if type(ident) is int and 1 <= ident <= MAX_EVENT_ID:
        event_id = ident  # the common case of valid_event_id, inlined
    elif ident is msgspec.UNSET:
        event_id = None
    else:
        event_id = valid_event_id(ident)
        if event_id is None:
            return None
    event = DaemonEvent(
        id=event_id, v=ENVELOPE_VERSION, type=frame.type, data=frame.data,
        prompt_id=frame.prompt_id, originator_client_id=frame.originator_client_id,
        meta=frame.meta,
    )
    event.__dict__["_raw_frame"] = raw
    return event


def _decode_general(raw: bytes | bytearray | memoryview | msgspec.Raw | str) -> DaemonEvent | None:
    try:
        obj = _json_decoder.decode(raw)
    except (msgspec.DecodeError, UnicodeDecodeError):
        return None
    event = event_from_mapping(obj)
    if event is not None:
        event.__dict__["_raw_frame"] = raw
    return event


def decode_events(items: Iterable[Any]) -> list[DaemonEvent]:
    """Decode a list of frames (parsed objects or raw JSON bytes), dropping the invalid ones."""
    out: list[DaemonEvent] = []
    for item in items:
        event = (
            decode_event(item)
            if isinstance(item, bytes | bytearray | memoryview | msgspec.Raw)
            else event_from_mapping(item)
        )
        if event is not None:
            out.append(event)
    return out


# --- encoding ------------------------------------------------------------------------------------

_encode: Final = msgspec.json.Encoder().encode

# The envelope's wire names, in wire order, as the Struct defines them.
_ID, _V, _TYPE, _DATA, _PROMPT_ID, _ORIGINATOR, _META = DaemonEvent.__struct_encode_fields__


def envelope_fields(event_type: str, data: Any, *, event_id: int | None = None,
                    prompt_id: str | None = None, originator_client_id: str | None = None,
                    meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """One envelope as a dict: the members :class:`DaemonEvent` encodes, in its order, absent
    ones left out (the daemon keeps its envelopes as dicts for its journals). Encoded, it is
    :func:`encode_envelope`'s bytes (``tests/protocol/test_wire_contract.py`` holds the two together)."""
    env: dict[str, Any] = {}
    if event_id is not None:
        env[_ID] = event_id
    env[_V] = ENVELOPE_VERSION
    env[_TYPE] = event_type
    env[_DATA] = data
    if prompt_id is not None:
        env[_PROMPT_ID] = prompt_id
    if originator_client_id is not None:
        env[_ORIGINATOR] = originator_client_id
    if meta is not None:
        env[_META] = meta
    return env


def encode_envelope(
    event_type: str,
    data: Any,
    *,
    event_id: int | None = None,
    prompt_id: str | None = None,
    originator_client_id: str | None = None,
    meta: dict[str, Any] | None = None,
) -> bytes:
    """The compact JSON of one envelope: a :class:`DaemonEvent` encoded.

    ``data`` may be a payload Struct (encoded with its wire names, fields in definition order)
    or plain JSON values. The result is what the daemon publishes and what its size limits
    count.
    """
    return _encode(DaemonEvent(
        id=event_id, v=ENVELOPE_VERSION, type=event_type, data=data, prompt_id=prompt_id,
        originator_client_id=originator_client_id, meta=meta))


#: A hole in an envelope template (:func:`envelope_template`): put it where a value is filled
#: in later. Its byte, a raw NUL, never appears in msgspec's JSON otherwise (strings escape it).
HOLE: Final[Any] = msgspec.Raw(b"\x00")
_HOLE_BYTE: Final = b"\x00"


def envelope_template(event_type: str, data: Any, *, prompt_id: str | None = None,
                      originator_client_id: str | None = None,
                      meta: dict[str, Any] | None = None) -> list[bytes]:
    """The bytes of an envelope with an id, cut at its holes: the id's place, then each
    :data:`HOLE` in ``data`` (or ``meta``) in encoding order. Joining the pieces with the
    values' JSON in between gives :func:`encode_envelope`'s bytes for those values, so a
    writer that fills the holes (the daemon's splicer: an event id and an agent's update)
    never encodes the rest again."""
    return _encode(DaemonEvent(
        id=HOLE, v=ENVELOPE_VERSION, type=event_type, data=data, prompt_id=prompt_id,
        originator_client_id=originator_client_id, meta=meta)).split(_HOLE_BYTE)


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


def record_ids_of(event: DaemonEvent) -> tuple[str, ...]:
    """The transcript record ids of a ``session_update`` (``payload.acp.record_ids``), else ().

    The same answer as reading the typed payload, but an update without a ``_meta`` object —
    which can carry no record id — answers ``()`` without typing the payload, so a scan for
    the first stamped event over a long replay does not type every event twice.
    """
    if event.type != "session_update":
        return ()
    data = event.data
    if isinstance(data, dict) and getattr(event, "_payload", None) is None:
        update = data.get("update")
        if not isinstance(update, dict):
            if "update" in data or not isinstance(data.get("sessionUpdate"), str):
                return ()
            update = data  # the page shape: data is the update itself
        if not isinstance(update.get("_meta"), dict):
            return ()
    payload = read_payload(event)
    return payload.acp.record_ids if isinstance(payload, SessionUpdateData) else ()


def server_timestamp(event: DaemonEvent) -> float | None:
    """The envelope's ``_meta.serverTimestamp`` when it is a finite number."""
    meta = event.meta
    if meta is None:
        return None
    value = meta.get("serverTimestamp")
    if type(value) is int:  # the daemon's own stamps: epoch milliseconds
        return float(value)
    return finite_number(value)


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

    def observe(self, event: DaemonEvent) -> EventPayload | None:
        """Return the typed payload, or count and keep the frame when there is none."""
        typed = event.payload
        if typed is None:
            self.record(event)
        return typed

    def record(self, event: DaemonEvent) -> None:
        self.total += 1
        self.by_type[event.type] = self.by_type.get(event.type, 0) + 1
        self.recent.append(event)
