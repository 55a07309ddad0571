"""Every event payload the daemon emits and clients read, as frozen msgspec Structs.

Wire names are camelCase (``rename="camel"``). Unknown keys are ignored by the Structs and kept
in :attr:`~sdk.protocol.envelope.DaemonEvent.data`, which is always the complete payload.

:func:`decode_payload` picks one decoder by the envelope's ``type`` and decodes the frame's raw
``data`` bytes straight into its Struct. A ``session_update``'s ACP update is a tagged union on
its ``sessionUpdate`` field (:data:`AcpUpdate`); kinds without a Struct here — or an update
whose typed fields do not fit — pass through as :class:`RawUpdate`. An unknown event type, or a
payload that does not fit its Struct, has no typed payload (``None``): the frame is kept and
counted (:class:`UnknownEventCounter`), never raised.

``history_truncated`` follows its own stricter rules (:class:`DaemonHistoryTruncatedData`):
counts written as ``3.0`` are 3, booleans are not numbers, a non-string ``recordId`` is absent,
a ``null`` or empty ``scope`` is malformed; ``msgspec.convert(payload,
DaemonHistoryTruncatedData)`` applies them to a wire payload directly.

Pure: no I/O, no clock. The package's private modules, one job each: ``_updates`` (the ACP
update kinds), ``_payloads`` (the payload Structs and their event types),
``_history_truncated`` (that payload's rules) and ``_codec`` (the frame decoders).
"""

from sdk.protocol.events._codec import decode_payload, payload_from_data
from sdk.protocol.events._history_truncated import DaemonHistoryTruncatedData, parse_truncation
from sdk.protocol.events._payloads import (
    KNOWN_EVENT_TYPES,
    PAYLOAD_TYPES,
    ClientEvictedData,
    EventPayload,
    KnownEventData,
    PendingPromptAddedData,
    PendingPromptCompletedData,
    PendingPromptStartedData,
    PermissionOption,
    PermissionRequestData,
    PermissionResolvedData,
    PermissionToolCall,
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
    event_type_of,
)
from sdk.protocol.events._updates import (
    AcpUpdate,
    AgentMessageChunk,
    AgentThoughtChunk,
    AvailableCommandsUpdate,
    ContentChunk,
    CurrentModeUpdate,
    Plan,
    QwenTranscript,
    RawUpdate,
    ToolCall,
    ToolCallUpdate,
    UpdateMeta,
    UserMessageChunk,
    finite_number,
)

__all__ = [
    "KNOWN_EVENT_TYPES",
    "PAYLOAD_TYPES",
    "AcpUpdate",
    "AgentMessageChunk",
    "AgentThoughtChunk",
    "AvailableCommandsUpdate",
    "ClientEvictedData",
    "ContentChunk",
    "CurrentModeUpdate",
    "DaemonHistoryTruncatedData",
    "EventPayload",
    "KnownEventData",
    "PendingPromptAddedData",
    "PendingPromptCompletedData",
    "PendingPromptStartedData",
    "PermissionOption",
    "PermissionRequestData",
    "PermissionResolvedData",
    "PermissionToolCall",
    "Plan",
    "PromptCancelledData",
    "QwenTranscript",
    "RawUpdate",
    "ReplayCompleteData",
    "SessionClosedData",
    "SessionDiedData",
    "SessionSnapshotData",
    "SessionUpdateData",
    "SlowClientWarningData",
    "StateResyncRequiredData",
    "StreamErrorData",
    "ToolCall",
    "ToolCallUpdate",
    "TurnCompleteData",
    "TurnErrorData",
    "UpdateMeta",
    "UserMessageChunk",
    "decode_payload",
    "event_type_of",
    "finite_number",
    "parse_truncation",
    "payload_from_data",
]
