"""Replay window of compacted completed turns. Pure core: no trio, no clock, no I/O.

The window is a queue of *segments*, one per completed turn (the compactor's output, stamped with
transcript record ids). It is capped in bytes (the sum of its events' sizes); past the cap the
oldest whole segments are dropped, but the newest one always stays. A load snapshot flattens the
retained segments, reusing each event's encoded bytes, behind an id-less ``history_truncated``
marker when anything was dropped. The marker's ``recordId`` is the oldest record id still in the
window, so that a transcript page before it returns exactly the dropped turns.

Memory is bounded as well as the wire: a turn larger than the whole cap (the newest segment is
kept even then) can be *spilled* once its records are committed to the transcript
(:meth:`ReplayWindow.spill`). A spilled segment keeps only its record ids and sizes; it counts
exactly as before for the cap, the counters and the marker, and a snapshot yields a
:class:`SpilledTurn` in its place, which the shell replaces with the records read back from the
transcript. The wire is unchanged: ``load`` still returns the whole compacted turn.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Final

import msgspec

from daemon.core.envelope import Event, typed_synthetic
from sdk.protocol.constants import REPLAY_WINDOW_EXCEEDED
from sdk.protocol.events import DaemonHistoryTruncatedData

__all__ = ["DEFAULT_MAX_BYTES", "Record", "ReplayWindow", "SegmentHandle", "SpilledTurn"]

DEFAULT_MAX_BYTES: Final = 4 * 1024 * 1024


class Record(msgspec.Struct, frozen=True):
    """One compacted event and the transcript record id it was stored under (None when the
    transcript is off or the write failed)."""

    event: Event
    record_id: str | None = None


class SpilledTurn(msgspec.Struct, frozen=True):
    """A snapshot's stand-in for a spilled segment: the record ids to read back from the
    transcript, in order, and the bytes they add up to."""

    record_ids: tuple[str, ...]
    size: int


class _Segment:
    __slots__ = ("record_ids", "records", "size")

    def __init__(self, records: tuple[Record, ...], size: int) -> None:
        self.records: tuple[Record, ...] | None = records  # None once spilled
        self.size = size
        self.record_ids: tuple[str | None, ...] = tuple(r.record_id for r in records)


class SegmentHandle:
    """Names one segment added to a window (for :meth:`ReplayWindow.spill`)."""

    __slots__ = ("_segment",)

    def __init__(self, segment: _Segment) -> None:
        self._segment = segment


class ReplayWindow:
    """Completed turns, newest last, within ``max_bytes`` (the newest turn is always kept)."""

    __slots__ = ("_segments", "event_count", "max_bytes", "total_bytes", "truncated_events",
                 "truncated_turns")

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes <= 0:
            raise ValueError(f"replay window max_bytes must be a positive int, got {max_bytes!r}")
        self.max_bytes = max_bytes
        self._segments: deque[_Segment] = deque()
        self.total_bytes = 0
        self.event_count = 0
        self.truncated_events = 0
        self.truncated_turns = 0

    @property
    def segment_count(self) -> int:
        return len(self._segments)

    @property
    def held_bytes(self) -> int:
        """Bytes of the events held in memory (``total_bytes`` minus spilled segments)."""
        return sum(seg.size for seg in self._segments if seg.records is not None)

    @property
    def spilled_segments(self) -> int:
        return sum(1 for seg in self._segments if seg.records is None)

    @property
    def oldest_record_id(self) -> str | None:
        """The oldest record id still in the window (the marker's ``recordId`` anchor)."""
        for segment in self._segments:
            for record_id in segment.record_ids:
                if record_id is not None:
                    return record_id
        return None

    def add_segment(self, records: Sequence[Record]) -> SegmentHandle:
        """Append one completed turn, then drop the oldest turns while over the cap."""
        segment = self._push(records)
        self._evict()
        return SegmentHandle(segment)

    def spillable(self, handle: SegmentHandle) -> bool:
        """True if the segment is still held in memory, alone is over the cap, and every
        record has a record id (so the transcript can give it back)."""
        segment = handle._segment
        return (
            segment.records is not None
            and segment.size > self.max_bytes
            and all(record_id is not None for record_id in segment.record_ids)
            and any(seg is segment for seg in self._segments)
        )

    def spill(self, handle: SegmentHandle) -> bool:
        """Forget the events of a :meth:`spillable` segment, keeping its ids and sizes; the
        caller promises its records are committed to the transcript. False (and nothing
        changes) if it is not spillable any more (e.g. it was evicted meanwhile)."""
        if not self.spillable(handle):
            return False
        handle._segment.records = None
        return True

    def newest_handle(self) -> SegmentHandle | None:
        """The newest segment (e.g. to spill a seeded turn read back from the transcript)."""
        return SegmentHandle(self._segments[-1]) if self._segments else None

    def seed(
        self,
        segments: Sequence[Sequence[Record]],
        *,
        truncated_events: int,
        truncated_turns: int,
    ) -> None:
        """Replace the window with turns read back from the transcript (cold restore, when a
        session no longer in memory is loaded).

        ``truncated_events``/``truncated_turns`` count the older records the caller left out;
        segments that still do not fit the cap are dropped and counted on top of them.
        """
        if truncated_events < 0 or truncated_turns < 0:
            raise ValueError(
                "seeded truncation counts must be >= 0, got "
                f"truncated_events={truncated_events}, truncated_turns={truncated_turns}"
            )
        self._segments.clear()
        self.total_bytes = 0
        self.event_count = 0
        self.truncated_events = truncated_events
        self.truncated_turns = truncated_turns
        for records in segments:
            self._push(records)
        self._evict()

    def records(self) -> list[Record]:
        """Every retained record held in memory, oldest first (spilled segments excluded)."""
        return [record for segment in self._segments for record in segment.records or ()]

    def marker(self, *, full_transcript_available: bool) -> DaemonHistoryTruncatedData | None:
        """The replay-history marker's payload, or None when nothing was dropped."""
        return self._marker(self.truncated_events, self.truncated_turns, self.event_count,
                            self.oldest_record_id, full_transcript_available)

    def _marker(self, truncated_events: int, truncated_turns: int, retained: int,
                anchor: str | None, full_transcript_available: bool
                ) -> DaemonHistoryTruncatedData | None:
        if truncated_events == 0 and truncated_turns == 0:
            return None
        return DaemonHistoryTruncatedData(
            reason=REPLAY_WINDOW_EXCEEDED, truncated_events=truncated_events,
            retained_events=retained, max_bytes=self.max_bytes,
            truncated_turns=truncated_turns if truncated_turns > 0 else None,
            record_id=anchor, full_transcript_available=full_transcript_available)

    def snapshot(
        self, *, full_transcript_available: bool, lost: Sequence[SpilledTurn] = ()
    ) -> list[bytes | SpilledTurn]:
        """The retained events' encodings, oldest first, behind the marker if anything was
        dropped; a spilled segment appears as one :class:`SpilledTurn`. The marker has no
        ``scope``, ``promptId`` or ``_meta``.

        ``lost``: spilled turns the transcript could not give back. They are left out and
        counted as truncated, as if the window had dropped them, and the anchor moves to the
        oldest record still served."""
        lost_ids = {turn.record_ids for turn in lost}
        truncated_events, truncated_turns = self.truncated_events, self.truncated_turns
        retained = self.event_count
        kept: list[tuple[_Segment, SpilledTurn | None]] = []
        for segment in self._segments:
            spilled: SpilledTurn | None = None
            if segment.records is None:
                ids = tuple(rid for rid in segment.record_ids if rid is not None)
                if ids in lost_ids:
                    count = len(segment.record_ids)
                    truncated_events += count
                    truncated_turns += 1
                    retained -= count
                    continue
                spilled = SpilledTurn(ids, segment.size)
            kept.append((segment, spilled))
        anchor = next((rid for seg, _ in kept for rid in seg.record_ids if rid is not None),
                      None)
        out: list[bytes | SpilledTurn] = []
        data = self._marker(truncated_events, truncated_turns, retained, anchor,
                            full_transcript_available)
        if data is not None:
            out.append(typed_synthetic(data).raw)
        for segment, spilled in kept:
            if spilled is not None:
                out.append(spilled)
            else:
                out.extend(record.event.raw for record in segment.records or ())
        return out

    def _push(self, records: Sequence[Record]) -> _Segment:
        if not records:
            raise ValueError("a replay window segment needs at least one event (its terminal)")
        frozen = tuple(records)
        size = sum(record.event.size for record in frozen)
        segment = _Segment(frozen, size)
        self._segments.append(segment)
        self.total_bytes += size
        self.event_count += len(frozen)
        return segment

    def _evict(self) -> None:
        segments = self._segments
        while self.total_bytes > self.max_bytes and len(segments) > 1:
            dropped = segments.popleft()
            self.total_bytes -= dropped.size
            self.event_count -= len(dropped.record_ids)
            self.truncated_events += len(dropped.record_ids)
            self.truncated_turns += 1
