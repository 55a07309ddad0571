"""``history_truncated``: its payload (:class:`DaemonHistoryTruncatedData`) and the stricter rules
it is read by: counts written as ``3.0`` are 3, booleans are not numbers, a non-string
``recordId`` is absent, a ``null`` or empty ``scope`` is malformed; ``msgspec.convert(payload,
DaemonHistoryTruncatedData)`` applies them to a wire payload directly, :func:`parse_truncation`
also keeps the keys the type does not name. Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Final, Literal, TypeAlias

import msgspec

from sdk.protocol.constants import LIVE_JOURNAL_SCOPE, REPLAY_WINDOW_EXCEEDED

__all__ = ["DaemonHistoryTruncatedData", "parse_truncation"]

if TYPE_CHECKING:
    _Count: TypeAlias = int
    _OptionalCount: TypeAlias = int | None
    _Scope: TypeAlias = str | None
    _LooseStr: TypeAlias = str | None
else:
    # What msgspec checks on the wire; __post_init__ narrows to the declared types above.
    _Count = int | float
    # The optional fields default to None but do not accept ``null``: a null scope or count
    # is malformed, an absent one is None (and, encoded, None is left out again).
    _OptionalCount = int | float
    _Scope = str
    _LooseStr = Any

_MARKER_KEYS: Final = frozenset(
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


def _count(name: str, value: object, *, optional: bool) -> int | None:
    if value is None and optional:
        return None
    if isinstance(value, bool):
        raise ValueError(f"history_truncated {name} must be an integer >= 0")
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or value < 0:
        raise ValueError(f"history_truncated {name} must be an integer >= 0")
    return value


class DaemonHistoryTruncatedData(
    msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True
):
    """A validated ``history_truncated`` payload (counts are plain ``int``).

    Decodes straight from the wire (``msgspec.convert(payload, DaemonHistoryTruncatedData)``,
    a ``ValidationError`` when malformed) with the rules of the module docstring; direct
    construction enforces the same invariants and raises ``ValueError``. ``extra`` holds the
    keys this type does not name (:func:`sdk._truncation.parse_truncation` fills it).

    The daemon builds its markers from this type; encoded, the fields are in the wire order
    and the ones that are None (or an empty ``extra``) are left out.
    """

    reason: Literal["replay_window_exceeded"]
    scope: _Scope = None
    truncated_events: _Count
    retained_events: _Count
    max_bytes: _Count
    max_events: _OptionalCount = None
    truncated_turns: _OptionalCount = None
    record_id: _LooseStr = None
    full_transcript_available: bool
    extra: dict[str, Any] = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.reason != REPLAY_WINDOW_EXCEEDED:
            raise ValueError(f"history_truncated reason must be {REPLAY_WINDOW_EXCEEDED!r}")
        force = msgspec.structs.force_setattr
        scope: object = self.scope
        if scope is not None and (not isinstance(scope, str) or not scope):
            raise ValueError("history_truncated scope must be a non-empty string when present")
        for name in ("truncated_events", "retained_events", "max_bytes"):
            force(self, name, _count(name, getattr(self, name), optional=False))
        for name in ("max_events", "truncated_turns"):
            force(self, name, _count(name, getattr(self, name), optional=True))
        if not isinstance(self.full_transcript_available, bool):
            raise ValueError("history_truncated fullTranscriptAvailable must be a boolean")
        if not isinstance(self.record_id, str):
            force(self, "record_id", None)

    @property
    def is_live(self) -> bool:
        """True for the live-turn marker (``scope == "live_journal"``)."""
        return self.scope == LIVE_JOURNAL_SCOPE

    @property
    def is_recoverable_live(self) -> bool:
        """A live-turn marker whose complete turn the transcript promises to hold."""
        return self.is_live and self.full_transcript_available


def parse_truncation(data: Any) -> DaemonHistoryTruncatedData | None:
    """Validate a ``history_truncated`` payload; ``None`` when malformed (never raises).

    Keys the type does not name are kept in ``extra`` (and never make a payload malformed).
    """
    if not isinstance(data, dict):
        return None
    known = {k: v for k, v in data.items() if k in _MARKER_KEYS}
    try:
        marker = msgspec.convert(known, DaemonHistoryTruncatedData)
    except msgspec.ValidationError:
        return None
    extra = {k: v for k, v in data.items() if k not in _MARKER_KEYS}
    if extra:
        msgspec.structs.force_setattr(marker, "extra", extra)
    return marker
