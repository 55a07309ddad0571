"""Rate-limited logging. Pure: the caller passes the clock.

A condition a hostile or broken client can trigger at will (a request body that never arrives,
say) must not turn the log into a flood: the first occurrence is logged, later ones are only
counted, and one summary line per interval says how many there were (:class:`LogThrottle`).
A stream of lines another process writes (an agent's stderr) is logged within a budget of lines
and bytes per second (:class:`LineBudget`); the rest is counted and reported in one line.
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

    def flush(self, now: float) -> int | None:
        """The occurrences not logged yet, if a line is due at time ``now`` (none was written
        for an interval); ``None`` otherwise. Called periodically, so that the last ones of a
        burst are reported too."""
        if self._pending == 0 or (self._last is not None and now - self._last < self.interval_s):
            return None
        count, self._pending, self._last = self._pending, 0, now
        return count


class LineBudget:
    """A token bucket of lines and bytes: how much of a stream (an agent's stderr) may be
    logged. Each allowance refills at its rate per second up to its burst; a line is logged
    only if both allowances cover it, else it is counted as dropped. The caller reports the
    drops with :meth:`take_dropped` (one line saying how many) at a moment it chooses.
    """

    __slots__ = ("_bytes", "_last", "_lines", "byte_burst", "bytes_per_s", "dropped_bytes",
                 "dropped_lines", "line_burst", "lines_per_s")

    def __init__(self, *, lines_per_s: float, line_burst: int, bytes_per_s: float,
                 byte_burst: int) -> None:
        if min(lines_per_s, line_burst, bytes_per_s, byte_burst) <= 0:
            raise ValueError("rates and bursts must be positive")
        self.lines_per_s = lines_per_s
        self.line_burst = line_burst
        self.bytes_per_s = bytes_per_s
        self.byte_burst = byte_burst
        self._lines = float(line_burst)
        self._bytes = float(byte_burst)
        self._last: float | None = None
        self.dropped_lines = 0
        self.dropped_bytes = 0

    def allow(self, now: float, size: int) -> bool:
        """Whether a line of ``size`` bytes read at ``now`` may be logged (and charge it)."""
        last, self._last = self._last, now
        if last is not None and now > last:
            elapsed = now - last
            self._lines = min(float(self.line_burst), self._lines + elapsed * self.lines_per_s)
            self._bytes = min(float(self.byte_burst), self._bytes + elapsed * self.bytes_per_s)
        if self._lines >= 1 and self._bytes >= size:
            self._lines -= 1
            self._bytes -= size
            return True
        self.dropped_lines += 1
        self.dropped_bytes += size
        return False

    def take_dropped(self) -> tuple[int, int]:
        """The lines and bytes dropped since the last call, and reset the counts."""
        dropped = self.dropped_lines, self.dropped_bytes
        self.dropped_lines = self.dropped_bytes = 0
        return dropped
