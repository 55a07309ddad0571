"""Issue 10's smaller hardening items, each against the real daemon (or the real SDK):

- ``session_died`` names how the agent ended: the signal that killed it, or its exit code;
- a token that cannot travel in an HTTP header is refused at start, and by the SDK;
- a busy port or a data directory that is not a directory ends start-up with one clear line;
- SIGHUP is a graceful shutdown, like SIGTERM.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
import trio

from sdk._client import DaemonClient
from sdk._errors import InvalidTokenError
from tests.harness import RunningDaemon, running_daemon, start_daemon
from tests.sse_client import Subscriber, is_terminal_for, text_of

pytestmark = pytest.mark.processes  # starts processes: not in make unit-fast

CLIENT_TIMEOUT_S = 15.0


# --- session_died carries the agent's real exit status ----------------------------------------


def daemon_children(daemon_pid: int) -> set[int]:
    """The daemon's child processes, read from /proc (every thread's ``children`` list)."""
    pids: set[int] = set()
    for task in Path(f"/proc/{daemon_pid}/task").iterdir():
        try:
            pids.update(int(p) for p in (task / "children").read_text().split())
        except FileNotFoundError:
            continue  # the thread ended while we looked
    return pids


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except FileNotFoundError:
        return ""


@asynccontextmanager
async def gated_turn(daemon: RunningDaemon, cwd: Path
                     ) -> AsyncIterator[tuple[httpx.AsyncClient, Subscriber, str, str]]:
    """A thread session in ``cwd`` with one prompt running (its chunk seen), gated forever."""
    cwd.mkdir(exist_ok=True)
    async with httpx.AsyncClient(base_url=daemon.url, timeout=CLIENT_TIMEOUT_S) as client, \
            trio.open_nursery() as nursery:
        created = await client.post("/session", json={"cwd": str(cwd), "sessionScope": "thread"})
        assert created.status_code == 200, created.text
        sid = created.json()["sessionId"]
        sub = Subscriber(client, f"/session/{sid}/events", {"Last-Event-ID": "0"})
        await nursery.start(sub.run)
        resp = await client.post(f"/session/{sid}/prompt", json={"prompt": [
            {"type": "text", "text": "mock:chunks=1 mock:gate=never"}]})
        assert resp.status_code == 202, resp.text
        pid = resp.json()["promptId"]
        await sub.wait_for(lambda e: text_of(e) == "chunk-0")
        yield client, sub, sid, pid
        nursery.cancel_scope.cancel()


async def agent_pid_for(client: httpx.AsyncClient, cwd: Path) -> int:
    status = (await client.get("/daemon/status")).json()
    return {a["workspaceCwd"]: a["pid"] for a in status["agents"]}[str(cwd)]


async def test_session_died_names_the_signal_that_killed_the_agent(tmp_path: Path) -> None:
    with running_daemon(tmp_path) as daemon:
        cwd = tmp_path / "killed"
        async with gated_turn(daemon, cwd) as (client, sub, sid, pid):
            agent = await agent_pid_for(client, cwd)
            children = daemon_children(daemon.proc.pid)
            assert agent in children, (agent, children)
            assert "daemon.mock_agent" in cmdline(agent)
            os.kill(agent, signal.SIGKILL)
            terminal = await sub.wait_for(is_terminal_for(pid))
            died = await sub.wait_for(lambda e: e.type == "session_died")
        assert terminal.type == "turn_error" and terminal.data["code"] == "channel_closed"
        assert died.data == {"sessionId": sid, "reason": "channel_closed",
                             "exitCode": None, "signalCode": "SIGKILL"}


async def test_session_died_names_the_exit_code_of_an_agent_that_exited(tmp_path: Path) -> None:
    with running_daemon(tmp_path) as daemon:
        cwd = tmp_path / "crashed"
        cwd.mkdir()
        async with httpx.AsyncClient(base_url=daemon.url, timeout=CLIENT_TIMEOUT_S) as client, \
                trio.open_nursery() as nursery:
            sid = (await client.post("/session", json={"cwd": str(cwd), "sessionScope": "thread"})
                   ).json()["sessionId"]
            sub = Subscriber(client, f"/session/{sid}/events", {"Last-Event-ID": "0"})
            await nursery.start(sub.run)
            resp = await client.post(f"/session/{sid}/prompt", json={"prompt": [
                {"type": "text", "text": "mock:chunks=1 mock:mode=crash-on-prompt"}]})
            assert resp.status_code == 202, resp.text
            died = await sub.wait_for(lambda e: e.type == "session_died")
            nursery.cancel_scope.cancel()
    # The mock's crash-on-prompt mode exits with status 3.
    assert died.data == {"sessionId": sid, "reason": "channel_closed",
                         "exitCode": 3, "signalCode": None}


async def test_session_died_without_a_running_prompt_names_the_signal(tmp_path: Path) -> None:
    with running_daemon(tmp_path) as daemon:
        cwd = tmp_path / "idle"
        cwd.mkdir()
        async with httpx.AsyncClient(base_url=daemon.url, timeout=CLIENT_TIMEOUT_S) as client, \
                trio.open_nursery() as nursery:
            sid = (await client.post("/session", json={"cwd": str(cwd), "sessionScope": "thread"})
                   ).json()["sessionId"]
            sub = Subscriber(client, f"/session/{sid}/events", {"Last-Event-ID": "0"})
            await nursery.start(sub.run)
            os.kill(await agent_pid_for(client, cwd), signal.SIGTERM)
            died = await sub.wait_for(lambda e: e.type == "session_died")
            nursery.cancel_scope.cancel()
    assert died.data["exitCode"] is None and died.data["signalCode"] == "SIGTERM"


# --- SIGHUP is a graceful shutdown ------------------------------------------------------------


async def test_sighup_shuts_down_gracefully(tmp_path: Path) -> None:
    daemon = start_daemon(tmp_path)
    try:
        async with gated_turn(daemon, tmp_path / "ws") as (_, sub, _sid, pid):
            started = time.monotonic()
            daemon.proc.send_signal(signal.SIGHUP)
            terminal = await sub.wait_for(is_terminal_for(pid))
            closed = await sub.wait_for(lambda e: e.type == "session_closed")
            await sub.wait_ended()
        code = daemon.proc.wait(10)
        elapsed = time.monotonic() - started
    finally:
        daemon.stop()
    assert code == 0
    assert elapsed < 5.0, f"shutdown took {elapsed:.2f}s"
    assert terminal.type == "turn_error" and terminal.data["code"] == "session_closed"
    assert closed.data["reason"] == "daemon_shutdown"
    assert "event=shutdown signal=SIGHUP" in daemon.stderr()


# --- start-up refusals: one clear line, non-zero exit -----------------------------------------


def run_daemon_cli(tmp_path: Path, *args: str, env: dict[str, str] | None = None
                   ) -> subprocess.CompletedProcess[str]:
    full_env = dict(os.environ)
    full_env.pop("QWEN_SERVER_TOKEN", None)
    full_env.update(env or {})
    argv = [sys.executable, "-m", "daemon", "--hostname", "127.0.0.1",
            "--workspace", str(tmp_path), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, env=full_env,
                          cwd=str(tmp_path))


def assert_one_clear_line(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) <= 2, result.stderr
    for needle in needles:
        assert needle in result.stderr, result.stderr
    assert "listening on" not in result.stdout


def test_busy_port_is_one_line_and_nonzero_exit(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = run_daemon_cli(tmp_path, "--port", str(port), "--data-dir", str(tmp_path / "d"))
    assert_one_clear_line(result, f"127.0.0.1:{port}", "in use")


def test_data_dir_that_is_a_file_is_one_line_and_nonzero_exit(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "data-file"
    not_a_dir.write_text("not a directory")
    result = run_daemon_cli(tmp_path, "--port", "0", "--data-dir", str(not_a_dir))
    assert_one_clear_line(result, str(not_a_dir), "not a directory")


def test_data_dir_under_a_file_is_one_line_and_nonzero_exit(tmp_path: Path) -> None:
    parent = tmp_path / "data-file"
    parent.write_text("not a directory")
    result = run_daemon_cli(tmp_path, "--port", "0", "--data-dir", str(parent / "sub"))
    assert_one_clear_line(result, str(parent / "sub"))


@pytest.mark.parametrize("how", ["flag", "env"])
def test_non_ascii_token_is_refused_at_start(tmp_path: Path, how: str) -> None:
    token = "s\u00e9cret-\u2603"
    args = ["--port", "0", "--data-dir", str(tmp_path / "d")]
    env: dict[str, str] = {}
    if how == "flag":
        args += ["--token", token]
    else:
        env["QWEN_SERVER_TOKEN"] = token
    result = run_daemon_cli(tmp_path, *args, env=env)
    assert result.returncode == 2
    assert_one_clear_line(result, "token", "ASCII")
    assert token not in result.stderr, "the refusal must not echo the secret"


# --- the SDK refuses such a token at construction ---------------------------------------------


@pytest.mark.parametrize("token", ["s\u00e9cret", "caf\u00e9\u2603", "two words", "tab\there",
                                   "nl\n", "del\x7f"])
def test_sdk_refuses_a_token_that_cannot_be_a_header(token: str) -> None:
    with pytest.raises(InvalidTokenError) as info:
        DaemonClient("http://127.0.0.1:1", token=token)
    assert "token" in str(info.value) and "visible ASCII" in str(info.value)
    assert token not in str(info.value), "the error must not echo the secret"
    assert isinstance(info.value, ValueError)


def test_sdk_refuses_a_bad_token_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QWEN_SERVER_TOKEN", "s\u00e9cret")
    with pytest.raises(InvalidTokenError, match="QWEN_SERVER_TOKEN"):
        DaemonClient("http://127.0.0.1:1")


@pytest.mark.parametrize("token", ["abc", "A-Z_0.9~+/=", "x" * 200, "!#$%&'*^`|"])
async def test_sdk_accepts_visible_ascii_tokens(token: str) -> None:
    async with DaemonClient("http://127.0.0.1:1", token=token) as client:
        assert client.headers()["Authorization"] == f"Bearer {token}"
