"""The daemon's layout holds: ``daemon/core/`` is pure, and the lint that says so really runs.

``make check`` runs ruff over ``daemon/``; ``daemon/core/ruff.toml`` extends the project's config
with banned-api (TID251). These tests pin the parts a later edit could quietly undo: that ruff
picks the nested config up for a core module (and not for a shell), that every shell module of
``daemon/`` is on the banned list (a new shell added beside the cores is banned too), and the
builtins banned-api cannot see (``open``, ``print``, ``input``), checked on the syntax tree.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import daemon
import daemon.core

DAEMON = Path(daemon.__file__).parent
CORE = Path(daemon.core.__file__).parent
ROOT = DAEMON.parent

# Shell modules a core may still import: the version constant only.
_ALLOWED_FROM_DAEMON = {"daemon._version", "daemon.core"}


def _ruff() -> str:
    beside = Path(sys.executable).with_name("ruff")
    found = str(beside) if beside.exists() else shutil.which("ruff")
    if found is None:
        pytest.skip("ruff is not installed (pip install -e '.[test]')")
    return found


def _lint(source: str, as_file: Path) -> subprocess.CompletedProcess[str]:
    """Lint ``source`` as if it were ``as_file`` (ruff picks the config by that path; nothing is
    written to the package)."""
    return subprocess.run(
        [_ruff(), "check", "--no-cache", "--output-format", "concise", "--select", "TID251",
         "--stdin-filename", str(as_file), "-"],
        input=source, capture_output=True, text=True, cwd=ROOT, timeout=60, check=False,
    )


@pytest.mark.parametrize(
    "line",
    [
        "import trio",
        "import trio.lowlevel",
        "from quart_trio import QuartTrio",
        "import hypercorn.trio",
        "import httpx",
        "import socket",
        "import subprocess",
        "from os import path",
        "import sqlite3",
        "from time import monotonic",
        "from daemon.bus import SessionBus",
        "from ..session import Session",
    ],
)
def test_a_core_module_that_imports_io_fails_the_lint(line: str) -> None:
    probe = CORE / "_probe.py"
    result = _lint(f"from __future__ import annotations\n\n{line}\n", probe)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "TID251" in result.stdout


def test_the_same_import_in_a_shell_passes() -> None:
    result = _lint("from __future__ import annotations\n\nimport trio\nimport socket\n",
                   DAEMON / "_probe.py")
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_core_may_import_its_siblings_and_the_protocol() -> None:
    source = ("from __future__ import annotations\n\nimport msgspec\n\n"
              "from daemon._version import __version__\nfrom sdk.protocol import http\n\n"
              "from . import envelope\nfrom .ring import EventRing\n")
    assert _lint(source, CORE / "_probe.py").returncode == 0


def _shell_modules() -> set[str]:
    names = {f"daemon.{p.stem}" for p in DAEMON.glob("*.py") if p.stem != "__init__"}
    names |= {f"daemon.{p.parent.name}" for p in DAEMON.glob("*/__init__.py")}
    return names - _ALLOWED_FROM_DAEMON


def test_every_shell_module_is_banned_from_the_cores() -> None:
    config = tomllib.loads((CORE / "ruff.toml").read_text())
    banned = set(config["lint"]["flake8-tidy-imports"]["banned-api"])
    assert _shell_modules() - banned == set()
    assert "daemon.bus" in banned and "trio" in banned


_BANNED_CALLS = {"open", "print", "input", "__import__", "breakpoint", "exec", "eval"}


@pytest.mark.parametrize("path", sorted(CORE.glob("*.py")), ids=lambda p: p.name)
def test_no_core_module_calls_an_io_builtin(path: Path) -> None:
    tree = ast.parse(path.read_text(), str(path))
    calls = [
        f"{path.name}:{node.lineno} {node.func.id}()"
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        and node.func.id in _BANNED_CALLS
    ]
    assert calls == []
