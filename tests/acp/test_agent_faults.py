"""Misbehaving agents against the real daemon: garbage and oversized stdout lines
mid-turn, replies for requests nobody sent, and agents that never finish ``initialize``.

One daemon runs ``tests/agents/faulty_agent.py``; the daemon starts one agent per workspace,
and each workspace's ``faulty-agent-mode`` file picks that agent's fault. The ``ok`` workspace
runs the plain mock: every test checks that it keeps serving, with the same agent process,
while another workspace's agent misbehaves.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import trio

from sdk.protocol.envelope import DaemonEvent
from tests.harness import RunningDaemon, running_daemon
from tests.sse_client import Subscriber, chunk_kind, is_terminal_for, text_of

pytestmark = pytest.mark.processes  # starts processes: not in make unit-fast

FAULTY_AGENT = Path(__file__).parents[1] / "agents" / "faulty_agent.py"
MODES = ("ok", "garbage", "oversized", "unknown-reply", "silent-init", "exit-on-init",
         "bad-init")
CLIENT_TIMEOUT_S = 15.0


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    base = tmp_path_factory.mktemp("agent-faults")
    for name in MODES:
        (base / name).mkdir()
        mode = "mock" if name == "ok" else name
        (base / name / "faulty-agent-mode").write_text(mode)
    agent = f"{shlex.quote(sys.executable)} {shlex.quote(str(FAULTY_AGENT))}"
    # A generous initialize bound: an agent that does answer must never lose the race to it on a
    # busy machine (the silent agent gets its own daemon with a short bound, below).
    with running_daemon(base, ["--agent", agent, "--agent-init-timeout-ms", "30000"]) as d:
        yield d


@pytest.fixture(scope="module")
def impatient_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    """A daemon that gives agents 0.5 s to answer ``initialize``: only the silent agent runs on
    it, so no agent that does answer can lose that race."""
    base = tmp_path_factory.mktemp("agent-faults-impatient")
    for name in ("ok", "silent-init"):
        (base / name).mkdir()
        (base / name / "faulty-agent-mode").write_text("mock" if name == "ok" else name)
    agent = f"{shlex.quote(sys.executable)} {shlex.quote(str(FAULTY_AGENT))}"
    with running_daemon(base, ["--agent", agent, "--agent-init-timeout-ms", "500"]) as d:
        yield d


def workspace(daemon: RunningDaemon, name: str) -> str:
    return str(daemon.data_dir.parent / name)


@pytest.fixture(scope="module")
def ok_session(daemon: RunningDaemon) -> str:
    """A session on the well-behaved agent, made before any fault is injected."""
    with httpx.Client(base_url=daemon.url, timeout=CLIENT_TIMEOUT_S) as client:
        resp = client.post("/session", json={"cwd": workspace(daemon, "ok"),
                                             "sessionScope": "thread"})
    assert resp.status_code == 200, resp.text
    return str(resp.json()["sessionId"])


def agent_pids(client: httpx.Client) -> dict[str, int]:
    status = client.get("/daemon/status").json()
    return {a["workspaceCwd"]: a["pid"] for a in status["agents"]}


@pytest.fixture(scope="module")
def ok_agent_pid(daemon: RunningDaemon, ok_session: str) -> int:
    """The healthy workspace's agent, as first started: no fault elsewhere may replace it."""
    with httpx.Client(base_url=daemon.url, timeout=CLIENT_TIMEOUT_S) as client:
        return agent_pids(client)[workspace(daemon, "ok")]


async def run_turn(client: httpx.AsyncClient, sid: str, text: str
                   ) -> tuple[DaemonEvent, list[DaemonEvent]]:
    """Send one prompt; return its terminal and every frame of the turn, in order."""
    status = (await client.get(f"/session/{sid}/status")).json()
    async with trio.open_nursery() as nursery:
        sub = Subscriber(client, f"/session/{sid}/events",
                         {"Last-Event-ID": str(status["lastEventId"]),
                          "X-Qwen-Event-Epoch": status["eventEpoch"]})
        await nursery.start(sub.run)
        resp = await client.post(f"/session/{sid}/prompt",
                                 json={"prompt": [{"type": "text", "text": text}]})
        assert resp.status_code == 202, resp.text
        pid = resp.json()["promptId"]
        terminal = await sub.wait_for(is_terminal_for(pid), timeout=CLIENT_TIMEOUT_S)
        nursery.cancel_scope.cancel()
    turn = [e for e in sub.events if e.prompt_id == pid]
    return terminal, turn


def agent_chunks(turn: list[DaemonEvent]) -> list[str]:
    return [text_of(e) for e in turn if chunk_kind(e) == "agent_message_chunk"]


async def assert_ok_workspace_serves(daemon: RunningDaemon, ok_session: str,
                                     ok_agent_pid: int) -> None:
    async with httpx.AsyncClient(base_url=daemon.url, timeout=CLIENT_TIMEOUT_S) as client:
        assert (await client.get("/health")).json() == {"status": "ok"}
        terminal, turn = await run_turn(client, ok_session, "mock:chunks=2 still here")
        assert terminal.type == "turn_complete" and terminal.data["stopReason"] == "end_turn"
        assert agent_chunks(turn) == ["chunk-0", "chunk-1"]
        status = (await client.get("/daemon/status")).json()
    pids = {a["workspaceCwd"]: a["pid"] for a in status["agents"]}
    assert pids[workspace(daemon, "ok")] == ok_agent_pid, "the healthy agent was restarted"


def agent_pids_of(resp: httpx.Response) -> dict[str, int]:
    return {a["workspaceCwd"]: a["pid"] for a in resp.json()["agents"]}


async def new_session(client: httpx.AsyncClient, cwd: str) -> httpx.Response:
    with trio.fail_after(CLIENT_TIMEOUT_S):
        return await client.post("/session", json={"cwd": cwd, "sessionScope": "thread"})


# --- mid-turn faults: the turn completes, the junk is logged and dropped ----------------------


async def test_garbage_lines_mid_turn_are_logged_and_skipped(
        daemon: RunningDaemon, ok_session: str, ok_agent_pid: int) -> None:
    async with httpx.AsyncClient(base_url=daemon.url, timeout=CLIENT_TIMEOUT_S) as client:
        created = await new_session(client, workspace(daemon, "garbage"))
        assert created.status_code == 200, created.text
        sid = created.json()["sessionId"]
        terminal, turn = await run_turn(client, sid, "mock:chunks=6")
        assert terminal.type == "turn_complete" and terminal.data["stopReason"] == "end_turn"
        # Exactly the real chunks, in order: nothing from the garbage became a frame.
        assert agent_chunks(turn) == [f"chunk-{i}" for i in range(6)]
        assert [e for e in turn if e.type == "session_update"
                and chunk_kind(e) not in ("user_message_chunk", "agent_message_chunk")] == []
        # The session is still usable for another turn.
        terminal2, turn2 = await run_turn(client, sid, "mock:chunks=2")
        assert terminal2.type == "turn_complete" and agent_chunks(turn2)[-1] == "chunk-1"
    log = daemon.stderr()
    assert "event=agent_malformed_line" in log
    assert "event=agent_bad_update" in log
    assert "event=agent_request_unsupported" in log and "fs/read_text_file" in log
    assert "event=agent_notification_ignored" in log
    await assert_ok_workspace_serves(daemon, ok_session, ok_agent_pid)


async def test_oversized_line_mid_turn_is_discarded(
        daemon: RunningDaemon, ok_session: str, ok_agent_pid: int) -> None:
    async with httpx.AsyncClient(base_url=daemon.url, timeout=CLIENT_TIMEOUT_S) as client:
        created = await new_session(client, workspace(daemon, "oversized"))
        assert created.status_code == 200, created.text
        sid = created.json()["sessionId"]
        terminal, turn = await run_turn(client, sid, "mock:chunks=4")
        assert terminal.type == "turn_complete" and terminal.data["stopReason"] == "end_turn"
        # The chunk after the 17 MiB line arrives: the reader resynchronised on its newline.
        assert agent_chunks(turn) == ["chunk-0", "chunk-1", "chunk-2", "chunk-3"]
        assert max(len(text_of(e)) for e in turn) < 1024
        terminal2, turn2 = await run_turn(client, sid, "mock:chunks=2")
        assert terminal2.type == "turn_complete"
        assert agent_chunks(turn2) == ["chunk-0", "chunk-1"]
    assert "event=agent_line_discarded" in daemon.stderr()
    await assert_ok_workspace_serves(daemon, ok_session, ok_agent_pid)


async def test_reply_for_unknown_request_id_is_ignored(
        daemon: RunningDaemon, ok_session: str, ok_agent_pid: int) -> None:
    async with httpx.AsyncClient(base_url=daemon.url, timeout=CLIENT_TIMEOUT_S) as client:
        created = await new_session(client, workspace(daemon, "unknown-reply"))
        assert created.status_code == 200, created.text
        sid = created.json()["sessionId"]
        terminal, turn = await run_turn(client, sid, "mock:chunks=1")
        # The bogus replies said "refusal"; only the real one (end_turn) ends the turn.
        assert terminal.type == "turn_complete" and terminal.data["stopReason"] == "end_turn"
        assert len([e for e in turn if e.type in ("turn_complete", "turn_error")]) == 1
    log = daemon.stderr()
    assert log.count("event=agent_reply_unknown_id") >= 3
    assert "'never-sent'" in log
    await assert_ok_workspace_serves(daemon, ok_session, ok_agent_pid)


# --- start-up faults: a prompt 502, a log line, and the next request tries again --------------


async def test_an_agent_that_never_answers_initialize_is_502_after_the_bound(
        impatient_daemon: RunningDaemon) -> None:
    cwd = workspace(impatient_daemon, "silent-init")
    reason = "no initialize reply within 0.5 s"
    async with httpx.AsyncClient(base_url=impatient_daemon.url,
                                 timeout=CLIENT_TIMEOUT_S) as client:
        resp = await new_session(client, cwd)
        assert resp.status_code == 502, resp.text
        body = resp.json()
        assert body["code"] == "agent_start_failed" and reason in body["error"]
        assert cwd not in agent_pids_of(await client.get("/daemon/status"))
    log = impatient_daemon.stderr()
    assert any("event=agent_start_failed" in line and reason in line
               for line in log.splitlines()), log[-3000:]


@pytest.mark.parametrize(("mode", "reason"), [
    ("exit-on-init", "agent exited during initialize"),
    ("bad-init", "unsupported protocolVersion 99"),
])
async def test_agent_start_failure_is_502(daemon: RunningDaemon, ok_session: str,
                                          ok_agent_pid: int, mode: str, reason: str) -> None:
    cwd = workspace(daemon, mode)
    async with httpx.AsyncClient(base_url=daemon.url, timeout=CLIENT_TIMEOUT_S) as client:
        resp = await new_session(client, cwd)
        assert resp.status_code == 502, resp.text
        body = resp.json()
        assert body["code"] == "agent_start_failed" and reason in body["error"]
        assert cwd not in agent_pids_of(await client.get("/daemon/status"))
    log = daemon.stderr()
    failures = [line for line in log.splitlines()
                if "event=agent_start_failed" in line and reason in line]
    assert failures, log[-3000:]
    await assert_ok_workspace_serves(daemon, ok_session, ok_agent_pid)


async def test_next_request_after_a_failed_start_starts_a_new_agent(
        daemon: RunningDaemon, tmp_path: Path) -> None:
    cwd = tmp_path / "flaky"
    cwd.mkdir()
    mode_file = cwd / "faulty-agent-mode"
    mode_file.write_text("exit-on-init")
    async with httpx.AsyncClient(base_url=daemon.url, timeout=CLIENT_TIMEOUT_S) as client:
        failed = await new_session(client, str(cwd))
        assert failed.status_code == 502 and failed.json()["code"] == "agent_start_failed"
        mode_file.write_text("mock")  # the workspace's agent is fixed
        created = await new_session(client, str(cwd))
        assert created.status_code == 200, created.text
        terminal, turn = await run_turn(client, created.json()["sessionId"], "mock:chunks=1")
        assert terminal.type == "turn_complete" and agent_chunks(turn) == ["chunk-0"]


@pytest.fixture
def own_daemon(tmp_path: Path) -> Iterator[RunningDaemon]:
    """A daemon of its own, for a fault that, while unfixed, takes the whole daemon down."""
    for name in ("ok", "deep-line"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "faulty-agent-mode").write_text("mock" if name == "ok" else name)
    agent = f"{shlex.quote(sys.executable)} {shlex.quote(str(FAULTY_AGENT))}"
    with running_daemon(tmp_path, ["--agent", agent]) as d:
        yield d


async def test_deeply_nested_agent_line_is_skipped(own_daemon: RunningDaemon) -> None:
    """A well-formed line nested deeper than the decoder's recursion limit is one more
    malformed line: logged and skipped, never an exception in the agent's reader (which would
    end the daemon's root nursery, and with it every workspace)."""
    daemon = own_daemon
    async with httpx.AsyncClient(base_url=daemon.url, timeout=CLIENT_TIMEOUT_S) as client:
        ok = await new_session(client, workspace(daemon, "ok"))
        assert ok.status_code == 200, ok.text
        created = await new_session(client, workspace(daemon, "deep-line"))
        assert created.status_code == 200, created.text
        sid = created.json()["sessionId"]
        terminal, turn = await run_turn(client, sid, "mock:chunks=4")
        assert terminal.type == "turn_complete" and terminal.data["stopReason"] == "end_turn"
        assert agent_chunks(turn) == [f"chunk-{i}" for i in range(4)]
        terminal, turn = await run_turn(client, ok.json()["sessionId"], "mock:chunks=1")
        assert terminal.type == "turn_complete" and agent_chunks(turn) == ["chunk-0"]
    assert "event=agent_malformed_line" in daemon.stderr()
    assert daemon.proc.poll() is None, daemon.stderr()[-3000:]
