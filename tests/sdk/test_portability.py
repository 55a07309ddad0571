"""The SDK and the WebUI model run in any Python program: no module of theirs imports Trio;
under asyncio, ``import sdk`` and real requests load neither Trio nor a daemon module; and an
SDK-only install (this distribution without its dependencies, plus the ``sdk`` extra's
requirements and theirs, nothing else) runs a session against the real daemon, its command
line included, in an interpreter where ``import trio`` fails."""

from __future__ import annotations

import ast
import importlib.metadata
import subprocess
import sys
import textwrap
import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.harness import RunningDaemon, running_daemon

pytestmark = pytest.mark.processes  # starts processes: not in make unit-fast

ROOT = Path(__file__).resolve().parents[2]
OUR_PACKAGES = ("daemon", "sdk", "webui_model", "benchmarks")  # what `pip install --no-deps` ships


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    with running_daemon(tmp_path_factory.mktemp("sdk-portable")) as d:
        yield d


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


@pytest.mark.parametrize("package", ["sdk", "webui_model"])
def test_no_module_imports_trio(package: str) -> None:
    offenders = sorted(
        str(path.relative_to(ROOT))
        for path in (ROOT / package).rglob("*.py")
        if any(n == "trio" or n.startswith(("trio.", "trio_")) for n in _imports(path))
    )
    assert offenders == []


# One session under asyncio: a request, a prompt through a session handle and its WebSocket
# stream, and the WebUI model's provider; then what got loaded.
SESSION = textwrap.dedent("""
    import asyncio, sys

    import sdk
    from webui_model import WebUIProvider

    async def main(url):
        async with sdk.DaemonClient(url) as client:
            assert (await client.health()).status == "ok"
            handle = await sdk.SessionHandle.create(client, transport="ws")
            async with asyncio.TaskGroup() as tasks:
                seen = []
                async def on_event(event):
                    seen.append(event.type)
                handle.subscribe(tasks, on_event)
                done = await handle.prompt("portable mock:chunks=2")
                await handle.close()
            assert done.stop_reason == "end_turn" and "turn_complete" in seen
            async with WebUIProvider(client) as provider:
                await provider.open_session(handle.session_id)
                assert provider.store.blocks
        print("ok")

    asyncio.run(main(sys.argv[1]))
    loaded = sorted(m for m in sys.modules
                    if m.split(".")[0] in ("trio", "trio_websocket", "daemon"))
    print("loaded", loaded)
""")


def test_import_sdk_and_requests_under_asyncio_load_no_trio_and_no_daemon(
    daemon: RunningDaemon,
) -> None:
    done = subprocess.run([sys.executable, "-c", SESSION, daemon.url], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["ok", "loaded []"]


# httpcore, loaded before Trio is (a client made outside any loop), still serves Trio after.
TRIO_LATER = textwrap.dedent("""
    import sys

    import sdk

    client = sdk.DaemonClient(sys.argv[1])
    assert "trio" not in sys.modules and "httpcore" in sys.modules
    import trio

    async def main():
        async with client:
            handle = await sdk.SessionHandle.create(client)
            done = await handle.prompt("later mock:chunks=1")
            await handle.close()
        assert done.stop_reason == "end_turn"
        print("ok")

    trio.run(main)
""")


def test_httpcore_loaded_before_trio_still_serves_a_trio_program(daemon: RunningDaemon) -> None:
    done = subprocess.run([sys.executable, "-c", TRIO_LATER, daemon.url], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["ok"]


def _closure(requirements: list[str]) -> set[str]:
    """The distributions ``requirements`` pull in, here (markers evaluated, no extras)."""
    found: set[str] = set()
    todo = [Requirement(text) for text in requirements]
    while todo:
        requirement = todo.pop()
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(requirement.name)
        if name in found:
            continue
        found.add(name)
        todo += [Requirement(text) for text in importlib.metadata.requires(name) or []]
    return found


def _top_level(distribution: str) -> set[str]:
    files = importlib.metadata.distribution(distribution).files or []
    tops: set[str] = set()
    for file in files:
        top = file.parts[0]
        if top.endswith((".dist-info", ".pth")) or top in ("..", "__pycache__"):
            continue
        tops.add(top)
    return tops


def _sdk_only_tree(base: Path) -> Path:
    """A directory holding exactly an SDK-only install: our packages and the sdk extra's
    requirement closure (linked from this environment)."""
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["sdk"]
    tree = base / "site"
    tree.mkdir()
    for package in OUR_PACKAGES:
        (tree / package).symlink_to(ROOT / package)
    for distribution in sorted(_closure(extra)):
        located = importlib.metadata.distribution(distribution).locate_file("")
        for top in _top_level(distribution):
            (tree / top).symlink_to(Path(str(located)) / top)
    return tree


MINIMAL = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[1])
    try:
        import trio
    except ModuleNotFoundError:
        print("no trio")
""") + SESSION.replace("sys.argv[1]", "sys.argv[2]")


def test_an_sdk_only_install_runs_without_trio(daemon: RunningDaemon, tmp_path: Path) -> None:
    tree = _sdk_only_tree(tmp_path)
    # -I -S: no site-packages, no environment, no current directory: only the tree and stdlib.
    isolated = [sys.executable, "-I", "-S"]
    done = subprocess.run([*isolated, "-c", MINIMAL, str(tree), daemon.url], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["no trio", "ok", "loaded []"]
    # The command line too (it runs on asyncio).
    cli = "import sys; sys.path.insert(0, sys.argv.pop(1)); from sdk.__main__ import main; " \
          "sys.exit(main())"
    created = subprocess.run([*isolated, "-c", cli, str(tree), "--url", daemon.url, "create"],
                             cwd=tmp_path, capture_output=True, text=True, timeout=60,
                             check=False)
    assert created.returncode == 0, created.stderr
    assert uuid.UUID(created.stdout.strip())  # the new session's id
