"""The frame codec: every byte format the daemon writes an event in, in one place. Pure.

Three formats, from the inside out:

- **The envelope splice.** A plain text chunk's envelope is never encoded from a dict: it is
  the envelope the daemon would have encoded (same members, same order) with the agent's
  ``update`` bytes copied in (:class:`EnvelopeSplicer`, one ``%``-format per envelope; a run's
  envelopes can be made again from its :class:`~daemon.core.transcript_ops.RunTemplate`, which
  is what the transcript stores, :func:`run_envelopes`). The updates come from
  :class:`daemon.core.updates.UpdateBatch`.
- **SSE frames.** ``id:``, ``event:``, ``data:`` and the envelope, laid out as the protocol's
  :data:`sdk.protocol.sse.SSE_FRAME` (the one definition of the frame): :func:`sse_frames` for
  a wake-up's run of ring events, built once for every subscriber, :func:`sse_chunks` for a
  replay cut into writes.
- **WebSocket frames.** An event as a server's WebSocket text message: one unmasked frame
  (:func:`daemon.core.transport_frames.ws_frame_head`), then the envelope; the bytes wsproto
  writes for a finished text message with no extension (:func:`ws_frames` for a wake-up's
  run, shared like the SSE frames, :func:`ws_chunks` for a replay cut into writes).

The HTTP/1.1 chunks a direct body is written in, and the WebSocket frame head, are
:mod:`daemon.core.transport_frames` (re-exported here): they frame bytes, not events.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import repeat
from operator import attrgetter
from typing import Final

from daemon.core.envelope import Event
from daemon.core.transcript_ops import RunTemplate
from sdk.protocol.envelope import HOLE, envelope_template
from sdk.protocol.events import SessionUpdateData
from sdk.protocol.sse import SSE_FRAME, SSE_FRAME_END, frame_format

# Re-exported: the transport's framing, which holds no event (see that module).
from .transport_frames import CRLF as CRLF
from .transport_frames import Buffer as Buffer
from .transport_frames import advance as advance
from .transport_frames import chunk as chunk
from .transport_frames import ws_frame_head as ws_frame_head

__all__ = ["CRLF", "Buffer", "EnvelopeSplicer", "Splicer", "advance", "chunk", "run_envelopes",
           "sse_chunks", "sse_frames", "ws_chunks", "ws_frame_head", "ws_frames"]


# --- the envelope splice ----------------------------------------------------------------------

class EnvelopeSplicer:
    """Builds ``session_update`` envelopes around pre-encoded ``update`` bytes.

    The result is exactly what :func:`daemon.core.envelope.make_event` encodes for
    ``data = {sessionId, update}`` with the given prompt and originator ids and
    ``_meta.serverTimestamp = now_ms`` when ``update`` is in msgspec's compact form, and the
    same envelope with the agent's spelling of ``update`` otherwise. The bytes around the id
    and the update are the protocol's envelope encoded once with holes there
    (:func:`sdk.protocol.envelope.envelope_template`), never written by hand.
    """

    __slots__ = ("_format", "_head", "_prompt_id", "_tail")

    def __init__(
        self, session_id: str, prompt_id: str | None, originator_client_id: str | None,
        now_ms: int, *, pieces: tuple[bytes, bytes, bytes] | None = None,
    ) -> None:
        # The id leads every envelope, so the piece before it is always _ID_START (a run's
        # RunTemplate keeps only the two pieces after it). ``pieces``: what
        # :func:`_timestamped_pieces` made for these ids, filled with ``now_ms`` here instead
        # of encoding the envelope again.
        if pieces is None:
            pieces = _timestamped_pieces(session_id, prompt_id, originator_client_id)
        head, after_update, after_stamp = pieces
        self._head = head
        self._tail = b"%b%d%b" % (after_update, now_ms, after_stamp)
        self._format = _envelope_format(self._head, self._tail)
        self._prompt_id = prompt_id

    def envelope(self, event_id: int, update: bytes) -> bytes:
        return b"%b%d%b%b%b" % (_ID_START, event_id, self._head, update, self._tail)

    def envelopes(self, first_id: int, updates: list[bytes]) -> list[bytes]:
        """:meth:`envelope` of each update, the ids counting up from ``first_id``."""
        return _formatted(self._format, first_id, updates)

    def run(self, first_id: int, updates: list[bytes]) -> tuple[list[Event], RunTemplate]:
        """The ``session_update`` events of ``updates`` (their envelopes, the ids counting up
        from ``first_id``), and the template that makes the envelopes again from the updates
        (what the transcript stores of the run, :func:`run_envelopes`)."""
        raws = _formatted(self._format, first_id, updates)
        events = list(map(Event, raws, map(len, raws), range(first_id, first_id + len(raws)),
                          repeat("session_update"), repeat(self._prompt_id)))
        return events, RunTemplate(first_id, self._head, self._tail)

    def template(self, first_id: int) -> RunTemplate:
        """What :func:`run_envelopes` needs to make the envelopes of a run from its updates
        again, the run's ids counting up from ``first_id``."""
        return RunTemplate(first_id, self._head, self._tail)


class Splicer:
    """A session's spliced runs: :meth:`EnvelopeSplicer.run` with the envelope template of
    the moment, the last one reused while the prompt, the originator and the clock's
    millisecond are the same (a turn's reads come several to a millisecond, and a template
    costs several envelopes to make). The envelope's pieces around the timestamp are kept
    while the prompt and the originator are the same: a paced turn publishes every few tens
    of milliseconds, each time in a new millisecond, and a new millisecond only fills them."""

    __slots__ = ("_ids", "_key", "_pieces", "_splicer", "session_id")

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self._key: tuple[str | None, str | None, int] | None = None
        self._splicer: EnvelopeSplicer | None = None
        self._ids: tuple[str | None, str | None] | None = None
        self._pieces: tuple[bytes, bytes, bytes] | None = None

    def run(self, prompt_id: str | None, originator_client_id: str | None, now_ms: int,
            first_id: int, updates: list[bytes]) -> tuple[list[Event], RunTemplate]:
        key = (prompt_id, originator_client_id, now_ms)
        splicer = self._splicer
        if splicer is None or key != self._key:
            ids = (prompt_id, originator_client_id)
            pieces = self._pieces
            if pieces is None or ids != self._ids:
                pieces = self._pieces = _timestamped_pieces(self.session_id, prompt_id,
                                                            originator_client_id)
                self._ids = ids
            splicer = self._splicer = EnvelopeSplicer(self.session_id, prompt_id,
                                                      originator_client_id, now_ms,
                                                      pieces=pieces)
            self._key = key
        return splicer.run(first_id, updates)


def _timestamped_pieces(session_id: str, prompt_id: str | None,
                        originator_client_id: str | None) -> tuple[bytes, bytes, bytes]:
    """The envelope of a ``session_update`` with these ids, encoded once with holes at its
    id, its update and its ``_meta.serverTimestamp`` (the envelope's members come in that
    order): the pieces after the id, after the update and after the timestamp."""
    _, head, after_update, after_stamp = envelope_template(
        "session_update", SessionUpdateData(session_id=session_id, update=HOLE),
        prompt_id=prompt_id, originator_client_id=originator_client_id,
        meta={"serverTimestamp": HOLE})
    return head, after_update, after_stamp


#: What an envelope with an id starts with, before the id's digits (``{"id":``).
_ID_START: Final = envelope_template("", None)[0]


def _envelope_format(head: bytes, tail: bytes) -> bytes:
    """The ``%``-format of one envelope: its id (``%d``) and its update (``%b``) go in."""
    return _ID_START + b"%d" + head.replace(b"%", b"%%") + b"%b" + tail.replace(b"%", b"%%")


def run_envelopes(run: RunTemplate, updates: list[bytes]) -> list[bytes]:
    """The envelopes of a run of spliced chunks: exactly what
    ``EnvelopeSplicer.envelopes(run.first_id, updates)`` returned for the splicer
    ``run`` came from."""
    return _formatted(_envelope_format(run.head, run.tail), run.first_id, updates)


def _formatted(envelope_format: bytes, first_id: int, updates: list[bytes]) -> list[bytes]:
    """``envelope_format`` filled with each of ``updates``, the ids counting up from
    ``first_id``: one C call per envelope."""
    return list(map(envelope_format.__mod__,
                    zip(range(first_id, first_id + len(updates)), updates, strict=True)))


# --- SSE frames -------------------------------------------------------------------------------

_type = attrgetter("type")
_raw = attrgetter("raw")


_FRAME_FORMATS: dict[str, bytes] = {}


def _frame_format(event_type: str) -> bytes:
    """:func:`sdk.protocol.sse.frame_format`, made once per event type (a handful of them)."""
    found = _FRAME_FORMATS.get(event_type)
    if found is None:
        found = _FRAME_FORMATS[event_type] = frame_format(event_type)
    return found


def sse_frames(events: list[Event]) -> bytes:
    """The SSE frames of ``events`` (ring events: each has an id), joined; the same bytes as
    :func:`sse_chunks` without caching a head on every event: what a live wake-up writes."""
    count = len(events)
    if count == 1:  # a paced turn's usual wake-up: one frame
        event = events[0]
        if event.id is not None:
            return _frame_format(event.type) % (event.id, event.raw)
    if not count:
        return b""
    first, last = events[0].id, events[-1].id
    kind = events[0].type
    if (first is not None and last == first + count - 1
            and list(map(_type, events)).count(kind) == count):
        # The usual wake-up: consecutive ring events of one type (a run of chunks), whose
        # frames differ only in their id and envelope. The whole run is one %-format of the
        # frame's template repeated ``count`` times, fed (id, envelope) pairs: the parsing,
        # the id formatting and the copy all happen in one C call, cheaper per event than
        # formatting each head and joining heads, envelopes and separators (a test holds it
        # to sse_chunks' bytes).
        template = _frame_format(kind)
        values: list[object] = [None] * (2 * count)
        values[0::2] = range(first, last + 1)
        values[1::2] = map(_raw, events)
        return (template * count) % tuple(values)
    types: dict[str, bytes] = {}
    return b"".join([
        SSE_FRAME % (
            event.id or 0,
            types.get(event.type) or types.setdefault(event.type, event.type.encode()),
            event.raw)
        for event in events])


def sse_chunks(events: Iterable[Event], max_chunk: int = 1024 * 1024) -> list[bytes]:
    """SSE frames of ``events`` joined into as few writes as possible (each about
    ``max_chunk`` bytes at most, one frame at least)."""
    out: list[bytes] = []
    parts: list[bytes] = []
    size = 0
    for event in events:
        parts += (event.sse_head, event.raw, SSE_FRAME_END)
        size += event.size + 64
        if size >= max_chunk:
            out.append(b"".join(parts))
            parts, size = [], 0
    if parts:
        out.append(b"".join(parts))
    return out


# --- WebSocket frames -------------------------------------------------------------------------

_size = attrgetter("size")


def ws_frames(events: list[Event]) -> bytes:
    """Each of ``events`` as one WebSocket text message (its envelope), joined."""
    count = len(events)
    if not count:
        return b""
    parts: list[bytes] = [b""] * (2 * count)
    parts[0::2] = map(ws_frame_head, map(_size, events))
    parts[1::2] = map(_raw, events)
    return b"".join(parts)


def ws_chunks(events: Iterable[Event], max_chunk: int = 1024 * 1024) -> list[bytes]:
    """:func:`ws_frames` of ``events`` joined into as few writes as possible (each about
    ``max_chunk`` bytes at most, one message at least)."""
    out: list[bytes] = []
    parts: list[bytes] = []
    size = 0
    for event in events:
        parts += (ws_frame_head(event.size), event.raw)
        size += event.size + 10
        if size >= max_chunk:
            out.append(b"".join(parts))
            parts, size = [], 0
    if parts:
        out.append(b"".join(parts))
    return out
