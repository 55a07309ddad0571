"""Start and stop a real daemon subprocess on loopback for a benchmark.

The daemon runs with ``--port 0`` and a temporary data directory; its first stdout line names
the URL it bound, so nothing guesses ports or sleeps waiting for start-up. The bundled mock agent
is the agent: a gate directory lets a benchmark hold a turn open (``mock:gate=<name>``) and a
prompt log counts the prompts the agent received.

Each daemon starts in a session (and process group) of its own, with its agents in that group,
so a terminal's Ctrl-C does not reach it half-way and :func:`kill_everything` can take the
daemon and its agents down together when ``python -m benchmarks`` is interrupted.
"""

from __future__ import annotations

import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from sdk.protocol.headers import CLIENT_ID

LISTEN_RE = re.compile(rb"listening on (https?://\S+)")
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0


class LaunchError(RuntimeError):
    """The daemon did not start, or a request it must answer failed."""


# Daemons started and not yet stopped, by pid (each leads its own process group).
_RUNNING: dict[int, subprocess.Popen[bytes]] = {}
# Told about every daemon started (``python -m benchmarks`` prints it as a progress line).
_reporter: Callable[[str], None] | None = None


def set_reporter(report: Callable[[str], None] | None) -> None:
    global _reporter
    _reporter = report


def _children_by_parent() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                raw = stat.read()
        except OSError:
            continue
        ppid = int(raw[raw.rindex(b")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    return children


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (children, their children, ...)."""
    tree = _children_by_parent()
    found: list[int] = []
    todo = list(tree.get(pid, []))
    while todo:
        child = todo.pop()
        found.append(child)
        todo.extend(tree.get(child, []))
    return found


def processes_marked(marker: str) -> list[int]:
    """Live processes (not zombies) whose environment or command line holds ``marker``: the
    run's scratch directory, which every process it starts inherits in ``TMPDIR``."""
    needle = marker.encode()
    found: list[int] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                raw = stat.read()
            if raw[raw.rindex(b")") + 2:].split()[0] == b"Z":
                continue
            with open(f"/proc/{entry}/environ", "rb") as environ:
                blob = environ.read()
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                blob += cmdline.read()
        except (OSError, ValueError):
            continue
        if needle in blob:
            found.append(int(entry))
    return found


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            raw = stat.read()
    except OSError:
        return False
    return raw[raw.rindex(b")") + 2:].split()[0] != b"Z"


def kill_everything(marker: str | None = None, timeout: float = STOP_TIMEOUT_S) -> list[int]:
    """SIGKILL every process this one started: its descendants, the process groups of the
    daemons still running (their agents), and with ``marker`` any process whose environment
    names it (an agent whose daemon died first). Reaps this process's own children and waits,
    up to ``timeout``, until none is left; returns the pids it killed."""
    killed: set[int] = set()
    deadline = time.monotonic() + timeout
    while True:
        targets = set(descendants(os.getpid()))
        if marker is not None:
            targets.update(processes_marked(marker))
        targets = {pid for pid in targets if alive(pid)}
        for leader in list(_RUNNING):
            try:
                os.killpg(leader, signal.SIGKILL)
            except OSError:
                pass
        for pid in targets:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        killed.update(targets)
        for pid in list(killed):  # reap our own children so none lingers as a zombie
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
        if not targets or time.monotonic() > deadline:
            break
        time.sleep(0.01)  # a poll interval while waiting for the kernel to finish the kills
    _RUNNING.clear()
    return sorted(killed)


def read_rss_kib(pid: int) -> int:
    """``VmRSS`` of one process (not its children), in KiB."""
    with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise LaunchError(f"/proc/{pid}/status has no VmRSS line (is it a zombie?)")


@dataclass
class Daemon:
    """One running daemon, its scratch directory and a keep-alive HTTP client."""

    url: str
    proc: subprocess.Popen[bytes]
    base: Path
    gate_dir: Path
    prompt_log: Path
    stderr_path: Path
    args: list[str] = field(default_factory=list)
    http: httpx.Client = field(init=False)

    def __post_init__(self) -> None:
        # No pool limits worth hitting: a benchmark issues one request at a time.
        self.http = httpx.Client(base_url=self.url, timeout=120.0)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def host_port(self) -> tuple[str, int]:
        parsed = httpx.URL(self.url)
        if parsed.port is None:
            raise LaunchError(f"daemon URL {self.url} has no port")
        return parsed.host, parsed.port

    # -- the agent ------------------------------------------------------------------------------

    def agent_pids(self) -> list[int]:
        """The pids of the daemon's agent processes (one per workspace)."""
        status = self.get_json("/daemon/status")
        return [int(agent["pid"]) for agent in status.get("agents", []) if agent.get("pid")]

    def open_gate(self, name: str) -> None:
        (self.gate_dir / name).touch()

    def prompt_count(self) -> int:
        if not self.prompt_log.exists():
            return 0
        return sum(1 for line in self.prompt_log.read_text().splitlines() if line.strip())

    # -- HTTP helpers ---------------------------------------------------------------------------

    def _check(self, response: httpx.Response, what: str) -> Any:
        if response.status_code >= 400:
            raise LaunchError(f"{what} answered {response.status_code}: {response.text[:500]}")
        return response.json() if response.content else None

    def get_json(self, path: str) -> Any:
        return self._check(self.http.get(path), f"GET {path}")

    def post_json(self, path: str, body: Mapping[str, Any] | None = None,
                  headers: Mapping[str, str] | None = None) -> Any:
        return self._check(self.http.post(path, json=dict(body or {}), headers=headers),
                           f"POST {path}")

    def create_session(self) -> tuple[str, str]:
        """A new session in the daemon's workspace: ``(sessionId, clientId)``."""
        body = self.post_json("/session", {"sessionScope": "thread"})
        return str(body["sessionId"]), str(body["clientId"])

    def prompt(self, session_id: str, text: str, client_id: str | None = None) -> dict[str, Any]:
        """Send a prompt; returns the 202 body (``promptId``, ``lastEventId``, ``eventEpoch``)."""
        headers = {CLIENT_ID: client_id} if client_id else None
        body = self.post_json(f"/session/{session_id}/prompt",
                              {"prompt": [{"type": "text", "text": text}]}, headers)
        return dict(body)

    def status(self, session_id: str) -> dict[str, Any]:
        return dict(self.get_json(f"/session/{session_id}/status"))

    def wait_status(self, session_id: str, what: str,
                    predicate: Callable[[dict[str, Any]], bool], timeout: float = 600.0,
                    poll_s: float = 0.02, report: Callable[[dict[str, Any]], None] | None = None,
                    report_every_s: float = 5.0) -> dict[str, Any]:
        """Poll the session status until ``predicate(status)`` holds (a condition, not a
        guessed delay); raise with the last status after ``timeout``. ``report`` is called with
        the status every ``report_every_s`` while waiting (progress for long waits)."""
        deadline = time.monotonic() + timeout
        next_report = time.monotonic() + report_every_s
        while True:
            status = self.status(session_id)
            if predicate(status):
                return status
            if self.proc.poll() is not None:
                raise LaunchError(f"daemon exited ({self.proc.returncode}) while waiting for "
                                  f"{what}:\n{self.stderr_tail()}")
            now = time.monotonic()
            if now > deadline:
                raise LaunchError(f"timed out waiting for {what}; last status {status}")
            if report is not None and now >= next_report:
                report(status)
                next_report = now + report_every_s
            time.sleep(poll_s)

    def wait_ingested(self, session_id: str, last_event_id: int, *, durable: bool = False,
                      timeout: float = 600.0,
                      report: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        """Wait until the bus has published ``last_event_id`` (and, with ``durable``, until the
        transcript has committed it)."""

        def done(status: dict[str, Any]) -> bool:
            if status["lastEventId"] < last_event_id:
                return False
            return not durable or status["durableEventId"] >= status["lastEventId"]

        return self.wait_status(session_id, f"event {last_event_id}", done, timeout,
                                report=report)

    def wait_idle(self, session_id: str, timeout: float = 600.0) -> dict[str, Any]:
        """Wait until the session has no active or queued prompt."""
        return self.wait_status(
            session_id, "the turn to end",
            lambda s: not s["hasActivePrompt"] and not s["pendingPrompts"], timeout)

    def rss_kib(self) -> int:
        return read_rss_kib(self.pid)

    def stderr_tail(self, limit: int = 4000) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")[-limit:]
        except OSError:
            return ""

    # -- lifetime -------------------------------------------------------------------------------

    def stop(self) -> int:
        forget(self.proc)
        self.http.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return self.proc.returncode

    def __enter__(self) -> Daemon:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
        shutil.rmtree(self.base, ignore_errors=True)


def start_daemon(
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    *,
    persistence: bool = True,
    scratch: Path | None = None,
) -> Daemon:
    """Start ``python -m daemon`` on 127.0.0.1 with a fresh scratch directory.

    The scratch directory (under ``scratch`` or the system temp dir) holds the data dir, the
    workspace, the gate dir, the prompt log and the daemon's stderr; it is removed on exit.
    """
    base = Path(tempfile.mkdtemp(prefix="tk-bench-", dir=scratch))
    data, gates, workspace = base / "data", base / "gates", base / "workspace"
    for path in (data, gates, workspace):
        path.mkdir()
    prompt_log = base / "prompts.log"
    stderr_path = base / "daemon-stderr.log"
    mock_env = {
        "MOCK_ACP_GATE_DIR": str(gates),
        "MOCK_ACP_PROMPT_LOG": str(prompt_log),
        "MOCK_ACP_PROMPT_DELAY_MS": "0",
    }
    argv = ["--data-dir", str(data), "--workspace", str(workspace), *args]
    if not persistence:
        argv.append("--no-persistence")
    try:
        proc, url = spawn_daemon(argv, {**mock_env, **(env or {})}, workspace, stderr_path,
                                 new_session=True)
    except BaseException:
        shutil.rmtree(base, ignore_errors=True)
        raise
    if _reporter is not None:
        _reporter(f"daemon pid {proc.pid} listening on {url}")
    return Daemon(url, proc, base, gates, prompt_log, stderr_path, argv)


def spawn_daemon(
    args: Sequence[str],
    env: Mapping[str, str],
    cwd: Path,
    stderr_path: Path,
    *,
    new_session: bool = False,
    popen: Callable[..., subprocess.Popen[bytes]] = subprocess.Popen,
) -> tuple[subprocess.Popen[bytes], str]:
    """Start ``python -m daemon --hostname 127.0.0.1 --port 0 *args`` and wait for its URL.

    The one way tests and benchmarks launch a daemon. ``env`` is laid over this process's
    environment without ``QWEN_SERVER_TOKEN`` (a launched daemon is open unless ``env`` or
    ``args`` set a token); stderr goes to ``stderr_path``. With ``new_session`` the daemon
    leads a process group of its own (see :func:`kill_everything`). The daemon's first stdout
    line names the URL it bound, so nothing guesses ports or sleeps; a daemon that exits or
    stays silent for ``START_TIMEOUT_S`` is killed and :class:`LaunchError` carries the tail of
    its stderr. ``popen`` starts the process (the tests' harness may fork it from a zygote that
    has the daemon's modules imported, see tests/harness_zygote.py).
    """
    full_env = dict(os.environ)
    full_env.pop("QWEN_SERVER_TOKEN", None)
    full_env["PYTHONUNBUFFERED"] = "1"
    full_env.update(env)
    argv = [sys.executable, "-m", "daemon", "--hostname", "127.0.0.1", "--port", "0", *args]
    with open(stderr_path, "wb") as err:
        proc = popen(argv, stdout=subprocess.PIPE, stderr=err, env=full_env, cwd=str(cwd),
                     start_new_session=new_session)
    _RUNNING[proc.pid] = proc
    try:
        return proc, _read_url(proc, stderr_path)
    except BaseException:
        _RUNNING.pop(proc.pid, None)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
        raise


def forget(proc: subprocess.Popen[bytes]) -> None:
    """``proc`` was stopped by its owner: :func:`kill_everything` need not stop it."""
    _RUNNING.pop(proc.pid, None)


def _read_url(proc: subprocess.Popen[bytes], stderr_path: Path) -> str:
    assert proc.stdout is not None
    deadline = time.monotonic() + START_TIMEOUT_S
    buf = b""
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise LaunchError("daemon did not report its URL within "
                                  f"{START_TIMEOUT_S:.0f} s:\n"
                                  + stderr_path.read_text(errors="replace")[-4000:])
            if not sel.select(remaining):
                continue
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                proc.wait(5)
                raise LaunchError(f"daemon exited with {proc.returncode} before listening:\n"
                                  + stderr_path.read_text(errors="replace")[-4000:])
            buf += chunk
            match = LISTEN_RE.search(buf)
            if match:
                return match.group(1).decode()


def gate_name() -> str:
    """A fresh gate file name for one held-open turn."""
    return f"g{uuid.uuid4().hex[:12]}"
