"""The transcript's records as data: the write operations, the read rows and the terminal states.

Pure (no sqlite3, no I/O): the bus, the session and :mod:`daemon.core.restore` build these values
and :class:`daemon.transcript_store.TranscriptDatabase` (the SQL over one SQLite file) applies or
returns them. Keeping them here lets a pure core speak about the transcript without importing
the module that does the file I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, Literal, TypeAlias

import msgspec

__all__ = [
    "TERMINAL_STATES",
    "AdmitPrompt",
    "AppendEvent",
    "DeleteSession",
    "FinishTurn",
    "KeyedPromptRow",
    "MarkClosed",
    "Op",
    "PromptRow",
    "RunTemplate",
    "SessionRow",
    "StoredPage",
    "TerminalState",
    "UpsertSession",
]

TerminalState: TypeAlias = Literal["completed", "cancelled", "error", "interrupted"]
TERMINAL_STATES: Final[frozenset[str]] = frozenset(
    {"completed", "cancelled", "error", "interrupted"}
)


# --- write operations ------------------------------------------------------------------------


class UpsertSession(msgspec.Struct, frozen=True):
    """Create the session, or update an existing one: ``workspace_cwd`` is replaced,
    ``agent_session_id`` only when given (``None`` keeps the known one), ``created_at`` is kept,
    and the session is open again (a restore re-opens a session its agent's death closed)."""

    session_id: str
    workspace_cwd: str
    created_at_ms: int
    agent_session_id: str | None = None


class RunTemplate(msgspec.Struct, frozen=True, array_like=True):
    """The envelope every event of a run of spliced text chunks shares: event ``i`` of the run
    is ``{"id":<first_id + i>`` + ``head`` + its ``update`` bytes + ``tail`` (see
    :mod:`daemon.core.frame_codec`)."""

    first_id: int
    head: bytes
    tail: bytes


class AppendEvent(msgspec.Struct, frozen=True, omit_defaults=True):
    """Durable events of the unfinished turn, ending at id ``event_id``.

    Without ``run``, ``raw`` is the bus's encoding of one event, or of several joined by
    newlines (compact JSON never holds one). With ``run``, ``raw`` is the ``update`` bytes of a
    run of spliced chunks joined by newlines, ids ``run.first_id`` to ``event_id``: what the
    envelopes would be, without the template each of them repeats (about a quarter of the
    bytes of a short chunk's envelope)."""

    session_id: str
    event_id: int
    prompt_id: str | None
    raw: bytes
    run: RunTemplate | None = None


class AdmitPrompt(msgspec.Struct, frozen=True, omit_defaults=True):
    """Ledger: the prompt is ``in_flight`` from now on (a second admit is a no-op).

    A prompt sent with an ``Idempotency-Key`` also stores the key, the digest of its request
    body and the 202 body it is answered with (``accepted_event_id``, ``accepted_epoch``; the
    prompt id is the row's): a later request with the key is answered from them, after a
    restart or on another node too (the op log carries these fields)."""

    session_id: str
    prompt_id: str
    at_ms: int
    idempotency_key: str | None = None
    request_digest: str | None = None
    accepted_event_id: int | None = None
    accepted_epoch: str | None = None


class FinishTurn(msgspec.Struct, frozen=True):
    """The turn boundary: store the compacted turn's ``(record_id, raw)`` records in order,
    latch the ledger terminal (when ``prompt_id`` is given), and delete the session's raw events
    that exist at this point of the batch."""

    session_id: str
    prompt_id: str | None
    terminal: TerminalState
    stop_reason: str | None
    at_ms: int
    records: Sequence[tuple[str, bytes]] = ()


class DeleteSession(msgspec.Struct, frozen=True):
    """Remove the session and everything stored for it."""

    session_id: str


class MarkClosed(msgspec.Struct, frozen=True):
    """The session ended (its rows stay, for restore and paging)."""

    session_id: str


Op: TypeAlias = UpsertSession | AppendEvent | AdmitPrompt | FinishTurn | DeleteSession | MarkClosed


# --- read results ----------------------------------------------------------------------------


class SessionRow(msgspec.Struct, frozen=True):
    session_id: str
    workspace_cwd: str
    created_at_ms: int
    agent_session_id: str | None
    closed: bool


class PromptRow(msgspec.Struct, frozen=True):
    session_id: str
    prompt_id: str
    state: str
    stop_reason: str | None
    admitted_at_ms: int | None
    ended_at_ms: int | None


class KeyedPromptRow(msgspec.Struct, frozen=True):
    """The ledger row of a prompt admitted with an idempotency key."""

    prompt_id: str
    idempotency_key: str
    request_digest: str
    accepted_event_id: int
    accepted_epoch: str
    state: str
    stop_reason: str | None
    admitted_at_ms: int | None
    ended_at_ms: int | None


class StoredPage(msgspec.Struct, frozen=True):
    """One transcript page: ``events`` are stored JSON bytes, chronological; records first,
    then (newest page only) the unfinished turn's raw events."""

    events: list[bytes]
    next_cursor: str | None
    has_more: bool
