"""A minimal SSE subscriber for integration tests: collects typed events from a real daemon
and lets a test wait for a condition (woken per frame, never by sleeping)."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import trio

from sdk.protocol.envelope import DaemonEvent
from sdk.protocol.sse import SSEParser


class Subscriber:
    def __init__(self, client: httpx.AsyncClient, path: str,
                 headers: dict[str, str] | None = None) -> None:
        self.client = client
        self.path = path
        self.headers = headers or {}
        self.events: list[DaemonEvent] = []
        self.status: int | None = None
        self.response_headers: httpx.Headers | None = None
        self.ended = False
        self.raw = bytearray()
        self._changed = trio.Event()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        parser = SSEParser()
        try:
            async with self.client.stream("GET", self.path, headers=self.headers,
                                          timeout=httpx.Timeout(30, read=None)) as resp:
                self.status = resp.status_code
                self.response_headers = resp.headers
                task_status.started()
                async for chunk in resp.aiter_raw():
                    self.raw += chunk
                    self.events.extend(parser.feed(chunk))
                    self._notify()
        finally:
            self.ended = True
            self._notify()

    async def wait_for(self, pred: Callable[[DaemonEvent], bool],
                       timeout: float = 20) -> DaemonEvent:
        with trio.fail_after(timeout):
            seen = 0
            while True:
                for ev in self.events[seen:]:
                    if pred(ev):
                        return ev
                seen = len(self.events)
                if self.ended:
                    counts: dict[str, int] = {}
                    for e in self.events:
                        counts[e.type] = counts.get(e.type, 0) + 1
                    last = self.events[-1].data if self.events else None
                    raise AssertionError(f"stream ended without the awaited event; got {counts}, "
                                         f"last frame data {last!r}")
                await self._changed.wait()

    async def wait_raw(self, needle: bytes, timeout: float = 20) -> None:
        """Wait until the raw stream contains ``needle`` (e.g. an SSE comment)."""
        with trio.fail_after(timeout):
            while needle not in self.raw:
                if self.ended:
                    raise AssertionError(f"stream ended without {needle!r}")
                await self._changed.wait()

    async def wait_ended(self, timeout: float = 20) -> None:
        with trio.fail_after(timeout):
            while not self.ended:
                await self._changed.wait()

    def of_type(self, kind: str) -> list[DaemonEvent]:
        return [e for e in self.events if e.type == kind]

    def ids(self) -> list[int]:
        return [e.id for e in self.events if e.id is not None]


def is_terminal_for(prompt_id: str) -> Callable[[DaemonEvent], bool]:
    def pred(ev: DaemonEvent) -> bool:
        return ev.type in ("turn_complete", "turn_error") and isinstance(ev.data, dict) \
            and ev.data.get("promptId") == prompt_id
    return pred


def text_of(ev: DaemonEvent) -> str:
    data = ev.data if isinstance(ev.data, dict) else {}
    update = data.get("update") or {}
    content = update.get("content") or {}
    text = content.get("text")
    return text if isinstance(text, str) else ""


def chunk_kind(ev: DaemonEvent) -> str | None:
    if ev.type != "session_update" or not isinstance(ev.data, dict):
        return None
    update = ev.data.get("update")
    return update.get("sessionUpdate") if isinstance(update, dict) else None


async def follow_until(client: httpx.AsyncClient, sid: str, pred: Callable[[DaemonEvent], bool],
                       *, max_queued: int = 2048, timeout: float = 60
                       ) -> tuple[list[DaemonEvent], int]:
    """Follow a session from id 0 until ``pred`` matches, resuming from the cursor (with the
    epoch) whenever the daemon evicts this reader, as a real client does. Returns every event
    received over all connections and the number of reconnects."""
    events: list[DaemonEvent] = []
    cursor, epoch, reconnects = 0, None, 0
    with trio.fail_after(timeout):
        while True:
            headers = {"Last-Event-ID": str(cursor)}
            if epoch is not None:
                headers["X-Qwen-Event-Epoch"] = epoch
            sub = Subscriber(client, f"/session/{sid}/events?maxQueued={max_queued}", headers)
            async with trio.open_nursery() as nursery:
                await nursery.start(sub.run)
                assert sub.response_headers is not None
                epoch = sub.response_headers["x-qwen-event-epoch"]
                try:
                    await sub.wait_for(pred, timeout=timeout)
                    found = True
                except AssertionError:
                    found = False
                nursery.cancel_scope.cancel()
            events.extend(sub.events)
            if found:
                return events, reconnects
            cursor = max([e.id for e in events if e.id is not None], default=cursor)
            reconnects += 1
