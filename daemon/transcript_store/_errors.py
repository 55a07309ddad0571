"""What the transcript raises, and how SQLite says a file is damaged or a statement was cut.

::

    TranscriptSchemaError        the file is not a transcript this daemon can use (untouched)
    └── TranscriptDamagedError   it was one and is damaged: empty, not SQLite, failing a check
    TranscriptDamaged            what a read would return is damaged (``session_id``: whose)
    └── DamagedRow               one row's checksum does not match its values
"""

from __future__ import annotations

import sqlite3
from typing import Final

__all__ = ["DamagedRow", "TranscriptDamaged", "TranscriptDamagedError", "TranscriptSchemaError",
           "is_corruption", "is_interrupt", "unreadable"]

# SQLite's primary result codes for a damaged file and for an interrupted statement.
_SQLITE_CORRUPT: Final = 11
_SQLITE_NOTADB: Final = 26
_SQLITE_INTERRUPT: Final = 9


class TranscriptSchemaError(Exception):
    """The file is not a transcript database this daemon can use. It is left untouched."""


class TranscriptDamagedError(TranscriptSchemaError):
    """The file was a transcript and is damaged (empty, truncated, not SQLite any more, or
    failing ``quick_check``): what is readable can be recovered from it. Left untouched."""


class TranscriptDamaged(Exception):
    """What a read would return is damaged, so it is not returned. ``session_id`` names the
    session it belongs to, ``None`` when the damage is the file's (or its owner unknown)."""

    def __init__(self, session_id: str | None, message: str) -> None:
        super().__init__(message)
        self.session_id = session_id


class DamagedRow(TranscriptDamaged):
    """A row read back is not what was written: its checksum does not match its values (or it
    has none). Raised instead of serving it."""

    def __init__(self, session_id: str | None, table: str, key: int, detail: str = "") -> None:
        where = f"session {session_id}" if session_id else "an unknown session"
        super().__init__(session_id, f"damaged {table} row {key} of {where}"
                         + (f": {detail}" if detail else ""))
        self.table = table
        self.key = key


def unreadable(path: str, exc: BaseException) -> TranscriptDamagedError:
    """The refusal of a file whose first reads fail (not SQLite, or its header damaged)."""
    return TranscriptDamagedError(f"transcript database {path!r} is unreadable or corrupt ({exc}); "
                                  "refusing to open it (the file was not modified)")


def is_corruption(exc: BaseException) -> bool:
    """Is ``exc`` SQLite saying the file is damaged (``SQLITE_CORRUPT``, ``SQLITE_NOTADB``)?"""
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(exc, sqlite3.DatabaseError) and isinstance(code, int):
        return code & 0xFF in (_SQLITE_CORRUPT, _SQLITE_NOTADB)
    return False


def is_interrupt(exc: BaseException) -> bool:
    """Is ``exc`` SQLite saying the statement was cut (``sqlite3_interrupt``)?"""
    return getattr(exc, "sqlite_errorcode", 0) & 0xFF == _SQLITE_INTERRUPT
