"""Run the real daemon as a subprocess on 127.0.0.1 for integration tests.

The daemon is started with ``--port 0``; its first stdout line names the URL it bound, so tests
never guess ports and never sleep waiting for start-up.
"""

from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

LISTEN_RE = re.compile(r"listening on (http://\S+)")
START_TIMEOUT_S = 30.0


@dataclass
class RunningDaemon:
    url: str
    proc: subprocess.Popen[bytes]
    data_dir: Path
    gate_dir: Path
    prompt_log: Path
    stderr_path: Path
    args: list[str] = field(default_factory=list)

    def open_gate(self, name: str = "open") -> None:
        (self.gate_dir / name).touch()

    def prompts(self) -> list[str]:
        if not self.prompt_log.exists():
            return []
        return [line for line in self.prompt_log.read_text().splitlines() if line.strip()]

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int:
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
    # The mock waits for <gate>/<name> when a prompt says mock:gate=<name>, else for "open":
    # ungated prompts run straight through.
    (gate / "open").touch()
    log = base / "prompts.log"
    stderr_path = base / f"{tag}-stderr-{time.monotonic_ns()}.log"
    full_env = dict(os.environ)
    full_env.pop("QWEN_SERVER_TOKEN", None)
    full_env.update({"MOCK_ACP_GATE_DIR": str(gate), "MOCK_ACP_PROMPT_LOG": str(log),
                     "PYTHONUNBUFFERED": "1"})
    if env:
        full_env.update(env)
    argv = [sys.executable, "-m", "daemon", "--hostname", "127.0.0.1", "--port", "0",
            "--data-dir", str(data), "--workspace", str(base), *args]
    with open(stderr_path, "wb") as err:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, env=full_env,
                                cwd=str(base))
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + START_TIMEOUT_S
    buf = b""
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RuntimeError("daemon did not report its URL in time:\n"
                                   + stderr_path.read_text(errors="replace"))
            if not sel.select(remaining):
                continue
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                proc.wait(5)
                raise RuntimeError(f"daemon exited with {proc.returncode} before listening:\n"
                                   + stderr_path.read_text(errors="replace"))
            buf += chunk
            match = LISTEN_RE.search(buf.decode(errors="replace"))
            if match:
                return RunningDaemon(match.group(1), proc, data, gate, log, stderr_path,
                                     list(args))
    finally:
        sel.close()


@contextmanager
def running_daemon(base: Path, args: Sequence[str] = (),
                   env: Mapping[str, str] | None = None, **kw: object) -> Iterator[RunningDaemon]:
    daemon = start_daemon(base, args, env, **kw)  # type: ignore[arg-type]
    try:
        yield daemon
    finally:
        daemon.stop()
