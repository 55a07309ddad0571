"""Runs of spliced chunks in the transcript: stored as their template and updates, read back as
the very envelopes the bus made, beside envelope rows and rows an older daemon wrote."""

from __future__ import annotations

import sqlite3
import tempfile
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from daemon.core.frame_codec import EnvelopeSplicer
from daemon.transcript_store import (
    ROW_MAX_BYTES,
    SCHEMA_VERSION,
    AdmitPrompt,
    AppendEvent,
    DamagedRow,
    FinishTurn,
    TranscriptDatabase,
    UpsertSession,
)
from tests.hypothesis_profiles import examples
from tests.transcript_v2 import OldTranscript

S1 = "11111111-1111-4111-8111-111111111111"
S2 = "22222222-2222-4222-8222-222222222222"
PROMPT = "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d"
CLIENT = "client_3c4d5e6f"


def chunk_update(text: str) -> bytes:
    return msgspec.json.encode({"sessionUpdate": "agent_message_chunk",
                                "content": {"type": "text", "text": text}})


def plain_event(event_id: int, text: str) -> bytes:
    return msgspec.json.encode({"id": event_id, "v": 1, "type": "tool_call", "data": text})


class Turn:
    """One session's events as the bus hands them to the writer, and the envelopes it made."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.next_id = 1
        self.envelopes: list[bytes] = []

    def run(self, texts: list[str], prompt_id: str | None, client_id: str | None,
            now_ms: int) -> AppendEvent:
        splicer = EnvelopeSplicer(self.session_id, prompt_id, client_id, now_ms)
        updates = [chunk_update(text) for text in texts]
        first = self.next_id
        self.envelopes += splicer.envelopes(first, updates)
        self.next_id += len(updates)
        return AppendEvent(self.session_id, self.next_id - 1, prompt_id,
                           b"\n".join(updates), splicer.template(first))

    def plain(self, texts: list[str]) -> AppendEvent:
        raws = [plain_event(self.next_id + i, text) for i, text in enumerate(texts)]
        self.envelopes += raws
        self.next_id += len(raws)
        return AppendEvent(self.session_id, self.next_id - 1, None, b"\n".join(raws))


def new_store(path: Path) -> TranscriptDatabase:
    store = TranscriptDatabase(path)
    store.apply([UpsertSession(S1, "/w", 1), UpsertSession(S2, "/w", 2)])
    return store


def stored_bytes(path: Path, session_id: str) -> int:
    conn = sqlite3.connect(path)
    try:
        return int(conn.execute("SELECT sum(length(raw)) FROM raw_events WHERE session_id = ?",
                                (session_id,)).fetchone()[0])
    finally:
        conn.close()


# Mostly short texts (some with what JSON or a %-format must escape), now and then one big
# enough that a few of them pass a row's cap.
text = st.one_of(st.text(max_size=12), st.text(max_size=12),
                 st.text(alphabet="%\\\"\n\u2028é", max_size=6),
                 st.integers(1, 2).map(lambda n: "y" * (n * ROW_MAX_BYTES // 4)))
step = st.tuples(
    st.sampled_from([S1, S2]),
    st.booleans(),  # a run of spliced chunks, or plain envelopes
    st.lists(text, min_size=1, max_size=12),
    st.sampled_from([(PROMPT, CLIENT), (PROMPT, None), (None, None), ("p%d", "c%b")]),
    st.integers(0, 3),  # the clock's millisecond moves on
)


@settings(max_examples=examples(40), deadline=None)
@given(steps=st.lists(step, min_size=1, max_size=25), cuts=st.lists(st.integers(1, 8)),
       with_other_ops=st.booleans())
def test_runs_read_back_as_the_envelopes_byte_for_byte(
        steps: list[tuple[str, bool, list[str], tuple[str | None, str | None], int]],
        cuts: list[int], with_other_ops: bool) -> None:
    turns = {S1: Turn(S1), S2: Turn(S2)}
    ops: list[AppendEvent] = []
    now = 1_796_204_622_000
    for session_id, is_run, texts, (prompt_id, client_id), tick in steps:
        now += tick
        turn = turns[session_id]
        ops.append(turn.run(texts, prompt_id, client_id, now) if is_run else turn.plain(texts))
    with tempfile.TemporaryDirectory() as tmp:
        store = new_store(Path(tmp) / "t.db")
        try:
            # Batches of the sizes drawn (then one for the rest); an AdmitPrompt in a batch
            # takes the general path of apply instead of the events-only one.
            start = 0
            for size in [*cuts, len(ops)]:
                batch: list[AppendEvent | AdmitPrompt] = list(ops[start:start + size])
                if with_other_ops and batch:
                    batch.insert(len(batch) // 2, AdmitPrompt(S1, f"p{start}", 5))
                store.apply(batch)
                start += size
                if start >= len(ops):
                    break
            for session_id, turn in turns.items():
                assert store.raw_events(session_id) == turn.envelopes
                assert store.max_raw_event_id(session_id) == turn.next_id - 1
        finally:
            store.close()


def test_a_run_is_stored_as_its_updates_not_its_envelopes(tmp_path: Path) -> None:
    turn = Turn(S1)
    store = new_store(tmp_path / "t.db")
    try:
        ops = [turn.run([f"chunk-{i}" for i in range(n, n + 500)], PROMPT, CLIENT, 1_000 + n)
               for n in range(0, 4000, 500)]
        store.apply(ops)
        assert store.raw_events(S1) == turn.envelopes
    finally:
        store.close()
    updates = sum(len(op.raw) for op in ops)
    envelopes = sum(map(len, turn.envelopes))
    stored = stored_bytes(tmp_path / "t.db", S1)
    # The updates and one template per run, not an envelope's ~300 bytes per chunk.
    assert updates < stored < updates + 8 * 400
    assert stored < envelopes / 3


def test_a_version_1_file_is_upgraded_and_its_rows_still_read(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    turn = Turn(S1)
    old = OldTranscript(path, version=1)
    old.session(S1, "/w")
    # What a version-1 daemon wrote: envelope rows only (runs without a template).
    for op in (turn.plain(["a", "b"]), turn.plain(["c"])):
        old.raw(S1, op.raw.split(b"\n"), None, op.event_id)
    old.close()

    store = TranscriptDatabase(path)
    try:
        assert store.schema_version == SCHEMA_VERSION == 3
        assert store.raw_events(S1) == turn.envelopes
        store.apply([turn.run(["d", "e"], PROMPT, CLIENT, 7), turn.plain(["f"])])
        assert store.raw_events(S1) == turn.envelopes
        store.apply([FinishTurn(S1, PROMPT, "completed", "end_turn", 9, [("r1", b"{}")])])
        assert store.raw_events(S1) == []
    finally:
        store.close()


@pytest.mark.parametrize("damaged", [b"\x94\x01garbage", b"\x00", b"[1,2]"])
def test_a_row_without_a_valid_checksum_is_refused_not_skipped(tmp_path: Path,
                                                               damaged: bytes) -> None:
    """A row someone else wrote (no checksum) or whose checksum does not match is damage: the
    read raises instead of serving it or quietly leaving it out of the turn."""
    path = tmp_path / "t.db"
    turn = Turn(S1)
    store = new_store(path)
    store.apply([turn.run(["a", "b"], PROMPT, CLIENT, 7)])
    store.close()
    conn = sqlite3.connect(path)
    conn.execute("INSERT INTO raw_events (session_id, event_id, prompt_id, raw) "
                 "VALUES (?, 2, NULL, ?)", (S1, damaged))
    conn.commit()
    conn.close()
    store = TranscriptDatabase(path)
    try:
        with pytest.raises(DamagedRow, match="no checksum"):
            store.raw_events(S1)
        store.connection.execute("UPDATE raw_events SET crc = 12345 WHERE raw = ?", (damaged,))
        with pytest.raises(DamagedRow, match="checksum mismatch"):
            store.raw_events(S1)
    finally:
        store.close()
