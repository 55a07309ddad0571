"""Pure pieces of the daemon shell: request guards, the slow-client rules, and the restore
helpers (closing interrupted prompts, seeding the replay window)."""

from __future__ import annotations

import itertools

import msgspec

from daemon.core.envelope import decode_json, encode_json, make_event
from daemon.core.guards import Denial, Guard, bearer_token, host_name
from daemon.core.restore import close_interrupted, seed_segments
from daemon.core.ring import EventRing
from daemon.core.subscriber import Eviction, SubscriberState, Warning
from sdk.protocol.http import ErrorBody


def test_host_name_strips_ports() -> None:
    assert host_name("localhost:4170") == "localhost"
    assert host_name("[::1]:80") == "[::1]"
    assert host_name("127.0.0.1") == "127.0.0.1"
    assert host_name("Example.COM") == "example.com"


def test_bearer_token_parsing() -> None:
    assert bearer_token("Bearer abc") == "abc"
    assert bearer_token("bearer   abc ") == "abc"
    assert bearer_token("Basic abc") is None
    assert bearer_token("Bearer") is None
    assert bearer_token(None) is None


def test_guard_order_host_origin_auth() -> None:
    guard = Guard(token="t", loopback_bind=True, bind_hostname="127.0.0.1",
                  allow_origins=frozenset({"http://ok"}))
    bad_host = guard.check("GET", "/x", {"host": "evil:1", "origin": "http://evil"})
    assert bad_host is not None and bad_host.body.code == "invalid_host"
    bad_origin = guard.check("GET", "/x", {"host": "localhost", "origin": "http://evil"})
    assert bad_origin is not None and bad_origin.body.code == "origin_not_allowed"
    no_auth = guard.check("GET", "/x", {"host": "localhost", "origin": "http://ok"})
    assert no_auth is not None and no_auth.status == 401
    assert guard.check("GET", "/x", {"host": "localhost", "authorization": "Bearer t"}) is None
    assert guard.check("GET", "/health", {"host": "localhost"}) is None
    strict = Guard(token="t", loopback_bind=True, bind_hostname="127.0.0.1",
                   allow_origins=frozenset(), require_auth=True)
    assert strict.check("GET", "/health", {"host": "localhost"}) is not None


def test_cors_preflight_skips_auth_only_for_allowed_origins() -> None:
    guard = Guard(token="t", loopback_bind=True, bind_hostname="127.0.0.1",
                  allow_origins=frozenset({"http://ok"}), require_auth=True)
    pre = {"host": "localhost", "origin": "http://ok", "access-control-request-method": "POST"}
    assert guard.check("OPTIONS", "/session", pre) is None
    answer = dict(guard.preflight_headers(pre) or [])
    assert answer[b"access-control-allow-origin"] == b"http://ok"
    assert b"Authorization" in answer[b"access-control-allow-headers"]
    assert answer[b"vary"] == b"Origin"
    # Not a preflight without the request-method header: auth applies.
    plain = {"host": "localhost", "origin": "http://ok"}
    assert guard.check("OPTIONS", "/session", plain) == Denial(
        401, ErrorBody(error="Unauthorized", code="unauthorized"))
    assert guard.preflight_headers(plain) is None
    # A preflight from another origin is refused before auth, and gets no CORS headers.
    evil = {**pre, "origin": "http://evil"}
    denied = guard.check("OPTIONS", "/session", evil)
    assert denied is not None and denied.body.code == "origin_not_allowed"
    assert guard.preflight_headers(evil) is None and guard.cors_headers(evil) == []
    assert guard.cors_headers({"host": "localhost"}) == []
    exposed = dict(guard.cors_headers(plain))[b"access-control-expose-headers"]
    assert b"X-Qwen-Event-Epoch" in exposed and b"Retry-After" in exposed


def ring_with(n: int, size: int = 100) -> EventRing:
    ring = EventRing(capacity=10_000)
    for i in range(1, n + 1):
        event = make_event(i, "x", "p" * size, now_ms=0)
        assert event is not None
        ring.append(event)
    return ring


def test_warning_once_then_rearm_then_evict() -> None:
    state = SubscriberState(cursor=0, max_queued=16)
    assert state.check(ring_with(11)) is None
    first = state.check(ring_with(12))
    assert isinstance(first, Warning) and first.data.threshold == "frames"
    assert first.data.queue_size == 12 and first.data.max_queued == 16
    assert state.check(ring_with(13)) is None  # latched
    state.cursor = 10  # caught up below 37.5%: re-armed
    assert state.check(ring_with(15)) is None
    assert isinstance(state.check(ring_with(22)), Warning)
    evicted = state.check(ring_with(27))
    assert isinstance(evicted, Eviction)
    assert msgspec.to_builtins(evicted.data) == {"reason": "queue_overflow", "droppedAfter": 10, "queueSize": 17,
                            "maxQueued": 16, "queuedBytes": evicted.data.queued_bytes,
                            "maxQueuedBytes": 2 * 1024 * 1024}
    assert state.check(ring_with(1)) is evicted  # sticky


def test_byte_cap_eviction() -> None:
    state = SubscriberState(cursor=0, max_queued=2048, max_queued_bytes=10_000)
    verdict = state.check(ring_with(50, size=300))
    assert isinstance(verdict, Eviction) and verdict.data.reason == "queue_bytes_overflow"


def test_close_interrupted_compacts_the_running_turn() -> None:
    ids = (f"r{i}" for i in itertools.count())
    raws = []
    for i, (kind, text) in enumerate([("user_message_chunk", "hi"),
                                      ("agent_message_chunk", "a"),
                                      ("agent_message_chunk", "b")], start=1):
        event = make_event(i, "session_update", {"sessionId": "s", "update": {
            "sessionUpdate": kind, "content": {"type": "text", "text": text}}},
            now_ms=0, prompt_id="p1")
        assert event is not None
        raws.append(event.raw)
    ops = close_interrupted("s", raws, ["p1", "p2"], now_ms=5, new_record_id=lambda: next(ids))
    assert [(op.prompt_id, op.terminal) for op in ops] == [("p1", "interrupted"),
                                                          ("p2", "interrupted")]
    first = [decode_json(raw) for _, raw in ops[0].records]
    assert [e["type"] for e in first] == ["session_update", "session_update", "turn_error"]
    assert first[1]["data"]["update"]["content"]["text"] == "ab"
    assert first[2]["data"] == {"sessionId": "s", "message": "Prompt interrupted by daemon "
                                "restart", "code": "interrupted", "promptId": "p1"}
    assert first[1]["data"]["update"]["_meta"]["qwen.session.recordId"] == "r1"
    second = [decode_json(raw) for _, raw in ops[1].records]
    assert [e["type"] for e in second] == ["turn_error"]
    assert second[0]["data"]["promptId"] == "p2"


def test_close_interrupted_without_prompts_keeps_between_turn_events() -> None:
    event = make_event(1, "session_update", {"sessionId": "s", "update": {
        "sessionUpdate": "available_commands_update", "availableCommands": []}}, now_ms=0)
    assert event is not None
    ops = close_interrupted("s", [event.raw], [], now_ms=0, new_record_id=lambda: "r")
    assert len(ops) == 1 and ops[0].prompt_id is None
    assert [decode_json(raw)["type"] for _, raw in ops[0].records] == ["session_update"]
    assert close_interrupted("s", [], [], now_ms=0, new_record_id=lambda: "r") == []


def test_seed_segments_assigns_fresh_ids() -> None:
    turns = [[("a", encode_json({"id": 40, "v": 1, "type": "t", "data": 1})),
              ("b", encode_json({"id": 41, "v": 1, "type": "t", "data": 2}))],
             [("c", encode_json({"v": 1, "type": "t", "data": 3})), ("bad", b"{not json")]]
    segments, next_id = seed_segments(turns, 1)
    assert next_id == 4
    assert [[(r.event.id, r.record_id) for r in seg] for seg in segments] == [
        [(1, "a"), (2, "b")], [(3, "c")]]
    assert decode_json(segments[0][0].event.raw)["id"] == 1
