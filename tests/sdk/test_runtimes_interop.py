"""Three programs, one session: a Trio client (``trio.run``), an asyncio client
(``asyncio.run``) and a blocking client (``SyncDaemonClient``), each in its own thread with its
own event loop, follow one daemon session through a live turn that overflows the live journal.
They must see the same events with the same ids, and the same live ``history_truncated`` marker
in a mid-turn load. The turn is held open by the mock's gate until all three have loaded."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import anyio
import pytest
import trio

from sdk import DaemonClient, DaemonEvent, SyncDaemonClient
from sdk._client import EventStream
from sdk._ws import WebSocketEventStream
from tests.harness import RunningDaemon, running_daemon
from tests.sse_client import text_of

pytestmark = pytest.mark.processes  # starts processes: not in make unit-fast

WAIT_S = 30.0
CHUNKS = 20


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    base = tmp_path_factory.mktemp("sdk-interop")
    with running_daemon(base, ["--max-journal-events", "3", "--max-journal-bytes", "300"]) as d:
        yield d


@dataclass
class Seen:
    loop: str
    events: list[DaemonEvent]
    marker: DaemonEvent

    def ids_and_types(self) -> list[tuple[int | None, str]]:
        return [(e.id, e.type) for e in self.events]


@dataclass
class Cue:
    """What the test waits on: each client's stream is open; each has loaded mid-turn."""

    ready: threading.Event
    loaded: threading.Event


def is_last_chunk(event: DaemonEvent) -> bool:
    return text_of(event) == f"chunk-{CHUNKS - 1}"


async def follow_async(loop: str, url: str, sid: str, transport: str, cue: Cue) -> Seen:
    """The same code under trio.run and asyncio.run."""
    with anyio.fail_after(WAIT_S):
        async with DaemonClient(url) as client:
            stream: EventStream | WebSocketEventStream = (
                WebSocketEventStream(client, sid, 0) if transport == "ws"
                else EventStream(client, sid, 0))
            events: list[DaemonEvent] = []
            marker: DaemonEvent | None = None
            async with stream:
                cue.ready.set()
                async for event in stream:
                    events.append(event)
                    if is_last_chunk(event):
                        marker = (await client.load_session(sid)).live_journal[0]
                        cue.loaded.set()
                    if event.type == "turn_complete":
                        break
    assert marker is not None
    return Seen(loop, events, marker)


def follow_sync(url: str, sid: str, transport: str, cue: Cue) -> Seen:
    with SyncDaemonClient(url) as client:
        events: list[DaemonEvent] = []
        marker: DaemonEvent | None = None
        with client.events(sid, 0, transport=transport) as stream:  # type: ignore[arg-type]
            cue.ready.set()
            for event in stream:
                events.append(event)
                if is_last_chunk(event):
                    marker = client.load_session(sid).live_journal[0]
                    cue.loaded.set()
                if event.type == "turn_complete":
                    break
    assert marker is not None
    return Seen("sync", events, marker)


def in_thread(run: Callable[[], Seen], results: list[Seen], errors: list[BaseException]
              ) -> threading.Thread:
    def target() -> None:
        try:
            results.append(run())
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("transport", ["sse", "ws"])
def test_trio_asyncio_and_sync_clients_see_the_same_events_ids_and_marker(
    daemon: RunningDaemon, transport: str
) -> None:
    gate = f"interop-{uuid.uuid4().hex[:12]}"
    with SyncDaemonClient(daemon.url) as control:
        sid = control.create_session(scope="thread").session_id
        cues = {name: Cue(threading.Event(), threading.Event())
                for name in ("trio", "asyncio", "sync")}
        results: list[Seen] = []
        errors: list[BaseException] = []
        runs: dict[str, Callable[[], Any]] = {
            "trio": lambda: trio.run(follow_async, "trio", daemon.url, sid, transport,
                                     cues["trio"]),
            "asyncio": lambda: asyncio.run(follow_async("asyncio", daemon.url, sid, transport,
                                                        cues["asyncio"])),
            "sync": lambda: follow_sync(daemon.url, sid, transport, cues["sync"]),
        }
        threads = [in_thread(run, results, errors) for run in runs.values()]
        try:
            for name, cue in cues.items():
                assert cue.ready.wait(WAIT_S), f"{name}: stream not open in time {errors}"
            accepted = control.send_prompt(
                sid, f"interop mock:chunks={CHUNKS} mock:gate={gate}")
            for name, cue in cues.items():
                assert cue.loaded.wait(WAIT_S), f"{name}: no mid-turn load in time {errors}"
        finally:
            daemon.open_gate(gate)
            for thread in threads:
                thread.join(WAIT_S)
    assert errors == []
    assert sorted(seen.loop for seen in results) == ["asyncio", "sync", "trio"]
    first = results[0]
    ids = [i for i, _ in first.ids_and_types() if i is not None]
    assert ids == list(range(1, len(ids) + 1)), "gap or duplicate"
    assert first.events[-1].data["promptId"] == accepted.prompt_id
    chunks = [text_of(e) for e in first.events if text_of(e).startswith("chunk-")]
    assert chunks == [f"chunk-{i}" for i in range(CHUNKS)]
    marker = first.marker
    assert marker.type == "history_truncated" and marker.prompt_id == accepted.prompt_id
    assert marker.data["scope"] == "live_journal" and marker.data["fullTranscriptAvailable"]
    for seen in results[1:]:
        assert seen.ids_and_types() == first.ids_and_types(), seen.loop
        assert [e.data for e in seen.events] == [e.data for e in first.events], seen.loop
        assert (seen.marker.id, seen.marker.prompt_id, seen.marker.data) == (
            marker.id, marker.prompt_id, marker.data), seen.loop
