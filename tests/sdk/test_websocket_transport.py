"""The WebSocket transport against the real daemon: resume after a severed connection
with no gap and no duplicate, close code 1000 at session end, and HTTP errors on the upgrade."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import anyio
import pytest

from sdk._client import DaemonClient
from sdk._errors import AuthError, SessionNotFoundError
from sdk._session import SessionHandle, SubscriptionState
from sdk._ws import WebSocketEventStream, ws_url
from sdk.protocol.envelope import DaemonEvent
from tests.builders.sdk_session import EventLog, RecordingSleep, Stops, assert_contiguous
from tests.fault_proxy import FaultProxy
from tests.harness import RunningDaemon, running_daemon
from tests.sse_client import is_terminal_for, text_of

WAIT_S = 30

pytestmark = [pytest.mark.anyio, pytest.mark.processes]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    with running_daemon(tmp_path_factory.mktemp("sdk-ws"), ["--token", "ws-token"]) as d:
        yield d


@pytest.fixture
async def proxy(daemon: RunningDaemon) -> AsyncIterator[FaultProxy]:
    fault_proxy = FaultProxy(daemon.url)
    async with anyio.create_task_group() as nursery:
        await nursery.start(fault_proxy.run)
        yield fault_proxy
        nursery.cancel_scope.cancel()


def test_ws_url_carries_the_cursor_in_the_query() -> None:
    assert (
        ws_url("http://127.0.0.1:4170", "s/1", 7, "ep-1", 1024)
        == "ws://127.0.0.1:4170/session/s%2F1/ws?lastEventId=7&epoch=ep-1&maxQueued=1024"
    )
    # An epoch without a cursor means nothing to the daemon, so it is not sent.
    assert ws_url("https://h:1/base/", "s", None, "ep", None) == "wss://h:1/base/session/s/ws"
    assert ws_url("http://h:1", "s", 0, None, None) == "ws://h:1/session/s/ws?lastEventId=0"


async def test_ws_resume_after_a_severed_connection_has_no_gap_and_no_duplicate(
    proxy: FaultProxy,
) -> None:
    sleep = RecordingSleep()
    cut: list[int] = []

    def sever_at_chunk_700(event: DaemonEvent) -> None:
        if text_of(event) == "chunk-700" and not cut:
            cut.append(proxy.sever_streams())

    async with DaemonClient(proxy.url, token="ws-token") as client, anyio.create_task_group() as nursery:
        # The WebSocket writes one message per event, so a 2000-event burst can overflow the
        # default queue and evict (which also resumes); the widest queue keeps the only
        # reconnect the one this test causes.
        handle = await SessionHandle.create(client, transport="ws", max_queued=2048, sleep=sleep)
        log = EventLog(sever_at_chunk_700)
        handle.subscribe(nursery, log)
        accepted = await handle.client.send_prompt(handle.session_id, "ws mock:chunks=2000")
        terminal = await log.wait_for(is_terminal_for(accepted.prompt_id))
        await handle.close()

    assert cut == [1], "the WebSocket was not cut mid-turn"
    assert proxy.count("GET", r"/ws$") == 2 and handle.connects == 2
    assert len(sleep.delays) == 1
    assert_contiguous(log.ids(), 1)
    assert log.texts(accepted.prompt_id) == [f"chunk-{i}" for i in range(2000)]
    assert handle.last_event_id == terminal.id


async def test_ws_closes_with_1000_when_the_session_ends(daemon: RunningDaemon) -> None:
    async with DaemonClient(daemon.url, token="ws-token") as client:
        handle = await SessionHandle.create(client)
        await handle.prompt("one mock:chunks=2")
        events: list[DaemonEvent] = []
        async with WebSocketEventStream(
            client, handle.session_id, 0, handle.epoch, max_queued=64
        ) as stream:
            assert stream.epoch == handle.epoch
            with anyio.fail_after(WAIT_S):
                async for event in stream:
                    events.append(event)
                    if event.type == "replay_complete":
                        await client.close_session(handle.session_id)
        assert stream.ended and stream.close_code == 1000
        assert events[-1].type == "session_closed"
        assert stream.last_event_id == events[-1].id


async def test_ws_upgrade_errors_map_to_the_sdk_errors(daemon: RunningDaemon) -> None:
    async with (
        DaemonClient(daemon.url, token="ws-token") as good,
        DaemonClient(daemon.url, token="nope") as bad,
    ):
        created = await good.create_session(scope="thread")
        with pytest.raises(AuthError) as auth:
            async with WebSocketEventStream(bad, created.session_id, 0):
                pass
        assert auth.value.status == 401
        with pytest.raises(SessionNotFoundError) as missing:
            async with WebSocketEventStream(good, "no-such-session", 0):
                pass
        assert missing.value.status == 404 and missing.value.code == "session_not_found"


async def test_ws_handle_stops_with_missing_session_after_close(daemon: RunningDaemon) -> None:
    sleep = RecordingSleep()
    async with DaemonClient(daemon.url, token="ws-token") as client, anyio.create_task_group() as nursery:
        handle = await SessionHandle.create(client, transport="ws", sleep=sleep)
        log, stops = EventLog(), Stops()
        handle.subscribe(nursery, log, on_stop=stops)
        await log.wait_for(lambda e: e.type == "replay_complete")
        await client.close_session(handle.session_id)
        error = await stops.wait()
    assert isinstance(error, SessionNotFoundError)
    assert log.events[-1].type == "session_closed"
    assert handle.state is SubscriptionState.STOPPED and len(sleep.delays) == 1
