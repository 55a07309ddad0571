"""``python -m benchmarks`` as a command: an interrupted run cleans up after itself and still
reports, the table fits the terminal (or not, with ``--wide``), ``--out`` names the code that
was measured, and the package page's long description has no relative links.

The signal tests run a real benchmark (``e2e`` with a turn far too long to finish) against a
real daemon and its mock agent, wait on the run's own progress lines on stderr until the daemon
and agents are up, record every process whose environment names the run's scratch directory
(every process the run starts inherits it as ``TMPDIR``), then signal the run.
"""

from __future__ import annotations

import json
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from datetime import datetime
from pathlib import Path

import pytest

from benchmarks.harness import Row, format_table, git_commit, run_meta
from benchmarks.launcher import alive, processes_marked
from sdk.protocol import __version__

pytestmark = pytest.mark.processes  # starts processes: not in make unit-fast

ROOT = Path(__file__).resolve().parents[2]
DEADLINE_S = 90.0  # a hang guard for each wait, not a timing bound


def _read_until(proc: subprocess.Popen[str], pattern: str, seen: list[str]) -> re.Match[str]:
    """Read the run's stderr line by line until a line matches ``pattern``."""
    assert proc.stderr is not None
    deadline = time.monotonic() + DEADLINE_S
    regex = re.compile(pattern)
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stderr, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if not sel.select(deadline - time.monotonic()):
                continue
            line = proc.stderr.readline()
            if not line:
                break
            seen.append(line)
            match = regex.search(line)
            if match:
                return match
    proc.kill()
    raise AssertionError(f"no stderr line matched {pattern!r}:\n{''.join(seen)}")


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _ppid(pid: int) -> int:
    raw = Path(f"/proc/{pid}/stat").read_bytes()
    return int(raw[raw.rindex(b")") + 2:].split()[1])


def _wait_for_agents(scratch: str, daemon_pid: int, run_pid: int) -> list[int]:
    """Poll /proc (bounded) until the daemon, its agent and the benchmark's own raw-emission
    agent all run; return every process of the run."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        started = processes_marked(scratch)
        parents = {_ppid(pid) for pid in started if "daemon.mock_agent" in _cmdline(pid)}
        if daemon_pid in started and {daemon_pid, run_pid} <= parents:
            return started
        assert time.monotonic() < deadline, (daemon_pid, run_pid, started, parents)
        time.sleep(0.01)  # poll interval of a bounded wait on the processes' real state


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_every_process_and_reports_what_was_done(
        tmp_path: Path, signum: signal.Signals) -> None:
    out = tmp_path / "partial.json"
    env = dict(os.environ, COLUMNS="80", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks", "e2e", "--quick", "--chunks", "50000000",
         "--subscribers", "1", "--out", str(out)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen: list[str] = []
    scratch = ""
    try:
        scratch = _read_until(proc, r"scratch directory (\S+)", seen).group(1)
        daemon_pid = int(_read_until(proc, r"daemon pid (\d+) listening", seen).group(1))
        # After the warm-up turn: the daemon's agent runs, and the raw-emission agent (started
        # by the benchmark itself) is streaming 50M lines.
        _read_until(proc, r"agent raw emission", seen)
        started = _wait_for_agents(scratch, daemon_pid, proc.pid)
        proc.send_signal(signum)
        stdout, stderr = proc.communicate(timeout=DEADLINE_S)
        detail = f"stdout:\n{stdout}\nstderr:\n{''.join(seen)}{stderr}"
        assert proc.returncode == 128 + signum, detail
        assert [pid for pid in started if alive(pid)] == [], detail
        assert processes_marked(scratch) == [], detail
        # The run killed them itself (an agent reading a closed stdin would also die on its own).
        killed = re.search(rf"{signum.name}: killed pids ([\d ]+);", stderr)
        assert killed is not None, detail
        assert set(started) <= {int(pid) for pid in killed.group(1).split()}, detail
        assert not Path(scratch).exists(), detail
        # The partial table: the interrupted benchmark marked as such, fitted to COLUMNS=80.
        assert "e2e: (interrupted)" in stdout and "INTERRUPTED" in stdout, detail
        assert f"stopped by {signum.name}" in stdout, detail
        assert "1 INTERRUPTED" in stdout, detail
        assert max(len(line) for line in stdout.splitlines()) <= 80, detail
        results = json.loads(out.read_text())
        (row,) = results["rows"]
        assert (row["benchmark"], row["verdict"], row["interrupted"]) == (
            "e2e", "INTERRUPTED", True)
        assert results["meta"]["version"] == __version__
    finally:
        # Whatever failed above, leave no daemon or scratch directory to the next test.
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        if scratch:
            for pid in processes_marked(scratch):
                os.kill(pid, signal.SIGKILL)
            shutil.rmtree(scratch, ignore_errors=True)


# --- the table's width -------------------------------------------------------------------------


def _rows() -> list[Row]:
    long_target = "at-cap <= 1.3x empty; >= 300,000/s at caps; a target with many words"
    return [
        Row(benchmark="journal", name="LiveJournal.append at caps, unmerged, alternating kinds",
            params={"events": 100_000, "transcript": True}, unit="events/s",
            samples=[650_000.0, 660_000.0, 640_000.0], baseline=731_068.0,
            baseline_label="empty journal", ratio=1.12, ratio_label="cost vs empty",
            target=long_target, ok=True, notes=["a note " * 30]),
        Row(benchmark="e2e", name="throughput, 64 subscribers", params={"chunks": 100_000},
            unit="events/s", samples=[12_345.0], target=">= 16x the 1-subscriber rate",
            ok=False),
        Row(benchmark="e2e", name="(interrupted)", params={}, unit="", samples=[],
            error="stopped by SIGTERM after 3.0s of the run", interrupted=True),
    ]


def _words(rows: list[Row]) -> set[str]:
    from benchmarks.harness import table_cells

    return {word for row in rows for cell in table_cells(row) for word in cell.split()}


@pytest.mark.parametrize("width", [100, 80, 60, 40])
def test_the_table_fits_the_width_and_keeps_every_word(width: int) -> None:
    rows = _rows()
    table = format_table(rows, width)
    assert max(len(line) for line in table.splitlines()) <= width, table
    for word in _words(rows):
        assert word in table, (word, table)
    assert "INTERRUPTED e2e: (interrupted): stopped by SIGTERM" in table.replace("\n    ", " ")


def test_wide_prints_one_line_per_row() -> None:
    rows = _rows()
    table = format_table(rows, None)
    lines = table.splitlines()
    assert max(len(line) for line in lines) > 100
    for row, line in zip(rows, lines[2:], strict=False):
        assert line.startswith(f"{row.benchmark}: {row.name}")
        assert row.target in line and row.verdict in line
    assert len(lines) == 2 + len(rows) + 1 + 2  # header, rule, rows, blank, two footnotes
    assert f"journal: {rows[0].name}: {rows[0].notes[0]}" in lines


def test_cli_wide_flag_is_wider_than_the_terminal() -> None:
    from benchmarks.__main__ import build_parser

    assert build_parser().parse_args(["--wide"]).wide is True
    assert build_parser().parse_args(["e2e", "--wide"]).wide is True
    assert build_parser().parse_args([]).wide is False


# --- what --out records about the run -------------------------------------------------------------


def test_out_meta_names_the_version_the_commit_and_the_date(tmp_path: Path) -> None:
    meta = run_meta(["--quick"], True, 1_800_000_000.0, git_commit())
    assert meta["version"] == __version__
    assert datetime.fromisoformat(meta["date"]).timestamp() == 1_800_000_000.0
    if (ROOT / ".git").exists():
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout.strip()
        assert meta["commit"] == head
    assert git_commit(tmp_path) is None  # not a git checkout


# --- the package page --------------------------------------------------------------------------

# [text](target) and [text]: target, where target has no scheme (http:, mailto:) and no #anchor.
MD_LINK = re.compile(r"\]\(\s*<?([^)\s>]+)|^\s*\[[^\]]+\]:\s*<?(\S+?)>?\s*$", re.MULTILINE)
SRC_ATTR = re.compile(r"""(?:src|href)\s*=\s*["']([^"']+)["']""")


def _relative_links(text: str) -> list[str]:
    targets = [a or b for a, b in MD_LINK.findall(text)] + SRC_ATTR.findall(text)
    return [t for t in targets if not re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", t)
            and not t.startswith("#")]


def test_the_package_long_description_has_no_relative_links() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    readme = project["readme"]
    path = readme if isinstance(readme, str) else readme["file"]
    text = (ROOT / path).read_text()
    assert _relative_links(text) == []
    for command in ("turnkeeper-daemon", "turnkeeper", "python -m webui_model.demo", "pip install"):
        assert command in text, command
    # The checker does find relative links (README.md's own, and these).
    assert _relative_links("see [the protocol](docs/protocol.md) and ![x](img.png)") == [
        "docs/protocol.md", "img.png"]
    assert _relative_links("[ref]: docs/sdk.md\n<img src='a.png'>") == ["docs/sdk.md", "a.png"]
    assert _relative_links("[site](https://example.org) [top](#install)") == []


# --- journal progress ----------------------------------------------------------------------------


def test_journal_reports_every_step_and_trial() -> None:
    from benchmarks import journal

    lines: list[str] = []
    rows = journal.run(True, lines.append)
    assert rows and all(row["error"] is None for row in rows)
    steps = [line for line in lines if re.match(r"step \d/8 .*: trial \d/3 ", line)]
    assert len(steps) == 8 * 3, lines
    for step in range(1, 9):
        assert sum(line.startswith(f"step {step}/8 ") for line in steps) == 3, (step, lines)
    assert all(re.search(r"\d+ ms", line) for line in steps)
