"""Builders shared by the tests of sdk session."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import anyio
import anyio.lowlevel
import httpx
import msgspec

from sdk._errors import (
    DaemonError,
)
from sdk.protocol.envelope import DaemonEvent, event_prompt_id
from tests.sse_client import chunk_kind, text_of

WAIT_S = 30  # a guard against hangs, never a synchronisation device


class EventLog:
    """An ``on_event`` callback that keeps every event and lets a test wait on a condition."""

    def __init__(self, hook: Callable[[DaemonEvent], object] | None = None) -> None:
        self.events: list[DaemonEvent] = []
        self.hook = hook
        self._changed = anyio.Event()

    async def __call__(self, event: DaemonEvent) -> None:
        self.events.append(event)
        if self.hook is not None:
            self.hook(event)
        self._changed.set()
        self._changed = anyio.Event()

    async def wait_for(self, pred: Callable[[DaemonEvent], bool]) -> DaemonEvent:
        seen = 0
        with anyio.fail_after(WAIT_S):
            while True:
                for event in self.events[seen:]:
                    if pred(event):
                        return event
                seen = len(self.events)
                await self._changed.wait()

    def ids(self) -> list[int]:
        return [e.id for e in self.events if e.id is not None]

    def texts(self, prompt_id: str | None = None) -> list[str]:
        return [
            text_of(e)
            for e in self.events
            if chunk_kind(e) == "agent_message_chunk"
            and (prompt_id is None or event_prompt_id(e) == prompt_id)
        ]


class Stops:
    """An ``on_stop`` callback that a test can wait on."""

    def __init__(self) -> None:
        self.errors: list[DaemonError] = []
        self.event = anyio.Event()

    def __call__(self, error: DaemonError) -> None:
        self.errors.append(error)
        self.event.set()

    async def wait(self, timeout: float = WAIT_S) -> DaemonError:
        with anyio.fail_after(timeout):
            await self.event.wait()
        return self.errors[0]


class RecordingSleep:
    """Replaces the reconnect wait: records each delay, yields once, never waits for real."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)
        await anyio.lowlevel.checkpoint()


def gate_name(name: str) -> str:
    """A gate of the mock agent no earlier test opened: a module's daemon serves every
    backend's run of a test, and a gate file, once there, stays open."""
    return f"{name}-{uuid.uuid4().hex[:12]}"


def assert_contiguous(ids: list[int], first: int) -> None:
    assert ids == list(range(first, first + len(ids))), "gap or duplicate in event ids"


def sse_body(*frames: dict[str, object]) -> bytes:
    out = [b"retry: 3000\n\n"]
    for frame in frames:
        head = f"id: {frame['id']}\n".encode() if "id" in frame else b""
        out.append(head + b"data: " + msgspec.json.encode(frame) + b"\n\n")
    return b"".join(out)


def sse(body: bytes, epoch: str = "E1") -> httpx.Response:
    return httpx.Response(
        200,
        headers={"content-type": "text/event-stream", "x-qwen-event-epoch": epoch},
        content=body,
    )


def update(ident: int) -> dict[str, object]:
    return {
        "id": ident,
        "v": 1,
        "type": "session_update",
        "data": {
            "sessionId": "s1",
            "update": {
                "sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": "x"},
            },
        },
    }

