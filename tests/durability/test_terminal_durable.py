"""A turn's terminal is durable history: no subscriber sees a terminal before
everything the session published ahead of it is committed.

In-process and real except for the agent: a real :class:`TranscriptWriter` over a real SQLite
:class:`TranscriptDatabase` whose commits are held on a gate the test opens, a real
:class:`SessionBus` and :class:`Session` (its prompt runner), and a reader that follows the
bus's ring the way the SSE stream does. The agent is a stand-in that streams its chunks into
the session and answers ``end_turn`` at once, so the only thing that can hold the terminal back
is the durability wait.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import trio
import trio.testing

from daemon.bus import BusLimits, SessionBus
from daemon.core.envelope import Event
from daemon.session import Session
from daemon.transcript_store import TranscriptDatabase, UpsertSession
from daemon.transcript_writer import TranscriptWriter
from tests.builders.commit_gate import CommitGate

SID = "44444444-4444-4444-8444-444444444444"
CHUNKS = 200


class StreamingAgent:
    """The agent side of one ACP session: streams chunks into the sink, then ends the turn."""

    closed = False
    exit_code = None
    signal_name = None
    supports_load_session = False

    def __init__(self) -> None:
        self.sink: Any = None
        self.answered = trio.Event()

    def attach(self, acp_session_id: str, sink: Any) -> None:
        self.sink = sink

    def detach(self, acp_session_id: str, sink: Any = None) -> None:
        self.sink = None

    def group_lines_changed(self) -> None:
        """The session says its subscribers changed; one sink, nothing to recompute."""

    async def prompt(self, acp_session_id: str, blocks: list[Any]) -> dict[str, Any]:
        for i in range(CHUNKS):
            # The channel hands its sink the agent's bytes of each update object.
            self.sink.on_update(msgspec.json.encode({
                "sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": f"chunk-{i}"}}))
            if i % 50 == 49:
                self.sink.flush()
                await trio.lowlevel.checkpoint()
        self.sink.flush()
        self.answered.set()
        return {"stopReason": "end_turn"}

    async def cancel(self, acp_session_id: str) -> None:
        pass


async def follow(bus: SessionBus, seen: list[Event]) -> None:
    """Read the bus's ring from the start, as a subscriber's stream does."""
    cursor = 0
    while not bus.closed or bus.ring.last_id > cursor:
        await bus.wait_for_events(cursor)
        fresh = bus.ring.since(cursor)
        if fresh:
            seen.extend(fresh)
            cursor = fresh[-1].id or cursor


def terminals(seen: list[Event]) -> list[Event]:
    return [e for e in seen if e.type in ("turn_complete", "turn_error")]


async def test_no_terminal_reaches_a_subscriber_before_its_turn_is_committed(
        tmp_path: Path) -> None:
    gate = CommitGate()
    store = TranscriptDatabase(tmp_path / "t.db", hooks=gate.hooks)
    store.apply([UpsertSession(SID, str(tmp_path), 1)])
    writer = TranscriptWriter(store)
    bus = SessionBus(SID, BusLimits(10_000, 8 << 20, 4 << 20, 8000), writer)
    agent = StreamingAgent()
    session = Session(SID, str(tmp_path), "now", agent, "acp-1", bus)  # type: ignore[arg-type]
    seen: list[Event] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        await nursery.start(session.run)
        nursery.start_soon(follow, bus, seen)
        entered = gate.close()  # from here on nothing commits until the test opens the gate
        try:
            session.admit([{"type": "text", "text": "hello"}], None, None)
            await agent.answered.wait()
            await entered.wait()
            # Everything that can run has run: the agent answered, the runner is parked in its
            # durability wait, the writer's thread is held at the gate.
            await trio.testing.wait_all_tasks_blocked()
            assert gate.held >= 1
            texts = [e for e in seen if e.type == "session_update"]
            assert len(texts) == CHUNKS + 1  # the echo and every chunk reached the reader
            assert terminals(seen) == []
            assert terminals(bus.ring.since(0)) == []
            assert writer.durable_event_id(SID) < (texts[-1].id or 0)
        finally:
            # Released on failure too: a parked worker thread would hang the teardown.
            gate.open()
        with trio.fail_after(10):
            while not terminals(seen):
                await bus.wait_for_events(seen[-1].id or 0)
                await trio.testing.wait_all_tasks_blocked()
        [terminal] = terminals(seen)
        assert terminal.type == "turn_complete" and terminal.id is not None
        # Everything published before the terminal was committed when it went out.
        assert writer.durable_event_id(SID) >= terminal.id - 1
        assert await writer.read(lambda s: s.record_count(SID)) > 0  # then the turn boundary
        assert bus.transcript_degraded is False
        await session.close("test_done")
        await writer.aclose()
        nursery.cancel_scope.cancel()
    store.close()
