"""The public surface, pinned (the httpx habit): every name a package's ``__init__`` exports,
exactly, each importable, and the module paths other code imports from still answering after
the protocol package and the model's layers moved code around.

Adding or removing a public name is a decision: change the list here in the same commit.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

import daemon.transcript_store
import sdk
import sdk.protocol
import webui_model

SDK = [
    "AuthError", "Capabilities", "ClientEvictedData", "DEFAULT_MAX_QUEUED", "DaemonClient",
    "DaemonError", "DaemonEvent", "DaemonHTTPError", "DaemonHistoryTruncatedData", "DaemonStatus",
    "EpisodeRegistry", "EventStream", "HandleClosedError", "Health", "IdempotencyKeyReusedError",
    "InvalidTokenError",
    "KNOWN_EVENT_TYPES", "KnownEventData", "LoadResult", "PendingPromptAddedData",
    "PendingPromptCompletedData", "PendingPromptStartedData", "PermissionRequestData",
    "PermissionResolvedData", "PermissionVote", "PromptAccepted", "PromptByKeyResponse",
    "PromptCancelledData", "PromptOutcomeUnknownError", "PromptQueueFullError",
    "PromptRetryPolicy", "PromptTerminal", "ReconnectPolicy", "RepairCandidate", "RepairDriver",
    "RepairEpisode", "RepairGuards", "RepairNotice", "RepairOutcome", "RepairOutcomeKind",
    "RepairState", "RepairTarget", "RepairValidationError", "ReplayCompleteData", "ResumeResult",
    "SSEBufferOverflow", "SSEParser", "ServerError", "SessionClosedData", "SessionCreated",
    "SessionDiedData", "SessionHandle", "SessionNotFoundError", "SessionPage", "SessionSnapshotData",
    "SessionStatus", "SessionSummary", "SessionUpdateData", "SlowClientWarningData",
    "StateResyncRequiredData",
    "StreamErrorData", "SubscriptionState", "SuffixResult", "SyncDaemonClient", "SyncEventStream",
    "SyncSessionHandle", "TERMINAL_TYPES", "TranscriptPage",
    "TransportError", "TruncationDebugItem", "TruncationStatusItem", "TurnCompleteData",
    "TurnError", "TurnErrorData", "UnknownEventCounter", "WebSocketEventStream", "decode_event",
    "decode_events", "error_for_status", "event_from_mapping", "event_prompt_id",
    "find_repair_target", "find_suffix_start", "is_new_event", "is_retriable",
    "normalize_page_event", "normalize_status_item", "parse_sse", "parse_truncation",
    "repair_failure_notice", "repair_signature", "status_text", "truncation_marker", "typed_data",
    "validate_fresh_snapshot",
]

WEBUI_MODEL = [
    "ASSISTANT_DONE", "BLOCK_KINDS", "Block", "BlockKind", "Checkpoint", "ConnectionMetadata",
    "ConnectionState", "DEFAULT_MAX_BLOCKS", "DEFAULT_PAGE_SIZE", "FOLLOWUP_META_KEY",
    "FollowUpSuggestion", "HISTORY_FAILED_CODE", "HistoryPage", "InjectedMessage", "LoadWarnings",
    "MessageBlock", "Notice", "NoticeBoard", "PAGINATION_CAPABILITY", "PageData", "PageError",
    "PageOutcome", "PageRequest", "PaginationState", "PendingPromptPublication", "PermissionBlock",
    "RepairBuild", "ReplayResult", "STORE_MAX_BLOCKS", "SessionAbandonedError", "SideChannels",
    "SideEffect", "StoreState", "TextBlock", "ToolBlock", "TranscriptDraft", "TranscriptStore",
    "WebUIProvider", "WorkspaceSignal", "after_page", "after_page_error", "append_block",
    "apply_event", "apply_events", "apply_history_page", "block_id", "build_repair",
    "build_repaired_state", "capacity_rejected", "displayed_record_ids", "first_record_id",
    "initial_pagination", "is_hidden_marker", "is_recoverable_live_marker",
    "is_transient_page_error", "load_more", "make_is_new", "mirror_page", "mirror_status",
    "notice_from_repair", "parse_block_id", "prepend_blocks", "reanchored", "replay_anchor",
    "replay_snapshot", "run_events", "take_checkpoint", "transcript_record_ids", "visible_blocks",
]

PROTOCOL = [
    "AcpUpdate", "DaemonEvent", "DaemonHistoryTruncatedData", "ENVELOPE_VERSION", "EventPayload",
    "KNOWN_EVENT_TYPES", "MAX_EVENT_ID", "RawUpdate", "ResumeCursor", "SSEParser",
    "SessionUpdateData", "TERMINAL_TYPES", "TerminalOutcome", "TurnCompleteData", "TurnErrorData",
    "UnknownEventCounter", "__version__", "check_cursor", "decode_event", "decode_events", "encode_envelope",
    "encode_sse_frame", "event_from_mapping", "event_prompt_id", "http", "is_epoch_reset",
    "parse_sse", "parse_truncation", "sse_head", "terminal_for", "terminal_of",
]

# The transcript store: its schema, file, checks, writes and reads are private modules.
TRANSCRIPT_STORE = [
    "AdmitPrompt", "AppendEvent", "CACHE_BUSY_KIB", "CACHE_KIB", "CHECKED_TABLES", "DamagedRow",
    "DeleteSession", "FinishTurn", "INDEX_TABLES", "InvalidCursor", "KeyedPromptRow", "MarkClosed", "Op", "PAGE_SIZE",
    "PromptRow", "ROW_MAX_BYTES", "RunTemplate", "SCHEMA_VERSION", "SessionRow", "StoreHooks",
    "StoredPage", "TERMINAL_STATES", "TerminalState", "TranscriptDamaged", "TranscriptDamagedError",
    "TranscriptDatabase", "TranscriptSchemaError", "UpsertSession", "WAL_CHECKPOINT_BYTES",
    "events_are_json", "is_corruption",
]


@pytest.mark.parametrize(
    ("package", "expected"),
    [(sdk, SDK), (webui_model, WEBUI_MODEL), (sdk.protocol, PROTOCOL),
     (daemon.transcript_store, TRANSCRIPT_STORE)],
    ids=["sdk", "webui_model", "sdk.protocol", "daemon.transcript_store"],
)
def test_public_names_are_pinned_and_importable(package: object, expected: list[str]) -> None:
    exported = package.__all__  # type: ignore[attr-defined]
    assert sorted(exported) == expected
    assert len(set(exported)) == len(exported)
    for name in expected:
        assert getattr(package, name) is not None, name


# Names other modules and tests import from a module path that is now a re-export.
MOVED = {
    "webui_model.reducer": ["Notice", "SideEffect", "WorkspaceSignal", "FollowUpSuggestion",
                            "InjectedMessage", "PendingPromptPublication", "ConnectionMetadata",
                            "apply_event", "apply_events", "first_record_id",
                            "transcript_record_ids", "is_recoverable_live_marker",
                            "valid_marker_payload", "settle_streaming", "ASSISTANT_DONE",
                            "FOLLOWUP_META_KEY"],
    "webui_model.store": ["StoreState", "TranscriptDraft", "TranscriptStore", "append_block",
                          "prepend_blocks", "bump_counters", "DEFAULT_MAX_BLOCKS",
                          "STORE_MAX_BLOCKS"],
    "webui_model.provider": ["WebUIProvider", "ConnectionState", "LoadWarnings",
                             "SessionAbandonedError"],
}


@pytest.mark.parametrize("module", sorted(MOVED))
def test_moved_names_still_import_from_their_old_paths(module: str) -> None:
    loaded = importlib.import_module(module)
    for name in MOVED[module]:
        assert hasattr(loaded, name), f"{module}.{name}"


def test_the_protocol_package_is_the_one_definition() -> None:
    from sdk.protocol import envelope, events, sse

    assert sdk.DaemonEvent is envelope.DaemonEvent
    assert sdk.TurnErrorData is events.TurnErrorData
    assert sdk.DaemonHistoryTruncatedData is events.DaemonHistoryTruncatedData
    assert sdk.SSEParser is sse.SSEParser
    assert sdk.typed_data is envelope.typed_data


# The SDK's public face is the package itself (and its wire contract, sdk.protocol, and the
# command line, sdk.cli); every other module of it is an implementation module, named _x.
SDK_PUBLIC_MODULES = {"__init__", "__main__", "cli", "protocol"}


def test_the_sdk_has_one_public_face() -> None:
    root = Path(sdk.__file__).parent
    public = {path.stem for path in root.iterdir()
              if (path.suffix == ".py" or (path / "__init__.py").exists())
              and not path.stem.startswith("_")} | {"__init__", "__main__"}
    assert public == SDK_PUBLIC_MODULES


def test_the_transcript_store_has_one_public_face() -> None:
    root = Path(daemon.transcript_store.__file__).parent
    assert {path.stem for path in root.glob("*.py") if not path.stem.startswith("_")} == set()


@pytest.mark.parametrize("shim", ["sdk.events", "sdk.sse", "sdk.client", "sdk.truncation"])
def test_no_compatibility_shim_is_left(shim: str) -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(shim)


def test_dir_of_sdk_lists_the_public_names_for_completion() -> None:
    """Completion (IPython, editors) reads dir(): the public names, the lazily loaded ones
    (DaemonClient, SessionHandle, RepairDriver) included, and no import machinery."""
    names = dir(sdk)
    assert names == sorted(sdk.__all__)
    assert {"DaemonClient", "SessionHandle", "RepairDriver", "SyncDaemonClient"} <= set(names)
    assert not {"TYPE_CHECKING", "annotations", "importlib"} & set(names)
