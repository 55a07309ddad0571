"""TurnCompactor and stamp_record."""

from __future__ import annotations

import copy
from collections import defaultdict
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from daemon.core.compactor import stamp_record
from daemon.core.envelope import JsonObject
from tests.builders.compactor import CID, PID, SID, Feed, kinds, text_of, upd


def test_top_level_chunks_merge_into_one_slot_with_last_id_and_meta() -> None:
    feed = Feed()
    echo = feed.update(
        {
            "sessionUpdate": "user_message_chunk",
            "content": {"type": "text", "text": "say hi"},
            "_meta": {"serverTimestamp": 5, "source": "bridge-echo"},
        }
    )
    feed.chunk("Hello")
    feed.chunk(" from")
    feed.chunk(" fake")
    last = feed.chunk("", meta={"usage": {"outputTokens": 3}, "durationMs": 277})
    out = feed.finish()
    assert kinds(out) == ["user_message_chunk", "agent_message_chunk", "turn_complete"]
    assert out[0] == echo.env
    merged = out[1]
    assert merged["id"] == last.id == 5
    assert merged["_meta"] == last.env["_meta"]
    assert merged["promptId"] == PID and merged["originatorClientId"] == CID
    assert merged["data"]["sessionId"] == SID
    assert upd(merged) == {
        "sessionUpdate": "agent_message_chunk",
        "content": {"type": "text", "text": "Hello from fake"},
        "_meta": {"usage": {"outputTokens": 3}, "durationMs": 277},
    }
    assert out[2]["type"] == "turn_complete" and out[2]["id"] == 6


def test_update_meta_is_shallow_merged_later_wins_and_omitted_when_empty() -> None:
    feed = Feed()
    feed.chunk("a", meta={"timestamp": 1, "x": "first"})
    feed.chunk("b")
    feed.chunk("c", meta={"timestamp": 2, "y": True})
    feed.chunk("d", kind="agent_thought_chunk")
    feed.chunk("e", kind="agent_thought_chunk")
    out = feed.finish()
    assert upd(out[0])["_meta"] == {"timestamp": 2, "x": "first", "y": True}
    assert text_of(out[0]) == "abc"
    assert "_meta" not in upd(out[1])
    assert text_of(out[1]) == "de"


def test_message_and_thought_chunks_do_not_merge_with_each_other() -> None:
    feed = Feed()
    feed.chunk("t1", kind="agent_thought_chunk")
    feed.chunk("m1")
    feed.chunk("t2", kind="agent_thought_chunk")
    feed.chunk("t3", kind="agent_thought_chunk")
    out = feed.finish()
    assert [(kinds([e])[0], text_of(e)) for e in out[:-1]] == [
        ("agent_thought_chunk", "t1"),
        ("agent_message_chunk", "m1"),
        ("agent_thought_chunk", "t2t3"),
    ]


def test_prompt_and_originator_come_from_latest_chunk_that_had_them() -> None:
    feed = Feed()
    feed.chunk("a", prompt_id="p-old", originator="c-old")
    feed.chunk("b", prompt_id="p-new", originator="c-new")
    last = feed.chunk("c", prompt_id=None, originator=None)
    out = feed.finish()
    assert text_of(out[0]) == "abc"
    assert out[0]["id"] == last.id
    assert out[0]["promptId"] == "p-new"
    assert out[0]["originatorClientId"] == "c-new"


def test_chunks_without_any_prompt_id_emit_none() -> None:
    feed = Feed()
    feed.chunk("a", prompt_id=None, originator=None)
    feed.chunk("b", prompt_id=None, originator=None)
    out = feed.finish()
    assert "promptId" not in out[0] and "originatorClientId" not in out[0]


def test_top_level_merge_only_into_the_last_slot() -> None:
    feed = Feed()
    feed.chunk("A")
    feed.update({"sessionUpdate": "plan", "entries": []})
    feed.chunk("B")
    feed.chunk("C")
    out = feed.finish()
    assert kinds(out) == ["agent_message_chunk", "plan", "agent_message_chunk", "turn_complete"]
    assert [text_of(out[0]), text_of(out[2])] == ["A", "BC"]


def test_source_record_ids_separate_top_level_slots() -> None:
    feed = Feed()
    r1 = {"qwenTranscript": {"sourceRecordIds": ["r1"]}}
    r2 = {"qwenTranscript": {"sourceRecordIds": ["r2"]}}
    feed.chunk("a", meta=r1)
    feed.chunk("b", meta=r1)
    feed.chunk("c", meta=r2)
    feed.chunk("d")
    feed.chunk("e", meta=r2)
    out = feed.finish()
    assert [text_of(e) for e in out[:-1]] == ["ab", "c", "d", "e"]
    assert upd(out[0])["_meta"]["qwenTranscript"] == {"sourceRecordIds": ["r1"]}


def test_subagent_chunks_merge_into_keyed_slot_anywhere_in_the_turn() -> None:
    feed = Feed()
    sub_a = {"parentToolCallId": "task-a", "subagentType": "explorer"}
    sub_b = {"parentToolCallId": "task-b"}
    feed.chunk("a1", meta=sub_a)
    feed.chunk("top1")
    feed.chunk("b1", meta=sub_b)
    feed.chunk("a2", meta=sub_a)
    feed.chunk("ta1", kind="agent_thought_chunk", meta=sub_a)
    feed.chunk("top2")
    feed.chunk("b2", meta=sub_b)
    feed.chunk(
        "a3", meta={"parentToolCallId": "task-a", "qwenTranscript": {"sourceRecordIds": ["r9"]}}
    )
    out = feed.finish()[:-1]
    got = [(upd(e).get("_meta", {}).get("parentToolCallId"), kinds([e])[0], text_of(e))
           for e in out]
    assert got == [
        ("task-a", "agent_message_chunk", "a1a2"),
        (None, "agent_message_chunk", "top1"),
        ("task-b", "agent_message_chunk", "b1b2"),
        ("task-a", "agent_thought_chunk", "ta1"),
        (None, "agent_message_chunk", "top2"),
        ("task-a", "agent_message_chunk", "a3"),
    ]
    assert upd(out[0])["_meta"] == sub_a


def test_top_level_chunk_does_not_join_a_subagent_slot() -> None:
    feed = Feed()
    feed.chunk("sub", meta={"parentToolCallId": "task-a"})
    feed.chunk("top")
    out = feed.finish()
    assert [text_of(e) for e in out[:-1]] == ["sub", "top"]


def test_discrete_messages_and_non_text_chunks_are_kept_as_is() -> None:
    feed = Feed()
    feed.chunk("a")
    discrete = feed.chunk("whole message", meta={"qwenDiscreteMessage": True})
    feed.chunk("b")
    image = feed.update(
        {
            "sessionUpdate": "agent_message_chunk",
            "content": {"type": "image", "data": "AAAA", "mimeType": "image/png"},
        }
    )
    feed.chunk("c")
    out = feed.finish()
    assert out[1] is discrete.env
    assert out[3] is image.env
    assert [text_of(out[i]) for i in (0, 2, 4)] == ["a", "b", "c"]
    assert len(out) == 6


def test_tool_call_frames_fold_into_first_position_with_non_null_overwrite() -> None:
    feed = Feed()
    feed.chunk("before")
    first = feed.update(
        {
            "sessionUpdate": "tool_call",
            "toolCallId": "call-1",
            "title": "Read file",
            "kind": "read",
            "status": "pending",
            "rawInput": {"path": "a.txt"},
            "_meta": {"parentToolCallId": "task-x", "timestamp": 1},
        },
        prompt_id="p-1",
        originator="c-1",
    )
    feed.chunk("between")
    feed.update(
        {
            "sessionUpdate": "tool_call_update",
            "toolCallId": "call-1",
            "status": "in_progress",
            "title": None,
            "_meta": {"timestamp": 2},
        },
        prompt_id="p-2",
        originator="c-2",
    )
    last = feed.update(
        {
            "sessionUpdate": "tool_call_update",
            "toolCallId": "call-1",
            "status": "completed",
            "content": [{"type": "content", "content": {"type": "text", "text": "ok"}}],
            "rawOutput": None,
        },
        prompt_id=None,
        originator=None,
    )
    out = feed.finish()
    assert kinds(out) == [
        "agent_message_chunk", "tool_call", "agent_message_chunk", "turn_complete"
    ]
    tool = out[1]
    assert tool["id"] == last.id
    assert tool["promptId"] == "p-2" and tool["originatorClientId"] == "c-2"
    assert tool["_meta"] == first.env["_meta"]
    assert upd(tool) == {
        "sessionUpdate": "tool_call",
        "toolCallId": "call-1",
        "title": "Read file",
        "kind": "read",
        "status": "completed",
        "rawInput": {"path": "a.txt"},
        "_meta": {"parentToolCallId": "task-x", "timestamp": 2},
        "content": [{"type": "content", "content": {"type": "text", "text": "ok"}}],
        "rawOutput": None,
    }
    # The source envelopes are shared with the ring and journal: never mutated.
    assert upd(first.env)["status"] == "pending"
    assert upd(first.env)["sessionUpdate"] == "tool_call"


def test_update_without_prior_tool_call_becomes_a_tool_call_slot() -> None:
    feed = Feed()
    feed.update({"sessionUpdate": "tool_call_update", "toolCallId": "c9", "status": "failed"})
    out = feed.finish()
    assert upd(out[0]) == {"sessionUpdate": "tool_call", "toolCallId": "c9", "status": "failed"}


def test_separate_tool_calls_get_separate_slots() -> None:
    feed = Feed()
    feed.update({"sessionUpdate": "tool_call", "toolCallId": "a", "status": "pending"})
    feed.update({"sessionUpdate": "tool_call", "toolCallId": "b", "status": "pending"})
    feed.update({"sessionUpdate": "tool_call_update", "toolCallId": "a", "status": "completed"})
    feed.update({"sessionUpdate": "tool_call_update", "toolCallId": "b", "status": "failed"})
    out = feed.finish()
    assert [(upd(e)["toolCallId"], upd(e)["status"], e["id"]) for e in out[:-1]] == [
        ("a", "completed", 3),
        ("b", "failed", 4),
    ]


def test_tool_frames_without_tool_call_id_are_kept_as_is() -> None:
    feed = Feed()
    a = feed.update({"sessionUpdate": "tool_call_update", "status": "completed"})
    b = feed.update({"sessionUpdate": "tool_call_update", "status": "completed"})
    out = feed.finish()
    assert out[0] is a.env and out[1] is b.env


def test_latest_wins_kinds_keep_the_first_position() -> None:
    feed = Feed()
    feed.update({"sessionUpdate": "available_commands_update", "availableCommands": [1]})
    feed.update({"sessionUpdate": "current_mode_update", "currentModeId": "plan"})
    feed.chunk("hi")
    newest_cmds = feed.update(
        {"sessionUpdate": "available_commands_update", "availableCommands": [1, 2]}
    )
    newest_mode = feed.update({"sessionUpdate": "current_mode_update", "currentModeId": "auto"})
    out = feed.finish()
    assert out[0] is newest_cmds.env
    assert out[1] is newest_mode.env
    assert text_of(out[2]) == "hi"
    assert len(out) == 4


def test_everything_else_kept_in_order() -> None:
    feed = Feed()
    started = feed.publish("pending_prompt_started", {"sessionId": SID, "promptId": PID})
    echo1 = feed.update(
        {"sessionUpdate": "user_message_chunk", "content": {"type": "text", "text": "a"}}
    )
    echo2 = feed.update(
        {"sessionUpdate": "user_message_chunk", "content": {"type": "text", "text": "b"}}
    )
    plan = feed.update({"sessionUpdate": "plan", "entries": [{"content": "x"}]})
    perm = feed.publish("permission_request", {"requestId": "r", "sessionId": SID})
    resolved = feed.publish("permission_resolved", {"requestId": "r", "outcome": "cancelled"})
    unknown = feed.update({"sessionUpdate": "brand_new_kind", "stuff": 1})
    cancelled = feed.publish("prompt_cancelled", {"sessionId": SID})
    terminal = feed.terminal()
    out = feed.compactor.finish(terminal)
    expected = [started, echo1, echo2, plan, perm, resolved, unknown, cancelled, terminal]
    assert out == [e.env for e in expected]
    assert all(a is b.env for a, b in zip(out, expected, strict=True))


def test_terminal_is_last_and_finish_resets() -> None:
    feed = Feed()
    feed.chunk("one")
    feed.update({"sessionUpdate": "tool_call", "toolCallId": "t", "status": "pending"})
    feed.update({"sessionUpdate": "current_mode_update", "currentModeId": "plan"})
    assert feed.compactor.pending_events == 3
    assert feed.compactor.slot_count == 3
    first = feed.finish()
    assert first[-1]["type"] == "turn_complete"
    assert feed.compactor.pending_events == 0
    assert feed.compactor.slot_count == 0
    # Nothing of the previous turn leaks into the next: no merge into old slots.
    feed.chunk("two")
    feed.update({"sessionUpdate": "tool_call_update", "toolCallId": "t", "status": "done"})
    feed.update({"sessionUpdate": "current_mode_update", "currentModeId": "auto"})
    second = feed.finish()
    assert text_of(second[0]) == "two"
    assert upd(second[1]) == {"sessionUpdate": "tool_call", "toolCallId": "t", "status": "done"}
    assert upd(second[2])["currentModeId"] == "auto"
    assert len(second) == 4


def test_reset_discards_the_turn() -> None:
    feed = Feed()
    feed.chunk("lost")
    feed.compactor.reset()
    assert feed.compactor.pending_events == 0
    out = feed.finish()
    assert [e["type"] for e in out] == ["turn_complete"]


def test_terminal_also_passed_to_add_is_emitted_once() -> None:
    feed = Feed()
    feed.chunk("x")
    terminal = feed.terminal()  # Feed.publish also adds it
    out = feed.compactor.finish(terminal)
    assert [e["type"] for e in out] == ["session_update", "turn_complete"]


def test_open_text_is_kept_compact_and_exact() -> None:
    feed = Feed()
    pieces = [f"w{i} " for i in range(70_000)]
    sub_meta = {"parentToolCallId": "task"}
    for i, piece in enumerate(pieces):
        if i % 7 == 0:
            # A keyed subagent slot is not the last slot, so top-level text keeps merging.
            feed.chunk(piece, meta=sub_meta)
        feed.chunk(piece)
        assert feed.compactor.held_text_pieces <= 2 * 2 * 256
    assert feed.compactor.slot_count == 2
    out = feed.finish()
    assert text_of(out[0]) == "".join(pieces[::7])
    assert text_of(out[1]) == "".join(pieces)


def test_compacted_shapes_match_the_reference_sample() -> None:
    # Frames 2..7 of the captured reference turn (samples/sse-frames.txt, section A) compact to
    # the events 2, 6, 7 of samples/load-after-turn.json.
    feed = Feed()
    feed.next_id = 2
    feed.update(
        {
            "sessionUpdate": "user_message_chunk",
            "content": {"type": "text", "text": "say hi"},
            "_meta": {"serverTimestamp": 1796204622451, "source": "bridge-echo"},
        }
    )
    for text in ("Hello", " from", " fake"):
        feed.update({"content": {"text": text, "type": "text"},
                     "sessionUpdate": "agent_message_chunk"})
    usage = {"inputTokens": 10, "outputTokens": 3, "totalTokens": 13, "thoughtTokens": 0,
             "cachedReadTokens": 0}
    feed.update({"_meta": {"usage": usage, "durationMs": 277},
                 "content": {"text": "", "type": "text"}, "sessionUpdate": "agent_message_chunk"})
    out = feed.finish()
    assert [e["id"] for e in out] == [2, 6, 7]
    assert out[1]["data"] == {
        "sessionId": SID,
        "update": {
            "sessionUpdate": "agent_message_chunk",
            "content": {"type": "text", "text": "Hello from fake"},
            "_meta": {"usage": usage, "durationMs": 277},
        },
    }


# -- stamp_record ------------------------------------------------------------------------------


def test_stamp_record_sets_both_record_fields_and_leaves_input_untouched() -> None:
    feed = Feed()
    event = feed.chunk(
        "x", meta={"timestamp": 3, "qwenTranscript": {"sourceRecordIds": ["old"], "segmentId": "s"}}
    )
    before = copy.deepcopy(event.env)
    stamped = stamp_record(event.env, "rec-1")
    assert event.env == before
    assert stamped is not event.env
    assert upd(stamped)["_meta"] == {
        "timestamp": 3,
        "qwenTranscript": {"sourceRecordIds": ["rec-1"], "segmentId": "s"},
        "qwen.session.recordId": "rec-1",
    }
    assert upd(stamped)["content"] == {"type": "text", "text": "x"}
    assert stamped["id"] == event.id and stamped["_meta"] == event.env["_meta"]


def test_stamp_record_adds_meta_when_absent() -> None:
    feed = Feed()
    event = feed.update({"sessionUpdate": "plan", "entries": []})
    stamped = stamp_record(event.env, "rec-2")
    assert upd(stamped) == {
        "sessionUpdate": "plan",
        "entries": [],
        "_meta": {"qwenTranscript": {"sourceRecordIds": ["rec-2"]},
                  "qwen.session.recordId": "rec-2"},
    }
    assert "_meta" not in upd(event.env)


def test_stamp_record_leaves_other_types_unchanged() -> None:
    feed = Feed()
    event = feed.terminal()
    stamped = stamp_record(event.env, "rec-3")
    assert stamped == event.env
    assert stamped is not event.env


# -- property: no text is lost, duplicated or reordered ----------------------------------------

_TEXT = st.text(alphabet="ab cé\n", max_size=4)
_KIND = st.sampled_from(["agent_message_chunk", "agent_thought_chunk"])
_PARENT = st.sampled_from([None, None, "task-1", "task-2"])
_SOURCES = st.sampled_from([None, None, ["r1"], ["r2"]])
_ITEM = st.one_of(
    st.tuples(st.just("chunk"), _KIND, _TEXT, _PARENT, _SOURCES, st.booleans()),
    st.tuples(st.just("tool"), st.sampled_from(["tool_call", "tool_call_update"]),
              st.sampled_from(["t1", "t2", "t3"]), st.sampled_from([None, "pending", "done"])),
    st.tuples(st.just("other"), st.sampled_from(["plan", "user_message_chunk",
                                                 "current_mode_update"])),
)

# Top-level text of one kind (discrete messages included) is one ordered stream; subagent text
# is one stream per (kind, parent, sourceRecordIds), and a subagent's discrete messages another.
_StreamKey = tuple[str, str | None, tuple[str, ...] | None, bool]


def _chunk_meta(parent: str | None, sources: list[str] | None, discrete: bool) -> JsonObject:
    meta: JsonObject = {}
    if parent is not None:
        meta["parentToolCallId"] = parent
    if sources is not None:
        meta["qwenTranscript"] = {"sourceRecordIds": sources}
    if discrete:
        meta["qwenDiscreteMessage"] = True
    return meta


def _key(kind: str, parent: str | None, sources: Any, discrete: bool) -> _StreamKey:
    if parent is None:
        return (kind, None, None, False)
    return (kind, parent, tuple(sources) if sources is not None else None, discrete)


def _stream_key(env: JsonObject) -> _StreamKey | None:
    if env["type"] != "session_update":
        return None
    update = upd(env)
    kind = update["sessionUpdate"]
    if kind not in ("agent_message_chunk", "agent_thought_chunk"):
        return None
    meta = update.get("_meta") or {}
    sources = (meta.get("qwenTranscript") or {}).get("sourceRecordIds")
    return _key(kind, meta.get("parentToolCallId"), sources, bool(meta.get("qwenDiscreteMessage")))


@given(st.lists(_ITEM, max_size=60))
def test_property_compacted_text_is_the_concatenation_of_all_chunks(
    items: list[tuple[Any, ...]],
) -> None:
    feed = Feed()
    expected: dict[_StreamKey, str] = defaultdict(str)
    for item in items:
        if item[0] == "chunk":
            _, kind, text, parent, sources, discrete = item
            feed.chunk(text, kind=kind, meta=_chunk_meta(parent, sources, discrete) or None)
            expected[_key(kind, parent, sources, discrete)] += text
        elif item[0] == "tool":
            _, kind, call_id, status = item
            feed.update({"sessionUpdate": kind, "toolCallId": call_id, "status": status})
        else:
            feed.update({"sessionUpdate": item[1], "content": {"type": "text", "text": "u"}})
    out = feed.finish()
    got: dict[_StreamKey, str] = defaultdict(str)
    for env in out:
        key = _stream_key(env)
        if key is not None:
            got[key] += text_of(env)
    assert dict(got) == dict(expected)
    all_text = "".join(item[2] for item in items if item[0] == "chunk")
    assert sorted("".join(got.values())) == sorted(all_text)
    assert out[-1]["type"] == "turn_complete"
    assert sum(1 for e in out if e["type"] == "turn_complete") == 1
    # One slot per tool call, whatever its number of frames.
    tool_ids = [upd(e)["toolCallId"] for e in out if e["type"] == "session_update"
                and upd(e)["sessionUpdate"] == "tool_call"]
    assert sorted(tool_ids) == sorted({item[2] for item in items if item[0] == "tool"})
