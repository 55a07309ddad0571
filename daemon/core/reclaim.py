"""When to hand freed heap memory back to the OS: the decision, without the clock or the call.

Events above Python's small-object size (a text chunk's envelope past ~500 bytes) come from the C
heap. When newer events push them out of the ring and the live journals, they leave free holes
below live objects, and glibc returns memory to the OS only from the top of the heap. Trimming
gives them back, but it costs milliseconds when it releases tens of MB, so it runs once enough
bytes have gone through the buses, when publishing pauses, and at most about once a second
while it does not (figures: benchmarks/README.md, "Figures behind the code").

A trim the churn made due leaves the stream's tail: the bytes published after it free heap too,
and fewer than the minimum would never trim again. That holds for a trim forced while publishing
goes on (the longest delay) and for one at a pause after which the stream resumed (a slow agent,
a busy machine): published bytes understate what they free when small events push big ones out
of the ring. So the first pause after a churn trim trims once more, whatever the churn since: at
most two trims per minimum of churn.

Pure: :class:`ReclaimPolicy` is told the bytes published and the times, and says when to trim.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

__all__ = ["MAX_DELAY_S", "MIN_CHURN_BYTES", "QUIET_S", "ReclaimPolicy"]

#: Published bytes since the last trim below which no trim is worth it (the holes they can leave
#: are at most about this big).
MIN_CHURN_BYTES: Final = 4 * 1024 * 1024
#: Publishing paused this long: the burst is over, trim now.
QUIET_S: Final = 0.05
#: A stream that never pauses still gets a trim this long after the churn passed the minimum.
MAX_DELAY_S: Final = 1.0


@dataclass(slots=True)
class ReclaimPolicy:
    """Counts the bytes published since the last trim and says when the next one is due."""

    min_churn_bytes: int = MIN_CHURN_BYTES
    quiet_s: float = QUIET_S
    max_delay_s: float = MAX_DELAY_S
    churn: int = 0
    _last_note_at: float = 0.0
    _armed_at: float | None = None
    # The last trim was made due by the churn: the next pause after more publishing trims,
    # whatever the churn by then.
    _tail: bool = False
    _tail_at: float | None = None  # the first note of that tail

    def __post_init__(self) -> None:
        if self.min_churn_bytes < 1:
            raise ValueError(f"min_churn_bytes must be >= 1, got {self.min_churn_bytes}")
        if self.quiet_s <= 0 or self.max_delay_s < self.quiet_s:
            raise ValueError("need 0 < quiet_s <= max_delay_s, got "
                             f"{self.quiet_s} and {self.max_delay_s}")

    def note(self, nbytes: int, now: float) -> bool:
        """``nbytes`` were published at ``now``; True when this note is the one that made a
        trim due (the churn just passed the minimum): a waiting caller should wake up."""
        if nbytes <= 0:
            return False
        self.churn += nbytes
        self._last_note_at = now
        if self._armed_at is None:
            if self.churn >= self.min_churn_bytes:
                self._armed_at = now
                return True
            if self._tail and self._tail_at is None:
                self._tail_at = now
                return True
        return False

    def due_at(self) -> float | None:
        """When the next trim is due (it may be in the past), or None while the churn is below
        the minimum. Later notes move it on, up to ``max_delay_s`` after the churn passed the
        minimum. After a trim the churn made due, the next pause is due too."""
        if self._armed_at is not None:
            return min(self._last_note_at + self.quiet_s, self._armed_at + self.max_delay_s)
        if self._tail_at is not None:
            return self._last_note_at + self.quiet_s
        return None

    def trimmed(self, now: float | None = None) -> None:
        """A trim ran (at ``now``, for one this policy made due): count from zero again. One
        the churn made due makes the next pause after more publishing due, whatever the churn
        by then; the trim of that tail, or one asked for, leaves none."""
        self._tail = now is not None and self._armed_at is not None
        self.churn = 0
        self._armed_at = None
        self._tail_at = None
