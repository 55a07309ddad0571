"""Hand freed heap memory back to the OS (glibc ``malloc_trim``); a no-op elsewhere.

After a very large turn (hundreds of MB of chunk text) the heap is left full of free holes
between small live objects; glibc only returns memory from the top of the heap on its own, so the
daemon's RSS would stay at the turn's peak. ``malloc_trim(0)`` releases every free page.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable

__all__ = ["trim"]


def _load() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn: Callable[[int], int] = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    return fn


_malloc_trim = _load()


def trim() -> bool:
    """Release free heap pages to the OS; True if anything was released."""
    if _malloc_trim is None:
        return False
    return bool(_malloc_trim(0))
