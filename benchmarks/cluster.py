"""Cluster mode: three daemons on one real ``redis-server`` (AOF on), the session on node A.

Rows, each measured against its single-node counterpart in the same run:

- **fan-out**: one turn of ``--chunks`` mock chunks delivered to 64 SSE subscribers on each of
  A, B and C (192; B's and C's read A's Redis stream through their mirror) against 64 on A
  alone. Every subscriber's ids are checked (contiguous, first to last, terminal last).
- **forwarding**: ``POST /session/{id}/prompt`` answered by the owner directly vs sent to B,
  which forwards it (p50/p99 of the round trip; the turns are one chunk, awaited in between).
- **event latency**: the owner's publish timestamp (``_meta.serverTimestamp``, whole ms) to
  the moment an SSE reader in this process has the frame, for a reader on A vs one on B
  (through Redis); p50/p99 over several short turns.
- **stream memory**: after turns of 1,000 chunks past the ring, the Redis memory of the
  session's event stream (``MEMORY USAGE``) per 1,000 events it retains, against the bytes of
  those events' envelopes; the stream holds at most the ring (trimmed by event id).
- **mirror catch-up**: a new reader with ``Last-Event-ID: 0`` on a node with no mirror yet
  (the ring's worth read from Redis) vs the same reader on the owner (from its ring).
- **failover, per fault**: owner SIGKILL, owner SIGSTOP past its lease (then SIGCONT), Redis
  restarted (SIGTERM, two leases down, started on its AOF) and Redis frozen (SIGSTOP, two
  leases): from the fault (for Redis: from its return) to the first event of a new prompt on
  a reader of the other node, the prompt resent after each 503 as the SDK does; p50/p99 over
  the rounds. Baseline: the lease (``--lease-ms``).

Needs ``redis-server`` on PATH (Debian package ``redis-server``); without it the benchmark is
an ERROR row saying so.
"""

from __future__ import annotations

import argparse
import json
import secrets
import shutil
import signal
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

from benchmarks.harness import Context, CpuUse, Row
from benchmarks.launcher import Daemon, start_daemon
from benchmarks.loadgen import LoadGen, check_delivery
from benchmarks.redis_launcher import RedisServer, redis_server
from daemon.core.cluster import session_keys
from sdk.protocol.headers import EVENT_EPOCH, LAST_EVENT_ID

NAME = "cluster"
TITLE = ("cluster mode: fan-out over 3 nodes, forwarding, event latency through Redis, stream "
         "memory, mirror catch-up, failover per fault")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--chunks", type=int, default=None,
                        help="chunks of the fan-out turn (default 20,000; quick 2,000)")
    parser.add_argument("--subscribers", type=int, default=64,
                        help="SSE subscribers per node in the fan-out rows (default 64)")
    parser.add_argument("--prompts", type=int, default=None,
                        help="prompts per forwarding figure (default 60; quick 10)")
    parser.add_argument("--lease-ms", type=int, default=2000,
                        help="the nodes' --lease-ms (the failover waits it out)")
    parser.add_argument("--failovers", type=int, default=None,
                        help="rounds of each fault in the failover rows (default 5; quick 2)")


class _Reader:
    """A raw SSE reader in a thread: for each frame with an id, (receive ms, its
    serverTimestamp, type, promptId)."""

    def __init__(self, url: str, session_id: str, headers: dict[str, str] | None = None) -> None:
        self.headers = headers or {}
        self.frames: list[tuple[float, int | None, str, str | None]] = []
        self.ready = threading.Event()
        self._stop = False
        self._thread = threading.Thread(target=self._run, args=(url, session_id), daemon=True)
        self._thread.start()
        if not self.ready.wait(30):
            raise RuntimeError("SSE reader did not connect")

    def _run(self, url: str, session_id: str) -> None:
        try:
            with httpx.stream("GET", f"{url}/session/{session_id}/events", headers=self.headers,
                              timeout=httpx.Timeout(30, read=None)) as resp:
                self.ready.set()
                for line in resp.iter_lines():
                    if self._stop:
                        return
                    if not line.startswith("data: "):
                        continue
                    now = time.time() * 1000
                    env = json.loads(line[6:])
                    if "id" not in env:
                        continue
                    meta = env.get("_meta") or {}
                    stamp = meta.get("serverTimestamp")
                    self.frames.append((now, stamp if isinstance(stamp, int) else None,
                                        env["type"], env.get("promptId")))
        except (httpx.HTTPError, OSError):
            self.ready.set()

    def wait_for(self, pred: Any, timeout: float = 60) -> tuple[float, int | None, str,
                                                                  str | None]:
        deadline = time.monotonic() + timeout
        seen = 0
        while time.monotonic() < deadline:
            for frame in self.frames[seen:]:
                if pred(frame):
                    return frame
            seen = len(self.frames)
            time.sleep(0.002)  # polling the reader thread's list
        raise RuntimeError("the awaited frame never arrived")

    def close(self) -> None:
        self._stop = True


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _fanout(ctx: Context, nodes: list[Daemon], chunks: int, per_node: int) -> float:
    owner = nodes[0]
    session_id, client_id = owner.create_session()
    loadgens = []
    try:
        for node in nodes:
            host, port = node.host_port
            loadgens.append(LoadGen(host, port, session_id, subscribers=per_node,
                                    max_queued=2048, until="turn_complete", timeout=600,
                                    reconnect=True))
        for loadgen in loadgens:
            loadgen.wait_ready()
        before = int(owner.status(session_id)["lastEventId"])
        t0 = time.monotonic()
        owner.prompt(session_id, f"mock:chunks={chunks} mock:delay_ms=0", client_id)
        results = [loadgen.result() for loadgen in loadgens]
    finally:
        for loadgen in loadgens:
            loadgen.close()
    published = int(owner.status(session_id)["lastEventId"])
    subs = [sub for result in results for sub in result["rounds"][0]]
    check_delivery(subs, before + 1, published)
    seconds = max(float(sub["t_done"]) for sub in subs) - t0
    delivered = sum(int(sub["ids"]) for sub in subs)
    ctx.progress(f"fan-out over {len(nodes)} node(s) x {per_node}: {delivered} events in "
                 f"{seconds:.2f} s")
    return delivered / seconds


def _prompt_rtts(owner: Daemon, via: Daemon, session_id: str, rounds: int
                 ) -> tuple[list[float], list[float]]:
    direct: list[float] = []
    forwarded: list[float] = []
    for n in range(rounds):
        for target, out in ((owner, direct), (via, forwarded)):
            t0 = time.perf_counter()
            target.prompt(session_id, f"r{n} mock:chunks=1 mock:delay_ms=0")
            out.append((time.perf_counter() - t0) * 1000)
            owner.wait_idle(session_id)
    return direct, forwarded


def _latencies(reader: _Reader, since: int) -> list[float]:
    return [now - stamp for now, stamp, kind, _ in reader.frames[since:]
            if stamp is not None and kind == "session_update"]


def run(ctx: Context, args: argparse.Namespace) -> list[Row]:
    chunks = args.chunks or ctx.pick(20_000, 2_000)
    per_node = args.subscribers
    prompts = args.prompts or ctx.pick(60, 10)
    lease_ms = args.lease_ms
    rows: list[Row] = []
    with ExitStack() as stack:
        scratch = Path(tempfile.mkdtemp(prefix="tk-cluster-"))
        stack.callback(shutil.rmtree, scratch, True)
        redis = stack.enter_context(redis_server(scratch / "redis"))
        redis_url = redis.url
        ctx.progress(f"redis-server at {redis_url}")
        nodes = []
        secret = {"TURNKEEPER_CLUSTER_SECRET": secrets.token_hex(16)}  # one for the cluster
        for name in "ABC":
            node = _node(redis_url, name, lease_ms, secret, scratch)
            stack.callback(node.stop)
            nodes.append(node)
        a, b, _ = nodes

        one = _fanout(ctx, [a], chunks, per_node)
        three = _fanout(ctx, nodes, chunks, per_node)
        rows.append(Row(benchmark=NAME, name=f"fan-out: 3 nodes x {per_node} SSE subscribers",
                        params={"chunks": chunks, "subscribers": 3 * per_node},
                        unit="events/s", samples=[three], baseline=one,
                        baseline_label=f"1 node x {per_node}", ratio=three / one,
                        ratio_label="vs 1 node", cpu=CpuUse(), quick=ctx.quick,
                        notes=["B and C read A's Redis stream (mirror bus); same run"]))

        session_id, _ = a.create_session()
        direct, forwarded = _prompt_rtts(a, b, session_id, prompts)
        rows.append(Row(benchmark=NAME, name="prompt forwarded by a non-owner: p50",
                        params={"prompts": prompts}, unit="ms",
                        samples=[statistics.median(forwarded)],
                        baseline=statistics.median(direct), baseline_label="owner directly",
                        ratio=statistics.median(forwarded) - statistics.median(direct),
                        ratio_label="ms added", quick=ctx.quick,
                        notes=[f"p99 {_pct(forwarded, 0.99):.2f} ms vs "
                               f"{_pct(direct, 0.99):.2f} ms direct"]))

        on_a, on_b = _Reader(a.url, session_id), _Reader(b.url, session_id)
        marks = (len(on_a.frames), len(on_b.frames))
        for n in range(ctx.pick(30, 5)):
            pid = a.prompt(session_id, f"lat{n} mock:chunks=5 mock:delay_ms=0")["promptId"]
            for reader in (on_a, on_b):
                reader.wait_for(lambda f, p=pid: f[2] == "turn_complete" and f[3] == p)
        local, remote = _latencies(on_a, marks[0]), _latencies(on_b, marks[1])
        rows.append(Row(benchmark=NAME, name="publish -> SSE reader on another node: p50",
                        params={"events": len(remote)}, unit="ms",
                        samples=[statistics.median(remote)],
                        baseline=statistics.median(local), baseline_label="reader on the owner",
                        ratio=statistics.median(remote) - statistics.median(local),
                        ratio_label="ms added", quick=ctx.quick,
                        notes=[f"p99 {_pct(remote, 0.99):.1f} ms vs {_pct(local, 0.99):.1f} ms"
                               " on the owner; serverTimestamp has whole-ms resolution"]))

        on_a.close()
        on_b.close()
        rows += _stream_memory(ctx, redis, a, nodes[2], session_id)
        rounds = args.failovers or ctx.pick(5, 2)

        def restart(name: str) -> Daemon:
            node = _node(redis_url, name, lease_ms, secret, scratch)
            stack.callback(node.stop)
            return node

        rows += _failovers(ctx, redis, [a, b], session_id, lease_ms, rounds, restart)
    return rows


def _node(redis_url: str, name: str, lease_ms: int, env: dict[str, str],
          scratch: Path) -> Daemon:
    return start_daemon(["--cluster-redis", redis_url, "--node-id", name,
                         "--lease-ms", str(lease_ms)], env, scratch=scratch)


def _stream_memory(ctx: Context, redis: RedisServer, owner: Daemon, fresh: Daemon,
                   session_id: str) -> list[Row]:
    """Fill the session's stream past the ring; its memory per 1,000 retained events, then a
    new mirror's catch-up on ``fresh`` against a reader on the owner."""
    ring = 8000  # the default --event-ring-size
    for n in range(ctx.pick(12, 10)):
        owner.prompt(session_id, f"fill{n} mock:chunks=1000 mock:delay_ms=0")
        owner.wait_idle(session_id)
    key = session_keys(session_id).events
    import coredis  # the cluster extra; only this benchmark needs it here

    async def read() -> tuple[int, int, int]:
        client = coredis.Redis(host="127.0.0.1", port=redis.port)
        async with client:
            entries = await client.xrange(key)
            used = await client.memory_usage(key, samples=0)
        events = sum(int(e.field_values[b"l"]) - int(e.field_values[b"f"]) + 1
                     for e in entries)
        return events, sum(len(e.field_values[b"b"]) for e in entries), int(used or 0)

    import trio

    held, raw, used = trio.run(read)
    last = int(owner.status(session_id)["lastEventId"])
    per_k = used / held * 1000
    rows = [Row(benchmark=NAME, name="event stream in Redis: memory per 1,000 retained events",
                params={"published": last, "ring": ring, "retained": held}, unit="KiB",
                samples=[per_k / 1024], baseline=raw / held * 1000 / 1024,
                baseline_label="their envelopes", ratio=used / raw,
                ratio_label="x the envelopes", quick=ctx.quick,
                notes=[f"{held} events retained of {last} published (ring {ring}): trimmed by "
                       f"event id; {used / 1024 / 1024:.1f} MiB in all"])]
    catch_up: list[float] = []
    on_owner: list[float] = []
    for _ in range(ctx.pick(3, 2)):
        for node, out in ((owner, on_owner), (fresh, catch_up)):
            t0 = time.monotonic()
            reader = _Reader(node.url, session_id, {"Last-Event-ID": "0"})
            _wait_count(reader, held)
            out.append((time.monotonic() - t0) * 1000)
            reader.close()
        _wait_mirror_gone(redis, session_id, "C")  # the next trial opens a new mirror
    rows.append(Row(benchmark=NAME, name="new mirror's catch-up: the ring from Redis",
                    params={"events": held}, unit="ms", samples=catch_up,
                    baseline=statistics.median(on_owner), baseline_label="on the owner",
                    ratio=statistics.median(catch_up) / statistics.median(on_owner),
                    ratio_label="x the owner", quick=ctx.quick,
                    notes=["a reader with Last-Event-ID 0 on a node with no mirror: "
                           "XRANGE of the stream, then the ring's replay"]))
    return rows


def _wait_mirror_gone(redis: RedisServer, session_id: str, node: str,
                      timeout: float = 30) -> None:
    """Until ``node``'s mirror of the session has ended (it withdraws its reader report then;
    a mirror nobody reads ends after two seconds)."""
    deadline = time.monotonic() + timeout
    while redis.cli("HEXISTS", session_keys(session_id).readers, node) != "0":
        if time.monotonic() > deadline:
            raise RuntimeError(f"the mirror on {node} did not end")
        time.sleep(0.05)  # polling Redis' own state


def _wait_count(reader: _Reader, count: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while len(reader.frames) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the reader got {len(reader.frames)} of {count} events")
        time.sleep(0.002)  # polling the reader thread's list


def _first_event_after(target: Daemon, session_id: str, started: float,
                       limit_s: float = 60) -> tuple[float, int]:
    """Send a prompt to ``target`` until it is accepted (503s resent after 50 ms, as the SDK
    does after Retry-After, faster); the time from ``started`` to its first event on a
    reader of ``target``, and the number of 503s."""
    refused = 0
    while True:
        resp = target.http.post(f"/session/{session_id}/prompt",
                                json={"prompt": [{"type": "text", "text": "after"}]})
        if resp.status_code == 202:
            break
        if resp.status_code != 503 or time.monotonic() - started > limit_s:
            raise RuntimeError(f"failover: {resp.status_code} {resp.text[:300]}")
        refused += 1
        time.sleep(0.05)
    accepted = resp.json()
    pid = accepted["promptId"]
    reader = _Reader(target.url, session_id, {LAST_EVENT_ID: str(accepted["lastEventId"]),
                                              EVENT_EPOCH: accepted["eventEpoch"]})
    try:
        reader.wait_for(lambda f: f[3] == pid)
    finally:
        reader.close()
    return (time.monotonic() - started) * 1000, refused


def _owner(node: Daemon, session_id: str) -> str:
    return str(node.status(session_id)["ownerNodeId"])


def _failovers(ctx: Context, redis: RedisServer, pair: list[Daemon], session_id: str,
               lease_ms: int, rounds: int, restart: Callable[[str], Daemon]) -> list[Row]:
    """Each fault ``rounds`` times on the session's owner (or on Redis); the other node of
    ``pair`` is asked. Killed nodes are started again (same id) between rounds."""
    by_name = {"A": pair[0], "B": pair[1]}
    rows = []
    for fault in ("owner SIGKILL", "owner SIGSTOP", "Redis restart", "Redis freeze"):
        times: list[float] = []
        refused = kept = 0
        for _ in range(rounds):
            owner_name = _owner(by_name["A"] if by_name["A"].proc.poll() is None
                                else by_name["B"], session_id)
            other_name = "B" if owner_name == "A" else "A"
            owner, other = by_name[owner_name], by_name[other_name]
            outage = 2 * lease_ms / 1000
            if fault == "owner SIGKILL":
                started = time.monotonic()
                owner.proc.send_signal(signal.SIGKILL)
                owner.proc.wait()
                took, n = _first_event_after(other, session_id, started)
                owner.stop()
                by_name[owner_name] = restart(owner_name)
            elif fault == "owner SIGSTOP":
                started = time.monotonic()
                owner.proc.send_signal(signal.SIGSTOP)
                try:
                    took, n = _first_event_after(other, session_id, started)
                finally:
                    owner.proc.send_signal(signal.SIGCONT)
            else:
                if fault == "Redis restart":
                    redis.stop()
                    time.sleep(outage)  # the fault's length
                    redis.start()
                else:
                    redis.proc.send_signal(signal.SIGSTOP)
                    time.sleep(outage)  # the fault's length
                    redis.proc.send_signal(signal.SIGCONT)
                started = time.monotonic()
                took, n = _first_event_after(other, session_id, started)
                kept += _owner(other, session_id) == owner_name
            times.append(took)
            refused += n
            if fault.startswith("Redis"):
                by_name[owner_name].wait_idle(session_id)  # it kept the session
            else:
                other.wait_idle(session_id)
            ctx.progress(f"failover ({fault}): {took:.0f} ms")
        notes = [f"p99 {_pct(times, 0.99):.0f} ms over {rounds} rounds; {refused} prompts "
                 "answered 503 first"]
        if fault.startswith("owner"):
            notes.append("from the fault to the first event of a new prompt on the other node")
        else:
            notes.append(f"{2 * lease_ms} ms outage; timed from Redis' return; the owner kept "
                         f"the session in {kept} of {rounds} rounds")
        rows.append(Row(benchmark=NAME, name=f"failover, {fault}: p50", params={
            "lease_ms": lease_ms, "rounds": rounds}, unit="ms", samples=times,
            baseline=float(lease_ms), baseline_label="lease",
            ratio=statistics.median(times) / lease_ms, ratio_label="of the lease",
            quick=ctx.quick, notes=notes))
    return rows
