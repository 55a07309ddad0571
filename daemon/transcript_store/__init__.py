"""The durable transcript: one SQLite file, synchronous and trio-free.

:class:`~daemon.transcript_writer.TranscriptWriter` calls :class:`TranscriptDatabase` from a
worker thread, one call at a time, on the one connection it owns.

What is stored, per session:

- ``sessions``: the daemon session id, its workspace, creation time, the agent's ACP session id
  and whether the session was closed.
- ``raw_events``: every durable event published since the session's last turn boundary (the
  unfinished turn); a row holds one batch's run of a session's events (split into rows of at
  most ``ROW_MAX_BYTES``), and ``event_id`` is the row's last id. A row is either their
  envelopes as the bus encoded them, joined by newlines (it starts with ``{``: the only form
  schema version 1 wrote), or, when the batch has runs of spliced chunks
  (``AppendEvent.run``), a MessagePack array of segments ``[first_id, head, tail, joined]``:
  a run's template and its updates joined by newlines, or ``first_id`` 0 and envelopes joined
  by newlines. Either form reads back as the same envelopes, byte for byte. The row codec (and
  the page cursor) is the pure :mod:`daemon.core.transcript_rows`.
- ``records``: the compacted, record-stamped events of completed turns, each with its
  ``record_id`` and its per-session ``turn`` number (so seeding can keep whole turns and count the
  turns it leaves out).
- ``prompts``: the prompt ledger, ``in_flight`` from admission until its terminal; a prompt sent
  with an ``Idempotency-Key`` also holds the key, its request's digest and its 202 body.

Every row carries ``crc``, the checksum of its values, written with it and checked whenever it
is read: a row whose bytes changed on disk raises :class:`DamagedRow` instead of being served.
Opening the file refuses one that is empty, not SQLite, or fails SQLite's ``quick_check``
(:class:`TranscriptDamagedError`).

The package's private modules, one concept each, composed by :class:`TranscriptDatabase`
(``_store``) over the one connection:

- ``_schema``: the tables, the row checksum rule, the upgrade of an older file;
- ``_file``: opening a file (the refusals, a new file made whole first, the connection's
  settings);
- ``_integrity``: the bounded ``quick_check`` at opening, the full check, the cut;
- ``_writes``: a batch of :data:`Op` values applied in one transaction (what makes group
  commit atomic);
- ``_reads``: sessions, the ledger, pages, what a restore reads;
- ``_errors``: what they raise.

:class:`StoreHooks` is the one seam for fault injection (tests only).
"""

from daemon.core.transcript_ops import (
    TERMINAL_STATES,
    AdmitPrompt,
    AppendEvent,
    DeleteSession,
    FinishTurn,
    KeyedPromptRow,
    MarkClosed,
    Op,
    PromptRow,
    RunTemplate,
    SessionRow,
    StoredPage,
    TerminalState,
    UpsertSession,
)
from daemon.core.transcript_rows import InvalidCursor, events_are_json

from ._errors import (
    DamagedRow,
    TranscriptDamaged,
    TranscriptDamagedError,
    TranscriptSchemaError,
    is_corruption,
)
from ._file import CACHE_BUSY_KIB, CACHE_KIB, PAGE_SIZE, WAL_CHECKPOINT_BYTES
from ._schema import CHECKED_TABLES, INDEX_TABLES, SCHEMA_VERSION
from ._store import StoreHooks, TranscriptDatabase
from ._writes import ROW_MAX_BYTES

__all__ = [
    "CACHE_BUSY_KIB",
    "CACHE_KIB",
    "CHECKED_TABLES",
    "INDEX_TABLES",
    "PAGE_SIZE",
    "ROW_MAX_BYTES",
    "SCHEMA_VERSION",
    "TERMINAL_STATES",
    "WAL_CHECKPOINT_BYTES",
    "AdmitPrompt",
    "AppendEvent",
    "DamagedRow",
    "DeleteSession",
    "FinishTurn",
    "InvalidCursor",
    "KeyedPromptRow",
    "MarkClosed",
    "Op",
    "PromptRow",
    "RunTemplate",
    "SessionRow",
    "StoreHooks",
    "StoredPage",
    "TerminalState",
    "TranscriptDamaged",
    "TranscriptDamagedError",
    "TranscriptDatabase",
    "TranscriptSchemaError",
    "UpsertSession",
    "events_are_json",
    "is_corruption",
]
