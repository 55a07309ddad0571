"""``make demo`` (``python -m webui_model.demo``): its output shows the marker and the repair, and it
leaves nothing behind, also when stopped by SIGTERM or Ctrl-C half-way.

The demo is run exactly as ``make demo`` runs it, as a subprocess; ``TMPDIR`` points at the
test's directory so "the temporary directory is removed" can be checked there.
"""

from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.processes  # starts processes: not in make unit-fast

DEADLINE_S = 90.0
STATUS = (
    "status: History truncated for live turn replay: kept the latest 1 source events and "
    "dropped 20 older source events (limits: 3 replay entries / 300 bytes). "
    "Complete content remains available after the turn finishes."
)


def demo_env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["TMPDIR"] = str(tmp_path)
    env.pop("QWEN_SERVER_TOKEN", None)
    return env


def leftovers(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in tmp_path.glob("turnkeeper-demo-*"))


def gone(pid: int, wait_s: float = 10.0) -> bool:
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.02)  # polling the process table with a bounded deadline
    return False


def test_demo_shows_the_marker_then_the_repair_with_one_more_load(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "webui_model.demo"], capture_output=True, text=True,
                          env=demo_env(tmp_path), timeout=DEADLINE_S, check=False)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    lines = [line.strip() for line in out.splitlines()]
    assert STATUS in lines
    assert ("marker: history_truncated scope=\"live_journal\" truncatedEvents=20 "
            "retainedEvents=1 maxEvents=3 maxBytes=300 fullTranscriptAvailable=true") in lines
    assert "the model shows: [truncation marker], chunk-19" in lines
    assert "the model shows: user prompt, chunk-0 … chunk-19: every chunk once, no marker" in lines
    assert re.search(r"repair +after the terminal the model loads once more \(load 2\): repaired",
                     out)
    assert re.search(r"counts +agent prompts: 1, loads: 2$", out, re.M)
    assert re.search(r"daemon +stopped \(exit status 0\); pids \d+, \d+: no process left", out)
    assert re.search(r"cleanup +temporary directory removed", out)
    # Steps come in order: the marker before the release, the repair after it.
    assert out.index(STATUS) < out.index("gate opened") < out.index("loads once more")
    assert leftovers(tmp_path) == []


def read_until(proc: subprocess.Popen[bytes], needle: bytes) -> bytes:
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    buf = b""
    deadline = time.monotonic() + DEADLINE_S
    try:
        while needle not in buf:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no {needle!r} in time: {buf!r}"
            if sel.select(remaining):
                chunk = os.read(proc.stdout.fileno(), 4096)
                assert chunk, f"demo exited before {needle!r}: {buf!r}"
                buf += chunk
    finally:
        sel.close()
    return buf


def demo_command(ignore_sigint: bool) -> list[str]:
    """``python -m webui_model.demo --step``; with ``ignore_sigint``, started with SIGINT ignored, as a
    background job of a non-interactive shell (``make test &`` in a script) starts it: Python
    then installs no KeyboardInterrupt handler and neither does Trio."""
    argv = [sys.executable, "-m", "webui_model.demo", "--step"]
    if not ignore_sigint:
        return argv
    return ["/bin/sh", "-c", 'trap "" INT; exec "$@"', "sh", *argv]


@pytest.mark.parametrize(("sig", "code", "ignore_sigint"), [
    (signal.SIGTERM, 128 + signal.SIGTERM, False),
    (signal.SIGINT, 130, False),
    (signal.SIGINT, 130, True),
])
def test_a_signal_mid_turn_stops_daemon_and_agent_and_removes_the_directory(
    tmp_path: Path, sig: signal.Signals, code: int, ignore_sigint: bool,
) -> None:
    proc = subprocess.Popen(demo_command(ignore_sigint), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=demo_env(tmp_path))
    try:
        head = read_until(proc, b"press Enter").decode()
        assert STATUS in head  # the turn is held open, mid-way
        daemon_pid = int(re.search(r"\(pid (\d+)\)", head).group(1))  # type: ignore[union-attr]
        agent_pid = int(re.search(r"agent pid (\d+)", head).group(1))  # type: ignore[union-attr]
        assert leftovers(tmp_path) != []
        proc.send_signal(sig)
        rest, err = proc.communicate(timeout=DEADLINE_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == code, err.decode()
    assert re.search(rb"daemon +stopped \(exit status 0\).*no process left", rest)
    assert gone(daemon_pid) and gone(agent_pid)
    assert leftovers(tmp_path) == []
