"""Agents that misbehave in new ways, against the real daemon and real agent processes: an agent
that stops reading its stdin, one that hands out one session id twice, one that floods
permission requests, one that floods stderr, one that never initializes while several creates
wait for it; a permission request nobody answers; and input echoed in error bodies.

The agent is ``tests/agents/faulty_agent.py``; each workspace's ``faulty-agent-mode`` file picks
its agent's fault. The ``ok`` workspace runs the plain mock: the tests check that it keeps
serving, with the same agent process, while another workspace's agent misbehaves.
"""

from __future__ import annotations

import os
import pty
import re
import shlex
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
import trio

from daemon.core.acp_client import MAX_PENDING_PERMISSIONS, TOO_MANY_REQUESTS
from daemon.core.throttle import LineBudget
from sdk.protocol.envelope import DaemonEvent
from tests.harness import RunningDaemon, running_daemon
from tests.sse_client import Subscriber, chunk_kind, is_terminal_for, text_of

pytestmark = pytest.mark.processes  # starts processes: not in make unit-fast

FAULTY_AGENT = Path(__file__).parents[1] / "agents" / "faulty_agent.py"
AGENT = f"{shlex.quote(sys.executable)} {shlex.quote(str(FAULTY_AGENT))}"
CLIENT_TIMEOUT_S = 30.0
# An agent whose stdin takes nothing this long is declared dead (the daemon's flag).
WRITE_TIMEOUT_MS = 5000
FLOOD_PERMISSIONS = 300
STDERR_LINES = 200_000  # 100 bytes each: 20 MB of agent stderr
MODES = ("ok", "stop-reading", "same-id", "permission-flood", "stderr-flood")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    base = tmp_path_factory.mktemp("agent-hardening")
    for name in MODES:
        (base / name).mkdir()
        (base / name / "faulty-agent-mode").write_text("mock" if name == "ok" else name)
    env = {"FAULTY_AGENT_PERMISSIONS": str(FLOOD_PERMISSIONS),
           "FAULTY_AGENT_STDERR_LINES": str(STDERR_LINES)}
    with running_daemon(base, ["--agent", AGENT, "--agent-init-timeout-ms", "30000",
                               "--agent-write-timeout-ms", str(WRITE_TIMEOUT_MS)], env) as d:
        yield d


def workspace(daemon: RunningDaemon, name: str) -> str:
    return str(daemon.data_dir.parent / name)


async def agent_pids(client: httpx.AsyncClient) -> dict[str, int]:
    status = (await client.get("/daemon/status")).json()
    return {a["workspaceCwd"]: a["pid"] for a in status["agents"]}


async def create(client: httpx.AsyncClient, cwd: str) -> httpx.Response:
    with trio.fail_after(CLIENT_TIMEOUT_S):
        return await client.post("/session", json={"cwd": cwd, "sessionScope": "thread"})


async def send(client: httpx.AsyncClient, sid: str, text: str) -> str:
    resp = await client.post(f"/session/{sid}/prompt",
                             json={"prompt": [{"type": "text", "text": text}]})
    assert resp.status_code == 202, resp.text
    return str(resp.json()["promptId"])


@asynccontextmanager
async def following(client: httpx.AsyncClient, sid: str) -> AsyncIterator[Subscriber]:
    """Every frame of the session from its start, while the block runs."""
    async with trio.open_nursery() as nursery:
        sub = Subscriber(client, f"/session/{sid}/events", {"Last-Event-ID": "0"})
        await nursery.start(sub.run)
        yield sub
        nursery.cancel_scope.cancel()


def agent_chunks(events: list[DaemonEvent], prompt_id: str) -> list[str]:
    return [text_of(e) for e in events
            if e.prompt_id == prompt_id and chunk_kind(e) == "agent_message_chunk"]


async def wait_for_log(daemon: RunningDaemon, pattern: str) -> re.Match[str]:
    """The first daemon log match of ``pattern``, polled under a deadline."""
    with trio.fail_after(CLIENT_TIMEOUT_S):
        while (found := re.search(pattern, daemon.stderr())) is None:
            await trio.sleep(0.05)
    return found


async def assert_ok_workspace_serves(client: httpx.AsyncClient, daemon: RunningDaemon,
                                     ok_pid: int | None = None) -> int:
    """A turn on the healthy workspace completes; returns its agent's pid (checked against
    ``ok_pid`` when given)."""
    created = await create(client, workspace(daemon, "ok"))
    assert created.status_code == 200, created.text
    sid = created.json()["sessionId"]
    async with following(client, sid) as sub:
        pid = await send(client, sid, "mock:chunks=2 still here")
        terminal = await sub.wait_for(is_terminal_for(pid), timeout=CLIENT_TIMEOUT_S)
    assert terminal.type == "turn_complete"
    assert agent_chunks(sub.events, pid) == ["chunk-0", "chunk-1"]
    pids = await agent_pids(client)
    if ok_pid is not None:
        assert pids[workspace(daemon, "ok")] == ok_pid, "the healthy agent was restarted"
    return pids[workspace(daemon, "ok")]


# --- an agent that stops reading its stdin ------------------------------------------------------


async def test_an_agent_that_stops_reading_stdin_is_declared_dead_and_blocks_nobody(
        daemon: RunningDaemon) -> None:
    cwd = workspace(daemon, "stop-reading")
    async with httpx.AsyncClient(base_url=daemon.url, timeout=CLIENT_TIMEOUT_S) as client:
        ok_pid = await assert_ok_workspace_serves(client, daemon)
        first, second = [await create(client, cwd) for _ in range(2)]
        assert first.status_code == second.status_code == 200, (first.text, second.text)
        sid_a, sid_b = first.json()["sessionId"], second.json()["sessionId"]
        stuck_pid = (await agent_pids(client))[cwd]
        async with following(client, sid_a) as sub_a, following(client, sid_b) as sub_b:
            pid_a = await send(client, sid_a, "stop-reading")
            await sub_a.wait_for(lambda e: text_of(e) == "stopped-reading")
            # 3 MB on the other session of the workspace: its write fills the pipe and stalls.
            pid_b = await send(client, sid_b, "x" * 3_000_000)
            await sub_b.wait_for(lambda e: chunk_kind(e) == "user_message_chunk")
            # A cancel while that write is stalled is answered at once (its line waits in the
            # queue), long before the stall deadline declares the agent dead.
            with trio.fail_after(CLIENT_TIMEOUT_S):
                cancelled = await client.post(f"/session/{sid_a}/cancel")
            assert cancelled.status_code == 204
            assert "event=agent_stdin_stalled" not in daemon.stderr()
            assert (await client.get("/health")).status_code == 200
            # A create in the workspace waits behind the stalled write, and is answered once
            # the deadline declares the agent dead: 502, not a hang.
            late = await create(client, cwd)
            assert late.status_code == 502, late.text
            assert late.json()["code"] == "agent_start_failed"
            assert "agent declared dead" in late.json()["error"]
            # Both sessions end: their prompts terminated, then session_died (SIGKILL).
            for sub, pid in ((sub_a, pid_a), (sub_b, pid_b)):
                terminal = await sub.wait_for(is_terminal_for(pid), timeout=CLIENT_TIMEOUT_S)
                assert terminal.type == "turn_error"
                assert terminal.data["code"] == "channel_closed"
                died = await sub.wait_for(lambda e: e.type == "session_died",
                                          timeout=CLIENT_TIMEOUT_S)
                assert died.data["signalCode"] == "SIGKILL"
                assert sub.events.index(terminal) < sub.events.index(died)
        stalled = await wait_for_log(
            daemon, rf"event=agent_stdin_stalled pid={stuck_pid} timeout_ms={WRITE_TIMEOUT_MS}"
                    r" line_bytes=(\d+) .*action=kill")
        assert int(stalled.group(1)) > 3_000_000  # the prompt's line is the stalled one
        # The next create starts a fresh agent, which serves a whole turn.
        fresh = await create(client, cwd)
        assert fresh.status_code == 200, fresh.text
        assert (await agent_pids(client))[cwd] != stuck_pid
        sid = fresh.json()["sessionId"]
        async with following(client, sid) as sub:
            pid = await send(client, sid, "mock:chunks=2")
            terminal = await sub.wait_for(is_terminal_for(pid), timeout=CLIENT_TIMEOUT_S)
        assert terminal.type == "turn_complete" and agent_chunks(sub.events, pid) == [
            "chunk-0", "chunk-1"]
        await assert_ok_workspace_serves(client, daemon, ok_pid)


# --- an agent that reuses a session id ----------------------------------------------------------


async def test_an_agent_that_reuses_a_session_id_cannot_cross_sessions(
        daemon: RunningDaemon) -> None:
    cwd = workspace(daemon, "same-id")
    async with httpx.AsyncClient(base_url=daemon.url, timeout=CLIENT_TIMEOUT_S) as client:
        first = await create(client, cwd)
        assert first.status_code == 200, first.text
        sid = first.json()["sessionId"]
        second = await create(client, cwd)
        assert second.status_code == 502, second.text
        body = second.json()
        assert body["code"] == "agent_session_id_reused"
        assert "the-one-session" in body["error"]
        log_line = await wait_for_log(daemon, r"event=agent_session_id_reused .*"
                                              r"acp_session_id='the-one-session'.*")
        assert "action=refuse_create" in log_line.group(0)
        # The first session keeps its agent session: its turn lands in its own transcript.
        async with following(client, sid) as sub:
            pid = await send(client, sid, "mock:chunks=3")
            terminal = await sub.wait_for(is_terminal_for(pid), timeout=CLIENT_TIMEOUT_S)
        assert terminal.type == "turn_complete"
        assert agent_chunks(sub.events, pid) == ["chunk-0", "chunk-1", "chunk-2"]
        status = (await client.get("/daemon/status")).json()
        assert [s["sessionId"] for s in status["sessions"]
                if s["workspaceCwd"] == cwd] == [sid]


# --- permission requests: capped, resolved before the terminal, votes checked -------------------


async def test_a_permission_flood_is_capped_and_resolved_before_the_terminal(
        daemon: RunningDaemon) -> None:
    cwd = workspace(daemon, "permission-flood")
    async with httpx.AsyncClient(base_url=daemon.url, timeout=CLIENT_TIMEOUT_S) as client:
        created = await create(client, cwd)
        assert created.status_code == 200, created.text
        sid = created.json()["sessionId"]
        async with following(client, sid) as sub:
            # The agent asks 300 permissions and answers the prompt without waiting.
            pid = await send(client, sid, "flood")
            terminal = await sub.wait_for(is_terminal_for(pid), timeout=CLIENT_TIMEOUT_S)
            assert (await client.get("/health")).status_code == 200
        assert terminal.type == "turn_complete"
        turn = sub.events[:sub.events.index(terminal)]
        requests = [e for e in turn if e.type == "permission_request"]
        resolved = [e for e in turn if e.type == "permission_resolved"]
        assert len(requests) == MAX_PENDING_PERMISSIONS
        # Every admitted request is resolved, by the turn's end, before its terminal.
        assert sorted(e.data["requestId"] for e in resolved) == sorted(
            e.data["requestId"] for e in requests)
        assert {(e.data["outcome"]["outcome"], e.data["reason"]) for e in resolved} == {
            ("cancelled", "turn_ended")}
        assert all(e.prompt_id == pid for e in requests + resolved)
        assert [e for e in sub.events[sub.events.index(terminal):]
                if e.type.startswith("permission_")] == []
        # The agent got an answer to every request: the excess refused with an error.
        report = await wait_for_log(daemon, r"permission-flood: answered=(\d+) refused=(\d+) "
                                            r"codes=\[(-?\d+)\]")
        assert report.groups() == (str(MAX_PENDING_PERMISSIONS),
                                   str(FLOOD_PERMISSIONS - MAX_PENDING_PERMISSIONS),
                                   str(TOO_MANY_REQUESTS))
        refused = re.findall(r"event=agent_permission_refused .*count=(\d+)", daemon.stderr())
        assert refused and len(refused) < 5  # a flood is a few log lines, not one per request


# --- agent stderr -------------------------------------------------------------------------------


async def test_agent_stderr_is_rate_limited_with_a_count_of_what_was_dropped(
        daemon: RunningDaemon) -> None:
    cwd = workspace(daemon, "stderr-flood")
    async with httpx.AsyncClient(base_url=daemon.url, timeout=CLIENT_TIMEOUT_S) as client:
        before = len(daemon.stderr_path.read_bytes())
        created = await create(client, cwd)
        assert created.status_code == 200, created.text
        sid = created.json()["sessionId"]
        agent_pid = (await agent_pids(client))[cwd]
        async with following(client, sid) as sub:
            # 20 MB of stderr first, then the turn: the agent never blocks on its stderr.
            pid = await send(client, sid, "mock:chunks=2")
            terminal = await sub.wait_for(is_terminal_for(pid), timeout=CLIENT_TIMEOUT_S)
        assert terminal.type == "turn_complete"
        assert agent_chunks(sub.events, pid) == ["chunk-0", "chunk-1"]
        # One line says how many were dropped, once the flood has paused.
        report = await wait_for_log(daemon, rf"event=agent_stderr_dropped pid={agent_pid} "
                                            r"lines=(\d+) bytes=(\d+)")
        assert int(report.group(1)) > 0
    log = daemon.stderr_path.read_bytes()[before:].decode(errors="replace")
    logged = len(re.findall(rf"event=agent_stderr pid={agent_pid} ", log))
    dropped = [(int(n), int(b)) for n, b in re.findall(
        rf"event=agent_stderr_dropped pid={agent_pid} lines=(\d+) bytes=(\d+)", log)]
    # Every line is either logged or counted as dropped (the final "done" line included).
    assert logged + sum(n for n, _ in dropped) == STDERR_LINES + 1
    assert sum(b for _, b in dropped) >= (STDERR_LINES - logged) * 99
    # 20 MB of agent stderr made well under 1 MB of daemon log: the burst and the rate.
    assert len(log) < 1_000_000, len(log)
    assert logged < STDERR_LINES // 100


def test_line_budget_refills_at_its_rates_up_to_its_bursts() -> None:
    budget = LineBudget(lines_per_s=2, line_burst=3, bytes_per_s=100, byte_burst=250)
    assert [budget.allow(0.0, 10) for _ in range(4)] == [True, True, True, False]
    assert budget.take_dropped() == (1, 10)
    assert budget.take_dropped() == (0, 0)
    assert budget.allow(0.5, 10)  # one line refilled after 0.5 s
    assert not budget.allow(0.5, 10)
    assert budget.allow(100.0, 250)  # refilled to the burst, not beyond
    assert not budget.allow(100.0, 1)
    assert not budget.allow(101.0, 200)  # bytes: 100 refilled, 200 asked
    assert budget.take_dropped() == (3, 211)
    with pytest.raises(ValueError):
        LineBudget(lines_per_s=0, line_burst=1, bytes_per_s=1, byte_burst=1)


# --- starting an agent that never initializes ---------------------------------------------------


@pytest.fixture
def impatient_daemon(tmp_path: Path) -> Iterator[RunningDaemon]:
    (tmp_path / "silent").mkdir()
    (tmp_path / "silent" / "faulty-agent-mode").write_text("silent-init")
    with running_daemon(tmp_path, ["--agent", AGENT, "--agent-init-timeout-ms", "1000"]) as d:
        yield d


async def test_concurrent_creates_share_one_start_attempt_and_its_failure(
        impatient_daemon: RunningDaemon) -> None:
    daemon = impatient_daemon
    cwd = workspace(daemon, "silent")
    answers: list[httpx.Response] = []
    async with httpx.AsyncClient(base_url=daemon.url, timeout=CLIENT_TIMEOUT_S) as client:

        async def one() -> None:
            answers.append(await create(client, cwd))

        async with trio.open_nursery() as nursery:
            for _ in range(4):
                nursery.start_soon(one)
    assert [a.status_code for a in answers] == [502] * 4
    assert {a.json()["error"] for a in answers} == {
        answers[0].json()["error"]}  # one failure, shared
    assert "no initialize reply within 1 s" in answers[0].json()["error"]
    log = daemon.stderr()
    started = re.findall(rf"event=agent_started pid=\d+ argv=.* cwd='{re.escape(cwd)}'", log)
    assert len(started) == 1, log[-3000:]
    # The next create (after the failure) is a new attempt.
    async with httpx.AsyncClient(base_url=daemon.url, timeout=CLIENT_TIMEOUT_S) as client:
        assert (await create(client, cwd)).status_code == 502
    assert len(re.findall(rf"event=agent_started pid=\d+ argv=.* cwd='{re.escape(cwd)}'",
                          daemon.stderr())) == 2


# --- input echoed in error bodies ---------------------------------------------------------------


async def test_a_huge_cwd_is_not_echoed_back(daemon: RunningDaemon) -> None:
    huge = "/" + "a" * 5_000_000
    async with httpx.AsyncClient(base_url=daemon.url, timeout=CLIENT_TIMEOUT_S) as client:
        resp = await client.post("/session", json={"cwd": huge})
        assert resp.status_code == 400 and resp.json()["code"] == "invalid_cwd"
        assert len(resp.content) < 2000, len(resp.content)
        missing = "/" + "b/" * 1000 + "gone"  # under PATH_MAX, over the echo cap
        resp = await client.post("/session", json={"cwd": missing})
        assert resp.status_code == 400 and resp.json()["code"] == "invalid_cwd"
        body = resp.json()
        assert len(resp.content) < 2000 and body["cwd"].startswith("/b/b/")
        assert "(2005 characters)" in body["cwd"]
        assert (await client.get("/health")).status_code == 200


# --- votes and the permission timeout, with the mock agent's real permission request ------------


async def test_a_vote_for_an_option_the_agent_did_not_offer_is_refused(
        daemon: RunningDaemon) -> None:
    async with httpx.AsyncClient(base_url=daemon.url, timeout=CLIENT_TIMEOUT_S) as client:
        created = await create(client, workspace(daemon, "ok"))
        assert created.status_code == 200, created.text
        sid = created.json()["sessionId"]
        async with following(client, sid) as sub:
            pid = await send(client, sid, "mock:chunks=0 mock:permission=ask")
            asked = await sub.wait_for(lambda e: e.type == "permission_request")
            request_id = asked.data["requestId"]
            path = f"/session/{sid}/permission/{request_id}"
            bogus = await client.post(path, json={"optionId": "allow-always"})
            assert bogus.status_code == 400, bogus.text
            assert bogus.json()["code"] == "invalid_permission_option"
            # Still pending: a valid vote is taken, and the agent sees that one.
            voted = await client.post(path, json={"optionId": "reject-once"})
            assert voted.status_code == 200, voted.text
            terminal = await sub.wait_for(is_terminal_for(pid), timeout=CLIENT_TIMEOUT_S)
        (resolved,) = sub.of_type("permission_resolved")
        assert resolved.data == {"requestId": request_id,
                                 "outcome": {"outcome": "selected", "optionId": "reject-once"}}
        assert agent_chunks(sub.events, pid) == ["permission:reject-once"]
        assert sub.events.index(resolved) < sub.events.index(terminal)
        # A cancelling vote names no option: taken as it is.
        async with following(client, sid) as sub:
            pid = await send(client, sid, "mock:chunks=0 mock:permission=ask")
            asked = await sub.wait_for(lambda e: e.type == "permission_request"
                                       and e.prompt_id == pid)
            voted = await client.post(f"/session/{sid}/permission/{asked.data['requestId']}",
                                      json={"outcome": "cancelled"})
            assert voted.status_code == 200, voted.text
            await sub.wait_for(is_terminal_for(pid), timeout=CLIENT_TIMEOUT_S)
        assert agent_chunks(sub.events, pid) == ["permission:cancelled"]


PERMISSION_TIMEOUT_MS = 1000


@pytest.fixture(scope="module")
def timeout_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    """The bundled mock agent, and permission requests cancelled after 1 s without a vote."""
    base = tmp_path_factory.mktemp("permission-timeout")
    with running_daemon(base, ["--permission-response-timeout-ms",
                               str(PERMISSION_TIMEOUT_MS)]) as d:
        yield d


async def test_an_unanswered_permission_request_times_out_as_cancelled(
        timeout_daemon: RunningDaemon) -> None:
    daemon = timeout_daemon
    async with httpx.AsyncClient(base_url=daemon.url, timeout=CLIENT_TIMEOUT_S) as client:
        created = await client.post("/session", json={"sessionScope": "thread"})
        sid = created.json()["sessionId"]
        async with following(client, sid) as sub:
            pid = await send(client, sid, "mock:chunks=1 mock:permission=ask")
            terminal = await sub.wait_for(is_terminal_for(pid), timeout=CLIENT_TIMEOUT_S)
            asked = sub.of_type("permission_request")[0]
            late = await client.post(f"/session/{sid}/permission/{asked.data['requestId']}",
                                     json={"optionId": "allow-once"})
    assert terminal.type == "turn_complete" and terminal.data["stopReason"] == "end_turn"
    (resolved,) = sub.of_type("permission_resolved")
    assert resolved.data == {"requestId": asked.data["requestId"],
                             "outcome": {"outcome": "cancelled"}, "reason": "timeout"}
    assert resolved.prompt_id == pid
    # The agent was answered "cancelled" and went on: request, resolution, its report, the end.
    order = [sub.events.index(e) for e in (asked, resolved)]
    report = next(e for e in sub.events if text_of(e) == "permission:cancelled")
    assert order[0] < order[1] < sub.events.index(report) < sub.events.index(terminal)
    assert late.status_code == 404 and late.json()["code"] == "permission_not_found"
    assert re.search(rf"event=permission_timeout session={sid} .*timeout_ms="
                     rf"{PERMISSION_TIMEOUT_MS}", daemon.stderr())


def test_the_cli_on_a_terminal_says_the_request_timed_out(timeout_daemon: RunningDaemon) -> None:
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "QWEN_SERVER_TOKEN"}
    env["PYTHONUNBUFFERED"] = "1"
    session_id = subprocess.run(
        [sys.executable, "-m", "sdk", "--url", timeout_daemon.url, "create"], cwd=root,
        env=env, capture_output=True, text=True, timeout=CLIENT_TIMEOUT_S, check=True,
    ).stdout.strip()
    leader, follower = pty.openpty()
    try:
        # On a terminal the CLI asks the user; nobody answers, the daemon's timeout does.
        done = subprocess.run(
            [sys.executable, "-m", "sdk", "--url", timeout_daemon.url, "prompt", session_id,
             "mock:chunks=0 mock:permission=ask"], cwd=root, env=env, stdin=follower,
            capture_output=True, text=True, timeout=CLIENT_TIMEOUT_S, check=False,
        )
    finally:
        os.close(follower)
        os.close(leader)
    assert done.returncode == 0, done.stderr
    assert "permission:cancelled" in done.stdout
    assert re.search(r"turnkeeper: permission request [0-9a-f]{8} timed out: nobody answered "
                     r"within the daemon's permission timeout, so the agent was answered "
                     r'\{"outcome":"cancelled"\}', done.stderr), done.stderr
