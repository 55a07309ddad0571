"""Rate-limited logging of a recurring condition. Pure: the caller passes the clock.

A condition a hostile or broken client can trigger at will (a request body that never arrives,
say) must not turn the log into a flood: the first occurrence is logged, later ones are only
counted, and one summary line per interval says how many there were.
"""

from __future__ import annotations


class LogThrottle:
    """Decides when an occurrence of one condition gets a log line."""

    __slots__ = ("_last", "_pending", "interval_s", "total")

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.total = 0
        self._pending = 0
        self._last: float | None = None

    def note(self, now: float) -> int | None:
        """Count one occurrence at time ``now``. Returns how many occurrences the log line to
        write now covers (this one and those suppressed since the last line), or ``None`` when
        no line is due."""
        self.total += 1
        self._pending += 1
        if self._last is not None and now - self._last < self.interval_s:
            return None
        count, self._pending, self._last = self._pending, 0, now
        return count
