"""``history_truncated`` markers: validation, status text and the normalized status item.

CLIENT-SPEC §1.1 (validation) and §1.2 (exact status text). Pure: no I/O, no clock.

A malformed payload is never an exception here: :func:`parse_truncation` answers ``None`` and
:func:`normalize_status_item` turns the event into a debug item, so one bad frame from a newer
or broken daemon cannot take a client down.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Final, Literal, TypeGuard

import msgspec

if TYPE_CHECKING:
    from sdk.events import DaemonEvent

REPLAY_WINDOW_EXCEEDED: Final = "replay_window_exceeded"
LIVE_JOURNAL_SCOPE: Final = "live_journal"
HISTORY_TRUNCATED: Final = "history_truncated"
MALFORMED_REASON: Final = "malformed_payload"
MALFORMED_TEXT: Final = "history_truncated: malformed history_truncated payload"

_KNOWN_KEYS: Final = frozenset(
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


def _is_count(value: object) -> TypeGuard[int | float]:
    # JSON has one number type, so 3.0 is the integer 3; booleans are not numbers here.
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return value >= 0
    if isinstance(value, float):
        return math.isfinite(value) and value.is_integer() and value >= 0
    return False


class DaemonHistoryTruncatedData(msgspec.Struct, frozen=True, kw_only=True):
    """A validated ``history_truncated`` payload (counts are plain ``int``).

    Construct it with :func:`parse_truncation`; direct construction enforces the same
    invariants and raises ``ValueError`` on a violation.
    """

    reason: Literal["replay_window_exceeded"]
    truncated_events: int
    retained_events: int
    max_bytes: int
    full_transcript_available: bool
    scope: str | None = None
    max_events: int | None = None
    truncated_turns: int | None = None
    record_id: str | None = None
    extra: dict[str, Any] = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.reason != REPLAY_WINDOW_EXCEEDED:
            raise ValueError(f"history_truncated reason must be {REPLAY_WINDOW_EXCEEDED!r}")
        if self.scope is not None and (not isinstance(self.scope, str) or not self.scope):
            raise ValueError("history_truncated scope must be a non-empty string when present")
        for name in ("truncated_events", "retained_events", "max_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"history_truncated {name} must be an integer >= 0")
        for name in ("max_events", "truncated_turns"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 0
            ):
                raise ValueError(f"history_truncated {name} must be an integer >= 0 when present")
        if not isinstance(self.full_transcript_available, bool):
            raise ValueError("history_truncated fullTranscriptAvailable must be a boolean")

    @property
    def is_live(self) -> bool:
        """True for the live-turn marker (``scope == "live_journal"``)."""
        return self.scope == LIVE_JOURNAL_SCOPE

    @property
    def is_recoverable_live(self) -> bool:
        """A live-turn marker whose complete turn the transcript promises to hold."""
        return self.is_live and self.full_transcript_available


def parse_truncation(data: Any) -> DaemonHistoryTruncatedData | None:
    """Validate a ``history_truncated`` payload per CLIENT-SPEC §1.1; ``None`` when malformed."""
    if not isinstance(data, dict):
        return None
    if data.get("reason") != REPLAY_WINDOW_EXCEEDED:
        return None
    scope: str | None = None
    if "scope" in data:
        raw_scope = data["scope"]
        if not isinstance(raw_scope, str) or not raw_scope:
            return None
        scope = raw_scope
    counts: dict[str, int] = {}
    for key in ("truncatedEvents", "retainedEvents", "maxBytes"):
        value = data.get(key)
        if not _is_count(value):
            return None
        counts[key] = int(value)
    optional: dict[str, int | None] = {}
    for key in ("maxEvents", "truncatedTurns"):
        if key not in data:
            optional[key] = None
            continue
        value = data[key]
        if not _is_count(value):
            return None
        optional[key] = int(value)
    full = data.get("fullTranscriptAvailable")
    if not isinstance(full, bool):
        return None
    record_id = data.get("recordId")
    return DaemonHistoryTruncatedData(
        reason=REPLAY_WINDOW_EXCEEDED,
        scope=scope,
        truncated_events=counts["truncatedEvents"],
        retained_events=counts["retainedEvents"],
        max_bytes=counts["maxBytes"],
        max_events=optional["maxEvents"],
        truncated_turns=optional["truncatedTurns"],
        record_id=record_id if isinstance(record_id, str) else None,
        full_transcript_available=full,
        extra={k: v for k, v in data.items() if k not in _KNOWN_KEYS},
    )


def status_text(marker: DaemonHistoryTruncatedData) -> str:
    """The exact user-facing text of CLIENT-SPEC §1.2 for a validated marker."""
    kept = marker.retained_events
    dropped = marker.truncated_events
    full = marker.full_transcript_available
    if marker.scope == LIVE_JOURNAL_SCOPE:
        limits = _limits(marker, "replay entries")
        return (
            f"History truncated for live turn replay: kept the latest {kept} source events and "
            f"dropped {dropped} older source events (limits: {limits}). "
            + (
                "Complete content remains available after the turn finishes."
                if full
                else "Complete content is not available for automatic recovery."
            )
        )
    limits = _limits(marker, "events")
    if marker.scope is None:
        return (
            f"History truncated in replay history: kept the latest {kept} events and "
            f"dropped {dropped} older replay events (limits: {limits}). "
            + (
                "Older content remains available from the full transcript."
                if full
                else "Older content is not available from a full transcript."
            )
        )
    return (
        f"History truncated: kept the latest {kept} events and dropped {dropped} older replay "
        f"events (limits: {limits}). "
        + (
            "Full transcript content remains available."
            if full
            else "Full transcript content is not available."
        )
    )


def _limits(marker: DaemonHistoryTruncatedData, unit: str) -> str:
    if marker.max_events is None:
        return f"{marker.max_bytes} bytes"
    return f"{marker.max_events} {unit} / {marker.max_bytes} bytes"


class TruncationStatusItem(msgspec.Struct, frozen=True, kw_only=True):
    """A valid marker, ready for a ``status`` block. ``data`` is the daemon payload, untouched."""

    text: str
    data: dict[str, Any]
    marker: DaemonHistoryTruncatedData
    prompt_id: str | None = None
    event_id: int | None = None
    source: Literal["history_truncated"] = HISTORY_TRUNCATED
    kind: Literal["status"] = "status"


class TruncationDebugItem(msgspec.Struct, frozen=True, kw_only=True):
    """A malformed marker, shown as one ``debug`` item (the raw payload kept as ``data``)."""

    data: Any
    prompt_id: str | None = None
    event_id: int | None = None
    text: str = MALFORMED_TEXT
    reason: Literal["malformed_payload"] = MALFORMED_REASON
    source: Literal["history_truncated"] = HISTORY_TRUNCATED
    kind: Literal["debug"] = "debug"


def normalize_status_item(event: DaemonEvent) -> TruncationStatusItem | TruncationDebugItem:
    """Turn a ``history_truncated`` event into its status item, or a debug item if malformed."""
    prompt_id = event.prompt_id if isinstance(event.prompt_id, str) and event.prompt_id else None
    marker = parse_truncation(event.data)
    if marker is None:
        return TruncationDebugItem(data=event.data, prompt_id=prompt_id, event_id=event.id)
    payload: dict[str, Any] = event.data
    return TruncationStatusItem(
        text=status_text(marker),
        data=payload,
        marker=marker,
        prompt_id=prompt_id,
        event_id=event.id,
    )
