"""The event walk docs/architecture.md states, measured on a real daemon (tests/event_walk.py):
one agent read of plain text chunks from the agent's stdout to an SSE socket enters no more
modules, and returns to no more modules it had left, than the figures written there."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.event_walk import measure

pytestmark = pytest.mark.processes  # the daemon's agent is a real subprocess

ARCHITECTURE = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"
# "| reader | 19 | 17 |": the table of docs/architecture.md's "One event's walk".
_ROW = re.compile(r"^\| (reader|delivery|stream) \| (\d+) \| (\d+) \|", re.MULTILINE)


def stated() -> dict[str, tuple[int, int]]:
    rows = {role: (int(entered), int(returned))
            for role, entered, returned in _ROW.findall(ARCHITECTURE.read_text())}
    assert rows.keys() == {"reader", "delivery", "stream"}, rows
    return rows


async def test_one_read_walks_no_further_than_the_architecture_says(tmp_path: Path) -> None:
    walks = await measure(tmp_path)
    for role, (entered, returned) in stated().items():
        walk = walks[role]
        assert walk.entered <= entered and walk.returns <= returned, \
            f"{role}: entered {walk.entered}, returned {walk.returns}: {walk.render()}"
