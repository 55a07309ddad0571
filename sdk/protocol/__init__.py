"""The turnkeeper wire protocol: one sans-IO definition shared by the daemon, the SDK and the
WebUI model (the h11/wsproto shape: handed bytes, it answers typed records; handed records, it
answers bytes).

Pure: no trio, no sockets, no clock. Modules, lowest first:

- ``constants``: shared numbers and names (max event id, envelope version, terminal types,
  resync reasons, marker names).
- ``envelope``: :class:`DaemonEvent`, the frame validity rules, :func:`decode_event` (one pass,
  payload kept raw for its typed decoder), :func:`encode_envelope`, :func:`event_prompt_id`.
- ``events``: every event payload as a frozen Struct (wire camelCase), the ACP update kinds of
  ``session_update`` as a tagged union, ``history_truncated`` validation,
  :class:`UnknownEventCounter` for frames a client cannot interpret.
- ``sse``: the SSE frame encoder and the incremental :class:`SSEParser`.
- ``cursor``: the client's resume cursor and epoch (:class:`ResumeCursor`).
- ``terminals``: the terminal builders, the daemon's error codes, and
  :class:`TerminalOutcome` / :func:`terminal_for` for reading a prompt's end.
- ``http``: request and response bodies of the HTTP routes.
- ``headers``: the HTTP header names of the wire, each written once.
- ``routes``: the HTTP routes (method, path, body types, errors), each written once.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING

from sdk.protocol._version import __version__

if TYPE_CHECKING:
    from sdk.protocol import http
    from sdk.protocol.constants import ENVELOPE_VERSION, MAX_EVENT_ID, TERMINAL_TYPES
    from sdk.protocol.cursor import ResumeCursor, check_cursor, is_epoch_reset
    from sdk.protocol.envelope import (
        DaemonEvent,
        UnknownEventCounter,
        decode_event,
        decode_events,
        encode_envelope,
        event_from_mapping,
        event_prompt_id,
    )
    from sdk.protocol.events import (
        KNOWN_EVENT_TYPES,
        AcpUpdate,
        DaemonHistoryTruncatedData,
        EventPayload,
        RawUpdate,
        SessionUpdateData,
        TurnCompleteData,
        TurnErrorData,
        parse_truncation,
    )
    from sdk.protocol.sse import SSEParser, encode_sse_frame, parse_sse, sse_head
    from sdk.protocol.terminals import TerminalOutcome, terminal_for, terminal_of

# Each name is imported from its module by its first use, not with the package: a process
# that needs one part of the protocol (the daemon at idle: the HTTP bodies and routes, no
# event types) loads that part alone. The submodules import as usual
# (``from sdk.protocol import http``).
_LAZY: dict[str, str] = {
    "http": "http",
    **dict.fromkeys(("ENVELOPE_VERSION", "MAX_EVENT_ID", "TERMINAL_TYPES"), "constants"),
    **dict.fromkeys(("ResumeCursor", "check_cursor", "is_epoch_reset"), "cursor"),
    **dict.fromkeys(("DaemonEvent", "UnknownEventCounter", "decode_event", "decode_events",
                     "encode_envelope", "event_from_mapping", "event_prompt_id"), "envelope"),
    **dict.fromkeys(("KNOWN_EVENT_TYPES", "AcpUpdate", "DaemonHistoryTruncatedData",
                     "EventPayload", "RawUpdate", "SessionUpdateData", "TurnCompleteData",
                     "TurnErrorData", "parse_truncation"), "events"),
    **dict.fromkeys(("SSEParser", "encode_sse_frame", "parse_sse", "sse_head"), "sse"),
    **dict.fromkeys(("TerminalOutcome", "terminal_for", "terminal_of"), "terminals"),
}


def __dir__() -> list[str]:
    return sorted(__all__)


def __getattr__(name: str) -> object:
    module: ModuleType
    # One plain import per submodule (no import by a computed name): the imports stay what a
    # reader and the lint see.
    match _LAZY.get(name):
        case "http":
            import sdk.protocol.http as module
        case "constants":
            import sdk.protocol.constants as module
        case "cursor":
            import sdk.protocol.cursor as module
        case "envelope":
            import sdk.protocol.envelope as module
        case "events":
            import sdk.protocol.events as module
        case "sse":
            import sdk.protocol.sse as module
        case "terminals":
            import sdk.protocol.terminals as module
        case _:
            raise AttributeError(f"module 'sdk.protocol' has no attribute {name!r}")
    value = module if name == "http" else getattr(module, name)
    globals()[name] = value
    return value


__all__ = [
    "ENVELOPE_VERSION",
    "KNOWN_EVENT_TYPES",
    "MAX_EVENT_ID",
    "TERMINAL_TYPES",
    "AcpUpdate",
    "DaemonEvent",
    "DaemonHistoryTruncatedData",
    "EventPayload",
    "RawUpdate",
    "ResumeCursor",
    "SSEParser",
    "SessionUpdateData",
    "TerminalOutcome",
    "TurnCompleteData",
    "TurnErrorData",
    "UnknownEventCounter",
    "__version__",
    "check_cursor",
    "decode_event",
    "decode_events",
    "encode_envelope",
    "encode_sse_frame",
    "event_from_mapping",
    "event_prompt_id",
    "http",
    "is_epoch_reset",
    "parse_sse",
    "parse_truncation",
    "sse_head",
    "terminal_for",
    "terminal_of",
]
