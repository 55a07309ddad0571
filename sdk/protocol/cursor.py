"""The client's resume cursor: which event it has, in which bus epoch.

Rules (one implementation; the SSE stream, the WebSocket stream and the session handle all use
:class:`ResumeCursor`):

- the cursor (``last_event_id``) advances only from frames that carry an ``id``, to
  ``max(previous, id)``; synthetic frames (no id) never move it;
- ``state_resync_required`` with reason ``epoch_reset`` means the bus the cursor counted is gone
  (a new epoch numbers from 1 again, and the daemon now replays the new bus's whole ring), so
  the cursor restarts at 0 before that replay advances it;
- the epoch is the one the daemon answered with (``X-Qwen-Event-Epoch``); a stream that names
  none leaves the kept epoch as it was. Clients send the epoch only together with a cursor.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from sdk.protocol.constants import MAX_EVENT_ID, RESYNC_EPOCH_RESET
from sdk.protocol.envelope import DaemonEvent
from sdk.protocol.events import StateResyncRequiredData

__all__ = ["FollowsCursor", "ResumeCursor", "check_cursor", "is_epoch_reset"]


def check_cursor(value: int | None) -> int | None:
    """``value`` if it is a usable cursor (``None``, or an int in 0..2^53−1), else ValueError.

    ``0`` is a real cursor: it asks for the whole ring.
    """
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_EVENT_ID
    ):
        raise ValueError(f"last_event_id must be an int in 0..2^53-1, got {value!r}")
    return value


def is_epoch_reset(event: DaemonEvent) -> bool:
    """A ``state_resync_required`` saying the bus (and so the id numbering) is a new one."""
    if event.type != "state_resync_required":
        return False
    payload = event.payload
    return isinstance(payload, StateResyncRequiredData) and payload.reason == RESYNC_EPOCH_RESET


class ResumeCursor:
    """``last_event_id`` and ``epoch`` of one subscriber, advanced by :meth:`observe`."""

    __slots__ = ("epoch", "last_event_id")

    def __init__(self, last_event_id: int | None = None, epoch: str | None = None) -> None:
        self.last_event_id: int | None = check_cursor(last_event_id)
        self.epoch: str | None = epoch

    def observe(self, event: DaemonEvent) -> None:
        """Account for one frame handed to the consumer (the rules of the module docstring)."""
        if is_epoch_reset(event):
            self.last_event_id = 0
        ident = event.id
        if ident is not None and (self.last_event_id is None or ident > self.last_event_id):
            self.last_event_id = ident

    def answered(self, epoch: str | None) -> None:
        """The daemon answered a (re)connect with ``epoch``; an empty answer changes nothing."""
        if epoch:
            self.epoch = epoch

    def __repr__(self) -> str:
        return f"ResumeCursor(last_event_id={self.last_event_id!r}, epoch={self.epoch!r})"


class FollowsCursor:
    """A reader that keeps a :class:`ResumeCursor` as ``cursor`` and shows it read-only."""

    cursor: ResumeCursor

    @property
    def last_event_id(self) -> int | None:
        """The cursor: the newest event id handed over (0 after an epoch reset)."""
        return self.cursor.last_event_id

    @property
    def epoch(self) -> str | None:
        """The bus epoch the cursor belongs to (the daemon's latest answer)."""
        return self.cursor.epoch
