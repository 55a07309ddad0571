"""The event envelope: its Struct, the frame validity rules, and its one encoding.

Every frame — SSE, WebSocket, load answers, transcript pages — is one JSON object::

    {"id": 3, "v": 1, "type": "session_update", "data": {...}, "promptId": "...",
     "originatorClientId": "...", "_meta": {"serverTimestamp": 1796204622728}}

Decoding: one :class:`msgspec.json.Decoder` reads the frame's envelope fields typed and ``data``
as plain values (the payload as sent, unknown keys included, because a client must keep frames
it does not understand whole); a frame whose envelope fields have other JSON types is read into
plain values and checked field by field, with the same result. The typed payload (:attr:`DaemonEvent.payload`) is
decoded from the frame's bytes by the decoder of the frame's ``type`` (see
:mod:`sdk.protocol.events`), on first use — never converted from the already-built dict, and
never at all for a consumer that does not look at it. (A first decoder with ``data`` as
:class:`msgspec.Raw` followed by a plain decode of ``data`` measured slower on the SSE path:
it scans the payload bytes twice before any typed decode.)

Validity (both sides apply the same rules): a JSON object, ``v == 1`` (``true`` is not 1), a
string ``type``, and, when the ``id`` key is present, an integer in 1..2^53−1 (``7.0`` is 7).
Other envelope fields of the wrong JSON type are treated as absent. A frame failing the rules is
not an event: decoders answer ``None`` and the caller skips it.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from types import ModuleType
from typing import TYPE_CHECKING, Any, Final

import msgspec

from sdk.protocol.constants import ENVELOPE_VERSION, MAX_EVENT_ID

if TYPE_CHECKING:
    from sdk.protocol.events import EventPayload

__all__ = [
    "DaemonEvent",
    "decode_event",
    "decode_events",
    "encode_envelope",
    "envelope_fields",
    "event_from_mapping",
    "event_prompt_id",
    "names_prompt",
    "normalize_page_event",
    "read_payload",
    "valid_event_id",
]


class DaemonEvent(msgspec.Struct, omit_defaults=True, dict=True):
    """One frame from the daemon: SSE, WebSocket, load snapshot or transcript page.

    ``data`` is the payload as plain JSON values (the complete daemon payload, unknown keys
    included); :attr:`payload` is the same payload as its typed Struct.
    """

    type: str
    v: int = ENVELOPE_VERSION
    id: int | None = None
    data: Any = None
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
        codec = _CODEC or _load_codec()
        raw = cache.pop("_raw_frame", None)
        if raw is not None:
            payload = codec.decode_payload(self.type, raw, self.data)
        else:
            payload = codec.payload_from_data(self.type, self.data)
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
    codec = _CODEC or _load_codec()
    raw = getattr(event, "_raw_frame", None)
    if raw is not None:
        payload = codec.decode_payload(event.type, raw, event.data)
    else:
        payload = codec.payload_from_data(event.type, event.data)
    return payload


class _Missing:
    __slots__ = ()


_MISSING: Final = _Missing()


# sdk.protocol.events imports this module, so it is looked up on first use (and kept here, so
# the hot paths pay one global read, not a call).
_CODEC: ModuleType | None = None


def _load_codec() -> ModuleType:
    global _CODEC
    _CODEC = importlib.import_module("sdk.protocol.events")
    return _CODEC


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
        type=kind,
        v=ENVELOPE_VERSION,
        id=event_id,
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
        frame.type, ENVELOPE_VERSION, event_id, frame.data, frame.prompt_id,
        frame.originator_client_id, frame.meta,
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


def envelope_fields(event_type: str, data: Any, *, event_id: int | None = None,
                    prompt_id: str | None = None, originator_client_id: str | None = None,
                    meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """One envelope as a dict, keys in the daemon's order (``id``, ``v``, ``type``, ``data``,
    ``promptId``, ``originatorClientId``, ``_meta``), absent ones left out: the one definition
    of the envelope's layout, which :func:`encode_envelope` encodes."""
    env: dict[str, Any] = {}
    if event_id is not None:
        env["id"] = event_id
    env["v"] = ENVELOPE_VERSION
    env["type"] = event_type
    env["data"] = data
    if prompt_id is not None:
        env["promptId"] = prompt_id
    if originator_client_id is not None:
        env["originatorClientId"] = originator_client_id
    if meta is not None:
        env["_meta"] = meta
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
    """The compact JSON of one envelope (:func:`envelope_fields`).

    ``data`` may be a payload Struct (encoded with its wire names, fields in definition order)
    or plain JSON values. The result is what the daemon publishes and what its size limits
    count.
    """
    return _encode(envelope_fields(
        event_type, data, event_id=event_id, prompt_id=prompt_id,
        originator_client_id=originator_client_id, meta=meta))


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
