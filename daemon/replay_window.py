"""Replay window of compacted completed turns (SPEC §3.2). Pure core: no trio, no clock, no I/O.

The window is a queue of *segments*, one per completed turn (the compactor's output, stamped with
transcript record ids). It is capped in bytes (the sum of its events' sizes); past the cap the
oldest whole segments are dropped, but the newest one always stays. A load snapshot flattens the
retained segments, reusing each event's encoded bytes, behind an id-less ``history_truncated``
marker when anything was dropped. The marker's ``recordId`` is the oldest record id still in the
window, so that a transcript page before it returns exactly the dropped turns.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from daemon.envelope import Event, JsonObject, synthetic

__all__ = ["DEFAULT_MAX_BYTES", "Record", "ReplayWindow"]

DEFAULT_MAX_BYTES: Final = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Record:
    """One compacted event and the transcript record id it was stored under (None when the
    transcript is off or the write failed)."""

    event: Event
    record_id: str | None = None


@dataclass(frozen=True, slots=True)
class _Segment:
    records: tuple[Record, ...]
    size: int


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
    def oldest_record_id(self) -> str | None:
        """The oldest record id still in the window (the marker's ``recordId`` anchor)."""
        for segment in self._segments:
            for record in segment.records:
                if record.record_id is not None:
                    return record.record_id
        return None

    def add_segment(self, records: Sequence[Record]) -> None:
        """Append one completed turn, then drop the oldest turns while over the cap."""
        self._push(records)
        self._evict()

    def seed(
        self,
        segments: Sequence[Sequence[Record]],
        *,
        truncated_events: int,
        truncated_turns: int,
    ) -> None:
        """Replace the window with turns read back from the transcript (cold restore, SPEC §6.2).

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
        """Every retained record, oldest first."""
        return [record for segment in self._segments for record in segment.records]

    def marker(self, *, full_transcript_available: bool) -> JsonObject | None:
        """The replay-history marker's ``data``, or None when nothing was dropped."""
        if self.truncated_events == 0 and self.truncated_turns == 0:
            return None
        data: JsonObject = {
            "reason": "replay_window_exceeded",
            "truncatedEvents": self.truncated_events,
            "retainedEvents": self.event_count,
            "maxBytes": self.max_bytes,
        }
        if self.truncated_turns > 0:
            data["truncatedTurns"] = self.truncated_turns
        anchor = self.oldest_record_id
        if anchor is not None:
            data["recordId"] = anchor
        data["fullTranscriptAvailable"] = full_transcript_available
        return data

    def snapshot(self, *, full_transcript_available: bool) -> list[bytes]:
        """The retained events' encodings, oldest first, behind the marker if anything was
        dropped. The marker has no ``scope``, ``promptId`` or ``_meta`` (SPEC §3.2)."""
        out: list[bytes] = []
        data = self.marker(full_transcript_available=full_transcript_available)
        if data is not None:
            out.append(synthetic("history_truncated", data).raw)
        for segment in self._segments:
            out.extend(record.event.raw for record in segment.records)
        return out

    def _push(self, records: Sequence[Record]) -> None:
        if not records:
            raise ValueError("a replay window segment needs at least one event (its terminal)")
        frozen = tuple(records)
        size = sum(record.event.size for record in frozen)
        self._segments.append(_Segment(frozen, size))
        self.total_bytes += size
        self.event_count += len(frozen)

    def _evict(self) -> None:
        segments = self._segments
        while self.total_bytes > self.max_bytes and len(segments) > 1:
            dropped = segments.popleft()
            self.total_bytes -= dropped.size
            self.event_count -= len(dropped.records)
            self.truncated_events += len(dropped.records)
            self.truncated_turns += 1
