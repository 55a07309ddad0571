"""Lines typed on a terminal (or written to a pipe), read without a thread.

A thread blocked in ``readline`` outlives a cancelled wait, and on asyncio (whose worker threads
the interpreter joins at exit) it keeps the process alive until someone presses Enter. This
reader waits until the file descriptor is readable on the event loop (Trio or asyncio: anyio's
``wait_readable``) and only then reads what is there, so cancelling it leaves nothing behind.
POSIX only, like the command line that uses it.
"""

from __future__ import annotations

import os
from typing import Final

import anyio
import anyio.lowlevel

__all__ = ["LineReader"]

_READ: Final = 4096


class LineReader:
    """``await reader.readline()``: the next line with its newline, or None at end of input."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._buffer = b""
        self._eof = False

    async def readline(self) -> str | None:
        while True:
            end = self._buffer.find(b"\n")
            if end != -1:
                line, self._buffer = self._buffer[: end + 1], self._buffer[end + 1 :]
                return line.decode("utf-8", "replace")
            if self._eof:
                rest, self._buffer = self._buffer, b""
                return rest.decode("utf-8", "replace") if rest else None
            try:
                await anyio.wait_readable(self._fd)
            except OSError:
                # A regular file cannot be polled (epoll refuses it); reading it never blocks.
                await anyio.lowlevel.checkpoint()
            data = os.read(self._fd, _READ)
            if data:
                self._buffer += data
            else:
                self._eof = True
