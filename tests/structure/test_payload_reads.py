"""No module outside ``sdk/protocol/`` digs a wire member out of a dict by hand.

Wire payloads (envelope members, event data, ACP ``session/update`` updates and results,
``_meta`` contents, HTTP bodies) are read through the protocol's Structs: the payload types of
``sdk.protocol.events``/``http`` and the views of ``sdk.protocol.acp``. This test walks the syntax
tree of every module of ``daemon/``, ``sdk/`` (bar the protocol) and ``webui_model/`` and fails on
a read by a wire member's name: ``x.get("name")``, ``x["name"]`` (a load, not an assignment) or
``"name" in x``, where ``name`` is the encoded name of a field of any Struct in ``sdk.protocol``
(or one of the ``_meta`` keys the ACP views name). Writing a member (building a payload) is not a
read and is allowed.

The allowlist is short and says why each entry is not a wire payload read.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import msgspec
import pytest

import daemon
import sdk.protocol
from sdk.protocol.acp import ACP_WIRE_NAMES

ROOT = Path(daemon.__file__).parent.parent
SCANNED = ("daemon", "sdk", "webui_model")

# (module path, member name): why the read is not of a wire payload.
ALLOWED: dict[tuple[str, str], str] = {
    # ASGI: the server's scope and message dicts (``type``, ``server``) are the server
    # interface, not the daemon's wire.
    ("daemon/asgi.py", "type"): "ASGI message type",
    ("daemon/streams/_subscription.py", "type"): "ASGI message type",
    ("daemon/streams/_ws.py", "type"): "ASGI message type",
    ("daemon/bridge/_direct_body.py", "type"): "ASGI scope key",
    ("daemon/bridge/_direct_body.py", "server"): "ASGI scope key",
    ("daemon/bridge/_direct_ws.py", "type"): "ASGI scope key",
    ("daemon/bridge/_direct_ws.py", "server"): "ASGI scope key",
    ("daemon/bridge/_probe.py", "type"): "ASGI scope and message type",
    ("daemon/asgi.py", "server"): "ASGI scope key",
    ("daemon/streams/_sse.py", "server"): "ASGI scope key",
    ("daemon/streams/_ws.py", "server"): "ASGI scope key",
    ("daemon/cluster/_router.py", "type"): "ASGI message type",
    ("daemon/cluster/_router.py", "status"): "ASGI response-start status",
    # Query-string parameters, parsed from the URL (not a JSON body).
    ("daemon/streams/_request.py", "maxQueued"): "query-string parameter",
    ("daemon/streams/_request.py", "lastEventId"): "query-string parameter",
    ("daemon/http_api.py", "limit"): "query-string parameter",
    # A field of the cluster's session directory entry (a Redis hash), not of the wire.
    ("daemon/core/cluster.py", "workspace"): "Redis hash field of the session directory",
    # A regular expression's named group.
    ("daemon/logs.py", "name"): "re.Match group",
    # The CLI's own summary dict (built by sdk/cli/commands.py from a typed LoadResult).
    ("sdk/cli/commands.py", "entries"): "the CLI's own summary dict",
    ("sdk/cli/commands.py", "bytes"): "the CLI's own summary dict",
    ("sdk/cli/commands.py", "text"): "the CLI's own marker summary dict",
    # The reducer names a malformed update's tag in a debug message (another helper owns the
    # reducer's payload reads; left for them).
    ("webui_model/reducer.py", "sessionUpdate"): "debug text of a malformed update",
}
# The bundled mock agent is the other end of ACP (its own process): it parses the daemon's
# requests independently of the daemon's codec, on purpose, so that it tests that codec.
ALLOWED_MODULES = {"daemon/mock_agent/agent.py": "the agent side of ACP, an independent double"}


def wire_names() -> frozenset[str]:
    """Every encoded field name of every Struct in ``sdk.protocol``, plus the ACP names."""
    names: set[str] = set(ACP_WIRE_NAMES)
    for info in pkgutil.walk_packages(sdk.protocol.__path__, "sdk.protocol."):
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            if (isinstance(value, type) and issubclass(value, msgspec.Struct)
                    and value.__module__ == module.__name__):
                names.update(field.encode_name for field in msgspec.structs.fields(value))
    return frozenset(names)


def _typing_subscript(node: ast.Subscript) -> bool:
    # Literal["x"], Annotated[...] and friends are types, not lookups.
    value = node.value
    name = value.id if isinstance(value, ast.Name) else (
        value.attr if isinstance(value, ast.Attribute) else "")
    return name in {"Literal", "Annotated", "Final", "ClassVar"}


def payload_reads(source: str, names: frozenset[str]) -> list[tuple[int, str]]:
    """``(line, name)`` of every read of a member called one of ``names`` in ``source``."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        key: object = None
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "get" and node.args
                and isinstance(node.args[0], ast.Constant)):
            key = node.args[0].value
        elif (isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load)
              and isinstance(node.slice, ast.Constant) and not _typing_subscript(node)):
            key = node.slice.value
        elif (isinstance(node, ast.Compare) and isinstance(node.left, ast.Constant)
              and any(isinstance(op, ast.In | ast.NotIn) for op in node.ops)):
            key = node.left.value
        if isinstance(key, str) and key in names and isinstance(node, ast.expr):
            found.append((node.lineno, key))
    return sorted(found)


def _modules() -> list[Path]:
    out: list[Path] = []
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT)
            if rel.parts[:2] == ("sdk", "protocol") or ".venv" in rel.parts:
                continue
            out.append(path)
    return out


def test_the_wire_names_cover_the_envelope_the_acp_update_and_meta() -> None:
    names = wire_names()
    assert {"id", "type", "data", "promptId", "originatorClientId", "_meta"} <= names
    assert {"sessionUpdate", "content", "text", "toolCallId", "parentToolCallId",
            "qwenTranscript", "sourceRecordIds", "serverTimestamp", "stopReason",
            "optionId", "sessionId", "update", "usage"} <= names


def test_no_module_outside_the_protocol_reads_a_wire_member_by_hand() -> None:
    names = wire_names()
    offenders: list[str] = []
    for path in _modules():
        rel = path.relative_to(ROOT).as_posix()
        if rel in ALLOWED_MODULES:
            continue
        for line, name in payload_reads(path.read_text(), names):
            if (rel, name) not in ALLOWED:
                offenders.append(f"{rel}:{line} reads {name!r}")
    assert offenders == [], "read these through an sdk.protocol Struct/view:\n" + "\n".join(
        offenders)


def test_every_allowlist_entry_is_still_needed() -> None:
    names = wire_names()
    used: set[tuple[str, str]] = set()
    for path in _modules():
        rel = path.relative_to(ROOT).as_posix()
        used.update((rel, name) for _, name in payload_reads(path.read_text(), names))
    assert set(ALLOWED) - used == set()
    assert all((ROOT / module).exists() for module in ALLOWED_MODULES)


@pytest.mark.parametrize("source, expected", [
    ('def f(env):\n    return env.get("promptId")\n', [(2, "promptId")]),
    ('def f(update):\n    return update["sessionUpdate"]\n', [(2, "sessionUpdate")]),
    ('def f(meta):\n    return "parentToolCallId" in meta\n', [(2, "parentToolCallId")]),
    ('def f(meta):\n    return "usage" not in meta\n', [(2, "usage")]),
    # Building a payload writes members: not a read.
    ('def f(env):\n    env["promptId"] = "p"\n', []),
    # Types and other names are not reads of the wire.
    ('from typing import Literal\nX = Literal["text"]\n', []),
    ('def f(d):\n    return d.get("someLocalKey"), d["other"]\n', []),
])
def test_the_check_sees_each_kind_of_read(source: str, expected: list[tuple[int, str]]) -> None:
    assert payload_reads(source, wire_names()) == expected
