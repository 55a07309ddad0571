"""The one cursor rule on every client path, against the real daemon: a reconnect naming the
wrong epoch gets ``state_resync_required {reason: epoch_reset}`` and then the new bus's whole
ring, so the cursor must restart at 0 and follow the replayed ids — on the SSE stream, on the
WebSocket stream and in the session handle alike (each used to keep the old, higher cursor
except the handle)."""

from __future__ import annotations

from collections.abc import Iterator

import anyio
import pytest

from sdk._client import DaemonClient, EventStream
from sdk._session import SessionHandle
from sdk._ws import WebSocketEventStream
from sdk.protocol.envelope import DaemonEvent
from tests.harness import RunningDaemon, running_daemon

WAIT_S = 30

pytestmark = [pytest.mark.anyio, pytest.mark.processes]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    with running_daemon(tmp_path_factory.mktemp("epoch-reset")) as d:
        yield d


async def _session_with_events(client: DaemonClient) -> tuple[str, int]:
    handle = await SessionHandle.create(client)
    async with handle:
        await handle.prompt("mock:chunks=5")
        status = await handle.client.session_status(handle.session_id)
    assert status.last_event_id is not None and status.last_event_id > 3
    return handle.session_id, status.last_event_id


@pytest.mark.parametrize("transport", ["sse", "ws"])
async def test_a_stream_cursor_restarts_at_zero_on_epoch_reset(
    daemon: RunningDaemon, transport: str
) -> None:
    async with DaemonClient(daemon.url) as client:
        sid, newest = await _session_with_events(client)
        stream: EventStream | WebSocketEventStream = (
            EventStream(client, sid, newest, "not-this-epoch")
            if transport == "sse"
            else WebSocketEventStream(client, sid, newest, "not-this-epoch")
        )
        seen: list[tuple[str, int | None, int | None]] = []
        with anyio.fail_after(WAIT_S):
            async with stream:
                async for event in stream:
                    seen.append((event.type, event.id, stream.last_event_id))
                    if event.id == 2:
                        break
    assert seen[0][0] == "state_resync_required"
    assert seen[0][2] == 0, "the epoch_reset frame must reset the cursor"
    assert seen[1][1:] == (1, 1) and seen[2][1:] == (2, 2)
    assert stream.epoch is not None and stream.epoch != "not-this-epoch"


async def test_the_session_handle_resets_before_handing_the_frame_over(
    daemon: RunningDaemon,
) -> None:
    async with DaemonClient(daemon.url) as client:
        sid, newest = await _session_with_events(client)
        handle = SessionHandle(client.with_client_id(None), sid, last_event_id=newest,
                               epoch="not-this-epoch")
        cursors: list[tuple[str, int | None]] = []
        got_two = anyio.Event()

        async def on_event(event: DaemonEvent) -> None:
            cursors.append((event.type, handle.last_event_id))
            if event.id == 2:
                got_two.set()

        with anyio.fail_after(WAIT_S):
            async with anyio.create_task_group() as nursery:
                handle.subscribe(nursery, on_event)
                await got_two.wait()
                handle.stop()
    assert cursors[0] == ("state_resync_required", 0)
    assert cursors[1:3] == [("session_update", 1), ("session_update", 2)]
