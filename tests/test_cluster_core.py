"""daemon/core/cluster.py without Redis: keys and hash tags, the directory entry, routing, the
503 rule, the op-log encoding and the event-stream runs."""

from __future__ import annotations

import pytest

from daemon.core.cluster import (
    DirectoryEntry,
    Forward,
    Local,
    TakeOver,
    Unavailable,
    Unknown,
    append_args,
    decode_op,
    encode_op,
    event_run,
    lease_value,
    node_key,
    renew_interval_ms,
    retry_after_s,
    route,
    session_keys,
    split_run,
)
from daemon.core.transcript_ops import (
    AdmitPrompt,
    AppendEvent,
    DeleteSession,
    FinishTurn,
    MarkClosed,
    UpsertSession,
)

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


def test_append_args_layout() -> None:
    assert append_args(4, "ep", 8000, 7, [b"o1", b"o2"], [(1, 2, b"x\ny")], 60_000) == [
        "4", "ep", 8000, 7, 60_000, 2, b"o1", b"o2", 1, 2, b"x\ny"]


def test_single_node_mode_never_imports_the_cluster_code() -> None:
    """Every module a single-node daemon loads, loaded in a fresh interpreter: neither the
    cluster shell nor its Redis client is among them (idle RSS stays what it was)."""
    import subprocess
    import sys

    probe = ("import sys, daemon.__main__, daemon.server, daemon.asgi, daemon.http_api, "
             "daemon.manager; print(sorted(m for m in sys.modules if m == 'daemon.cluster' "
             "or m.split('.')[0] == 'coredis'))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stdout.strip() == "[]"
