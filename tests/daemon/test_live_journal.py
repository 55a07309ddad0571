"""Unit tests of the live journal core: merging, limits, marker, summary filter."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterable
from typing import Any

import pytest

from daemon.core.envelope import Event, JsonObject, make_event
from daemon.core.live_journal import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_EVENTS,
    JOIN_PIECES,
    MAX_EVENTS_PER_ENTRY,
    LiveJournal,
    LiveJournals,
    _MergedEntry,
    in_summary,
    merge_key,
)
from tests.builders.live_journal import CLIENT, NOW, PROMPT, SESSION, chunk, chunk_env


def user_chunk(event_id: int, text: str = "hi") -> Event:
    return chunk(event_id, text, kind="user_message_chunk")


def decoded(items: Iterable[bytes]) -> list[JsonObject]:
    return [json.loads(item) for item in items]


def ids(items: Iterable[bytes]) -> list[int | None]:
    return [env.get("id") for env in decoded(items)]


def text_of(env: JsonObject) -> str:
    text: str = env["data"]["update"]["content"]["text"]
    return text


def feed(journal: LiveJournal | LiveJournals, events: Iterable[Event]) -> None:
    for event in events:
        journal.append(event)


# --- worked examples ------------------------------------------------------------------------


def test_example_five_user_chunks_max_events_3() -> None:
    journal = LiveJournal(max_events=3)
    feed(journal, (user_chunk(i) for i in range(1, 6)))

    snap = decoded(journal.snapshot(active_prompt_id=None, full_transcript_available=True))

    marker = snap[0]
    assert marker["type"] == "history_truncated"
    assert "id" not in marker
    assert marker["data"]["truncatedEvents"] == 2
    assert marker["data"]["retainedEvents"] == 3
    assert marker["data"]["maxBytes"] == 8_388_608
    assert marker["data"]["maxEvents"] == 3
    assert [env["id"] for env in snap[1:]] == [3, 4, 5]


def test_example_512_mergeable_chunks_make_two_entries() -> None:
    journal = LiveJournal(max_events=3)
    feed(journal, (chunk(i) for i in range(1, 513)))

    snap = journal.snapshot(active_prompt_id=PROMPT, full_transcript_available=True)

    assert ids(snap) == [256, 512]
    assert journal.truncated_events == 0
    assert journal.retained_events == 512


def test_example_512_chunks_then_user_chunk_evicts_whole_256_entry() -> None:
    journal = LiveJournal(max_events=2)
    feed(journal, (chunk(i) for i in range(1, 513)))
    journal.append(user_chunk(513))

    snap = decoded(journal.snapshot(active_prompt_id=PROMPT, full_transcript_available=True))

    assert [env.get("id") for env in snap[1:]] == [512, 513]
    assert snap[0]["data"]["truncatedEvents"] == 256
    assert snap[0]["data"]["retainedEvents"] == 257


def _mock_turn(prompt_id: str, session_id: str, client_id: str) -> list[Event]:
    """The mock agent's turn as the bus publishes it: one user echo, then chunk-0 … chunk-19."""
    events: list[Event] = []
    echo = make_event(
        1,
        "session_update",
        {
            "sessionId": session_id,
            "update": {
                "sessionUpdate": "user_message_chunk",
                "content": {"type": "text", "text": "emit twenty chunks"},
                "_meta": {"serverTimestamp": NOW, "source": "bridge-echo"},
            },
        },
        now_ms=NOW,
        prompt_id=prompt_id,
        originator_client_id=client_id,
    )
    assert echo is not None
    events.append(echo)
    for n in range(20):
        event = make_event(
            n + 2,
            "session_update",
            {
                "sessionId": session_id,
                "update": {
                    "sessionUpdate": "agent_message_chunk",
                    "content": {"type": "text", "text": f"chunk-{n}"},
                },
            },
            now_ms=NOW + n,
            prompt_id=prompt_id,
            originator_client_id=client_id,
        )
        assert event is not None
        events.append(event)
    return events


def test_example_twenty_chunk_mock_turn_over_byte_cap() -> None:
    turn = _mock_turn(
        "0f0e4f6e-2c5d-4c4b-9a43-7d0c9f0f6a11",
        "6a3b1c2d-8e9f-4a0b-b1c2-d3e4f5a6b7c8",
        "client_1b2c3d4e-5f60-4718-89a0-b1c2d3e4f5a6",
    )
    assert all(event.size > 300 for event in turn), "each chunk must be over the byte cap alone"
    journal = LiveJournal(max_events=3, max_bytes=300)

    for fed, event in enumerate(turn, start=1):
        journal.append(event)
        assert journal.entry_count == 1
        assert journal.retained_events == 1
        assert journal.truncated_events == fed - 1

    snap = decoded(
        journal.snapshot(
            active_prompt_id="0f0e4f6e-2c5d-4c4b-9a43-7d0c9f0f6a11", full_transcript_available=True
        )
    )
    marker, tail = snap[0], snap[1:]
    assert marker["type"] == "history_truncated"
    assert marker["promptId"] == "0f0e4f6e-2c5d-4c4b-9a43-7d0c9f0f6a11"
    assert marker["data"]["scope"] == "live_journal"
    assert marker["data"]["maxEvents"] == 3
    assert marker["data"]["truncatedEvents"] == 20
    assert [text_of(env) for env in tail] == ["chunk-19"]
    assert all("chunk-0" not in text_of(env) for env in tail)


def test_example_twenty_chunk_mock_turn_merges_under_event_cap_alone() -> None:
    # With only --max-journal-events 3, the echo plus the 20 chunks are 2 entries.
    journal = LiveJournal(max_events=3)
    feed(journal, _mock_turn(PROMPT, SESSION, CLIENT))

    snap = decoded(journal.snapshot(active_prompt_id=PROMPT, full_transcript_available=True))

    assert len(snap) == 2
    assert all(env["type"] != "history_truncated" for env in snap)
    assert text_of(snap[1]) == "".join(f"chunk-{n}" for n in range(20))
    assert snap[1]["id"] == 21


# --- merge conditions -------------------------------------------------------------------------

Mutator = Callable[[JsonObject], None]


def _set_update_meta(meta: JsonObject) -> Mutator:
    def mutate(env: JsonObject) -> None:
        env["data"]["update"]["_meta"] = meta

    return mutate


def _set(path: tuple[str, ...], value: Any) -> Mutator:
    def mutate(env: JsonObject) -> None:
        target = env
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return mutate


def _delete(path: tuple[str, ...]) -> Mutator:
    def mutate(env: JsonObject) -> None:
        target = env
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]

    return mutate


def _noop(env: JsonObject) -> None:
    return None


UPDATE = ("data", "update")
CONTENT = (*UPDATE, "content")

# Each case: (first event mutation, second event mutation). The two events differ only in it.
BREAKING: dict[str, tuple[Mutator, Mutator]] = {
    "first not session_update": (_set(("type",), "agent_message"), _noop),
    "second not session_update": (_noop, _set(("type",), "agent_message")),
    "different chunk kinds": (_noop, _set((*UPDATE, "sessionUpdate"), "agent_thought_chunk")),
    "both user_message_chunk": (
        _set((*UPDATE, "sessionUpdate"), "user_message_chunk"),
        _set((*UPDATE, "sessionUpdate"), "user_message_chunk"),
    ),
    "both tool_call_update": (
        _set((*UPDATE, "sessionUpdate"), "tool_call_update"),
        _set((*UPDATE, "sessionUpdate"), "tool_call_update"),
    ),
    "content type not text": (_noop, _set((*CONTENT, "type"), "image")),
    "content text not str": (_noop, _set((*CONTENT, "text"), 7)),
    "content text missing": (_noop, _delete((*CONTENT, "text"))),
    "content not an object": (_noop, _set(CONTENT, "text")),
    "content extra key": (_noop, _set((*CONTENT, "annotations"), {})),
    "data extra key": (_noop, _set(("data", "extra"), 1)),
    "update extra key": (_noop, _set((*UPDATE, "toolCallId"), "tc1")),
    "update._meta extra key": (_noop, _set_update_meta({"usage": {"inputTokens": 1}})),
    "update._meta not an object": (_noop, _set_update_meta(None)),  # type: ignore[arg-type]
    "parentToolCallId not str": (
        _set_update_meta({"parentToolCallId": 5}),
        _set_update_meta({"parentToolCallId": 5}),
    ),
    "subagentType not str": (
        _set_update_meta({"subagentType": ["x"]}),
        _set_update_meta({"subagentType": ["x"]}),
    ),
    "qwenTranscript not an object": (
        _set_update_meta({"qwenTranscript": "r1"}),
        _set_update_meta({"qwenTranscript": "r1"}),
    ),
    "qwenTranscript extra key": (
        _set_update_meta({"qwenTranscript": {"sourceRecordIds": ["r1"], "other": 1}}),
        _set_update_meta({"qwenTranscript": {"sourceRecordIds": ["r1"], "other": 1}}),
    ),
    "sourceRecordIds not a list of str": (
        _set_update_meta({"qwenTranscript": {"sourceRecordIds": [1]}}),
        _set_update_meta({"qwenTranscript": {"sourceRecordIds": [1]}}),
    ),
    "planToolCallId not str": (
        _set_update_meta({"qwenTranscript": {"planToolCallId": 3}}),
        _set_update_meta({"qwenTranscript": {"planToolCallId": 3}}),
    ),
    "promptId differs": (_noop, _set(("promptId",), "other-prompt")),
    "promptId absent on one": (_noop, _delete(("promptId",))),
    "originatorClientId differs": (_noop, _set(("originatorClientId",), "client_other")),
    "originatorClientId absent on one": (_delete(("originatorClientId",)), _noop),
    "data.sessionId differs": (_noop, _set(("data", "sessionId"), "other-session")),
    "parentToolCallId differs": (
        _set_update_meta({"parentToolCallId": "tc1"}),
        _set_update_meta({"parentToolCallId": "tc2"}),
    ),
    "parentToolCallId absent on one": (_noop, _set_update_meta({"parentToolCallId": "tc1"})),
    "sourceRecordIds differ": (
        _set_update_meta({"qwenTranscript": {"sourceRecordIds": ["r1"]}}),
        _set_update_meta({"qwenTranscript": {"sourceRecordIds": ["r2"]}}),
    ),
    "sourceRecordIds absent on one": (
        _set_update_meta({"qwenTranscript": {"planToolCallId": "p"}}),
        _set_update_meta({"qwenTranscript": {"sourceRecordIds": ["r1"], "planToolCallId": "p"}}),
    ),
    "first envelope _meta extra key": (_set(("_meta", "source"), "x"), _noop),
    "second envelope _meta extra key": (_noop, _set(("_meta", "source"), "x")),
    "envelope _meta not an object": (_noop, _set(("_meta",), 5)),
}

# Differences the merge rule does not forbid: the pair still merges.
ALLOWED: dict[str, tuple[Mutator, Mutator]] = {
    "plain chunks": (_noop, _noop),
    "both thought chunks": (
        _set((*UPDATE, "sessionUpdate"), "agent_thought_chunk"),
        _set((*UPDATE, "sessionUpdate"), "agent_thought_chunk"),
    ),
    "timestamps differ": (
        _set_update_meta({"timestamp": 1, "serverTimestamp": 2}),
        _set_update_meta({"timestamp": 3}),
    ),
    "same parentToolCallId, different subagentType": (
        _set_update_meta({"parentToolCallId": "tc1", "subagentType": "a"}),
        _set_update_meta({"parentToolCallId": "tc1", "subagentType": "b"}),
    ),
    "same sourceRecordIds, different planToolCallId": (
        _set_update_meta({"qwenTranscript": {"sourceRecordIds": ["r1"], "planToolCallId": "p1"}}),
        _set_update_meta({"qwenTranscript": {"sourceRecordIds": ["r1"], "planToolCallId": "p2"}}),
    ),
    "envelope _meta timestamp": (_set(("_meta", "timestamp"), 5), _noop),
    "envelope _meta absent": (_delete(("_meta",)), _delete(("_meta",))),
    "promptId absent on both": (_delete(("promptId",)), _delete(("promptId",))),
    "empty update._meta": (_set_update_meta({}), _noop),
}


def _pair(first: Mutator, second: Mutator) -> tuple[Event, Event]:
    a = chunk_env(1, "alpha")
    b = chunk_env(2, "beta")
    first(a)
    second(b)
    return Event.from_env(a), Event.from_env(b)


@pytest.mark.parametrize("case", sorted(BREAKING))
def test_merge_condition_violation_starts_new_entry(case: str) -> None:
    first, second = _pair(*BREAKING[case])
    journal = LiveJournal()
    feed(journal, [first, second])

    assert journal.entry_count == 2
    assert journal.entries() == [first.raw, second.raw]


@pytest.mark.parametrize("case", sorted(ALLOWED))
def test_compatible_pair_merges(case: str) -> None:
    first, second = _pair(*ALLOWED[case])
    journal = LiveJournal()
    feed(journal, [first, second])

    assert journal.entry_count == 1
    assert journal.retained_events == 2
    assert journal.total_bytes == first.size + second.size
    (entry,) = decoded(journal.entries())
    assert text_of(entry) == "alphabeta"


def test_merge_key_is_none_for_non_chunks_and_equal_for_compatible_chunks() -> None:
    assert merge_key(user_chunk(1).env) is None
    assert merge_key({"type": "turn_complete", "data": {"promptId": PROMPT}}) is None
    assert merge_key(chunk(1).env) == merge_key(chunk(2).env)
    assert merge_key(chunk(1).env) != merge_key(chunk(2, kind="agent_thought_chunk").env)


@pytest.mark.parametrize(
    "env",
    [
        {"data": {}},
        {"type": "session_update", "data": [1]},
        {"type": "session_update", "data": "update"},
        {"type": "session_update", "data": {"update": ["agent_message_chunk"]}},
        {"type": "session_update", "data": {"update": {"sessionUpdate": ["x"]}}},
        {
            "type": "session_update",
            "data": {"update": {"sessionUpdate": "agent_message_chunk", "content": "text"}},
        },
        {
            "type": "session_update",
            "data": {"update": {"sessionUpdate": "agent_message_chunk", "content": [1, 2]}},
        },
    ],
)
def test_merge_key_of_malformed_envelope_is_none(env: JsonObject) -> None:
    assert merge_key(env) is None


def test_entry_holds_at_most_256_source_events() -> None:
    journal = LiveJournal()
    feed(journal, (chunk(i) for i in range(1, MAX_EVENTS_PER_ENTRY + 2)))

    first, second = decoded(journal.entries())
    assert journal.entry_count == 2
    assert first["id"] == MAX_EVENTS_PER_ENTRY
    assert text_of(first) == "".join(f"t{i}" for i in range(1, MAX_EVENTS_PER_ENTRY + 1))
    assert second["id"] == MAX_EVENTS_PER_ENTRY + 1
    assert text_of(second) == f"t{MAX_EVENTS_PER_ENTRY + 1}"


def test_a_merged_entry_holds_few_strings_however_many_chunks_it_merged() -> None:
    # One string per merged chunk would hold more string header than text for short chunks:
    # the pieces are joined as they accumulate, the rendered text staying the same.
    journal = LiveJournal()
    feed(journal, (chunk(i) for i in range(1, MAX_EVENTS_PER_ENTRY + 1)))
    (entry,) = journal._entries
    assert isinstance(entry, _MergedEntry) and entry.count == MAX_EVENTS_PER_ENTRY
    assert len(entry.pieces) < JOIN_PIECES
    (merged,) = decoded(journal.entries())
    assert text_of(merged) == "".join(f"t{i}" for i in range(1, MAX_EVENTS_PER_ENTRY + 1))


@pytest.mark.parametrize("fit", [2, 3])
def test_merge_requires_entry_bytes_plus_event_within_max_bytes(fit: int) -> None:
    # fit=2 checks the limit when the last entry is one event, fit=3 when it is already merged.
    events = [chunk(i, "x") for i in range(1, fit + 2)]
    size = events[0].size
    assert all(event.size == size for event in events)
    journal = LiveJournal(max_bytes=fit * size)

    feed(journal, events[:fit])
    assert journal.entry_count == 1, "exactly at the cap still merges"
    assert journal.total_bytes == fit * size

    journal.append(events[fit])
    # One more would make the entry exceed the cap: it starts a new entry, and the byte cap
    # then evicts the merged entry whole.
    assert journal.entry_count == 1
    assert journal.entries() == [events[fit].raw]
    assert journal.truncated_events == fit
    assert journal.retained_events == 1


def test_chunk_after_non_chunk_does_not_join_earlier_entry() -> None:
    journal = LiveJournal()
    feed(journal, [chunk(1), user_chunk(2), chunk(3), chunk(4)])

    assert ids(journal.entries()) == [1, 2, 4]
    assert [text_of(env) for env in decoded(journal.entries())] == ["t1", "hi", "t3t4"]


# --- rendering ---------------------------------------------------------------------------------


def test_unmerged_entry_is_event_raw_itself() -> None:
    event = user_chunk(1)
    journal = LiveJournal()
    journal.append(event)

    (item,) = journal.entries()
    assert item is event.raw


def test_merged_entry_is_shallow_merge_of_first_and_last() -> None:
    first_env = chunk_env(
        1,
        "Hello",
        update_meta={"serverTimestamp": 10, "subagentType": "a", "parentToolCallId": "tc"},
    )
    first_env["_meta"] = {"serverTimestamp": 100, "timestamp": 99}
    middle_env = chunk_env(
        2, ", ", update_meta={"subagentType": "middle", "parentToolCallId": "tc"}
    )
    last_env = chunk_env(3, "world", update_meta={"timestamp": 30, "parentToolCallId": "tc"})
    last_env["_meta"] = {"serverTimestamp": 300}
    events = [Event.from_env(env) for env in (first_env, middle_env, last_env)]
    journal = LiveJournal()
    feed(journal, events)

    (entry,) = decoded(journal.entries())

    assert entry == {
        "id": 3,
        "v": 1,
        "type": "session_update",
        "data": {
            "sessionId": SESSION,
            "update": {
                "sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": "Hello, world"},
                # update is merged one level deep: _meta itself is the last chunk's, whole.
                "_meta": {"timestamp": 30, "parentToolCallId": "tc"},
            },
        },
        "promptId": PROMPT,
        "originatorClientId": CLIENT,
        "_meta": {"serverTimestamp": 300},
    }
    assert journal.total_bytes == sum(event.size for event in events)


def test_merged_rendering_keeps_first_only_update_keys() -> None:
    first_env = chunk_env(1, "a", update_meta={"serverTimestamp": 1})
    last_env = chunk_env(2, "b")
    journal = LiveJournal()
    feed(journal, [Event.from_env(first_env), Event.from_env(last_env)])

    (entry,) = decoded(journal.entries())
    assert entry["data"]["update"]["_meta"] == {"serverTimestamp": 1}
    assert entry["id"] == 2
    assert entry["_meta"] == {"serverTimestamp": NOW + 2}


def test_merged_rendering_is_cached_until_the_entry_grows() -> None:
    journal = LiveJournal()
    feed(journal, [chunk(1, "a"), chunk(2, "b")])

    (first_render,) = journal.entries()
    (again,) = journal.entries()
    assert again is first_render

    journal.append(chunk(3, "c"))
    (grown,) = journal.entries()
    assert grown is not first_render
    assert text_of(json.loads(grown)) == "abc"
    assert json.loads(grown)["id"] == 3


def test_rendering_does_not_mutate_source_envelopes() -> None:
    events = [chunk(1, "a", update_meta={"timestamp": 1}), chunk(2, "b")]
    before = [copy.deepcopy(event.env) for event in events]
    journal = LiveJournal()
    feed(journal, events)
    journal.entries()

    assert [event.env for event in events] == before


# --- limits and eviction -----------------------------------------------------------------------


def test_defaults_match_spec() -> None:
    journal = LiveJournal()
    assert (DEFAULT_MAX_EVENTS, DEFAULT_MAX_BYTES) == (10_000, 8_388_608)
    assert (journal.max_events, journal.max_bytes) == (10_000, 8_388_608)


def test_single_event_over_max_bytes_is_kept_alone() -> None:
    big = chunk(2, "x" * 500)
    journal = LiveJournal(max_bytes=300)
    journal.append(user_chunk(1))
    journal.append(big)

    assert journal.entries() == [big.raw]
    assert journal.total_bytes == big.size > journal.max_bytes
    assert journal.truncated_events == 1
    assert journal.retained_events == 1

    bigger = user_chunk(3, "y" * 600)
    journal.append(bigger)
    assert journal.entries() == [bigger.raw]
    assert journal.truncated_events == 2


def test_byte_cap_evicts_oldest_entries_until_within_cap() -> None:
    events = [user_chunk(i) for i in range(1, 6)]
    size = events[0].size
    journal = LiveJournal(max_bytes=3 * size)
    feed(journal, events)

    assert ids(journal.entries()) == [3, 4, 5]
    assert journal.total_bytes == 3 * size
    assert journal.truncated_events == 2


def test_counters_count_source_events_and_cap_counts_entries() -> None:
    journal = LiveJournal(max_events=2)
    feed(journal, (chunk(i) for i in range(1, 11)))
    journal.append(user_chunk(11))
    assert journal.entry_count == 2
    assert journal.retained_events == 11
    assert journal.truncated_events == 0

    journal.append(user_chunk(12))
    assert journal.entry_count == 2
    assert journal.retained_events == 2
    assert journal.truncated_events == 10


def test_reset_clears_entries_bytes_counters_and_merge_state() -> None:
    journal = LiveJournal(max_events=2)
    feed(journal, [user_chunk(1), user_chunk(2), chunk(3), chunk(4)])
    assert journal.truncated_events > 0

    journal.reset()

    assert journal.entry_count == 0
    assert journal.total_bytes == 0
    assert journal.truncated_events == 0
    assert journal.retained_events == 0
    assert journal.entries() == []
    assert journal.snapshot(active_prompt_id=PROMPT, full_transcript_available=True) == []

    after = chunk(5)  # same merge key as the chunks before the reset
    journal.append(after)
    assert journal.entries() == [after.raw]
    assert journal.retained_events == 1


@pytest.mark.parametrize(
    ("max_events", "max_bytes", "error"),
    [(0, 1, ValueError), (1, 0, ValueError), (-5, 10, ValueError), (True, 10, TypeError)],
)
def test_invalid_caps_are_refused(max_events: Any, max_bytes: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        LiveJournal(max_events, max_bytes)


# --- marker ------------------------------------------------------------------------------------


def _truncated_journal() -> LiveJournal:
    journal = LiveJournal(max_events=1, max_bytes=4096)
    feed(journal, [user_chunk(1), user_chunk(2)])
    return journal


def test_marker_with_prompt_and_record_id() -> None:
    journal = _truncated_journal()
    items = journal.snapshot(
        active_prompt_id=PROMPT, full_transcript_available=True, record_id="rec-9"
    )

    assert json.loads(items[0]) == {
        "v": 1,
        "type": "history_truncated",
        "promptId": PROMPT,
        "data": {
            "reason": "replay_window_exceeded",
            "scope": "live_journal",
            "truncatedEvents": 1,
            "retainedEvents": 1,
            "maxBytes": 4096,
            "maxEvents": 1,
            "recordId": "rec-9",
            "fullTranscriptAvailable": True,
        },
    }
    assert items[1:] == journal.entries()


def test_marker_without_prompt_or_record_id_and_transcript_unavailable() -> None:
    journal = _truncated_journal()
    marker = json.loads(
        journal.snapshot(active_prompt_id=None, full_transcript_available=False)[0]
    )

    assert marker == {
        "v": 1,
        "type": "history_truncated",
        "data": {
            "reason": "replay_window_exceeded",
            "scope": "live_journal",
            "truncatedEvents": 1,
            "retainedEvents": 1,
            "maxBytes": 4096,
            "maxEvents": 1,
            "fullTranscriptAvailable": False,
        },
    }
    assert "truncatedTurns" not in marker["data"]
    assert "_meta" not in marker


def test_no_marker_without_truncation() -> None:
    journal = LiveJournal()
    feed(journal, [user_chunk(1), chunk(2)])

    items = journal.snapshot(active_prompt_id=PROMPT, full_transcript_available=True)
    assert items == journal.entries()
    assert journal.marker(active_prompt_id=PROMPT, full_transcript_available=True) is None


def test_marker_is_built_per_snapshot_and_never_stored() -> None:
    journal = _truncated_journal()
    journal.snapshot(active_prompt_id=PROMPT, full_transcript_available=True)

    assert journal.entry_count == 1
    assert all(json.loads(item)["type"] != "history_truncated" for item in journal.entries())
    later = decoded(journal.snapshot(active_prompt_id=None, full_transcript_available=True))
    assert "promptId" not in later[0]


# --- summary journal -------------------------------------------------------------------------


def _update_event(event_id: int, update: JsonObject, event_type: str = "session_update") -> Event:
    event = make_event(
        event_id,
        event_type,
        {"sessionId": SESSION, "update": update},
        now_ms=NOW,
        prompt_id=PROMPT,
    )
    assert event is not None
    return event


@pytest.mark.parametrize(
    ("update", "expected"),
    [
        ({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "x"}}, True),
        ({"sessionUpdate": "tool_call", "toolCallId": "t", "_meta": {"parentToolCallId": ""}}, True),
        ({"sessionUpdate": "tool_call", "toolCallId": "t", "_meta": {"parentToolCallId": 3}}, True),
        ({"sessionUpdate": "tool_call", "toolCallId": "t", "_meta": {"parentToolCallId": "t"}}, True),
        (
            {"sessionUpdate": "tool_call_update", "toolCallId": "t2", "_meta": {"parentToolCallId": "t"}},
            False,
        ),
        (
            {
                "sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": "x"},
                "_meta": {"parentToolCallId": "t"},
            },
            False,
        ),
        (
            {
                "sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": ""},
                "_meta": {"parentToolCallId": "t", "usage": {"inputTokens": 3, "outputTokens": 1}},
            },
            True,
        ),
        (
            {
                "sessionUpdate": "agent_thought_chunk",
                "content": {"type": "text", "text": ""},
                "_meta": {"parentToolCallId": "t", "usage": {"inputTokens": 3}},
            },
            False,
        ),
        (
            {
                "sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": ""},
                "_meta": {"parentToolCallId": "t", "usage": 12},
            },
            False,
        ),
    ],
)
def test_in_summary(update: JsonObject, expected: bool) -> None:
    assert in_summary(_update_event(1, update)) is expected


def test_in_summary_keeps_other_event_types() -> None:
    event = _update_event(1, {"_meta": {"parentToolCallId": "t"}}, event_type="turn_complete")
    assert in_summary(event) is True


def _subagent_chunk(event_id: int) -> Event:
    return chunk(event_id, update_meta={"parentToolCallId": "task-1", "subagentType": "explore"})


def test_journals_pair_routes_events_and_enforces_caps_separately() -> None:
    journals = LiveJournals(max_events=2, max_bytes=DEFAULT_MAX_BYTES)
    top = [user_chunk(1), chunk(2)]
    sub = [user_chunk(3), _subagent_chunk(4), _subagent_chunk(5)]
    feed(journals, top)
    feed(journals, sub)

    # full: [1], [2], [3], [4+5] -> two entries kept, 2 events evicted.
    assert ids(journals.full.entries()) == [3, 5]
    assert journals.full.truncated_events == 2
    # summary never saw 4 and 5: [1], [2], [3] -> one evicted.
    assert ids(journals.summary.entries()) == [2, 3]
    assert journals.summary.truncated_events == 1
    assert journals.snapshot(
        "summary", active_prompt_id=None, full_transcript_available=True
    ) == journals.summary.snapshot(active_prompt_id=None, full_transcript_available=True)
    full_snap = decoded(
        journals.snapshot("full", active_prompt_id=PROMPT, full_transcript_available=True)
    )
    assert full_snap[0]["data"]["truncatedEvents"] == 2
    assert full_snap[0]["promptId"] == PROMPT


def test_journals_summary_keeps_subagent_usage_and_tool_call_frames() -> None:
    journals = LiveJournals()
    own_tool = _update_event(
        1,
        {"sessionUpdate": "tool_call", "toolCallId": "task-1", "_meta": {"parentToolCallId": "task-1"}},
    )
    usage = _update_event(
        2,
        {
            "sessionUpdate": "agent_message_chunk",
            "content": {"type": "text", "text": ""},
            "_meta": {"parentToolCallId": "task-1", "usage": {"totalTokens": 4}},
        },
    )
    feed(journals, [own_tool, _subagent_chunk(3), usage, _subagent_chunk(4)])

    assert ids(journals.summary.entries()) == [1, 2]
    assert ids(journals.full.entries()) == [1, 3, 2, 4]


def test_journals_reset_clears_both() -> None:
    journals = LiveJournals(max_events=1, max_bytes=DEFAULT_MAX_BYTES)
    feed(journals, [user_chunk(1), user_chunk(2)])
    journals.reset()

    for journal in (journals.full, journals.summary):
        assert journal.entry_count == 0
        assert journal.truncated_events == 0
        assert journal.retained_events == 0
        assert journal.total_bytes == 0


def test_journals_refuse_unknown_mode() -> None:
    journals = LiveJournals()
    with pytest.raises(ValueError, match="invalid live replay mode"):
        journals.snapshot("compact", active_prompt_id=None, full_transcript_available=True)
