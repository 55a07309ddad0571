"""HTTP surface of the real daemon: auth, Host/Origin guards, 404s, every malformed input
the API defines, with its code, capabilities and status."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.harness import RunningDaemon, running_daemon

pytestmark = pytest.mark.processes  # starts processes: not in make unit-fast

TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    with running_daemon(tmp_path_factory.mktemp("http"), ["--max-journal-events", "77"]) as d:
        yield d


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    with running_daemon(tmp_path_factory.mktemp("auth"), ["--token", TOKEN,
                                                          "--allow-origin", "http://ok.test"]) as d:
        yield d


@pytest.fixture(scope="module")
def session_id(daemon: RunningDaemon) -> str:
    with httpx.Client(base_url=daemon.url, timeout=30) as client:
        return str(client.post("/session", json={}).json()["sessionId"])


def test_auth_is_required_and_compared(secured: RunningDaemon) -> None:
    with httpx.Client(base_url=secured.url, timeout=30) as client:
        missing = client.post("/session", json={})
        assert missing.status_code == 401
        assert missing.json() == {"error": "Unauthorized", "code": "unauthorized"}
        wrong = client.post("/session", json={}, headers={"Authorization": f"Bearer {TOKEN}x"})
        assert wrong.status_code == 401
        basic = client.post("/session", json={}, headers={"Authorization": f"Basic {TOKEN}"})
        assert basic.status_code == 401
        ok = client.post("/session", json={}, headers={"Authorization": f"bEaReR {TOKEN}"})
        assert ok.status_code == 200
        sid = ok.json()["sessionId"]
        stream = client.get(f"/session/{sid}/events")
        assert stream.status_code == 401
        # /health is a liveness probe: no token needed.
        assert client.get("/health").json() == {"status": "ok"}


def _read_head(sock: socket.socket) -> tuple[bytes, bytes]:
    """A response's head (lowercased) and what of its body came with it."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        assert chunk, f"connection closed after {data!r}"
        data += chunk
    head, rest = data.split(b"\r\n\r\n", 1)
    return head.lower(), rest


def test_a_denial_before_the_body_arrives_says_it_closes(secured: RunningDaemon) -> None:
    # The 401 goes out before the body is read; the server cannot reuse the connection then
    # and closes it. Unannounced, a client that reuses the connection for its next request
    # finds it gone ("Server disconnected without sending a response").
    host, port = secured.url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"POST /session HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 2\r\n\r\n")
        head, _ = _read_head(sock)  # the body is not sent yet
        assert head.startswith(b"http/1.1 401")
        assert b"\r\nconnection: close" in head
    # Without a body the connection is kept: a second request on it is answered.
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        for _ in range(2):
            sock.sendall(b"GET /capabilities HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            head, body = _read_head(sock)
            assert head.startswith(b"http/1.1 401") and b"connection: close" not in head
            length = int(head.split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0])
            while len(body) < length:
                body += sock.recv(length - len(body))


def test_origin_is_refused_unless_allow_listed(secured: RunningDaemon) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=secured.url, timeout=30) as client:
        denied = client.get("/capabilities", headers={**auth, "Origin": "http://evil.test"})
        assert denied.status_code == 403
        assert denied.json() == {"error": "Request denied by CORS policy",
                                 "code": "origin_not_allowed"}
        allowed = client.get("/capabilities", headers={**auth, "Origin": "http://ok.test"})
        assert allowed.status_code == 200
        # Origin is checked before auth.
        no_token = client.get("/capabilities", headers={"Origin": "http://evil.test"})
        assert no_token.status_code == 403


def test_foreign_host_is_refused(daemon: RunningDaemon) -> None:
    with httpx.Client(base_url=daemon.url, timeout=30) as client:
        resp = client.get("/health", headers={"Host": "attacker.example:4170"})
        assert resp.status_code == 403
        assert resp.json() == {"error": "Invalid Host header", "code": "invalid_host"}
        for host in ("localhost:1", "127.0.0.1", "[::1]:9"):
            assert client.get("/health", headers={"Host": host}).status_code == 200


def test_unknown_session_and_route(daemon: RunningDaemon) -> None:
    ghost = "00000000-0000-4000-8000-000000000000"
    with httpx.Client(base_url=daemon.url, timeout=30) as client:
        for method, path in [("POST", "load"), ("POST", "prompt"), ("POST", "cancel"),
                             ("GET", "status"), ("GET", "transcript"), ("GET", "events")]:
            resp = client.request(method, f"/session/{ghost}/{path}", json={})
            assert resp.status_code == 404, path
            assert resp.json() == {"error": f'No session with id "{ghost}"',
                                   "code": "session_not_found", "sessionId": ghost}
        assert client.delete(f"/session/{ghost}").status_code == 404
        route = client.get("/nope")
        assert route.status_code == 404 and route.json()["code"] == "route_not_found"
        method = client.put("/session")
        assert method.status_code == 405 and method.json()["code"] == "method_not_allowed"


@pytest.mark.parametrize(("path", "body", "code"), [
    ("/session", b"{not json", "invalid_json"),
    ("/session", b"[1, 2]", "invalid_json"),
    ("/session", b'{"cwd": "relative/dir"}', "invalid_cwd"),
    ("/session", b'{"cwd": 5}', "invalid_cwd"),
    ("{sid}/load", b'{"historyPageSize": 0}', "invalid_transcript_limit"),
    ("{sid}/load", b'{"historyPageSize": 501}', "invalid_transcript_limit"),
    ("{sid}/load", b'{"historyPageSize": true}', "invalid_transcript_limit"),
    ("{sid}/load", b'{"liveReplayMode": "everything"}', "invalid_live_replay_mode"),
    ("{sid}/prompt", b'{"prompt": []}', "invalid_prompt"),
    ("{sid}/prompt", b'{"prompt": "hi"}', "invalid_prompt"),
    ("{sid}/prompt", b'{"prompt": [{"text": "no type"}]}', "invalid_prompt"),
    ("{sid}/prompt", b'{}', "invalid_prompt"),
    ("{sid}/prompt", b'{"prompt": [{"type": "text", "text": "x"}], "deadlineMs": -1}',
     "invalid_deadline_ms"),
    ("{sid}/prompt", b'{"prompt": [{"type": "text", "text": "x"}], "deadlineMs": "5"}',
     "invalid_deadline_ms"),
    ("{sid}/prompt", b'\xff\xfe', "invalid_json"),
])
def test_malformed_input_gets_400_with_code(daemon: RunningDaemon, session_id: str,
                                            path: str, body: bytes, code: str) -> None:
    url = path.replace("{sid}", f"/session/{session_id}")
    with httpx.Client(base_url=daemon.url, timeout=30) as client:
        resp = client.post(url, content=body, headers={"Content-Type": "application/json"})
    assert resp.status_code == 400, resp.text
    payload = resp.json()
    assert payload["code"] == code and isinstance(payload["error"], str)


def test_bad_json_error_text_matches_reference(daemon: RunningDaemon) -> None:
    with httpx.Client(base_url=daemon.url, timeout=30) as client:
        resp = client.post("/session", content=b"{", headers={"Content-Type": "application/json"})
    assert resp.json() == {"error": "Invalid JSON in request body", "code": "invalid_json"}


def test_stream_query_and_client_id_validation(daemon: RunningDaemon, session_id: str) -> None:
    with httpx.Client(base_url=daemon.url, timeout=30) as client:
        for bad in ("15", "2049", "abc"):
            resp = client.get(f"/session/{session_id}/events", params={"maxQueued": bad})
            assert resp.status_code == 400 and resp.json()["code"] == "invalid_max_queued"
        bad_id = client.post("/session", json={}, headers={"X-Qwen-Client-Id": "bad id!"})
        assert bad_id.status_code == 400 and bad_id.json()["code"] == "invalid_client_id"
        unregistered = client.post(f"/session/{session_id}/prompt",
                                   json={"prompt": [{"type": "text", "text": "x"}]},
                                   headers={"X-Qwen-Client-Id": "client_not-registered"})
        assert unregistered.status_code == 400
        assert unregistered.json()["code"] == "invalid_client_id"
        vote = client.post(f"/session/{session_id}/permission/nope", json={"optionId": "a"})
        assert vote.status_code == 404 and vote.json()["code"] == "permission_not_found"
        both = client.get(f"/session/{session_id}/transcript",
                          params={"cursor": "x", "beforeRecordId": "y"})
        assert both.status_code == 400 and both.json()["code"] == "invalid_transcript_cursor"
        unknown = client.get(f"/session/{session_id}/transcript", params={"cursor": "zzz"})
        assert unknown.status_code == 400 and unknown.json()["code"] == "invalid_transcript_cursor"


def test_body_too_large_is_413(daemon: RunningDaemon) -> None:
    big = b'{"pad": "' + b"x" * (10 * 1024 * 1024 + 10) + b'"}'
    with httpx.Client(base_url=daemon.url, timeout=30) as client:
        resp = client.post("/session", content=big, headers={"Content-Type": "application/json"})
    assert resp.status_code == 413
    assert resp.json() == {"error": "Request body too large (max 10 MB)", "code": "body_too_large"}


def test_oversized_headers_rejected_before_app(daemon: RunningDaemon) -> None:
    host, port = daemon.url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 200_000
                     + b"\r\n\r\n")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    assert data.split(b" ", 2)[1].startswith(b"4")


def test_capabilities_and_status_show_effective_limits(daemon: RunningDaemon,
                                                       session_id: str) -> None:
    with httpx.Client(base_url=daemon.url, timeout=30) as client:
        caps = client.get("/capabilities").json()
        assert caps["v"] == 1 and "session_transcript_pagination" in caps["features"]
        assert caps["limits"]["maxJournalEvents"] == 77
        assert caps["limits"]["maxJournalBytes"] == 8 * 1024 * 1024
        assert caps["limits"]["compactedReplayMaxBytes"] == 4 * 1024 * 1024
        assert caps["limits"]["eventRingSize"] == 8000
        assert "sessionRestoreTimeoutMs" in caps["limits"]
        status = client.get("/daemon/status").json()
        assert status["limits"] == caps["limits"]
        mine = [s for s in status["sessions"] if s["sessionId"] == session_id]
        assert mine and {"journalEntries", "journalBytes", "subscribers"} <= set(mine[0])
        sstatus = client.get(f"/session/{session_id}/status").json()
        for key in ("sessionId", "hasActivePrompt", "pendingPrompts", "lastEventId",
                    "durableEventId", "eventEpoch", "transcriptDegraded"):
            assert key in sstatus


def test_subscriber_cap_is_429(daemon: RunningDaemon) -> None:
    host, port = daemon.url.removeprefix("http://").rsplit(":", 1)
    with httpx.Client(base_url=daemon.url, timeout=30) as client:
        sid = client.post("/session", json={"sessionScope": "thread"}).json()["sessionId"]
    socks = []
    try:
        for _ in range(64):
            s = socket.create_connection((host, int(port)), timeout=10)
            s.sendall(f"GET /session/{sid}/events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
            head = b""
            while b"retry: 3000" not in head:
                head += s.recv(4096)
            socks.append(s)
        with httpx.Client(base_url=daemon.url, timeout=30) as client:
            resp = client.get(f"/session/{sid}/events")
        assert resp.status_code == 429
        assert resp.headers["retry-after"] == "5"
        assert resp.json()["code"] == "subscriber_limit_exceeded"
        assert resp.json()["limit"] == 64
    finally:
        for s in socks:
            s.close()


def test_unread_request_bodies_never_stall_keep_alive(daemon: RunningDaemon) -> None:
    """Regression: a handler answering without reading the body (a 404, a GET with a body)
    used to leave the keep-alive connection stalled for the next request."""
    ghost = "00000000-0000-4000-8000-000000000000"
    # A stalled connection never answers; the timeout only bounds how long that takes to show
    # (generous: a busy machine may take seconds over a request, never 20 s).
    with httpx.Client(base_url=daemon.url, timeout=20) as client:
        for _ in range(30):
            for method, path in [("POST", "cancel"), ("GET", "status"), ("GET", "transcript")]:
                resp = client.request(method, f"/session/{ghost}/{path}", json={"x": 1})
                assert resp.status_code == 404


def test_daemon_status_says_when_each_session_was_active_and_on_which_branch(
        daemon: RunningDaemon, tmp_path: Path) -> None:
    """What a session list shows (the viewer's sidebar, `turnkeeper list`): when a session was
    created and last active, the workspace's git branch, and how permissions are answered."""
    repo, plain = tmp_path / "repo", tmp_path / "plain"
    (repo / ".git").mkdir(parents=True)
    (repo / ".git" / "HEAD").write_text("ref: refs/heads/feature/chips\n")
    plain.mkdir()
    with httpx.Client(base_url=daemon.url, timeout=30) as client:
        in_repo = client.post("/session", json={"sessionScope": "thread", "cwd": str(repo)}).json()
        elsewhere = client.post("/session", json={"sessionScope": "thread",
                                                  "cwd": str(plain)}).json()
        status = client.get("/daemon/status").json()
        assert status["approvalMode"] == "default"
        assert status["defaultWorkspace"]["workspaceCwd"] == str(daemon.data_dir.parent)
        assert status["defaultWorkspace"]["gitBranch"] is None
        rows = {s["sessionId"]: s for s in status["sessions"]}
        row = rows[in_repo["sessionId"]]
        assert row["createdAt"] == in_repo["createdAt"]
        assert row["gitBranch"] == "feature/chips"
        assert rows[elsewhere["sessionId"]]["gitBranch"] is None
        before = row["lastActivityAt"]
        assert before >= row["createdAt"]  # ISO 8601 UTC strings order as times do
        assert client.post(f"/session/{in_repo['sessionId']}/prompt", json={"prompt": [
            {"type": "text", "text": "activity mock:chunks=1"}]}).status_code == 202
        deadline = time.monotonic() + 20
        while True:
            row = {s["sessionId"]: s for s in client.get("/daemon/status").json()["sessions"]}[
                in_repo["sessionId"]]
            if not row["hasActivePrompt"] and row["lastEventId"] >= 3:
                break
            assert time.monotonic() < deadline, row
            time.sleep(0.02)  # a bounded status poll
        assert row["lastActivityAt"] > before
        (repo / ".git" / "HEAD").write_text("0123456789abcdef0123456789abcdef01234567\n")
        detached = {s["sessionId"]: s for s in client.get("/daemon/status").json()["sessions"]}
        assert detached[in_repo["sessionId"]]["gitBranch"] is None  # read afresh, detached
