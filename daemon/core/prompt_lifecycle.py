"""One prompt's life as a state machine, and the one terminal each way of ending it gets. Pure.

A prompt is admitted (``QUEUED``), handed to the agent (``RUNNING``), maybe asked to stop by a
client (``CANCELLING``: the agent was told and the cancel grace runs) or cut by the session
closing (``CLOSING``), and ends with exactly one terminal (``ENDED``). The session shell
(:mod:`daemon.session`) owns the cancel scope, the clock and the agent call; it reports how the
call ended as an :data:`EndCause` and publishes what :func:`terminal_for` answers.

=====================  ===========================================================================
how it ended           terminal
=====================  ===========================================================================
``AgentAnswered``      ``turn_complete`` with the agent's stop reason (``end_turn`` when it gave
                       none); the ledger says ``cancelled`` for ``stopReason: "cancelled"``
``AgentFailed``        ``turn_error`` with the agent's JSON-RPC error code and message
``ChannelLost``        ``turn_error channel_closed`` (the agent process died)
``CallCut``            the prompt's scope ended the call: ``CLOSING`` → ``turn_error
                       session_closed``; ``CANCELLING`` before the deadline → ``turn_complete
                       cancelled`` (the grace ran out); otherwise → ``turn_error
                       prompt_deadline_exceeded``, and the agent is told to cancel
``SessionEnded``       a prompt still queued when the session ends: ``channel_closed`` if the
                       agent died, else ``session_closed``
=====================  ===========================================================================
"""

from __future__ import annotations

import enum
from typing import Final, Literal, TypeAlias

import msgspec

from sdk.protocol.events import TurnCompleteData, TurnErrorData
from sdk.protocol.terminals import (
    CHANNEL_CLOSED,
    DEFAULT_STOP_REASON,
    INTERRUPTED,
    PROMPT_DEADLINE_EXCEEDED,
    SESSION_CLOSED,
    STOP_CANCELLED,
    turn_complete,
    turn_error,
)

from .transcript_ops import TerminalState

__all__ = [
    "NOT_ACKNOWLEDGED",
    "AgentAnswered",
    "AgentFailed",
    "CallCut",
    "ChannelLost",
    "EndCause",
    "PromptState",
    "SessionEnded",
    "TerminalDecision",
    "after_cancel",
    "after_close",
    "terminal_for",
]

SESSION_CLOSED_MESSAGE: Final = "Session closed"
CHANNEL_CLOSED_MESSAGE: Final = "Agent process exited"
DEADLINE_MESSAGE: Final = "Prompt deadline exceeded"


class PromptState(enum.Enum):
    """Where one admitted prompt is."""

    QUEUED = "queued"
    RUNNING = "running"
    CANCELLING = "cancelling"
    CLOSING = "closing"
    ENDED = "ended"


def after_cancel(state: PromptState) -> PromptState | None:
    """A client's cancel: only a running prompt takes it (``None``: ignored, nothing to do)."""
    return PromptState.CANCELLING if state is PromptState.RUNNING else None


def after_close(state: PromptState) -> PromptState:
    """The session closes: an unfinished prompt is being cut; an ended one stays ended."""
    return state if state is PromptState.ENDED else PromptState.CLOSING


# --- how the agent call (or the queue wait) ended ----------------------------------------------


class AgentAnswered(msgspec.Struct, frozen=True):
    """The agent answered ``session/prompt``; ``stop_reason`` is its raw ``stopReason``."""

    stop_reason: object = None


class AgentFailed(msgspec.Struct, frozen=True):
    """The agent answered with a JSON-RPC error."""

    code: int | str
    message: str


class ChannelLost(msgspec.Struct, frozen=True):
    """The agent process died (or its pipes closed) before it answered."""


class CallCut(msgspec.Struct, frozen=True):
    """The prompt's own cancel scope ended the call; ``deadline_passed``: the prompt's
    ``deadlineMs`` had run out when it did."""

    deadline_passed: bool


class SessionEnded(msgspec.Struct, frozen=True):
    """The prompt never ran: the session ended with it queued."""

    agent_died: bool


EndCause: TypeAlias = AgentAnswered | AgentFailed | ChannelLost | CallCut | SessionEnded


class TerminalDecision(msgspec.Struct, frozen=True):
    """The one terminal of a prompt: its event type, the ledger's state and the payload fields.
    ``cancel_agent``: the agent is still working on it and must be told ``session/cancel``."""

    event_type: Literal["turn_complete", "turn_error"]
    ledger: TerminalState
    stop_reason: str | None = None
    code: str | None = None
    message: str | None = None
    cancel_agent: bool = False

    def data(self, session_id: str, prompt_id: str) -> TurnCompleteData | TurnErrorData:
        """The event's payload (:mod:`sdk.protocol.terminals`' builders)."""
        if self.event_type == "turn_complete":
            return turn_complete(session_id, prompt_id, self.stop_reason or DEFAULT_STOP_REASON)
        return turn_error(session_id, prompt_id, self.code or "", self.message or "")


# Cluster mode: a prompt answered 503 because its admission did not reach Redis in time never
# runs; it ends as a takeover ends a prompt the new owner never ran.
NOT_ACKNOWLEDGED: Final = TerminalDecision(
    "turn_error", "interrupted", code=INTERRUPTED,
    message="Prompt not run: its admission did not reach the cluster in time (answered 503)")


def _error(code: str, message: str, *, cancel_agent: bool = False) -> TerminalDecision:
    return TerminalDecision("turn_error", "error", code=code, message=message,
                            cancel_agent=cancel_agent)


def terminal_for(state: PromptState, cause: EndCause) -> TerminalDecision | None:
    """The terminal a prompt in ``state`` gets when it ends by ``cause``; ``None`` once it has
    ended (a prompt gets exactly one terminal)."""
    if state is PromptState.ENDED:
        return None
    match cause:
        case AgentAnswered(stop_reason=raw):
            stop = raw if isinstance(raw, str) and raw else DEFAULT_STOP_REASON
            ledger: TerminalState = "cancelled" if stop == STOP_CANCELLED else "completed"
            return TerminalDecision("turn_complete", ledger, stop_reason=stop)
        case AgentFailed(code=code, message=message):
            return _error(str(code), message)
        case ChannelLost():
            return _error(CHANNEL_CLOSED, CHANNEL_CLOSED_MESSAGE)
        case SessionEnded(agent_died=died):
            if died:
                return _error(CHANNEL_CLOSED, CHANNEL_CLOSED_MESSAGE)
            return _error(SESSION_CLOSED, SESSION_CLOSED_MESSAGE)
        case CallCut(deadline_passed=deadline_passed):
            if state is PromptState.CLOSING:
                return _error(SESSION_CLOSED, SESSION_CLOSED_MESSAGE)
            if state is PromptState.CANCELLING and not deadline_passed:
                return TerminalDecision("turn_complete", "cancelled", stop_reason=STOP_CANCELLED)
            return _error(PROMPT_DEADLINE_EXCEEDED, DEADLINE_MESSAGE, cancel_agent=True)
