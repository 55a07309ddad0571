"""daemon.malloc: the glibc tuning takes effect, and trim gives freed heap pages back."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.processes  # starts processes: not in make unit-fast

glibc_only = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc malloc only")

# A child process: (tune,) free one 2 MiB block, then allocate 64 more of them, each followed by a
# small live block, and free them; prints the RSS (kB) before and after that free.
_CHILD = r"""
import ctypes, sys
from daemon import malloc
if sys.argv[1] == "tune":
    print(malloc.tune())
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
first = bytearray(2 * 1024 * 1024)
del first                                      # glibc raises its mmap threshold to 2 MiB here
keep = []
blocks = []
for i in range(64):
    blocks.append(bytearray(2 * 1024 * 1024))  # 128 MiB in all
    keep.append(bytearray(1000))                # a small live block (malloc, not pymalloc) after each
before = rss()
del blocks
print(before, rss())
"""


@glibc_only
def test_tune_is_accepted_by_glibc() -> None:
    out = subprocess.run([sys.executable, "-c", "from daemon import malloc; print(malloc.tune())"],
                         check=True, capture_output=True, text=True).stdout
    assert out.strip() == "{'arena_max': True, 'mmap_threshold': True, 'trim_threshold': True}"


@glibc_only
@pytest.mark.parametrize("mode", ["tune", "default"])
def test_big_blocks_freed_leave_rss(mode: str) -> None:
    """With the fixed threshold, big blocks freed after an earlier big free still leave RSS;
    with glibc's default (dynamic) threshold they stay on the heap (the case the tuning fixes)."""
    out = subprocess.run([sys.executable, "-c", _CHILD, mode], check=True, capture_output=True,
                         text=True).stdout.split("\n")
    before, after = map(int, out[-2].split())
    freed_mb = (before - after) / 1024
    if mode == "tune":
        assert freed_mb > 100
    else:
        assert freed_mb < 20


@glibc_only
def test_trim_reports_release() -> None:
    """Freed 100 KB holes between live blocks: trim finds whole pages to release."""
    code = ("from daemon import malloc\n"
            "x = [bytes(1000) for _ in range(100000)]\n"
            "y = x[::100]\n"
            "del x\n"
            "print(malloc.trim())\n")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True).stdout
    assert out.strip() == "True"
