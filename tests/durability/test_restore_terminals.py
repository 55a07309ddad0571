"""Restore's pure half (``daemon.core.restore.close_interrupted``): a turn whose terminal event is
durable is closed with that terminal, never relabelled ``interrupted``; only a turn whose
terminal truly did not commit gets the ``interrupted`` terminal."""

from __future__ import annotations

import itertools

from daemon.core.envelope import decode_json
from daemon.core.restore import close_interrupted
from tests.builders.restore import chunk, done, raw


def test_a_durable_terminal_keeps_its_turn_completed() -> None:
    # The terminal committed; the turn boundary after it (FinishTurn) did not.
    ids = (f"r{i}" for i in itertools.count())
    raws = [chunk(1, "a", "p1"), chunk(2, "b", "p1"), done(3, "p1")]
    ops = close_interrupted("s", raws, ["p1"], now_ms=7, new_record_id=lambda: next(ids))
    assert [(op.prompt_id, op.terminal, op.stop_reason) for op in ops] == [
        ("p1", "completed", "end_turn")]
    records = [decode_json(r) for _, r in ops[0].records]
    assert [e["type"] for e in records] == ["session_update", "turn_complete"]
    assert records[0]["data"]["update"]["content"]["text"] == "ab"
    assert all(e["data"].get("code") != "interrupted" for e in records)


def test_turns_in_raw_events_close_in_order_each_with_one_terminal() -> None:
    # Raw events left by an older writer: p1 ended (cancelled), p2 ended in an error, p3 was
    # cut, p4 was queued and never ran.
    ids = (f"r{i}" for i in itertools.count())
    raws = [chunk(1, "x", "p1"), done(2, "p1", "cancelled"),
            chunk(3, "y", "p2"),
            raw(4, "turn_error", {"sessionId": "s", "message": "m", "code": "-32603",
                                  "promptId": "p2"}, "p2"),
            chunk(5, "z", "p3")]
    ops = close_interrupted("s", raws, ["p1", "p2", "p3", "p4"], now_ms=7,
                            new_record_id=lambda: next(ids))
    assert [(op.prompt_id, op.terminal) for op in ops] == [
        ("p1", "cancelled"), ("p2", "error"), ("p3", "interrupted"), ("p4", "interrupted")]
    terminals = [[decode_json(r) for _, r in op.records][-1] for op in ops]
    assert [t["type"] for t in terminals] == ["turn_complete", "turn_error", "turn_error",
                                              "turn_error"]
    assert [t["data"].get("code") for t in terminals] == [None, "-32603", "interrupted",
                                                          "interrupted"]
    assert [t["data"]["promptId"] for t in terminals] == ["p1", "p2", "p3", "p4"]
    texts = [decode_json(op.records[0][1]) for op in ops[:3]]
    assert [t["data"]["update"]["content"]["text"] for t in texts] == ["x", "y", "z"]


def test_a_terminal_twice_is_used_once() -> None:
    ids = (f"r{i}" for i in itertools.count())
    raws = [chunk(1, "a", "p1"), done(2, "p1"), done(3, "p1")]
    ops = close_interrupted("s", raws, ["p1"], now_ms=7, new_record_id=lambda: next(ids))
    assert (ops[0].prompt_id, ops[0].terminal) == ("p1", "completed")
    all_terminals = [decode_json(r) for op in ops for _, r in op.records
                     if decode_json(r)["type"] in ("turn_complete", "turn_error")]
    assert len([t for t in all_terminals if t["data"]["promptId"] == "p1"]) == 1
