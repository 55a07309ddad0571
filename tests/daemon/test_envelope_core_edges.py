"""Envelope details pinned down by mutation testing: the fields an Event reads from its
envelope, the exact shape of id-less transport frames, and where SSE batches are cut."""

from __future__ import annotations

import msgspec

from daemon.core.envelope import Event, make_event, synthetic
from daemon.core.frame_codec import sse_chunks


def test_event_reads_id_type_and_prompt_id_from_its_envelope() -> None:
    env = {"id": 4, "v": 1, "type": "turn_complete", "promptId": "p-1", "data": {}}
    event = Event.from_env(env)
    assert (event.id, event.type, event.prompt_id) == (4, "turn_complete", "p-1")
    # Before release the envelope is the caller's dict, not a re-decoded copy.
    assert event.env is env
    assert msgspec.json.decode(event.raw) == env


def test_event_ignores_ids_and_prompt_ids_of_the_wrong_type() -> None:
    event = Event.from_env({"id": "4", "v": 1, "type": "x", "promptId": 7, "data": None})
    assert event.id is None
    assert event.prompt_id is None
    assert Event.from_env({"v": 1, "type": "x", "data": None}).prompt_id is None


def test_make_event_carries_caller_meta() -> None:
    event = make_event(1, "x", {}, now_ms=5, meta={"serverTimestamp": 9, "trace": "t"})
    assert event is not None
    assert msgspec.json.decode(event.raw)["_meta"] == {"serverTimestamp": 9, "trace": "t"}


def test_synthetic_frame_shape() -> None:
    bare = synthetic("replay_complete", {"replayedCount": 3})
    assert msgspec.json.decode(bare.raw) == {
        "v": 1, "type": "replay_complete", "data": {"replayedCount": 3}}
    assert bare.id is None and bare.prompt_id is None
    full = synthetic("stream_error", {"code": "x"}, now_ms=77, prompt_id="p")
    assert msgspec.json.decode(full.raw) == {
        "v": 1, "type": "stream_error", "data": {"code": "x"}, "promptId": "p",
        "_meta": {"serverTimestamp": 77}}
    assert full.env == msgspec.json.decode(full.raw)
    assert full.prompt_id == "p"


def _events(n: int) -> list[Event]:
    return [Event.from_env({"id": i, "v": 1, "type": "x", "data": "y" * 200}) for i in range(10, 10 + n)]


def test_sse_batch_is_cut_when_sizes_plus_64_per_frame_reach_max_chunk() -> None:
    events = _events(12)
    assert len({e.size for e in events}) == 1
    estimate = events[0].size + 64  # the per-frame allowance for the id/event/data lines
    frames = [e.sse_frame for e in events]
    # Exactly three frames' estimate: each batch closes at three frames.
    chunks = sse_chunks(events, max_chunk=3 * estimate)
    assert chunks == [b"".join(frames[i:i + 3]) for i in range(0, 12, 3)]
    # One byte more: the third frame no longer reaches it, the fourth does.
    chunks = sse_chunks(events, max_chunk=3 * estimate + 1)
    assert chunks == [b"".join(frames[i:i + 4]) for i in range(0, 12, 4)]


def test_sse_chunks_of_nothing_is_no_write() -> None:
    assert sse_chunks([]) == []
