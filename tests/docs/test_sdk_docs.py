"""docs/sdk.md's programs run as written against the real daemon: the same program with Trio,
with asyncio and blocking gives the same output, and the asyncio agent tool answers, times out
and cancels the agent's turn. Each ``<!-- example: NAME -->`` block is run as a script, with
only the daemon's URL replaced."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.harness import RunningDaemon, running_daemon

pytestmark = pytest.mark.processes  # starts processes: not in make unit-fast

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "sdk.md"
EXAMPLE = re.compile(r"<!-- example: (\w+) -->\n(?:<!-- [^\n]* -->\n)*```python\n(.*?)```", re.S)
DOC_URL = "http://127.0.0.1:4170"


SMALL_JOURNAL = ["--max-journal-events", "3", "--max-journal-bytes", "300"]


def examples() -> dict[str, str]:
    return dict(EXAMPLE.findall(DOC.read_text()))


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    with running_daemon(tmp_path_factory.mktemp("sdk-docs")) as d:
        yield d


@pytest.fixture(scope="module")
def small_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    """The caps the doc tells the reader to start the daemon with for these examples."""
    with running_daemon(tmp_path_factory.mktemp("sdk-docs-small"), SMALL_JOURNAL) as d:
        yield d


def run_example(name: str, daemon: RunningDaemon) -> str:
    code = examples()[name]
    assert DOC_URL in code, name
    done = subprocess.run([sys.executable, "-c", code.replace(DOC_URL, daemon.url)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_doc_opens_with_the_same_program_three_ways() -> None:
    found = list(examples())
    assert found[:3] == ["trio", "asyncio", "sync"]
    text = DOC.read_text()
    assert text.index("## The same program three ways") < text.index("## `DaemonClient(")
    trio_code, asyncio_code = examples()["trio"], examples()["asyncio"]
    # The async program is the same on both loops: only the import and the run line differ.
    strip = re.compile(r"^(import trio|import asyncio|trio\.run\(main\)|asyncio\.run\(main\(\)\))$",
                       re.M)
    assert strip.sub("", trio_code) == strip.sub("", asyncio_code)


@pytest.mark.parametrize("name", ["trio", "asyncio", "sync"])
def test_each_way_prints_the_answer_and_the_stop_reason(daemon: RunningDaemon, name: str) -> None:
    assert run_example(name, daemon) == "chunk-0chunk-1chunk-2\nstop reason: end_turn\n"


def test_the_blocking_for_loop_example_follows_the_turn_and_keeps_the_cursor(
    daemon: RunningDaemon,
) -> None:
    lines = run_example("sync_events", daemon).splitlines()
    assert lines[-2].endswith(" turn_complete")
    # Synthetic frames (replay_complete) have no id and print "None".
    ids = [int(word) for word in (line.split()[0] for line in lines[:-1]) if word != "None"]
    assert ids == list(range(ids[0], ids[0] + len(ids)))  # from the 202's cursor on, no gap
    assert lines[-1].startswith(f"resume from {ids[-1]} ")


def test_the_asyncio_agent_tool_answers_and_times_out(daemon: RunningDaemon) -> None:
    lines = run_example("agent", daemon).splitlines()
    assert lines == ["['chunk-0chunk-1chunk-2']", "the agent did not finish within 1 s"]
    assert [p for p in daemon.prompts() if "mock:mode=hang" in p]
    # The timed-out turn (an agent that waits for a cancel) was cancelled on the daemon, not
    # left running: soon no session has an active prompt.
    deadline = time.monotonic() + 10
    while any(session["hasActivePrompt"] for session in _sessions(daemon)):
        assert time.monotonic() < deadline, "the hung turn is still running"
        time.sleep(0.05)


def _sessions(daemon: RunningDaemon) -> list[dict[str, object]]:
    body = httpx.get(f"{daemon.url}/daemon/status", timeout=10).json()
    sessions: list[dict[str, object]] = body["sessions"]
    assert sessions
    return sessions


def test_the_exactly_once_example_resends_with_its_key_and_runs_once(
        daemon: RunningDaemon) -> None:
    def runs() -> int:
        return sum("summarise the build log" in line for line in daemon.prompts())

    before = runs()
    assert run_example("exactly_once", daemon) == "the same prompt: True\nfound: True\n"
    deadline = time.monotonic() + 30
    while any(s["hasActivePrompt"] or s["pendingPrompts"]  # polled: no "idle" event exists
              for s in httpx.get(f"{daemon.url}/daemon/status").json()["sessions"]):
        assert time.monotonic() < deadline, "the daemon did not become idle"
        time.sleep(0.02)
    assert runs() == before + 1


def test_the_doc_starts_the_daemon_with_the_caps_the_examples_need() -> None:
    text = DOC.read_text()
    for name in ("load_marker", "repair"):
        assert f"<!-- example: {name} -->\n<!-- doc-test: daemon {' '.join(SMALL_JOURNAL)} -->" \
            in text
    assert f"make serve ARGS='{' '.join(SMALL_JOURNAL)}'" in text


def test_the_load_example_prints_the_marker_and_its_status_text(small_daemon: RunningDaemon) -> None:
    from sdk._truncation import LIVE_JOURNAL_SCOPE

    lines = run_example("load_marker", small_daemon).splitlines()
    assert lines[0] == "turn running: True"
    assert re.fullmatch(r"live journal: \d+ events", lines[1])
    assert re.fullmatch(rf"{LIVE_JOURNAL_SCOPE} marker: \d+ events dropped", lines[2]), lines
    assert lines[3].startswith("History truncated for live turn replay: kept the latest ")
    assert "(limits: 3 replay entries / 300 bytes)" in lines[3]
    # What the doc shows as the output is what the program printed.
    shown = DOC.read_text().split("<!-- example: load_marker -->", 1)[1]
    shown = shown.split("```text\n", 1)[1].split("```", 1)[0]
    assert shown.splitlines() == lines


def test_the_repair_example_restores_the_whole_turn(small_daemon: RunningDaemon) -> None:
    before = len(small_daemon.prompts())
    lines = run_example("repair", small_daemon).splitlines()
    assert len(lines) == 2, lines
    shown = re.fullmatch(r"before the repair: (\d+) chunks of 20", lines[0])
    assert shown is not None and int(shown.group(1)) < 20, lines
    assert lines[1] == "after the repair: 20 chunks of 20"
    assert len(small_daemon.prompts()) == before + 1  # the repair sent no prompt to the agent
