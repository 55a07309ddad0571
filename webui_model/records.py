"""What the model reads off replayed events to page history: record ids and markers.

Compacted ``session_update``\\ s carry their transcript record id
(``update._meta["qwen.session.recordId"]``, and ``update._meta.qwenTranscript.sourceRecordIds``);
``history_truncated`` markers may carry a ``recordId`` anchor. Both are read from the typed
payload (:attr:`~sdk.protocol.envelope.DaemonEvent.payload`), never from raw dicts.

Pure: no I/O.
"""

from __future__ import annotations

from typing import Any

from sdk.protocol.envelope import DaemonEvent, record_ids_of
from sdk.protocol.events import DaemonHistoryTruncatedData

__all__ = [
    "first_record_id",
    "is_recoverable_live_marker",
    "marker_of",
    "transcript_record_ids",
    "valid_marker_payload",
]


def transcript_record_ids(event: DaemonEvent) -> tuple[str, ...]:
    """The transcript record ids stamped on a compacted ``session_update`` (may be empty)."""
    return record_ids_of(event)


def first_record_id(event: DaemonEvent) -> str | None:
    """``update._meta["qwen.session.recordId"]``, else ``qwenTranscript.sourceRecordIds[0]``."""
    ids = transcript_record_ids(event)
    return ids[0] if ids else None


def marker_of(event: DaemonEvent) -> DaemonHistoryTruncatedData | None:
    """The validated marker of a ``history_truncated`` event, else None (malformed or other)."""
    if event.type != "history_truncated":
        return None
    payload = event.payload
    return payload if isinstance(payload, DaemonHistoryTruncatedData) else None


def valid_marker_payload(event: DaemonEvent) -> dict[str, Any] | None:
    """The complete daemon payload of a *valid* ``history_truncated`` event, else None."""
    if marker_of(event) is None:
        return None
    payload: dict[str, Any] = event.data
    return payload


def is_recoverable_live_marker(event: DaemonEvent) -> bool:
    """A valid live-turn marker with ``fullTranscriptAvailable: true``."""
    marker = marker_of(event)
    return marker is not None and marker.is_recoverable_live
