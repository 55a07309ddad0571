"""Prompt terminals: how the daemon builds them and how a client reads one.

Every prompt the daemon admits ends with exactly one terminal, ``turn_complete`` or
``turn_error``, whose ``data.promptId`` names the prompt (clients match on it). The builders
here make the payloads (``promptId`` is required); the error codes the daemon itself uses are
constants (an agent's JSON-RPC error code travels as its decimal string).

A client reads a terminal with :func:`terminal_for` into one :class:`TerminalOutcome`, the same
type for the SDK's session handle and the WebUI model's provider. A terminal whose other fields
do not fit still ends the turn: the outcome keeps what is certain (a numeric ``code`` becomes its
decimal string, a non-string ``message`` is absent).

Pure: no I/O, no clock.
"""

from __future__ import annotations

from typing import Final, Literal

import msgspec

from sdk.protocol.constants import TERMINAL_TYPES
from sdk.protocol.envelope import DaemonEvent
from sdk.protocol.errors import TurnError
from sdk.protocol.events import TurnCompleteData, TurnErrorData

__all__ = [
    "CHANNEL_CLOSED",
    "DEFAULT_STOP_REASON",
    "FALLBACK_ERROR_MESSAGE",
    "INTERRUPTED",
    "PROMPT_DEADLINE_EXCEEDED",
    "SESSION_CLOSED",
    "STOP_CANCELLED",
    "TERMINAL_TYPES",
    "TerminalFields",
    "TerminalOutcome",
    "is_terminal",
    "terminal_fields",
    "terminal_for",
    "terminal_of",
    "turn_complete",
    "turn_error",
]

#: ``turn_error.code`` values the daemon makes itself.
CHANNEL_CLOSED: Final = "channel_closed"
"""The agent process died with the prompt unfinished."""
SESSION_CLOSED: Final = "session_closed"
"""The session was closed with the prompt unfinished (or still queued)."""
PROMPT_DEADLINE_EXCEEDED: Final = "prompt_deadline_exceeded"
"""The prompt's ``deadlineMs`` ran out."""
INTERRUPTED: Final = "interrupted"
"""Only in records of a restored session: the daemon stopped mid-turn."""

#: The message of a failure whose ``turn_error`` carried none the client could read.
FALLBACK_ERROR_MESSAGE: Final = "turn failed"

#: ``turn_complete.stopReason`` when the agent gave none, and the one of a cancelled prompt.
DEFAULT_STOP_REASON: Final = "end_turn"
STOP_CANCELLED: Final = "cancelled"


def turn_complete(
    session_id: str, prompt_id: str, stop_reason: str = DEFAULT_STOP_REASON
) -> TurnCompleteData:
    """The payload of a ``turn_complete``."""
    if not prompt_id:
        raise ValueError("a terminal needs its prompt id")
    return TurnCompleteData(prompt_id=prompt_id, stop_reason=stop_reason, session_id=session_id)


def turn_error(session_id: str, prompt_id: str, code: str, message: str) -> TurnErrorData:
    """The payload of a ``turn_error`` (``code``: one of the constants, or the agent's code)."""
    if not prompt_id:
        raise ValueError("a terminal needs its prompt id")
    return TurnErrorData(prompt_id=prompt_id, message=message, code=code, session_id=session_id)


class TerminalOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """How one prompt ended, read from its terminal event."""

    prompt_id: str
    type: Literal["turn_complete", "turn_error"]
    stop_reason: str | None = None
    """``turn_complete`` only: the agent's stop reason (``end_turn`` when it gave none)."""
    code: str | None = None
    """``turn_error`` only."""
    message: str | None = None
    """``turn_error`` only."""
    session_id: str | None = None

    @property
    def failed(self) -> bool:
        return self.type == "turn_error"

    def result(self) -> TurnCompleteData:
        """What waiting for the prompt answers: its ``turn_complete`` payload, or
        :class:`~sdk.protocol.errors.TurnError` (``code``, ``message``, ``prompt_id``) raised for a
        ``turn_error``."""
        if self.failed:
            message = self.message if self.message is not None else FALLBACK_ERROR_MESSAGE
            raise TurnError(self.code, message, self.prompt_id)
        return TurnCompleteData(
            prompt_id=self.prompt_id,
            stop_reason=self.stop_reason or DEFAULT_STOP_REASON,
            session_id=self.session_id,
        )


def is_terminal(event: DaemonEvent) -> bool:
    return event.type in TERMINAL_TYPES


class TerminalFields(msgspec.Struct, frozen=True, kw_only=True):
    """What a terminal event says beyond its prompt id, read as leniently as the rule above."""

    stop_reason: str | None = None
    code: str | None = None
    message: str | None = None
    session_id: str | None = None


def terminal_fields(event: DaemonEvent) -> TerminalFields:
    """The typed payload's fields; for a terminal whose payload does not fit its Struct, what
    can still be read (a numeric ``code`` as its decimal string, a string ``message`` and
    ``stopReason``)."""
    payload = event.payload
    if isinstance(payload, TurnErrorData):
        return TerminalFields(
            code=payload.code, message=payload.message, session_id=payload.session_id
        )
    if isinstance(payload, TurnCompleteData):
        return TerminalFields(stop_reason=payload.stop_reason, session_id=payload.session_id)
    data = event.data
    if not isinstance(data, dict):
        return TerminalFields()
    stop = data.get("stopReason")
    code = data.get("code")
    message = data.get("message")
    return TerminalFields(
        stop_reason=stop if isinstance(stop, str) else None,
        code=None if code is None else str(code),
        message=message if isinstance(message, str) else None,
    )


def terminal_of(event: DaemonEvent) -> TerminalOutcome | None:
    """The outcome a terminal event reports; ``None`` for any other event or a terminal that
    names no prompt (``data.promptId`` missing or not a non-empty string)."""
    if event.type not in TERMINAL_TYPES:
        return None
    data = event.data
    prompt_id = data.get("promptId") if isinstance(data, dict) else None
    if not isinstance(prompt_id, str) or not prompt_id:
        return None
    fields = terminal_fields(event)
    if event.type == "turn_error":
        return TerminalOutcome(
            prompt_id=prompt_id, type="turn_error", code=fields.code, message=fields.message,
            session_id=fields.session_id,
        )
    return TerminalOutcome(
        prompt_id=prompt_id, type="turn_complete", stop_reason=fields.stop_reason,
        session_id=fields.session_id,
    )


def terminal_for(event: DaemonEvent, prompt_id: str) -> TerminalOutcome | None:
    """:func:`terminal_of` when ``event`` is the terminal of ``prompt_id`` (strict equality of
    ``data.promptId``), else ``None``."""
    outcome = terminal_of(event)
    return outcome if outcome is not None and outcome.prompt_id == prompt_id else None
