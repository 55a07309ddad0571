"""Typed daemon events: the SDK's names for the wire definitions in :mod:`sdk.protocol`.

The envelope (:class:`DaemonEvent`), its validity rules and decoders live in
:mod:`sdk.protocol.envelope`; the payload Structs (wire camelCase, one per event type, the ACP
update kinds as a tagged union) in :mod:`sdk.protocol.events`. A frame read off the wire carries
its typed payload as :attr:`DaemonEvent.payload`, decoded from the frame's own bytes;
:func:`typed_data` is the same thing as a function. Unknown types and payloads that do not fit
have no typed payload and are counted by :class:`UnknownEventCounter`, never raised.

:func:`normalize_page_event` puts a reference-daemon transcript page event into the bus shape
(``data = {sessionId, update}``).
"""

from __future__ import annotations

from sdk.protocol.constants import MAX_EVENT_ID, TERMINAL_TYPES
from sdk.protocol.envelope import (
    DaemonEvent,
    UnknownEventCounter,
    decode_event,
    decode_events,
    event_from_mapping,
    event_prompt_id,
    normalize_page_event,
)
from sdk.protocol.events import (
    KNOWN_EVENT_TYPES,
    PAYLOAD_TYPES,
    ClientEvictedData,
    DaemonHistoryTruncatedData,
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

__all__ = [
    "KNOWN_EVENT_TYPES",
    "MAX_EVENT_ID",
    "PAYLOAD_TYPES",
    "TERMINAL_TYPES",
    "ClientEvictedData",
    "DaemonEvent",
    "DaemonHistoryTruncatedData",
    "KnownEventData",
    "PendingPromptAddedData",
    "PendingPromptCompletedData",
    "PendingPromptStartedData",
    "PermissionRequestData",
    "PermissionResolvedData",
    "PromptCancelledData",
    "ReplayCompleteData",
    "SessionClosedData",
    "SessionDiedData",
    "SessionSnapshotData",
    "SessionUpdateData",
    "SlowClientWarningData",
    "StateResyncRequiredData",
    "StreamErrorData",
    "TurnCompleteData",
    "TurnErrorData",
    "UnknownEventCounter",
    "decode_event",
    "decode_events",
    "event_from_mapping",
    "event_prompt_id",
    "normalize_page_event",
    "typed_data",
]


def typed_data(event: DaemonEvent) -> KnownEventData | None:
    """The payload as its typed Struct (:attr:`DaemonEvent.payload`); ``None`` for an unknown
    type or a payload that does not fit. Never raises."""
    return event.payload
