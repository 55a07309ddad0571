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
import functools
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("daemon", "sdk", "webui_model", "benchmarks")
PROTOCOL = ROOT / "sdk" / "protocol"


def product_modules() -> Iterator[Path]:
    for package in PACKAGES:
        yield from sorted((ROOT / package).rglob("*.py"))


def outside_protocol() -> Iterator[Path]:
    return (path for path in product_modules() if PROTOCOL not in path.parents)


@functools.cache
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


# --- layers and cycles -------------------------------------------------------------------------


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_only(tree: ast.Module) -> set[int]:
    """ids of the nodes under ``if TYPE_CHECKING:`` (never imported at run time)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for statement in node.body:
                out.update(id(sub) for sub in ast.walk(statement))
    return out


def imports_of(name: str, tree: ast.Module, is_package: bool, known: set[str]) -> set[str]:
    """The product modules ``name`` imports at run time, lazy imports inside functions
    included (a circle through one is still a circle)."""
    skip = _type_checking_only(tree)
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[:len(base) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            for alias in node.names:
                full = f"{module}.{alias.name}"
                found.add(full if full in known else module)
    return {module for module in found if module in known and module != name}


def import_graph(sources: dict[str, tuple[ast.Module, bool]]) -> dict[str, set[str]]:
    known = set(sources)
    return {name: imports_of(name, tree, is_package, known)
            for name, (tree, is_package) in sources.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


@functools.cache
def _product_graph() -> dict[str, set[str]]:
    return import_graph({module_name(path): (_tree(path), path.name == "__init__.py")
                         for path in product_modules()})


def test_layers_point_down() -> None:
    """The protocol imports nothing above it; the SDK neither the daemon nor the WebUI model;
    the model not the daemon; the daemon not the SDK's client side nor the model."""
    above = {
        "sdk.protocol": ("sdk.", "daemon", "webui_model", "benchmarks"),
        "sdk": ("daemon", "webui_model", "benchmarks"),
        "webui_model": ("daemon", "benchmarks"),
        "daemon": ("webui_model", "benchmarks"),
    }
    found = []
    for name, targets in _product_graph().items():
        layer = next((layer for layer in above if name == layer or
                      name.startswith(layer + ".")), None)
        if layer is None:
            continue
        for target in targets:
            if layer == "sdk.protocol" and target.startswith("sdk.protocol"):
                continue
            if target.startswith(above[layer]) and not (layer == "daemon"
                                                        and target.startswith("sdk.protocol")):
                found.append(f"{name} -> {target}")
    assert found == []


def test_no_import_cycle() -> None:
    assert cycles(_product_graph()) == []
    probe = {
        "a": (ast.parse("import b\n"), False),
        "b": (ast.parse("def f() -> None:\n    from a import x\n"), False),
        "c": (ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import a\n"),
              False),
    }
    assert cycles(import_graph(probe)) == [["a", "b"]]


# --- one name, one class -----------------------------------------------------------------------


def public_classes(paths: Iterator[Path]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in paths:
        for node in _tree(path).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                found.setdefault(node.name, []).append(module_name(path))
    return found


def test_one_public_class_name_means_one_class() -> None:
    twice = {name: where for name, where in public_classes(product_modules()).items()
             if len(where) > 1}
    assert twice == {}


# --- the tests' shared helpers ---------------------------------------------------------------


def imports_of_test_modules(tree: ast.Module) -> Iterator[tuple[ast.AST, str]]:
    """Each import of a test module (``test_*``) in ``tree``, with the module it names."""
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        for name in names:
            if name.rsplit(".", 1)[-1].startswith("test_"):
                yield node, name
                break


def test_no_test_module_imports_another() -> None:
    """A helper two test modules share lives in ``tests/builders/`` (or the harness), not in
    one of them: a test module is imported by pytest only."""
    found = [f"{_where(path, node)} imports {name}"
             for path in sorted((ROOT / "tests").rglob("*.py"))
             for node, name in imports_of_test_modules(_tree(path))]
    assert found == []
    probe = ast.parse("from tests.sdk.test_cli import cli\nimport tests.builders.cli\n")
    assert [name for _, name in imports_of_test_modules(probe)] == ["tests.sdk.test_cli"]
