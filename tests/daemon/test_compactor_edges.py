"""Compactor details pinned down by mutation testing: which frames are kept as
is, how odd ``sourceRecordIds`` compare, tool-call folding of nested values, and the bounded
text pieces."""

from __future__ import annotations

from typing import Any

from daemon.core.compactor import TurnCompactor
from daemon.core.envelope import Event
from tests.builders.compactor import Feed, kinds, text_of, upd


def test_chunks_whose_content_is_not_text_are_kept_as_is() -> None:
    feed = Feed()
    odd = [
        feed.update({"sessionUpdate": "agent_message_chunk", "content": "oops"}),
        feed.update({"sessionUpdate": "agent_message_chunk",
                     "content": {"type": "text", "text": 5}}),
        feed.update({"sessionUpdate": "agent_message_chunk",
                     "content": {"type": "image", "text": "alt"}}),
    ]
    out = feed.finish()
    assert out[:3] == [e.env for e in odd]
    assert len(out) == 4


def test_empty_update_meta_is_omitted_from_the_merged_chunk() -> None:
    feed = Feed()
    feed.chunk("a", meta={})
    feed.chunk("b", meta={})
    out = feed.finish()
    assert text_of(out[0]) == "ab"
    assert "_meta" not in upd(out[0])


def test_absent_source_record_ids_agree_with_a_transcript_without_them() -> None:
    feed = Feed()
    feed.chunk("a")
    feed.chunk("b", meta={"qwenTranscript": {"planToolCallId": "plan"}})
    out = feed.finish()
    assert kinds(out) == ["agent_message_chunk", "turn_complete"]
    assert text_of(out[0]) == "ab"


def test_odd_source_record_ids_compare_by_value() -> None:
    def slots(*sources: Any) -> list[str]:
        feed = Feed()
        for i, value in enumerate(sources):
            feed.chunk(str(i), meta={"qwenTranscript": {"sourceRecordIds": value}})
        return [text_of(e) for e in feed.finish()[:-1]]

    assert slots(["a", "b"], "ab") == ["0", "1"]
    assert slots(5, "x") == ["0", "1"]
    assert slots({"k": 1}, {"k": 2}) == ["0", "1"]
    assert slots({"k": 1}, {"k": 1}) == ["01"]
    assert slots(["a"], ["a"]) == ["01"]


def test_a_parent_tool_call_id_that_is_not_a_non_empty_string_is_top_level() -> None:
    feed = Feed()
    feed.chunk("a")
    feed.chunk("b", meta={"parentToolCallId": 5})
    feed.chunk("c", meta={"parentToolCallId": ""})
    out = feed.finish()
    assert [text_of(e) for e in out[:-1]] == ["abc"]


def test_tool_frames_with_an_empty_or_non_string_id_are_kept_as_is() -> None:
    feed = Feed()
    frames = [
        feed.update({"sessionUpdate": "tool_call", "toolCallId": "", "title": "a"}),
        feed.update({"sessionUpdate": "tool_call_update", "toolCallId": "", "status": "done"}),
        feed.update({"sessionUpdate": "tool_call", "toolCallId": 7, "title": "b"}),
        feed.update({"sessionUpdate": "tool_call_update", "toolCallId": 7, "status": "done"}),
    ]
    out = feed.finish()
    assert out[:-1] == [e.env for e in frames]


def test_tool_call_meta_arriving_later_is_taken_and_other_objects_are_replaced() -> None:
    feed = Feed()
    feed.update({"sessionUpdate": "tool_call", "toolCallId": "t", "rawInput": {"a": 1}})
    feed.update({"sessionUpdate": "tool_call_update", "toolCallId": "t",
                 "_meta": {"timestamp": 3}, "rawInput": {"b": 2}})
    feed.update({"sessionUpdate": "tool_call_update", "toolCallId": "t",
                 "_meta": {"serverTimestamp": 4}})
    out = feed.finish()
    update = upd(out[0])
    assert update["rawInput"] == {"b": 2}
    assert update["_meta"] == {"timestamp": 3, "serverTimestamp": 4}
    assert update["sessionUpdate"] == "tool_call"


def _chunk_event() -> Event:
    return Event.from_env({"id": 1, "v": 1, "type": "session_update", "data": {
        "sessionId": "s", "update": {"sessionUpdate": "agent_message_chunk",
                                     "content": {"type": "text", "text": "x"}}}})


def test_text_pieces_are_joined_every_256_and_the_groups_every_256_again() -> None:
    compactor = TurnCompactor()
    event = _chunk_event()
    for _ in range(255):
        compactor.add(event)
    assert compactor.held_text_pieces == 255
    compactor.add(event)  # the 256th piece: one joined group
    assert compactor.held_text_pieces == 1
    for _ in range(256 * 255 - 1):
        compactor.add(event)
    assert compactor.held_text_pieces == 255 + 255
    compactor.add(event)  # 65,536 pieces: 256 groups, joined again into one string
    assert compactor.held_text_pieces == 1
    out = compactor.finish(Event.from_env({"v": 1, "type": "turn_complete", "data": {}}))
    assert text_of(out[0]) == "x" * 65_536


def test_a_second_turn_starts_from_nothing() -> None:
    feed = Feed()
    feed.chunk("a", meta={"parentToolCallId": "task"})
    feed.update({"sessionUpdate": "tool_call", "toolCallId": "t", "title": "x"})
    feed.finish()
    feed.chunk("b", meta={"parentToolCallId": "task"})
    feed.update({"sessionUpdate": "tool_call_update", "toolCallId": "t", "status": "done"})
    out = feed.finish()
    assert [text_of(out[0])] == ["b"]
    assert upd(out[1]) == {"sessionUpdate": "tool_call", "toolCallId": "t", "status": "done"}
    assert len(out) == 3
