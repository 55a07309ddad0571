"""Live-journal details pinned down by mutation testing."""

from __future__ import annotations

import json

import pytest

from daemon.core.envelope import Event, JsonObject
from daemon.core.live_journal import LiveJournal, LiveJournals, in_summary
from tests.builders.live_journal import chunk


def _merges(meta: JsonObject) -> bool:
    journal = LiveJournal()
    journal.append(chunk(1, update_meta=meta))
    journal.append(chunk(2, update_meta=meta))
    return journal.entry_count == 1


def test_transcript_meta_with_only_a_plan_tool_call_id_merges() -> None:
    assert _merges({"qwenTranscript": {"planToolCallId": "plan-1"}})


def test_transcript_meta_with_only_source_record_ids_merges() -> None:
    assert _merges({"qwenTranscript": {"sourceRecordIds": ["r1", "r2"]}})


def test_transcript_meta_with_ill_typed_members_does_not_merge() -> None:
    assert not _merges({"qwenTranscript": {"planToolCallId": 3}})
    assert not _merges({"qwenTranscript": {"sourceRecordIds": "r1"}})
    assert not _merges({"qwenTranscript": {"sourceRecordIds": [1]}})
    assert not _merges({"qwenTranscript": {"other": "x"}})


def _odd(data: object) -> Event:
    return Event.from_env({"id": 1, "v": 1, "type": "session_update", "data": data})


def test_summary_keeps_session_updates_it_cannot_read() -> None:
    # Only frames positively identified as subagent-internal are dropped from the summary.
    assert in_summary(_odd("not an object")) is True
    assert in_summary(_odd({"sessionId": "s", "update": ["not", "an", "object"]})) is True
    assert in_summary(_odd({"sessionId": "s", "update": {"sessionUpdate": "plan", "_meta": 5}}))


def test_pair_snapshot_names_the_record_id_in_the_marker() -> None:
    journals = LiveJournals(max_events=1)
    journals.append(chunk(1, kind="user_message_chunk"))
    journals.append(chunk(2, kind="user_message_chunk"))
    for mode in ("full", "summary"):
        items = journals.snapshot(
            mode, active_prompt_id="p", full_transcript_available=True, record_id="rec-4"
        )
        marker = json.loads(items[0])
        assert marker["type"] == "history_truncated"
        assert marker["data"]["recordId"] == "rec-4"
        assert [json.loads(i)["id"] for i in items[1:]] == [2]


def test_byte_cap_is_inclusive_after_eviction() -> None:
    # Entries exactly filling max_bytes are within the cap (eviction runs while bytes > cap).
    events = [chunk(i, "same", kind="user_message_chunk") for i in range(1, 5)]
    assert len({e.size for e in events}) == 1
    journal = LiveJournal(max_bytes=3 * events[0].size)
    for event in events:
        journal.append(event)
    assert journal.total_bytes == journal.max_bytes
    assert [json.loads(i)["id"] for i in journal.entries()] == [2, 3, 4]
    assert (journal.retained_events, journal.truncated_events) == (3, 1)


def test_absent_source_record_ids_agree_with_a_transcript_without_them() -> None:
    # Merging: the envelopes must agree on sourceRecordIds; absent on both sides agrees.
    journal = LiveJournal()
    journal.append(chunk(1, update_meta={"qwenTranscript": {"planToolCallId": "plan"}}))
    journal.append(chunk(2))
    journal.append(chunk(3, update_meta={"qwenTranscript": {"planToolCallId": "plan"}}))
    assert journal.entry_count == 1
    assert json.loads(journal.entries()[0])["data"]["update"]["content"]["text"] == "t1t2t3"


def test_chunks_without_a_session_id_merge() -> None:
    def bare(event_id: int) -> Event:
        return Event.from_env({"id": event_id, "v": 1, "type": "session_update", "data": {
            "update": {"sessionUpdate": "agent_message_chunk",
                       "content": {"type": "text", "text": f"t{event_id}"}}}})

    journal = LiveJournal()
    journal.append(bare(1))
    journal.append(bare(2))
    assert journal.entry_count == 1


def test_envelope_meta_beyond_the_timestamps_prevents_merging() -> None:
    def with_env_meta(event_id: int, meta: JsonObject) -> Event:
        env = json.loads(chunk(event_id).raw)
        env["_meta"] = meta
        return Event.from_env(env)

    for meta in ({"other": 1}, {"serverTimestamp": 1, "other": 2}):
        journal = LiveJournal()
        journal.append(with_env_meta(1, meta))
        journal.append(with_env_meta(2, meta))
        assert journal.entry_count == 2, meta
    journal = LiveJournal()
    journal.append(with_env_meta(1, {"timestamp": 1, "serverTimestamp": 2}))
    journal.append(with_env_meta(2, {"timestamp": 3}))
    assert journal.entry_count == 1


def test_update_meta_with_every_allowed_key_merges() -> None:
    meta = {"timestamp": 1, "serverTimestamp": 2, "parentToolCallId": "task",
            "subagentType": "explore", "qwenTranscript": {"sourceRecordIds": ["r"]}}
    assert _merges(meta)


def test_one_big_event_evicts_several_merged_entries_and_counts_their_sources() -> None:
    small = [chunk(1, kind="user_message_chunk"), chunk(2), chunk(3),
             chunk(4, kind="user_message_chunk"), chunk(5), chunk(6), chunk(7)]
    total = sum(e.size for e in small)
    # The big event alone fits; with any one of the older entries it does not.
    big = chunk(8, "", kind="user_message_chunk")
    big = chunk(8, "x" * (total - big.size), kind="user_message_chunk")
    assert big.size == total
    journal = LiveJournal(max_bytes=total)
    for event in small:
        journal.append(event)
    # Entries: [1], [2+3], [4], [5+6+7].
    assert journal.entry_count == 4 and journal.truncated_events == 0
    journal.append(big)
    assert [json.loads(i)["id"] for i in journal.entries()] == [8]
    assert journal.total_bytes == big.size
    assert (journal.retained_events, journal.truncated_events) == (1, 7)


def test_an_invalid_cap_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"^max_events must be a positive integer, got 0$"):
        LiveJournal(max_events=0)
    with pytest.raises(ValueError, match=r"^max_bytes must be a positive integer, got -1$"):
        LiveJournal(max_bytes=-1)
    with pytest.raises(TypeError, match=r"^max_bytes must be an int, got float$"):
        LiveJournal(max_bytes=1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^max_events must be an int, got bool$"):
        LiveJournals(max_events=True)
