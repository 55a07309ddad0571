"""Spliced agent updates: the bus's batch path for agent updates publishes exactly what the
general path (decode, publish the dict, encode) publishes, byte for byte, for updates in compact
form; the agent's spelling is kept otherwise, always compact and valid."""

from __future__ import annotations

import itertools
import json
import uuid
from typing import Any
from unittest import mock

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from daemon.bus import BusLimits, SessionBus
from daemon.core import frame_codec
from daemon.core.acp_codec import splice_updates, update_prefix
from daemon.core.cluster import event_run
from daemon.core.envelope import decode_json, encode_json, make_event
from daemon.core.frame_codec import EnvelopeSplicer, Splicer
from daemon.core.live_journal import LiveJournal, merge_key, plain_chunk_key
from daemon.core.updates import (
    UpdateBatch,
    compact,
    compact_chunks,
    plain_chunk,
    plain_chunk_lines,
    plain_chunk_run,
)
from daemon.transcript_store import AppendEvent
from sdk.protocol.events import SessionUpdateData, TurnCompleteData
from tests.hypothesis_profiles import examples

SID = "6f1c2a9e-0000-4000-8000-000000000001"
PROMPT = "70ed4f91-1eaf-4a5f-947b-012de441327f"
CLIENT = "client_e9d029a4"


class RecordingWriter:
    """The transcript writer's submit side: records every op."""

    def __init__(self) -> None:
        self.ops: list[object] = []
        self.failed_sessions: set[str] = set()

    def submit(self, op: object) -> int:
        self.ops.append(op)
        return len(self.ops)

    def reset_durable(self, session_id: str) -> None:
        pass

    def publish_guard(self, session_id: str) -> None:
        return None  # no cluster: nothing to check before publishing

    def stored_events(self) -> list[tuple[int, bytes]]:
        """(id, raw) of every event the AppendEvent ops carry, a run's row split back (its
        envelopes made again from its template, when it has one)."""
        out: list[tuple[int, bytes]] = []
        for op in self.ops:
            if isinstance(op, AppendEvent):
                first, _, joined = event_run(op)
                out.extend(zip(itertools.count(first), joined.split(b"\n"), strict=False))
        return out


def new_bus(max_events: int, max_bytes: int) -> tuple[SessionBus, RecordingWriter]:
    writer = RecordingWriter()
    bus = SessionBus(SID, BusLimits(max_events, max_bytes, 4 * 1024 * 1024, 64),
                     writer,  # type: ignore[arg-type]
                     clock_ms=lambda: 1_796_204_622_451)
    return bus, writer


def text_chunk(kind: str, text: str) -> dict[str, Any]:
    return {"sessionUpdate": kind, "content": {"type": "text", "text": text}}


def is_plain(update: dict[str, Any]) -> bool:
    content = update.get("content")
    return (set(update) == {"sessionUpdate", "content"} and isinstance(content, dict)
            and set(content) == {"type", "text"} and content["type"] == "text"
            and update["sessionUpdate"] in ("agent_message_chunk", "agent_thought_chunk"))


texts = st.text(max_size=30)
plain = st.builds(text_chunk, st.sampled_from(["agent_message_chunk", "agent_thought_chunk"]),
                  texts)
# Updates the batch path must hand to the general path: not plain text chunks.
others = st.one_of(
    st.builds(lambda t: {**text_chunk("agent_message_chunk", t),
                         "_meta": {"timestamp": 42, "parentToolCallId": "tc"}}, texts),
    st.builds(lambda t: {**text_chunk("agent_message_chunk", t),
                         "_meta": {"usage": {"inputTokens": 3}}}, texts),
    st.builds(lambda n: {"sessionUpdate": "tool_call", "toolCallId": f"t{n}",
                         "status": "pending"}, st.integers(0, 3)),
    st.just({"sessionUpdate": "agent_message_chunk",
             "content": {"type": "image", "data": "AA==", "mimeType": "image/png"}}),
    st.just({"sessionUpdate": "user_message_chunk", "content": {"type": "text", "text": "u"}}),
    st.just({"sessionUpdate": "agent_message_chunk",
             "content": {"type": "text", "text": "x", "annotations": None}}),
    st.just({"sessionUpdate": "plan", "entries": []}),
)


def publish_both(updates: list[dict[str, Any]], max_events: int, max_bytes: int,
                 prompt_id: str | None, client_id: str | None, batch: int
                 ) -> tuple[tuple[SessionBus, RecordingWriter], tuple[SessionBus, RecordingWriter]]:
    """The same updates through the batch path (``publish_updates`` in batches of ``batch``)
    and through the general path (``publish`` of each decoded update), record ids made
    deterministic so the compacted turns compare too."""
    results = []
    for batch_path in (True, False):
        ids = (uuid.UUID(int=n) for n in itertools.count(1))
        with mock.patch("daemon.bus.uuid.uuid4", ids.__next__):
            bus, writer = new_bus(max_events, max_bytes)
            raws = [encode_json(u) for u in updates]
            if batch_path:
                for start in range(0, len(raws), batch):
                    bus.publish_updates(UpdateBatch.of(raws[start:start + batch]), prompt_id=prompt_id,
                                        originator_client_id=client_id)
            else:
                for update in updates:
                    bus.publish(SessionUpdateData(session_id=SID, update=update),
                                prompt_id=prompt_id, originator_client_id=client_id,
                                flush=False)
            bus.publish_terminal(TurnCompleteData(session_id=SID, stop_reason="end_turn",
                                                  prompt_id=prompt_id or ""),
                                 prompt_id=prompt_id, originator_client_id=client_id,
                                 ledger_terminal="completed", stop_reason="end_turn")
        results.append((bus, writer))
    return results[0], results[1]


def journal_state(journal: LiveJournal) -> tuple[object, ...]:
    return (journal.snapshot(active_prompt_id=PROMPT, full_transcript_available=True),
            journal.entry_count, journal.total_bytes, journal.retained_events,
            journal.truncated_events)


@settings(max_examples=examples(150), deadline=None)
@given(
    updates=st.lists(st.one_of(plain, plain, plain, others), min_size=1, max_size=80),
    max_events=st.integers(1, 8),
    max_bytes=st.integers(300, 6000),
    ids=st.sampled_from([(PROMPT, CLIENT), (PROMPT, None), (None, None)]),
    batch=st.integers(1, 70),
)
def test_batch_path_publishes_what_the_general_path_publishes(
        updates: list[dict[str, Any]], max_events: int, max_bytes: int,
        ids: tuple[str | None, str | None], batch: int) -> None:
    prompt_id, client_id = ids
    (fast, fast_writer), (ref, ref_writer) = publish_both(
        updates, max_events, max_bytes, prompt_id, client_id, batch)
    # Same ids, same bytes in the ring and in the transcript.
    assert [e.raw for e in fast.ring.since(0)] == [e.raw for e in ref.ring.since(0)]
    assert [(e.id, e.type, e.prompt_id, e.size) for e in fast.ring.since(0)] == [
        (e.id, e.type, e.prompt_id, e.size) for e in ref.ring.since(0)]
    assert fast_writer.stored_events() == ref_writer.stored_events()
    # A batch of nothing but plain chunks of one kind reaches the transcript as one run op
    # with its template (never as its envelopes); the general path never makes one.
    assert not any(op.run for op in ref_writer.ops if isinstance(op, AppendEvent))
    if batch >= len(updates) and all(map(is_plain, updates)) and len(
            {u["sessionUpdate"] for u in updates}) == 1:
        assert [op.run is not None for op in fast_writer.ops  # the turn's terminal follows
                if isinstance(op, AppendEvent) and op.event_id <= len(updates)] == [True]
    # In a mixed batch too, every plain chunk reaches the transcript inside a run op: none is
    # stored as its envelope.
    for op in fast_writer.ops:
        if isinstance(op, AppendEvent) and op.run is None:
            for raw in op.raw.split(b"\n"):
                event = decode_json(raw)
                assert not (event["type"] == "session_update"
                            and is_plain(event["data"]["update"])), event
    # The compacted turn (window segment and transcript records) is the same.
    assert fast.window.snapshot(full_transcript_available=True) == ref.window.snapshot(
        full_transcript_available=True)
    assert [op for op in fast_writer.ops if not isinstance(op, AppendEvent)] == [
        op for op in ref_writer.ops if not isinstance(op, AppendEvent)]


@settings(max_examples=examples(150), deadline=None)
@given(
    updates=st.lists(st.one_of(plain, plain, plain, others), min_size=1, max_size=80),
    max_events=st.integers(1, 8),
    max_bytes=st.integers(300, 6000),
    batch=st.integers(1, 70),
)
def test_batch_path_journals_match_the_general_path_mid_turn(
        updates: list[dict[str, Any]], max_events: int, max_bytes: int, batch: int) -> None:
    fast, _ = new_bus(max_events, max_bytes)
    ref, _ = new_bus(max_events, max_bytes)
    raws = [encode_json(u) for u in updates]
    for start in range(0, len(raws), batch):
        fast.publish_updates(UpdateBatch.of(raws[start:start + batch]), prompt_id=PROMPT,
                             originator_client_id=CLIENT)
        for update in updates[start:start + batch]:
            ref.publish(SessionUpdateData(session_id=SID, update=update),
                        prompt_id=PROMPT, originator_client_id=CLIENT, flush=False)
        # Merged entries, evictions and both counters agree after every batch.
        assert journal_state(fast.journals.full) == journal_state(ref.journals.full)
        assert journal_state(fast.journals.summary) == journal_state(ref.journals.summary)


def test_splicer_matches_make_event_byte_for_byte() -> None:
    update = text_chunk("agent_message_chunk", 'hé "quoted" \\ \n tab\t')
    for prompt_id, client_id in ((PROMPT, CLIENT), (PROMPT, None), (None, CLIENT), (None, None)):
        expected = make_event(7, "session_update", {"sessionId": SID, "update": update},
                              now_ms=123, prompt_id=prompt_id, originator_client_id=client_id)
        assert expected is not None
        splicer = EnvelopeSplicer(SID, prompt_id, client_id, 123)
        assert splicer.envelope(7, encode_json(update)) == expected.raw


def test_a_session_splicer_encodes_its_envelope_once_per_prompt_whatever_the_millisecond(
) -> None:
    """A paced turn publishes in a new millisecond every time: the splicer fills the kept
    pieces with the new timestamp (the envelope encoded again only for a new prompt or
    originator), and every envelope is still make_event's, byte for byte."""
    update = text_chunk("agent_message_chunk", "%d %b 100% é")
    encoded = encode_json(update)
    splicer = Splicer(SID)
    calls: list[object] = []
    real = frame_codec.envelope_template

    def counted(*args: Any, **kwargs: Any) -> list[bytes]:
        calls.append(args)
        return real(*args, **kwargs)

    with mock.patch.object(frame_codec, "envelope_template", counted):
        event_id = 1
        for prompt_id, client_id in ((PROMPT, CLIENT), (PROMPT, None), (None, None)):
            for now in (1_796_204_640_885, 1_796_204_640_909, 9, 1_796_204_641_000):
                events, _ = splicer.run(prompt_id, client_id, now, event_id, [encoded])
                expected = make_event(event_id, "session_update",
                                      {"sessionId": SID, "update": update}, now_ms=now,
                                      prompt_id=prompt_id, originator_client_id=client_id)
                assert expected is not None and events[0].raw == expected.raw
                event_id += 1
    assert len(calls) == 3  # one per prompt and originator, not one per millisecond


def test_plain_chunk_takes_only_exact_text_chunks() -> None:
    assert plain_chunk(b'{"content":{"text":"a","type":"text"},"sessionUpdate":'
                       b'"agent_thought_chunk"}') == ("agent_thought_chunk", "a")
    for update in (
        {**text_chunk("agent_message_chunk", "a"), "_meta": {}},
        {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "a", "x": 1}},
        {"sessionUpdate": "agent_message_chunk", "content": {"type": "image", "text": "a"}},
        {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": 5}},
        text_chunk("user_message_chunk", "a"),
        {"sessionUpdate": "tool_call", "toolCallId": "t"},
    ):
        assert plain_chunk(encode_json(update)) is None, update
    assert plain_chunk(b'{"sessionUpdate":"agent_message_chunk","content":{"type":"text",'
                       b'"text":"\xff"}}') is None  # invalid UTF-8 is refused, never spliced
    assert plain_chunk(b"[1]") is None


# Raw update bytes as an agent channel could hand them on: encoded updates of every kind, plus
# spellings the decoder must judge (escapes, bad UTF-8, bad JSON, values that are not objects).
raw_updates = st.one_of(
    st.builds(encode_json, plain), st.builds(encode_json, plain), st.builds(encode_json, others),
    st.sampled_from([
        b'{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"\\u00e9\\n"}}',
        b'{"content":{"text":"a","type":"text"},"sessionUpdate":"agent_message_chunk"}',
        b'{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"\xff"}}',
        b'{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"a"}',
        b'{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"a"}},{}',
        b'{"sessionUpdate":"agent_message_chunk","content":{"type":"image","text":"a"}}',
        b"[1]", b"7", b"",
    ]),
)


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(raw_updates, max_size=12))
def test_plain_chunk_run_is_the_verdict_of_each(updates: list[bytes]) -> None:
    each = [plain_chunk(update) for update in updates]
    kinds = {chunk[0] for chunk in each if chunk is not None}
    expected = None
    if updates and None not in each and len(kinds) == 1:
        expected = (kinds.pop(), [chunk[1] for chunk in each if chunk is not None])
    assert plain_chunk_run(updates) == expected


def test_envelopes_are_envelope_of_each() -> None:
    updates = [encode_json(text_chunk("agent_message_chunk", t)) for t in ("a", "100%", "%d")]
    for session_id, prompt_id, client_id in ((SID, PROMPT, CLIENT), (SID, None, None),
                                             ("s%d", "p%s", "c%b")):
        splicer = EnvelopeSplicer(session_id, prompt_id, client_id, 1796204640885)
        assert splicer.envelopes(41, updates) == [
            splicer.envelope(41 + i, update) for i, update in enumerate(updates)]


def test_agent_whitespace_is_removed_and_its_spelling_kept() -> None:
    update = text_chunk("agent_message_chunk", "a, b: c  é")
    spaced = json.dumps(update, ensure_ascii=False).encode()
    assert b", " in spaced and b": " in spaced
    # Outside strings only: the result is msgspec's compact encoding here.
    assert compact(spaced) == encode_json(update)
    assert compact(b'{"a":1}') == b'{"a":1}'
    escaped = json.dumps(update).encode()  # "\u00e9": the agent's spelling stays
    bus, writer = new_bus(100, 1 << 20)
    bus.publish_updates(UpdateBatch.of([compact(raw) for raw in (
        spaced, escaped, b'{"sessionUpdate": "plan", "entries": [ ]}')]),
        prompt_id=PROMPT, originator_client_id=CLIENT)
    events = bus.ring.since(0)
    assert len(events) == 3
    for event in events:
        assert msgspec.json.format(event.raw, indent=-1) == event.raw  # compact
        assert event.size == len(event.raw)
        assert msgspec.json.decode(event.raw)["id"] == event.id
    assert decode_json(events[0].raw)["data"]["update"] == update
    assert b"\\u00e9" in events[1].raw
    assert decode_json(events[1].raw)["data"]["update"] == update
    assert decode_json(events[2].raw)["data"]["update"] == {"sessionUpdate": "plan",
                                                            "entries": []}
    assert [raw for _, raw in writer.stored_events()] == [e.raw for e in events]


def test_an_update_that_is_not_an_object_is_dropped_without_an_id() -> None:
    bus, _ = new_bus(100, 1 << 20)
    bus.publish_updates(UpdateBatch.of([b"[1,2]", b'"x"', b"{bad", encode_json(text_chunk(
        "agent_message_chunk", "ok"))]), prompt_id=None, originator_client_id=None)
    events = bus.ring.since(0)
    assert [e.id for e in events] == [1]
    assert decode_json(events[0].raw)["data"]["update"]["content"]["text"] == "ok"


def test_plain_chunk_key_is_the_merge_key_of_a_spliced_chunk() -> None:
    for prompt_id, client_id in ((PROMPT, CLIENT), (None, None)):
        bus, _ = new_bus(100, 1 << 20)
        bus.publish_updates(UpdateBatch.of([encode_json(text_chunk("agent_thought_chunk", "t"))]),
                            prompt_id=prompt_id, originator_client_id=client_id)
        event = bus.ring.since(0)[0]
        assert merge_key(decode_json(event.raw)) == plain_chunk_key(
            "agent_thought_chunk", prompt_id, client_id, SID)


def test_long_runs_fill_merged_entries_to_their_event_limit_like_the_general_path() -> None:
    # 256 source events per merged entry at most: runs crossing that limit split where the
    # general path splits (and at the byte cap, for the second pair of caps).
    for max_events, max_bytes in ((10_000, 8 * 1024 * 1024), (3, 60_000)):
        fast, _ = new_bus(max_events, max_bytes)
        ref, _ = new_bus(max_events, max_bytes)
        updates = [text_chunk("agent_message_chunk", f"chunk-{i}") for i in range(1500)]
        raws = [encode_json(u) for u in updates]
        for start in range(0, len(raws), 100):
            fast.publish_updates(UpdateBatch.of(raws[start:start + 100]), prompt_id=PROMPT,
                                 originator_client_id=CLIENT)
        for update in updates:
            ref.publish(SessionUpdateData(session_id=SID, update=update),
                        prompt_id=PROMPT, originator_client_id=CLIENT, flush=False)
        assert journal_state(fast.journals.full) == journal_state(ref.journals.full)
        assert journal_state(fast.journals.summary) == journal_state(ref.journals.summary)
    assert fast.journals.full.truncated_events > 0


_PREFIX = update_prefix("acp-s")


def _line_of(middle: bytes) -> bytes:
    return _PREFIX + middle + b"}}"


# Line middles: plain chunks (compact or with the agent's whitespace), other updates, and
# pieces that are JSON only when joined with a neighbour.
line_middles = st.one_of(
    raw_updates, raw_updates,
    st.builds(lambda u: json.dumps(u).encode(), plain),
    st.sampled_from([
        b'{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"a"}},'
        b'{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"',
        b'"}}', b'{"}}', b'{"sessionUpdate":"agent_message_chunk"',
        b'"content":{"type":"text","text":"a"}}',
        b'{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"}',
        b' {"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"a"}}',
    ]),
)


# Runs of one kind, so that the accepting path is drawn often, besides anything at all.
one_kind_middles = st.sampled_from(["agent_message_chunk", "agent_thought_chunk"]).flatmap(
    lambda kind: st.lists(st.builds(lambda t: encode_json(text_chunk(kind, t)), texts),
                          min_size=1, max_size=10))


@settings(max_examples=examples(400), deadline=None)
@given(st.one_of(st.lists(line_middles, max_size=10), one_kind_middles),
       st.one_of(st.none(), st.integers(0, 9)))
def test_plain_chunk_lines_is_splice_updates_then_plain_chunk_run(middles: list[bytes],
                                                                   foreign: int | None) -> None:
    lines = [_line_of(m) for m in middles]
    if foreign is not None and lines:
        # Another session's line, anywhere in the batch.
        at = foreign % len(lines)
        lines[at] = update_prefix("other") + middles[at] + b"}}"
    spliced = splice_updates(lines, _PREFIX)
    run = plain_chunk_run(spliced) if spliced else None
    expected = None if run is None else (spliced, run)
    assert plain_chunk_lines(lines, _PREFIX) == expected


def test_plain_chunk_lines_refuses_middles_that_only_join_into_chunks() -> None:
    head = b'{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"'
    one = head + b'a"}}'
    # Joined by "," these would be two plain chunks; neither second line is JSON alone.
    for pair in ([one + b"," + head, b'"}}'], [one + b"," + head + b"}", b'{"}}'],
                 [b'{"sessionUpdate":"agent_message_chunk"', b'"content":{"type":"text",'
                  b'"text":"a"}}']):
        assert plain_chunk_lines([_line_of(m) for m in pair], _PREFIX) is None
    assert plain_chunk_lines([_line_of(one)] * 3, _PREFIX) == (
        [one] * 3, ("agent_message_chunk", ["a"] * 3))


def _chunk(kind: str, text: str) -> bytes:
    return encode_json(text_chunk(kind, text))


def test_plain_chunk_lines_reads_either_kind_but_not_both() -> None:
    thoughts = [_chunk("agent_thought_chunk", t) for t in ("a", "b")]
    assert plain_chunk_lines([_line_of(m) for m in thoughts], _PREFIX) == (
        thoughts, ("agent_thought_chunk", ["a", "b"]))
    for mixed in ([_chunk("agent_message_chunk", "a"), _chunk("agent_thought_chunk", "b")],
                  [_chunk("agent_thought_chunk", "a"), _chunk("agent_message_chunk", "b")]):
        assert plain_chunk_lines([_line_of(m) for m in mixed], _PREFIX) is None


def test_plain_chunk_lines_checks_every_line_not_only_the_ends() -> None:
    good = _line_of(_chunk("agent_message_chunk", "a"))
    other_session = update_prefix("other") + _chunk("agent_message_chunk", "a") + b"}}"
    no_suffix = _line_of(_chunk("agent_message_chunk", "a"))[:-2] + b"  "
    not_an_object = _PREFIX + b'["agent_message_chunk"]}}'
    two_in_one = _line_of(_chunk("agent_message_chunk", "a") + b","
                          + _chunk("agent_message_chunk", "b"))
    for odd in (other_session, no_suffix, not_an_object, two_in_one):
        assert plain_chunk_lines([good, odd, good], _PREFIX) is None


def test_plain_chunk_lines_refuses_lines_holding_a_newline() -> None:
    # LineSplitter never makes one; the joints' reasoning needs that, so it is checked. This
    # line is even valid JSON (the newline is whitespace between members).
    spaced = b'{"sessionUpdate":"agent_message_chunk",\n"content":{"type":"text","text":"a"}}'
    assert splice_updates([_line_of(spaced)], _PREFIX) == [spaced]
    assert plain_chunk_lines([_line_of(spaced)], _PREFIX) is None


def test_the_envelope_template_follows_the_prompt_the_originator_and_the_clock() -> None:
    # The bus keeps its last template while prompt, originator and millisecond stay the same:
    # a chunk published after any of them changed carries the new value.
    now = [1_000]
    writer = RecordingWriter()
    bus = SessionBus(SID, BusLimits(100, 1 << 20, 1 << 20, 64), writer,  # type: ignore[arg-type]
                     clock_ms=lambda: now[0])
    chunk = [_chunk("agent_message_chunk", "a")]
    steps = [(PROMPT, CLIENT, 1_000), (PROMPT, CLIENT, 1_000), (PROMPT, CLIENT, 1_001),
             (PROMPT, None, 1_001), ("p2", None, 1_001), ("p2", CLIENT, 1_001)]
    for prompt_id, client_id, at in steps:
        now[0] = at
        bus.publish_updates(UpdateBatch.of(chunk), prompt_id=prompt_id, originator_client_id=client_id)
        bus.publish_updates(UpdateBatch.of(chunk * 2), prompt_id=prompt_id, originator_client_id=client_id)
    envs = [decode_json(raw) for _, raw in writer.stored_events()]
    assert [(e.get("promptId"), e.get("originatorClientId"), e["_meta"]["serverTimestamp"])
            for e in envs] == [step for step in steps for _ in range(3)]
    assert [e["id"] for e in envs] == list(range(1, 3 * len(steps) + 1))


_WS = st.sampled_from([" ", "  ", "\t", "\r", "\n", " \r\n"])


@st.composite
def spelled_chunk(draw: st.DrawFn) -> bytes:
    """A plain text chunk as an agent might spell it: either kind, any text (escaped or not,
    some spaces written as \\u0020), members in either order, whitespace anywhere between
    tokens, or none."""
    kind = draw(st.sampled_from(["agent_message_chunk", "agent_thought_chunk"]))
    text = json.dumps(draw(st.text(alphabet=st.characters(codec="utf-8"), max_size=20)
                           | st.sampled_from(["a b", " ", "a\u0020b", "x, y: {z}"])),
                      ensure_ascii=draw(st.booleans()))
    if draw(st.booleans()):
        text = text.replace(" ", "\\u0020", 1)

    # Whitespace in a few of the places between tokens (often one: the case where a space
    # outside the strings could pass for a space of the text).
    spots = draw(st.dictionaries(st.integers(0, 19), _WS, max_size=3))
    slot = itertools.count()

    def ws() -> str:
        return spots.get(next(slot), "")

    def obj(members: list[tuple[str, str]]) -> str:
        if draw(st.booleans()):
            members = members[::-1]
        body = ("," + ws()).join(f'{ws()}"{k}"{ws()}:{ws()}{v}{ws()}' for k, v in members)
        return "{" + body + "}"

    content = obj([("type", '"text"'), ("text", text)])
    return (ws() + obj([("sessionUpdate", f'"{kind}"'), ("content", content)]) + ws()).encode()


@settings(max_examples=examples(500), deadline=None)
@given(st.lists(spelled_chunk(), min_size=1, max_size=8))
def test_compact_chunks_is_compact_of_each(updates: list[bytes]) -> None:
    texts = []
    for update in updates:
        found = plain_chunk(update)
        assert found is not None, update
        texts.append(found[1])
    assert compact_chunks(updates, texts) == [compact(update) for update in updates]


def test_compact_chunks_hands_back_compact_updates_untouched() -> None:
    updates = [_chunk("agent_message_chunk", t) for t in ("a b", "  c  ", "d")]
    assert compact_chunks(updates, ["a b", "  c  ", "d"]) is updates
    # One space outside a string is enough to have them all made compact.
    spaced = [*updates[:2], updates[2].replace(b'"content":', b'"content": ')]
    assert compact_chunks(spaced, ["a b", "  c  ", "d"]) == updates

    # A space outside the strings next to one spelled \\u0020 in the text: as many raw
    # spaces as the text holds, and still not compact.
    escaped = b'{"sessionUpdate":"agent_message_chunk", "content":{"type":"text","text":"a\\u0020b"}}'
    assert compact_chunks([escaped], ["a b"]) == [compact(escaped)] != [escaped]
    tabbed = b'{"sessionUpdate":"agent_message_chunk",\t"content":{"type":"text","text":"a"}}'
    assert compact_chunks([tabbed], ["a"]) == [compact(tabbed)] != [tabbed]
