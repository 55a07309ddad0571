"""The daemon's ASGI entry: guards first, then the event streams or the Quart app."""

from __future__ import annotations

import re
from typing import Any

from quart_trio import QuartTrio

from .envelope import encode_json
from .guards import Guard
from .manager import SessionManager
from .streams import Receive, Scope, Send, deny_ws, serve_sse, serve_ws

STREAM_PATH = re.compile(r"^/session/([^/]+)/(events|ws)$")


def _headers(scope: Scope) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in scope.get("headers", ()):
        name = key.decode("latin-1").lower()
        if name not in out:  # first wins, like most servers
            out[name] = value.decode("latin-1")
    return out


async def _send_json(send: Send, status: int, body: dict[str, Any]) -> None:
    raw = encode_json(body)
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]})
    await send({"type": "http.response.body", "body": raw, "more_body": False})


class DaemonASGI:
    def __init__(self, app: QuartTrio, manager: SessionManager, guard: Guard,
                 heartbeat_s: float) -> None:
        self.app = app
        self.manager = manager
        self.guard = guard
        self.heartbeat_s = heartbeat_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket"):
            await self.app(scope, receive, send)  # type: ignore[arg-type]
            return
        headers = _headers(scope)
        method = scope.get("method", "GET")
        path: str = scope["path"]
        denial = self.guard.check(method, path, headers)
        if denial is not None:
            if kind == "http":
                await _send_json(send, denial.status, denial.body)
            else:
                await deny_ws(send, denial.status, denial.body)
            return
        match = STREAM_PATH.match(path)
        if match is not None:
            session_id, which = match.groups()
            if kind == "http" and which == "events" and method != "GET":
                await _send_json(send, 405, {"error": "Method not allowed",
                                             "code": "method_not_allowed"})
                return
            if (kind == "http") == (which == "events"):
                session = self.manager.get(session_id)
                if session is None:
                    body = {"error": f'No session with id "{session_id}"',
                            "code": "session_not_found", "sessionId": session_id}
                    if kind == "http":
                        await _send_json(send, 404, body)
                    else:
                        await deny_ws(send, 404, body)
                    return
                if kind == "http":
                    await serve_sse(scope, receive, send, session.bus, headers, self.heartbeat_s)
                else:
                    await serve_ws(scope, receive, send, session.bus, headers, self.heartbeat_s)
                return
        if kind == "websocket":
            await deny_ws(send, 404, {"error": "Route not found", "code": "route_not_found"})
            return
        await self.app(scope, receive, send)  # type: ignore[arg-type]
