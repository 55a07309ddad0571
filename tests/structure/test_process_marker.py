"""Every test module that starts a process says so, including the ones `make test` never runs.

The guard in ``tests/conftest.py`` refuses process creation to an unmarked test, but only in the
runs that collect it. The agent matrix (``make test-agents``) is run by CI after `make test`, not
by it, so a missing marker there surfaced only in CI. This reads the source instead: a test module
(``test_*.py``, or a module the Makefile hands to pytest by path) that names a way of starting a
process carries ``pytestmark = pytest.mark.processes``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent

# The calls and helpers through which a test starts a process.
STARTERS = frozenset({
    "start_daemon", "spawn_daemon", "Popen", "run_process", "open_process", "fork",
    "posix_spawn", "check_call", "check_output",
})


def _pytest_targets() -> set[Path]:
    """Modules the Makefile runs pytest on by path (those need not be named test_*.py)."""
    targets: set[Path] = set()
    for line in (ROOT / "Makefile").read_text().splitlines():
        if "pytest" not in line and not line.lstrip().startswith("tests/"):
            continue
        for name in re.findall(r"tests/[\w/]+\.py", line):
            path = ROOT / name
            if path.name != "conftest.py" and path.exists():
                targets.add(path)
    return targets


def _test_modules() -> list[Path]:
    named = {p for p in TESTS.rglob("test_*.py") if ".venv" not in p.parts}
    return sorted(named | _pytest_targets())


def _starts_processes(tree: ast.Module) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in STARTERS:
                return True
            if (name == "run" and isinstance(func, ast.Attribute)
                    and getattr(func.value, "id", None) == "subprocess"):
                return True
    return False


def _marked(tree: ast.Module) -> bool:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                getattr(t, "id", None) == "pytestmark" for t in node.targets):
            return "processes" in ast.unparse(node.value)
    return False


def test_the_agent_matrix_is_among_the_modules_checked() -> None:
    assert TESTS / "agent_matrix" / "scenario.py" in _test_modules()


def test_a_module_that_starts_processes_is_marked() -> None:
    unmarked = []
    for path in _test_modules():
        tree = ast.parse(path.read_text(), str(path))
        if _starts_processes(tree) and not _marked(tree):
            unmarked.append(str(path.relative_to(ROOT)))
    assert not unmarked, f"start processes without pytest.mark.processes: {unmarked}"
