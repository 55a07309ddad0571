"""Hostile HTTP input against the real daemon on loopback.

Every route of ``sdk.protocol.routes.ROUTES`` (which ``test_openapi`` holds against the routes the
daemon really serves) is fuzzed with hypothesis over raw sockets, so nothing is normalised on
the way (httpx would resolve ``..`` and re-encode paths). The contract checked on every case:

- a request the application receives gets a 4xx with a JSON ``{error, code}`` body, or a 2xx
  that is right for its route, or one of the two 5xx the daemon defines (502 agent_start_failed,
  503 prompt_queue_full) — never a 500, never a hang (every socket read has a deadline);
- a request the HTTP server rejects before the application gets a 4xx and a closed connection;
- the daemon stays responsive: a ``GET /health`` probe follows every case.

Requests are sent with ``Connection: close`` and read to EOF, so a connection the server
forgets to close is caught as a hang.
"""

from __future__ import annotations

import base64
import json
import os
import re
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from daemon.core.openapi import body_schema, response_schema
from sdk.protocol.routes import ROUTES, Route
from tests.harness import RunningDaemon, running_daemon
from tests.hypothesis_profiles import examples

pytestmark = pytest.mark.processes  # starts processes: not in make unit-fast

READ_TIMEOUT_S = 10.0
HEARTBEAT = b": heartbeat\n\n"
SPEC_5XX = {(502, "agent_start_failed"), (503, "prompt_queue_full")}
FUZZ = settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --- a raw HTTP/1.1 client -------------------------------------------------------------------


@dataclass
class RawResponse:
    status: int
    headers: dict[str, str]
    body: bytes
    closed: bool  # the server closed the connection after answering

    def json(self) -> Any:
        return json.loads(self.body)


def _address(daemon: RunningDaemon) -> tuple[str, int]:
    host, port = daemon.url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


def request_bytes(daemon: RunningDaemon, method: str, target: str, *,
                  headers: list[tuple[str, bytes]] | None = None,
                  body: bytes | None = None) -> bytes:
    host, port = _address(daemon)
    lines = [f"{method} {target} HTTP/1.1".encode("latin-1"),
             f"Host: {host}:{port}".encode(), b"Connection: close"]
    for name, value in headers or []:
        lines.append(name.encode("latin-1") + b": " + value)
    if body is not None:
        lines.append(b"Content-Length: %d" % len(body))
        lines.append(b"Content-Type: application/json")
    return b"\r\n".join(lines) + b"\r\n\r\n" + (body or b"")


def _parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    parts = status_line.split(" ", 2)
    assert parts[0].startswith("HTTP/1."), status_line
    headers: dict[str, str] = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(parts[1]), headers


def _dechunk(data: bytes) -> bytes:
    out = b""
    while data:
        size_line, _, rest = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out += rest[:size]
        data = rest[size + 2:]
    return out


def exchange(daemon: RunningDaemon, raw: bytes) -> RawResponse:
    """Send ``raw``; read the whole answer. An event stream is read up to its first heartbeat
    (the daemon runs with a short heartbeat): everything it writes before entering its live
    loop (``retry:``, any replay) comes first. Anything else must be followed by the server
    closing the connection."""
    deadline = time.monotonic() + READ_TIMEOUT_S
    with socket.create_connection(_address(daemon), timeout=READ_TIMEOUT_S) as sock:
        try:
            sock.sendall(raw)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed before taking everything; read its answer
        data = b""
        while True:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                raise AssertionError(f"no complete answer within {READ_TIMEOUT_S} s "
                                     f"(got {data[:300]!r}) for {raw[:200]!r}") from None
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                break
            data += chunk
            head, sep, rest = data.partition(b"\r\n\r\n")
            if sep and b"text/event-stream" in head.lower() and HEARTBEAT in rest:
                status, headers = _parse_head(head)
                return RawResponse(status, headers, _dechunk(rest), closed=False)
    head, sep, rest = data.partition(b"\r\n\r\n")
    assert sep, f"connection closed without a full response: {data[:300]!r}"
    status, headers = _parse_head(head)
    if headers.get("transfer-encoding", "").lower() == "chunked":
        rest = _dechunk(rest)
    elif "content-length" in headers and not raw.upper().startswith(b"HEAD "):
        assert len(rest) == int(headers["content-length"]), (headers, len(rest))
    return RawResponse(status, headers, rest, closed=True)


def assert_healthy(daemon: RunningDaemon) -> None:
    resp = exchange(daemon, request_bytes(daemon, "GET", "/health"))
    assert (resp.status, resp.json()) == (200, {"status": "ok"})
    log = daemon.stderr()
    # An exception the application did not turn into a 4xx is logged with a traceback.
    assert "event=internal_error" not in log and "Traceback" not in log, log[-4000:]


def assert_error_body(resp: RawResponse) -> dict[str, Any]:
    assert resp.headers.get("content-type", "").startswith("application/json"), resp
    payload = resp.json()
    assert isinstance(payload, dict), payload
    assert isinstance(payload.get("error"), str) and payload["error"], payload
    assert isinstance(payload.get("code"), str) and payload["code"], payload
    return payload


def assert_app_answer(resp: RawResponse, method: str, route: Route | None) -> None:
    """The application's answer: a well-formed error, a defined 5xx, or a right 2xx."""
    method = method.upper()  # Hypercorn hands the app the method upper-cased
    assert resp.status != 500, resp
    assert resp.closed, "a non-stream answer must end with the connection closed"
    if resp.status >= 400:
        if method == "HEAD":
            assert resp.body == b""
            return
        payload = assert_error_body(resp)
        if resp.status >= 500:
            assert (resp.status, payload["code"]) in SPEC_5XX, payload
        else:
            assert 400 <= resp.status < 500
        return
    assert 200 <= resp.status < 300, resp
    assert route is not None and method in (route.method, "HEAD"), (method, route, resp)
    assert resp.status == route.status, (route.operation_id, resp)
    schema = response_schema(route)
    if schema is None or method == "HEAD":
        assert resp.body == b""
        return
    if route.media_type != "application/json":  # GET /metrics: Prometheus' text format
        assert resp.headers.get("content-type", "").startswith(route.media_type), resp
        return
    payload = resp.json()
    for key in schema.get("required", ()):
        assert key in payload, (route.operation_id, key, payload)


# --- fixtures --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    env = {"MOCK_ACP_PROMPT_DELAY_MS": "0", "MOCK_ACP_EMIT_CHUNKS": "1"}
    # A short heartbeat marks where a stream's replay ends and its live loop begins.
    with running_daemon(tmp_path_factory.mktemp("fuzz"), ["--heartbeat-ms", "50"],
                        env=env) as d:
        yield d


def new_session(daemon: RunningDaemon) -> str:
    resp = exchange(daemon, request_bytes(daemon, "POST", "/session",
                                          body=b'{"sessionScope": "thread"}'))
    assert resp.status == 200, resp
    return str(resp.json()["sessionId"])


@pytest.fixture(scope="module")
def session_id(daemon: RunningDaemon) -> str:
    return new_session(daemon)


@pytest.fixture(scope="module")
def idle_session_id(daemon: RunningDaemon) -> str:
    """A session nobody prompts: its streams carry no live frames before the heartbeat."""
    return new_session(daemon)


def expand(route: Route, session_id: str, request_id: str = "req-1") -> str:
    return route.path.replace("{sessionId}", session_id).replace("{requestId}", request_id)


# --- strategies ------------------------------------------------------------------------------

# Field names each route reads, plus fields nobody reads (they must be ignored).
FIELDS = ["cwd", "sessionId", "sessionScope", "historyPageSize", "liveReplayMode", "prompt",
          "deadlineMs", "optionId", "outcome", "modelServiceId", "__proto__", "constructor"]
NUMBER_LITERALS = [b"1e308", b"-1e308", b"1e309", b"-1e999", b"-0", b"-0.0", b"0.1e-400",
                   str(2**70).encode(), str(-(2**70)).encode(), b"9007199254740993",
                   b"1" * 5000, b"NaN", b"Infinity", b"-Infinity", b"0x10", b"+1", b"01"]
DEEP = 10_000
DEEP_BODIES = [b"[" * DEEP + b"]" * DEEP, b'{"a":' * DEEP + b"1" + b"}" * DEEP,
               b'{"prompt": ' + b"[" * DEEP + b"]" * DEEP + b"}",
               b'{"cwd": ' + b'{"x":' * DEEP + b"1" + b"}" * DEEP + b"}"]
NON_OBJECT_BODIES = [b"", b" ", b"null", b"[]", b"1", b'"x"', b"true", b"{", b"}", b'{"a"}',
                     b'{"cwd": "\xff\xfe"}', b"\xef\xbb\xbf{}", b'{"a": "\\ud800"}',
                     b"{}{}", b'{"cwd": "/a"} trailing', b"\x00", b'{"\x00": 1}']

json_leaf = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**80), max_value=2**80),
                      st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=12))
json_value = st.recursive(json_leaf, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=8)
content_block = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "image", "", "resource"])},
    optional={"text": st.text(max_size=20), "data": json_value})
# Paths that exist nowhere (spawning there fails: 502), are not absolute, or are not strings.
cwd_value = st.one_of(st.sampled_from(["", "relative/dir", "./x", "~", "/\x00", "C:\\x",
                                       "/nonexistent-turnkeeper-dir/a", "/" + "a" * 5000]),
                      json_value)


@st.composite
def field_value(draw: st.DrawFn, name: str) -> bytes:
    choice = draw(st.integers(0, 3))
    if choice == 0:
        return draw(st.sampled_from(NUMBER_LITERALS))
    if name == "cwd":
        return json.dumps(draw(cwd_value)).encode()
    if name == "prompt" and choice == 1:
        return json.dumps(draw(st.lists(content_block, max_size=3))).encode()
    return json.dumps(draw(json_value)).encode()


@st.composite
def hostile_body(draw: st.DrawFn) -> bytes | None:
    kind = draw(st.integers(0, 9))
    if kind == 0:
        return None
    if kind == 1:
        return draw(st.sampled_from(DEEP_BODIES))
    if kind == 2:
        return draw(st.sampled_from(NON_OBJECT_BODIES))
    if kind == 3:
        return draw(st.binary(max_size=64))
    names = draw(st.lists(st.sampled_from(FIELDS), max_size=4, unique=True))
    items = [json.dumps(name).encode() + b":" + draw(field_value(name)) for name in names]
    return b"{" + b",".join(items) + b"}"


header_text = st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0xFF),
                      max_size=40).map(lambda s: s.encode("latin-1"))
client_id_header = st.one_of(
    st.none(), header_text,
    st.sampled_from([b"ok-client", b"a" * 129, b"client_../x", b"\xff\xfe"]))


@st.composite
def hostile_id(draw: st.DrawFn) -> str:
    """A session id path segment, already in request-target form (ASCII, no spaces)."""
    kind = draw(st.integers(0, 2))
    if kind == 0:
        return draw(st.sampled_from([
            "..", ".", "%2e%2e", "%2E%2E%2F..%2Fhealth", "..%2F..%2Fhealth", "%2F", "a%2Fb",
            "a%2fevents", "%00", "a%00b", "%ff%fe", "%C0%AE%C0%AE", "%", "%zz", "%25",
            "~", "*", "", "x" * 4000, "%F0%9F%98%80" * 50, "00000000-0000-4000-8000-000000000000",
            "..;", "%5C..%5C", "\\..\\", "session", "?", "#frag",
        ]))
    if kind == 1:
        return quote(draw(st.text(min_size=1, max_size=60)), safe="")
    return draw(st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E,
                                               exclude_characters="/?#%"), min_size=1,
                        max_size=60))


METHODS = ["GET", "POST", "DELETE", "PUT", "PATCH", "OPTIONS", "HEAD", "TRACE", "PROPFIND",
           "FOO", "get", "M-SEARCH", "X" * 64]


# --- the fuzz tests --------------------------------------------------------------------------


@pytest.mark.parametrize("route", ROUTES, ids=[r.operation_id for r in ROUTES])
@settings(FUZZ, max_examples=examples(30))
@example(body=DEEP_BODIES[0], client_id=None, request_id="r")
@example(body=DEEP_BODIES[1], client_id=None, request_id="r")
@given(body=hostile_body(), client_id=client_id_header, request_id=hostile_id())
def test_every_route_survives_hostile_bodies(daemon: RunningDaemon, session_id: str,
                                            route: Route, body: bytes | None,
                                            client_id: bytes | None, request_id: str) -> None:
    sid = new_session(daemon) if route.operation_id == "deleteSession" else session_id
    headers = [("X-Qwen-Client-Id", client_id)] if client_id is not None else []
    raw = request_bytes(daemon, route.method, expand(route, sid, request_id), headers=headers,
                        body=body)
    resp = exchange(daemon, raw)
    if route.operation_id == "events" and resp.status == 200:
        assert resp.headers["content-type"] == "text/event-stream"
        assert resp.body.startswith(b"retry: 3000\n\n")
        assert b"replay_complete" not in resp.body  # no cursor: live only
    else:
        assert_app_answer(resp, route.method, route)
    if body in DEEP_BODIES[:2] and body_schema(route) is not None and client_id is None:
        # 10,000 levels: refused as invalid JSON, not a recursion crash.
        assert (resp.status, resp.json()["code"]) == (400, "invalid_json")
    assert_healthy(daemon)


@settings(FUZZ, max_examples=examples(200))
@given(route=st.sampled_from(ROUTES), method=st.sampled_from(METHODS), sid=hostile_id(),
       body=st.one_of(st.none(), st.sampled_from(NON_OBJECT_BODIES)))
def test_path_tricks_and_unknown_methods_get_json_4xx(daemon: RunningDaemon, route: Route,
                                                      method: str, sid: str,
                                                      body: bytes | None) -> None:
    target = expand(route, sid, sid)
    resp = exchange(daemon, request_bytes(daemon, method, target, body=body))
    assert_app_answer(resp, method, route)
    if resp.status < 400:
        # A hostile id never names a live session or a pending permission request.
        assert "{sessionId}" not in route.path, resp
    elif method.upper() not in ("GET", "POST", "DELETE", "HEAD"):
        code = resp.json()["code"]
        assert code in ("method_not_allowed", "route_not_found", "session_not_found"), code
    assert_healthy(daemon)


def _decimal(text: str, limit: int) -> int | None:
    if not (0 < len(text) <= 64 and text.isascii() and text.isdigit()):
        return None
    value = int(text)
    return value if value <= limit else None


def expected_cursor(raw: bytes | None, *, header_mode: bool) -> int | None:
    """The resume cursor rules as the request carries them: headers arrive latin-1 with
    surrounding blanks stripped by the parser; query values are percent-decoded UTF-8, and an
    empty one counts as absent."""
    if raw is None:
        return None
    if header_mode:
        return _decimal(raw.decode("latin-1").strip(" \t"), 2**53 - 1)
    return _decimal(raw.decode("utf-8", errors="replace"), 2**53 - 1)


def expected_epoch(raw: bytes | None, *, header_mode: bool) -> str | None:
    if raw is None:
        return None
    text = raw.decode("latin-1").strip(" \t") if header_mode else raw.decode(
        "utf-8", errors="replace")
    return text if re.fullmatch(r"[A-Za-z0-9_-]{1,64}", text) else None


def max_queued_ok(raw: str | None) -> bool:
    if not raw:  # absent, or empty (dropped by the query parser): the default
        return True
    value = _decimal(raw, 2048)
    return value is not None and value >= 16


cursor_text = st.one_of(
    header_text,
    st.sampled_from([b"0", b"1", b"-1", b"1e3", b"9007199254740991", b"9007199254740992",
                     b"0x10", b" 5", b"00000000000000000000000001", b"\xb2", b"9" * 5000,
                     b"18446744073709551616", b"\xd9\xa3", b"\xc2\xb2", b""]))
epoch_text = st.one_of(header_text, st.sampled_from([b"a" * 64, b"a" * 65, b"x-y_z", b"\xff"]))
max_queued_text = st.one_of(st.text(max_size=8), st.sampled_from(
    ["16", "2048", "15", "2049", "0256", "\u00b2", "\u0663\u0660", "9" * 5000, "1e2", "-16", ""]))


@FUZZ
@example(last_event_id=b"0", epoch=b"x-y_z", max_queued=None, via_query=False)
@example(last_event_id=b"0000", epoch=None, max_queued="2048", via_query=True)
@example(last_event_id=b"\xb2", epoch=None, max_queued=None, via_query=False)
@example(last_event_id=b"\xc2\xb2", epoch=None, max_queued=None, via_query=True)
@example(last_event_id=b"9" * 5000, epoch=None, max_queued="\u00b2", via_query=False)
@example(last_event_id=b"7", epoch=b"\xff", max_queued="9" * 5000, via_query=True)
@given(last_event_id=st.one_of(st.none(), cursor_text), epoch=st.one_of(st.none(), epoch_text),
       max_queued=st.one_of(st.none(), max_queued_text), via_query=st.booleans())
def test_event_stream_cursor_garbage(daemon: RunningDaemon, idle_session_id: str,
                                     last_event_id: bytes | None, epoch: bytes | None,
                                     max_queued: str | None, via_query: bool) -> None:
    headers: list[tuple[str, bytes]] = []
    query: list[str] = []
    if via_query:
        if last_event_id is not None:
            query.append("lastEventId=" + quote(last_event_id, safe=""))
        if epoch is not None:
            query.append("epoch=" + quote(epoch, safe=""))
    else:
        if last_event_id is not None:
            headers.append(("Last-Event-ID", last_event_id))
        if epoch is not None:
            headers.append(("X-Qwen-Event-Epoch", epoch))
    if max_queued is not None:
        query.append("maxQueued=" + quote(max_queued, safe=""))
    target = f"/session/{idle_session_id}/events" + ("?" + "&".join(query) if query else "")
    resp = exchange(daemon, request_bytes(daemon, "GET", target, headers=headers))
    if not max_queued_ok(max_queued):
        assert resp.status == 400 and assert_error_body(resp)["code"] == "invalid_max_queued"
        assert_healthy(daemon)
        return
    assert resp.status == 200, resp
    assert resp.headers["content-type"] == "text/event-stream"
    assert re.fullmatch(r"[0-9a-f-]{36}", resp.headers["x-qwen-event-epoch"])
    # Headers win as soon as either is present.
    cursor = expected_cursor(last_event_id, header_mode=not via_query)
    if cursor is None:
        assert resp.body == b"retry: 3000\n\n" + HEARTBEAT, resp.body[:300]  # live only
    else:
        # A cursor replays (possibly nothing; a cursor past the end resyncs first) and always
        # ends the replay with replay_complete, before the live loop's first heartbeat.
        assert resp.body.startswith(b"retry: 3000\n\n")
        frames = resp.body.removesuffix(HEARTBEAT)
        assert frames.endswith(b"\n\n") and b"event: replay_complete\n" in frames
        # On an empty ring any cursor past 0 is in the future, and any valid epoch differs.
        resync = cursor > 0 or expected_epoch(epoch, header_mode=not via_query) is not None
        assert (b"event: state_resync_required\n" in frames) == resync, frames
    assert_healthy(daemon)


transcript_text = st.one_of(st.text(max_size=16), st.sampled_from(
    ["0", "1", "500", "501", "0100", "\u00b2", "\u0663", "9" * 5000, "-1", "1e2", "",
     "tc1.", "tc1.////", "tc1.gA", "tc1." + "A" * 400, "\x00"]))


@settings(FUZZ, max_examples=examples(100))
@example(limit="\u00b2", cursor=None, before=None)
@example(limit="9" * 5000, cursor=None, before=None)
@example(limit=None, cursor="tc1.gA", before=None)
@given(limit=st.one_of(st.none(), transcript_text), cursor=st.one_of(st.none(), transcript_text),
       before=st.one_of(st.none(), transcript_text))
def test_transcript_query_garbage(daemon: RunningDaemon, session_id: str, limit: str | None,
                                  cursor: str | None, before: str | None) -> None:
    query = [f"{name}={quote(value, safe='')}" for name, value in
             (("limit", limit), ("cursor", cursor), ("beforeRecordId", before))
             if value is not None]
    target = f"/session/{session_id}/transcript" + ("?" + "&".join(query) if query else "")
    resp = exchange(daemon, request_bytes(daemon, "GET", target))
    route = next(r for r in ROUTES if r.operation_id == "transcript")
    assert_app_answer(resp, "GET", route)
    if limit is not None and (_decimal(limit, 500) is None or int(limit) < 1):
        assert (resp.status, resp.json()["code"]) == (400, "invalid_transcript_limit")
    elif cursor is not None and before is not None:
        assert (resp.status, resp.json()["code"]) == (400, "invalid_transcript_cursor")
    elif resp.status != 200:
        assert (resp.status, resp.json()["code"]) == (400, "invalid_transcript_cursor")
    assert_healthy(daemon)


def ws_exchange(daemon: RunningDaemon, target: str) -> RawResponse:
    """A WebSocket upgrade: a 101 is read up to its head; a refusal must close the socket."""
    key = base64.b64encode(os.urandom(16))
    raw = request_bytes(daemon, "GET", target, headers=[
        ("Upgrade", b"websocket"), ("Sec-WebSocket-Key", key),
        ("Sec-WebSocket-Version", b"13")]).replace(b"Connection: close", b"Connection: Upgrade")
    with socket.create_connection(_address(daemon), timeout=READ_TIMEOUT_S) as sock:
        sock.sendall(raw)
        data = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                raise AssertionError(f"no complete answer to {raw[:200]!r}: {data!r}") from None
            if not chunk:
                break
            data += chunk
            head, sep, _ = data.partition(b"\r\n\r\n")
            if sep and head.startswith(b"HTTP/1.1 101"):
                status, headers = _parse_head(head)
                return RawResponse(status, headers, b"", closed=False)
    head, sep, rest = data.partition(b"\r\n\r\n")
    assert sep, data
    status, headers = _parse_head(head)
    return RawResponse(status, headers, rest, closed=True)


@settings(FUZZ, max_examples=examples(100))
@given(sid=st.one_of(st.none(), hostile_id()),
       query=st.lists(st.tuples(st.sampled_from(["maxQueued", "lastEventId", "epoch", "x"]),
                                st.text(max_size=12)), max_size=3))
def test_websocket_upgrades_with_hostile_input(daemon: RunningDaemon, idle_session_id: str,
                                               sid: str | None,
                                               query: list[tuple[str, str]]) -> None:
    """Refusals of an upgrade are plain HTTP answers with the JSON body."""
    live = sid is None
    target = f"/session/{idle_session_id if live else sid}/ws"
    if query:
        target += "?" + "&".join(f"{k}={quote(v, safe='')}" for k, v in query)
    resp = ws_exchange(daemon, target)
    max_queued = [v for k, v in query if k == "maxQueued" and v]
    if not live:
        assert resp.status == 404 and resp.closed, resp
        assert assert_error_body(resp)["code"] in ("session_not_found", "route_not_found")
    elif max_queued and not max_queued_ok(max_queued[-1]):
        assert resp.status == 400 and resp.closed, resp
        assert assert_error_body(resp)["code"] == "invalid_max_queued"
    else:
        assert resp.status == 101, resp
        assert re.fullmatch(r"[0-9a-f-]{36}", resp.headers["x-qwen-event-epoch"])
    assert_healthy(daemon)


# --- what the HTTP server rejects before the application --------------------------------------

SERVER_LEVEL = {
    "garbage request line": b"GARBAGE\r\n\r\n",
    "missing target": b"GET\r\n\r\n",
    "space in header name": b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nBad Name: y\r\n\r\n",
    "empty header name": b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n: v\r\n\r\n",
    "non-ascii target": b"GET /session/\xc3\xa9/status HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
    "NUL in header": b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-A: a\x00b\r\n\r\n",
    "bad content-length": b"POST /session HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                          b"Content-Length: abc\r\n\r\n",
    "negative content-length": b"POST /session HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                               b"Content-Length: -1\r\n\r\n",
    "bad chunk size": b"POST /session HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                      b"Transfer-Encoding: chunked\r\n\r\nzz\r\n",
    "oversized header": b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: "
                        + b"a" * 100_000 + b"\r\n\r\n",
    "many headers": b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    + b"".join(b"X-H%d: v\r\n" % i for i in range(12_000)) + b"\r\n",
    "oversized request line": b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    "two content-lengths": b"POST /session HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                           b"Content-Length: 1\r\nContent-Length: 2\r\n\r\nab",
}


@pytest.mark.parametrize("raw", list(SERVER_LEVEL.values()), ids=list(SERVER_LEVEL))
def test_server_level_rejections_are_4xx_and_close(daemon: RunningDaemon, raw: bytes) -> None:
    resp = exchange(daemon, raw)
    assert 400 <= resp.status < 500, resp
    assert resp.closed
    assert_healthy(daemon)


def test_connection_close_is_honoured_for_app_answers(daemon: RunningDaemon,
                                                      session_id: str) -> None:
    """Quart-Trio used to cancel Hypercorn's socket close: a ``Connection: close`` (or
    HTTP/1.0) request got its answer but the connection stayed open until the client left."""
    cases = [request_bytes(daemon, "GET", "/health"),
             request_bytes(daemon, "POST", f"/session/{session_id}/heartbeat"),
             request_bytes(daemon, "PUT", "/session"),
             b"GET /capabilities HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n"]
    for raw in cases:
        resp = exchange(daemon, raw)  # reads to EOF: a kept-open socket is a hang
        assert resp.closed and resp.status in (200, 405), resp


def test_half_sent_requests_do_not_block_others(daemon: RunningDaemon) -> None:
    """Slow or stalled clients (half a request line, headers without the blank line, a body
    shorter than its Content-Length) hold only their own connection."""
    partials = [b"GET /hea", b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n",
                b"POST /session HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{"]
    socks = [socket.create_connection(_address(daemon), timeout=READ_TIMEOUT_S)
             for _ in partials]
    try:
        for sock, raw in zip(socks, partials, strict=True):
            sock.sendall(raw)
        for _ in range(3):
            assert_healthy(daemon)
        sid = new_session(daemon)
        resp = exchange(daemon, request_bytes(daemon, "GET", f"/session/{sid}/status"))
        assert resp.status == 200 and resp.json()["sessionId"] == sid
    finally:
        for sock in socks:
            sock.close()
    assert_healthy(daemon)
