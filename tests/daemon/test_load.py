"""Load on loopback: 50 sessions x 4 SSE subscribers, 3 turns of 200 chunks per session, all at
once.

Every subscriber must end up with every event of its session exactly once and in id order. A
subscriber may be told ``state_resync_required`` or ``client_evicted`` when the slow-client
rules say so; it then resumes from its cursor, like the SDK, and must still end up with every
id. Any other frame is a failure. Runs under one overall deadline so a stall fails instead of
hanging; the time it took is printed, never asserted (timing belongs in ``benchmarks/``).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import trio

from sdk.protocol.envelope import DaemonEvent
from sdk.protocol.sse import SSEParser
from tests.harness import RunningDaemon, running_daemon
from tests.sse_client import chunk_kind, text_of

pytestmark = pytest.mark.processes  # starts processes: not in make unit-fast

SESSIONS = 50
SUBSCRIBERS = 4
TURNS = 3
CHUNKS = 200
MAX_QUEUED = 2048
DEADLINE_S = 120.0
TERMINALS = ("turn_complete", "turn_error")
# Id-less frames the stream may carry.
ALLOWED_SYNTHETIC = {"replay_complete", "state_resync_required", "slow_client_warning",
                     "client_evicted"}


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[RunningDaemon]:
    env = {"MOCK_ACP_PROMPT_DELAY_MS": "0", "MOCK_ACP_EMIT_CHUNKS": str(CHUNKS)}
    with running_daemon(tmp_path, env=env) as d:
        yield d


class Collector:
    """One SSE subscriber that resumes from its cursor whenever its stream ends."""

    def __init__(self, client: httpx.AsyncClient, sid: str, changed: trio.Condition) -> None:
        self.client = client
        self.sid = sid
        self.changed = changed
        self.events: list[DaemonEvent] = []
        self.synthetic: Counter[str] = Counter()
        self.cursor = 0
        self.epoch: str | None = None
        self.target: int | None = None  # stop once the cursor reaches it
        self.connections = 0

    @property
    def terminals(self) -> int:
        return sum(e.type in TERMINALS for e in self.events)

    @property
    def finished(self) -> bool:
        return self.target is not None and self.cursor >= self.target

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        started = False
        while not self.finished:
            headers = {"Last-Event-ID": str(self.cursor)}
            if self.epoch is not None:
                headers["X-Qwen-Event-Epoch"] = self.epoch
            async with self.client.stream(
                    "GET", f"/session/{self.sid}/events", params={"maxQueued": MAX_QUEUED},
                    headers=headers, timeout=httpx.Timeout(30, read=None)) as resp:
                assert resp.status_code == 200, await resp.aread()
                epoch = resp.headers["x-qwen-event-epoch"]
                assert self.epoch in (None, epoch), "the bus changed under a live session"
                self.epoch = epoch
                self.connections += 1
                if not started:
                    started = True
                    task_status.started()
                parser = SSEParser()
                async for chunk in resp.aiter_raw():
                    if not await self._take(parser.feed(chunk)):
                        break  # evicted: resume from the cursor on a new stream

    async def _take(self, events: list[DaemonEvent]) -> bool:
        """Record a batch; False when the stream should be dropped and resumed."""
        keep = True
        for event in events:
            if event.id is None:
                assert event.type in ALLOWED_SYNTHETIC, event
                self.synthetic[event.type] += 1
                if event.type == "client_evicted":
                    assert event.data["droppedAfter"] == self.cursor, event.data
                    keep = False
                continue
            # In order, no duplicate, no gap: the ring still holds every event of the run, so
            # even after a resync announcement a resumed stream must fill the gap.
            assert event.id == self.cursor + 1, (self.sid, self.cursor, event.id, event.type)
            self.cursor = event.id
            self.events.append(event)
        if events:
            async with self.changed:
                self.changed.notify_all()
        return keep and not self.finished


async def wait_for(changed: trio.Condition, predicate: Callable[[], bool]) -> None:
    async with changed:
        while not predicate():
            await changed.wait()


def check_turns(collector: Collector, prompt_ids: list[str]) -> None:
    by_prompt: dict[str, list[DaemonEvent]] = {pid: [] for pid in prompt_ids}
    for event in collector.events:
        if event.prompt_id in by_prompt:
            by_prompt[event.prompt_id].append(event)
    for pid, turn in by_prompt.items():
        terminals = [e for e in turn if e.type in TERMINALS]
        assert len(terminals) == 1 and terminals[0].type == "turn_complete", terminals
        assert terminals[0].data["promptId"] == pid
        chunks = [text_of(e) for e in turn if chunk_kind(e) == "agent_message_chunk"]
        assert chunks == [f"chunk-{i}" for i in range(CHUNKS)]


async def test_fifty_sessions_four_subscribers_get_every_event(daemon: RunningDaemon) -> None:
    began = time.monotonic()
    limits = httpx.Limits(max_connections=SESSIONS * SUBSCRIBERS + 50,
                          max_keepalive_connections=50)
    changed = trio.Condition()
    async with httpx.AsyncClient(base_url=daemon.url, limits=limits, timeout=30) as client:
        sids = []
        for _ in range(SESSIONS):
            resp = await client.post("/session", json={"sessionScope": "thread"})
            assert resp.status_code == 200, resp.text
            sids.append(resp.json()["sessionId"])
        collectors = {sid: [Collector(client, sid, changed) for _ in range(SUBSCRIBERS)]
                      for sid in sids}
        everyone = [c for group in collectors.values() for c in group]
        prompt_ids: dict[str, list[str]] = {sid: [] for sid in sids}

        async def prompts(sid: str) -> None:
            for turn in range(TURNS):
                resp = await client.post(f"/session/{sid}/prompt", json={
                    "prompt": [{"type": "text", "text": f"load {turn}"}]})
                assert resp.status_code == 202, resp.text
                prompt_ids[sid].append(resp.json()["promptId"])

        with trio.fail_after(DEADLINE_S):
            async with trio.open_nursery() as streams:
                for collector in everyone:
                    await streams.start(collector.run)
                async with trio.open_nursery() as senders:
                    for sid in sids:
                        senders.start_soon(prompts, sid)
                await wait_for(changed, lambda: all(c.terminals >= TURNS for c in everyone))
                # A queued prompt's pending_prompt_completed follows its terminal: stop at the
                # session's last id, read once every turn is over.
                for sid, group in collectors.items():
                    last = (await client.get(f"/session/{sid}/status")).json()["lastEventId"]
                    for collector in group:
                        collector.target = last
                async with changed:
                    changed.notify_all()
                await wait_for(changed, lambda: all(c.finished for c in everyone))
                streams.cancel_scope.cancel()

    for sid, group in collectors.items():
        reference = [(e.id, e.type) for e in group[0].events]
        assert group[0].target is not None
        assert [i for i, _ in reference] == list(range(1, group[0].target + 1))
        for collector in group:
            assert [(e.id, e.type) for e in collector.events] == reference
            assert collector.synthetic["replay_complete"] == collector.connections
            check_turns(collector, prompt_ids[sid])
    totals: Counter[str] = Counter()
    for collector in everyone:
        totals.update(collector.synthetic)
    events = sum(len(c.events) for c in everyone)
    print(f"\nload: {SESSIONS} sessions x {SUBSCRIBERS} subscribers, {events} events delivered "
          f"in {time.monotonic() - began:.1f} s; reconnects="
          f"{sum(c.connections - 1 for c in everyone)} synthetic={dict(totals)}")
