"""The daemon's ASGI entry: guards first (a CORS preflight is answered there), then the event
streams or the Quart app; every HTTP answer to an allowed origin carries the CORS headers."""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import TYPE_CHECKING, Any

import trio
from quart_trio import QuartTrio

from sdk.protocol import http as wire
from sdk.protocol import routes
from sdk.protocol.headers import RETRY_AFTER, lower

from .bridge import is_reserve
from .core.guards import Guard, is_loopback_peer, is_ui_asset
from .core.json_codec import encode_json
from .core.throttle import LogThrottle
from .http_api import MAX_BODY_BYTES
from .manager import (
    SESSION_LIMIT_RETRY_AFTER_S,
    AgentSessionConflict,
    AgentUnavailable,
    SessionLimit,
    SessionManager,
)
from .transcript_store import TranscriptDamaged

if TYPE_CHECKING:
    # The event streams (and with them a session's bus) are imported by the first event-stream
    # or WebSocket request, not by the daemon's start.
    from .session import Session
    from .streams import Receive, Scope, Send
    from .ui_files import UiFiles

log = logging.getLogger("daemon.asgi")

_RETRY_AFTER = lower(RETRY_AFTER).encode()
BODY_TIMEOUT_LOG_INTERVAL_S = 60.0  # one line per minute at most, with the count


def _stream_route(path: str) -> tuple[routes.Route, str | None]:
    """The event stream route ``path`` names (SSE or WebSocket) and its session, else
    (the WebSocket route, None)."""
    session_id = routes.EVENTS.session_id(path)
    if session_id is not None:
        return routes.EVENTS, session_id
    return routes.EVENTS_WS, routes.EVENTS_WS.session_id(path)


def _headers(scope: Scope) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in scope.get("headers", ()):
        name = key.decode("latin-1").lower()
        if name not in out:  # first wins, like most servers
            out[name] = value.decode("latin-1")
    return out


async def _send_json(send: Send, status: int, body: wire.ErrorBody, *,
                     close: bool = False, extra: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    raw = encode_json(body)
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(raw)).encode()), *extra]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": raw, "more_body": False})


async def _send_preflight(send: Send, cors: list[tuple[bytes, bytes]]) -> None:
    await send({"type": "http.response.start", "status": 204, "headers": cors})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


def _with_headers(send: Send, extra: list[tuple[bytes, bytes]]) -> Send:
    """Add ``extra`` to the response start, whoever answers (guards, streams or the app)."""

    async def send_with_headers(message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", ()), *extra]}
        await send(message)

    return send_with_headers


class DaemonASGI:
    def __init__(self, app: QuartTrio, manager: SessionManager, guard: Guard,
                 heartbeat_s: float) -> None:
        self.app = app
        self.manager = manager
        self.guard = guard
        self.heartbeat_s = heartbeat_s
        self.body_timeout_s = manager.config.body_timeout_ms / 1000
        self.stalled_write_s = manager.config.stalled_write_ms / 1000
        self.body_timeouts = LogThrottle(BODY_TIMEOUT_LOG_INTERVAL_S)
        self._ui: UiFiles | None = None  # the viewer's files: see _serve_ui
        # Cluster mode (daemon.cluster.ClusterRouter): routes requests for sessions this node
        # does not run. None in single-node mode.
        self.cluster: Any = None

    async def _live_session(self, session_id: str) -> Session | None:
        """:meth:`SessionManager.live`, its refusals as the JSON errors the routes give."""
        from .streams import StreamRequestError

        try:
            return await self.manager.live(session_id)
        except SessionLimit as exc:
            raise StreamRequestError(503, wire.error_body("session_limit", str(exc),
                                                          limit=exc.limit),
                                     {"Retry-After": str(SESSION_LIMIT_RETRY_AFTER_S)}) from None
        except AgentSessionConflict as exc:
            raise StreamRequestError(502, wire.error_body(
                "agent_session_id_reused", f"Agent session conflict: {exc}")) from None
        except AgentUnavailable as exc:
            raise StreamRequestError(502, wire.error_body(
                "agent_start_failed", f"Agent failed to start: {exc}")) from None
        except TranscriptDamaged:
            raise StreamRequestError(500, wire.error_body(
                "transcript_damaged", "The transcript is damaged where this request reads it",
                session_id=session_id)) from None

    def _log_body_timeout(self, scope: Scope) -> None:
        count = self.body_timeouts.note(trio.current_time())
        if count is not None:
            client = scope.get("client") or ("?", 0)
            log.warning("event=body_timeout count=%d total=%d timeout_ms=%d last_peer=%s "
                        "method=%s path=%s", count, self.body_timeouts.total,
                        round(self.body_timeout_s * 1000), f"{client[0]}:{client[1]}",
                        scope.get("method"), scope.get("path"))

    async def _serve_ui(self, send: Send, method: str, path: str) -> None:
        # The viewer's module (and its files, read by its first answer) loads with the first
        # request for the viewer: a daemon nobody opens in a browser holds neither.
        if self._ui is None:
            from .ui_files import UiFiles

            self._ui = UiFiles()
        answer = self._ui.answer(method, path)
        if answer is None:
            await _send_json(send, 404, wire.route_not_found())
            return
        await send({"type": "http.response.start", "status": answer.status,
                    "headers": answer.headers})
        await send({"type": "http.response.body", "body": answer.body, "more_body": False})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket"):
            await self.app(scope, receive, send)  # type: ignore[arg-type]
            return
        headers = _headers(scope)
        method = scope.get("method", "GET")
        path: str = scope["path"]
        reserve = is_reserve(scope.get("server"), scope.get("client"))
        if reserve:
            # A loopback health probe let in over --max-connections: that, once, and no more.
            if kind != "http" or method != routes.HEALTH.method or path != routes.HEALTH.path:
                body = wire.ErrorBody(error="Too many connections", code="connection_limit")
                if kind == "http":
                    await _send_json(send, 503, body, close=True,
                                     extra=((_RETRY_AFTER, b"1"),))
                else:
                    from .streams import deny_ws

                    await deny_ws(send, 503, body, {RETRY_AFTER: "1"})
                return
            send = _with_headers(send, [(b"connection", b"close")])
        early = send  # for the answers given before the body is read
        if kind == "http" and not reserve and _has_body(headers):
            # The answers below that come before the body is read (a guard's denial, a wrong
            # method on the event stream...) can go out before the body has arrived: Hypercorn
            # then cannot reuse the connection and closes it after the response. Say so, or a
            # client that reuses it for its next request finds it gone.
            early = _with_headers(send, [(b"connection", b"close")])
        denial = self.guard.check(method, path, headers,
                                  peer_loopback=is_loopback_peer(scope.get("client")))
        if kind == "http":
            if denial is None and method == "OPTIONS":
                preflight = self.guard.preflight_headers(headers)
                if preflight is not None:
                    await _send_preflight(early, preflight)
                    return
            cors = self.guard.cors_headers(headers)
            if cors:  # every answer below, the guards' and the SSE stream's included
                send, early = _with_headers(send, cors), _with_headers(early, cors)
        if denial is not None:
            if kind == "http":
                await _send_json(early, denial.status, denial.body)
            else:
                from .streams import deny_ws

                await deny_ws(send, denial.status, denial.body)
            return
        if kind == "http" and is_ui_asset(method, path):
            await self._serve_ui(early, method, path)
            return
        stream, session_id = _stream_route(path)
        if session_id is not None:
            if kind == "http" and method != stream.method:
                await _send_json(early, 405, wire.method_not_allowed(),
                                 extra=((b"allow", stream.method.encode()),))
                return
            if kind == "http" and stream is routes.EVENTS_WS:
                # The WebSocket route without an upgrade: say which protocol it speaks.
                await _send_json(early, 426, wire.ErrorBody(
                    error="This route needs a WebSocket upgrade", code="upgrade_required"),
                                 extra=((b"upgrade", b"websocket"),))
                return
            if (kind == "http") == (stream is routes.EVENTS):
                from .streams import (
                    StreamRequestError,
                    deny_ws,
                    send_json_error,
                    serve_sse,
                    serve_ws,
                )

                try:
                    # A session unloaded when idle is restored first, as load would.
                    session = await self._live_session(session_id)
                    bus = session.bus if session is not None else None
                    if self.cluster is not None:  # it also settles a lease this node doubts
                        bus = await self.cluster.stream_bus(session_id, self.manager.limits)
                except StreamRequestError as err:  # Redis trouble: 503 + Retry-After
                    if kind == "http":
                        await send_json_error(early, err)
                    else:
                        await deny_ws(send, err.status, err.body, err.headers)
                    return
                if bus is None:
                    gone = wire.session_not_found(session_id)
                    if kind == "http":
                        await _send_json(early, 404, gone)
                    else:
                        await deny_ws(send, 404, gone)
                    return
                if kind == "http":
                    await serve_sse(scope, receive, send, bus, headers, self.heartbeat_s,
                                    self.stalled_write_s)
                else:
                    await serve_ws(scope, receive, send, bus, headers, self.heartbeat_s)
                return
        if kind == "websocket":
            from .streams import deny_ws

            await deny_ws(send, 404, wire.route_not_found())
            return
        # Read the whole body before the app runs: a handler that answers without reading it
        # (a 404, a GET with a body) otherwise leaves a keep-alive connection that can stall
        # the next request. It also enforces the body limit before any JSON parsing.
        # A body that does not arrive in time closes the connection (408): a client cannot
        # hold a connection and its descriptor by sending headers and then nothing.
        with trio.move_on_after(self.body_timeout_s) as body_deadline:
            received = await _read_body(receive, MAX_BODY_BYTES)
        if body_deadline.cancelled_caught:
            self._log_body_timeout(scope)
            await _send_json(send, 408, wire.ErrorBody(error="Request body not received in time",
                                                       code="body_timeout"), close=True)
            return
        request_body = received
        if request_body is None:
            return  # the client went away
        if request_body is _TOO_LARGE:
            await _send_json(send, 413, wire.body_too_large(), close=True)
            return
        if self.cluster is not None:
            if await self.cluster.handle(scope, receive, send, headers, request_body):
                return
            send = self.cluster.wrap_send(method, path, send)
        replay, shielded = _replay(request_body, receive), _shield_last_body(send)
        await self.app(scope, replay, shielded)  # type: ignore[arg-type]


_TOO_LARGE = b"\x00too-large"


def _has_body(headers: dict[str, str]) -> bool:
    """Whether the request announces a body (HTTP/1.1: a non-zero length, or chunked)."""
    if "transfer-encoding" in headers:
        return True
    return headers.get("content-length", "0").strip() not in ("", "0")


async def _read_body(receive: Receive, limit: int) -> bytes | None:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return _TOO_LARGE
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _shield_last_body(send: Send) -> Send:
    """Shield the final body message from cancellation.

    Sending it makes Hypercorn hand the app ``http.disconnect`` and, for ``Connection: close``
    (and HTTP/1.0), close the socket, all inside this one call. Quart-Trio cancels the request
    nursery as soon as it reads that disconnect, which cancelled the close half-way: the
    connection stayed open, with no idle timer, until the client went away.
    """

    async def send_shielded(message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            with trio.CancelScope(shield=True):
                await send(message)
        else:
            await send(message)

    return send_shielded


def _replay(body: bytes, receive: Receive) -> Receive:
    delivered = False

    async def replay() -> MutableMapping[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
