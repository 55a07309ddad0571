"""The prompt lifecycle core: every way a prompt ends, in every state, gets its one terminal.
No server, no trio: ``terminal_for`` and the transitions are plain functions."""

from __future__ import annotations

import msgspec
import pytest

from daemon.core.prompt_lifecycle import (
    AgentAnswered,
    AgentFailed,
    CallCut,
    ChannelLost,
    EndCause,
    PromptState,
    SessionEnded,
    TerminalDecision,
    after_cancel,
    after_close,
    terminal_for,
)
from daemon.core.transcript_ops import TerminalState

S = PromptState
LIVE = [S.QUEUED, S.RUNNING, S.CANCELLING, S.CLOSING]


def complete(stop: str, ledger: TerminalState) -> TerminalDecision:
    return TerminalDecision("turn_complete", ledger, stop_reason=stop)


def error(code: str, message: str, *, cancel_agent: bool = False) -> TerminalDecision:
    return TerminalDecision("turn_error", "error", code=code, message=message,
                            cancel_agent=cancel_agent)


SESSION_CLOSED = error("session_closed", "Session closed")
CHANNEL_CLOSED = error("channel_closed", "Agent process exited")
DEADLINE = error("prompt_deadline_exceeded", "Prompt deadline exceeded", cancel_agent=True)


# (state, cause) -> terminal, for every cause; the agent's own answer wins over the state.
CASES: list[tuple[PromptState, EndCause, TerminalDecision]] = [
    *[(s, AgentAnswered("end_turn"), complete("end_turn", "completed")) for s in LIVE],
    *[(s, AgentAnswered("max_tokens"), complete("max_tokens", "completed")) for s in LIVE],
    *[(s, AgentAnswered("cancelled"), complete("cancelled", "cancelled")) for s in LIVE],
    # No stop reason, an empty one or a non-string one: end_turn.
    (S.RUNNING, AgentAnswered(None), complete("end_turn", "completed")),
    (S.RUNNING, AgentAnswered(""), complete("end_turn", "completed")),
    (S.RUNNING, AgentAnswered(7), complete("end_turn", "completed")),
    *[(s, AgentFailed(-32603, "injected error"), error("-32603", "injected error"))
      for s in LIVE],
    (S.RUNNING, AgentFailed("E1", "boom"), error("E1", "boom")),
    *[(s, ChannelLost(), CHANNEL_CLOSED) for s in LIVE],
    # The scope cut the call: closing wins, then a cancel within its deadline, else the deadline.
    (S.CLOSING, CallCut(deadline_passed=False), SESSION_CLOSED),
    (S.CLOSING, CallCut(deadline_passed=True), SESSION_CLOSED),
    (S.CANCELLING, CallCut(deadline_passed=False), complete("cancelled", "cancelled")),
    (S.CANCELLING, CallCut(deadline_passed=True), DEADLINE),
    (S.RUNNING, CallCut(deadline_passed=True), DEADLINE),
    (S.RUNNING, CallCut(deadline_passed=False), DEADLINE),
    # A prompt still queued when the session ends.
    (S.QUEUED, SessionEnded(agent_died=False), SESSION_CLOSED),
    (S.QUEUED, SessionEnded(agent_died=True), CHANNEL_CLOSED),
]


@pytest.mark.parametrize(("state", "cause", "expected"), CASES,
                         ids=[f"{s.value}-{c!r}" for s, c, _ in CASES])
def test_terminal_for_every_end_cause(state: PromptState, cause: EndCause,
                                      expected: TerminalDecision) -> None:
    assert terminal_for(state, cause) == expected


@pytest.mark.parametrize("cause", [AgentAnswered("end_turn"), AgentFailed(1, "x"), ChannelLost(),
                                   CallCut(deadline_passed=True), SessionEnded(agent_died=True)],
                         ids=repr)
def test_an_ended_prompt_gets_no_second_terminal(cause: EndCause) -> None:
    assert terminal_for(S.ENDED, cause) is None


def test_the_payloads_are_the_wire_shapes_in_wire_order() -> None:
    done = complete("end_turn", "completed").data("s1", "p1")
    assert list(msgspec.to_builtins(done).items()) == [("sessionId", "s1"), ("stopReason", "end_turn"),
                                  ("promptId", "p1")]
    failed = DEADLINE.data("s1", "p1")
    assert list(msgspec.to_builtins(failed).items()) == [("sessionId", "s1"), ("message", "Prompt deadline exceeded"),
                                    ("code", "prompt_deadline_exceeded"), ("promptId", "p1")]


def test_only_a_running_prompt_takes_a_cancel() -> None:
    assert after_cancel(S.RUNNING) is S.CANCELLING
    for state in (S.QUEUED, S.CANCELLING, S.CLOSING, S.ENDED):
        assert after_cancel(state) is None, state


def test_closing_cuts_every_unfinished_prompt_and_leaves_an_ended_one() -> None:
    for state in LIVE:
        assert after_close(state) is S.CLOSING, state
    assert after_close(S.ENDED) is S.ENDED
