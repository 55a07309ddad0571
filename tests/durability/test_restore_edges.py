"""Cold-restore details pinned down by mutation testing: the exact interrupted
terminal, the ledger state each durable terminal stands for, damaged rows, queued prompts, and
seeding with fresh ids."""

from __future__ import annotations

import itertools

import msgspec

from daemon.core.envelope import decode_json, encode_json
from daemon.core.restore import (
    INTERRUPTED_MESSAGE,
    close_interrupted,
    interrupted_terminal,
    seed_segments,
)
from tests.builders.restore import chunk, done, raw


def _ids() -> itertools.count[int]:
    return itertools.count(1)


def test_the_interrupted_terminal() -> None:
    assert INTERRUPTED_MESSAGE == "Prompt interrupted by daemon restart"
    assert msgspec.to_builtins(interrupted_terminal("s", "p", 9)) == {
        "v": 1, "type": "turn_error",
        "data": {"sessionId": "s", "message": INTERRUPTED_MESSAGE, "code": "interrupted",
                 "promptId": "p"},
        "promptId": "p", "_meta": {"serverTimestamp": 9}}


def _close(raws: list[bytes], in_flight: list[str]) -> list[tuple[object, ...]]:
    counter = _ids()
    ops = close_interrupted("s", raws, in_flight, now_ms=7,
                            new_record_id=lambda: f"r{next(counter)}")
    return [(op.session_id, op.prompt_id, op.terminal, op.stop_reason, op.at_ms,
             [(rid, decode_json(body)["type"]) for rid, body in op.records]) for op in ops]


def test_each_durable_terminal_keeps_its_ledger_state() -> None:
    error = raw(3, "turn_error", {"sessionId": "s", "message": "m", "promptId": "p2"}, "p2")
    odd = raw(5, "turn_complete", {"sessionId": "s", "stopReason": 4, "promptId": "p3"}, "p3")
    no_data = raw(6, "turn_complete", None, "p4")  # type: ignore[arg-type]
    assert _close([done(1, "p1", "cancelled"), error, odd, no_data], ["p1", "p2", "p3", "p4"]) == [
        ("s", "p1", "cancelled", "cancelled", 7, [("r1", "turn_complete")]),
        ("s", "p2", "error", None, 7, [("r2", "turn_error")]),
        ("s", "p3", "completed", "end_turn", 7, [("r3", "turn_complete")]),
        ("s", "p4", "completed", "end_turn", 7, [("r4", "turn_complete")]),
    ]


def test_damaged_rows_are_skipped_and_queued_prompts_get_their_terminal() -> None:
    raws = [b"{not json", encode_json([1, 2]), chunk(1, "a", "p1")]
    ops = _close(raws, ["p1", "p0"])
    assert ops == [
        ("s", "p1", "interrupted", None, 7, [("r1", "session_update"), ("r2", "turn_error")]),
        ("s", "p0", "interrupted", None, 7, [("r3", "turn_error")]),
    ]
    counter = _ids()
    (op,) = close_interrupted("s", [], ["p9"], now_ms=3, new_record_id=lambda: f"r{next(counter)}")
    ((record_id, body),) = op.records
    assert record_id == "r1"
    record = decode_json(body)
    assert record["data"] == msgspec.to_builtins(interrupted_terminal("s", "p9", 3)["data"])
    assert record["data"]["code"] == "interrupted"


def test_seeding_skips_unusable_records_and_numbers_the_rest() -> None:
    good = encode_json({"id": 99, "v": 1, "type": "x", "data": 1})
    turns = [
        [("a", good), ("b", b"{bad"), ("c", encode_json([1])), ("d", encode_json({"type": 5})),
         ("e", good)],
        [("f", b"{bad")],  # nothing usable: no segment
        [("g", good)],
    ]
    segments, next_id = seed_segments(turns, 10)
    assert [[(r.record_id, r.event.id) for r in seg] for seg in segments] == [
        [("a", 10), ("e", 11)], [("g", 12)]]
    assert next_id == 13
    first = segments[0][0].event
    assert decode_json(first.raw) == {"id": 10, "v": 1, "type": "x", "data": 1}
    assert first.env == {"id": 10, "v": 1, "type": "x", "data": 1}


def test_between_turn_events_are_all_kept_as_records() -> None:
    tool = raw(2, "session_update", {"sessionId": "s", "update": {
        "sessionUpdate": "tool_call", "toolCallId": "t", "title": "x"}}, "p-old")
    ops = _close([chunk(1, "a", "p-old"), tool], [])
    assert ops == [("s", None, "interrupted", None, 7,
                    [("r1", "session_update"), ("r2", "session_update")])]
