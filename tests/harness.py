"""Run the real daemon as a subprocess on 127.0.0.1 for integration tests.

The daemon is started by :func:`benchmarks.launcher.spawn_daemon`, the one launcher the tests and
the benchmarks share: ``--port 0``, and its first stdout line names the URL it bound, so tests
never guess ports and never sleep waiting for start-up. The process is forked from the worker's
zygote (:mod:`tests.harness_zygote`: the daemon's imports paid once) unless the test is marked
``pytest.mark.exec_daemon``, which exec's ``python -m daemon`` as a user would.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.launcher import forget, spawn_daemon
from tests.harness_zygote import daemon_popen

# Set by tests/conftest.py for each test: whether it is marked ``exec_daemon``.
exec_daemons = False


@dataclass
class RunningDaemon:
    url: str
    proc: subprocess.Popen[bytes]
    data_dir: Path
    gate_dir: Path
    prompt_log: Path
    stderr_path: Path
    args: list[str] = field(default_factory=list)

    def open_gate(self, name: str) -> None:
        (self.gate_dir / name).touch()

    def prompts(self) -> list[str]:
        if not self.prompt_log.exists():
            return []
        return [line for line in self.prompt_log.read_text().splitlines() if line.strip()]

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int:
        forget(self.proc)
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def kill(self) -> None:
        self.stop(signal.SIGKILL)


def start_daemon(
    base: Path,
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    *,
    data_dir: Path | None = None,
    tag: str = "d",
) -> RunningDaemon:
    base.mkdir(parents=True, exist_ok=True)
    data = data_dir or base / f"{tag}-data"
    gate = base / "gates"
    gate.mkdir(exist_ok=True)
    log = base / "prompts.log"
    stderr_path = base / f"{tag}-stderr-{time.monotonic_ns()}.log"
    # The mock waits for <gate>/<name> when a prompt says mock:gate=<name>; ungated prompts
    # run straight through (no delay after the chunks unless a prompt asks for one).
    mock_env = {"MOCK_ACP_GATE_DIR": str(gate), "MOCK_ACP_PROMPT_LOG": str(log),
                "MOCK_ACP_PROMPT_DELAY_MS": "0"}
    # A daemon that does not start raises LaunchError (a RuntimeError) with its stderr's tail.
    proc, url = spawn_daemon(["--data-dir", str(data), "--workspace", str(base), *args],
                             {**mock_env, **(env or {})}, base, stderr_path,
                             popen=subprocess.Popen if exec_daemons else daemon_popen)
    return RunningDaemon(url, proc, data, gate, log, stderr_path, list(args))


async def answer_lifespan(receive: Callable[[], Awaitable[Mapping[str, Any]]],
                          send: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
    """The ASGI lifespan handshake of a test app served by Hypercorn: every startup and
    shutdown message answered with its ``.complete``, until the shutdown."""
    while True:
        message = await receive()
        await send({"type": message["type"] + ".complete"})
        if message["type"] == "lifespan.shutdown":
            return


@contextmanager
def running_daemon(base: Path, args: Sequence[str] = (),
                   env: Mapping[str, str] | None = None, **kw: object) -> Iterator[RunningDaemon]:
    daemon = start_daemon(base, args, env, **kw)  # type: ignore[arg-type]
    try:
        yield daemon
    finally:
        daemon.stop()
