"""The live journal's fast chunk decoder (``sdk.protocol.acp.mergeable_chunk_fields``) gives
exactly what the strict view ``MergeableChunk`` gives, over envelopes generated around the
mergeable shape: every member present or absent, of the right type or not, extra members."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sdk.protocol.acp import (
    MergeableChunk,
    MergeableUpdate,
    MergeFields,
    mergeable_chunk_fields,
    view,
)
from tests.hypothesis_profiles import examples

UNSET = msgspec.UNSET

_scalars = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from(
    ["", "x", "text", "agent_message_chunk", "tool-1"]))
_json = st.recursive(_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(["a", "text", "type"]), inner,
                                                 max_size=2)), max_leaves=4)
_not_str = st.one_of(st.none(), st.booleans(), st.integers(-3, 3))
_str_list = st.one_of(st.lists(_not_str, min_size=1, max_size=2),
                      st.lists(st.sampled_from(["r1", 2]), min_size=2, max_size=3), _scalars)


# Hypothesis favours the bounds of an integer range, so the odds are set with sampled_from.
_PICKS = st.sampled_from(["good"] * 10 + ["absent", "odd"])
_RARE = st.sampled_from([False] * 11 + [True])


def _maybe(draw: st.DrawFn, value: st.SearchStrategy[Any], odd: st.SearchStrategy[Any]
           ) -> Any:
    """Mostly a well-typed value, sometimes absent (UNSET) or ill-typed, so that both answers
    come up often (checked by the test below)."""
    pick = draw(_PICKS)
    if pick == "absent":
        return UNSET
    if pick == "odd":
        return draw(odd)
    return draw(value)


def _put(target: dict[str, Any], key: str, value: Any) -> None:
    if value is not UNSET:
        target[key] = value


@st.composite
def envelopes(draw: st.DrawFn) -> Any:
    transcript: dict[str, Any] = {}
    _put(transcript, "sourceRecordIds", _maybe(draw, st.lists(st.sampled_from(["r1", "r2"]), max_size=3), _str_list))
    _put(transcript, "planToolCallId", _maybe(draw, st.just("plan-1"), _scalars))
    if draw(_RARE):
        transcript["extra"] = 1
    meta: dict[str, Any] = {}
    for key in ("timestamp", "serverTimestamp"):
        _put(meta, key, _maybe(draw, st.integers(0, 5), _json))
    _put(meta, "parentToolCallId", _maybe(draw, st.sampled_from(["", "tool-1"]), _scalars))
    _put(meta, "subagentType", _maybe(draw, st.just("general"), _not_str))
    _put(meta, "qwenTranscript", _maybe(draw, st.just(transcript), _json))
    if draw(_RARE):
        meta["usage"] = {"inputTokens": 1}
    content: dict[str, Any] = {}
    _put(content, "type", _maybe(draw, st.just("text"), _scalars))
    _put(content, "text", _maybe(draw, st.sampled_from(["", "hi", "chunk-7"]), _json))
    if draw(_RARE):
        content["annotations"] = None
    update: dict[str, Any] = {}
    _put(update, "sessionUpdate", _maybe(draw, st.sampled_from(
        ["agent_message_chunk", "agent_thought_chunk"] * 3
        + ["user_message_chunk", "tool_call", "plan", "something_new"]), _scalars))
    _put(update, "content", _maybe(draw, st.just(content), _json))
    _put(update, "_meta", _maybe(draw, st.just(meta), _json))
    if draw(_RARE):
        update["toolCallId"] = "tool-1"
    data: dict[str, Any] = {}
    _put(data, "update", _maybe(draw, st.just(update), _json))
    _put(data, "sessionId", _maybe(draw, st.sampled_from(["s-1", "s-2"]), _json))
    if draw(_RARE):
        data["extra"] = True
    env_meta: dict[str, Any] = {}
    _put(env_meta, "serverTimestamp", _maybe(draw, st.integers(0, 5), _json))
    _put(env_meta, "timestamp", _maybe(draw, st.integers(0, 5), _json))
    if draw(_RARE):
        env_meta["other"] = 1
    env: dict[str, Any] = {"v": 1, "id": 3, "type": "session_update"}
    _put(env, "data", _maybe(draw, st.just(data), _json))
    _put(env, "promptId", _maybe(draw, st.sampled_from(["p-1", "p-2"]), _scalars))
    _put(env, "originatorClientId", _maybe(draw, st.just("c-1"), _scalars))
    _put(env, "_meta", _maybe(draw, st.just(env_meta), _json))
    # Round-trip through JSON: the decoder reads envelopes as decoded from the wire.
    shaped = draw(_json) if draw(_RARE) else env
    return msgspec.json.decode(msgspec.json.encode(shaped))


def _from_view(env: Any) -> MergeFields | None:
    found = view(env, MergeableChunk)
    if found is None or not isinstance(found.data.update, MergeableUpdate):
        return None
    update = found.data.update
    parent: Any = UNSET
    sources: Any = UNSET
    if update.meta is not UNSET:
        parent = update.meta.parent_tool_call_id
        if update.meta.qwen_transcript is not UNSET:
            sources = update.meta.qwen_transcript.source_record_ids
    return ((update.kind, found.prompt_id, found.originator_client_id, found.data.session_id,
             parent, sources), update.content.text)


@settings(max_examples=examples(800), deadline=None)
@given(envelopes())
def test_fast_decoder_equals_the_view(env: Any) -> None:
    assert mergeable_chunk_fields(env) == _from_view(env)


def test_the_generator_reaches_both_answers() -> None:
    """Guards the property above against a generator that only ever produces one answer."""
    plain = {"type": "session_update", "promptId": "p-1", "_meta": {"serverTimestamp": 1},
             "data": {"sessionId": "s-1", "update": {
                 "sessionUpdate": "agent_message_chunk",
                 "content": {"type": "text", "text": "hi"}}}}
    fields = mergeable_chunk_fields(plain)
    assert fields == (("agent_message_chunk", "p-1", UNSET, "s-1", UNSET, UNSET), "hi")
    assert fields == _from_view(plain)
    plain["data"]["update"]["content"]["extra"] = 1  # type: ignore[index]
    assert mergeable_chunk_fields(plain) is None and _from_view(plain) is None


def _plain() -> dict[str, Any]:
    return {"type": "session_update", "promptId": "p-1", "_meta": {"serverTimestamp": 1},
            "data": {"sessionId": "s-1", "update": {
                "sessionUpdate": "agent_thought_chunk",
                "content": {"type": "text", "text": "hi"},
                "_meta": {"parentToolCallId": "tool-1", "subagentType": "general",
                          "qwenTranscript": {"sourceRecordIds": ["r1"]}}}}}


_EDITS = {
    "as is": lambda e: None,
    "no sessionId": lambda e: e["data"].pop("sessionId"),
    "data: extra member instead of sessionId": lambda e: e["data"].update(
        {"extra": 1}) or e["data"].pop("sessionId"),
    "data: extra member": lambda e: e["data"].update({"extra": 1}),
    "subagentType not a string": lambda e: e["data"]["update"]["_meta"].update(
        {"subagentType": 3}),
    "parentToolCallId null": lambda e: e["data"]["update"]["_meta"].update(
        {"parentToolCallId": None}),
    "a source record id not a string": lambda e: e["data"]["update"]["_meta"][
        "qwenTranscript"].update({"sourceRecordIds": ["r1", 2]}),
    "planToolCallId not a string": lambda e: e["data"]["update"]["_meta"][
        "qwenTranscript"].update({"planToolCallId": 1}),
    "transcript extra member": lambda e: e["data"]["update"]["_meta"][
        "qwenTranscript"].update({"x": 1}),
    "update _meta empty": lambda e: e["data"]["update"].update({"_meta": {}}),
    "update _meta usage": lambda e: e["data"]["update"]["_meta"].update({"usage": {}}),
    "update extra member": lambda e: e["data"]["update"].update({"toolCallId": "t"}),
    "content extra member": lambda e: e["data"]["update"]["content"].update({"x": 1}),
    "content type image": lambda e: e["data"]["update"]["content"].update({"type": "image"}),
    "envelope _meta timestamp": lambda e: e["_meta"].update({"timestamp": 2}),
    "envelope _meta extra": lambda e: e["_meta"].update({"x": 2}),
    "envelope _meta null": lambda e: e.update({"_meta": None}),
    "no promptId": lambda e: e.pop("promptId"),
}


@pytest.mark.parametrize("edit", list(_EDITS))
def test_near_misses_agree(edit: str) -> None:
    env = _plain()
    _EDITS[edit](env)
    assert mergeable_chunk_fields(env) == _from_view(env)
