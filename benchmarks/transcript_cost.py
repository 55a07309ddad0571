"""Benchmark 6: what the durable SQLite transcript costs in end-to-end throughput.

Two daemons run side by side, one with the transcript (the default) and one with
``--no-persistence``; trials alternate between them so machine noise hits both alike. Each trial
is benchmark 3's single-subscriber turn (``--chunks`` chunks, agent stdout to one SSE client,
ending when the client reads the terminal, which the daemon publishes only after the transcript
has committed the turn). The baseline is the transcript-off rate; the target is that the
transcript costs at most 25% of it.
"""

from __future__ import annotations

import argparse
import statistics

from benchmarks.e2e import TurnRun, measure_turn
from benchmarks.harness import Context, CpuUse, Row
from benchmarks.launcher import start_daemon

NAME = "transcript_cost"
TITLE = "transcript durability cost: throughput with the SQLite transcript on vs off"

MAX_COST = 0.25


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--chunks", type=int, default=None,
                        help="chunks per turn (default 100,000; quick 5,000)")
    parser.add_argument("--subscribers", type=int, default=1)


def _mean_cpu(turns: list[TurnRun]) -> CpuUse:
    total = CpuUse()
    for turn in turns:
        total = total + turn.cpu
    return total.scaled(1 / max(1, len(turns)))


def run(ctx: Context, args: argparse.Namespace) -> list[Row]:
    chunks = args.chunks or ctx.pick(100_000, 5_000)
    trials = ctx.trials(4, 1)
    on: list[TurnRun] = []
    off: list[TurnRun] = []
    ctx.progress("starting two daemons: transcript on, and --no-persistence")
    with start_daemon(persistence=True) as d_on, start_daemon(persistence=False) as d_off:
        for daemon in (d_on, d_off):  # warm-up: agents started, code paths touched
            measure_turn(daemon, min(chunks, 2000), args.subscribers)
        for trial in range(trials):
            # Alternate which goes first so neither always follows the other's cleanup.
            order = ((d_on, on), (d_off, off)) if trial % 2 == 0 else ((d_off, off), (d_on, on))
            for daemon, runs in order:
                label = "on" if daemon is d_on else "off"
                ctx.progress(f"trial {trial + 1}/{trials}: transcript {label}, {chunks:,} chunks")
                turn = measure_turn(daemon, chunks, args.subscribers)
                runs.append(turn)
                ctx.progress(f"  {turn.rate:,.0f} events/s")
    params = {"chunks": chunks, "subscribers": args.subscribers}
    off_row = Row(benchmark=NAME, name="throughput, transcript off (--no-persistence)",
                  params=params, unit="events/s", samples=[t.rate for t in off],
                  cpu=_mean_cpu(off), quick=ctx.quick)
    on_row = Row(benchmark=NAME, name="throughput, transcript on (SQLite, group commit)",
                 params=params, unit="events/s", samples=[t.rate for t in on],
                 cpu=_mean_cpu(on), quick=ctx.quick)
    on_row.baseline, on_row.baseline_label = off_row.value, "transcript off"
    ratio = (on_row.value or 0.0) / (off_row.value or 1.0)
    on_row.ratio, on_row.ratio_label = ratio, "of off"
    on_row.target = "cost <= 25% (ratio >= 0.75)"
    on_row.ok = 1 - ratio <= MAX_COST
    on_row.notes.append(f"the transcript costs {max(0.0, 1 - ratio) * 100:.0f}% of throughput")
    evicted = sum(t.evicted for t in on + off)
    if evicted:
        on_row.ok = False
        on_row.notes.append(f"{evicted} subscriber(s) evicted")
    cpu_on = [t.daemon_ms_per_1k for t in on if t.daemon_ms_per_1k is not None]
    cpu_off = [t.daemon_ms_per_1k for t in off if t.daemon_ms_per_1k is not None]
    rows = [on_row, off_row]
    if cpu_on and cpu_off:
        cpu_row = Row(benchmark=NAME, name="daemon CPU per 1,000 events, transcript on",
                      params=params, unit="ms", samples=cpu_on,
                      baseline=statistics.median(cpu_off), baseline_label="transcript off",
                      cpu=_mean_cpu(on), quick=ctx.quick)
        cpu_row.ratio = (cpu_row.value or 0.0) / cpu_row.baseline if cpu_row.baseline else None
        rows.append(cpu_row)
    return rows
