"""CORS for ``--allow-origin`` against the real daemon: a browser on an allowed origin can
preflight any route without the token, and reads every answer (the SSE stream and the errors
included); any other origin gets a 403 and not a single CORS header."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import trio

from tests.harness import RunningDaemon, running_daemon
from tests.sse_client import Subscriber

pytestmark = pytest.mark.processes  # starts processes: not in make unit-fast

TOKEN = "cors-test-token"
APP = "http://app.example"
EVIL = "http://evil.example"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
REQUIRED_REQUEST_HEADERS = {"authorization", "content-type", "last-event-id",
                            "x-qwen-client-id", "x-qwen-event-epoch"}
EXPOSED = {"x-qwen-event-epoch", "x-qwen-sse-stream-id", "retry-after"}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    base = tmp_path_factory.mktemp("cors")
    with running_daemon(base, ["--token", TOKEN, "--allow-origin", APP,
                               "--allow-origin", "http://other.example:8080"]) as d:
        yield d


def listed(value: str | None) -> set[str]:
    return {part.strip().lower() for part in (value or "").split(",") if part.strip()}


def assert_cors_for(resp: httpx.Response, origin: str) -> None:
    assert resp.headers.get("access-control-allow-origin") == origin, dict(resp.headers)
    assert "origin" in listed(", ".join(resp.headers.get_list("vary")))
    assert EXPOSED <= listed(resp.headers.get("access-control-expose-headers"))


def assert_no_cors(resp: httpx.Response) -> None:
    cors = {k for k in resp.headers if k.lower().startswith("access-control-")}
    assert not cors, dict(resp.headers)


def preflight(client: httpx.Client, path: str, origin: str = APP, method: str = "POST",
              request_headers: str = "authorization, content-type") -> httpx.Response:
    return client.options(path, headers={"Origin": origin,
                                         "Access-Control-Request-Method": method,
                                         "Access-Control-Request-Headers": request_headers})


@pytest.mark.parametrize("path", ["/session", "/session/abc/prompt", "/session/abc/events",
                                  "/health", "/no/such/route"])
def test_preflight_from_allowed_origin_is_answered_without_the_token(
        daemon: RunningDaemon, path: str) -> None:
    with httpx.Client(base_url=daemon.url, timeout=30) as client:
        resp = preflight(client, path)
    assert resp.status_code == 204, resp.text
    assert resp.headers["access-control-allow-origin"] == APP
    assert {"GET", "POST", "DELETE"} <= {m.upper() for m in
                                         listed(resp.headers["access-control-allow-methods"])}
    assert REQUIRED_REQUEST_HEADERS <= listed(resp.headers["access-control-allow-headers"])
    assert int(resp.headers["access-control-max-age"]) > 0
    assert "origin" in listed(resp.headers.get("vary"))
    assert resp.content == b""


def test_each_allowed_origin_is_echoed_exactly(daemon: RunningDaemon) -> None:
    with httpx.Client(base_url=daemon.url, timeout=30) as client:
        resp = preflight(client, "/session", origin="http://other.example:8080")
        assert resp.status_code == 204
        assert resp.headers["access-control-allow-origin"] == "http://other.example:8080"
        # A different port is a different origin.
        other_port = preflight(client, "/session", origin="http://other.example:8081")
        assert other_port.status_code == 403
        assert_no_cors(other_port)


def test_preflight_from_other_origin_gets_403_and_no_cors(daemon: RunningDaemon) -> None:
    with httpx.Client(base_url=daemon.url, timeout=30) as client:
        resp = preflight(client, "/session", origin=EVIL)
    assert resp.status_code == 403
    assert resp.json()["code"] == "origin_not_allowed"
    assert_no_cors(resp)


def test_preflight_still_needs_a_loopback_host(daemon: RunningDaemon) -> None:
    with httpx.Client(base_url=daemon.url, timeout=30) as client:
        resp = client.options("/session", headers={"Origin": APP, "Host": "attacker.example",
                                                   "Access-Control-Request-Method": "POST"})
    assert resp.status_code == 403 and resp.json()["code"] == "invalid_host"


def test_options_that_is_not_a_preflight_needs_the_token(daemon: RunningDaemon) -> None:
    with httpx.Client(base_url=daemon.url, timeout=30) as client:
        resp = client.options("/session", headers={"Origin": APP})
    assert resp.status_code == 401
    assert_cors_for(resp, APP)


def test_actual_requests_from_allowed_origin_carry_cors(daemon: RunningDaemon) -> None:
    with httpx.Client(base_url=daemon.url, timeout=30) as client:
        created = client.post("/session", json={}, headers={**AUTH, "Origin": APP})
        assert created.status_code == 200, created.text
        assert_cors_for(created, APP)
        sid = created.json()["sessionId"]
        status = client.get(f"/session/{sid}/status", headers={**AUTH, "Origin": APP})
        assert status.status_code == 200
        assert_cors_for(status, APP)
        # Errors are readable by the page too: 401, 404, 405.
        unauthorized = client.post("/session", json={}, headers={"Origin": APP})
        assert unauthorized.status_code == 401
        assert_cors_for(unauthorized, APP)
        missing = client.get("/session/nope/status", headers={**AUTH, "Origin": APP})
        assert missing.status_code == 404
        assert_cors_for(missing, APP)
        missing_stream = client.get("/session/nope/events", headers={**AUTH, "Origin": APP})
        assert missing_stream.status_code == 404
        assert_cors_for(missing_stream, APP)
        wrong_method = client.post(f"/session/{sid}/events", headers={**AUTH, "Origin": APP})
        assert wrong_method.status_code == 405
        assert_cors_for(wrong_method, APP)


def test_requests_from_other_origin_get_403_and_no_cors(daemon: RunningDaemon) -> None:
    with httpx.Client(base_url=daemon.url, timeout=30) as client:
        resp = client.post("/session", json={}, headers={**AUTH, "Origin": EVIL})
        assert resp.status_code == 403 and resp.json()["code"] == "origin_not_allowed"
        assert_no_cors(resp)
        stream = client.get("/session/x/events", headers={**AUTH, "Origin": EVIL})
        assert stream.status_code == 403
        assert_no_cors(stream)


def test_requests_without_origin_get_no_cors(daemon: RunningDaemon) -> None:
    with httpx.Client(base_url=daemon.url, timeout=30) as client:
        resp = client.post("/session", json={}, headers=AUTH)
    assert resp.status_code == 200
    assert_no_cors(resp)


async def test_sse_stream_from_allowed_origin_carries_cors(daemon: RunningDaemon) -> None:
    async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH, timeout=15) as client:
        sid = (await client.post("/session", json={"sessionScope": "thread"},
                                 headers={"Origin": APP})).json()["sessionId"]
        async with trio.open_nursery() as nursery:
            sub = Subscriber(client, f"/session/{sid}/events",
                             {"Origin": APP, "Last-Event-ID": "0"})
            await nursery.start(sub.run)
            nursery.cancel_scope.cancel()
    assert sub.status == 200 and sub.response_headers is not None
    headers = sub.response_headers
    assert headers["content-type"].startswith("text/event-stream")
    assert headers.get("access-control-allow-origin") == APP
    assert "origin" in listed(", ".join(headers.get_list("vary")))
    assert EXPOSED <= listed(headers.get("access-control-expose-headers"))
    # The headers it exposes are really there for the page to read.
    assert headers.get("x-qwen-event-epoch") and headers.get("x-qwen-sse-stream-id")


def test_no_allow_origin_means_every_origin_is_refused(tmp_path: Path) -> None:
    with running_daemon(tmp_path) as plain, httpx.Client(base_url=plain.url, timeout=30) as client:
        resp = preflight(client, "/session")
        assert resp.status_code == 403
        assert_no_cors(resp)
