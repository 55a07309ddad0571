"""The transcript store: the live state, dispatch, reset and listeners.

:class:`TranscriptStore` owns one :class:`~webui_model.draft.TranscriptDraft`, reduces events
into it (:mod:`webui_model.reducer`), keeps the newest ``max_blocks`` blocks after every
dispatch, and notifies listeners once per dispatch or reset. The state value and the draft
themselves live in :mod:`webui_model.draft` (re-exported here).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sdk.protocol.envelope import DaemonEvent
from webui_model.blocks import Block, MessageBlock
from webui_model.draft import (
    DEFAULT_MAX_BLOCKS,
    STORE_MAX_BLOCKS,
    StoreState,
    TranscriptDraft,
    append_block,
    bump_counters,
    prepend_blocks,
)
from webui_model.effects import SideEffect
from webui_model.pagination import PaginationState
from webui_model.reducer import apply_typed

__all__ = [
    "DEFAULT_MAX_BLOCKS",
    "STORE_MAX_BLOCKS",
    "Listener",
    "StoreState",
    "TranscriptDraft",
    "TranscriptStore",
    "append_block",
    "bump_counters",
    "prepend_blocks",
]

Listener = Callable[[], None]


class TranscriptStore:
    """The live transcript: dispatch events, reset to a prepared state, notify listeners."""

    def __init__(self, max_blocks: int = STORE_MAX_BLOCKS) -> None:
        if max_blocks < 1:
            raise ValueError(f"max_blocks must be >= 1, got {max_blocks}")
        self._configured_max_blocks = max_blocks
        self._draft = TranscriptDraft(max_blocks=max_blocks)
        self._listeners: list[Listener] = []
        self._version = 0

    # -- reading -------------------------------------------------------------------------

    @property
    def configured_max_blocks(self) -> int:
        return self._configured_max_blocks

    @property
    def max_blocks(self) -> int:
        """The effective cap: the configured one, or more after an oversized replay."""
        cap = self._draft.max_blocks
        assert cap is not None  # the store's draft is always bounded
        return cap

    @property
    def blocks(self) -> Sequence[Block]:
        """The stored blocks, oldest first (a live view: do not mutate)."""
        return self._draft.blocks

    @property
    def pagination(self) -> PaginationState:
        return self._draft.pagination

    @property
    def version(self) -> int:
        """Incremented once per listener notification."""
        return self._version

    def block(self, block_id: str) -> Block | None:
        return self._draft.get(block_id)

    def tool_block(self, tool_call_id: str) -> Block | None:
        return self._draft.get(self._draft.tools.get(tool_call_id))

    def permission_block(self, request_id: str) -> Block | None:
        return self._draft.get(self._draft.permissions.get(request_id))

    def active_block(self, kind: str) -> Block | None:
        """The block text chunks of ``kind`` (user/assistant/thought) would extend, if any."""
        pointers = {
            "user": self._draft.active_user,
            "assistant": self._draft.active_assistant,
            "thought": self._draft.active_thought,
        }
        if kind not in pointers:
            raise ValueError(f"no active pointer for block kind {kind!r}")
        return self._draft.get(pointers[kind])

    def snapshot_state(self) -> StoreState:
        """A frozen copy of the current state (references only; blocks are shared)."""
        return self._draft.to_state()

    # -- changing ------------------------------------------------------------------------

    def dispatch(self, event: DaemonEvent, *, side_effects: bool = True) -> list[SideEffect]:
        """Reduce one event, trim to ``max_blocks``, notify once; return its side effects.

        ``side_effects=False`` rebuilds state without returning any.
        """
        effects = apply_typed(self._draft, event, event.payload)  # apply_event, one call less
        self._draft.trim()
        self._notify()
        return effects if side_effects else []

    def add_status(
        self,
        text: str,
        *,
        source: str = "provider",
        code: str | None = None,
        data: object = None,
    ) -> MessageBlock:
        """Append a local ``status`` block (e.g. a provider load warning); notify once."""
        block = MessageBlock(
            id=self._draft.new_id("status"), kind="status", text=text, code=code, source=source,
            data=data,
        )
        self._draft.append(block)
        self._draft.trim()
        self._notify()
        return block

    def set_pagination(self, pagination: PaginationState) -> None:
        """Replace only the pagination state (no block changes); notify once."""
        self._draft.pagination = pagination
        self._notify()

    def reset(self, seed: StoreState) -> None:
        """Replace the whole state with ``seed`` in one step: one notification, shared blocks."""
        self._draft = TranscriptDraft.from_state(seed)
        self._notify()

    def clear(self) -> None:
        """Back to an empty store with the configured cap (one notification)."""
        self.reset(StoreState(max_blocks=self._configured_max_blocks))

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener()`` after every change; returns the unsubscribe function."""
        self._listeners.append(listener)

        def unsubscribe() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return unsubscribe

    def _notify(self) -> None:
        self._version += 1
        for listener in tuple(self._listeners):
            listener()
