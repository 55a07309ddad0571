"""The browser viewer agrees with the Python WebUI model.

``tests/conformance/vectors.json`` holds the Python model's answers (rendered blocks, status
texts, pagination, repair targets, suffix starts, "is new" decisions, repaired states). The
first test fails when the committed vectors no longer match what the Python model produces now
(regenerate with ``python -m tests.conformance.generate``); the second runs the same vectors
against the viewer's ES modules (``daemon/ui/*.js``) under Node's test runner.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conformance.generate import VECTORS, build_vectors, render

pytestmark = pytest.mark.processes  # starts processes: not in make unit-fast

ROOT = Path(__file__).resolve().parents[2]


def test_committed_vectors_match_the_python_model() -> None:
    fresh = render(build_vectors())
    committed = VECTORS.read_text(encoding="utf-8")
    assert committed == fresh, (
        "tests/conformance/vectors.json is stale: run `python -m tests.conformance.generate`"
    )


def test_vectors_cover_every_section() -> None:
    vectors = build_vectors()
    for section in ("status_texts", "reducer", "replay", "pages", "repair"):
        assert len(vectors[section]) >= 5, section
    kinds = {b["kind"] for case in vectors["reducer"] for b in case["blocks"]}
    assert kinds == {"user", "assistant", "thought", "tool", "permission", "status", "error",
                     "debug", "prompt_cancelled"}
    outcomes = {("result" in c["expected"], "notice" in c["expected"]) for c in vectors["repair"]}
    assert {(True, False), (False, True)} <= outcomes


def test_viewer_modules_pass_the_vectors_under_node() -> None:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: the viewer's JS conformance run needs Node >= 20")
    proc = subprocess.run(
        [node, "--test", "--test-reporter=tap", "tests/conformance/"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    tail = "\n".join(proc.stdout.splitlines()[-40:])
    assert proc.returncode == 0, f"node --test failed:\n{tail}\n{proc.stderr[-2000:]}"
    assert "# fail 0" in proc.stdout and "# pass 0" not in proc.stdout, tail
