"""The daemon's wall clock, in the milliseconds the wire carries (``_meta.serverTimestamp``,
``at``, ``createdAt``). One place, so the shells that stamp events take it from here and the
pure cores never read a clock (they are handed the time)."""

from __future__ import annotations

import time

__all__ = ["now_ms"]


def now_ms() -> int:
    """Unix time in milliseconds."""
    return time.time_ns() // 1_000_000
