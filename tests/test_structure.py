"""Structure facts of the tree, read from its source: the wire is written only by the protocol
package (no error body, header name or envelope spelled out elsewhere), layers point down (no
module of ``sdk/`` imports ``daemon/`` or ``webui_model/``), no import cycle anywhere, and one
class name means one class.

Each check walks the product's modules (``daemon/``, ``sdk/``, ``webui_model/``,
``benchmarks/``) with ``ast``; ``sdk/protocol/`` is the one place the wire's words may be
written. Each test also runs its checker on a small source that breaks the rule, so a checker
that cannot fail would fail here.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("daemon", "sdk", "webui_model", "benchmarks")
PROTOCOL = ROOT / "sdk" / "protocol"


def product_modules() -> Iterator[Path]:
    for package in PACKAGES:
        yield from sorted((ROOT / package).rglob("*.py"))


def outside_protocol() -> Iterator[Path]:
    return (path for path in product_modules() if PROTOCOL not in path.parents)


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), str(path))


def _where(path: Path, node: ast.AST) -> str:
    return f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"


# --- error bodies ------------------------------------------------------------------------------


def error_dicts(tree: ast.Module) -> Iterator[ast.AST]:
    """Dict displays and ``dict(...)`` calls with both an ``error`` and a ``code`` key, and
    byte or text literals holding both ``"error":`` and ``"code":`` (a pre-encoded body)."""
    for node in ast.walk(tree):
        keys: set[object] = set()
        if isinstance(node, ast.Dict):
            keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id == "dict"):
            keys = {kw.arg for kw in node.keywords}
        elif isinstance(node, ast.Constant) and isinstance(node.value, str | bytes):
            text = node.value if isinstance(node.value, str) else node.value.decode("latin-1")
            if '"error":' in text and '"code":' in text:
                yield node
            continue
        if {"error", "code"} <= keys:
            yield node


def test_no_error_body_is_written_outside_the_protocol() -> None:
    """Every error answer is the protocol's ``ErrorBody``: no ``{"error": …, "code": …}`` dict
    (or pre-encoded bytes of one) anywhere else."""
    found = [_where(path, node) for path in outside_protocol()
             for node in error_dicts(_tree(path))]
    assert found == []
    probe = ast.parse('a = {"error": "x", "code": "y"}\nb = dict(error=1, code=2)\n'
                      "c = b'{\"error\":\"x\",\"code\":\"y\"}'\n"
                      'd = {"jsonrpc": "2.0", "error": {"code": 1, "message": "m"}}\n')
    assert [node.lineno for node in error_dicts(probe)] == [1, 2, 3]


# --- header names ------------------------------------------------------------------------------


def _docstrings(tree: ast.Module) -> set[int]:
    """ids of the docstring nodes (they describe the wire in prose; they do not write it)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def header_literals(tree: ast.Module) -> Iterator[ast.Constant]:
    """Text or byte literals (docstrings aside) naming one of the protocol's own headers."""
    docs = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str | bytes) \
                and id(node) not in docs:
            text = node.value if isinstance(node.value, str) else node.value.decode("latin-1")
            if "x-qwen-" in text.lower() or "x-turnkeeper-" in text.lower():
                yield node


def test_no_header_name_of_the_protocol_is_written_outside_it() -> None:
    """``X-Qwen-…`` and ``X-Turnkeeper-…`` header names are ``sdk.protocol.headers``'s: the
    daemon, the SDK, the model and the benchmarks use its constants."""
    found = [_where(path, node) for path in outside_protocol()
             for node in header_literals(_tree(path))]
    assert found == []
    probe = ast.parse('"""X-Qwen-Client-Id in a docstring is prose."""\n'
                      'a = "X-Qwen-Client-Id"\nb = b"x-turnkeeper-node"\n'
                      'def f() -> None:\n    """X-Qwen-Event-Epoch"""\n    g(f"X-Qwen-{c}")\n')
    assert [node.lineno for node in header_literals(probe)] == [2, 3, 6]
