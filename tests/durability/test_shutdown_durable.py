"""A graceful stop reports its sessions closed only once their closes are committed.

In-process and real: a real :class:`SessionManager` with the bundled mock agent (its own
process), a real :class:`TranscriptWriter` over a real SQLite :class:`TranscriptDatabase` whose
commits are held at a gate the test opens (the store's fault-injection seam). The idle sessions'
``session_closed`` frames are published together and made durable by the stop's one wait for
the transcript; while that commit is held the stop must not go on: no ``sessions_closed`` line,
no agent stopped.
"""

from __future__ import annotations

import logging
from pathlib import Path

import msgspec
import pytest
import trio
import trio.testing

from daemon.config import DaemonConfig
from daemon.manager import SessionManager
from daemon.transcript_store import AppendEvent, Op, TranscriptDatabase
from daemon.transcript_writer import TranscriptWriter
from tests.builders.commit_gate import CommitGate

pytestmark = pytest.mark.processes  # starts the mock agent: not in make unit-fast

SESSIONS = 3


def closed_sessions(ops: list[Op]) -> set[str]:
    """The sessions whose ``session_closed`` frame is among ``ops``."""
    closed = set()
    for op in ops:
        if isinstance(op, AppendEvent) and op.run is None:
            for line in op.raw.split(b"\n"):
                if msgspec.json.decode(line)["type"] == "session_closed":
                    closed.add(op.session_id)
    return closed


class LineWatch(logging.Handler):
    """Keeps, when the stop's ``event=sessions_closed`` line is written, what was committed."""

    def __init__(self, gate: CommitGate) -> None:
        super().__init__()
        self.gate = gate
        self.committed_then: list[list[Op]] = []

    def emit(self, record: logging.LogRecord) -> None:
        if "event=sessions_closed" in record.getMessage():
            self.committed_then.append(self.gate.committed())


async def test_the_stop_waits_for_the_idle_sessions_closes_to_commit(tmp_path: Path) -> None:
    gate = CommitGate()
    store = TranscriptDatabase(tmp_path / "t.sqlite3", hooks=gate.hooks)
    writer = TranscriptWriter(store)
    config = DaemonConfig(data_dir=tmp_path, workspace=str(tmp_path))
    watch = LineWatch(gate)
    logger = logging.getLogger("daemon.manager")
    logger.addHandler(watch)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(writer.run)
            manager = SessionManager(config, writer, nursery)
            ids = set()
            for _ in range(SESSIONS):
                session, _, _ = await manager.create(str(tmp_path), None, "thread", None)
                ids.add(session.id)
            assert await writer.wait_flushed()
            (agent,) = manager.agents.values()  # one workspace, one agent process
            stopped = trio.Event()

            async def stop() -> None:
                await manager.shutdown()
                stopped.set()

            entered = gate.close()
            try:
                nursery.start_soon(stop)
                with trio.fail_after(30):
                    await entered.wait()  # the closes' commit is held in the writer's thread
                # Everything that can run has run: the sessions' tasks ended, and the stop
                # waits for the transcript.
                await trio.testing.wait_all_tasks_blocked()
                assert closed_sessions(gate.committed()) == set()
                assert watch.committed_then == [], "the stop went on before the closes committed"
                assert not agent.closed, "an agent was stopped before the closes committed"
                assert not stopped.is_set()
            finally:
                gate.open()  # a held worker thread would hang the teardown
            with trio.fail_after(30):
                await stopped.wait()
            [committed] = watch.committed_then
            assert closed_sessions(committed) == ids
            assert agent.closed
            await writer.aclose()
            nursery.cancel_scope.cancel()
    finally:
        logger.removeHandler(watch)
        logger.setLevel(level)
        store.close()
    again = TranscriptDatabase(tmp_path / "t.sqlite3")
    try:
        for sid in ids:
            last = msgspec.json.decode(again.raw_events(sid)[-1])
            assert (last["type"], last["data"]["reason"]) == ("session_closed", "daemon_shutdown")
    finally:
        again.close()
