"""Benchmark 5: resume cost, reconnecting with a cursor a whole ring back.

A session runs a turn of more chunks than the ring holds (default ring 8,000 events) and stays
open (gated). A subscriber then reconnects with ``Last-Event-ID`` = newest id - 8,000 and the
bus epoch: the daemon replays 8,000 events from the ring and sends ``replay_complete``. The
figure is the time from opening the connection to reading ``replay_complete``, measured by the
load generator, which connects with the SSE default ``maxQueued`` (256): replayed frames must
not count against the live caps, so the subscriber must not be evicted although the replay is
31x its queue.

Baseline: the same reconnect with the cursor at the newest id (nothing to replay), measured in
the same run: the fixed cost of opening a stream.
"""

from __future__ import annotations

import argparse
from statistics import median
from typing import Any

from benchmarks.harness import Context, CpuMeter, CpuUse, Row
from benchmarks.launcher import Daemon, gate_name, start_daemon
from benchmarks.loadgen import LoadGen, check_delivery

NAME = "resume"
TITLE = "resume cost: reconnect with a cursor a full ring (8,000 events) back"

TARGET_MS = 50.0
RING = 8000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--back", type=int, default=RING,
                        help="events behind the newest id to resume from (default 8,000)")
    parser.add_argument("--connects", type=int, default=None,
                        help="reconnects per figure (default 30; quick 3)")
    parser.add_argument("--max-queued", type=int, default=256)


def _reconnects(daemon: Daemon, session_id: str, cursor: int, epoch: str, rounds: int,
                max_queued: int, meter: CpuMeter) -> tuple[list[dict[str, Any]], CpuUse]:
    host, port = daemon.host_port
    loadgen = LoadGen(host, port, session_id, subscribers=1, max_queued=max_queued,
                      until="replay_complete", last_event_id=cursor, epoch=epoch,
                      rounds=rounds, announce_ready=False, timeout=120)
    try:
        meter.start()
        result = loadgen.result()
        meter.add_client(float(result["cpu_s"]))
        cpu = meter.stop()
    finally:
        loadgen.close()
    return [round_[0] for round_ in result["rounds"]], cpu


def run(ctx: Context, args: argparse.Namespace) -> list[Row]:
    back = args.back
    connects = args.connects or ctx.trials(30, 3)
    blocks = 1 if connects < 6 else 3
    chunks = back + 2000
    ctx.progress(f"starting daemon; a held-open turn of {chunks:,} chunks")
    with start_daemon(["--event-ring-size", str(max(RING, back))]) as daemon:
        session_id, client_id = daemon.create_session()
        gate = gate_name()
        accepted = daemon.prompt(session_id, f"mock:chunks={chunks} mock:gate={gate}", client_id)
        status = daemon.wait_ingested(session_id, int(accepted["lastEventId"]) + 1 + chunks)
        newest, epoch = int(status["lastEventId"]), str(status["eventEpoch"])
        meter = CpuMeter(daemon.pid, daemon.agent_pids())
        replays: list[dict[str, Any]] = []
        heads: list[dict[str, Any]] = []
        cpu_replay, cpu_head = CpuUse(), CpuUse()
        for block in range(blocks):
            per_block = connects // blocks + (1 if block < connects % blocks else 0)
            ctx.progress(f"block {block + 1}/{blocks}: {per_block} reconnects {back:,} back, "
                         f"then {per_block} at the head")
            subs, cpu = _reconnects(daemon, session_id, newest - back, epoch, per_block,
                                    args.max_queued, meter)
            # Each reconnect must have replayed exactly the ids after its cursor, in order (an
            # evicted one only in order: the row reports the eviction).
            check_delivery(subs, newest - back + 1, newest, terminal=False, allow_evicted=True)
            replays += subs
            cpu_replay = cpu_replay + cpu
            subs, cpu = _reconnects(daemon, session_id, newest, epoch, per_block,
                                    args.max_queued, meter)
            check_delivery(subs, newest + 1, newest, terminal=False, allow_evicted=True)
            heads += subs
            cpu_head = cpu_head + cpu
        daemon.open_gate(gate)
    times = [(s["t_done"] - s["t_start"]) * 1000 for s in replays]
    head_times = [(s["t_done"] - s["t_start"]) * 1000 for s in heads]
    evicted = sum(1 for s in replays if s["evicted"])
    unfinished = sum(1 for s in replays if not s["done"])
    replayed = sorted({int(s["ids"]) for s in replays})
    row = Row(benchmark=NAME, name=f"time to replay_complete, cursor {back:,} back",
              params={"replayed": "/".join(str(r) for r in replayed),
                      "replay_MB": round(max(s["bytes"] for s in replays) / 1e6, 2),
                      "maxQueued": args.max_queued, "evicted": evicted},
              unit="ms", samples=times, cpu=cpu_replay.scaled(1 / len(replays)),
              cpu_note="per reconnect", quick=ctx.quick)
    row.baseline, row.baseline_label = median(head_times), "cursor at head"
    row.ratio = (row.value or 0.0) / row.baseline if row.baseline else None
    row.target = f"<= {TARGET_MS:g} ms, not evicted"
    row.ok = (row.value or 0.0) <= TARGET_MS and evicted == 0 and unfinished == 0 \
        and replayed == [back]
    if replayed != [back]:
        row.notes.append(f"expected {back} replayed frames per reconnect, counted {replayed} "
                         "(a state_resync_required or a budget cut?)")
    if evicted or unfinished:
        row.notes.append(f"{evicted} reconnect(s) evicted, {unfinished} without replay_complete")
    head = Row(benchmark=NAME, name="time to replay_complete, cursor at head (baseline)",
               params={"replayed": 0, "maxQueued": args.max_queued}, unit="ms",
               samples=head_times, cpu=cpu_head.scaled(1 / len(heads)), cpu_note="per reconnect",
               quick=ctx.quick)
    return [row, head]
