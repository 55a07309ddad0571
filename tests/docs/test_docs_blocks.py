"""Every code block in docs/ is checked, not just read.

- Every fenced block names its language. ``python`` blocks are complete programs: each runs as a
  script against a real daemon (the docs' URL replaced by the test daemon's) and must exit 0,
  and all of them together pass ``mypy --strict`` as written. ``sh`` blocks run in bash
  (``set -eu``) from the checkout, with ``TURNKEEPER_URL`` naming the test daemon. ``json``
  blocks parse. ``text``, ``console`` and ``yaml`` blocks are shown output, signatures,
  diagrams or configuration for other programs.
- A block can be marked in the line(s) above it:
  ``<!-- doc-test: skip (REASON) -->`` (never run; the reason is required and says what tests
  the same thing), ``<!-- doc-test: daemon ARGS -->`` (run against a daemon started with these
  flags, as the text around it tells the reader to), ``<!-- doc-test: prints TEXT -->`` (its
  output holds TEXT), ``<!-- example: NAME -->`` (a named program
  that tests/docs/test_sdk_docs.py runs and checks the output of; here it is type-checked only).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.harness import RunningDaemon, start_daemon

pytestmark = pytest.mark.processes  # starts processes: not in make unit-fast

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted((ROOT / "docs").glob("*.md"))
DOC_URL = "http://127.0.0.1:4170"
LANGS = {"python", "sh", "json", "text", "console", "yaml"}
FENCE = re.compile(r"^([ \t]*)```([^\n`]*)\n(.*?)^\1```[ \t]*$", re.S | re.M)
MARK = re.compile(r"<!-- (doc-test|example): (.*?) -->")
RUN_S = 90


@dataclass(frozen=True)
class Block:
    doc: str
    line: int
    lang: str
    body: str
    marks: tuple[tuple[str, str], ...]

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"

    def mark(self, kind: str) -> str | None:
        for key, value in self.marks:
            if key == "example" and kind == "example":
                return value
            if key == "doc-test" and value.split(" ", 1)[0] == kind:
                return value[len(kind):].strip()
        return None


def blocks() -> list[Block]:
    found: list[Block] = []
    for path in DOCS:
        text = path.read_text()
        for match in FENCE.finditer(text):
            before = text[:match.start()].rstrip("\n").split("\n")
            marks: list[tuple[str, str]] = []
            while before and MARK.fullmatch(before[-1].strip()):
                m = MARK.fullmatch(before.pop().strip())
                assert m is not None
                marks.append((m.group(1), m.group(2)))
            found.append(Block(path.name, text[:match.start()].count("\n") + 1,
                               match.group(2).strip(), textwrap.dedent(match.group(3)),
                               tuple(marks)))
    return found


ALL = blocks()
PYTHON = [b for b in ALL if b.lang == "python"]
RUN_PYTHON = [b for b in PYTHON if b.mark("example") is None and b.mark("skip") is None]
RUN_SH = [b for b in ALL if b.lang == "sh" and b.mark("skip") is None]


def test_every_block_names_a_language_and_every_skip_says_why() -> None:
    assert len(ALL) > 30  # the fence pattern still finds the docs' blocks
    untagged = [b.where for b in ALL if b.lang not in LANGS]
    assert not untagged, f"blocks without a known language ({sorted(LANGS)}): {untagged}"
    for b in ALL:
        skip = b.mark("skip")
        if skip is not None:
            assert re.fullmatch(r"\(.{20,}\)", skip), f"{b.where}: a skip needs its reason"
            assert b.lang in ("python", "sh"), f"{b.where}: only runnable blocks are skipped"


def test_named_examples_are_the_ones_the_sdk_docs_test_checks() -> None:
    from tests.builders.sdk_docs import CHECKED

    named = {b.mark("example") for b in PYTHON} - {None}
    assert named == set(CHECKED)


def test_json_blocks_parse() -> None:
    json_blocks = [b for b in ALL if b.lang == "json"]
    assert json_blocks
    for b in json_blocks:
        try:
            json.loads(b.body)
        except json.JSONDecodeError:
            for line in b.body.splitlines():  # one frame per line
                assert json.loads(line), b.where


def test_python_blocks_pass_mypy_strict(tmp_path: Path) -> None:
    files = []
    for i, b in enumerate(PYTHON):
        stem = re.sub(r"\W", "_", b.where)
        path = tmp_path / f"doc_{i:02d}_{stem}.py"
        path.write_text(b.body)
        files.append(path)
    done = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--python-version", "3.11",
                           "--no-error-summary", *map(str, files)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, check=False)
    names = {str(p): PYTHON[i].where for i, p in enumerate(files)}
    report = done.stdout
    for path, where in names.items():
        report = report.replace(path, where)
    assert done.returncode == 0, report


# --- running them ------------------------------------------------------------------------------


_DAEMONS: dict[str, RunningDaemon] = {}


@pytest.fixture(scope="module")
def daemons(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, RunningDaemon]]:
    try:
        yield _DAEMONS
    finally:
        for d in _DAEMONS.values():
            d.stop()
        _DAEMONS.clear()


def daemon_for(block: Block, daemons: dict[str, RunningDaemon],
               factory: pytest.TempPathFactory) -> RunningDaemon:
    args = block.mark("daemon") or ""
    if args not in daemons:
        daemons[args] = start_daemon(factory.mktemp("docs-daemon"), shlex.split(args))
    return daemons[args]


@pytest.mark.parametrize("block", RUN_PYTHON, ids=[b.where for b in RUN_PYTHON])
def test_python_block_runs(block: Block, daemons: dict[str, RunningDaemon],
                           tmp_path_factory: pytest.TempPathFactory) -> None:
    assert DOC_URL in block.body, f"{block.where}: a program that talks to no daemon"
    daemon = daemon_for(block, daemons, tmp_path_factory)
    done = subprocess.run([sys.executable, "-c", block.body.replace(DOC_URL, daemon.url)],
                          cwd=ROOT, capture_output=True, text=True, timeout=RUN_S, check=False)
    assert done.returncode == 0, f"{block.where}:\n{done.stdout}\n{done.stderr}"
    expected = block.mark("prints")
    if expected is not None:
        assert expected in done.stdout, f"{block.where}: {expected!r} not in\n{done.stdout}"


@pytest.mark.parametrize("block", RUN_SH, ids=[b.where for b in RUN_SH])
def test_sh_block_runs(block: Block, daemons: dict[str, RunningDaemon],
                       tmp_path_factory: pytest.TempPathFactory) -> None:
    daemon = daemon_for(block, daemons, tmp_path_factory)
    bindir = str(Path(sys.executable).parent)  # turnkeeper, turnkeeper-daemon as installed
    env = {**os.environ, "TURNKEEPER_URL": daemon.url, "MOCK_ACP_GATE_DIR": str(daemon.gate_dir),
           "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("QWEN_SERVER_TOKEN", None)
    done = subprocess.run(["bash", "-euc", block.body.replace(DOC_URL, daemon.url)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=RUN_S, check=False)
    assert done.returncode == 0, f"{block.where}:\n{done.stdout}\n{done.stderr}"


def test_every_image_the_docs_show_is_there() -> None:
    shown = [(path.name, target) for path in DOCS
             for target in re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", path.read_text())]
    assert any(t == "reference-web-shell-1280.png" for _, t in shown)  # the pattern still finds
    missing = [f"{doc}: {t}" for doc, t in shown
               if not t.startswith("http") and not (ROOT / "docs" / t).is_file()]
    assert not missing, missing
