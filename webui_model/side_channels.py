"""Where the provider puts side effects: the notices list and the side channels.

The reducer returns side effects as values (:mod:`webui_model.reducer`); something has to *do*
them. In the browser that is toasts, a command palette refetch, a follow-up chip. Headless, the
provider records them here, so a test can see exactly which effects fired and how often — which
is how the rebuild's suppression ("observed events do not fire again") becomes observable.

- :class:`NoticeBoard`: the visible notices, deduplicated by ``id`` (a repeat replaces the old
  entry and moves to the end) and capped at the newest ``cap`` (50). ``emitted`` counts every
  :meth:`NoticeBoard.add`, deduplicated or not, so a duplicate emission is still visible.
- :class:`SideChannels`: workspace-signal counters plus the newest ``keep`` entries of each
  channel (follow-up suggestions, mid-turn injected messages, pending-prompt publications,
  connection metadata). Bounded: a long session must not grow without limit.

Pure: no trio import, no clock, no I/O.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Final

from sdk._repair import RepairNotice
from webui_model.effects import (
    ConnectionMetadata,
    FollowUpSuggestion,
    InjectedMessage,
    Notice,
    PendingPromptPublication,
    SideEffect,
    WorkspaceSignal,
)

NOTICE_CAP: Final = 50
CHANNEL_KEEP: Final = 256


def notice_from_repair(notice: RepairNotice) -> Notice:
    """The SDK's repair-failure notice as a model notice (same id, code and texts)."""
    return Notice(
        id=notice.id,
        code=notice.code,
        message=notice.message,
        severity=notice.severity,
        category=notice.category,
        operation=notice.operation,
        recoverable=notice.recoverable,
        debug_message=notice.debug_message,
    )


class NoticeBoard:
    """The notices a UI shows: one per id, newest last, at most ``cap``."""

    def __init__(self, cap: int = NOTICE_CAP) -> None:
        if cap < 1:
            raise ValueError(f"cap must be >= 1, got {cap}")
        self.cap = cap
        self.emitted = 0
        """Every notice ever added, including ones that replaced an entry with the same id."""
        self._by_id: dict[str, Notice] = {}

    def add(self, notice: Notice) -> None:
        self.emitted += 1
        # Re-inserting moves a repeated id to the end: it is the newest news again.
        self._by_id.pop(notice.id, None)
        self._by_id[notice.id] = notice
        while len(self._by_id) > self.cap:
            del self._by_id[next(iter(self._by_id))]

    @property
    def notices(self) -> tuple[Notice, ...]:
        """Oldest first."""
        return tuple(self._by_id.values())

    def get(self, notice_id: str) -> Notice | None:
        return self._by_id.get(notice_id)

    def dismiss(self, notice_id: str) -> bool:
        """Remove one notice; False when it was not shown."""
        return self._by_id.pop(notice_id, None) is not None

    def __len__(self) -> int:
        return len(self._by_id)


class SideChannels:
    """Records every non-notice side effect the provider performed."""

    def __init__(self, keep: int = CHANNEL_KEEP) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.workspace_signal_count = 0
        self.workspace_signals_by_kind: dict[str, int] = {}
        self.workspace_signals: deque[WorkspaceSignal] = deque(maxlen=keep)
        self.follow_ups: deque[FollowUpSuggestion] = deque(maxlen=keep)
        self.injected_messages: deque[InjectedMessage] = deque(maxlen=keep)
        self.pending_prompts: deque[PendingPromptPublication] = deque(maxlen=keep)
        self.connection_metadata: deque[ConnectionMetadata] = deque(maxlen=keep)

    @property
    def latest_follow_up(self) -> FollowUpSuggestion | None:
        return self.follow_ups[-1] if self.follow_ups else None

    def record(self, effect: SideEffect) -> None:
        """Record one effect. A :class:`Notice` belongs on a :class:`NoticeBoard` instead."""
        if isinstance(effect, WorkspaceSignal):
            self.workspace_signal_count += 1
            self.workspace_signals_by_kind[effect.kind] = (
                self.workspace_signals_by_kind.get(effect.kind, 0) + 1
            )
            self.workspace_signals.append(effect)
        elif isinstance(effect, FollowUpSuggestion):
            self.follow_ups.append(effect)
        elif isinstance(effect, InjectedMessage):
            self.injected_messages.append(effect)
        elif isinstance(effect, PendingPromptPublication):
            self.pending_prompts.append(effect)
        elif isinstance(effect, ConnectionMetadata):
            self.connection_metadata.append(effect)
        else:
            raise TypeError(f"not a side-channel effect: {type(effect).__name__}")

    def event_ids(self) -> list[int | None]:
        """The event id of every recorded effect still kept, channel by channel."""
        channels: Iterable[Iterable[SideEffect]] = (
            self.workspace_signals,
            self.follow_ups,
            self.injected_messages,
            self.pending_prompts,
            self.connection_metadata,
        )
        return [effect.event_id for channel in channels for effect in channel]
