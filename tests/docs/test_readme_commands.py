"""The README's shell blocks are the commands a new user copies first; each one is checked here,
so the README cannot drift from the tools.

- ``turnkeeper`` commands run in order against a real daemon on 127.0.0.1 (``TURNKEEPER_URL``),
  each with the exit status its comment promises (``# exits N``; otherwise 0). One that the
  README says runs until Ctrl-C gets a SIGINT once it has printed the replay, and must stop with
  130 and no traceback. A ``VAR=$(...)`` line keeps its output for the lines after it.
- ``turnkeeper-daemon`` command lines (they start real agents that are not installed here) go
  through the daemon's own configuration parser, as typed after the shell's quoting: every flag
  must exist and validate, and ``--agent``'s value must split into the agent's command line.
- ``make serve ARGS=...`` lines are expanded by ``make -n`` and the daemon command they produce is
  parsed the same way.

A command of any other kind fails the test until it gets a rule here.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from daemon.config import parse_config
from tests.harness import RunningDaemon, start_daemon

pytestmark = pytest.mark.processes  # starts processes: not in make unit-fast

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
FENCE = re.compile(r"^```sh\n(.*?)^```[ \t]*$", re.S | re.M)
COMMENT = re.compile(r"\s+#\s?(.*)$")
ASSIGN = re.compile(r"^([A-Za-z_]\w*)=\$\((.*)\)$")
BIN = ".venv/bin/"
RUN_S = 60
INTERRUPT_S = 15


@dataclass(frozen=True)
class Command:
    line: int
    text: str
    comment: str

    @property
    def where(self) -> str:
        return f"README.md:{self.line}"


def commands() -> list[list[Command]]:
    """Each ``sh`` block's commands, comments split off (a trailing ``\\`` joins lines)."""
    text = README.read_text()
    found: list[list[Command]] = []
    for match in FENCE.finditer(text):
        first = text[:match.start()].count("\n") + 2
        block: list[Command] = []
        pending = ""
        for offset, raw in enumerate(match.group(1).splitlines()):
            pending += raw
            if pending.endswith("\\"):
                pending = pending[:-1] + " "
                continue
            if pending.strip():
                m = COMMENT.search(pending)
                body = pending[:m.start()] if m else pending
                block.append(Command(first + offset, body.strip(), m.group(1) if m else ""))
            pending = ""
        found.append(block)
    return found


BLOCKS = commands()
ALL = [c for block in BLOCKS for c in block]


def _program(cmd: Command) -> str:
    m = ASSIGN.match(cmd.text)
    words = shlex.split(m.group(2) if m else cmd.text)
    if words[:2] == ["make", "serve"]:
        return "make serve"
    return words[0].removeprefix(BIN)


def test_the_readme_has_the_commands_this_test_knows() -> None:
    assert len(BLOCKS) >= 2 and len(ALL) >= 8  # the fence pattern still finds them
    unknown = [f"{c.where}: {c.text}" for c in ALL
               if _program(c) not in ("turnkeeper", "turnkeeper-daemon", "make serve")]
    assert not unknown, f"commands without a rule in {Path(__file__).name}: {unknown}"


def _daemon_argv(cmd: Command) -> list[str]:
    """The arguments the daemon itself would get from this line."""
    if _program(cmd) == "make serve":
        shown = subprocess.run(["bash", "-c", f"make -n {cmd.text.removeprefix('make ')}"],
                               cwd=ROOT, capture_output=True, text=True, timeout=RUN_S,
                               check=False)
        assert shown.returncode == 0, f"{cmd.where}: {shown.stderr}"
        lines = [ln for ln in shown.stdout.splitlines() if " -m daemon" in ln]
        assert len(lines) == 1, f"{cmd.where}: make -n printed {shown.stdout!r}"
        words = shlex.split(lines[0])
        return words[words.index("daemon") + 1:]
    words = shlex.split(cmd.text)
    assert words[0].removeprefix(BIN) == "turnkeeper-daemon", cmd.where
    return words[1:]


DAEMON_LINES = [c for c in ALL if _program(c) in ("turnkeeper-daemon", "make serve")]


@pytest.mark.parametrize("cmd", DAEMON_LINES, ids=[c.where for c in DAEMON_LINES])
def test_daemon_command_lines_parse_as_shown(cmd: Command) -> None:
    argv = _daemon_argv(cmd)
    config = parse_config(argv, environ={})
    if "--agent" in argv:
        agent = argv[argv.index("--agent") + 1]
        # (a relative path in it is resolved against the current directory)
        names = [Path(word).name for word in config.agent_argv]
        assert names == [Path(word).name for word in shlex.split(agent)], cmd.where
        assert len(config.agent_argv) >= 2, f"{cmd.where}: quoting lost the agent's arguments"


# --- the CLI block, run for real ---------------------------------------------------------------


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    d = start_daemon(tmp_path_factory.mktemp("readme-daemon"))
    try:
        yield d
    finally:
        d.stop()


def _env(daemon: RunningDaemon, variables: dict[str, str]) -> dict[str, str]:
    env = {**os.environ, **variables, "TURNKEEPER_URL": daemon.url}
    env.pop("QWEN_SERVER_TOKEN", None)
    return env


def _shell(cmd: Command) -> str:
    # The README's `.venv/bin/` is the checkout's venv; here, the tools of this interpreter.
    return cmd.text.replace(BIN, str(Path(sys.executable).parent) + "/")


def _interrupted(cmd: Command, env: dict[str, str]) -> None:
    """Runs until it printed something, then Ctrl-C: exits 130 at once, without a traceback."""
    proc = subprocess.Popen(["bash", "-c", f"exec {_shell(cmd)}"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()  # blocks until the replay's first line (or EOF)
        assert first.strip(), f"{cmd.where}: printed nothing before it ended ({proc.wait()})"
        proc.send_signal(signal.SIGINT)
        start = time.monotonic()
        _out, err = proc.communicate(timeout=INTERRUPT_S)
        assert proc.returncode == 130, f"{cmd.where}: exit {proc.returncode}\n{err}"
        assert "Traceback" not in err, f"{cmd.where}:\n{err}"
        assert time.monotonic() - start < INTERRUPT_S
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


CLI = [block for block in BLOCKS if any(_program(c) == "turnkeeper" for c in block)]


@pytest.mark.parametrize("block", CLI, ids=[b[0].where for b in CLI])
def test_cli_commands_run_in_order_against_a_daemon(block: list[Command],
                                                    daemon: RunningDaemon) -> None:
    variables: dict[str, str] = {}
    for cmd in block:
        assert _program(cmd) == "turnkeeper", f"{cmd.where}: mixed with other commands"
        if "Ctrl-C" in cmd.comment:
            _interrupted(cmd, _env(daemon, variables))
            continue
        expected = re.search(r"\bexits (\d+)", cmd.comment)
        assign = ASSIGN.match(cmd.text)
        shell = _shell(cmd)
        if assign:
            shell = f"{assign.group(1)}=$({_shell(Command(cmd.line, assign.group(2), ''))}) " \
                    f"&& printf %s \"${assign.group(1)}\""
        done = subprocess.run(["bash", "-euc", shell], cwd=ROOT, env=_env(daemon, variables),
                              capture_output=True, text=True, timeout=RUN_S, check=False)
        want = int(expected.group(1)) if expected else 0
        assert done.returncode == want, \
            f"{cmd.where}: {cmd.text}\nexit {done.returncode}, the README says {want}\n" \
            f"{done.stdout}\n{done.stderr}"
        if assign:
            assert done.stdout.strip(), f"{cmd.where}: {assign.group(1)} is empty"
            variables[assign.group(1)] = done.stdout.strip()
