"""glibc malloc tuning and ``malloc_trim`` for a long-running daemon; no-ops elsewhere.

After a very large turn (hundreds of MB of chunk text) the heap is left full of free holes
between small live objects; glibc only returns memory from the top of the heap on its own, so the
daemon's RSS would stay at the turn's peak. ``malloc_trim(0)`` releases every free page.

The C library is found through the process's own symbol table (``dlopen(NULL)``): the running
interpreter is linked against it, so no library search (``ctypes.util.find_library`` runs
``ldconfig`` or a compiler in a subprocess) is needed.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Final

__all__ = ["ARENA_MAX", "MMAP_THRESHOLD", "TRIM_THRESHOLD", "trim", "tune"]

# glibc mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD: Final = -1
_M_MMAP_THRESHOLD: Final = -3
_M_ARENA_MAX: Final = -8

ARENA_MAX: Final = 1
# Blocks at least this big get pages of their own (mmap), handed back to the OS when freed.
# glibc's default starts at 128 KiB but raises itself to the largest block freed so far (up to
# 32 MiB): after one big turn's text is joined and freed, blocks of that size come from the
# heap, and a freed one leaves a hole the heap cannot give back. A fixed value keeps it at
# 512 KiB, above the agent reader's 256 KiB reads (a page-faulting mmap per read would cost the
# hot path).
MMAP_THRESHOLD: Final = 512 * 1024
# Setting the mmap threshold also freezes the heap's trim threshold (free bytes at the top of the
# heap that glibc gives back on a free) at its 128 KiB default: at full speed the top then
# shrinks and grows again all the time, twice the page faults of an untuned daemon over a turn.
# 2 MiB of top slack brings them back to the untuned level; ``trim`` still releases everything
# (figures: benchmarks/README.md, "Figures behind the code").
TRIM_THRESHOLD: Final = 2 * 1024 * 1024


def _load(name: str) -> Callable[..., int] | None:
    try:
        fn: Callable[..., int] = getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):
        return None
    return fn


_malloc_trim = _load("malloc_trim")
_mallopt = _load("mallopt")


def tune() -> dict[str, bool]:
    """One malloc arena for the process (the transcript's worker thread would otherwise get an
    arena of its own whose freed memory stays in the daemon's RSS; the daemon's threads hardly
    contend for malloc), a fixed mmap threshold and a trim threshold to go with it. Returns which
    settings glibc accepted."""
    if _mallopt is None:
        return {}
    return {"arena_max": bool(_mallopt(_M_ARENA_MAX, ARENA_MAX)),
            "mmap_threshold": bool(_mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)),
            "trim_threshold": bool(_mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))}


def trim() -> bool:
    """Release free heap pages to the OS; True if anything was released."""
    if _malloc_trim is None:
        return False
    return bool(_malloc_trim(0))
