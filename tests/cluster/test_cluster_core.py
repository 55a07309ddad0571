"""daemon/core/cluster.py without Redis: keys and hash tags, the directory entry, routing, the
503 rule, the op-log encoding and the event-stream runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from daemon.core.cluster import (
    DirectoryEntry,
    Forward,
    Local,
    LogTail,
    TakeOver,
    Unavailable,
    Unknown,
    append_args,
    compact_ops,
    decode_op,
    encode_op,
    event_run,
    lease_value,
    node_key,
    readers_by_node,
    renew_interval_ms,
    retry_after_s,
    route,
    session_keys,
    split_run,
    stream_keep_from,
)
from daemon.core.transcript_ops import (
    AdmitPrompt,
    AppendEvent,
    DeleteSession,
    FinishTurn,
    MarkClosed,
    Op,
    UpsertSession,
)
from daemon.transcript_store import TranscriptDatabase

pytestmark = pytest.mark.processes  # starts processes: not in make unit-fast

SID = "0b9c1d2e-0000-4000-8000-000000000001"
ENTRY = DirectoryEntry("node-a", "http://127.0.0.1:1", "/w", "ep1", 3)


def test_every_session_key_shares_the_hash_tag() -> None:
    keys = session_keys(SID)
    assert len(set(keys.all())) == 4
    for key in keys.all():
        # Redis Cluster hashes only the part between the first { and the next }.
        start = key.index("{")
        assert key[start + 1:key.index("}", start)] == SID
    assert "{" not in node_key("n1")


def test_directory_entry_from_hash() -> None:
    fields = {"owner": "node-a", "url": "http://127.0.0.1:1", "workspace": "/w",
              "epoch": "ep1", "gen": "3", "closed": "0"}
    assert DirectoryEntry.from_hash(fields) == ENTRY
    assert DirectoryEntry.from_hash({**fields, "closed": "1"}) == DirectoryEntry(
        "node-a", "http://127.0.0.1:1", "/w", "ep1", 3, closed=True)
    assert DirectoryEntry.from_hash({}) is None
    assert DirectoryEntry.from_hash({**fields, "gen": "x"}) is None
    assert DirectoryEntry.from_hash({"gen": "1"}) is None  # only a generation: no owner yet


def test_route() -> None:
    assert route(ENTRY, 5000, "node-b", live_here=True) == Local()
    assert route(None, -2, "node-b", live_here=False) == Unknown()
    closed = DirectoryEntry("node-a", "u", "/w", "e", 1, closed=True)
    assert route(closed, 5000, "node-b", live_here=False) == Unknown()
    assert route(ENTRY, 5000, "node-b", live_here=False) == Forward("http://127.0.0.1:1", "node-a")
    assert route(ENTRY, 5000, "node-b", live_here=False, owner_unreachable=True) \
        == Unavailable(5)
    # No lease (expired or released): the first node asked takes over.
    assert route(ENTRY, -2, "node-b", live_here=False) == TakeOver()
    assert route(ENTRY, 0, "node-b", live_here=False) == TakeOver()
    # The lease names this node, which does not run it (restarted): take over at once.
    assert route(ENTRY, 5000, "node-a", live_here=False) == TakeOver()
    # Redis just came back (this node's grace): an expired lease stays the owner's.
    assert route(ENTRY, -2, "node-b", live_here=False, grace_left_ms=900) \
        == Forward("http://127.0.0.1:1", "node-a")
    assert route(ENTRY, -2, "node-b", live_here=False, grace_left_ms=900,
                 owner_unreachable=True) == Unavailable(1)
    assert route(ENTRY, -2, "node-b", live_here=False, grace_left_ms=2100,
                 owner_unreachable=True) == Unavailable(3)
    assert route(ENTRY, -2, "node-a", live_here=False, grace_left_ms=900) == TakeOver()


def test_retry_after_rounds_up_to_whole_seconds() -> None:
    assert retry_after_s(1) == 1
    assert retry_after_s(1000) == 1
    assert retry_after_s(1001) == 2
    assert retry_after_s(9500) == 10
    assert retry_after_s(0) == 1


def test_lease_timing() -> None:
    assert renew_interval_ms(10_000) == 3333
    assert renew_interval_ms(1) == 1
    assert lease_value("n1", 7) == "n1 7"


@pytest.mark.parametrize("op", [
    UpsertSession(SID, "/w", 12, "acp-1"),
    UpsertSession(SID, "/w", 12),
    AppendEvent(SID, 9, "p1", b'{"id":9}'),
    AppendEvent(SID, 9, None, b'{"id":8}\n{"id":9}'),
    AdmitPrompt(SID, "p1", 5),
    FinishTurn(SID, "p1", "completed", "end_turn", 7, [("r1", b"{}"), ("r2", b"[]")]),
    FinishTurn(SID, None, "interrupted", None, 7),
    DeleteSession(SID),
    MarkClosed(SID),
])
def test_op_log_round_trip(op: object) -> None:
    decoded = decode_op(encode_op(op))  # type: ignore[arg-type]
    assert decoded == op or (isinstance(op, FinishTurn) and isinstance(decoded, FinishTurn)
                             and list(decoded.records) == list(op.records)
                             and decoded.prompt_id == op.prompt_id)
    assert type(decoded) is type(op)


def test_op_log_refuses_foreign_bytes() -> None:
    with pytest.raises(ValueError):
        decode_op(b"\x92\xa4Nope\x80")
    with pytest.raises(ValueError):
        decode_op(b"not msgpack at all")


def test_event_runs() -> None:
    assert event_run(AppendEvent(SID, 9, None, b'{"id":9}')) == (9, 9, b'{"id":9}')
    run = event_run(AppendEvent(SID, 12, None, b"a\nb\nc"))
    assert run == (10, 12, b"a\nb\nc")
    assert split_run(*run) == [(10, b"a"), (11, b"b"), (12, b"c")]
    with pytest.raises(ValueError):
        split_run(10, 13, b"a\nb\nc")


def test_stream_keeps_what_the_ring_holds() -> None:
    # The owner's ring (bounded by events and bytes) decides; never more than its size back.
    assert stream_keep_from(None, 50, 100) == 1
    assert stream_keep_from(None, 250, 100) == 151
    assert stream_keep_from(200, 250, 100) == 200  # the ring dropped more (its byte cap)
    assert stream_keep_from(120, 250, 100) == 151  # the append is behind the ring


def test_append_args_layout() -> None:
    assert append_args("A", 4, "ep", 8000, 7, [b"o1", b"o2"], [(1, 2, b"x\ny")], 60_000) == [
        "A 4", "ep", 8000, 7, 60_000, 2, b"o1", b"o2", 1, 2, b"x\ny"]


def test_single_node_mode_never_imports_the_cluster_code() -> None:
    """Every module a single-node daemon loads, loaded in a fresh interpreter: neither the
    cluster shell nor its Redis client is among them (idle RSS stays what it was)."""
    import subprocess
    import sys

    probe = ("import sys, daemon.__main__, daemon.server, daemon.asgi, daemon.http_api, "
             "daemon.manager; print(sorted(m for m in sys.modules if m == 'daemon.cluster' "
             "or m.startswith('daemon.cluster.') "
             "or m.split('.')[0] == 'coredis'))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stdout.strip() == "[]"


# --- compaction of the op log -----------------------------------------------------------------


def _turns() -> list[Op]:
    """Two finished turns (a run of events each), a restore's UpsertSession in between, and a
    third turn still in flight."""
    def ev(n: int, prompt: str) -> AppendEvent:
        return AppendEvent(SID, n, prompt, f'{{"id":{n}}}'.encode())
    return [
        UpsertSession(SID, "/w", 1, "agent-1"),
        AdmitPrompt(SID, "p1", 2), ev(1, "p1"), ev(2, "p1"),
        FinishTurn(SID, "p1", "completed", "end_turn", 3, [("r1", b'{"r":1}')]),
        AdmitPrompt(SID, "p2", 4), ev(3, "p2"),
        UpsertSession(SID, "/w2", 9, None), ev(4, "p2"),
        FinishTurn(SID, "p2", "interrupted", None, 5, [("r2", b'{"r":2}'), ("r3", b'{"r":3}')]),
        AdmitPrompt(SID, "p3", 6), ev(5, "p3"), ev(6, "p3"),
    ]


def _replayed(tmp_path: Path, name: str, ops: list[Op]) -> tuple[object, ...]:
    store = TranscriptDatabase(tmp_path / f"{name}.sqlite")
    try:
        store.apply(ops)
        page = store.page(SID, limit=100)
        return (store.get_session(SID), [store.get_prompt(SID, p) for p in ("p1", "p2", "p3")],
                store.in_flight_prompts(SID), page.events, store.raw_events(SID),
                store.prompt_terminals(SID), store.record_count(SID))
    finally:
        store.close()


def test_compacted_log_replays_to_the_same_transcript(tmp_path: Path) -> None:
    ops = _turns()
    keep = compact_ops(ops)
    # The finished turns' raw events go; everything else stays, in order.
    assert keep == [0, 1, 4, 5, 7, 9, 10, 11, 12]
    kept = [ops[i] for i in keep]
    replayed = _replayed(tmp_path, "kept", kept)
    assert _replayed(tmp_path, "all", ops) == replayed
    assert replayed[4] == [b'{"id":5}', b'{"id":6}']  # the turn in flight keeps its events
    assert replayed[6] == 3
    # Everything up to a DeleteSession goes too (a takeover replays into an emptied store).
    again = [*ops, DeleteSession(SID), UpsertSession(SID, "/w3", 7, None)]
    assert compact_ops(again) == [len(ops) + 1]
    assert _replayed(tmp_path, "deleted", again) == _replayed(
        tmp_path, "deleted-kept", [again[-1]])


def test_log_tail_compacts_each_finished_turn_as_the_owner_appends() -> None:
    """The owner's incremental compactions (one per turn end, applied to the list as the
    COMPACT script does) leave the same log as compacting it whole."""
    ops = _turns()
    log: list[Op] = []
    tail = LogTail(0)
    compactions = []
    for op in ops:
        log.append(op)
        compaction = tail.add(op)
        if compaction is not None:
            assert compaction.end == len(log)
            stretch = log[compaction.start:]
            log[compaction.start:] = [stretch[i] for i in compaction.keep]
            assert compaction.new_length == len(log)
            compactions.append(compaction)
        assert tail.start + tail.length == len(log)
    assert log == [ops[i] for i in compact_ops(ops)]
    assert [(c.start, c.end, c.keep) for c in compactions] == [(0, 5, (0, 1, 4)),
                                                              (3, 8, (0, 2, 4))]
    assert compactions[0].args("A", 7) == ["A 7", 5, 0, 0, 1, 4]
    # The tail of a log read at a takeover: what follows its last FinishTurn.
    resumed = LogTail.of(log)
    assert (resumed.start, resumed.length, resumed.keep) == (6, 3, [0])
    # A turn without raw events needs no compaction; the tail moves past it.
    quiet = LogTail(4)
    assert quiet.add(AdmitPrompt(SID, "p9", 1)) is None
    assert quiet.add(FinishTurn(SID, "p9", "error", None, 2)) is None
    assert (quiet.start, quiet.length) == (6, 0)


def test_readers_by_node() -> None:
    flat = [b"B", b"2", b"C", b"5", b"A", b"9"]  # a report naming the owner is not counted
    assert readers_by_node(flat, "A", 1) == {"A": 1, "B": 2, "C": 5}
    assert readers_by_node([], "A", 0) == {"A": 0}
