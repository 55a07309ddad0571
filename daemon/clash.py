"""Detect the ``python-daemon`` clash: both distributions install a top-level package ``daemon``.

turnkeeper keeps its chosen layout (``daemon``, ``sdk``, ``webui_model``), so a Python
environment that also has PyPI's ``python-daemon`` holds two packages in one directory: whichever
was installed last owns ``daemon/__init__.py``, and uninstalling either one removes files the
other needs. The daemon says so in one line at startup instead of failing in a confusing way
later. The fix is a separate virtual environment for turnkeeper.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable
from types import ModuleType

__all__ = ["CONFLICTING_DISTRIBUTION", "clash_message"]

CONFLICTING_DISTRIBUTION = "python-daemon"


def _installed_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def clash_message(
    package: ModuleType,
    installed_version: Callable[[str], str | None] = _installed_version,
) -> str | None:
    """One line describing the clash, or ``None`` when there is none.

    ``package`` is the ``daemon`` package as imported; it is turnkeeper's when it carries the
    ``TURNKEEPER`` marker. ``installed_version`` looks a distribution up by name.
    """
    where = getattr(package, "__file__", None) or "?"
    other = installed_version(CONFLICTING_DISTRIBUTION)
    if getattr(package, "TURNKEEPER", False) is not True:
        installed = f", and {CONFLICTING_DISTRIBUTION} {other} is installed" if other else ""
        return (f"warning: the 'daemon' package imported from {where} is not turnkeeper's"
                f"{installed}: install turnkeeper in its own virtual environment")
    if other is not None:
        return (f"warning: {CONFLICTING_DISTRIBUTION} {other} is installed in this environment and "
                "shares the top-level package name 'daemon' with turnkeeper; installing or "
                "removing either breaks the other: use a separate virtual environment")
    return None
