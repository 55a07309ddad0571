"""The live journal: a bounded record of the unfinished turn.

The bus appends every non-transient published event; a turn terminal resets the journal. A
load snapshot returns the retained entries, preceded by an id-less ``history_truncated`` marker
when older entries had to be dropped.

Entries: normally one event is one entry, stored as the :class:`~daemon.core.envelope.Event`
itself so that its snapshot bytes are ``event.raw`` with no re-encode. Consecutive compatible
text chunks (same kind, same ids, plain text content, only whitelisted ``_meta``:
:func:`merge_key`) merge into one :class:`_MergedEntry` of at most
:data:`MAX_EVENTS_PER_ENTRY` source events, rendered on demand and cached until it grows.

This is on the publish hot path, so ``append`` is O(1) amortized: a deque of entries, running
byte/event counters, the merge compatibility of the last entry kept as one comparable key, an
event that is not a ``session_update`` rejected by its type before any inspection, and the
merge conditions checked by one decode of a strict view (``sdk.protocol.acp``). Runs of plain
spliced chunks skip even that (:meth:`LiveJournals.append_chunks`).

Pure: no trio, no clock, no I/O.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from itertools import accumulate
from typing import Any, Final, Literal

from msgspec import UNSET

from daemon.core.envelope import Event, JsonObject, encode_json, typed_synthetic
from sdk.protocol.acp import (
    AGENT_MESSAGE_CHUNK,
    EnvelopeView,
    MergeableChunk,
    OtherUpdate,
    SessionUpdateView,
    UpdateEnvelopeView,
    mergeable_chunk_fields,
    view,
)
from sdk.protocol.constants import LIVE_JOURNAL_SCOPE, REPLAY_WINDOW_EXCEEDED
from sdk.protocol.events import DaemonHistoryTruncatedData

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_EVENTS",
    "JOIN_PIECES",
    "LIVE_REPLAY_MODES",
    "MAX_EVENTS_PER_ENTRY",
    "LiveJournal",
    "LiveJournals",
    "LiveReplayMode",
    "in_summary",
    "merge_key",
    "plain_chunk_key",
]

DEFAULT_MAX_EVENTS: Final = 10_000
DEFAULT_MAX_BYTES: Final = 8 * 1024 * 1024
MAX_EVENTS_PER_ENTRY: Final = 256
# A merged entry joins its text pieces into one string whenever it holds this many: a chunk's
# text is often shorter than a string object's own header (49 bytes), so a list of one string
# per merged event held more header than text (about 1.2 MB of a full journal of short
# chunks). Each join copies the entry's text so far, about MAX_EVENTS_PER_ENTRY / 2 /
# JOIN_PIECES times a chunk's text per event.
JOIN_PIECES: Final = 16

# The load request's ``liveReplayMode`` values, for the HTTP layer to validate against.
LiveReplayMode = Literal["full", "summary"]
LIVE_REPLAY_MODES: Final[frozenset[str]] = frozenset({"full", "summary"})

_MESSAGE_CHUNK: Final = AGENT_MESSAGE_CHUNK

# A merge key: (kind, promptId, originatorClientId, data.sessionId, parentToolCallId,
# sourceRecordIds), each UNSET when absent, so "absent" never equals an explicit value.
MergeKey = tuple[Any, ...]


def merge_key(env: JsonObject) -> MergeKey | None:
    """What two events must share to merge into one entry, or ``None`` when ``env``
    can never merge.

    Two events with keys ``a`` and ``b`` are merge-compatible iff neither is ``None`` and
    ``a == b``; the per-entry count and byte limits are the journal's to check.
    """
    head = view(env, EnvelopeView)
    if head is None or head.type != "session_update":
        return None
    # The merge conditions are the strict view sdk.protocol.acp.MergeableChunk, read by its
    # fast dict decoder (property-tested equal to the view).
    fields = mergeable_chunk_fields(env)
    return None if fields is None else fields[0]


def plain_chunk_key(
    kind: str, prompt_id: str | None, originator_client_id: str | None, session_id: str
) -> MergeKey:
    """The merge key :func:`merge_key` gives a spliced plain text chunk (``daemon.core.frame_codec``):
    an envelope with ``_meta`` = ``{serverTimestamp}`` only, ``data`` = ``{sessionId, update}``
    and an update without ``_meta``, so without parent tool call or source records."""
    return (
        kind,
        UNSET if prompt_id is None else prompt_id,
        UNSET if originator_client_id is None else originator_client_id,
        session_id,
        UNSET,
        UNSET,
    )


def _chunk_text(event: Event) -> str:
    # Only called on events whose merge key was not None, so the decoder finds the chunk.
    fields = mergeable_chunk_fields(event.env)
    assert fields is not None
    return fields[1]


def in_summary(event: Event) -> bool:
    """Whether ``event`` belongs in the summary journal.

    Dropped: ``session_update`` frames from inside a subagent (``update._meta.parentToolCallId``
    a non-empty string), except the frame describing that tool call itself
    (``parentToolCallId == update.toolCallId``) and ``agent_message_chunk`` frames whose
    ``update._meta.usage`` is an object (token counts), which summary clients still need.
    """
    if event.type != "session_update":
        return True
    found = view(event.env, UpdateEnvelopeView)
    update = None if found is None else found.update
    if update is None:
        return True
    meta = update.meta
    if meta is None or _outside_subagent(meta.parent_tool_call_id, update.tool_call_id):
        return True
    return update.session_update == _MESSAGE_CHUNK and isinstance(meta.usage, dict)


def _outside_subagent(parent: object, tool_call_id: object) -> bool:
    """The summary keeps a frame whose ``parentToolCallId`` is not a non-empty string, or is
    the frame's own ``toolCallId`` (the frame describing the subagent's tool call)."""
    return not isinstance(parent, str) or not parent or parent == tool_call_id


def _other_in_summary(update: OtherUpdate) -> bool:
    """:func:`in_summary` of a ``session_update`` whose update is ``update`` (never an
    ``agent_message_chunk``, so the token-count exception does not apply)."""
    meta = update.meta
    return meta is None or _outside_subagent(meta.parent_tool_call_id, update.tool_call_id)


class _MergedEntry:
    """Two or more (``count``) merged chunk events. Texts are kept as pieces so adding one is
    O(1) amortized, joined into one whenever there are :data:`JOIN_PIECES` of them; the
    journal grows it in place (and clears ``rendered``) on its hot path."""

    __slots__ = ("count", "first", "last", "nbytes", "pieces", "rendered")

    def __init__(self, first: Event, second: Event, second_text: str,
                 first_text: str | None = None) -> None:
        self.first = first
        self.last = second
        # The first event's text is decoded from its bytes unless the caller knows it.
        self.pieces = [_chunk_text(first) if first_text is None else first_text, second_text]
        self.count = 2
        self.nbytes = first.size + second.size
        self.rendered: bytes | None = None

    def render(self) -> bytes:
        """The shallow merge of the first and last source events, last winning, ``data`` and
        ``update`` merged one level deep, the text being all pieces in order. Cached until
        the entry grows."""
        rendered = self.rendered
        if rendered is None:
            first = self.first.env
            last = self.last.env
            # Both ends are mergeable chunks: their data and update are objects.
            first_view = view(first, EnvelopeView)
            last_view = view(last, EnvelopeView)
            assert first_view is not None and last_view is not None
            first_data = first_view.data
            last_data = last_view.data
            first_update = view(first_data, SessionUpdateView)
            last_update = view(last_data, SessionUpdateView)
            assert first_update is not None and last_update is not None
            update = {**first_update.update, **last_update.update}
            update["content"] = {"type": "text", "text": "".join(self.pieces)}
            data = {**first_data, **last_data}
            data["update"] = update
            env = {**first, **last}
            env["data"] = data
            rendered = encode_json(env)
            self.rendered = rendered
        return rendered


_Entry = Event | _MergedEntry


def _check_cap(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value}")
    return value


class LiveJournal:
    """The entries of the unfinished turn, bounded by ``max_events`` entries and ``max_bytes``
   ."""

    __slots__ = (
        "_entries",
        "_last_key",
        "_retained",
        "_total_bytes",
        "_truncated",
        "max_bytes",
        "max_events",
    )

    def __init__(
        self, max_events: int = DEFAULT_MAX_EVENTS, max_bytes: int = DEFAULT_MAX_BYTES
    ) -> None:
        self.max_events: Final = _check_cap("max_events", max_events)
        self.max_bytes: Final = _check_cap("max_bytes", max_bytes)
        self._entries: deque[_Entry] = deque()
        self._total_bytes = 0
        self._retained = 0
        self._truncated = 0
        # Merge key of the last entry (None: it cannot take a chunk). The last entry is never
        # evicted (one always survives), so the key stays valid until the next append or reset.
        self._last_key: MergeKey | None = None

    @property
    def entry_count(self) -> int:
        return len(self._entries)

    @property
    def total_bytes(self) -> int:
        """Sum of the entries' bytes (an entry's bytes = its source events' sizes)."""
        return self._total_bytes

    @property
    def truncated_events(self) -> int:
        """Source events evicted since the last reset."""
        return self._truncated

    @property
    def retained_events(self) -> int:
        """Source events still held."""
        return self._retained

    def __len__(self) -> int:
        return len(self._entries)

    def append(self, event: Event) -> None:
        """Add one event: merge it into the last entry when their merge keys agree and the
        entry has room, then evict the oldest entries while over a cap (one always stays)."""
        # Called straight, not through a helper: one Python call per event is a few percent
        # of this path.
        fields = mergeable_chunk_fields(event.env) if event.type == "session_update" else None
        if fields is None:
            self._push(event, None, "")
        else:
            self._push(event, fields[0], fields[1])

    def _push(self, event: Event, key: MergeKey | None, text: str) -> None:
        # Key and text come in so LiveJournals classifies an event once for both journals.
        # Merging and eviction are inlined: at the caps every append evicts, and a call per
        # event is a measurable share of the publish path.
        entries = self._entries
        size = event.size
        merged = False
        if key is not None and key == self._last_key:
            # A recorded key means the last entry exists and took a compatible chunk.
            last = entries[-1]
            if isinstance(last, _MergedEntry):
                if last.count < MAX_EVENTS_PER_ENTRY and last.nbytes + size <= self.max_bytes:
                    pieces = last.pieces
                    pieces.append(text)
                    if len(pieces) >= JOIN_PIECES:
                        last.pieces = ["".join(pieces)]
                    last.count += 1
                    last.last = event
                    last.nbytes += size
                    last.rendered = None
                    merged = True
            elif last.size + size <= self.max_bytes:
                entries[-1] = _MergedEntry(last, event, text)
                merged = True
        if not merged:
            entries.append(event)
            self._last_key = key
        total = self._total_bytes + size
        if len(entries) > self.max_events or (total > self.max_bytes and len(entries) > 1):
            oldest = entries.popleft()
            if isinstance(oldest, Event):
                total -= oldest.size
                dropped = 1
            else:
                total -= oldest.nbytes
                dropped = oldest.count
            # Usually one eviction suffices; a big event can push several old ones out.
            while len(entries) > self.max_events or (total > self.max_bytes and len(entries) > 1):
                oldest = entries.popleft()
                if isinstance(oldest, Event):
                    total -= oldest.size
                    dropped += 1
                else:
                    total -= oldest.nbytes
                    dropped += oldest.count
            if dropped != 1:  # one in, one out leaves the retained count as it was
                self._retained += 1 - dropped
            self._truncated += dropped
        else:
            self._retained += 1
        self._total_bytes = total

    def _push_run(self, events: list[Event], texts: list[str], key: MergeKey,
                  offsets: list[int] | None = None) -> None:
        """:meth:`_push` of each event of a run sharing the merge key ``key`` (not None), with
        one eviction pass at the end. Same result: whether an event merges never depends on
        evictions (only on the last entry, which is never evicted), and evicting the oldest
        entries while over a cap, once after all appends, removes the same entries as doing
        it after each (the totals only grow meanwhile). ``offsets`` (``offsets[k] -
        offsets[0]``: the sizes of ``events[:k]`` added up, ``len(events) + 1`` of them; only
        their differences are read) finds how many events an entry takes with one search
        instead of a step per event."""
        entries = self._entries
        max_bytes = self.max_bytes
        total = self._total_bytes
        count = len(events)
        if offsets is None:
            offsets = list(accumulate([event.size for event in events], initial=0))
        i = 0
        while i < count:
            event = events[i]
            if key == self._last_key:
                last = entries[-1]
                if isinstance(last, _MergedEntry):
                    nbytes = last.nbytes
                    room = MAX_EVENTS_PER_ENTRY - last.count
                    end = i
                    if room > 0 and nbytes <= max_bytes:
                        # The furthest end within the room whose events still fit the bytes.
                        end = bisect_right(offsets, max_bytes - nbytes + offsets[i], i,
                                           min(count, i + room) + 1) - 1
                        nbytes += offsets[end] - offsets[i]
                    if end > i:
                        pieces = last.pieces
                        pieces.extend(texts[i:end])
                        if len(pieces) >= JOIN_PIECES:
                            last.pieces = ["".join(pieces)]
                        last.count += end - i
                        last.last = events[end - 1]
                        total += nbytes - last.nbytes
                        last.nbytes = nbytes
                        last.rendered = None
                        i = end
                        continue
                elif last.size + event.size <= max_bytes:
                    # Past the run's first event, a lone last entry is the previous event
                    # of this run, whose text is known.
                    entries[-1] = _MergedEntry(last, event, texts[i],
                                               texts[i - 1] if i else None)
                    total += event.size
                    i += 1
                    continue
            entries.append(event)
            self._last_key = key
            total += event.size
            i += 1
        dropped = 0
        max_events = self.max_events
        while len(entries) > max_events or (total > max_bytes and len(entries) > 1):
            oldest = entries.popleft()
            if isinstance(oldest, Event):
                total -= oldest.size
                dropped += 1
            else:
                total -= oldest.nbytes
                dropped += oldest.count
        self._retained += count - dropped
        self._truncated += dropped
        self._total_bytes = total

    def reset(self) -> None:
        """Turn boundary: forget every entry and zero the counters."""
        self._entries.clear()
        self._total_bytes = 0
        self._retained = 0
        self._truncated = 0
        self._last_key = None

    def entries(self) -> list[bytes]:
        """Each entry's encoded envelope, oldest first; an unmerged entry is its ``event.raw``."""
        return [e.raw if isinstance(e, Event) else e.render() for e in self._entries]

    def marker(
        self,
        *,
        active_prompt_id: str | None,
        full_transcript_available: bool,
        record_id: str | None = None,
    ) -> bytes | None:
        """The encoded live-journal ``history_truncated`` marker (id-less, never stored), or ``None`` when
        nothing was evicted."""
        if self._truncated == 0:
            return None
        data = DaemonHistoryTruncatedData(
            reason=REPLAY_WINDOW_EXCEEDED, scope=LIVE_JOURNAL_SCOPE,
            truncated_events=self._truncated, retained_events=self._retained,
            max_bytes=self.max_bytes, max_events=self.max_events, record_id=record_id,
            full_transcript_available=full_transcript_available)
        return typed_synthetic(data, prompt_id=active_prompt_id).raw

    def snapshot(
        self,
        *,
        active_prompt_id: str | None,
        full_transcript_available: bool,
        record_id: str | None = None,
    ) -> list[bytes]:
        """The load snapshot: the retained entries, with the marker first if any were evicted.

        ``active_prompt_id`` is the session's authoritative active prompt (``None`` when no
        prompt runs); ``record_id`` the newest transcript record id known now, if any.
        """
        items = self.entries()
        head = self.marker(
            active_prompt_id=active_prompt_id,
            full_transcript_available=full_transcript_available,
            record_id=record_id,
        )
        if head is not None:
            items.insert(0, head)
        return items


class LiveJournals:
    """The ``full`` and ``summary`` journals of one session (summary: without subagent
    frames, :func:`in_summary`): same caps, enforced apart."""

    __slots__ = ("full", "summary")

    def __init__(
        self, max_events: int = DEFAULT_MAX_EVENTS, max_bytes: int = DEFAULT_MAX_BYTES
    ) -> None:
        self.full: Final = LiveJournal(max_events, max_bytes)
        self.summary: Final = LiveJournal(max_events, max_bytes)

    def append(self, event: Event) -> None:
        """Every event goes to ``full``; those passing :func:`in_summary` also to ``summary``."""
        if event.type != "session_update":
            self.full._push(event, None, "")
            self.summary._push(event, None, "")
            return
        env = event.env
        fields = mergeable_chunk_fields(env)
        if fields is not None:
            key, text = fields
            self.full._push(event, key, text)
            # A mergeable chunk has no toolCallId and no usage, so in_summary reduces to "no
            # non-empty parentToolCallId", and the key holds that value.
            parent = key[4]
            if not isinstance(parent, str) or not parent:
                self.summary._push(event, key, text)
            return
        # One view answers both questions for the other common kinds.
        found = view(env, MergeableChunk)
        update = None if found is None else found.data.update
        if isinstance(update, OtherUpdate):
            self.full._push(event, None, "")
            if _other_in_summary(update):
                self.summary._push(event, None, "")
            return
        self.full._push(event, None, "")
        if in_summary(event):
            self.summary._push(event, None, "")

    def append_chunks(self, events: list[Event], texts: list[str], key: MergeKey,
                      offsets: list[int] | None = None) -> None:
        """Append a run of plain text chunks sharing merge key ``key``
        (:func:`plain_chunk_key`), ``texts[i]`` being the text of ``events[i]``: the same as
        :meth:`append` of each, without classifying them again. Top-level chunks belong in
        both journals. ``offsets``, when given, are the run's cumulative sizes from any
        start (``EventRing.extend`` returns them): ``offsets[j] - offsets[i]`` is the size
        of ``events[i:j]``."""
        if offsets is None:
            offsets = list(accumulate([event.size for event in events], initial=0))
        self.full._push_run(events, texts, key, offsets)
        self.summary._push_run(events, texts, key, offsets)

    def append_run(self, events: list[Event], texts: list[str], kind: str,
                   prompt_id: str | None, originator_client_id: str | None, session_id: str,
                   offsets: list[int] | None = None) -> None:
        """:meth:`append_chunks` of a run of spliced plain text chunks of ``kind``, published
        for ``prompt_id`` by ``originator_client_id`` in ``session_id`` (their merge key is
        :func:`plain_chunk_key` of those)."""
        self.append_chunks(events, texts,
                           plain_chunk_key(kind, prompt_id, originator_client_id, session_id),
                           offsets)

    def reset(self) -> None:
        self.full.reset()
        self.summary.reset()

    def journal(self, mode: str) -> LiveJournal:
        """The journal for a load's ``liveReplayMode``; anything but full/summary is refused."""
        if mode == "full":
            return self.full
        if mode == "summary":
            return self.summary
        raise ValueError(f"invalid live replay mode {mode!r}: expected 'full' or 'summary'")

    def snapshot(
        self,
        mode: str,
        *,
        active_prompt_id: str | None,
        full_transcript_available: bool,
        record_id: str | None = None,
    ) -> list[bytes]:
        """:meth:`LiveJournal.snapshot` of the journal ``mode`` selects."""
        return self.journal(mode).snapshot(
            active_prompt_id=active_prompt_id,
            full_transcript_available=full_transcript_available,
            record_id=record_id,
        )
