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
- **failover**: SIGKILL of A, then prompts sent to B until one is accepted (503 +
  ``Retry-After`` while A's lease runs; then B takes over); the time from the kill to the
  first event of that prompt on a reader of B. Baseline: the lease (``--lease-ms``).

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
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

from benchmarks.harness import Context, CpuUse, Row
from benchmarks.launcher import Daemon, start_daemon
from benchmarks.loadgen import LoadGen, check_delivery
from benchmarks.redis_launcher import redis_server

NAME = "cluster"
TITLE = "cluster mode: fan-out over 3 nodes, forwarding, event latency through Redis, failover"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--chunks", type=int, default=None,
                        help="chunks of the fan-out turn (default 20,000; quick 2,000)")
    parser.add_argument("--subscribers", type=int, default=64,
                        help="SSE subscribers per node in the fan-out rows (default 64)")
    parser.add_argument("--prompts", type=int, default=None,
                        help="prompts per forwarding figure (default 60; quick 10)")
    parser.add_argument("--lease-ms", type=int, default=2000,
                        help="the nodes' --lease-ms (the failover waits it out)")


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
        redis_url = stack.enter_context(redis_server(scratch / "redis")).url
        ctx.progress(f"redis-server at {redis_url}")
        nodes = []
        secret = {"TURNKEEPER_CLUSTER_SECRET": secrets.token_hex(16)}  # one for the cluster
        for name in "ABC":
            node = start_daemon(["--cluster-redis", redis_url, "--node-id", name,
                                 "--lease-ms", str(lease_ms)], secret)
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

        killed = time.monotonic()
        a.proc.send_signal(signal.SIGKILL)
        a.proc.wait()
        refused = 0
        while True:
            resp = b.http.post(f"/session/{session_id}/prompt",
                               json={"prompt": [{"type": "text", "text": "after"}]})
            if resp.status_code == 202:
                break
            if resp.status_code != 503 or time.monotonic() - killed > 60:
                raise RuntimeError(f"failover: {resp.status_code} {resp.text[:300]}")
            refused += 1
            time.sleep(0.05)  # the client's retry pace (the answer says Retry-After)
        accepted = resp.json()
        pid = accepted["promptId"]
        after = _Reader(b.url, session_id, {"Last-Event-ID": str(accepted["lastEventId"]),
                                            "X-Qwen-Event-Epoch": accepted["eventEpoch"]})
        after.wait_for(lambda f: f[3] == pid)
        failover = (time.monotonic() - killed) * 1000
        for reader in (on_a, on_b, after):
            reader.close()
        rows.append(Row(benchmark=NAME, name="failover: SIGKILL of the owner -> first event "
                                             "of a new prompt on the new owner",
                        params={"lease_ms": lease_ms}, unit="ms", samples=[failover],
                        baseline=float(lease_ms), baseline_label="lease",
                        ratio=failover / lease_ms, ratio_label="of the lease", quick=ctx.quick,
                        notes=[f"{refused} prompts answered 503 before the takeover"]))
    return rows
