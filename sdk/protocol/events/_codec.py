"""Typed payloads of event frames: :func:`decode_payload` picks one decoder by the envelope's
``type`` and decodes the frame's raw ``data`` bytes straight into its payload Struct (a
``session_update``'s ACP update into its typed kind in the same pass). An unknown event type,
or a payload that does not fit its Struct, has no typed payload (``None``): the frame is kept
and counted (:class:`~sdk.protocol.envelope.UnknownEventCounter`), never raised.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import functools
from typing import Any, TypeAlias

import msgspec

from sdk.protocol.events._history_truncated import parse_truncation
from sdk.protocol.events._payloads import (
    PAYLOAD_TYPES,
    EventPayload,
    SessionUpdateData,
)
from sdk.protocol.events._updates import (
    AcpUpdate,
    TypedSessionUpdate,
    TypedUpdate,
    update_from_dict,
)

__all__ = ["Frame", "decode_payload", "payload_from_data"]

# Frame decoders: each reads a whole frame's bytes and types only its ``data`` (msgspec skips
# the envelope's other fields without building them). Built by the first decode of a frame of
# their type, not at import: a process that only writes frames (the daemon) never needs them.
_frame_decoders: dict[str, msgspec.json.Decoder[Any] | None] = {}


def _frame_decoder(event_type: str) -> msgspec.json.Decoder[Any] | None:
    try:
        return _frame_decoders[event_type]
    except KeyError:
        pass
    cls = PAYLOAD_TYPES.get(event_type)
    decoder = None if cls is None else msgspec.json.Decoder(
        msgspec.defstruct(f"_{cls.__name__}Frame", [("data", cls | None, None)], gc=False))
    if cls is not None:
        _frame_decoders[event_type] = decoder  # unknown types are not kept: any string comes
    return decoder


class _SessionUpdateFrame(msgspec.Struct, gc=False):
    # The common case in one pass: data = {sessionId, update} with an update of a typed kind.
    data: TypedSessionUpdate


class _PageShapeFrame(msgspec.Struct, gc=False):
    # The reference daemon's transcript pages: data is the update itself.
    data: TypedUpdate


@functools.cache
def _update_decoders() -> tuple[msgspec.json.Decoder[_SessionUpdateFrame],
                                msgspec.json.Decoder[_PageShapeFrame]]:
    return msgspec.json.Decoder(_SessionUpdateFrame), msgspec.json.Decoder(_PageShapeFrame)


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
    payload.__dict__["acp"] = typed if typed is not None else update_from_dict(update)
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
            session_update_frame, page_shape_frame = _update_decoders()
            if isinstance(data, dict) and "update" not in data:
                typed = page_shape_frame.decode(frame).data
            else:
                typed = session_update_frame.decode(frame).data.update
        except msgspec.ValidationError:
            typed = None  # an untyped kind, or typed fields that do not fit: kept raw
        return _session_update(data, typed)
    if event_type == "history_truncated":
        return parse_truncation(data)
    decoder = _frame_decoder(event_type)
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
