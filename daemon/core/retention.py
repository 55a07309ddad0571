"""Which stored sessions retention removes, and in what order. Pure.

Closed sessions (``DELETE /session/{id}``: gone for good) are always removed. With
``--retain-days``, so is every session whose last activity (its creation, or its newest
prompt's admission or end) is older than that. With ``--retain-bytes``, further sessions go,
least recently active first, while the transcript is bigger than that. A live session (loaded
in the daemon) is never a candidate, whatever its age.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

import msgspec

__all__ = ["DAY_MS", "RetentionPolicy", "StoredSession", "by_bytes_order", "expired",
           "parse_size"]

DAY_MS = 86_400_000

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3,
          "gb": 1000**3, "t": 1000**4, "tb": 1000**4, "kib": 1024, "mib": 1024**2,
          "gib": 1024**3, "tib": 1024**4}


class StoredSession(msgspec.Struct, frozen=True):
    session_id: str
    closed: bool
    last_activity_ms: int


class RetentionPolicy(msgspec.Struct, frozen=True):
    """``retain_days``/``retain_bytes``: ``None`` is off."""

    retain_days: float | None = None
    retain_bytes: int | None = None


def expired(sessions: Iterable[StoredSession], live: Collection[str],
            policy: RetentionPolicy, now_ms: int) -> list[str]:
    """Sessions to remove whatever the transcript's size: the closed ones, then those idle past
    ``retain_days``, each group least recently active first; never a live one."""
    candidates = sorted((s for s in sessions if s.session_id not in live),
                        key=lambda s: (s.last_activity_ms, s.session_id))
    closed = [s.session_id for s in candidates if s.closed]
    if policy.retain_days is None:
        return closed
    horizon = now_ms - policy.retain_days * DAY_MS
    old = [s.session_id for s in candidates if not s.closed and s.last_activity_ms < horizon]
    return closed + old


def by_bytes_order(sessions: Iterable[StoredSession], live: Collection[str]) -> list[str]:
    """Sessions ``--retain-bytes`` removes while the transcript is too big, in order: least
    recently active first; never a live one."""
    return [s.session_id for s in sorted(
        (s for s in sessions if s.session_id not in live),
        key=lambda s: (s.last_activity_ms, s.session_id))]


def parse_size(raw: str) -> int:
    """``1500000``, ``500M``, ``2GiB``, ``1.5G`` → bytes (SI for K/M/G/T, binary for KiB…).
    Raises ``ValueError`` for anything else or a size below 1."""
    text = raw.strip().lower().replace(" ", "")
    number = text.rstrip("kmgtib")
    unit = text[len(number):]
    if unit not in _UNITS or not number:
        raise ValueError(f"not a size: {raw!r}")
    value = float(number) * _UNITS[unit]
    if not value >= 1:
        raise ValueError(f"not a size: {raw!r}")
    return int(value)
