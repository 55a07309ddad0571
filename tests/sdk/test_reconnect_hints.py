"""Server hints on reconnect (the stream's ``retry:`` field, ``Retry-After`` on 429/503), the
opt-in session restore on 404, the one ``maxQueued`` default, and the client's request counters.

In process: an httpx mock transport answers from a script and each backoff wait is recorded
instead of slept, so every delay is asserted exactly and nothing waits for real. Every async
test runs on each anyio backend.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import anyio
import httpx
import pytest

from sdk import DEFAULT_MAX_QUEUED as EXPORTED_MAX_QUEUED
from sdk._client import DEFAULT_MAX_QUEUED, DaemonClient, route_name
from sdk._errors import DaemonError, SessionNotFoundError, error_for_status
from sdk._session import ReconnectPolicy, SessionHandle, SubscriptionState
from sdk.protocol.sse import SSEParser
from tests.builders import wire_bodies
from tests.builders.sdk_session import EventLog, RecordingSleep, Stops, sse, sse_body, update
from tests.harness import RunningDaemon, running_daemon

HIGH: Callable[[float, float], float] = lambda low, high: high  # noqa: E731

pytestmark = [pytest.mark.anyio, pytest.mark.processes]


# --- the parser and the policy (pure) ---------------------------------------------------------


def test_the_parser_keeps_the_last_valid_retry_field() -> None:
    parser = SSEParser()
    assert parser.retry_ms is None
    parser.feed(b"retry: 3000\n\n")
    assert parser.retry_ms == 3000
    # Not only digits: ignored (WHATWG), the previous value stays.
    parser.feed(b"retry: 12x\nretry: -5\nretry:\nretry: 1.5\n\n")
    assert parser.retry_ms == 3000
    parser.feed(b"retry:250\n")  # no space after the colon is fine, and no frame is needed
    assert parser.retry_ms == 250
    events = parser.feed(b'data: {"v":1,"type":"replay_complete","data":{}}\n\n')
    assert [e.type for e in events] == ["replay_complete"]


def test_the_policy_uses_the_servers_retry_as_its_base_within_bounds() -> None:
    policy = ReconnectPolicy()
    mid: Callable[[float, float], float] = lambda low, high: 1.0  # noqa: E731
    assert [policy.delay(n, mid, server_retry_s=3.0) for n in (1, 2, 3)] == [3.0, 6.0, 10.0]
    # retry: 0 would spin; an hour would park the client: both are clamped.
    assert policy.delay(1, mid, server_retry_s=0.0) == pytest.approx(0.1)
    assert policy.delay(1, mid, server_retry_s=3600.0) == 10.0
    assert ReconnectPolicy(honor_server=False).delay(1, mid, server_retry_s=3.0) == 1.0
    # Retry-After is a floor (jittered upwards only), capped at max_retry_after_s.
    assert policy.delay(1, lambda low, high: low, retry_after_s=5.0) == 5.0
    assert policy.delay(1, HIGH, retry_after_s=5.0) == pytest.approx(6.0)
    assert policy.delay(1, lambda low, high: low, retry_after_s=3600.0) == 60.0
    assert policy.delay(4, mid, retry_after_s=0.5) == 8.0  # the backoff is already longer
    assert ReconnectPolicy(honor_server=False).delay(1, mid, retry_after_s=5.0) == 1.0


def test_retry_after_is_kept_on_429_and_503_errors() -> None:
    busy = error_for_status(503, b'{"error":"busy"}', {"retry-after": "7"})
    limited = error_for_status(429, b"{}", {"retry-after": "2"})
    other = error_for_status(500, b"{}", {"retry-after": "9"})
    assert (busy.retry_after, limited.retry_after, other.retry_after) == (7.0, 2.0, None)


# --- the reconnect loop, in process -------------------------------------------------------------


class Script:
    """Answers every request from a list; records (method, path, headers, query) of each."""

    def __init__(self, answers: list[httpx.Response]) -> None:
        self.answers = answers
        self.requests: list[httpx.Request] = []

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if not self.answers:
            raise AssertionError(f"unexpected extra request {request.method} {request.url}")
        return self.answers.pop(0)

    def routes(self) -> list[str]:
        return [route_name(r.method, r.url.path) for r in self.requests]


async def follow_script(
    answers: list[httpx.Response], *, restore: bool = False
) -> tuple[Script, SessionHandle, EventLog, DaemonError, list[float]]:
    script = Script(answers)
    sleep = RecordingSleep()

    async with DaemonClient("http://daemon.test", transport=httpx.MockTransport(script)) as client:
        handle = SessionHandle(
            client, "s1", last_event_id=4, epoch="E1", restore=restore, sleep=sleep,
            uniform=HIGH,
        )
        log, stops = EventLog(), Stops()
        async with anyio.create_task_group() as nursery:
            handle.subscribe(nursery, log, on_stop=stops)
            error = await stops.wait()
    return script, handle, log, error, sleep.delays


def gone() -> httpx.Response:
    return httpx.Response(404, json={"error": "No session", "code": "session_not_found"})


def resumed() -> httpx.Response:
    return httpx.Response(200, json=wire_bodies.resume("s1", epoch="E2", clientId="client_r"))


async def test_retry_after_on_503_and_429_sets_the_reconnect_wait() -> None:
    _script, _handle, _log, error, delays = await follow_script(
        [
            httpx.Response(503, json={"error": "busy"}, headers={"Retry-After": "7"}),
            httpx.Response(429, json={"error": "too many"}, headers={"Retry-After": "5"}),
            httpx.Response(502, json={"error": "bad gateway"}),
            gone(),
        ]
    )
    assert isinstance(error, SessionNotFoundError)
    # 7 s and 5 s (× the top jitter 1.2) instead of the 1.2 s and 2.4 s backoff; then 4.8 s.
    assert delays == pytest.approx([8.4, 6.0, 4.8])


async def test_the_streams_retry_field_becomes_the_base_delay() -> None:
    body = b"retry: 500\n\n" + sse_body(update(5))[len(b"retry: 3000\n\n"):]
    _script, handle, log, error, delays = await follow_script(
        [httpx.Response(502, json={}), sse(body), httpx.Response(502, json={}), gone()]
    )
    assert isinstance(error, SessionNotFoundError) and [e.id for e in log.events] == [5]
    # Before any stream: the policy's 1 s; after ``retry: 500``: 0.5 s, then 1 s.
    assert delays == pytest.approx([1.2, 0.6, 1.2])
    assert handle.server_retry_s == 0.5


async def test_restore_on_404_resumes_once_per_failure_and_a_second_404_is_final() -> None:
    script, handle, log, error, delays = await follow_script(
        [
            gone(),  # the daemon restarted: the session is not in memory
            resumed(),  # restored
            sse(sse_body(update(1)), epoch="E2"),  # a frame: the restore budget is renewed
            gone(),
            resumed(),
            gone(),  # restored, yet still missing: final, no third resume
        ],
        restore=True,
    )
    assert isinstance(error, SessionNotFoundError)
    assert script.routes() == ["events", "resume", "events", "events", "resume", "events"]
    assert handle.restores == 2 and handle.state is SubscriptionState.STOPPED
    assert delays == pytest.approx([3.6])  # a restore reopens at once; the stream end waits
    assert [e.id for e in log.events] == [1] and handle.client_id == "client_r"


async def test_restore_stops_when_the_restore_itself_answers_404() -> None:
    script, handle, _log, error, delays = await follow_script([gone(), gone()], restore=True)
    assert isinstance(error, SessionNotFoundError) and delays == []
    assert script.routes() == ["events", "resume"] and handle.restores == 0


async def test_without_restore_a_404_is_final() -> None:
    script, handle, _log, error, _delays = await follow_script([gone()])
    assert isinstance(error, SessionNotFoundError)
    assert script.routes() == ["events"] and handle.restores == 0


# --- maxQueued and statistics ---------------------------------------------------------------------


async def test_raw_streams_and_handles_send_the_same_max_queued_default() -> None:
    script = Script([sse(b""), sse(b"")])
    async with DaemonClient("http://daemon.test", transport=httpx.MockTransport(script)) as client:
        async with client.events("s1") as stream:
            assert [e async for e in stream] == []
        handle = SessionHandle(client, "s1")
        assert handle.max_queued == DEFAULT_MAX_QUEUED == EXPORTED_MAX_QUEUED == 1024
        stream2 = handle._open()
        async with stream2:
            pass
    sent = [r.url.params.get("maxQueued") for r in script.requests]
    assert sent == [str(DEFAULT_MAX_QUEUED)] * 2


def test_route_names() -> None:
    assert [
        route_name("POST", "/session"),
        route_name("POST", "/session/a%2Fb/load"),
        route_name("GET", "/session/x/events"),
        route_name("GET", "/session/x/ws"),
        route_name("DELETE", "/session/x"),
        route_name("POST", "/session/x/permission/r1"),
        route_name("GET", "/daemon/status"),
        route_name("GET", "/health"),
    ] == ["create", "load", "events", "ws", "close", "permission", "daemon_status", "health"]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    with running_daemon(tmp_path_factory.mktemp("sdk-hints")) as d:
        yield d


async def test_statistics_count_requests_by_route_without_a_custom_transport(
    daemon: RunningDaemon,
) -> None:
    async with DaemonClient(daemon.url) as client:
        assert client.statistics().requests == 0
        handle, _ = await SessionHandle.load(client, (await client.create_session()).session_id)
        await handle.prompt("counted mock:chunks=1")  # a temporary stream from the 202
        with pytest.raises(SessionNotFoundError):
            await client.load_session("no-such-session")
        stats = client.statistics()
        # The handle's own view shares the pool and the counters.
        assert stats == handle.client.statistics()
        assert (stats.count("create"), stats.loads, stats.prompts) == (1, 2, 1)
        assert stats.streams == 1 and stats.failures == 1
        assert stats.requests == sum(stats.by_route.values()) == 5
        with pytest.raises(TypeError):
            stats.by_route["load"] = 0  # type: ignore[index]
