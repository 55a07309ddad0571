"""The OpenAPI document against the daemon that serves it: every documented operation exists
on the real daemon, every route the daemon serves is documented, and the error codes the daemon
can answer with are all there."""

from __future__ import annotations

import base64
import inspect
import os
import re
import socket
from collections.abc import Iterator
from typing import Any, cast

import httpx
import msgspec
import pytest

import daemon.asgi
import daemon.core.guards
import daemon.http_api
import daemon.session_list
import daemon.streams._request
from daemon.config import DaemonConfig
from daemon.core.openapi import body_schema, build_openapi, documented_error_codes, response_schema
from daemon.http_api import create_app
from daemon.manager import SessionManager
from sdk.protocol import http as wire
from sdk.protocol.routes import ROUTES, Route
from tests.harness import RunningDaemon, running_daemon

pytestmark = pytest.mark.processes  # starts processes: not in make unit-fast

TOKEN = "openapi-test-token"

# Every machine error code the daemon's routes, streams and agent side can answer with.
SPEC_CODES = {
    "unauthorized", "origin_not_allowed", "invalid_host", "body_too_large", "route_not_found",
    "method_not_allowed", "invalid_json", "invalid_client_id", "invalid_cwd",
    "session_not_found", "invalid_transcript_limit", "invalid_live_replay_mode",
    "invalid_prompt", "invalid_deadline_ms", "prompt_queue_full", "permission_not_found",
    "invalid_transcript_cursor", "invalid_max_queued", "subscriber_limit_exceeded",
    "agent_start_failed",
}
PARAM = re.compile(r"\{[^}]+\}|<[^>]+>")


def normalise(path: str) -> str:
    """``/session/<session_id>/load`` and ``/session/{sessionId}/load`` both become
    ``/session/{}/load``."""
    return PARAM.sub("{}", path)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    env = {"MOCK_ACP_PROMPT_DELAY_MS": "0"}
    with running_daemon(tmp_path_factory.mktemp("openapi"), env=env) as d:
        yield d


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    with running_daemon(tmp_path_factory.mktemp("openapi-auth"), ["--token", TOKEN]) as d:
        yield d


def _resolve(doc: dict[str, Any], ref: str) -> Any:
    assert ref.startswith("#/"), ref
    node: Any = doc
    for part in ref[2:].split("/"):
        node = node[part]
    return node


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref":
                yield value
            else:
                yield from _refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _refs(item)


def test_document_is_well_formed_openapi_31() -> None:
    doc = build_openapi()
    assert doc["openapi"] == "3.1.0"
    assert doc["info"]["title"] and doc["info"]["version"]
    assert doc["components"]["securitySchemes"]["bearer"] == {"type": "http",
                                                              "scheme": "bearer"}
    operation_ids = []
    for path, item in doc["paths"].items():
        placeholders = set(re.findall(r"\{([^}]+)\}", path))
        for method, op in item.items():
            assert method in ("get", "post", "delete"), method
            operation_ids.append(op["operationId"])
            declared = {p["name"] for p in op.get("parameters", []) if p["in"] == "path"}
            assert declared == placeholders, (path, method)
            for param in op.get("parameters", []):
                assert param["in"] in ("path", "query", "header")
                assert param["required"] if param["in"] == "path" else True
            for status, response in op["responses"].items():
                assert status == "default" or re.fullmatch(r"[1-5][0-9][0-9]", status), status
                if "$ref" not in response:
                    assert response["description"]
    assert len(operation_ids) == len(set(operation_ids)) == len(ROUTES)
    for ref in _refs(doc):
        assert _resolve(doc, ref) is not None, ref
    # The error schema enumerates every code any response documents.
    enum = set(doc["components"]["schemas"]["Error"]["properties"]["code"]["enum"])
    for item in doc["paths"].values():
        for op in item.values():
            for response in op["responses"].values():
                assert set(response.get("x-error-codes", ())) <= enum


def test_spec_error_codes_are_documented() -> None:
    codes = documented_error_codes()
    assert SPEC_CODES <= codes, SPEC_CODES - codes
    by_operation = {
        op["operationId"]: {code for r in op["responses"].values()
                            for code in r.get("x-error-codes", ())}
        for item in build_openapi()["paths"].values() for op in item.values()
    }
    # Spot checks where a code belongs to one route.
    assert "prompt_queue_full" in by_operation["prompt"]
    assert "permission_not_found" in by_operation["votePermission"]
    assert {"invalid_max_queued", "subscriber_limit_exceeded"} <= by_operation["events"]
    assert "agent_start_failed" in by_operation["createSession"]
    assert "invalid_transcript_cursor" in by_operation["transcript"]
    assert "unauthorized" not in by_operation["health"]  # GET /health needs no token


def test_documented_error_codes_exist_in_the_daemon() -> None:
    """No invented codes: each one is a string literal somewhere in the HTTP layer (or in the
    protocol's builders of the errors several parts of it answer)."""
    source = "".join(inspect.getsource(module) for module in (
        daemon.asgi, daemon.core.guards, daemon.http_api, daemon.session_list,
        daemon.streams._request, wire))
    for code in documented_error_codes():
        assert f'"{code}"' in source, code


def test_every_route_the_daemon_serves_is_documented() -> None:
    app = create_app(DaemonConfig(), cast(SessionManager, None))
    served: set[tuple[str, str]] = set()
    for rule in app.url_map.iter_rules():
        # HEAD rides along with GET in Werkzeug; automatic OPTIONS is switched off.
        for method in (rule.methods or set()) - {"HEAD", "OPTIONS"}:
            served.add((method, normalise(rule.rule)))
    # The event streams are answered at the ASGI layer, before the Quart app: it recognises
    # the table's stream routes (and only those) by their paths.
    for route in ROUTES:
        path = route.url(**{name: "x" for name in route.path_params})
        answered, found = daemon.asgi._stream_route(path)
        if route.streams:
            assert (answered, found) == (route, "x"), route.operation_id
            served.add((route.method, normalise(route.path)))
        else:
            assert found is None, route.operation_id
    documented = {(route.method, normalise(route.path)) for route in ROUTES}
    assert served - documented == set(), "served but not documented"
    assert documented - served == set(), "documented but not served"


def test_served_document_matches_the_table(served: RunningDaemon) -> None:
    with httpx.Client(base_url=served.url, timeout=30) as client:
        resp = client.get("/openapi.json")
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("application/json")
    assert resp.json() == build_openapi()


def _ws_upgrade_status(url: str, path: str) -> int:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    key = base64.b64encode(os.urandom(16)).decode()
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall((f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
                      f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                      "Sec-WebSocket-Version: 13\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = sock.recv(4096)
            assert chunk, head
            head += chunk
    return int(head.split(b" ", 2)[1])


def _call(client: httpx.Client, url: str, route: Route, sid: str) -> tuple[int, Any]:
    path = route.path.replace("{sessionId}", sid).replace("{requestId}", "no-such-request") \
        .replace("{idempotencyKey}", "openapi-key")  # the prompt's, sent before this
    if route.operation_id == "eventsWebSocket":
        return _ws_upgrade_status(url, path), None
    if route.operation_id == "events":
        with client.stream("GET", path, headers={"Last-Event-ID": "0"}) as resp:
            return resp.status_code, None
    body: dict[str, Any] | None = None
    if route.operation_id == "prompt":
        body = {"prompt": [{"type": "text", "text": "openapi"}]}
    elif route.operation_id == "votePermission":
        body = {"optionId": "allow"}
    elif body_schema(route) is not None:
        body = {}
    headers = {"Idempotency-Key": "openapi-key"} if route.operation_id == "prompt" else {}
    resp = client.request(route.method, path, json=body, headers=headers)
    if resp.status_code == route.status and route.response_type is not None:
        # The answer is the protocol's type (strict: a member of another type fails here).
        kind: Any = route.response_type
        if kind in (wire.LoadSessionResponse, wire.TranscriptPage):
            kind = kind[msgspec.Raw]
        msgspec.json.decode(resp.content, type=kind)
    json_body = resp.content and route.media_type == "application/json"
    return resp.status_code, resp.json() if json_body else resp.text or None


def test_every_documented_operation_exists_on_the_daemon(served: RunningDaemon) -> None:
    with httpx.Client(base_url=served.url, timeout=10) as client:
        created = client.post("/session", json={"sessionScope": "thread"}).json()
        client.headers["X-Qwen-Client-Id"] = created["clientId"]
        sid = created["sessionId"]
        # DELETE last: it ends the session the others use.
        for route in sorted(ROUTES, key=lambda r: r.method == "DELETE"):
            status, body = _call(client, served.url, route, sid)
            code = body.get("code") if isinstance(body, dict) else None
            assert code not in ("route_not_found", "method_not_allowed"), (route, body)
            assert status not in (404, 405) or code in ("permission_not_found",), (route, body)
            if route.operation_id == "votePermission":
                # No permission request is pending: the route exists and says so.
                assert (status, code) == (404, "permission_not_found")
            else:
                assert status == route.status, (route.operation_id, status, body)
                schema = response_schema(route)
                if body is not None and schema is not None:
                    for key in schema.get("required", ()):
                        assert key in body, (route.operation_id, key)


def test_openapi_needs_the_token_like_every_route_but_health(secured: RunningDaemon) -> None:
    with httpx.Client(base_url=secured.url, timeout=30) as client:
        denied = client.get("/openapi.json")
        assert denied.status_code == 401 and denied.json()["code"] == "unauthorized"
        ok = client.get("/openapi.json", headers={"Authorization": f"Bearer {TOKEN}"})
        assert ok.status_code == 200 and ok.json()["openapi"] == "3.1.0"
        assert client.get("/health").status_code == 200
    doc = build_openapi()
    assert doc["security"] == [{"bearer": []}]
    assert "security" not in doc["paths"]["/openapi.json"]["get"]  # inherits: token needed
    assert {} in doc["paths"]["/health"]["get"]["security"]  # anonymous allowed


def test_405_names_the_allowed_methods_and_ws_needs_an_upgrade(served: RunningDaemon) -> None:
    """Every 405 carries ``Allow`` (the documented methods of that path); a plain GET of the
    WebSocket route is 426 with ``Upgrade: websocket``, not 404."""
    doc = build_openapi()
    with httpx.Client(base_url=served.url, timeout=10) as client:
        sid = client.post("/session", json={"sessionScope": "thread"}).json()["sessionId"]
        for template, item in doc["paths"].items():
            path = template.replace("{sessionId}", sid).replace("{requestId}", "r")
            resp = client.request("PUT", path)
            assert resp.status_code == 405, (path, resp.text)
            allowed = {m.strip() for m in resp.headers["allow"].split(",")}
            assert allowed - {"HEAD"} == {m.upper() for m in item}, (path, allowed)
        plain = client.get(f"/session/{sid}/ws")
    assert plain.status_code == 426, plain.text
    assert plain.headers["upgrade"] == "websocket"
    assert plain.json()["code"] == "upgrade_required"
