"""DaemonClient against httpx.MockTransport: request shapes, headers, results, error mapping.

Only request building, response decoding and error mapping are tested here; reading a live
SSE body is tested against the real daemon.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import msgspec
import pytest

from sdk._client import DaemonClient, PromptAccepted, SessionCreated
from sdk._errors import (
    AuthError,
    DaemonError,
    DaemonHTTPError,
    PromptQueueFullError,
    ServerError,
    SessionNotFoundError,
    SSEBufferOverflow,
    TransportError,
    TurnError,
    error_for_status,
    is_retriable,
)
from sdk.protocol import http as wire
from sdk.protocol.http import DaemonStatusResponse, LoadSessionResponse, SessionStatusResponse
from sdk.protocol.http import TranscriptPage as ProtocolTranscriptPage

BASE = "http://127.0.0.1:4170"
SID = "97ea491e-c339-49c7-a124-7737fb961931"
CLIENT = "client_e9d029a4-d686-465d-a72d-61b99f2769ba"

pytestmark = pytest.mark.anyio


class Recorder:
    """A MockTransport handler that records requests and answers from a route table."""

    def __init__(self, routes: dict[tuple[str, str], Callable[[httpx.Request], httpx.Response]]):
        self.routes = routes
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        handler = self.routes.get((request.method, request.url.path))
        if handler is None:
            return httpx.Response(404, json={"error": "nope", "code": "route_not_found"})
        return handler(request)

    def client(self, **kwargs: Any) -> DaemonClient:
        return DaemonClient(BASE, transport=httpx.MockTransport(self), **kwargs)

    @property
    def last(self) -> httpx.Request:
        return self.requests[-1]


def reply(
    status: int = 200, body: Any = None, **kwargs: Any
) -> Callable[[httpx.Request], httpx.Response]:
    def handler(request: httpx.Request) -> httpx.Response:
        if body is None:
            return httpx.Response(status, **kwargs)
        return httpx.Response(status, json=body, **kwargs)

    return handler


def sent_json(request: httpx.Request) -> Any:
    return json.loads(request.content)


CREATED = {
    "sessionId": SID,
    "workspaceCwd": "/srv/workspace",
    "attached": False,
    "clientId": CLIENT,
    "createdAt": "2026-12-02T09:43:34.405Z",
}

LOAD_BODY = {
    "sessionId": SID,
    "workspaceCwd": "/srv/workspace",
    "attached": True,
    "clientId": CLIENT,
    "createdAt": "2026-12-02T09:44:36.880Z",
    "state": {},
    "hasRunningBackgroundTasks": False,
    "hasActivePrompt": True,
    "compactedReplay": [
        {"v": 1, "type": "history_truncated", "data": {"reason": "replay_window_exceeded"}},
        {"id": 0, "v": 1, "type": "bad_id_is_dropped"},
    ],
    "liveJournal": [
        {
            "v": 1,
            "type": "history_truncated",
            "promptId": "p-1",
            "data": {
                "reason": "replay_window_exceeded",
                "scope": "live_journal",
                "truncatedEvents": 24,
                "retainedEvents": 2,
                "maxBytes": 4096,
                "maxEvents": 4,
                "fullTranscriptAvailable": True,
            },
        },
        {
            "id": 26,
            "v": 1,
            "type": "session_update",
            "promptId": "p-1",
            "data": {"sessionId": SID, "update": {"sessionUpdate": "agent_message_chunk"}},
        },
    ],
    "lastEventId": 26,
    "eventEpoch": "abc9b8a6-6862-4dee-a8c2-b057e7c43b93",
    "historyAnchorRecordId": "ea0be140",
    "promptTerminals": [
        {"v": 1, "promptId": "p-0", "terminal": "completed", "stopReason": "end_turn", "at": 17}
    ],
    "futureField": {"ignored": True},
}


# --- headers and identity ---------------------------------------------------------------------------


async def test_token_and_adopted_client_id_headers() -> None:
    rec = Recorder(
        {
            ("POST", "/session"): reply(200, CREATED),
            ("GET", "/health"): reply(200, {"status": "ok"}),
        }
    )
    async with rec.client(token="s3cret") as client:
        assert client.client_id is None
        await client.health()
        assert rec.last.headers["authorization"] == "Bearer s3cret"
        assert "x-qwen-client-id" not in rec.last.headers
        created = await client.create_session(cwd="/w", scope="thread")
        assert sent_json(rec.last) == {"cwd": "/w", "sessionScope": "thread"}
        assert created == SessionCreated(
            session_id=SID,
            workspace_cwd="/srv/workspace",
            attached=False,
            client_id=CLIENT,
            created_at="2026-12-02T09:43:34.405Z",
        )
        assert client.client_id == CLIENT
        await client.health()
        assert rec.last.headers["x-qwen-client-id"] == CLIENT


async def test_token_falls_back_to_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QWEN_SERVER_TOKEN", "from-env")
    rec = Recorder({("GET", "/health"): reply(200, {"status": "ok"})})
    async with rec.client() as client:
        await client.health()
    assert rec.last.headers["authorization"] == "Bearer from-env"


async def test_no_token_no_authorization_header(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("QWEN_SERVER_TOKEN", raising=False)
    rec = Recorder({("GET", "/health"): reply(200, {"status": "ok"})})
    async with rec.client(client_id="mine") as client:
        await client.health()
    assert "authorization" not in rec.last.headers
    assert rec.last.headers["x-qwen-client-id"] == "mine"


def test_constructor_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="http"):
        DaemonClient("127.0.0.1:4170")
    with pytest.raises(ValueError, match="client_id"):
        DaemonClient(BASE, client_id="has space")


# --- routes -----------------------------------------------------------------------------------------


async def test_load_session_decodes_events_and_fields() -> None:
    rec = Recorder({("POST", f"/session/{SID}/load"): reply(200, LOAD_BODY)})
    async with rec.client(client_id="old") as client:
        result = await client.load_session(SID)
        assert sent_json(rec.last) == {}
        assert isinstance(result, LoadSessionResponse)
        assert client.client_id == CLIENT
    assert result.has_active_prompt and result.last_event_id == 26
    assert result.event_epoch == "abc9b8a6-6862-4dee-a8c2-b057e7c43b93"
    assert result.history_anchor_record_id == "ea0be140"
    assert not result.replay_degraded and not result.history_has_more
    assert [e.type for e in result.compacted_replay] == ["history_truncated"]
    assert [(e.id, e.type, e.prompt_id) for e in result.live_journal] == [
        (None, "history_truncated", "p-1"),
        (26, "session_update", "p-1"),
    ]
    assert [e.type for e in result.events] == ["history_truncated"] * 2 + ["session_update"]
    assert result.prompt_terminals[0].prompt_id == "p-0"
    assert result.prompt_terminals[0].stop_reason == "end_turn"


async def test_load_session_sends_configured_replay_options() -> None:
    rec = Recorder(
        {("POST", f"/session/{SID}/load"): reply(200, {**LOAD_BODY, "replayDegraded": True})}
    )
    async with rec.client() as client:
        result = await client.load_session(
            SID, cwd="/w", history_page_size=50, live_replay_mode="summary"
        )
    assert sent_json(rec.last) == {"cwd": "/w", "historyPageSize": 50, "liveReplayMode": "summary"}
    assert result.replay_degraded


async def test_resume_adopts_client_id() -> None:
    body = {k: v for k, v in LOAD_BODY.items() if k not in ("compactedReplay", "liveJournal")}
    rec = Recorder({("POST", f"/session/{SID}/resume"): reply(200, body)})
    async with rec.client() as client:
        result = await client.resume_session(SID)
        assert result.last_event_id == 26 and client.client_id == CLIENT


async def test_send_prompt_string_and_blocks() -> None:
    accepted = {"promptId": "p-9", "lastEventId": 1, "eventEpoch": "e-1"}
    rec = Recorder({("POST", f"/session/{SID}/prompt"): reply(202, accepted)})
    async with rec.client() as client:
        got = await client.send_prompt(SID, "say hi")
        assert sent_json(rec.last) == {"prompt": [{"type": "text", "text": "say hi"}]}
        blocks = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
        await client.send_prompt(SID, blocks, deadline_ms=5000)
        assert sent_json(rec.last) == {"prompt": blocks, "deadlineMs": 5000}
    assert got == PromptAccepted(prompt_id="p-9", last_event_id=1, event_epoch="e-1")


async def test_simple_command_routes() -> None:
    rec = Recorder(
        {
            ("POST", f"/session/{SID}/cancel"): reply(204),
            ("POST", f"/session/{SID}/detach"): reply(204),
            ("POST", f"/session/{SID}/heartbeat"): reply(200, {"ok": True}),
            ("DELETE", f"/session/{SID}"): reply(204),
        }
    )
    async with rec.client() as client:
        await client.cancel(SID)
        await client.detach(SID)
        await client.heartbeat(SID)
        await client.close_session(SID)
    assert [(r.method, r.url.path) for r in rec.requests] == [
        ("POST", f"/session/{SID}/cancel"),
        ("POST", f"/session/{SID}/detach"),
        ("POST", f"/session/{SID}/heartbeat"),
        ("DELETE", f"/session/{SID}"),
    ]


async def test_vote_permission_bodies() -> None:
    rec = Recorder(
        {
            ("POST", f"/session/{SID}/permission/req-1"): reply(
                200, {"requestId": "req-1", "outcome": {"outcome": "selected"}}
            )
        }
    )
    async with rec.client() as client:
        vote = await client.vote_permission(SID, "req-1", option_id="allow_once")
        assert sent_json(rec.last) == {"optionId": "allow_once"}
        assert vote.request_id == "req-1"
        await client.vote_permission(SID, "req-1", cancelled=True)
        assert sent_json(rec.last) == {"outcome": "cancelled"}
        with pytest.raises(ValueError, match="exactly one"):
            await client.vote_permission(SID, "req-1")
        with pytest.raises(ValueError, match="exactly one"):
            await client.vote_permission(SID, "req-1", option_id="x", cancelled=True)


async def test_transcript_page_normalizes_both_shapes_and_sends_params() -> None:
    update = {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "hi"}}
    page = {
        "v": 1,
        "sessionId": SID,
        "events": [
            {"v": 1, "type": "session_update", "data": dict(update)},
            {"v": 1, "type": "session_update", "data": {"sessionId": SID, "update": dict(update)}},
            {"v": 7, "type": "dropped"},
        ],
        "nextCursor": "c-2",
        "hasMore": True,
    }
    rec = Recorder({("GET", f"/session/{SID}/transcript"): reply(200, page)})
    async with rec.client() as client:
        got = await client.transcript_page(SID, limit=50, before_record_id="rec-1")
        assert dict(rec.last.url.params) == {"limit": "50", "beforeRecordId": "rec-1"}
        with pytest.raises(ValueError, match="not both"):
            await client.transcript_page(SID, cursor="c", before_record_id="r")
    assert isinstance(got, ProtocolTranscriptPage)
    assert [e.data for e in got.events] == [{"sessionId": SID, "update": update}] * 2
    assert got.next_cursor == "c-2" and got.has_more


async def test_status_and_capabilities() -> None:
    status = {
        "sessionId": SID,
        "hasActivePrompt": False,
        "pendingPrompts": 0,
        "lastEventId": 7,
        "durableEventId": 7,
        "eventEpoch": "e",
        "transcriptDegraded": False,
        "subscribers": 2,
        "workspaceCwd": "/w",
        "activePromptId": None,
        "fullTranscriptAvailable": True,
        "replayDegraded": False,
        "slowClientWarnings": 0,
        "clientsEvicted": 0,
        "journal": {"entries": 0, "bytes": 0, "truncatedEvents": 0, "retainedEvents": 0},
        "serverTime": 1796204622728,
    }
    limits = {
        "maxJournalEvents": 10000, "maxJournalBytes": 1, "compactedReplayMaxBytes": 1,
        "eventRingSize": 1, "eventRingBytes": 1, "agentIdleMs": 1, "sessionRestoreTimeoutMs": 1,
        "maxPendingPrompts": 1, "maxSubscribersPerSession": 1, "maxRequestBodyBytes": 1,
        "maxSessions": 0, "maxConnections": 0,
    }
    caps = {
        "v": 1,
        "mode": "serve",
        "features": ["session_transcript_pagination"],
        "limits": limits,
    }
    rec = Recorder(
        {
            ("GET", f"/session/{SID}/status"): reply(200, status),
            ("GET", "/capabilities"): reply(200, caps),
            ("GET", "/daemon/status"): reply(200, daemon_status_body(limits)),
        }
    )
    async with rec.client() as client:
        st = await client.session_status(SID)
        cap = await client.capabilities()
        ds = await client.daemon_status()
    assert isinstance(st, SessionStatusResponse)
    assert st.durable_event_id == 7 and st.subscribers == 2
    assert cap.supports("session_transcript_pagination") and not cap.supports("nope")
    assert msgspec.to_builtins(cap.limits) == limits
    assert isinstance(ds, DaemonStatusResponse)
    assert msgspec.to_builtins(ds.limits) == limits and ds.sessions == []
    assert ds.agents[0].pid == 41 and ds.totals.unloaded_sessions == 3


def daemon_status_body(limits: dict[str, int]) -> dict[str, Any]:
    """A whole ``GET /daemon/status`` body, built from the protocol's types as the daemon does."""
    return msgspec.to_builtins(wire.DaemonStatusResponse(
        v=1, limits=msgspec.convert(limits, wire.Limits), persistence=False,
        transcript=wire.TranscriptHealth(enabled=False, degraded=False, failed_sessions=[],
                                         last_error=None, damaged_sessions=[], damage=[],
                                         check=wire.TranscriptCheck(quick="off", full="off")),
        agents=[wire.AgentInfo(workspace_cwd="/w", pid=41)], agents_reaped=0, restore_locks=0,
        known_clients=0,
        server=wire.ServerPatches(ws_keepalive=True, connection_registry=True, ws_limits=True,
                                  http2_flow_control=True, hypercorn_version="0.17.3"),
        live_sessions=0, approval_mode="default",
        default_workspace=wire.WorkspaceInfo(workspace_cwd="/w", git_branch=None),
        connections=wire.ConnectionCounts(open=1, reserve=0, refused=0), sessions=[],
        sessions_truncated=False,
        totals=wire.SessionTotals(sessions=0, unloaded_sessions=3, subscribers=0)))


async def test_list_sessions_reads_the_daemon_status_session_list() -> None:
    row = {"sessionId": SID, "workspaceCwd": "/w", "hasActivePrompt": False,
           "pendingPrompts": 2, "lastEventId": 9, "createdAt": "2025-01-01T00:00:00.000Z",
           "lastActivityAt": "2025-01-01T00:01:00.000Z", "gitBranch": "main",
           "journalEntries": 0}
    rec = Recorder({("GET", "/daemon/status"): reply(200, {"sessions": [row]})})
    async with rec.client() as client:
        (summary,) = await client.list_sessions()
    assert (summary.session_id, summary.workspace_cwd, summary.state) == (SID, "/w", "queued")
    assert summary.last_activity_at == "2025-01-01T00:01:00.000Z" and summary.git_branch == "main"
    bad = Recorder({("GET", "/daemon/status"): reply(200, {"sessions": [{"sessionId": 3}]})})
    async with bad.client() as client:
        with pytest.raises(TransportError, match="malformed sessions"):
            await client.list_sessions()


# --- error mapping --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "body", "headers", "exc_type", "retriable"),
    [
        (401, {"error": "Unauthorized"}, {}, AuthError, False),
        (403, {"error": "Invalid Host header", "code": "invalid_host"}, {}, AuthError, False),
        (
            404,
            {"error": f'No session with id "{SID}"', "code": "session_not_found", "sessionId": SID},
            {},
            SessionNotFoundError,
            False,
        ),
        (410, {"error": "gone"}, {}, SessionNotFoundError, False),
        (
            503,
            {"error": "full", "code": "prompt_queue_full", "limit": 5, "pendingCount": 5},
            {"Retry-After": "5"},
            PromptQueueFullError,
            True,
        ),
        (503, {"error": "busy", "code": "other"}, {}, ServerError, True),
        (500, {"error": "internal"}, {}, ServerError, True),
        (
            502,
            {"error": "agent", "code": "agent_start_failed", "retryable": False},
            {},
            ServerError,
            False,
        ),
        (400, {"error": "bad", "code": "invalid_prompt"}, {}, DaemonHTTPError, False),
        (
            429,
            {"error": "too many", "code": "subscriber_limit_exceeded", "limit": 64},
            {"Retry-After": "5"},
            DaemonHTTPError,
            True,
        ),
        (408, {"error": "slow"}, {}, DaemonHTTPError, True),
        (
            413,
            {"error": "Request body too large (max 10 MB)", "code": "body_too_large"},
            {},
            DaemonHTTPError,
            False,
        ),
    ],
)
async def test_error_mapping(
    status: int,
    body: dict[str, Any],
    headers: dict[str, str],
    exc_type: type[Exception],
    retriable: bool,
) -> None:
    # A prompt's sends have rules of their own (tests/sdk/test_prompt_once.py): load maps the
    # answers as every other route does.
    rec = Recorder({("POST", f"/session/{SID}/load"): reply(status, body, headers=headers)})
    async with rec.client() as client:
        with pytest.raises(exc_type) as info:
            await client.load_session(SID)
    exc = info.value
    assert type(exc) is exc_type
    assert isinstance(exc, DaemonHTTPError)
    assert exc.status == status and exc.body == body
    assert exc.code == body.get("code")
    assert exc.message == body["error"]
    assert is_retriable(exc) is retriable


async def test_prompt_queue_full_details() -> None:
    err = error_for_status(
        503,
        b'{"error":"Too many pending prompts","code":"prompt_queue_full","limit":5,"pendingCount":5}',
        httpx.Headers({"Retry-After": "5"}),
    )
    assert isinstance(err, PromptQueueFullError)
    assert (err.retry_after, err.limit, err.pending_count) == (5.0, 5, 5)


def test_server_error_is_both_http_and_transport() -> None:
    err = error_for_status(500, b"oops", None)
    assert isinstance(err, ServerError) and isinstance(err, TransportError)
    assert err.status == 500 and err.body == "oops"


def test_non_json_error_body_kept_as_text() -> None:
    err = error_for_status(400, b"<html>bad</html>", None)
    assert type(err) is DaemonHTTPError and err.body == "<html>bad</html>" and err.code is None


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (TransportError("connection refused"), True),
        (TransportError("x", body={"retryable": False}), False),
        (DaemonHTTPError(400, {"retryable": True}), True),
        (AuthError(401, {"retryable": True}), False),
        (SessionNotFoundError(404, {"retryable": True}), False),
        (PromptQueueFullError(503, {"code": "prompt_queue_full", "retryable": False}), False),
        (TurnError("channel_closed", "agent died", "p"), False),
        (SSEBufferOverflow("too big"), False),
        (DaemonError("generic"), False),
        (ConnectionResetError(), True),
        (TimeoutError(), True),
        (ValueError("bug"), False),
    ],
)
def test_is_retriable(exc: BaseException, expected: bool) -> None:
    assert is_retriable(exc) is expected


def test_turn_error_fields() -> None:
    err = TurnError("prompt_deadline_exceeded", "deadline", "p-3")
    assert (err.code, err.message, err.prompt_id) == ("prompt_deadline_exceeded", "deadline", "p-3")
    assert "p-3" in str(err) and "prompt_deadline_exceeded" in str(err)


async def test_network_failure_maps_to_transport_error() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    async with DaemonClient(BASE, transport=httpx.MockTransport(refuse)) as client:
        with pytest.raises(TransportError, match="connection refused") as info:
            await client.health()
    assert is_retriable(info.value)


async def test_timeout_maps_to_transport_error() -> None:
    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("read timed out", request=request)

    async with DaemonClient(BASE, transport=httpx.MockTransport(slow)) as client:
        with pytest.raises(TransportError, match="timed out"):
            await client.load_session(SID)


async def test_non_json_success_body_is_a_transport_error() -> None:
    rec = Recorder(
        {
            ("GET", "/health"): lambda r: httpx.Response(
                200, text="<html>proxy</html>", headers={"content-type": "text/html"}
            )
        }
    )
    async with rec.client() as client:
        with pytest.raises(TransportError, match="not JSON"):
            await client.health()


async def test_malformed_success_body_is_a_transport_error() -> None:
    rec = Recorder({("POST", f"/session/{SID}/resume"): reply(200, {"attached": 1})})
    async with rec.client() as client:
        with pytest.raises(TransportError, match="malformed"):
            await client.resume_session(SID)


# --- event stream: request headers and pre-iteration errors ---------------------------------------------


def test_epoch_header_only_with_cursor() -> None:
    client = DaemonClient(BASE, token="t", client_id="c1")
    with_cursor = client.events(SID, last_event_id=5, epoch="ep-1").request_headers()
    assert with_cursor["Last-Event-ID"] == "5"
    assert with_cursor["X-Qwen-Event-Epoch"] == "ep-1"
    assert with_cursor["Accept"] == "text/event-stream"
    assert with_cursor["Authorization"] == "Bearer t"
    assert with_cursor["X-Qwen-Client-Id"] == "c1"
    no_cursor = client.events(SID, epoch="ep-1").request_headers()
    assert "Last-Event-ID" not in no_cursor and "X-Qwen-Event-Epoch" not in no_cursor
    zero = client.events(SID, last_event_id=0).request_headers()
    assert zero["Last-Event-ID"] == "0" and "X-Qwen-Event-Epoch" not in zero


def test_event_stream_rejects_invalid_cursor() -> None:
    client = DaemonClient(BASE)
    for bad in (-1, 2**53, True):
        with pytest.raises(ValueError, match="last_event_id"):
            client.events(SID, last_event_id=bad)


def test_event_stream_starts_with_requested_cursor_and_epoch() -> None:
    stream = DaemonClient(BASE).events(SID, last_event_id=12, epoch="ep")
    assert stream.last_event_id == 12 and stream.epoch == "ep"


@pytest.mark.parametrize(
    ("status", "exc_type"),
    [
        (401, AuthError),
        (403, AuthError),
        (404, SessionNotFoundError),
        (410, SessionNotFoundError),
        (500, ServerError),
        (400, DaemonHTTPError),
    ],
)
async def test_event_stream_errors_raise_before_iteration(
    status: int, exc_type: type[Exception]
) -> None:
    rec = Recorder({("GET", f"/session/{SID}/events"): reply(status, {"error": "x", "code": "c"})})
    async with rec.client() as client:
        with pytest.raises(exc_type) as info:
            async with client.events(SID, last_event_id=3, epoch="ep", max_queued=64):
                pytest.fail("the stream must not open")
    assert type(info.value) is exc_type
    sent = rec.last
    assert sent.headers["last-event-id"] == "3" and sent.headers["x-qwen-event-epoch"] == "ep"
    assert dict(sent.url.params) == {"maxQueued": "64"}


async def test_event_stream_rejects_non_sse_content_type() -> None:
    rec = Recorder({("GET", f"/session/{SID}/events"): reply(200, {"not": "sse"})})
    async with rec.client() as client:
        with pytest.raises(TransportError, match="text/event-stream") as info:
            async with client.events(SID):
                pytest.fail("the stream must not open")
    assert is_retriable(info.value)


async def test_event_stream_must_be_entered_before_iterating() -> None:
    stream = DaemonClient(BASE).events(SID)
    with pytest.raises(RuntimeError, match="async with"):
        await stream.__anext__()
