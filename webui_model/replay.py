"""Snapshot replay and history pages, built off-store.

Both produce a complete :class:`~webui_model.store.StoreState` that the provider commits with
one ``store.reset``; nothing here touches a live store.

- :func:`replay_snapshot` rebuilds ``compactedReplay`` then ``liveJournal``. It is built
  unbounded and committed with the *effective* cap ``max(configured, replay size)``, so an
  oversized initial replay is kept whole. While replaying it captures the state just before
  the first recoverable live marker: the raw material of a repair checkpoint.
- :func:`apply_history_page` prepends an older transcript page: events whose record ids are
  all displayed already are dropped, and a page that would exceed the store's cap is rejected
  whole.
- :func:`visible_blocks` hides a replay-history marker (no ``scope``,
  ``fullTranscriptAvailable``) while older pages can be loaded, and once they all are; a live
  marker is never hidden.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import msgspec

from sdk.protocol.envelope import DaemonEvent, read_payload
from sdk.protocol.events import parse_truncation
from webui_model.blocks import Block, MessageBlock
from webui_model.draft import StoreState, TranscriptDraft, prepend_blocks
from webui_model.effects import SideEffect
from webui_model.pagination import (
    DEFAULT_PAGE_SIZE,
    PageData,
    PaginationState,
    after_page,
    capacity_rejected,
    initial_pagination,
)
from webui_model.records import is_recoverable_live_marker, transcript_record_ids
from webui_model.reducer import apply_event, apply_typed, settle_streaming

EffectFilter = Callable[[int, DaemonEvent], bool]
"""``(index in the replayed list, event) -> keep its side effects?``"""


class EventRun(msgspec.Struct, frozen=True, kw_only=True):
    """What :func:`run_events` saw besides the draft's new contents."""

    side_effects: tuple[SideEffect, ...] = ()
    marker_state: StoreState | None = None
    """The draft just before the first recoverable live marker (cap/pagination not final)."""
    marker_block_id: str | None = None
    marker_event: DaemonEvent | None = None


def run_events(
    draft: TranscriptDraft,
    events: Sequence[DaemonEvent],
    *,
    keep_effects: EffectFilter | None = None,
    capture_marker: bool = True,
) -> EventRun:
    """Reduce ``events`` into ``draft``, trimming after each, like a store dispatch would.

    Side effects are kept where ``keep_effects(index, event)`` holds (all when None).
    """
    effects: list[SideEffect] = []
    marker_state: StoreState | None = None
    marker_block_id: str | None = None
    marker_event: DaemonEvent | None = None
    # An unbounded draft (a snapshot replay) never trims, so it is not asked after every event.
    trim = draft.trim if draft.max_blocks is not None else None
    for index, event in enumerate(events):
        if (
            capture_marker
            and marker_event is None
            and event.type == "history_truncated"  # the check inlined: most events are not
            and is_recoverable_live_marker(event)
        ):
            before = len(draft.blocks)
            pre_marker = draft.to_state(max_blocks=draft.max_blocks or max(1, before))
            produced = apply_typed(draft, event, read_payload(event))
            if len(draft.blocks) > before:
                marker_state = pre_marker
                marker_event = event
                marker_block_id = draft.blocks[-1].id
        else:
            # Each event is read once here, so its typed payload is not kept on it (see
            # read_payload).
            produced = apply_typed(draft, event, read_payload(event))
        if trim is not None:
            trim()
        if produced and (keep_effects is None or keep_effects(index, event)):
            effects.extend(produced)
    return EventRun(
        side_effects=tuple(effects),
        marker_state=marker_state,
        marker_block_id=marker_block_id,
        marker_event=marker_event,
    )


class ReplayResult(msgspec.Struct, frozen=True, kw_only=True):
    """A rebuilt snapshot: the state to commit, its side effects, and the pre-marker state."""

    state: StoreState
    side_effects: tuple[SideEffect, ...] = ()
    marker_state: StoreState | None = None
    """State just before the first recoverable live marker, with the final effective cap and
    pagination (what a repair checkpoint holds); None when no such marker was replayed."""
    marker_block_id: str | None = None
    marker_event: DaemonEvent | None = None


def replay_snapshot(
    compacted_replay: Sequence[DaemonEvent],
    live_journal: Sequence[DaemonEvent],
    *,
    configured_max_blocks: int,
    pagination_enabled: bool = False,
    history_has_more: bool = False,
    history_anchor_record_id: str | None = None,
    page_size: int = DEFAULT_PAGE_SIZE,
) -> ReplayResult:
    """Rebuild a load snapshot (``compactedReplay`` then ``liveJournal``) into a store state."""
    if configured_max_blocks < 1:
        raise ValueError(f"configured_max_blocks must be >= 1, got {configured_max_blocks}")
    events = [*compacted_replay, *live_journal]
    pagination = initial_pagination(
        events,
        enabled=pagination_enabled,
        history_has_more=history_has_more,
        history_anchor_record_id=history_anchor_record_id,
        page_size=page_size,
    )
    draft = TranscriptDraft(max_blocks=None, pagination=pagination)
    run = run_events(draft, events)
    cap = max(configured_max_blocks, len(draft))
    marker_state = run.marker_state
    if marker_state is not None:
        marker_state = msgspec.structs.replace(marker_state, max_blocks=cap, pagination=pagination)
    return ReplayResult(
        state=draft.to_state(max_blocks=cap),
        side_effects=run.side_effects,
        marker_state=marker_state,
        marker_block_id=run.marker_block_id,
        marker_event=run.marker_event,
    )


# --- history pages ------------------------------------------------------------------------------


class PageOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """The result of applying one older page: commit ``state`` with one reset."""

    state: StoreState
    page_blocks: tuple[Block, ...] = ()
    """The blocks prepended (empty when rejected); mirror them into a live checkpoint."""
    accepted: bool = True
    dropped_events: int = 0
    """Page events skipped because their record ids are displayed already."""


def displayed_record_ids(blocks: Iterable[Block]) -> set[str]:
    """Every transcript record id some stored block was built from."""
    shown: set[str] = set()
    for block in blocks:
        if block.source_record_ids:
            shown.update(block.source_record_ids)
    return shown


def apply_history_page(
    state: StoreState, page: PageData, *, configured_max_blocks: int
) -> PageOutcome:
    """Prepend ``page`` to ``state``, or reject it whole when it would exceed the cap."""
    shown = displayed_record_ids(state.blocks)
    kept: list[DaemonEvent] = []
    for event in page.events:
        ids = transcript_record_ids(event)
        if ids and all(rid in shown for rid in ids):
            continue
        kept.append(event)
    # Minting from the store's counters keeps page block ids distinct from every stored id.
    draft = TranscriptDraft(max_blocks=None, counters=state.counters)
    for event in kept:
        apply_event(draft, event)
    settle_streaming(draft)
    page_blocks = tuple(draft.blocks)
    dropped = len(page.events) - len(kept)
    total = len(state.blocks) + len(page_blocks)
    if total > state.max_blocks:
        rejected = msgspec.structs.replace(state, pagination=capacity_rejected(state.pagination))
        return PageOutcome(state=rejected, accepted=False, dropped_events=dropped)
    pagination = after_page(
        state.pagination, page, block_count=total, configured_max_blocks=configured_max_blocks
    )
    return PageOutcome(
        state=prepend_blocks(state, page_blocks, pagination=pagination),
        page_blocks=page_blocks,
        dropped_events=dropped,
    )


# --- what is shown ------------------------------------------------------------------------------


def is_hidden_marker(block: Block, pagination: PaginationState) -> bool:
    """A replay-history marker is hidden while older pages can be (or have all been) loaded."""
    if not isinstance(block, MessageBlock) or block.source != "history_truncated":
        return False
    if block.kind != "status":
        return False
    marker = parse_truncation(block.data)  # the block keeps the marker's whole payload
    if marker is None or marker.scope is not None or not marker.full_transcript_available:
        return False
    return pagination.has_more or pagination.history_complete


def visible_blocks(blocks: Iterable[Block], pagination: PaginationState) -> list[Block]:
    """The blocks a transcript view shows, in order."""
    return [block for block in blocks if not is_hidden_marker(block, pagination)]
