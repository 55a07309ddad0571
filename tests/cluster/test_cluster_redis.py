"""The Redis test fixtures themselves (benchmarks/redis_launcher.py): a real redis-server with AOF
on, reaped when its context ends; a real 3-master Redis Cluster on which the session keys'
``{sessionId}`` hash tag keeps a multi-key script on one slot, for sessions spread over every
master. coredis drives both under Trio."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from benchmarks.redis_launcher import (
    HAVE_REDIS,
    SKIP_REASON,
    RedisServer,
    redis_cluster,
    redis_server,
)

DAY = 86_400_000
HOUR = 3_600_000
pytestmark = [pytest.mark.skipif(not HAVE_REDIS, reason=SKIP_REASON), pytest.mark.processes]
coredis = pytest.importorskip("coredis", reason="coredis is not installed (pip install '.[cluster]')")


def _scripts(client: Any, *names: str) -> list[Any]:
    """The named Lua scripts of the cluster cores (``"claim"`` is ``CLAIM_SCRIPT``), registered on
    ``client``, in the order named."""
    from daemon.core import cluster, cluster_identity

    sources = {**vars(cluster), **vars(cluster_identity)}
    return [client.register_script(sources[f"{name.upper()}_SCRIPT"]) for name in names]


async def test_server_has_aof_on_and_is_reaped(tmp_path: Path) -> None:
    with redis_server(tmp_path / "r") as server:
        client = coredis.Redis(host="127.0.0.1", port=server.port)
        async with client:
            assert await client.config_get(["appendonly"]) == {b"appendonly": b"yes"}
            await client.set("k", "v")
            assert await client.get("k") == b"v"
        proc = server.proc
    assert proc.poll() is not None  # stopped and reaped, not left behind


async def test_server_without_aof(tmp_path: Path) -> None:
    with redis_server(tmp_path / "r", appendonly=False) as server:
        assert server.cli("CONFIG", "GET", "appendonly").split() == ["appendonly", "no"]


async def test_cluster_runs_hash_tagged_scripts_on_every_master(tmp_path: Path) -> None:
    with redis_cluster(tmp_path / "c") as cluster:
        ports = [m.port for m in cluster.masters]
        client = coredis.RedisCluster(host="127.0.0.1", port=ports[0])
        script = ("redis.call('SET', KEYS[1], ARGV[1]); "
                  "return redis.call('INCR', KEYS[2])")
        owners: set[int] = set()
        async with client:
            fenced = client.register_script(script)
            for n in range(12):
                sid = f"session-{n}"
                assert await fenced(keys=[f"tk:{{{sid}}}:a", f"tk:{{{sid}}}:b"],
                                    args=[sid]) == 1
                assert await client.get(f"tk:{{{sid}}}:a") == sid.encode()
                slot = int(cluster.masters[0].cli("CLUSTER", "KEYSLOT", f"tk:{{{sid}}}:a"))
                owners.add(_master_of(cluster.masters, slot))
        procs = [m.proc for m in cluster.masters]
    assert len(owners) == 3  # the sessions really were spread over the three masters
    assert all(proc.poll() is not None for proc in procs)


def _master_of(masters: list[RedisServer], slot: int) -> int:
    """The port of the master serving ``slot`` (from ``CLUSTER NODES``)."""
    for line in masters[0].cli("CLUSTER", "NODES").splitlines():
        fields = line.split()
        port = int(fields[1].split(":")[1].split("@")[0])
        for part in fields[8:]:
            lo, _, hi = part.partition("-")
            if int(lo) <= slot <= int(hi or lo):
                return port
    raise AssertionError(f"no master serves slot {slot}")


async def test_lease_and_fencing_scripts_on_a_real_redis(tmp_path: Path) -> None:
    """The scripts of daemon/core/cluster.py as Redis runs them: a claim while another node
    holds the lease is refused; after the lease is gone the next claim raises the generation;
    from then on the old generation can neither renew nor append (nothing of it lands), the
    new one can."""
    from daemon.core.cluster import (
        append_args,
        session_keys,
    )

    keys = session_keys("s1")
    with redis_server(tmp_path / "r") as server:
        client = coredis.Redis(host="127.0.0.1", port=server.port)
        async with client:
            claim, renew, append, release = _scripts(client, "claim", "renew", "append", "release")
            lease = claiming = keys.all()
            assert await claim(keys=claiming, args=["A", "http://a", "/w", "e1", 60_000, DAY]) \
                == [1, 1, 0]  # generation 1, an empty op log
            refused = await claim(keys=claiming, args=["B", "http://b", "/w", "e1", 60_000, DAY])
            assert refused[0] == 0 and 0 < refused[1] <= 60_000  # the lease's remaining ms
            assert await client.get(keys.lease) == b"A 1"
            log = [keys.directory, keys.ops, keys.events]
            assert await append(keys=log, args=append_args("A", 1, "e1", 1, 0, [b"op1"],
                                                          [(1, 2, b"x\ny")])) == 1
            # The same batch again (its answer was lost): already there, not appended twice.
            assert await append(keys=log, args=append_args("A", 1, "e1", 1, 0, [b"op1"],
                                                          [(1, 2, b"x\ny")])) == 1
            assert await client.llen(keys.ops) == 1 and await client.xlen(keys.events) == 1
            # A writer that lost track of the log is refused (-1), nothing lands.
            assert await append(keys=log, args=append_args("A", 1, "e1", 1, 5, [b"op?"], [])) == -1
            assert await client.llen(keys.ops) == 1
            # The lease runs out (here: dropped, as its TTL would); B takes over.
            await client.delete([keys.lease])
            assert await claim(keys=claiming, args=["B", "http://b", "/w", "e2", 60_000, DAY]) \
                == [1, 2, 1]
            assert await renew(keys=lease, args=["A", 1, 60_000, DAY]) == 0
            assert await append(keys=log, args=append_args("A", 1, "e1", 1, 1, [b"late"],
                                                          [(3, 3, b"z")])) == 0
            assert await client.lrange(keys.ops, 0, -1) == [b"op1"]
            assert await client.xlen(keys.events) == 1
            assert await renew(keys=lease, args=["B", 2, 60_000, DAY]) == 1
            assert await append(keys=log, args=append_args("B", 2, "e2", 1, 1, [b"op2"], [])) == 1
            assert await client.lrange(keys.ops, 0, -1) == [b"op1", b"op2"]
            entry = (await client.xrange(keys.events))[0].field_values
            assert (entry[b"e"], entry[b"f"], entry[b"l"], entry[b"b"]) == (
                b"e1", b"1", b"2", b"x\ny")
            # A stale release does nothing; the owner's frees the lease at once.
            assert await release(keys=lease, args=["A", 1, "1", HOUR]) == 0
            assert await client.exists([keys.lease]) == 1
            assert await release(keys=lease, args=["B", 2, "1", HOUR]) == 1
            assert await client.exists([keys.lease]) == 0
            assert await client.hget(keys.directory, "closed") == b"1"
            # A renewal the owner sent before its release of the deleted session lands after
            # it: refused, the lease stays gone, the keys keep the closed retention.
            assert await renew(keys=lease, args=["B", 2, 60_000, DAY]) == 0
            assert await client.exists([keys.lease]) == 0
            assert 0 < await client.pttl(keys.directory) <= HOUR


async def test_compaction_and_retention_scripts_on_a_real_redis(tmp_path: Path) -> None:
    """COMPACT_SCRIPT replaces the stretch from its start to the log's end by the kept ops,
    once (a resend is recognised), only for the current generation and only on the log the
    owner knows; every write gives the session's keys the idle retention, a close the closed
    one."""
    from daemon.core.cluster import (
        Compaction,
        append_args,
        session_keys,
    )

    keys = session_keys("s2")
    with redis_server(tmp_path / "r") as server:
        client = coredis.Redis(host="127.0.0.1", port=server.port)
        async with client:
            claim, append, compact, release = _scripts(
                client, "claim", "append", "compact", "release")
            assert (await claim(keys=keys.all(), args=["A", "u", "/w", "e1", 60_000, DAY]))[0]
            assert 0 < await client.pttl(keys.directory) <= DAY
            log = [keys.directory, keys.ops, keys.events]
            batch = [b"up", b"admit", b"ev1", b"ev2", b"finish"]
            assert await append(keys=log, args=append_args("A", 1, "e1", 1, 0, batch,
                                                          [(1, 1, b"x")], DAY)) == 1
            for key in (keys.ops, keys.events):
                assert 0 < await client.pttl(key) <= DAY
            turn = Compaction(1, 5, (0, 3))  # from "admit": keep admit and finish
            ops = [keys.directory, keys.ops]
            assert await compact(keys=ops, args=turn.args("A", 2)) == 0  # another generation
            assert await client.llen(keys.ops) == 5
            assert await compact(keys=ops, args=Compaction(1, 6, (0, 3)).args("A", 1)) == -1
            assert await compact(keys=ops, args=turn.args("A", 1)) == 1
            assert await client.lrange(keys.ops, 0, -1) == [b"up", b"admit", b"finish"]
            assert await compact(keys=ops, args=turn.args("A", 1)) == 1  # resent: already done
            assert await client.lrange(keys.ops, 0, -1) == [b"up", b"admit", b"finish"]
            assert await compact(keys=ops, args=Compaction(0, 3, ()).args("A", 1)) == 1
            assert await client.exists([keys.ops]) == 0
            # A client deletes the session: its keys live the closed retention, then go.
            await append(keys=log, args=append_args("A", 1, "e1", 1, 0, [b"again"], [], DAY))
            assert await release(keys=keys.all(), args=["A", 1, "1", 1_000]) == 1
            for key in (keys.directory, keys.ops, keys.events):
                assert 0 < await client.pttl(key) <= 1_000


async def test_the_event_stream_is_trimmed_by_event_id(tmp_path: Path) -> None:
    """The stream keeps no event older than the id each append names, whatever the sizes of
    the publish batches (MAXLEN counted batches: 1,000 one-event entries and one 1,000-event
    entry held the same "length"); a new epoch's entries keep growing ids and push the old
    epoch out; a stream written with Redis' own ids (before this rule) is carried on."""
    from daemon.core.cluster import append_args, session_keys

    keys = session_keys("s3")
    ring = 100

    async def events_held(client: Any) -> int:
        return sum(int(e.field_values[b"l"]) - int(e.field_values[b"f"]) + 1
                   for e in await client.xrange(keys.events))

    with redis_server(tmp_path / "r") as server:
        client = coredis.Redis(host="127.0.0.1", port=server.port)
        async with client:
            claim, append = _scripts(client, "claim", "append")
            log = [keys.directory, keys.ops, keys.events]
            # Redis' own ids first (the old rule): the numbering starts above them.
            await client.xadd(keys.events, {"e": "old", "f": "1", "l": "1", "b": "x"})
            assert (await claim(keys=keys.all(), args=["A", "u", "/w", "e1", 60_000, DAY]))[0]
            length, last = 0, 0
            for size in [1] * 150 + [40] * 10 + [1] * 30:  # small and large batches
                first, last = last + 1, last + size
                runs = [(first, last, b"\n".join(b"e%d" % i for i in range(first, last + 1)))]
                keep = max(1, last - ring + 1)
                assert await append(keys=log, args=append_args("A", 1, "e1", keep, length,
                                                              [b"op"], runs, DAY)) == 1
                length += 1
                held = await events_held(client)
                assert held <= ring
                assert held > min(last, ring) - 40  # whole entries go: at most one batch less
            ids = [e.identifier for e in await client.xrange(keys.events)]
            assert ids == sorted(ids, key=lambda i: int(i.split(b"-")[0]))
            # A new epoch (a takeover) starts at id 1 again: its entries sort after.
            await client.delete([keys.lease])
            assert (await claim(keys=keys.all(), args=["B", "u", "/w", "e2", 60_000, DAY]))[0]
            assert await append(keys=log, args=append_args("B", 2, "e2", 1, length, [b"op"],
                                                          [(1, 5, b"a\nb\nc\nd\ne")], DAY)) == 1
            entries = await client.xrange(keys.events)
            assert [e.field_values[b"e"] for e in entries] == [b"e2"]  # the old epoch left
            assert int(entries[0].identifier.split(b"-")[0]) > int(ids[-1].split(b"-")[0])


async def test_node_identity_scripts_on_a_real_redis(tmp_path: Path) -> None:
    """JOIN_SCRIPT registers a free id (or this process's own), reports another process's
    registration, and takes it over only when it is exactly as seen (a dead process's beat);
    REFRESH_SCRIPT beats and tells a process that its id was taken over."""
    from daemon.core.cluster import node_key
    from daemon.core.cluster_identity import Holder, join_result

    key = node_key("A")
    with redis_server(tmp_path / "r") as server:
        client = coredis.Redis(host="127.0.0.1", port=server.port)
        async with client:
            join, refresh = _scripts(client, "join", "refresh")
            assert join_result(await join(keys=[key], args=["i1", "http://a", 5000, "", ""])) \
                is None
            assert join_result(await join(keys=[key], args=["i1", "http://a", 5000, "", ""])) \
                is None  # its own again
            held = join_result(await join(keys=[key], args=["i2", "http://b", 5000, "", ""]))
            assert held == Holder("http://a", "i1", "0")
            assert await refresh(keys=[key], args=["i1", "http://a", 5000]) == 1  # it beats
            # What i2 saw is stale now: i1 lives, i2 is refused.
            assert join_result(await join(keys=[key], args=[
                "i2", "http://b", 5000, "i1", "0"])) == Holder("http://a", "i1", "1")
            # i1 stops beating: i2 takes the id with the beat it saw; i1 learns it.
            assert join_result(await join(keys=[key], args=[
                "i2", "http://b", 5000, "i1", "1"])) is None
            assert await client.hget(key, "inst") == b"i2"
            assert await refresh(keys=[key], args=["i1", "http://a", 5000]) == 0
            assert await refresh(keys=[key], args=["i2", "http://b", 5000]) == 1
            assert 0 < await client.pttl(key) <= 5000
            await client.delete([key])  # expired (a long outage): recreated by a refresh
            assert await refresh(keys=[key], args=["i2", "http://b", 5000]) == 1
            assert await client.hget(key, "inst") == b"i2"


async def test_one_lookup_reads_the_directory_and_the_lease(tmp_path: Path) -> None:
    """LOOKUP_SCRIPT: a request's routing decision costs one Redis call."""
    from daemon.core.cluster import session_keys

    keys = session_keys("s4")
    with redis_server(tmp_path / "r") as server:
        client = coredis.Redis(host="127.0.0.1", port=server.port)
        async with client:
            lookup, claim = _scripts(client, "lookup", "claim")
            assert await lookup(keys=[keys.directory, keys.lease]) == [[], -2]
            await claim(keys=keys.all(), args=["A", "http://a", "/w", "e1", 60_000, DAY])
            flat, pttl = await lookup(keys=[keys.directory, keys.lease])
            fields = dict(zip(flat[::2], flat[1::2], strict=True))
            assert fields[b"owner"] == b"A" and fields[b"gen"] == b"1"
            assert 0 < pttl <= 60_000


async def test_a_former_owner_s_late_writes_land_nowhere(tmp_path: Path) -> None:
    """What a former owner sent before its graceful release and Redis runs after it (a
    renewal, an append, a new epoch, a compaction) is refused, also while nobody has
    claimed the session yet: the release retired its generation. A claim decided on a
    lookup made before a close, and run after it, is refused: the session stays closed with
    the closed retention."""
    from daemon.core.cluster import (
        Compaction,
        append_args,
        session_keys,
    )

    keys = session_keys("s5")
    with redis_server(tmp_path / "r") as server:
        client = coredis.Redis(host="127.0.0.1", port=server.port)
        async with client:
            claim, renew, append, set_epoch, compact, release = _scripts(
                client, "claim", "renew", "append", "set_epoch", "compact", "release")
            log = [keys.directory, keys.ops, keys.events]
            assert (await claim(keys=keys.all(), args=["A", "u", "/w", "e1", 60_000, DAY]))[:2] \
                == [1, 1]
            assert await append(keys=log, args=append_args("A", 1, "e1", 1, 0, [b"a", b"b"],
                                                          [(1, 1, b"x")], DAY)) == 1
            assert await release(keys=keys.all(), args=["A", 1, "0", HOUR]) == 1
            assert await client.exists([keys.lease]) == 0
            assert await renew(keys=keys.all(), args=["A", 1, 60_000, DAY]) == 0
            assert await client.exists([keys.lease]) == 0
            assert await append(keys=log, args=append_args("A", 1, "e1", 1, 2, [b"late"],
                                                          [(2, 2, b"y")], DAY)) == 0
            assert await set_epoch(keys=[keys.directory, keys.lease],
                                   args=["A", 1, "e-late", 9]) == 0
            assert await compact(keys=[keys.directory, keys.ops],
                                 args=Compaction(0, 2, (1,)).args("A", 1)) == 0
            assert await client.lrange(keys.ops, 0, -1) == [b"a", b"b"]
            assert await client.xlen(keys.events) == 1
            assert await client.hget(keys.directory, "epoch") == b"e1"
            # The next claim (any node's) raises the generation again and writes on.
            assert (await claim(keys=keys.all(), args=["B", "u", "/w", "e2", 60_000, DAY]))[:2] \
                == [1, 3]
            assert await append(keys=log, args=append_args("B", 3, "e2", 1, 2, [b"c"], [], DAY)) == 1
            # B closes it; A's claim, decided before the close, runs after it: refused.
            assert await release(keys=keys.all(), args=["B", 3, "1", HOUR]) == 1
            assert await claim(keys=keys.all(), args=["A", "u", "/w", "e3", 60_000, DAY]) \
                == [0, -1]
            assert await client.hget(keys.directory, "closed") == b"1"
            assert await client.exists([keys.lease]) == 0
            for key in (keys.directory, keys.ops, keys.events):
                assert 0 < await client.pttl(key) <= HOUR


async def test_a_generation_issued_twice_still_fences_the_node_it_was_taken_from(
        tmp_path: Path) -> None:
    """Redis can lose an acknowledged claim (a crash within its AOF's last second, a
    failover to a replica behind) and then issue the same generation to another node. The
    fencing token is the owner and the generation: the node whose claim was lost has its
    appends, compactions, new epoch and release refused under the other node's equal
    generation, and nothing of them lands."""
    from daemon.core.cluster import (
        Compaction,
        append_args,
        session_keys,
    )

    keys = session_keys("s6")
    with redis_server(tmp_path / "r") as server:
        client = coredis.Redis(host="127.0.0.1", port=server.port)
        async with client:
            claim, append, set_epoch, compact, release = _scripts(
                client, "claim", "append", "set_epoch", "compact", "release")
            log = [keys.directory, keys.ops, keys.events]
            assert (await claim(keys=keys.all(), args=["A", "u", "/w", "e1", 60_000, DAY]))[:2] \
                == [1, 1]
            # Redis loses A's claim (what a failover to a replica without it leaves) ...
            await client.delete([keys.directory, keys.lease])
            # ... and B claims: generation 1 again, B's now.
            assert (await claim(keys=keys.all(), args=["B", "u", "/w", "e2", 60_000, DAY])) \
                == [1, 1, 0]
            assert await append(keys=log, args=append_args("A", 1, "e1", 1, 0, [b"a"],
                                                          [(1, 1, b"x")], DAY)) == 0
            assert await set_epoch(keys=[keys.directory, keys.lease],
                                   args=["A", 1, "e1", 1]) == 0
            assert await release(keys=keys.all(), args=["A", 1, "0", HOUR]) == 0
            assert await client.get(keys.lease) == b"B 1"
            assert await append(keys=log, args=append_args("B", 1, "e2", 1, 0, [b"b1", b"b2"],
                                                          [], DAY)) == 1
            assert await compact(keys=[keys.directory, keys.ops],
                                 args=Compaction(0, 2, (1,)).args("A", 1)) == 0
            assert await client.lrange(keys.ops, 0, -1) == [b"b1", b"b2"]
            assert await client.exists([keys.events]) == 0
            assert await client.hget(keys.directory, "epoch") == b"e2"
            assert await set_epoch(keys=[keys.directory, keys.lease],
                                   args=["B", 1, "e2", 1]) == 1
