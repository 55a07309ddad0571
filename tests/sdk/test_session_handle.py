"""The SDK's session handle: reconnect rules, pause/resume and prompt().

In-process tests drive the reconnect loop with an httpx mock transport and a recorded (not
slept) backoff; integration tests run the real daemon and cut connections with the fault proxy
at points the test chooses (never by sleeping). Every async test runs on each anyio backend
(Trio, asyncio, and uvloop when installed).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator

import anyio
import anyio.lowlevel
import httpx
import pytest

from sdk._client import DaemonClient, EventStream, PromptAccepted
from sdk._errors import (
    AuthError,
    DaemonError,
    ServerError,
    SessionNotFoundError,
    TurnError,
)
from sdk._session import ReconnectPolicy, SessionHandle, SubscriptionState
from sdk._ws import WebSocketEventStream
from sdk.protocol.envelope import DaemonEvent, event_prompt_id
from tests.builders.sdk_session import (
    WAIT_S,
    EventLog,
    RecordingSleep,
    Stops,
    assert_contiguous,
    gate_name,
    sse,
    sse_body,
    update,
)
from tests.fault_proxy import FaultProxy
from tests.harness import RunningDaemon, running_daemon
from tests.sse_client import chunk_kind, is_terminal_for, text_of

pytestmark = [pytest.mark.anyio, pytest.mark.processes]


# --- helpers shared with the other SDK test files ------------------------------------------------


def is_user_echo(text: str) -> Callable[[DaemonEvent], bool]:
    return lambda e: chunk_kind(e) == "user_message_chunk" and text in text_of(e)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    with running_daemon(tmp_path_factory.mktemp("sdk-session")) as d:
        yield d


@pytest.fixture(scope="module")
def token_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    with running_daemon(tmp_path_factory.mktemp("sdk-auth"), ["--token", "s3cret"]) as d:
        yield d


@pytest.fixture
async def proxy(daemon: RunningDaemon) -> AsyncIterator[FaultProxy]:
    fault_proxy = FaultProxy(daemon.url)
    async with anyio.create_task_group() as nursery:
        await nursery.start(fault_proxy.run)
        yield fault_proxy
        nursery.cancel_scope.cancel()


# --- the backoff formula --------------------------------------------------------------------------


def test_reconnect_delay_doubles_from_one_second_up_to_ten() -> None:
    policy = ReconnectPolicy()
    drawn: list[tuple[float, float]] = []

    def midpoint(low: float, high: float) -> float:
        drawn.append((low, high))
        return 1.0

    assert [policy.delay(n, midpoint) for n in range(1, 8)] == [1, 2, 4, 8, 10, 10, 10]
    assert set(drawn) == {(0.8, 1.2)}
    assert policy.delay(3, lambda low, high: low) == pytest.approx(3.2)
    assert policy.delay(3, lambda low, high: high) == pytest.approx(4.8)
    assert policy.delay(10_000, lambda low, high: high) == pytest.approx(12.0)
    with pytest.raises(ValueError):
        policy.delay(0, midpoint)


# --- reconnect rules, in process ------------------------------------------------------------------


class Script:
    """A mock daemon answering the event-stream requests from a list, recording each request."""

    def __init__(self, answers: list[httpx.Response]) -> None:
        self.answers = answers
        self.requests: list[httpx.Request] = []

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if not self.answers:
            raise AssertionError(f"unexpected extra request {request.url}")
        return self.answers.pop(0)

    def cursors(self) -> list[tuple[str | None, str | None]]:
        return [
            (r.headers.get("last-event-id"), r.headers.get("x-qwen-event-epoch"))
            for r in self.requests
        ]


async def run_scripted(
    answers: list[httpx.Response],
    *,
    last_event_id: int | None = 4,
    epoch: str | None = "E1",
    uniform: Callable[[float, float], float] = lambda low, high: high,
) -> tuple[Script, SessionHandle, EventLog, DaemonError, list[float]]:
    script = Script(answers)
    sleep = RecordingSleep()

    async with DaemonClient("http://daemon.test", transport=httpx.MockTransport(script)) as client:
        handle = SessionHandle(
            client,
            "s1",
            last_event_id=last_event_id,
            epoch=epoch,
            sleep=sleep,
            uniform=uniform,
        )
        log, stops = EventLog(), Stops()
        async with anyio.create_task_group() as nursery:
            handle.subscribe(nursery, log, on_stop=stops)
            error = await stops.wait()
    return script, handle, log, error, sleep.delays


async def test_reconnect_rules_and_backoff_reset() -> None:
    evicted = {"v": 1, "type": "client_evicted", "data": {"reason": "queue_overflow"}}
    script, handle, log, error, delays = await run_scripted(
        [
            httpx.Response(503, json={"error": "busy"}),  # 5xx: retried
            httpx.Response(200, json={"not": "sse"}),  # wrong content type: retried
            sse(sse_body(update(5), update(6))),  # frames reset the backoff; the end resumes
            sse(sse_body(evicted)),  # eviction resumes from the cursor
            httpx.Response(429, json={"error": "too many", "code": "subscriber_limit_exceeded"}),
            httpx.Response(500, json={"error": "no", "retryable": False}),  # final
        ]
    )
    assert isinstance(error, ServerError) and error.status == 500
    assert handle.state is SubscriptionState.STOPPED and handle.error is error
    # Attempts 1, 2 fail (base 1 s); frames reset the counter, and the first stream's
    # ``retry: 3000`` makes the base 3 s from then on; eviction (a frame) resets it again.
    assert delays == pytest.approx([1.2, 2.4, 3.6, 3.6, 7.2])
    assert handle.server_retry_s == 3.0
    assert script.cursors() == [
        ("4", "E1"),
        ("4", "E1"),
        ("4", "E1"),
        ("6", "E1"),
        ("6", "E1"),
        ("6", "E1"),
    ]
    assert all(r.url.params.get("maxQueued") == "1024" for r in script.requests)
    assert [e.id for e in log.events] == [5, 6, None]
    assert handle.last_event_id == 6 and handle.connects == 2


@pytest.mark.parametrize(
    ("status", "kind"),
    [(401, AuthError), (403, AuthError), (404, SessionNotFoundError), (410, SessionNotFoundError)],
)
async def test_final_statuses_stop_without_retry(status: int, kind: type[DaemonError]) -> None:
    script, handle, _log, error, delays = await run_scripted(
        [httpx.Response(status, json={"error": "no"})]
    )
    assert isinstance(error, kind) and getattr(error, "status", None) == status
    assert delays == [] and len(script.requests) == 1
    assert handle.state is SubscriptionState.STOPPED


async def test_backoff_is_capped_at_ten_seconds() -> None:
    answers = [httpx.Response(502, json={"error": "bad gateway"}) for _ in range(7)]
    answers.append(httpx.Response(404, json={"error": "gone"}))
    _script, _handle, _log, error, delays = await run_scripted(
        answers, uniform=lambda low, high: low
    )
    assert isinstance(error, SessionNotFoundError)
    assert delays == pytest.approx([0.8, 1.6, 3.2, 6.4, 8.0, 8.0, 8.0])


async def test_pausing_inside_the_callback_neither_loses_nor_repeats_buffered_events() -> None:
    # Ten frames arrive in one read, so after the third the other seven are already parsed and
    # handed over without any I/O: the pause must still stop them, and the resume (from cursor 3)
    # bring them back once.
    script = Script([sse(sse_body(*(update(i) for i in range(1, 11)))),
                     sse(sse_body(*(update(i) for i in range(4, 11))))])
    async with DaemonClient("http://daemon.test", transport=httpx.MockTransport(script)) as client:
        handle = SessionHandle(client, "s1", last_event_id=0, epoch="E1",
                               sleep=RecordingSleep())
        delivered: list[int | None] = []
        paused, last = anyio.Event(), anyio.Event()

        async def on_event(event: DaemonEvent) -> None:
            delivered.append(event.id)
            if event.id == 3 and not paused.is_set():
                handle.pause()
                paused.set()
            if event.id == 10:
                handle.stop()  # before the stream's end would reconnect
                last.set()

        async with anyio.create_task_group() as nursery:
            handle.subscribe(nursery, on_event)
            with anyio.fail_after(WAIT_S):
                await paused.wait()
            await anyio.wait_all_tasks_blocked()  # the cancelled reader has wound down
            assert delivered == [1, 2, 3] and handle.last_event_id == 3
            handle.resume()
            with anyio.fail_after(WAIT_S):
                await last.wait()
    assert delivered == list(range(1, 11))
    assert script.cursors() == [("0", "E1"), ("3", "E1")]


async def test_epoch_reset_restarts_the_cursor() -> None:
    resync = {
        "v": 1,
        "type": "state_resync_required",
        "data": {"reason": "epoch_reset", "lastDeliveredId": 50, "earliestAvailableId": 1},
    }
    script, handle, _log, _error, _delays = await run_scripted(
        [
            sse(sse_body(resync, update(1), update(2)), epoch="E2"),
            httpx.Response(404, json={"error": "gone"}),
        ],
        last_event_id=50,
        epoch="E1",
    )
    # Ids of the new bus are not comparable with the old cursor: it restarts from them.
    assert handle.epoch == "E2"
    assert script.cursors() == [("50", "E1"), ("2", "E2")]


# --- against the real daemon ----------------------------------------------------------------------


async def test_sse_resume_after_a_severed_connection_has_no_gap_and_no_duplicate(
    proxy: FaultProxy,
) -> None:
    sleep = RecordingSleep()
    cut: list[int] = []

    def sever_at_chunk_700(event: DaemonEvent) -> None:
        if text_of(event) == "chunk-700" and not cut:
            cut.append(proxy.sever_streams())

    async with DaemonClient(proxy.url) as client, anyio.create_task_group() as nursery:
        # The only reconnect must be the one this test causes, however slow this machine is:
        # the whole turn (echo, 1,900 chunks, terminal) is fewer events than the widest queue,
        # so the reader can never fall far enough behind a full-speed agent to be evicted.
        handle = await SessionHandle.create(client, max_queued=2048, sleep=sleep)
        log = EventLog(sever_at_chunk_700)
        handle.subscribe(nursery, log)
        accepted = await handle.client.send_prompt(handle.session_id, "many mock:chunks=1900")
        terminal = await log.wait_for(is_terminal_for(accepted.prompt_id))
        await handle.close()

    assert cut == [1], "the stream was not cut mid-turn"
    assert handle.connects == 2 and len(sleep.delays) == 1
    assert_contiguous(log.ids(), 1)
    assert log.texts(accepted.prompt_id) == [f"chunk-{i}" for i in range(1900)]
    assert not [e for e in log.events if e.type == "state_resync_required"]
    assert handle.last_event_id == terminal.id


async def test_leaving_the_task_group_closes_every_stream_it_opened(
    daemon: RunningDaemon,
) -> None:
    """Structured on every loop: cancelling the caller's task group (no close() called) ends
    the SSE and WebSocket readers, a prompt's temporary stream and raw streams, and the daemon
    sees every one of their connections closed."""
    async with DaemonClient(daemon.url) as watcher:
        created = await watcher.create_session(scope="thread")
        sid = created.session_id

        async def subscribers() -> int:
            return int((await watcher.session_status(sid)).subscribers)

        async with DaemonClient(daemon.url) as client:
            async with anyio.create_task_group() as group:
                for transport in ("sse", "ws"):
                    handle = SessionHandle(client.with_client_id(None), sid, last_event_id=0,
                                           transport=transport)
                    handle.subscribe(group, EventLog())

                async def read_raw(stream: EventStream | WebSocketEventStream) -> None:
                    async with stream:
                        async for _event in stream:
                            pass

                group.start_soon(read_raw, client.events(sid, 0))
                group.start_soon(read_raw, WebSocketEventStream(client, sid, 0))
                group.start_soon(SessionHandle(client.with_client_id(None), sid).prompt,
                                 "held mock:chunks=1 mock:gate=" + gate_name("structured"))
                with anyio.fail_after(WAIT_S):
                    while await subscribers() < 5:  # 4 streams and the prompt's own
                        await anyio.sleep(0.02)  # polling the daemon's count, bounded
                group.cancel_scope.cancel()
            # Left: every task ended; the pool is still open, yet nothing holds a stream.
            with anyio.fail_after(WAIT_S):
                while await subscribers() > 0:
                    await anyio.sleep(0.02)
        await watcher.cancel(sid)


async def test_pause_keeps_cursor_epoch_and_registration(daemon: RunningDaemon) -> None:
    async with DaemonClient(daemon.url) as client, anyio.create_task_group() as nursery:
        handle = await SessionHandle.create(client)
        log = EventLog()
        handle.subscribe(nursery, log)
        await handle.prompt("before mock:chunks=2")
        cursor, epoch = handle.last_event_id, handle.epoch
        delivered = len(log.events)

        handle.pause()
        assert handle.state is SubscriptionState.PAUSED
        # Another client runs a whole turn while this handle is paused.
        other = SessionHandle(client.with_client_id(None), handle.session_id)
        missed = await other.prompt("while paused mock:chunks=4")
        assert len(log.events) == delivered and handle.last_event_id == cursor

        handle.resume()
        await log.wait_for(is_terminal_for(missed.prompt_id))
        assert handle.epoch == epoch
        assert log.texts(missed.prompt_id) == [f"chunk-{i}" for i in range(4)]
        assert_contiguous(log.ids(), 1)
        # The registration survived the pause: the daemon still accepts this client's prompt.
        after = await handle.prompt("after mock:chunks=1")
        assert log.texts(after.prompt_id) == ["chunk-0"]
        await handle.close()


async def test_wrong_token_stops_the_subscription_with_auth_error(
    token_daemon: RunningDaemon,
) -> None:
    sleep = RecordingSleep()
    async with (
        DaemonClient(token_daemon.url, token="s3cret") as good,
        DaemonClient(token_daemon.url, token="wrong") as bad,
    ):
        created = await SessionHandle.create(good)
        handle = SessionHandle(bad, created.session_id, last_event_id=0, sleep=sleep)
        stops = Stops()
        async with anyio.create_task_group() as nursery:
            handle.subscribe(nursery, EventLog(), on_stop=stops)
            error = await stops.wait()
        assert isinstance(error, AuthError) and error.status == 401
        assert handle.state is SubscriptionState.STOPPED and sleep.delays == []
        # Without on_stop the same error is raised, here from follow().
        with pytest.raises(AuthError):
            await SessionHandle(bad, created.session_id, last_event_id=0).follow(EventLog())
        with pytest.raises(AuthError):
            await SessionHandle(bad, created.session_id).prompt("never sent")


async def test_deleted_session_stops_with_missing_session_and_fails_the_waiting_prompt(
    daemon: RunningDaemon,
) -> None:
    sleep = RecordingSleep()
    async with DaemonClient(daemon.url) as client, anyio.create_task_group() as nursery:
        handle = await SessionHandle.create(client, sleep=sleep)
        log, stops = EventLog(), Stops()
        handle.subscribe(nursery, log, on_stop=stops)
        failures: list[TurnError] = []

        async def gated_prompt() -> None:
            with pytest.raises(TurnError) as info:
                await handle.prompt("held mock:chunks=1 mock:gate=never-opened")
            failures.append(info.value)

        nursery.start_soon(gated_prompt)
        await log.wait_for(lambda e: text_of(e) == "chunk-0")
        await client.close_session(handle.session_id)
        error = await stops.wait()

    assert isinstance(error, SessionNotFoundError) and error.status == 404
    assert [e.type for e in log.events if e.type == "session_closed"] == ["session_closed"]
    assert handle.state is SubscriptionState.STOPPED
    assert len(sleep.delays) == 1  # the stream ended, one reconnect found the session gone
    assert [f.code for f in failures] == ["session_closed"]


async def test_prompt_returns_its_own_terminal_with_another_prompt_interleaved(
    daemon: RunningDaemon,
) -> None:
    async with DaemonClient(daemon.url) as client, anyio.create_task_group() as nursery:
        first_handle = await SessionHandle.create(client)
        second_handle, _ = await SessionHandle.load(client, first_handle.session_id)
        assert first_handle.client_id != second_handle.client_id
        first_log, second_log = EventLog(), EventLog()
        first_handle.subscribe(nursery, first_log)
        second_handle.subscribe(nursery, second_log)
        results: dict[str, str] = {}
        second_updates: list[DaemonEvent] = []

        interleave = gate_name("interleave")

        async def run_first() -> None:
            done = await first_handle.prompt(f"first mock:chunks=5 mock:gate={interleave}")
            results["first"] = done.prompt_id

        async def record(event: DaemonEvent) -> None:
            second_updates.append(event)

        async def run_second() -> None:
            done = await second_handle.prompt("second mock:chunks=3", on_update=record)
            results["second"] = done.prompt_id

        nursery.start_soon(run_first)
        echo = await second_log.wait_for(is_user_echo("first"))
        first_id = event_prompt_id(echo)
        nursery.start_soon(run_second)
        queued = await second_log.wait_for(lambda e: e.type == "pending_prompt_added")
        daemon.open_gate(interleave)
        await second_log.wait_for(lambda e: e.type == "pending_prompt_completed")
        await first_handle.close()
        await second_handle.close()

    assert results["first"] == first_id
    second_id = results["second"]
    assert second_id != first_id and queued.data["promptId"] == second_id
    order = [e for e in second_log.events if e.type in ("turn_complete", "pending_prompt_added")]
    # The other prompt's terminal arrived while this one waited, and did not end it.
    assert [(e.type, e.data["promptId"]) for e in order] == [
        ("pending_prompt_added", second_id),
        ("turn_complete", first_id),
        ("turn_complete", second_id),
    ]
    assert {event_prompt_id(e) for e in second_updates} == {second_id}
    assert [text_of(e) for e in second_updates if chunk_kind(e) == "agent_message_chunk"] == [
        "chunk-0",
        "chunk-1",
        "chunk-2",
    ]


async def test_prompt_without_subscription_uses_a_temporary_stream(daemon: RunningDaemon) -> None:
    async with DaemonClient(daemon.url) as client:
        handle = await SessionHandle.create(client)
        seen: list[DaemonEvent] = []

        async def record(event: DaemonEvent) -> None:
            seen.append(event)

        done = await handle.prompt("alone mock:chunks=3", on_update=record)
        assert done.stop_reason == "end_turn"
        assert [e.type for e in seen][-1] == "turn_complete"
        assert [text_of(e) for e in seen if chunk_kind(e) == "agent_message_chunk"] == [
            "chunk-0",
            "chunk-1",
            "chunk-2",
        ]
        assert handle.state is SubscriptionState.IDLE and handle.prompts_in_flight == 0


@pytest.mark.parametrize("subscribed", [True, False])
async def test_prompt_raises_turn_error_on_reject(daemon: RunningDaemon, subscribed: bool) -> None:
    async with DaemonClient(daemon.url) as client, anyio.create_task_group() as nursery:
        handle = await SessionHandle.create(client)
        if subscribed:
            handle.subscribe(nursery, EventLog())
        with pytest.raises(TurnError) as info:
            await handle.prompt("no mock:mode=reject")
        assert info.value.code == "-32603" and "injected error" in info.value.message
        assert info.value.prompt_id
        await handle.close()


async def test_prompt_reports_its_id_before_the_terminal(daemon: RunningDaemon) -> None:
    async with DaemonClient(daemon.url) as client, anyio.create_task_group() as nursery:
        handle = await SessionHandle.create(client)
        told: list[str] = []
        accepted = anyio.Event()
        results: list[str] = []
        early = gate_name("early-id")

        def on_accepted(answer: PromptAccepted) -> None:
            told.append(answer.prompt_id)
            accepted.set()

        async def run() -> None:
            done = await handle.prompt(
                f"early id mock:chunks=1 mock:gate={early}", on_accepted=on_accepted
            )
            results.append(done.prompt_id)

        nursery.start_soon(run)
        with anyio.fail_after(WAIT_S):
            await accepted.wait()
        # The turn is held open by the gate: the id is known while it runs.
        assert results == [] and len(told) == 1
        status = await client.session_status(handle.session_id)
        assert status.active_prompt_id == told[0]
        daemon.open_gate(early)
    assert results == told
