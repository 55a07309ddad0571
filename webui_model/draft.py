"""The transcript state as a value and as a working copy.

- :class:`StoreState` is a frozen value: a tuple of block objects plus index maps, active
  pointers, ordinal counters, the effective cap and the pagination state. It is what a repair
  checkpoint holds and what :meth:`~webui_model.store.TranscriptStore.reset` consumes. Making
  one copies *references* only; block objects are shared, never copied.
- :class:`TranscriptDraft` is the mutable working form the reducer edits. The store and the
  off-store builders (snapshot replay, history pages, repair rebuilds) all use it.
- :func:`prepend_blocks` / :func:`append_block` make new states from old ones.

Positions are absolute: a block's position never changes while it is stored, trimming the
head just advances ``base`` and prepending lowers it. So trimming costs O(evicted blocks), not
O(stored blocks), and index maps never need renumbering.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Final

import msgspec

from webui_model.blocks import (
    Block,
    PermissionBlock,
    ToolBlock,
    block_id,
    parse_block_id,
)
from webui_model.pagination import PaginationState

__all__ = [
    "DEFAULT_MAX_BLOCKS",
    "STORE_MAX_BLOCKS",
    "StoreState",
    "TranscriptDraft",
    "append_block",
    "bump_counters",
    "prepend_blocks",
]

DEFAULT_MAX_BLOCKS: Final = 200_000
"""The WebUI model's default cap."""
STORE_MAX_BLOCKS: Final = 1_000
"""The default cap of a bare :class:`TranscriptStore`."""


class StoreState(msgspec.Struct, frozen=True, kw_only=True):
    """A complete, immutable store state (shares block objects with whoever made it)."""

    blocks: tuple[Block, ...] = ()
    base: int = 0
    """Absolute position of ``blocks[0]``."""
    positions: Mapping[str, int] = msgspec.field(default_factory=dict)
    """Block id → absolute position."""
    tools: Mapping[str, str] = msgspec.field(default_factory=dict)
    """Tool call id → block id (``"plan"`` → the newest plan block)."""
    permissions: Mapping[str, str] = msgspec.field(default_factory=dict)
    """Permission request id → block id."""
    in_flight_tools: Mapping[str, None] = msgspec.field(default_factory=dict)
    """Ids of tool blocks whose status is not terminal (an insertion-ordered set)."""
    active_user: str | None = None
    active_assistant: str | None = None
    active_thought: str | None = None
    counters: Mapping[str, int] = msgspec.field(default_factory=dict)
    """Per-kind ordinal of the last block id minted."""
    open_prompt_id: str | None = None
    """The prompt whose turn is running (set by its events, cleared by its terminal)."""
    max_blocks: int = STORE_MAX_BLOCKS
    """The effective cap (may exceed the configured one after an oversized replay)."""
    pagination: PaginationState = msgspec.field(default_factory=PaginationState)

    def block(self, block_id: str) -> Block | None:
        """The block with ``block_id``, or None when it is not (or no longer) stored."""
        position = self.positions.get(block_id)
        return None if position is None else self.blocks[position - self.base]

    def has_block(self, block_id: str) -> bool:
        return block_id in self.positions

    def __len__(self) -> int:
        return len(self.blocks)


class TranscriptDraft:
    """The mutable state the reducer edits; freeze it with :meth:`to_state`."""

    __slots__ = (
        "active_assistant",
        "active_thought",
        "active_user",
        "base",
        "blocks",
        "counters",
        "in_flight_tools",
        "max_blocks",
        "open_prompt_id",
        "pagination",
        "permissions",
        "positions",
        "tools",
    )

    def __init__(
        self,
        *,
        max_blocks: int | None,
        pagination: PaginationState | None = None,
        counters: Mapping[str, int] | None = None,
    ) -> None:
        if max_blocks is not None and max_blocks < 1:
            raise ValueError(f"max_blocks must be >= 1, got {max_blocks}")
        self.blocks: list[Block] = []
        self.base = 0
        self.positions: dict[str, int] = {}
        self.tools: dict[str, str] = {}
        self.permissions: dict[str, str] = {}
        self.in_flight_tools: dict[str, None] = {}
        self.active_user: str | None = None
        self.active_assistant: str | None = None
        self.active_thought: str | None = None
        self.counters: dict[str, int] = dict(counters or {})
        self.open_prompt_id: str | None = None
        self.max_blocks = max_blocks
        self.pagination = pagination if pagination is not None else PaginationState()

    @classmethod
    def from_state(cls, state: StoreState, *, max_blocks: int | None = None) -> TranscriptDraft:
        """A draft holding the same block objects as ``state`` (containers are copied).

        ``max_blocks`` defaults to the state's own effective cap.
        """
        draft = cls(
            max_blocks=state.max_blocks if max_blocks is None else max_blocks,
            pagination=state.pagination,
            counters=state.counters,
        )
        draft.blocks = list(state.blocks)
        draft.base = state.base
        draft.positions = dict(state.positions)
        draft.tools = dict(state.tools)
        draft.permissions = dict(state.permissions)
        draft.in_flight_tools = dict(state.in_flight_tools)
        draft.active_user = state.active_user
        draft.active_assistant = state.active_assistant
        draft.active_thought = state.active_thought
        draft.open_prompt_id = state.open_prompt_id
        return draft

    def to_state(self, *, max_blocks: int | None = None) -> StoreState:
        """Freeze into a :class:`StoreState` (an unbounded draft needs ``max_blocks``)."""
        cap = max_blocks if max_blocks is not None else self.max_blocks
        if cap is None:
            raise ValueError("an unbounded draft needs an explicit max_blocks to freeze")
        return StoreState(
            blocks=tuple(self.blocks),
            base=self.base,
            positions=dict(self.positions),
            tools=dict(self.tools),
            permissions=dict(self.permissions),
            in_flight_tools=dict(self.in_flight_tools),
            active_user=self.active_user,
            active_assistant=self.active_assistant,
            active_thought=self.active_thought,
            counters=dict(self.counters),
            open_prompt_id=self.open_prompt_id,
            max_blocks=cap,
            pagination=self.pagination,
        )

    def __len__(self) -> int:
        return len(self.blocks)

    def get(self, block_id: str | None) -> Block | None:
        if block_id is None:
            return None
        position = self.positions.get(block_id)
        return None if position is None else self.blocks[position - self.base]

    def new_id(self, kind: str) -> str:
        ordinal = self.counters.get(kind, 0) + 1
        self.counters[kind] = ordinal
        return block_id(kind, ordinal)

    def append(self, block: Block) -> None:
        if block.id in self.positions:
            raise ValueError(f"duplicate block id {block.id!r}")
        self.positions[block.id] = self.base + len(self.blocks)
        self.blocks.append(block)

    def replace(self, block: Block) -> None:
        """Swap in a new version of a stored block (copy-on-write update)."""
        position = self.positions.get(block.id)
        if position is None:
            raise KeyError(f"no stored block {block.id!r} to replace")
        self.blocks[position - self.base] = block

    def trim(self) -> list[Block]:
        """Drop the oldest blocks beyond ``max_blocks``; return them (oldest first)."""
        cap = self.max_blocks
        excess = 0 if cap is None else len(self.blocks) - cap
        if excess <= 0:
            return []
        evicted = self.blocks[:excess]
        del self.blocks[:excess]
        self.base += excess
        for block in evicted:
            self._forget(block)
        return evicted

    def _forget(self, block: Block) -> None:
        bid = block.id
        del self.positions[bid]
        self.in_flight_tools.pop(bid, None)
        if isinstance(block, ToolBlock) and self.tools.get(block.tool_call_id) == bid:
            del self.tools[block.tool_call_id]
        elif isinstance(block, PermissionBlock) and self.permissions.get(block.request_id) == bid:
            del self.permissions[block.request_id]
        if self.active_user == bid:
            self.active_user = None
        if self.active_assistant == bid:
            self.active_assistant = None
        if self.active_thought == bid:
            self.active_thought = None


def bump_counters(counters: Mapping[str, int], blocks: Iterable[Block]) -> dict[str, int]:
    """Counters advanced past every id in ``blocks``, so new ids never collide with them."""
    bumped = dict(counters)
    for block in blocks:
        kind, ordinal = parse_block_id(block.id)
        if ordinal > bumped.get(kind, 0):
            bumped[kind] = ordinal
    return bumped


def prepend_blocks(
    state: StoreState, blocks: Sequence[Block], *, pagination: PaginationState | None = None
) -> StoreState:
    """``state`` with older ``blocks`` in front (a history page), sharing every block object.

    Index entries of the newer blocks win over the prepended ones; prepended tools are never
    "in flight" (history cannot be cancelled by a later turn end).
    """
    new_base = state.base - len(blocks)
    positions = dict(state.positions)
    tools = dict(state.tools)
    permissions = dict(state.permissions)
    for offset, block in enumerate(blocks):
        if block.id in positions:
            raise ValueError(f"prepended block id {block.id!r} is already stored")
        positions[block.id] = new_base + offset
        if isinstance(block, ToolBlock):
            tools.setdefault(block.tool_call_id, block.id)
        elif isinstance(block, PermissionBlock):
            permissions.setdefault(block.request_id, block.id)
    return msgspec.structs.replace(
        state,
        blocks=(*blocks, *state.blocks),
        base=new_base,
        positions=positions,
        tools=tools,
        permissions=permissions,
        counters=bump_counters(state.counters, blocks),
        pagination=state.pagination if pagination is None else pagination,
    )


def append_block(state: StoreState, block: Block) -> StoreState:
    """``state`` with ``block`` appended at the end (not trimmed; no pointer changes)."""
    draft = TranscriptDraft.from_state(state)
    draft.append(block)
    draft.counters = bump_counters(draft.counters, (block,))
    return draft.to_state()
