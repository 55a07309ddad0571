"""The pure half of the repair commit.

A :class:`Checkpoint` is the store state just before a replayed recoverable live marker, with
the store's effective cap and pagination state at the time. While the episode lives, loaded
history pages and provider-local status blocks are mirrored into it (:func:`mirror_page`,
:func:`mirror_status`), so the commit neither loses nor duplicates them.

:func:`build_repaired_state` builds the state to commit, off-store:

- marker block still stored → start from the checkpoint and replay only the suffix (the
  target's first user input through the end of the fresh replay) with the checkpoint's cap:
  prefix and history blocks stay the *same objects* with the same ids, and pagination (anchor,
  cursor, ``has_more``, capacity) is the checkpoint's;
- marker block trimmed away → rebuild the whole fresh snapshot bounded by the *configured* cap
  and re-anchor pagination at the fresh snapshot's first record id (no cursor).

Side effects are kept only for events where ``is_new(event)`` holds, and in the fallback never
for events before the suffix start. The provider then commits with one ``store.reset``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

import msgspec

from sdk._repair import is_new_event
from sdk.protocol.envelope import DaemonEvent, event_prompt_id
from webui_model.blocks import Block
from webui_model.draft import StoreState, TranscriptDraft, append_block, prepend_blocks
from webui_model.effects import SideEffect
from webui_model.pagination import PaginationState, reanchored
from webui_model.replay import EventRun, ReplayResult, run_events

IsNew = Callable[[DaemonEvent], bool]


class Checkpoint(msgspec.Struct, frozen=True, kw_only=True):
    """The store just before a recoverable live marker (shares every block object)."""

    state: StoreState
    """Blocks before the marker; ``max_blocks`` is the effective cap when it was taken."""
    marker_block_id: str
    prompt_id: str | None = None
    """The marker's envelope ``promptId`` (None from an older daemon)."""

    @property
    def max_blocks(self) -> int:
        return self.state.max_blocks

    @property
    def pagination(self) -> PaginationState:
        return self.state.pagination


def take_checkpoint(result: ReplayResult) -> Checkpoint | None:
    """The checkpoint a snapshot replay captured, or None when it had no recoverable marker."""
    if result.marker_state is None or result.marker_block_id is None:
        return None
    return Checkpoint(
        state=result.marker_state,
        marker_block_id=result.marker_block_id,
        prompt_id=None if result.marker_event is None else event_prompt_id(result.marker_event),
    )


def mirror_page(
    checkpoint: Checkpoint,
    page_blocks: Sequence[Block],
    *,
    pagination: PaginationState | None = None,
) -> Checkpoint:
    """``checkpoint`` with a loaded history page in front, sharing the page's block objects.

    Pass the store's pagination state after the page (or after a capacity rejection, with no
    blocks) so the commit keeps the anchor, cursor, depth and capacity state. Blocks the
    checkpoint already holds are skipped, so mirroring twice is harmless.
    """
    fresh = [block for block in page_blocks if not checkpoint.state.has_block(block.id)]
    if not fresh and pagination is None:
        return checkpoint
    state = prepend_blocks(checkpoint.state, fresh, pagination=pagination)
    return msgspec.structs.replace(checkpoint, state=state)


def mirror_status(checkpoint: Checkpoint, block: Block) -> Checkpoint:
    """``checkpoint`` with a provider-local status block appended (once)."""
    if checkpoint.state.has_block(block.id):
        return checkpoint
    return msgspec.structs.replace(checkpoint, state=append_block(checkpoint.state, block))


def make_is_new(
    observed_ids: Collection[int], watermark: int | None, highest_live_id: int | None
) -> IsNew:
    """The "is this event new" rule as a predicate over events (the SDK's :func:`sdk._repair.is_new_event`)."""

    def is_new(event: DaemonEvent) -> bool:
        return is_new_event(event.id, observed_ids, watermark, highest_live_id)

    return is_new


class RepairBuild(msgspec.Struct, frozen=True, kw_only=True):
    """The state to commit, the side effects to perform, and a follow-up checkpoint."""

    state: StoreState
    side_effects: tuple[SideEffect, ...] = ()
    from_checkpoint: bool = True
    """False when the marker block had been trimmed and the whole snapshot was rebuilt."""
    checkpoint: Checkpoint | None = None
    """Set when the fresh replay itself holds another recoverable live marker: the checkpoint
    of that separate episode."""


def _next_checkpoint(run: EventRun, state: StoreState) -> Checkpoint | None:
    if run.marker_state is None or run.marker_block_id is None:
        return None
    return Checkpoint(
        state=msgspec.structs.replace(
            run.marker_state, max_blocks=state.max_blocks, pagination=state.pagination
        ),
        marker_block_id=run.marker_block_id,
        prompt_id=None if run.marker_event is None else event_prompt_id(run.marker_event),
    )


def build_repair(
    store_state: StoreState,
    checkpoint: Checkpoint,
    fresh_events: Sequence[DaemonEvent],
    suffix_start: int,
    is_new: IsNew,
    configured_max_blocks: int,
) -> RepairBuild:
    """Build the repaired state off-store (see the module docstring for the two paths)."""
    if not 0 <= suffix_start <= len(fresh_events):
        raise ValueError(
            f"suffix_start {suffix_start} is outside the fresh replay (0..{len(fresh_events)})"
        )
    if configured_max_blocks < 1:
        raise ValueError(f"configured_max_blocks must be >= 1, got {configured_max_blocks}")
    if store_state.has_block(checkpoint.marker_block_id):
        draft = TranscriptDraft.from_state(checkpoint.state)
        run = run_events(
            draft, fresh_events[suffix_start:], keep_effects=lambda _index, event: is_new(event)
        )
        state = draft.to_state()
        return RepairBuild(
            state=state,
            side_effects=run.side_effects,
            checkpoint=_next_checkpoint(run, state),
        )
    draft = TranscriptDraft(max_blocks=configured_max_blocks)
    run = run_events(
        draft,
        fresh_events,
        keep_effects=lambda index, event: index >= suffix_start and is_new(event),
    )
    draft.pagination = reanchored(
        checkpoint.state.pagination,
        fresh_events,
        block_count=len(draft),
        configured_max_blocks=configured_max_blocks,
    )
    state = draft.to_state()
    return RepairBuild(
        state=state,
        side_effects=run.side_effects,
        from_checkpoint=False,
        checkpoint=_next_checkpoint(run, state),
    )


def build_repaired_state(
    store_state: StoreState,
    checkpoint: Checkpoint,
    fresh_events: Sequence[DaemonEvent],
    suffix_start: int,
    is_new: IsNew,
    configured_max_blocks: int,
) -> tuple[StoreState, list[SideEffect]]:
    """``(state to commit with one reset, side effects to perform)``; see :func:`build_repair`."""
    build = build_repair(
        store_state, checkpoint, fresh_events, suffix_start, is_new, configured_max_blocks
    )
    return build.state, list(build.side_effects)
