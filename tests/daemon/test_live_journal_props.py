"""Property tests of the live journal over random event sequences.

Each generated event carries the parameters it was made from, so a naive model of merging and eviction
(lists of source events, sums recomputed every step) can predict the entries independently of
the implementation's merge key.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from daemon.core.envelope import Event, JsonObject
from daemon.core.live_journal import (
    JOIN_PIECES,
    MAX_EVENTS_PER_ENTRY,
    LiveJournal,
    LiveJournals,
    in_summary,
)

CHUNK_KINDS = ("agent_message_chunk", "agent_thought_chunk")


@dataclass(frozen=True)
class Spec:
    """How one event was generated."""

    kind: str  # a sessionUpdate kind, or "turn_note" for a non-session_update event
    prompt: str | None
    client: str | None
    session: str
    parent: str | None
    sources: tuple[str, ...] | None
    subagent: str | None
    extra: bool  # a non-whitelisted update key: never mergeable
    pad: int

    @property
    def mergeable_kind(self) -> bool:
        return self.kind in CHUNK_KINDS and not self.extra

    def compatible(self, other: Spec) -> bool:
        """Merge agreement, written from the generation parameters (subagentType may differ)."""
        return (
            self.mergeable_kind
            and other.mergeable_kind
            and (self.kind, self.prompt, self.client, self.session, self.parent, self.sources)
            == (other.kind, other.prompt, other.client, other.session, other.parent, other.sources)
        )


specs = st.builds(
    Spec,
    kind=st.sampled_from([*CHUNK_KINDS, *CHUNK_KINDS, *CHUNK_KINDS, "user_message_chunk", "turn_note"]),
    prompt=st.sampled_from(["p1", "p1", "p2", None]),
    client=st.sampled_from(["c1", "c1", None]),
    session=st.sampled_from(["s1", "s1", "s1", "s2"]),
    parent=st.sampled_from([None, None, "tc1", "tc2"]),
    sources=st.sampled_from([None, None, ("r1",), ("r1", "r2")]),
    subagent=st.none(),
    extra=st.sampled_from([False, False, False, True]),
    pad=st.just(0),
)


def make(event_id: int, spec: Spec) -> Event:
    # The id is in the text so concatenations also check order and completeness.
    text = f"[{event_id}]" + "x" * spec.pad
    if spec.kind == "turn_note":
        env: JsonObject = {"id": event_id, "v": 1, "type": "turn_note", "data": {"text": text}}
        return Event.from_env(env)
    update: JsonObject = {"sessionUpdate": spec.kind, "content": {"type": "text", "text": text}}
    meta: JsonObject = {"serverTimestamp": 1000 + event_id}
    if spec.parent is not None:
        meta["parentToolCallId"] = spec.parent
    if spec.subagent is not None:
        meta["subagentType"] = spec.subagent
    if spec.sources is not None:
        meta["qwenTranscript"] = {"sourceRecordIds": list(spec.sources)}
    update["_meta"] = meta
    if spec.extra:
        update["toolCallId"] = "extra"
    env = {"id": event_id, "v": 1, "type": "session_update"}
    env["data"] = {"sessionId": spec.session, "update": update}
    if spec.prompt is not None:
        env["promptId"] = spec.prompt
    if spec.client is not None:
        env["originatorClientId"] = spec.client
    env["_meta"] = {"serverTimestamp": 2000 + event_id}
    return Event.from_env(env)


def text_of(env: JsonObject) -> str:
    if env["type"] == "turn_note":
        text: str = env["data"]["text"]
        return text
    text = env["data"]["update"]["content"]["text"]
    return text


class Model:
    """Merging and eviction the slow, obvious way."""

    def __init__(self, max_events: int, max_bytes: int) -> None:
        self.max_events = max_events
        self.max_bytes = max_bytes
        self.entries: list[list[tuple[Spec, Event]]] = []
        self.truncated = 0

    def append(self, spec: Spec, event: Event) -> None:
        last = self.entries[-1] if self.entries else None
        if (
            last is not None
            and last[-1][0].compatible(spec)
            and len(last) < MAX_EVENTS_PER_ENTRY
            and sum(e.size for _, e in last) + event.size <= self.max_bytes
        ):
            last.append((spec, event))
        else:
            self.entries.append([(spec, event)])
        while len(self.entries) > self.max_events or (
            self.total_bytes() > self.max_bytes and len(self.entries) > 1
        ):
            self.truncated += len(self.entries.pop(0))

    def total_bytes(self) -> int:
        return sum(e.size for entry in self.entries for _, e in entry)

    def reset(self) -> None:
        self.entries.clear()
        self.truncated = 0


pads = st.one_of(st.integers(0, 40), st.integers(0, 40), st.integers(0, 1200))
subagents = st.sampled_from([None, "explore", "plan"])


@st.composite
def runs(draw: st.DrawFn) -> list[Spec]:
    """A run of events sharing one spec but for the text size: a chance to merge."""
    spec = draw(specs)
    variants = draw(st.lists(st.tuples(pads, subagents), min_size=1, max_size=8))
    return [dataclasses.replace(spec, pad=pad, subagent=sub) for pad, sub in variants]


# An operation is a run of events, or None for a turn-boundary reset.
operations = st.lists(st.one_of(runs(), runs(), runs(), st.none()), max_size=12).map(
    lambda ops: [item for op in ops for item in (op if op is not None else [None])]
)
caps = st.tuples(st.integers(1, 6), st.integers(150, 4000))


def check_against_model(journal: LiveJournal, model: Model, ingested: list[Event]) -> None:
    assert journal.entry_count <= journal.max_events
    assert journal.total_bytes <= journal.max_bytes or journal.entry_count == 1
    assert journal.retained_events + journal.truncated_events == len(ingested)
    assert journal.truncated_events == model.truncated
    assert journal.total_bytes == model.total_bytes()

    retained = ingested[len(ingested) - journal.retained_events :]
    assert journal.total_bytes == sum(event.size for event in retained)

    snapshot = journal.snapshot(active_prompt_id="p1", full_transcript_available=True)
    envs = [json.loads(item) for item in snapshot]  # every item is valid JSON
    if journal.truncated_events:
        marker, envs = envs[0], envs[1:]
        assert marker["type"] == "history_truncated"
        assert marker["data"]["truncatedEvents"] == journal.truncated_events
        assert marker["data"]["retainedEvents"] == journal.retained_events
    assert all(env["type"] != "history_truncated" for env in envs)

    assert "".join(text_of(env) for env in envs) == "".join(
        text_of(event.env) for event in retained
    )
    assert [env["id"] for env in envs] == [entry[-1][1].id for entry in model.entries]
    assert [text_of(env) for env in envs] == [
        "".join(text_of(e.env) for _, e in entry) for entry in model.entries
    ]


@given(caps=caps, ops=operations)
def test_journal_matches_model_and_invariants(
    caps: tuple[int, int], ops: list[Spec | None]
) -> None:
    max_events, max_bytes = caps
    journal = LiveJournal(max_events, max_bytes)
    model = Model(max_events, max_bytes)
    ingested: list[Event] = []
    for event_id, op in enumerate(ops, start=1):
        if op is None:
            journal.reset()
            model.reset()
            ingested.clear()
        else:
            event = make(event_id, op)
            journal.append(event)
            model.append(op, event)
            ingested.append(event)
        check_against_model(journal, model, ingested)


@given(caps=caps, ops=operations)
def test_journals_pair_summary_is_the_filtered_stream(
    caps: tuple[int, int], ops: list[Spec | None]
) -> None:
    max_events, max_bytes = caps
    journals = LiveJournals(max_events, max_bytes)
    full = LiveJournal(max_events, max_bytes)
    summary = LiveJournal(max_events, max_bytes)
    for event_id, spec in enumerate(ops, start=1):
        if spec is None:
            journals.reset()
            full.reset()
            summary.reset()
            continue
        event = make(event_id, spec)
        journals.append(event)
        full.append(event)
        if in_summary(event):
            summary.append(event)
        for mode, reference in (("full", full), ("summary", summary)):
            assert journals.snapshot(
                mode, active_prompt_id=None, full_transcript_available=False
            ) == reference.snapshot(active_prompt_id=None, full_transcript_available=False)


# -- runs of spliced chunks -----------------------------------------------------------------------


@given(
    st.lists(st.one_of(st.integers(0, 3), st.integers(0, 300)), min_size=1, max_size=700),
    st.lists(st.integers(1, 300), min_size=1, max_size=20),
    st.integers(2, 12),
    st.one_of(st.integers(400, 60_000), st.integers(150_000, 400_000)),
    st.booleans(),
    st.one_of(st.none(), st.integers(0, 1 << 40)),
)
def test_append_chunks_is_append_of_each(pads: list[int], runs: list[int], max_events: int,
                                         max_bytes: int, user_first: bool,
                                         shift: int | None) -> None:
    # The run path (one search per entry for how many events it takes) leaves both journals
    # exactly as appending each event: the same entries (256 sources at most, within the byte
    # cap), the same evictions and counters. Runs longer than an entry and byte caps that
    # cut entries short are both generated; so are the offsets the ring hands on (cumulative
    # sizes from wherever the ring's count stood: ``shift``) and none (summed here).
    check_runs_against_each(pads, runs, max_events, max_bytes, user_first, shift)


def test_append_chunks_fills_entries_to_256_sources_across_runs() -> None:
    entries = check_runs_against_each([0] * 600, [100, 37, 300], 10, 8 << 20, False)
    assert [entry.count for entry in entries] == [256, 256, 88]
    assert all(len(entry.pieces) < JOIN_PIECES for entry in entries)  # joined as they grew


def check_runs_against_each(pads: list[int], runs: list[int], max_events: int, max_bytes: int,
                            user_first: bool, shift: int | None = None) -> list[Any]:
    from daemon.core.frame_codec import EnvelopeSplicer
    from daemon.core.live_journal import plain_chunk_key

    session, prompt, client = "s1", "p1", "c1"
    splicer = EnvelopeSplicer(session, prompt, client, 1)
    one = LiveJournals(max_events, max_bytes)
    many = LiveJournals(max_events, max_bytes)
    next_id = 1
    if user_first:
        first = Event.from_env({"id": 1, "v": 1, "type": "session_update", "data": {
            "sessionId": session, "update": {"sessionUpdate": "user_message_chunk",
                                             "content": {"type": "text", "text": "u"}}}})
        one.append(first)
        many.append(first)
        next_id = 2
    texts = [f"t{i}-" + "x" * pad for i, pad in enumerate(pads)]
    events = []
    for i, text in enumerate(texts):
        update = json.dumps({"sessionUpdate": "agent_message_chunk",
                             "content": {"type": "text", "text": text}},
                            separators=(",", ":")).encode()
        events.append(Event.spliced(splicer.envelope(next_id + i, update), next_id + i,
                                    "session_update", prompt))
    for event in events:
        one.append(event)
    key = plain_chunk_key("agent_message_chunk", prompt, client, session)
    at, k = 0, 0
    while at < len(events):
        step = runs[k % len(runs)]
        run = events[at:at + step]
        offsets = None if shift is None else list(
            accumulate((event.size for event in run), initial=shift + at))
        many.append_chunks(run, texts[at:at + step], key, offsets)
        at += step
        k += 1
    for mode in ("full", "summary"):
        a, b = one.journal(mode), many.journal(mode)
        assert (len(b), b.total_bytes, b.retained_events, b.truncated_events) == (
            len(a), a.total_bytes, a.retained_events, a.truncated_events)
        assert b.snapshot(active_prompt_id=prompt, full_transcript_available=True) == \
            a.snapshot(active_prompt_id=prompt, full_transcript_available=True)
    return list(many.full._entries)
