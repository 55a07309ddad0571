"""httpcore (httpx's transport) without Trio in a program that does not run Trio.

httpcore's ``_synchronization`` module runs ``import trio`` when it is imported, whenever Trio is
installed, and picks trio's or anyio's primitives later, per call, from the running loop (an
upstream wish is to stop importing both eagerly: encode/httpcore#946). So an asyncio program
that merely has Trio installed would load all of Trio through the SDK. :func:`load_httpcore`
imports httpcore with that one ``import trio`` refused (in this thread only, through a
``sys.meta_path`` finder that answers for nobody else) and hands the module a stand-in that
imports Trio on first use: under Trio, httpcore gets the real module on its first attribute
access; under asyncio, Trio is never loaded. Nothing changes when Trio is already imported (a
Trio program), when httpcore already is, or when Trio is not installed at all.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

__all__ = ["load_httpcore"]

_refusing = threading.local()
_lock = threading.Lock()


class _RefuseTrio:
    """A meta path finder that refuses ``trio`` to the thread importing httpcore."""

    @staticmethod
    def find_spec(
        name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if name == "trio" and getattr(_refusing, "on", False):
            raise ImportError("trio is imported on first use (sdk._httpcore)")
        return None


class _TrioOnFirstUse:
    """Stands in for ``trio`` in httpcore until httpcore touches it (it does only under Trio)."""

    def __init__(self, module: ModuleType) -> None:
        self._module = module

    def __getattr__(self, name: str) -> Any:
        trio = importlib.import_module("trio")
        setattr(self._module, "trio", trio)  # noqa: B010 - from now on httpcore uses Trio
        return getattr(trio, name)


def load_httpcore() -> ModuleType:
    """``import httpcore``, without importing Trio unless the program already did."""
    loaded = sys.modules.get("httpcore")
    if loaded is not None:
        return loaded
    with _lock:
        if "httpcore" in sys.modules or "trio" in sys.modules:
            return importlib.import_module("httpcore")
        if importlib.util.find_spec("trio") is None:
            return importlib.import_module("httpcore")
        finder = _RefuseTrio()
        sys.meta_path.insert(0, finder)
        _refusing.on = True
        try:
            httpcore = importlib.import_module("httpcore")
        finally:
            _refusing.on = False
            sys.meta_path.remove(finder)
        synchronization = sys.modules.get("httpcore._synchronization")
        if synchronization is not None and getattr(synchronization, "trio", "") is None:
            setattr(synchronization, "trio", _TrioOnFirstUse(synchronization))  # noqa: B010
        return httpcore
