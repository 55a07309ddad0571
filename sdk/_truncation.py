"""``history_truncated`` markers: status text and the normalized status item.

The payload type and its validation (:class:`DaemonHistoryTruncatedData`,
:func:`parse_truncation`) are the wire's, in :mod:`sdk.protocol.events`, and re-exported here;
this module adds the exact status text and the status/debug item a UI shows. Pure: no I/O, no
clock.

A malformed payload is never an exception here: :func:`parse_truncation` answers ``None`` and
:func:`normalize_status_item` turns the event into a debug item, so one bad frame from a newer
or broken daemon cannot take a client down.
"""

from __future__ import annotations

from typing import Any, Final, Literal

import msgspec

from sdk.protocol.constants import LIVE_JOURNAL_SCOPE, REPLAY_WINDOW_EXCEEDED
from sdk.protocol.envelope import DaemonEvent
from sdk.protocol.events import DaemonHistoryTruncatedData, parse_truncation

__all__ = [
    "HISTORY_TRUNCATED",
    "LIVE_JOURNAL_SCOPE",
    "MALFORMED_REASON",
    "MALFORMED_TEXT",
    "REPLAY_WINDOW_EXCEEDED",
    "DaemonHistoryTruncatedData",
    "TruncationDebugItem",
    "TruncationStatusItem",
    "normalize_status_item",
    "parse_truncation",
    "status_text",
    "truncation_marker",
]

HISTORY_TRUNCATED: Final = "history_truncated"
MALFORMED_REASON: Final = "malformed_payload"
MALFORMED_TEXT: Final = "history_truncated: malformed history_truncated payload"


def truncation_marker(event: DaemonEvent) -> DaemonHistoryTruncatedData | None:
    """The event's truncation marker, typed: for a ``history_truncated`` event with a valid
    payload, else ``None`` (any other event, or a malformed marker). Never raises.

    The precise type a UI needs for :func:`status_text`::

        marker = truncation_marker(event)
        if marker is not None:
            print(status_text(marker))
    """
    if event.type != HISTORY_TRUNCATED:
        return None
    payload = event.payload
    if isinstance(payload, DaemonHistoryTruncatedData):
        return payload
    return parse_truncation(event.data)


def status_text(marker: DaemonHistoryTruncatedData) -> str:
    """The exact user-facing status text for a validated marker."""
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
    typed = event.payload if event.type == HISTORY_TRUNCATED else parse_truncation(event.data)
    marker = typed if isinstance(typed, DaemonHistoryTruncatedData) else None
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
