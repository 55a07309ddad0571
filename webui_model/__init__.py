"""webui_model: the headless WebUI state (transcript store, reducer, replay, repair commit) and
its provider (the async shell that drives the SDK's client and readers).

``import webui_model`` loads the pure model only: the provider's names (``WebUIProvider``,
``ConnectionState``, ``LoadWarnings``, ``SessionAbandonedError``) load their module, and with it
the SDK's HTTP client and anyio, on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from webui_model.blocks import (
    BLOCK_KINDS,
    Block,
    BlockKind,
    MessageBlock,
    PermissionBlock,
    TextBlock,
    ToolBlock,
    block_id,
    parse_block_id,
)
from webui_model.pagination import (
    DEFAULT_PAGE_SIZE,
    HISTORY_FAILED_CODE,
    PAGINATION_CAPABILITY,
    HistoryPage,
    PageData,
    PageError,
    PageRequest,
    PaginationState,
    after_page,
    after_page_error,
    capacity_rejected,
    initial_pagination,
    is_transient_page_error,
    load_more,
    reanchored,
    replay_anchor,
)
from webui_model.reducer import (
    ASSISTANT_DONE,
    FOLLOWUP_META_KEY,
    ConnectionMetadata,
    FollowUpSuggestion,
    InjectedMessage,
    Notice,
    PendingPromptPublication,
    SideEffect,
    WorkspaceSignal,
    apply_event,
    apply_events,
    first_record_id,
    is_recoverable_live_marker,
    transcript_record_ids,
)
from webui_model.repair_commit import (
    Checkpoint,
    RepairBuild,
    build_repair,
    build_repaired_state,
    make_is_new,
    mirror_page,
    mirror_status,
    take_checkpoint,
)
from webui_model.replay import (
    PageOutcome,
    ReplayResult,
    apply_history_page,
    displayed_record_ids,
    is_hidden_marker,
    replay_snapshot,
    run_events,
    visible_blocks,
)
from webui_model.side_channels import (
    NoticeBoard,
    SideChannels,
    notice_from_repair,
)
from webui_model.store import (
    DEFAULT_MAX_BLOCKS,
    STORE_MAX_BLOCKS,
    StoreState,
    TranscriptDraft,
    TranscriptStore,
    append_block,
    prepend_blocks,
)

if TYPE_CHECKING:
    from webui_model.provider import (
        ConnectionState,
        LoadWarnings,
        SessionAbandonedError,
        WebUIProvider,
    )

_LAZY: dict[str, str] = dict.fromkeys(
    ("ConnectionState", "LoadWarnings", "SessionAbandonedError", "WebUIProvider"),
    "webui_model.provider")


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'webui_model' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "ASSISTANT_DONE",
    "BLOCK_KINDS",
    "DEFAULT_MAX_BLOCKS",
    "DEFAULT_PAGE_SIZE",
    "FOLLOWUP_META_KEY",
    "HISTORY_FAILED_CODE",
    "PAGINATION_CAPABILITY",
    "STORE_MAX_BLOCKS",
    "Block",
    "BlockKind",
    "Checkpoint",
    "ConnectionMetadata",
    "ConnectionState",
    "FollowUpSuggestion",
    "HistoryPage",
    "InjectedMessage",
    "LoadWarnings",
    "MessageBlock",
    "Notice",
    "NoticeBoard",
    "PageData",
    "PageError",
    "PageOutcome",
    "PageRequest",
    "PaginationState",
    "PendingPromptPublication",
    "PermissionBlock",
    "RepairBuild",
    "ReplayResult",
    "SessionAbandonedError",
    "SideChannels",
    "SideEffect",
    "StoreState",
    "TextBlock",
    "ToolBlock",
    "TranscriptDraft",
    "TranscriptStore",
    "WebUIProvider",
    "WorkspaceSignal",
    "after_page",
    "after_page_error",
    "append_block",
    "apply_event",
    "apply_events",
    "apply_history_page",
    "block_id",
    "build_repair",
    "build_repaired_state",
    "capacity_rejected",
    "displayed_record_ids",
    "first_record_id",
    "initial_pagination",
    "is_hidden_marker",
    "is_recoverable_live_marker",
    "is_transient_page_error",
    "load_more",
    "make_is_new",
    "mirror_page",
    "mirror_status",
    "notice_from_repair",
    "parse_block_id",
    "prepend_blocks",
    "reanchored",
    "replay_anchor",
    "replay_snapshot",
    "run_events",
    "take_checkpoint",
    "transcript_record_ids",
    "visible_blocks",
]
