"""Live-journal repair: the pure rules.

When a load snapshot shows a recoverable live-turn marker, the visible tail of that turn is
incomplete. After the turn's formal terminal the daemon's compacted turn is complete again, so
one same-session memory-replay load can restore it without another model request. This module
decides *whether* and *what*: the target, the episode's state machine and guards, the validation
of the fresh snapshot, and which replayed events may repeat their side effects. The Trio driver
(pause, load, commit or resume) lives elsewhere and owns every lifetime.

Pure: no trio import, no clock, no I/O.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Collection, Iterable, Sequence
from typing import Any, Final, Literal

import msgspec

from sdk._errors import DaemonError
from sdk._truncation import DaemonHistoryTruncatedData, parse_truncation
from sdk.protocol.constants import TERMINAL_TYPES
from sdk.protocol.envelope import DaemonEvent, event_prompt_id
from sdk.protocol.events import SessionUpdateData

HISTORY_TRUNCATED: Final = "history_truncated"

DEGRADED_TEXT: Final = "Fresh replay is degraded"
INCOMPLETE_TEXT: Final = "Fresh replay does not contain the complete target turn"

NOTICE_CODE: Final = "daemon.live_journal_repair.failed"
NOTICE_MESSAGE: Final = "Could not restore the complete turn. The retained replay remains visible."


# --- target detection -----------------------------------------------------------------------


class RepairTarget(msgspec.Struct, frozen=True):
    """What to repair: the live marker, the prompt it belongs to, and the episode signature."""

    marker: DaemonEvent
    prompt_id: str
    signature: str
    marker_data: DaemonHistoryTruncatedData


def _recoverable_live_marker(event: DaemonEvent) -> DaemonHistoryTruncatedData | None:
    if event.type != HISTORY_TRUNCATED:
        return None
    marker = parse_truncation(event.data)
    if marker is None or not marker.is_recoverable_live:
        return None
    return marker


def _format_count(value: Any) -> str:
    if isinstance(value, bool):
        return "unknown"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float) and math.isfinite(value):
        return str(int(value)) if value.is_integer() else repr(value)
    return "unknown"


def repair_signature(
    session_id: str, prompt_id: str, last_event_id: int | None, truncated_events: Any
) -> str:
    """``session:prompt:<last_event_id|unknown>:<truncatedEvents|unknown>`` (0 stays ``0``)."""
    cursor = (
        str(last_event_id)
        if isinstance(last_event_id, int) and not isinstance(last_event_id, bool)
        else "unknown"
    )
    return f"{session_id}:{prompt_id}:{cursor}:{_format_count(truncated_events)}"


def find_repair_target(
    session_id: str,
    live_journal: Sequence[DaemonEvent],
    last_event_id: int | None,
    degraded: bool,
) -> RepairTarget | None:
    """The repair target of a load snapshot's live journal, or ``None`` (no automatic repair)."""
    if degraded:
        return None
    found: tuple[DaemonEvent, DaemonHistoryTruncatedData] | None = None
    for event in live_journal:
        marker = _recoverable_live_marker(event)
        if marker is not None:
            found = (event, marker)
            break
    if found is None:
        return None
    event, marker = found
    prompt_id = event.prompt_id if isinstance(event.prompt_id, str) and event.prompt_id else None
    if prompt_id is None:
        # An older daemon does not stamp the marker: accept only an unambiguous retained tail.
        ids = {
            pid
            for other in live_journal
            if other.type != HISTORY_TRUNCATED and (pid := event_prompt_id(other)) is not None
        }
        if len(ids) != 1:
            return None
        (prompt_id,) = ids
    return RepairTarget(
        marker=event,
        prompt_id=prompt_id,
        signature=repair_signature(session_id, prompt_id, last_event_id, marker.truncated_events),
        marker_data=marker,
    )


# --- fresh-snapshot validation ----------------------------------------------------------------


def _is_user_input(event: DaemonEvent) -> bool:
    payload = event.payload
    return isinstance(payload, SessionUpdateData) and payload.kind == "user_message_chunk"


def find_suffix_start(events: Sequence[DaemonEvent], prompt_id: str) -> int | None:
    """Index of the target's first user input, if a formal terminal of it follows; else None."""
    start: int | None = None
    for index, event in enumerate(events):
        if start is None:
            if _is_user_input(event) and event_prompt_id(event) == prompt_id:
                start = index
        elif event.type in TERMINAL_TYPES and event_prompt_id(event) == prompt_id:
            return start
    return None


class SuffixResult(msgspec.Struct, frozen=True):
    """A validated fresh replay: all events (compacted then live) and where the suffix starts."""

    events: list[DaemonEvent]
    start: int

    @property
    def suffix(self) -> list[DaemonEvent]:
        """The target's first user input through the end of the fresh replay."""
        return self.events[self.start :]


class RepairValidationError(DaemonError):
    """The fresh snapshot cannot replace the tail. Returned, not raised, by the validator."""

    def __init__(self, reason: Literal["degraded", "incomplete_turn"], message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def validate_fresh_snapshot(
    compacted: Sequence[DaemonEvent],
    live: Sequence[DaemonEvent],
    degraded: bool,
    prompt_id: str,
) -> SuffixResult | RepairValidationError:
    """Check a repair load's snapshot (not degraded; holds the target turn's user input
    and terminal) and locate the suffix to rebuild."""
    if degraded:
        return RepairValidationError("degraded", DEGRADED_TEXT)
    events = [*compacted, *live]
    start = find_suffix_start(events, prompt_id)
    if start is None:
        return RepairValidationError("incomplete_turn", INCOMPLETE_TEXT)
    return SuffixResult(events=events, start=start)


# --- side effects during a rebuild ----------------------------------------------------------


def is_new_event(
    event_id: int | None,
    observed_ids: Collection[int],
    watermark: int | None,
    highest_live_id: int | None,
) -> bool:
    """Whether a replayed event may repeat its side effects.

    New = it has an id, the snapshot did not show it, and it was not delivered live after the
    snapshot (``watermark < id <= highest_live_id``). An id at or below the watermark that the
    snapshot did not show was evicted before the client saw it, so it is new.
    """
    if event_id is None or event_id in observed_ids:
        return False
    return not (
        watermark is not None
        and highest_live_id is not None
        and watermark < event_id <= highest_live_id
    )


# --- the episode --------------------------------------------------------------------------


class RepairState(enum.Enum):
    NONE = "none"
    PENDING = "pending"
    ARMED = "armed"
    RELOADING = "reloading"


class RepairGuards(msgspec.Struct, frozen=True, kw_only=True):
    """What the caller knows right now; an attempt needs every ``*_in_flight`` to be False and
    ``current_session_id`` to be the episode's session."""

    current_session_id: str | None
    load_in_flight: bool = False
    resume_in_flight: bool = False
    navigation_in_flight: bool = False
    page_request_in_flight: bool = False
    local_prompt_in_flight: bool = False


class EpisodeRegistry:
    """Signatures of attempted episodes, so the same loss is repaired at most once."""

    def __init__(self) -> None:
        self._attempted: set[str] = set()

    def was_attempted(self, signature: str) -> bool:
        return signature in self._attempted

    def record_attempt(self, signature: str) -> None:
        self._attempted.add(signature)

    def new_episode(
        self,
        session_id: str,
        target: RepairTarget,
        observed_ids: Iterable[int],
        watermark: int | None,
    ) -> RepairEpisode:
        """An episode for a replayed recoverable marker; it never arms if already attempted."""
        return RepairEpisode(session_id, target, observed_ids, watermark, registry=self)


class RepairEpisode:
    """One repair episode: NONE ← PENDING → ARMED → RELOADING → NONE.

    ``ui_state`` is the UI's slot (checkpoint, marker block id) and ``attempt_scope`` the
    driver's (its cancel scope); this class never looks inside either.
    """

    def __init__(
        self,
        session_id: str,
        target: RepairTarget,
        observed_ids: Iterable[int],
        watermark: int | None,
        *,
        registry: EpisodeRegistry | None = None,
    ) -> None:
        self.session_id = session_id
        self.target = target
        self.observed_ids: frozenset[int] = frozenset(observed_ids)
        self.watermark = watermark
        self.highest_live_id: int | None = None
        self.terminal_seen = False
        self.registry = registry
        self.attempted = registry is not None and registry.was_attempted(target.signature)
        self.state = RepairState.PENDING
        self.ui_state: Any = None
        self.attempt_scope: Any = None

    @property
    def prompt_id(self) -> str:
        return self.target.prompt_id

    @property
    def signature(self) -> str:
        return self.target.signature

    def observe_live(self, event: DaemonEvent) -> bool:
        """Account for one live event; True when it is the terminal that arms the episode.

        ``prompt_cancelled`` does not arm: cancellation ends with a ``turn_complete`` whose
        ``stopReason`` is ``cancelled``, and that one does.
        """
        if event.id is not None and (
            self.highest_live_id is None or event.id > self.highest_live_id
        ):
            self.highest_live_id = event.id
        if (
            self.state is not RepairState.PENDING
            or self.attempted
            or event.type not in TERMINAL_TYPES
            or event_prompt_id(event) != self.target.prompt_id
        ):
            return False
        self.terminal_seen = True
        self.state = RepairState.ARMED
        return True

    def should_attempt(self, guards: RepairGuards) -> bool:
        """All of the episode's guards hold (nothing in flight, terminal seen, not attempted,
        same session): re-check after each trigger point, never on a timer."""
        return (
            self.state is RepairState.ARMED
            and self.terminal_seen
            and not self.attempted
            and guards.current_session_id == self.session_id
            and not guards.load_in_flight
            and not guards.resume_in_flight
            and not guards.navigation_in_flight
            and not guards.page_request_in_flight
            and not guards.local_prompt_in_flight
        )

    def mark_attempted(self) -> None:
        """Call before the repair load is sent: whatever happens next, no second attempt."""
        if self.state is not RepairState.ARMED or self.attempted:
            raise RuntimeError(
                f"repair episode {self.signature!r} cannot start an attempt from "
                f"state {self.state.name} (attempted={self.attempted})"
            )
        self.attempted = True
        self.state = RepairState.RELOADING
        if self.registry is not None:
            self.registry.record_attempt(self.signature)

    def is_new(self, event_id: int | None) -> bool:
        """:func:`is_new_event` with this episode's snapshot ids, watermark and live high mark."""
        return is_new_event(event_id, self.observed_ids, self.watermark, self.highest_live_id)

    def finish(self) -> None:
        """Success, failure or abort: the episode is over."""
        self.state = RepairState.NONE
        self.attempt_scope = None


# --- failure notice ---------------------------------------------------------------------------


class RepairNotice(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    debug_message: str
    severity: Literal["warning"] = "warning"
    category: Literal["connection"] = "connection"
    operation: Literal["load_session"] = "load_session"
    code: Literal["daemon.live_journal_repair.failed"] = NOTICE_CODE
    recoverable: bool = True
    message: str = NOTICE_MESSAGE


def repair_failure_notice(signature: str, error_text: str) -> RepairNotice:
    """The one notice every failed attempt emits (deduplicated by its id)."""
    return RepairNotice(id=f"{NOTICE_CODE}:{signature}", debug_message=error_text)
