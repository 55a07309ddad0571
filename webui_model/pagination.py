"""History pagination state and its rules, as pure values.

The provider does the HTTP; this module only decides *what* to ask for and what the answer
means. Everything here is a function from plain data to a new frozen
:class:`PaginationState`, so a repair checkpoint can hold the state by reference.

Rules:

- Anchor after a snapshot replay: the first transcript record id among the replayed events
  (``update._meta["qwen.session.recordId"]``, else ``update._meta.qwenTranscript
  .sourceRecordIds[0]``), else the first replayed marker's ``recordId``, else the load body's
  ``historyAnchorRecordId``.
- ``has_more`` after a replay = capability ``session_transcript_pagination`` AND
  (``historyHasMore`` OR a replayed valid marker with ``fullTranscriptAvailable``) AND an anchor.
- After a page: the anchor becomes the page's first record id (and the cursor is cleared), else
  the page's ``nextCursor`` becomes the cursor; ``has_more`` = the page's ``hasMore`` AND the
  store holds fewer blocks than the *configured* ``max_blocks``. A page that gives neither a
  record id nor a cursor ends paging, because asking again with the same anchor would return
  the same page forever.
- A page that would push the store past its cap is rejected whole: ``has_more = False``,
  ``capacity_reached = True``.
- Errors: a transport failure (no status), 5xx, 408 and 429 are transient: ``has_more`` stays
  and a ``daemon.transcript_history.failed`` notice is produced. Anything else latches
  ``pagination_error``, which blocks further loads until a *forced* load clears it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final, Protocol

import msgspec
from msgspec import UnsetType

from sdk.protocol.envelope import DaemonEvent
from webui_model.effects import Notice
from webui_model.records import first_record_id, marker_of

PAGINATION_CAPABILITY: Final = "session_transcript_pagination"
DEFAULT_PAGE_SIZE: Final = 100
HISTORY_FAILED_CODE: Final = "daemon.transcript_history.failed"


class PaginationState(msgspec.Struct, frozen=True, kw_only=True):
    """Where older history continues and whether it may be loaded."""

    enabled: bool = False
    """The daemon advertised ``session_transcript_pagination``."""
    anchor_record_id: str | None = None
    cursor: str | None = None
    """An opaque ``nextCursor``; when set it is used instead of the anchor."""
    has_more: bool = False
    capacity_reached: bool = False
    pagination_error: str | None = None
    """Latched non-transient error text; blocks loads until a forced load."""
    loaded_pages: int = 0
    """How many older pages were prepended (the loaded depth)."""
    history_complete: bool = False
    """A page answered ``hasMore: false``: everything older is displayed."""
    page_size: int = DEFAULT_PAGE_SIZE


class PageRequest(msgspec.Struct, frozen=True, kw_only=True):
    """The query of ``GET /session/{id}/transcript`` for the next older page."""

    limit: int
    before_record_id: str | None = None
    cursor: str | None = None


class PageData(Protocol):
    """What a transcript page must offer (the SDK's ``TranscriptPage`` fits as is)."""

    @property
    def events(self) -> Sequence[DaemonEvent]: ...
    @property
    def has_more(self) -> bool: ...
    @property
    def next_cursor(self) -> str | UnsetType | None: ...


class HistoryPage(msgspec.Struct, frozen=True, kw_only=True):
    """A plain transcript page (events already normalized to the bus shape by the SDK)."""

    events: Sequence[DaemonEvent] = ()
    has_more: bool = False
    next_cursor: str | None = None


class PageError(msgspec.Struct, frozen=True, kw_only=True):
    """A failed page request: ``status`` is None for a transport failure (no HTTP answer)."""

    message: str
    status: int | None = None
    code: str | None = None


def replay_anchor(
    events: Iterable[DaemonEvent], history_anchor_record_id: str | None = None
) -> tuple[str | None, bool]:
    """``(anchor, saw_full_marker)`` for a snapshot replay, per the anchor order above."""
    record_anchor: str | None = None
    marker_anchor: str | None = None
    saw_full_marker = False
    for event in events:
        if event.type == "history_truncated":
            marker = marker_of(event)
            if marker is None:
                continue
            if marker.full_transcript_available:
                saw_full_marker = True
            if marker_anchor is None and marker.record_id:
                marker_anchor = marker.record_id
        elif record_anchor is None:
            record_anchor = first_record_id(event)
    anchor = record_anchor or marker_anchor or history_anchor_record_id or None
    return anchor, saw_full_marker


def initial_pagination(
    events: Iterable[DaemonEvent],
    *,
    enabled: bool,
    history_has_more: bool = False,
    history_anchor_record_id: str | None = None,
    page_size: int = DEFAULT_PAGE_SIZE,
) -> PaginationState:
    """The pagination state right after replaying ``compactedReplay`` + ``liveJournal``."""
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    anchor, saw_full_marker = replay_anchor(events, history_anchor_record_id)
    has_more = enabled and (history_has_more or saw_full_marker) and anchor is not None
    return PaginationState(
        enabled=enabled, anchor_record_id=anchor, has_more=has_more, page_size=page_size
    )


def reanchored(
    pagination: PaginationState,
    events: Iterable[DaemonEvent],
    *,
    block_count: int,
    configured_max_blocks: int,
) -> PaginationState:
    """Pagination restarted at the first record id of ``events`` (the repair fallback)."""
    anchor: str | None = None
    for event in events:
        anchor = first_record_id(event)
        if anchor is not None:
            break
    return PaginationState(
        enabled=pagination.enabled,
        anchor_record_id=anchor,
        has_more=pagination.enabled and anchor is not None and block_count < configured_max_blocks,
        page_size=pagination.page_size,
    )


def load_more(
    pagination: PaginationState, *, force: bool = False
) -> tuple[PaginationState, PageRequest | None]:
    """Start a ``load_more``: the (possibly un-latched) state and the request, or no request.

    A forced load clears a latched ``pagination_error`` and retries; an unforced one does
    nothing while the error is latched.
    """
    if pagination.pagination_error is not None:
        if not force:
            return pagination, None
        pagination = msgspec.structs.replace(pagination, pagination_error=None)
    if not pagination.has_more:
        return pagination, None
    if pagination.cursor is not None:
        return pagination, PageRequest(limit=pagination.page_size, cursor=pagination.cursor)
    if pagination.anchor_record_id is not None:
        return pagination, PageRequest(
            limit=pagination.page_size, before_record_id=pagination.anchor_record_id
        )
    return pagination, None


def after_page(
    pagination: PaginationState,
    page: PageData,
    *,
    block_count: int,
    configured_max_blocks: int,
) -> PaginationState:
    """The state after ``page`` was prepended, leaving ``block_count`` blocks in the store."""
    anchor = pagination.anchor_record_id
    cursor: str | None = None
    page_anchor = next(
        (rid for rid in (first_record_id(e) for e in page.events) if rid is not None), None
    )
    if page_anchor is not None:
        anchor = page_anchor
    elif isinstance(page.next_cursor, str) and page.next_cursor:
        cursor = page.next_cursor
    moved = page_anchor is not None or cursor is not None
    return msgspec.structs.replace(
        pagination,
        anchor_record_id=anchor,
        cursor=cursor,
        has_more=page.has_more and moved and block_count < configured_max_blocks,
        loaded_pages=pagination.loaded_pages + 1,
        history_complete=not page.has_more,
        pagination_error=None,
    )


def capacity_rejected(pagination: PaginationState) -> PaginationState:
    """The state after a page was rejected because it would exceed ``max_blocks``."""
    return msgspec.structs.replace(pagination, has_more=False, capacity_reached=True)


def is_transient_page_error(error: PageError) -> bool:
    """Network failures, 5xx, 408 and 429 are worth retrying; everything else is final."""
    status = error.status
    return status is None or status >= 500 or status in (408, 429)


def after_page_error(
    pagination: PaginationState, error: PageError
) -> tuple[PaginationState, Notice | None]:
    """The state after a failed page request, and the notice to show (transient errors)."""
    if is_transient_page_error(error):
        notice = Notice(
            id=HISTORY_FAILED_CODE,
            code=HISTORY_FAILED_CODE,
            severity="warning",
            category="connection",
            operation="load_transcript_page",
            recoverable=True,
            message="Could not load older messages. Try again.",
            debug_message=error.message,
        )
        return pagination, notice
    return msgspec.structs.replace(pagination, pagination_error=error.message), None
