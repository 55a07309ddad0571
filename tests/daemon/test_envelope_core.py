"""The envelope core: one encoding per event, released dicts decoded on demand, SSE frames,
and response bodies spliced from pre-encoded items."""

from __future__ import annotations

import math

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from daemon.core.envelope import (
    Event,
    build_envelope,
    make_event,
    spliced_parts,
    synthetic,
    write_groups,
)
from daemon.core.frame_codec import sse_chunks, sse_frames
from sdk.protocol import http as wire


def test_make_event_encodes_once_and_sizes_by_encoding() -> None:
    event = make_event(7, "session_update", {"sessionId": "s", "update": {
        "sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "hé"}}},
        now_ms=123, prompt_id="p", originator_client_id="c")
    assert event is not None
    assert event.size == len(event.raw)
    assert msgspec.json.decode(event.raw) == {
        "id": 7, "v": 1, "type": "session_update",
        "data": {"sessionId": "s", "update": {"sessionUpdate": "agent_message_chunk",
                                              "content": {"type": "text", "text": "hé"}}},
        "promptId": "p", "originatorClientId": "c", "_meta": {"serverTimestamp": 123}}


def test_server_timestamp_rules() -> None:
    kept = build_envelope(1, "x", {}, now_ms=5, meta={"serverTimestamp": 99.5})
    assert kept["_meta"] == {"serverTimestamp": 99.5}
    for bad in (math.nan, math.inf, True, "9"):
        assert build_envelope(1, "x", {}, now_ms=5, meta={"serverTimestamp": bad}
                              )["_meta"]["serverTimestamp"] == 5
    lifted = build_envelope(1, "session_update", {"update": {"_meta": {"timestamp": 42}}},
                            now_ms=5)
    assert lifted["_meta"] == {"serverTimestamp": 42}
    preferred = build_envelope(1, "session_update", {"update": {"_meta": {
        "timestamp": 42, "serverTimestamp": 43}}}, now_ms=5)
    assert preferred["_meta"] == {"serverTimestamp": 43}
    not_lifted = build_envelope(1, "turn_complete", {"update": {"_meta": {"timestamp": 42}}},
                                now_ms=5)
    assert not_lifted["_meta"] == {"serverTimestamp": 5}


def test_unencodable_event_is_dropped() -> None:
    assert make_event(1, "x", {"bad": object()}, now_ms=0) is None


def test_release_keeps_bytes_and_decodes_on_demand() -> None:
    event = make_event(3, "x", {"a": [1, 2]}, now_ms=0)
    assert event is not None
    env = event.env
    event.release()
    again = event.env
    assert again == env and again is not env
    assert event.id == 3 and event.type == "x"


def test_with_env_reads_the_head_from_the_dict() -> None:
    env = {"id": 4, "v": 1, "type": "session_update", "promptId": "p", "data": {}}
    raw = msgspec.json.encode(env)
    event = Event.with_env(env, raw)
    assert (event.id, event.type, event.prompt_id, event.size, event.raw) == (
        4, "session_update", "p", len(raw), raw)
    assert event.env is env
    # Ids and prompt ids of the wrong type are not taken; a missing type is refused.
    odd = Event.with_env({"id": "4", "type": "x", "promptId": 5}, b"{}")
    assert odd.id is None and odd.prompt_id is None
    for bad in ({"id": 1}, {"type": 3}):
        try:
            Event.with_env(bad, b"{}")
        except TypeError:
            continue
        raise AssertionError(f"{bad} accepted")


def test_events_compare_and_hash_by_identity() -> None:
    # The ring, journals and frame caches hold events as objects: two events with equal
    # fields are still two events (and can be set members).
    a = Event.spliced(b"{}", 1, "x", None)
    b = Event.spliced(b"{}", 1, "x", None)
    assert a != b and a == a
    assert len({a, b}) == 2


def test_one_events_frames_are_its_frame_whatever_its_type() -> None:
    """The wake-up of a paced turn frames one ring event: the same bytes as the event's own
    frame (and as a run of them), for any type."""
    for kind in ("session_update", "turn_complete", "odd%dtype", "odd%btype"):
        events = [Event.from_env({"id": i, "v": 1, "type": kind, "data": "%d %b é"})
                  for i in (7, 8)]
        assert sse_frames(events[:1]) == events[0].sse_frame
        assert sse_frames(events) == events[0].sse_frame + events[1].sse_frame


def test_sse_frames_and_chunks() -> None:
    event = make_event(12, "turn_complete", {"promptId": "p"}, now_ms=0)
    assert event is not None
    assert event.sse_frame == b"id: 12\nevent: turn_complete\ndata: " + event.raw + b"\n\n"
    marker = synthetic("replay_complete", {"replayedCount": 0})
    assert marker.sse_frame == b"event: replay_complete\ndata: " + marker.raw + b"\n\n"
    events = [Event.from_env({"id": i, "v": 1, "type": "x", "data": "y" * 100})
              for i in range(1, 50)]
    chunks = sse_chunks(events, max_chunk=1000)
    assert len(chunks) > 1
    assert b"".join(chunks) == b"".join(e.sse_frame for e in events)


def _load_body(live: list[bytes], compacted: list[bytes], **given: object
               ) -> wire.LoadSessionResponse[bytes]:
    fields: dict[str, object] = {
        "session_id": "s", "workspace_cwd": "/w", "attached": True, "client_id": "c",
        "created_at": "t", "state": {}, "has_active_prompt": False,
        "has_running_background_tasks": False, "last_event_id": 3, "event_epoch": "e",
        **given}
    return wire.LoadSessionResponse[bytes](live_journal=live, compacted_replay=compacted,
                                           **fields)  # type: ignore[arg-type]


def _as_raw(body: msgspec.Struct) -> msgspec.Struct:
    """The same body with each envelope a ``msgspec.Raw``: what msgspec alone encodes."""
    return msgspec.structs.replace(body, **{
        name: [msgspec.Raw(item) for item in value]
        for name in body.__struct_fields__
        if type(value := getattr(body, name)) is list and value and type(value[0]) is bytes})


def test_spliced_parts_are_the_structs_encoding_with_the_envelopes_spliced_in() -> None:
    items = [msgspec.json.encode({"id": i, "pad": "x" * i}) for i in range(4)]
    for body in (_load_body(items[:3], items[3:]), _load_body([], items),
                 _load_body(items[:1], [], replay_degraded=True, history_has_more=True),
                 wire.TranscriptPage[bytes](session_id="s", has_more=False, events=items),
                 wire.TranscriptPage[bytes](session_id="s", has_more=False, events=[])):
        parts = spliced_parts(body)
        assert b"".join(parts) == msgspec.json.encode(_as_raw(body))
        # The pre-encoded envelopes are in the parts as the same objects: nothing copied them.
        spliced = [item for item in items if any(part is item for part in parts)]
        expected = [item for name in body.__struct_fields__
                    if type(value := getattr(body, name)) is list for item in value]
        assert spliced == expected
    # Members in the Struct's order (wire order), the lists last.
    assert msgspec.json.decode(b"".join(spliced_parts(_load_body(items[:1], items[1:2])))) \
        == {"sessionId": "s", "workspaceCwd": "/w", "attached": True, "clientId": "c",
            "createdAt": "t", "state": {}, "hasActivePrompt": False,
            "hasRunningBackgroundTasks": False, "lastEventId": 3, "eventEpoch": "e",
            "liveJournal": [{"id": 0, "pad": ""}], "compactedReplay": [{"id": 1, "pad": "x"}]}


@given(st.lists(st.integers(min_value=0, max_value=40)), st.integers(min_value=1, max_value=30))
def test_write_groups_keeps_the_bytes_and_copies_only_small_parts(sizes: list[int],
                                                                  min_bytes: int) -> None:
    parts = [bytes([65 + i % 26]) * size for i, size in enumerate(sizes)]
    groups = write_groups(parts, min_bytes)
    assert b"".join(groups) == b"".join(parts)
    big = [p for p in parts if len(p) >= min_bytes]
    # Every large part is written as it is, in order.
    assert [g for g in groups if any(g is p for p in big)] == big
    for i, group in enumerate(groups):
        if any(group is p for p in big):
            continue
        # A joined run stops growing once it reaches min_bytes: it is under twice that, and
        # one below min_bytes is cut short only by a large part or by the end.
        assert 0 < len(group) < 2 * min_bytes
        if len(group) < min_bytes and i + 1 < len(groups):
            assert any(groups[i + 1] is p for p in big)
