"""The viewer's own ES modules (``daemon/ui/``) without a browser.

- Its Markdown subset under Node's test runner (``tests/viewer_js/``: what renders, which links
  are refused, hostile input staying text in linear time).
- ``daemon/ui/protocol.js``, the one module holding the wire's names and numbers for the page,
  against the Python protocol package it mirrors: a value changed on one side fails here.
- The module layout: one module per concern, the pure ones free of DOM and network.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from sdk.protocol import constants, headers
from webui_model import pagination, viewer_protocol

pytestmark = pytest.mark.processes  # starts processes: not in make unit-fast

ROOT = Path(__file__).resolve().parents[2]
UI = ROOT / "daemon" / "ui"
PURE = ["protocol", "events", "sse", "truncation", "records", "draft", "reducer", "store",
        "pagination", "replay", "repair", "repair_commit", "markdown", "submission"]


def test_markdown_subset_passes_its_node_tests() -> None:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: the viewer's JS unit tests need Node >= 20")
    proc = subprocess.run([node, "--test", "--test-reporter=tap", "tests/viewer_js/"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    tail = "\n".join(proc.stdout.splitlines()[-30:])
    assert proc.returncode == 0, f"node --test failed:\n{tail}\n{proc.stderr[-2000:]}"
    assert "# fail 0" in proc.stdout and "# pass 0" not in proc.stdout, tail


def _js_constants() -> dict[str, object]:
    """``export const NAME = <JSON literal>;`` lines of protocol.js (strings and numbers)."""
    text = (UI / "protocol.js").read_text()
    found: dict[str, object] = {}
    pattern = r'^export const ([A-Z_]+) =\s*("(?:[^"\\]|\\.)*"|[^;\n]+);'
    for name, value in re.findall(pattern, text, re.M):
        value = value.strip()
        if value == "2 ** 53 - 1":
            found[name] = 2**53 - 1
        elif re.fullmatch(r'"[^"]*"|-?\d+', value):
            found[name] = json.loads(value)
    return found


def test_protocol_module_matches_the_python_protocol() -> None:
    js = _js_constants()
    expected = {
        "ENVELOPE_VERSION": constants.ENVELOPE_VERSION,
        "MAX_EVENT_ID": constants.MAX_EVENT_ID,
        "REPLAY_WINDOW_EXCEEDED": constants.REPLAY_WINDOW_EXCEEDED,
        "LIVE_JOURNAL_SCOPE": constants.LIVE_JOURNAL_SCOPE,
        "BRIDGE_ECHO": constants.BRIDGE_ECHO,
        "RECORD_ID_META_KEY": constants.RECORD_ID_META_KEY,
        "AGENT_CONTEXT_LOST": constants.AGENT_CONTEXT_LOST,
        "PAGINATION_CAPABILITY": pagination.PAGINATION_CAPABILITY,
        "HISTORY_FAILED_CODE": pagination.HISTORY_FAILED_CODE,
        "HEADER_CLIENT_ID": "X-Qwen-Client-Id",
        "HEADER_EVENT_EPOCH": "X-Qwen-Event-Epoch",
        "HEADER_LAST_EVENT_ID": "Last-Event-ID",
        "HEADER_IDEMPOTENCY_KEY": headers.IDEMPOTENCY_KEY,
    }
    assert {name: js.get(name) for name in expected} == expected
    text = (UI / "protocol.js").read_text()
    # Every event type the Python protocol knows is named, and nothing else.
    event_block = re.search(r"export const EVENT = Object\.freeze\(\{(.*?)\}\);", text, re.S)
    assert event_block is not None
    names = set(re.findall(r':\s*"([a-z_]+)"', event_block.group(1)))
    assert names == set(http_event_types())
    reasons = re.search(r"PERMISSION_REASONS = Object\.freeze\(\{(.*?)\}\);", text, re.S)
    assert reasons is not None
    assert set(re.findall(r"^\s*([a-z_]+):", reasons.group(1), re.M)) == set(
        constants.PERMISSION_RESOLVED_REASONS)
    assert js["CODE_SESSION_NOT_FOUND"] == "session_not_found"


def http_event_types() -> list[str]:
    from sdk.protocol.events import KNOWN_EVENT_TYPES
    return sorted(KNOWN_EVENT_TYPES)


def wire_words_spelled(code: str) -> list[str]:
    """Where a viewer module spells a wire word itself instead of importing it from
    protocol.js: an event type an event's ``type`` (or a block's ``source``) is compared
    with, or an ``X-Qwen-``/``X-Turnkeeper-`` header name."""
    code = re.sub(r"//[^\n]*", "", code)
    types = set(http_event_types())
    found = [m.group(0) for m in re.finditer(
        r"\.(?:type|source)\s*[!=]==?\s*[\"'`]([a-z_]+)[\"'`]", code) if m.group(1) in types]
    return found + re.findall(r"[\"'`](?:X-Qwen-|X-Turnkeeper-)[A-Za-z-]*[\"'`]", code)


def test_no_viewer_module_spells_a_wire_word_of_its_own() -> None:
    """The event types and header names the viewer reads come from the generated protocol.js,
    so a renamed one cannot go stale in one module."""
    found = {path.name: wire_words_spelled(path.read_text())
             for path in sorted(UI.glob("*.js")) if path.name != "protocol.js"}
    assert {name: words for name, words in found.items() if words} == {}
    assert wire_words_spelled('if (e.type !== "session_update") h["X-Qwen-Client-Id"] = 1;') == [
        '.type !== "session_update"', '"X-Qwen-Client-Id"']


def test_pure_modules_touch_no_dom_and_no_network() -> None:
    banned = re.compile(r"\b(document|window|fetch|localStorage|sessionStorage|navigator|"
                        r"XMLHttpRequest|innerHTML|outerHTML|insertAdjacentHTML|eval)\b")
    for name in PURE:
        text = (UI / f"{name}.js").read_text()
        code = re.sub(r"//[^\n]*", "", text)  # comments may name them
        assert not banned.search(code), f"{name}.js: {banned.search(code)}"


def test_no_module_writes_markup() -> None:
    """Text reaches the page through textContent and createElement only."""
    for path in UI.glob("*.js"):
        code = re.sub(r"//[^\n]*", "", path.read_text())
        assert not re.search(r"innerHTML|outerHTML|insertAdjacentHTML|document\.write|"
                             r"new Function|\beval\(", code), path.name


def test_protocol_module_is_generated_from_the_python_protocol() -> None:
    """protocol.js is what ``make viewer-protocol`` writes from sdk/protocol (header names,
    routes, event types) and the model's words: a name changed on the Python side and not
    regenerated fails here."""
    assert (UI / "protocol.js").read_text() == viewer_protocol.render()
    routes_block = re.search(r"export const ROUTES = Object\.freeze\(\{(.*?)\}\);",
                             (UI / "protocol.js").read_text(), re.S)
    assert routes_block is not None
    assert "`/session/${enc(sessionId)}/permission/${enc(requestId)}`" in routes_block.group(1)
