"""The harness's zygote (tests/harness_zygote.py) starts the same daemon an exec of
``python -m daemon`` starts: same output and exit codes for the same argv, the request's
environment and working directory (seen by the daemon's agent), real signals and exit statuses;
and the harness does fork from it, except in tests marked ``exec_daemon``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.harness import start_daemon
from tests.harness_zygote import ForkedPopen, daemon_popen

pytestmark = pytest.mark.processes  # starts daemons: not in make unit-fast

WAIT_S = 20.0


def _run(popen: object, argv: list[str], cwd: Path) -> tuple[int, str, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = popen([sys.executable, "-m", "daemon", *argv], stdout=subprocess.PIPE,  # type: ignore[operator]
                 stderr=subprocess.PIPE, env=env, cwd=str(cwd))
    out, err = proc.communicate(timeout=WAIT_S)
    return proc.returncode, out.decode(), err.decode()


@pytest.mark.parametrize("argv", [["--version"], ["--bogus"], ["--port", "x"], ["--help"]],
                         ids=["version", "unknown-flag", "bad-port", "help"])
def test_a_forked_start_says_and_exits_as_an_exec_does(tmp_path: Path, argv: list[str]) -> None:
    forked = _run(daemon_popen, argv, tmp_path)
    execd = _run(subprocess.Popen, argv, tmp_path)
    assert forked == execd
    assert "python -m daemon" in forked[1] + forked[2]  # the program's name as a user typed it


def test_the_harness_forks_its_daemons(tmp_path: Path) -> None:
    daemon = start_daemon(tmp_path)
    try:
        assert isinstance(daemon.proc, ForkedPopen)
    finally:
        daemon.stop()


@pytest.mark.exec_daemon
def test_a_test_marked_exec_daemon_gets_an_execd_daemon(tmp_path: Path) -> None:
    daemon = start_daemon(tmp_path)
    try:
        assert not isinstance(daemon.proc, ForkedPopen)
        cmdline = Path(f"/proc/{daemon.proc.pid}/cmdline").read_bytes().split(b"\0")
        assert cmdline[1:3] == [b"-m", b"daemon"]
    finally:
        daemon.stop()


def _agent_pid(url: str, workspace: Path) -> int:
    with httpx.Client(base_url=url, timeout=WAIT_S) as client:
        created = client.post("/session", json={"cwd": str(workspace), "sessionScope": "thread"})
        assert created.status_code == 200, created.text
        agents = client.get("/daemon/status").json()["agents"]
    return int(agents[0]["pid"])


def test_a_forked_daemon_runs_with_the_requests_environment_and_directory(
        tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    daemon = start_daemon(tmp_path, env={"TK_ZYGOTE_PROBE": "probe-value"})
    try:
        agent = _agent_pid(daemon.url, workspace)
        # The agent's environment is the daemon's os.environ when it started the agent.
        environ = Path(f"/proc/{agent}/environ").read_bytes().split(b"\0")
        assert b"TK_ZYGOTE_PROBE=probe-value" in environ
        assert f"MOCK_ACP_GATE_DIR={daemon.gate_dir}".encode() in environ
        assert Path(f"/proc/{daemon.proc.pid}/cwd").resolve() == tmp_path.resolve()
    finally:
        daemon.stop()


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 0), (signal.SIGKILL, -signal.SIGKILL)],
                         ids=["term", "kill"])
def test_a_forked_daemon_stops_on_real_signals_with_its_exit_status(
        tmp_path: Path, sig: int, code: int) -> None:
    daemon = start_daemon(tmp_path)
    assert daemon.proc.poll() is None
    os.kill(daemon.proc.pid, signal.SIGSTOP)  # a paused daemon is not an exited one
    assert daemon.proc.poll() is None
    os.kill(daemon.proc.pid, signal.SIGCONT)
    assert daemon.stop(sig) == code
    assert daemon.proc.poll() == code
