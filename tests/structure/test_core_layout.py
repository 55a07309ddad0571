"""The layout holds: every pure package is pure, and the lint that says so really runs.

``make check`` runs ruff over the tree. Four nested configs extend the project's config with
banned-api (TID251): ``daemon/core/ruff.toml`` (the daemon's cores), ``sdk/protocol/ruff.toml``
(the wire protocol), ``sdk/ruff.toml`` (the SDK's top-level pure modules; its readers, client
and driver, the Trio shells, are exempted there by name) and ``webui_model/ruff.toml`` (the
model's pure modules; the provider's modules, its Trio shell, are exempted there by name). These tests pin the parts a later edit
could quietly undo: that ruff picks each nested config up for a pure path (and not for a shell),
that the three lists ban the same I/O, that every shell module is banned from the pure ones (a new
shell added beside them is banned too), and the builtins banned-api cannot see (``open``,
``print``, ``input``), checked on the syntax tree.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

import daemon
import daemon.core
import sdk
import sdk.protocol
import webui_model

pytestmark = pytest.mark.processes  # starts processes: not in make unit-fast

DAEMON = Path(daemon.__file__).parent
CORE = Path(daemon.core.__file__).parent
SDK = Path(sdk.__file__).parent
PROTOCOL = Path(sdk.protocol.__file__).parent
MODEL = Path(webui_model.__file__).parent
ROOT = DAEMON.parent

# The daemon's modules that are not shells: its cores.
_ALLOWED_FROM_DAEMON = {"daemon.core"}
# The pure packages: (config directory, where a probe that must pass the rule sits).
PURE = {"daemon/core": (CORE, DAEMON / "_probe.py"),
        "sdk/protocol": (PROTOCOL, SDK / "_client.py"),
        "sdk": (SDK, SDK / "_client.py"),
        "webui_model": (MODEL, MODEL / "provider.py")}
# The model's modules that must stay pure (a per-file exemption for one of them is a mistake).
_MODEL_PURE = {"blocks", "draft", "effects", "pagination", "records", "reducer", "repair_commit",
               "replay", "side_channels", "store"}
# The SDK's top-level modules that must stay pure.
_SDK_PURE = {"_errors", "_repair", "_submission", "_truncation"}


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


def _config(directory: Path) -> dict[str, Any]:
    return tomllib.loads((directory / "ruff.toml").read_text())


def _banned(directory: Path) -> set[str]:
    return set(_config(directory)["lint"]["flake8-tidy-imports"]["banned-api"])


def _exempt(directory: Path) -> set[str]:
    ignores = _config(directory)["lint"]["per-file-ignores"]
    return {Path(pattern).stem for pattern, rules in ignores.items() if "TID251" in rules}


def _model_shells() -> set[str]:
    return _exempt(MODEL)


def _sdk_shells() -> set[str]:
    return _exempt(SDK)


def _pure_modules() -> list[Path]:
    shells = _model_shells()
    sdk_shells = _sdk_shells()
    return (sorted(CORE.glob("*.py")) + sorted(PROTOCOL.glob("*.py"))
            + sorted(p for p in SDK.glob("*.py") if p.stem not in sdk_shells)
            + sorted(p for p in MODEL.glob("*.py") if p.stem not in shells))


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


@pytest.mark.parametrize("package", ["sdk/protocol", "sdk", "webui_model"])
@pytest.mark.parametrize(
    "line",
    [
        "import trio",
        "from trio_websocket import open_websocket_url",
        "import httpx",
        "import socket",
        "from pathlib import Path",
        "import os",
        "from time import monotonic",
        "import logging",
        "from sdk._client import DaemonClient",
        "from daemon.core.envelope import encode_json",
    ],
)
def test_a_pure_module_that_imports_io_fails_the_lint(package: str, line: str) -> None:
    directory, _ = PURE[package]
    result = _lint(f"from __future__ import annotations\n\n{line}\n", directory / "_probe.py")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "TID251" in result.stdout


def test_a_model_module_cannot_import_the_provider() -> None:
    for line in ("from webui_model.provider_core import OpenSession",
                 "from .navigation import Navigation"):
        result = _lint(f"from __future__ import annotations\n\n{line}\n", MODEL / "reducer.py")
        assert result.returncode == 1, result.stdout + result.stderr


@pytest.mark.parametrize("package", sorted(PURE))
def test_the_same_import_in_a_shell_passes(package: str) -> None:
    _, shell = PURE[package]
    result = _lint("from __future__ import annotations\n\nimport trio\nimport socket\n", shell)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_core_may_import_its_siblings_and_the_protocol() -> None:
    source = ("from __future__ import annotations\n\nimport msgspec\n\n"
              "from sdk.protocol import __version__, http\n\n"
              "from . import envelope\nfrom .ring import EventRing\n")
    assert _lint(source, CORE / "_probe.py").returncode == 0


def test_the_pure_packages_ban_the_same_io() -> None:
    io = {name for name in _banned(CORE) if not name.startswith("daemon.")}
    assert {"trio", "httpx", "socket", "os", "time", "logging"} <= io
    assert io - _banned(PROTOCOL) == set()
    assert io - _banned(MODEL) == set()
    assert _banned(SDK) == _banned(PROTOCOL)


def _shell_modules() -> set[str]:
    names = {f"daemon.{p.stem}" for p in DAEMON.glob("*.py") if p.stem != "__init__"}
    names |= {f"daemon.{p.parent.name}" for p in DAEMON.glob("*/__init__.py")}
    return names - _ALLOWED_FROM_DAEMON


def test_every_shell_module_is_banned_from_the_cores() -> None:
    banned = _banned(CORE)
    assert _shell_modules() - banned == set()
    assert "daemon.bus" in banned and "trio" in banned


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def _uses(path: Path, banned: set[str]) -> bool:
    return any(name == b or name.startswith(b + ".") for name in _imports(path) for b in banned)


def test_every_sdk_shell_is_banned_from_the_protocol_and_the_model() -> None:
    io = _banned(PROTOCOL)
    # sdk/__init__.py only names the shells' types for lazy import; importing it runs none.
    shells = {f"sdk.{p.stem}" for p in SDK.glob("*.py") if p.stem != "__init__" and _uses(p, io)}
    assert {"sdk._client", "sdk._ws", "sdk._session"} <= shells
    assert shells - _banned(PROTOCOL) == set()
    assert shells - _banned(MODEL) == set()
    assert shells - _banned(SDK) == set()
    assert {"daemon", "webui_model"} <= _banned(PROTOCOL)


@pytest.mark.parametrize("module", sorted(_SDK_PURE))
def test_an_sdk_pure_module_that_imports_io_fails_the_lint(module: str) -> None:
    for line in ("import trio", "import os", "from sdk._client import DaemonClient"):
        result = _lint(f"from __future__ import annotations\n\n{line}\n", SDK / f"{module}.py")
        assert result.returncode == 1, result.stdout + result.stderr


def test_the_sdk_shells_are_the_readers_and_nothing_pure_is_exempt() -> None:
    shells = _sdk_shells()
    assert shells & _SDK_PURE == set()
    assert {"_client", "_ws", "_session", "_repair_driver"} <= shells
    # A module that does Trio or I/O work is exempt by name or it fails the lint.
    io = {name for name in _banned(SDK) if not name.startswith("sdk.")}
    doing_io = {p.stem for p in SDK.glob("*.py") if _uses(p, io)}
    assert doing_io - shells == set()
    assert {p.stem for p in SDK.glob("*.py")} - shells >= _SDK_PURE


def test_the_model_shells_are_the_provider_and_are_banned_from_the_pure_modules() -> None:
    shells = _model_shells()
    assert shells & _MODEL_PURE == set()
    assert {"provider", "provider_core", "navigation"} <= shells
    banned = _banned(MODEL)
    assert {f"webui_model.{s}" for s in shells if s != "__init__"} - banned == set()
    # A module that does Trio work is exempt by name or it fails the lint: nothing slips through.
    io = {name for name in banned if not name.startswith("webui_model.")}
    doing_io = {p.stem for p in MODEL.glob("*.py") if _uses(p, io)}
    assert doing_io - shells == set()
    assert {p.stem for p in MODEL.glob("*.py")} - shells >= _MODEL_PURE


_BANNED_CALLS = {"open", "print", "input", "__import__", "breakpoint", "exec", "eval"}


@pytest.mark.parametrize("path", _pure_modules(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_no_pure_module_calls_an_io_builtin(path: Path) -> None:
    tree = ast.parse(path.read_text(), str(path))
    calls = [
        f"{path.name}:{node.lineno} {node.func.id}()"
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        and node.func.id in _BANNED_CALLS
    ]
    assert calls == []
