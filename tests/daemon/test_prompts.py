"""Prompt lifecycle against the real daemon and mock agent: cancel, reject, crash, deadline,
close, the FIFO queue and its limit — and exactly one terminal per admitted prompt."""

from __future__ import annotations

import shlex
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
import trio

from sdk.protocol.envelope import DaemonEvent
from tests.harness import RunningDaemon, running_daemon
from tests.sse_client import Subscriber, chunk_kind, is_terminal_for, text_of

pytestmark = pytest.mark.processes  # starts processes: not in make unit-fast


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    with running_daemon(tmp_path_factory.mktemp("prompts"), ["--cancel-grace-ms", "10000"]) as d:
        yield d


@asynccontextmanager
async def session(daemon: RunningDaemon, cwd: str | None = None
                  ) -> AsyncIterator[tuple[httpx.AsyncClient, str, Subscriber, str]]:
    async with httpx.AsyncClient(base_url=daemon.url) as client, trio.open_nursery() as nursery:
        body: dict[str, str] = {"sessionScope": "thread"}
        if cwd is not None:
            body["cwd"] = cwd
        created = (await client.post("/session", json=body)).json()
        sid = created["sessionId"]
        client.headers["X-Qwen-Client-Id"] = created["clientId"]
        sub = Subscriber(client, f"/session/{sid}/events", {"Last-Event-ID": "0"})
        await nursery.start(sub.run)
        yield client, sid, sub, created["clientId"]
        nursery.cancel_scope.cancel()


async def send(client: httpx.AsyncClient, sid: str, text: str, **extra: object) -> str:
    resp = await client.post(f"/session/{sid}/prompt",
                             json={"prompt": [{"type": "text", "text": text}], **extra})
    assert resp.status_code == 202, resp.text
    return str(resp.json()["promptId"])


def terminals(sub: Subscriber, pid: str) -> list[DaemonEvent]:
    return [e for e in sub.events if is_terminal_for(pid)(e)]


async def test_cancel_hanging_prompt_ends_cancelled(daemon: RunningDaemon) -> None:
    async with session(daemon) as (client, sid, sub, client_id):
        pid = await send(client, sid, "mock:mode=hang")
        await sub.wait_for(lambda e: chunk_kind(e) == "user_message_chunk")
        resp = await client.post(f"/session/{sid}/cancel")
        assert resp.status_code == 204
        terminal = await sub.wait_for(is_terminal_for(pid))
        assert terminal.type == "turn_complete"
        assert terminal.data["stopReason"] == "cancelled"
        cancelled = sub.of_type("prompt_cancelled")
        assert len(cancelled) == 1 and cancelled[0].prompt_id == pid
        assert cancelled[0].originator_client_id == client_id
        assert sub.events.index(cancelled[0]) < sub.events.index(terminal)
        # A second cancel with nothing running publishes nothing.
        before = len(sub.events)
        assert (await client.post(f"/session/{sid}/cancel")).status_code == 204
        pid2 = await send(client, sid, "mock:chunks=1 mock:delay_ms=0")
        await sub.wait_for(is_terminal_for(pid2))
        assert not [e for e in sub.events[before:] if e.type == "prompt_cancelled"]
        assert len(terminals(sub, pid)) == 1


async def test_reject_ends_with_turn_error(daemon: RunningDaemon) -> None:
    async with session(daemon) as (client, sid, sub, _):
        pid = await send(client, sid, "mock:mode=reject")
        terminal = await sub.wait_for(is_terminal_for(pid))
        assert terminal.type == "turn_error"
        assert terminal.data["message"] == "injected error"
        assert terminal.data["code"] == "-32603"
        assert terminal.prompt_id == pid
        # The session keeps working.
        pid2 = await send(client, sid, "mock:chunks=2 mock:delay_ms=0")
        ok = await sub.wait_for(is_terminal_for(pid2))
        assert ok.type == "turn_complete" and len(terminals(sub, pid)) == 1


async def test_deadline_ends_with_prompt_deadline_exceeded(daemon: RunningDaemon) -> None:
    async with session(daemon) as (client, sid, sub, _):
        pid = await send(client, sid, "mock:mode=hang", deadlineMs=200)
        terminal = await sub.wait_for(is_terminal_for(pid))
        assert terminal.type == "turn_error"
        assert terminal.data["code"] == "prompt_deadline_exceeded"


async def test_crash_on_prompt_kills_only_its_workspace(daemon: RunningDaemon,
                                                        tmp_path: object) -> None:
    other = daemon.data_dir.parent / "other-workspace"
    other.mkdir(exist_ok=True)
    async with session(daemon, str(other)) as (oclient, osid, osub, _), \
            session(daemon) as (client, sid, sub, _):
        # Queue everything behind a gated prompt, so the crash happens with a prompt waiting.
        first = await send(client, sid, "mock:chunks=1 mock:gate=before-crash")
        pid = await send(client, sid, "mock:mode=crash-on-prompt")
        queued_behind = await send(client, sid, "never runs")
        daemon.open_gate("before-crash")
        assert (await sub.wait_for(is_terminal_for(first))).type == "turn_complete"
        terminal = await sub.wait_for(is_terminal_for(pid))
        assert terminal.type == "turn_error" and terminal.data["code"] == "channel_closed"
        queued_terminal = await sub.wait_for(is_terminal_for(queued_behind))
        assert queued_terminal.data["code"] == "channel_closed"
        died = await sub.wait_for(lambda e: e.type == "session_died")
        assert died.data["reason"] == "channel_closed" and died.data["sessionId"] == sid
        assert sub.events.index(queued_terminal) < sub.events.index(died)
        removed = [e for e in sub.of_type("pending_prompt_completed")
                   if e.data["promptId"] == queued_behind]
        assert [e.data["state"] for e in removed] == ["removed"]
        await sub.wait_ended()
        assert len(terminals(sub, pid)) == 1 and len(terminals(sub, queued_behind)) == 1
        assert (await client.get(f"/session/{sid}/status")).status_code == 404
        # The other workspace's agent and session are unaffected.
        opid = await send(oclient, osid, "mock:chunks=2 mock:delay_ms=0")
        done = await osub.wait_for(is_terminal_for(opid))
        assert done.type == "turn_complete"
        # The next request for the crashed workspace starts a new agent.
        fresh = await client.post("/session", json={"sessionScope": "thread"})
        assert fresh.status_code == 200


async def test_queue_is_fifo_limited_to_five_and_announced(daemon: RunningDaemon) -> None:
    async with session(daemon) as (client, sid, sub, _):
        pids = [await send(client, sid, f"q{i} mock:chunks=1 mock:gate=queue-gate")
                for i in range(5)]
        full = await client.post(f"/session/{sid}/prompt",
                                 json={"prompt": [{"type": "text", "text": "sixth"}]})
        assert full.status_code == 503
        assert full.headers["retry-after"] == "5"
        body = full.json()
        assert body["code"] == "prompt_queue_full" and body["limit"] == 5
        assert body["pendingCount"] == 5 and isinstance(body["error"], str)
        added = [e.data["promptId"] for e in sub.of_type("pending_prompt_added")]
        await sub.wait_for(lambda e: e.type == "pending_prompt_added"
                           and e.data["promptId"] == pids[4])
        added = [e.data["promptId"] for e in sub.of_type("pending_prompt_added")]
        assert added == pids[1:]
        daemon.open_gate("queue-gate")
        for pid in pids:
            await sub.wait_for(is_terminal_for(pid))
        order = [e.data["promptId"] for e in sub.events if e.type == "turn_complete"]
        assert order == pids
        for pid in pids[1:]:
            kinds = [e.type for e in sub.events if e.prompt_id == pid]
            assert kinds[0] == "pending_prompt_added"
            assert kinds.index("pending_prompt_started") < kinds.index("turn_complete")
            assert kinds[-1] == "pending_prompt_completed"
            completed = [e for e in sub.of_type("pending_prompt_completed")
                         if e.data["promptId"] == pid]
            assert completed[0].data["state"] == "completed"
        for pid in pids:
            assert len(terminals(sub, pid)) == 1


async def test_delete_mid_turn_closes_session(daemon: RunningDaemon) -> None:
    async with session(daemon) as (client, sid, sub, _):
        pid = await send(client, sid, "mock:chunks=1 mock:gate=never-opened")
        await sub.wait_for(lambda e: text_of(e) == "chunk-0")
        assert (await client.delete(f"/session/{sid}")).status_code == 204
        terminal = await sub.wait_for(is_terminal_for(pid))
        assert terminal.type == "turn_error" and terminal.data["code"] == "session_closed"
        closed = await sub.wait_for(lambda e: e.type == "session_closed")
        assert closed.data == {"sessionId": sid, "reason": "client_close"}
        assert sub.events.index(terminal) < sub.events.index(closed)
        await sub.wait_ended()
        resp = await client.post(f"/session/{sid}/load", json={})
        assert resp.status_code == 404 and resp.json()["code"] == "session_not_found"


async def test_prompt_cursor_is_read_before_admission(daemon: RunningDaemon) -> None:
    async with session(daemon) as (client, sid, sub, _):
        first = await send(client, sid, "mock:chunks=3 mock:delay_ms=0")
        await sub.wait_for(is_terminal_for(first))
        resp = await client.post(f"/session/{sid}/prompt", json={
            "prompt": [{"type": "text", "text": "mock:chunks=3 mock:delay_ms=0"}]})
        accepted = resp.json()
        late = Subscriber(client, f"/session/{sid}/events", {
            "Last-Event-ID": str(accepted["lastEventId"]),
            "X-Qwen-Event-Epoch": accepted["eventEpoch"]})
        async with trio.open_nursery() as nursery:
            await nursery.start(late.run)
            await late.wait_for(is_terminal_for(accepted["promptId"]))
            nursery.cancel_scope.cancel()
        turn = [e for e in late.events if e.id is not None]
        assert chunk_kind(turn[0]) == "user_message_chunk"
        assert turn[0].prompt_id == accepted["promptId"]
        assert [text_of(e) for e in turn[1:4]] == ["chunk-0", "chunk-1", "chunk-2"]


async def test_cancel_grace_ends_a_turn_the_agent_never_ends(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    agent = Path(__file__).parents[1] / "agents" / "faulty_agent.py"
    base = tmp_path_factory.mktemp("grace")
    (base / "faulty-agent-mode").write_text("ignore-cancel")
    with running_daemon(base, ["--agent", shlex.join([sys.executable, str(agent)]),
                               "--cancel-grace-ms", "300"]) as daemon:
        async with session(daemon) as (client, sid, sub, _):
            pid = await send(client, sid, "mock:mode=hang mock:chunks=1")
            await sub.wait_for(lambda e: text_of(e) == "chunk-0")
            assert (await client.post(f"/session/{sid}/cancel")).status_code == 204
            terminal = await sub.wait_for(is_terminal_for(pid))
            assert terminal.type == "turn_complete"
            assert terminal.data["stopReason"] == "cancelled"
            # The session still works, and the stray turn got exactly one terminal.
            pid2 = await send(client, sid, "mock:chunks=1 mock:delay_ms=0")
            assert (await sub.wait_for(is_terminal_for(pid2))).type == "turn_complete"
            assert len(terminals(sub, pid)) == 1
