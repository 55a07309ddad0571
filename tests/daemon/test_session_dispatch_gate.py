"""The session runner hands a prompt to the agent only once its dispatch gate (cluster mode:
is this node sure it owns the session?) says so.

In-process: a real :class:`Session` and :class:`SessionBus` (no transcript), an agent stand-in
that records every prompt it receives, and a gate the test answers by hand. While the gate has
not answered the agent receives nothing; "confirmed" hands the prompt over; "lost" never does,
and the session ends (its runner does not hang); a close while the gate waits ends the wait.
Broken on purpose: without the gate the agent receives the prompt before any answer.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import trio.testing

from daemon.bus import BusLimits, SessionBus
from daemon.session import Session

SID = "55555555-5555-4555-8555-555555555555"


class RecordingAgent:
    """The agent side of one ACP session: records each prompt, answers ``end_turn``."""

    closed = False
    exit_code = None
    signal_name = None
    supports_load_session = False

    def __init__(self) -> None:
        self.received: list[list[Any]] = []

    def attach(self, acp_session_id: str, sink: Any) -> None:
        pass

    def detach(self, acp_session_id: str, sink: Any = None) -> None:
        pass

    def group_lines_changed(self) -> None:
        pass

    async def prompt(self, acp_session_id: str, blocks: list[Any]) -> dict[str, Any]:
        self.received.append(blocks)
        return {"stopReason": "end_turn"}

    async def cancel(self, acp_session_id: str) -> None:
        pass


class HandGate:
    """A dispatch gate the test answers: each ask waits for :meth:`answer`."""

    def __init__(self) -> None:
        self.asks = 0
        self._answer: bool | None = None
        self._answered = trio.Event()

    async def __call__(self) -> bool:
        self.asks += 1
        await self._answered.wait()
        assert self._answer is not None
        return self._answer

    def answer(self, allowed: bool) -> None:
        self._answer = allowed
        self._answered.set()


def make_session(gate: HandGate | None) -> tuple[Session, RecordingAgent]:
    agent = RecordingAgent()
    bus = SessionBus(SID, BusLimits(10_000, 8 << 20, 4 << 20, 8000), None)
    session = Session(SID, "/", "now", agent, "acp-1", bus,  # type: ignore[arg-type]
                      may_act=gate)
    return session, agent


def terminals(session: Session) -> list[str]:
    return [e.type for e in session.bus.ring.since(0) if e.type in ("turn_complete",
                                                                   "turn_error")]


@asynccontextmanager
async def running(session: Session) -> AsyncIterator[None]:
    """The session's runner, cancelled if the test fails (a runner left waiting would hang
    the test instead of failing it)."""
    async with trio.open_nursery() as nursery:
        await nursery.start(session.run)
        try:
            yield
        finally:
            if not session.ended.is_set():
                nursery.cancel_scope.cancel()


async def turn_ended(session: Session) -> None:
    with trio.fail_after(10):
        while True:
            seen = session.bus.ring.last_id
            if terminals(session):
                return
            await session.bus.wait_for_events(seen)


BLOCKS = [{"type": "text", "text": "hello"}]


async def test_the_agent_gets_the_prompt_only_once_the_gate_confirms() -> None:
    gate = HandGate()
    session, agent = make_session(gate)
    async with running(session):
        accepted = session.admit(BLOCKS, None, None)
        await trio.testing.wait_all_tasks_blocked()  # the runner waits for the gate
        assert agent.received == [] and gate.asks == 1
        assert session.prompt_state(accepted.prompt_id) == "queued"
        gate.answer(True)
        await turn_ended(session)
        assert agent.received == [BLOCKS]
        assert terminals(session) == ["turn_complete"]
        await session.close("test_done")
    assert gate.asks == 1


async def test_a_lost_lease_never_hands_the_prompt_over_and_the_session_ends() -> None:
    gate = HandGate()
    session, agent = make_session(gate)
    async with running(session):
        session.admit(BLOCKS, None, None)
        session.admit([{"type": "text", "text": "second"}], None, None)
        await trio.testing.wait_all_tasks_blocked()  # the runner waits for the gate
        assert gate.asks == 1
        gate.answer(False)
        with trio.fail_after(10):
            await session.ended.wait()  # the runner does not hang
    assert agent.received == []
    assert session.closing == "lease_lost"
    assert not session.queue and session.active is None
    assert gate.asks == 1
    # Both prompts ended with the session here (its bus is fenced in cluster mode).
    assert terminals(session) == ["turn_error", "turn_error"]


@pytest.mark.parametrize("ending", ["close", "agent_death"])
async def test_a_close_or_the_agents_death_ends_the_wait_for_the_gate(ending: str) -> None:
    gate = HandGate()  # never answers
    session, agent = make_session(gate)
    async with running(session):
        session.admit(BLOCKS, None, None)
        await trio.testing.wait_all_tasks_blocked()  # the runner waits for the gate
        assert gate.asks == 1
        with trio.fail_after(10):
            if ending == "close":
                await session.close("client_close")
            else:
                session.agent_died(1, None)
                await session.ended.wait()
    assert agent.received == []
    if ending == "agent_death":
        assert session.closing is None  # it died; it was not taken for a lost lease
    assert terminals(session) == ["turn_error"]


async def test_a_single_node_has_no_gate() -> None:
    session, agent = make_session(None)
    async with running(session):
        session.admit(BLOCKS, None, None)
        await turn_ended(session)
        assert agent.received == [BLOCKS]
        await session.close("test_done")
