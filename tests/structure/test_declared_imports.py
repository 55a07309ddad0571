"""Every third-party module the product imports is one its packaging declares.

A module that is only there because another dependency happens to pull it in (Quart brings
werkzeug, Hypercorn brings h11 and h2) breaks the day that dependency stops bringing it, and
an upgrade cannot see it coming. So the product (``daemon``, ``sdk``, ``webui_model``) imports
only what ``pyproject.toml`` declares, with one seam: ``daemon/bridge/``, which patches
Hypercorn's internals, may also import what the installed Hypercorn itself requires (its HTTP/2
and HTTP/1.1 stacks), since it pins Hypercorn and checks the shapes it relies on.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import requires
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("daemon", "sdk", "webui_model")
# Distribution name -> the import name where the two differ.
IMPORT_NAME = {"quart-trio": "quart_trio"}
# Imports that need no declaration, and why.
ALLOWED = {"outcome": "trio's result type, named for type checking only (trio requires it)"}


def _requirement_name(spec: str) -> str:
    name = re.split(r"[\s<>=!~;\[(]", spec.strip(), maxsplit=1)[0].lower()
    return IMPORT_NAME.get(name, name.replace("-", "_"))


def _declared() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = list(project["dependencies"])
    for extra in ("sdk", "cluster"):
        specs += project["optional-dependencies"][extra]
    return {_requirement_name(spec) for spec in specs}


def _third_party_imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n not in PRODUCT}


def test_the_product_imports_only_declared_packages() -> None:
    declared = _declared() | set(ALLOWED)
    hypercorns_own = {_requirement_name(spec) for spec in requires("hypercorn") or ()
                      if "extra ==" not in spec}
    assert {"h11", "h2"} <= hypercorns_own
    undeclared: list[str] = []
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            seam = path.is_relative_to(ROOT / "daemon" / "bridge")
            allowed = declared | hypercorns_own if seam else declared
            undeclared += [f"{path.relative_to(ROOT)}: {name}"
                           for name in sorted(_third_party_imports(path) - allowed)]
    assert undeclared == []


def test_the_check_sees_an_undeclared_import(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("from werkzeug.exceptions import HTTPException\nimport trio\n")
    assert _third_party_imports(probe) - _declared() == {"werkzeug"}
