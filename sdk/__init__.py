"""turnkeeper SDK: typed daemon events, truncation text, the async client (on anyio: Trio or
asyncio) and its blocking twin, session handles with resumable subscriptions (SSE and
WebSocket), and the live-journal repair rules and driver."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sdk._client import (
        Capabilities,
        DaemonClient,
        DaemonStatus,
        EventStream,
        Health,
        LoadResult,
        PermissionVote,
        PromptAccepted,
        PromptByKeyResponse,
        PromptRetryPolicy,
        PromptTerminal,
        ResumeResult,
        SessionCreated,
        SessionPage,
        SessionStatus,
        SessionSummary,
        TranscriptPage,
    )
    from sdk._errors import (
        AuthError,
        DaemonError,
        DaemonHTTPError,
        IdempotencyKeyReusedError,
        InvalidTokenError,
        PromptOutcomeUnknownError,
        PromptQueueFullError,
        ServerError,
        SessionNotFoundError,
        SSEBufferOverflow,
        TransportError,
        TurnError,
        error_for_status,
        is_retriable,
    )
    from sdk._repair import (
        EpisodeRegistry,
        RepairEpisode,
        RepairGuards,
        RepairNotice,
        RepairState,
        RepairTarget,
        RepairValidationError,
        SuffixResult,
        find_repair_target,
        find_suffix_start,
        is_new_event,
        repair_failure_notice,
        repair_signature,
        validate_fresh_snapshot,
    )
    from sdk._repair_driver import (
        RepairCandidate,
        RepairDriver,
        RepairOutcome,
        RepairOutcomeKind,
    )
    from sdk._session import (
        DEFAULT_MAX_QUEUED,
        HandleClosedError,
        ReconnectPolicy,
        SessionHandle,
        SubscriptionState,
    )
    from sdk._sync import SyncDaemonClient, SyncEventStream, SyncSessionHandle
    from sdk._truncation import (
        DaemonHistoryTruncatedData,
        TruncationDebugItem,
        TruncationStatusItem,
        normalize_status_item,
        parse_truncation,
        status_text,
        truncation_marker,
    )
    from sdk._ws import WebSocketEventStream
    from sdk.protocol.constants import TERMINAL_TYPES
    from sdk.protocol.envelope import (
        DaemonEvent,
        UnknownEventCounter,
        decode_event,
        decode_events,
        event_from_mapping,
        event_prompt_id,
        normalize_page_event,
        typed_data,
    )
    from sdk.protocol.events import (
        KNOWN_EVENT_TYPES,
        ClientEvictedData,
        KnownEventData,
        PendingPromptAddedData,
        PendingPromptCompletedData,
        PendingPromptStartedData,
        PermissionRequestData,
        PermissionResolvedData,
        PromptCancelledData,
        ReplayCompleteData,
        SessionClosedData,
        SessionDiedData,
        SessionSnapshotData,
        SessionUpdateData,
        SlowClientWarningData,
        StateResyncRequiredData,
        StreamErrorData,
        TurnCompleteData,
        TurnErrorData,
    )
    from sdk.protocol.sse import SSEParser, parse_sse

# Every name loads on first use, so that importing the pure protocol (the daemon does, for
# sdk.protocol.http) pulls in neither the event types nor the errors, the repair rules and the
# async/HTTP parts (nor httpx, anyio and wsproto).
_LAZY: dict[str, str] = {
    "TERMINAL_TYPES": "sdk.protocol.constants",
    **dict.fromkeys(('DaemonEvent', 'UnknownEventCounter', 'decode_event', 'decode_events', 'event_from_mapping', 'event_prompt_id', 'normalize_page_event', 'typed_data'), "sdk.protocol.envelope"),
    **dict.fromkeys(('KNOWN_EVENT_TYPES', 'ClientEvictedData', 'KnownEventData', 'PendingPromptAddedData', 'PendingPromptCompletedData', 'PendingPromptStartedData', 'PermissionRequestData', 'PermissionResolvedData', 'PromptCancelledData', 'ReplayCompleteData', 'SessionClosedData', 'SessionDiedData', 'SessionSnapshotData', 'SessionUpdateData', 'SlowClientWarningData', 'StateResyncRequiredData', 'StreamErrorData', 'TurnCompleteData', 'TurnErrorData'), "sdk.protocol.events"),
    **dict.fromkeys(('SSEParser', 'parse_sse'), "sdk.protocol.sse"),
    **dict.fromkeys(('AuthError', 'DaemonError', 'DaemonHTTPError', 'IdempotencyKeyReusedError', 'InvalidTokenError', 'PromptOutcomeUnknownError', 'PromptQueueFullError', 'ServerError', 'SessionNotFoundError', 'SSEBufferOverflow', 'TransportError', 'TurnError', 'error_for_status', 'is_retriable',), "sdk._errors"),
    **dict.fromkeys(('EpisodeRegistry', 'RepairEpisode', 'RepairGuards', 'RepairNotice', 'RepairState', 'RepairTarget', 'RepairValidationError', 'SuffixResult', 'find_repair_target', 'find_suffix_start', 'is_new_event', 'repair_failure_notice', 'repair_signature', 'validate_fresh_snapshot',), "sdk._repair"),
    **dict.fromkeys(('DaemonHistoryTruncatedData', 'TruncationDebugItem', 'TruncationStatusItem', 'normalize_status_item', 'parse_truncation', 'status_text', 'truncation_marker',), "sdk._truncation"),
    **dict.fromkeys(('Capabilities', 'DaemonClient', 'DaemonStatus', 'EventStream', 'Health', 'LoadResult', 'PermissionVote', 'PromptAccepted', 'PromptByKeyResponse', 'PromptRetryPolicy', 'PromptTerminal', 'ResumeResult', 'SessionCreated', 'SessionPage', 'SessionStatus', 'SessionSummary', 'TranscriptPage'), "sdk._client"),
    **dict.fromkeys(('RepairCandidate', 'RepairDriver', 'RepairOutcome', 'RepairOutcomeKind'), "sdk._repair_driver"),
    **dict.fromkeys(('DEFAULT_MAX_QUEUED', 'HandleClosedError', 'ReconnectPolicy', 'SessionHandle', 'SubscriptionState'), "sdk._session"),
    **dict.fromkeys(('WebSocketEventStream',), "sdk._ws"),
    **dict.fromkeys(('SyncDaemonClient', 'SyncEventStream', 'SyncSessionHandle'), "sdk._sync"),
}


def __dir__() -> list[str]:
    # Completion (IPython, editors, dir()) shows the public names, the lazy ones included,
    # and none of this module's own imports (TYPE_CHECKING, importlib, ...).
    return sorted(__all__)


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'sdk' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "DEFAULT_MAX_QUEUED",
    "KNOWN_EVENT_TYPES",
    "TERMINAL_TYPES",
    "AuthError",
    "Capabilities",
    "ClientEvictedData",
    "DaemonClient",
    "DaemonError",
    "DaemonEvent",
    "DaemonHTTPError",
    "DaemonHistoryTruncatedData",
    "DaemonStatus",
    "EpisodeRegistry",
    "EventStream",
    "HandleClosedError",
    "Health",
    "IdempotencyKeyReusedError",
    "InvalidTokenError",
    "KnownEventData",
    "LoadResult",
    "PendingPromptAddedData",
    "PendingPromptCompletedData",
    "PendingPromptStartedData",
    "PermissionRequestData",
    "PermissionResolvedData",
    "PermissionVote",
    "PromptAccepted",
    "PromptByKeyResponse",
    "PromptCancelledData",
    "PromptOutcomeUnknownError",
    "PromptQueueFullError",
    "PromptRetryPolicy",
    "PromptTerminal",
    "ReconnectPolicy",
    "RepairCandidate",
    "RepairDriver",
    "RepairEpisode",
    "RepairGuards",
    "RepairNotice",
    "RepairOutcome",
    "RepairOutcomeKind",
    "RepairState",
    "RepairTarget",
    "RepairValidationError",
    "ReplayCompleteData",
    "ResumeResult",
    "SSEBufferOverflow",
    "SSEParser",
    "ServerError",
    "SessionClosedData",
    "SessionCreated",
    "SessionDiedData",
    "SessionHandle",
    "SessionNotFoundError",
    "SessionPage",
    "SessionSnapshotData",
    "SessionStatus",
    "SessionSummary",
    "SessionUpdateData",
    "SlowClientWarningData",
    "StateResyncRequiredData",
    "StreamErrorData",
    "SubscriptionState",
    "SuffixResult",
    "SyncDaemonClient",
    "SyncEventStream",
    "SyncSessionHandle",
    "TranscriptPage",
    "TransportError",
    "TruncationDebugItem",
    "TruncationStatusItem",
    "TurnCompleteData",
    "TurnError",
    "TurnErrorData",
    "UnknownEventCounter",
    "WebSocketEventStream",
    "decode_event",
    "decode_events",
    "error_for_status",
    "event_from_mapping",
    "event_prompt_id",
    "find_repair_target",
    "find_suffix_start",
    "is_new_event",
    "is_retriable",
    "normalize_page_event",
    "normalize_status_item",
    "parse_sse",
    "parse_truncation",
    "repair_failure_notice",
    "repair_signature",
    "status_text",
    "truncation_marker",
    "typed_data",
    "validate_fresh_snapshot",
]
