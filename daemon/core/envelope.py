"""The event envelope: built once, encoded once, sized by its encoding.

Every published event becomes one :class:`Event`. Its compact JSON encoding (``raw``) is made
exactly once, at publish time; the ring, the live journals, load snapshots, SSE frames and the
transcript writer all reuse those bytes. ``size`` is ``len(raw)`` and is the size every byte limit counts (live journal,
replay window, event ring, slow-client queue).

The daemon publishes the protocol's typed payloads (:mod:`sdk.protocol.events`):
:func:`typed_event` and :func:`typed_synthetic` take a payload Struct, name the event by its
type and encode the envelope (:func:`sdk.protocol.envelope.envelope_fields`, the one layout)
with the Struct inside, fields in wire order. :func:`make_event` and :func:`synthetic` are the
same for an event type and plain JSON ``data`` (envelopes read back from the transcript).

Pure: no clock (callers pass ``now_ms``), no I/O.
"""

from __future__ import annotations

import math
from types import ModuleType
from typing import Any, Final

import msgspec

from sdk.protocol.constants import ENVELOPE_VERSION
from sdk.protocol.envelope import HOLE, envelope_fields
from sdk.protocol.events import EventPayload, SessionUpdateData, event_type_of
from sdk.protocol.sse import SSE_FRAME_END, sse_head

# Re-exported: the event modules read and write their JSON through the same codec.
from .json_codec import decode_json as decode_json
from .json_codec import encode_json as encode_json

SCHEMA_VERSION: Final = ENVELOPE_VERSION
_HOLE_BYTE: Final = bytes(HOLE)

# The ACP views (sdk.protocol.acp) are imported by the first event built from a dict, not with
# this module: an idle daemon (whose start-up probe builds its events from bytes) does without
# them. Reached through one global (an import statement per call costs a few microseconds).
_acp_module: ModuleType | None = None


def _acp() -> ModuleType:
    global _acp_module
    if _acp_module is None:
        from sdk.protocol import acp

        _acp_module = acp
    return _acp_module



JsonObject = dict[str, Any]


def is_finite_number(value: object) -> bool:
    """True for an int or float that is finite; bools are not numbers here."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    return isinstance(value, float) and math.isfinite(value)


class Event(msgspec.Struct, gc=False, eq=False):
    """One published (or seeded) event: its one encoding and, until released, its envelope dict.

    ``env`` must be treated as immutable once the event exists: its bytes are shared. After the
    publish pipeline has taken what it needs, :meth:`release` drops the dict so that the ring
    and the journals hold only the bytes; a later ``env`` read decodes them again.

    A Struct rather than a plain class because a turn makes one per agent chunk: msgspec
    builds it in C from positional fields (:meth:`daemon.core.frame_codec.EnvelopeSplicer.run` maps the class over a run),
    which is about a third of a Python ``__init__``'s cost. Build one with
    :meth:`with_env`, :meth:`from_env` or :meth:`spliced`; the positional fields are
    ``raw, size, id, type, prompt_id`` and ``size`` must be ``len(raw)``. ``gc=False``: an
    event holds bytes, strings, ints and a JSON dict, never anything that refers back to it,
    so it cannot be part of a reference cycle and the collector need not track it.
    ``eq=False``: events compare (and hash) by identity, like any object.
    """

    raw: bytes
    size: int
    id: int | None
    type: str
    prompt_id: str | None
    _env: JsonObject | None = None
    _sse_head: bytes | None = None

    @classmethod
    def with_env(cls, env: JsonObject, raw: bytes) -> Event:
        """The event of envelope ``env`` whose encoding is ``raw``; id, type and prompt id are
        read from ``env`` (raises ``TypeError`` unless it is an object with a string type)."""
        acp = _acp_module or _acp()
        head = acp.view(env, acp.EnvelopeView)
        if head is None or not isinstance(head.type, str):
            raise TypeError("an envelope is an object with a string type")
        ident = head.id
        prompt_id = head.prompt_id
        return cls(raw, len(raw), ident if isinstance(ident, int) else None, head.type,
                   prompt_id if isinstance(prompt_id, str) else None, env)

    @classmethod
    def from_env(cls, env: JsonObject) -> Event:
        """Encode ``env`` (raises ``msgspec.EncodeError``/``TypeError`` if it cannot be)."""
        return cls.with_env(env, encode_json(env))

    @classmethod
    def spliced(cls, raw: bytes, event_id: int, event_type: str, prompt_id: str | None) -> Event:
        """An event whose encoding was built without a dict (``daemon.core.frame_codec``): ``raw`` must
        be a valid compact envelope carrying these id, type and prompt id. ``env`` decodes it
        when someone asks."""
        return cls(raw, len(raw), event_id, event_type, prompt_id)

    @property
    def env(self) -> JsonObject:
        env = self._env
        if env is None:
            decoded: JsonObject = decode_json(self.raw)
            return decoded
        return env

    def release(self) -> None:
        """Forget the envelope dict (kept: the bytes). Memory then tracks the encoded size."""
        self._env = None

    @property
    def sse_head(self) -> bytes:
        """``id:``/``event:`` lines and the ``data: `` prefix of this event's SSE frame; the
        frame is ``sse_head + raw + SSE_FRAME_END`` (written without copying ``raw`` twice)."""
        head = self._sse_head
        if head is None:
            head = self._sse_head = sse_head(self.type, self.id)
        return head

    @property
    def sse_frame(self) -> bytes:
        """The whole SSE frame (for single frames; batches use
        :func:`daemon.core.frame_codec.sse_chunks`)."""
        return self.sse_head + self.raw + SSE_FRAME_END

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return f"Event(id={self.id}, type={self.type!r}, size={self.size})"


def _lifted_timestamp(data: Any) -> float | int | None:
    """``update._meta.serverTimestamp`` (else ``.timestamp``) of a session_update, if finite."""
    acp = _acp_module or _acp()
    view = acp.view
    found = view(data, acp.SessionUpdateView)
    update = None if found is None else view(found.update, acp.UpdateView)
    meta = None if update is None else view(update.meta, acp.UpdateMetaView)
    if meta is None:
        return None
    for value in (meta.server_timestamp, meta.timestamp):
        if is_finite_number(value):
            lifted: float | int = value
            return lifted
    return None


def build_envelope(
    event_id: int | None,
    event_type: str,
    data: Any,
    *,
    now_ms: int,
    prompt_id: str | None = None,
    originator_client_id: str | None = None,
    meta: JsonObject | None = None,
) -> JsonObject:
    """The envelope dict as the bus publishes it.

    ``_meta.serverTimestamp`` is the caller's finite numeric one, else (for ``session_update``)
    the one lifted from ``update._meta``, else ``now_ms``.
    """
    out_meta: JsonObject = dict(meta) if meta else {}
    acp = _acp_module or _acp()
    given = acp.view(out_meta, acp.EnvelopeMetaView) if out_meta else None
    if given is None or not is_finite_number(given.server_timestamp):
        lifted = _lifted_timestamp(data) if event_type == "session_update" else None
        out_meta["serverTimestamp"] = lifted if lifted is not None else now_ms
    return envelope_fields(event_type, data, event_id=event_id, prompt_id=prompt_id,
                           originator_client_id=originator_client_id, meta=out_meta)


def make_event(
    event_id: int | None,
    event_type: str,
    data: Any,
    *,
    now_ms: int,
    prompt_id: str | None = None,
    originator_client_id: str | None = None,
    meta: JsonObject | None = None,
) -> Event | None:
    """Build and encode one event; ``None`` when it cannot be encoded (it must then be dropped
    and consume no id)."""
    env = build_envelope(
        event_id,
        event_type,
        data,
        now_ms=now_ms,
        prompt_id=prompt_id,
        originator_client_id=originator_client_id,
        meta=meta,
    )
    try:
        return Event.with_env(env, encode_json(env))
    except (msgspec.EncodeError, TypeError, ValueError, OverflowError):
        return None


def _data_of(payload: EventPayload) -> Any:
    # A session_update's payload goes into the envelope dict as plain values: the live
    # journals and the compactor read its update (the bytes are the same either way).
    if type(payload) is SessionUpdateData:
        return {"sessionId": payload.session_id, "update": payload.update}
    return payload


def typed_event(event_id: int | None, payload: EventPayload, *, now_ms: int,
                prompt_id: str | None = None, originator_client_id: str | None = None,
                meta: JsonObject | None = None) -> Event | None:
    """:func:`make_event` for a payload Struct: the event type is the payload's."""
    return make_event(event_id, event_type_of(payload), _data_of(payload), now_ms=now_ms,
                      prompt_id=prompt_id, originator_client_id=originator_client_id,
                      meta=meta)


def synthetic(
    event_type: str, data: Any, *, now_ms: int | None = None, prompt_id: str | None = None
) -> Event:
    """An id-less transport frame (markers, ``replay_complete``, ``state_resync_required``,
    ``slow_client_warning``, ``client_evicted``, ``stream_error``). Never stored."""
    env = envelope_fields(event_type, data, prompt_id=prompt_id,
                          meta=None if now_ms is None else {"serverTimestamp": now_ms})
    return Event.with_env(env, encode_json(env))


def typed_synthetic(
    payload: EventPayload, *, now_ms: int | None = None, prompt_id: str | None = None
) -> Event:
    """:func:`synthetic` for a payload Struct: the event type is the payload's."""
    return synthetic(event_type_of(payload), payload, now_ms=now_ms, prompt_id=prompt_id)


def spliced_parts(body: msgspec.Struct) -> list[bytes]:
    """The JSON of a response Struct whose lists of envelopes hold their encoded ``bytes`` (a
    ``LoadSessionResponse[bytes]``, a ``TranscriptPage[bytes]``), as the parts that make it up:
    msgspec's encoding of the Struct with each such list left empty, cut open there, and the
    envelopes' own bytes (not copies) with the commas between them put in. So the members,
    their names and their order are the Struct's, and an 8 MiB load is written from where its
    envelopes already lie instead of being copied into one body first. The parts joined are
    ``msgspec.json.encode`` of the same Struct with each envelope as a ``msgspec.Raw``."""
    spliced: dict[str, list[bytes]] = {}
    for name in body.__struct_fields__:
        value = getattr(body, name)
        if type(value) is list and value and type(value[0]) is bytes:
            spliced[name] = value
    if not spliced:
        return [encode_json(body)]
    holes = msgspec.structs.replace(body, **{name: [HOLE] for name in spliced})
    pieces = encode_json(holes).split(_HOLE_BYTE)
    parts: list[bytes] = [pieces[0]]
    for items, piece in zip(spliced.values(), pieces[1:], strict=True):
        parts.append(items[0])
        for item in items[1:]:
            parts += (b",", item)
        parts.append(piece)
    return parts


def write_groups(parts: list[bytes], min_bytes: int) -> list[bytes]:
    """``parts`` regrouped for writing, with the same bytes in the same order: a part of at
    least ``min_bytes`` stays as it is (written from where it already lies), the runs of
    smaller parts between them are joined, each run cut once it reaches ``min_bytes``. So a
    body of a few large items is written without copying them, and one of many small items
    takes a few writes, not one per item. Empty parts are left out."""
    out: list[bytes] = []
    run: list[bytes] = []
    held = 0
    for part in parts:
        size = len(part)
        if not size:
            continue
        if size >= min_bytes:
            if run:
                out.append(b"".join(run))
                run, held = [], 0
            out.append(part)
            continue
        run.append(part)
        held += size
        if held >= min_bytes:
            out.append(b"".join(run))
            run, held = [], 0
    if run:
        out.append(b"".join(run))
    return out

