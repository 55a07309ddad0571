"""A gate on a real store's commits, through its fault-injection seam
(:class:`daemon.transcript_store.StoreHooks`): the test holds every commit from a point on and
opens the gate again; the gate counts the batches it held and keeps every op committed.

    gate = CommitGate()
    store = TranscriptDatabase(path, hooks=gate.hooks)
    entered = gate.close()   # from Trio
    ...                      # await entered.wait(): a batch is held in the writer's thread
    gate.open()              # always, in a finally: a held thread would hang the teardown
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import trio

from daemon.transcript_store import Op, StoreHooks

__all__ = ["CommitGate"]


class CommitGate:
    """Holds every commit while closed, in the thread that commits (the writer's worker)."""

    def __init__(self) -> None:
        self._open = threading.Event()
        self._open.set()
        self.held = 0  # batches that had to wait at the gate
        self.entered = trio.Event()  # set (from the committing thread) when a batch is held
        self._token: trio.lowlevel.TrioToken | None = None
        self._lock = threading.Lock()
        self._committed: list[Op] = []
        self.hooks = StoreHooks(before_commit=self._before_commit,
                                after_commit=self._after_commit)

    def close(self) -> trio.Event:
        """From Trio: hold every commit from now on; the event returned is set when one is
        held (the committing thread needs the loop's token to say so)."""
        self._token = trio.lowlevel.current_trio_token()
        self.entered = trio.Event()
        self._open.clear()
        return self.entered

    def open(self) -> None:
        """Let the held commit (and every later one) go on. From any thread."""
        self._open.set()

    def committed(self) -> list[Op]:
        """Every op committed so far, in commit order."""
        with self._lock:
            return list(self._committed)

    def _before_commit(self, ops: Sequence[Op]) -> None:
        if not self._open.is_set():
            self.held += 1
            trio.from_thread.run_sync(self.entered.set, trio_token=self._token)
            self._open.wait()

    def _after_commit(self, ops: Sequence[Op]) -> None:
        with self._lock:
            self._committed.extend(ops)
