"""Benchmark: what a WebSocket subscriber costs the daemon, against an SSE subscriber.

One daemon (transcript on), one mock turn of ``--chunks`` chunks at a time, held by the load
generator (``benchmarks.loadgen``, one separate process; ``--transport ws`` for WebSockets) at
the default ``maxQueued`` (256) and without reconnecting: an evicted subscriber misses the rest
of its turn, and the turn then gives no figure but an ERROR. Each trial runs four turns, in an
order that rotates from trial to trial: 1 and ``--subscribers`` SSE subscribers, 1 and
``--subscribers`` WebSockets. Every subscriber's ids are checked against what the bus published
(contiguous, first to last, the terminal last).

Rows:

- *daemon CPU per 1,000 WebSocket deliveries*: the daemon's CPU over the N-WebSocket turn per
  1,000 events delivered (events x N), against the same for the N-SSE turn of the same trial
  (the baseline; the ratio is the median of the per-trial ratios). Both include the turn's
  publishing, the same work for both. The note gives each transport's marginal cost too,
  ``(cpu(N) - cpu(1)) / ((N - 1) x events)``: what one more subscriber costs (noisy: for SSE
  it is near zero, within the noise of the turn's own cost);
- *N WebSockets receive the turn whole*: the delivered rate, against N SSE subscribers' in the
  same trial; its figure exists only if all N received every event, none evicted.

Daemon CPU is the daemon process's user + system time (``/proc``), robust to a busy machine
where wall time is not.
"""

from __future__ import annotations

import argparse
import statistics

from benchmarks.e2e import TurnRun, measure_turn
from benchmarks.harness import Context, CpuUse, Row
from benchmarks.launcher import start_daemon
from daemon.core.subscriber import MAX_QUEUED_DEFAULT

NAME = "ws_cost"
TITLE = "WebSocket subscribers against SSE subscribers (daemon CPU per delivery)"

CPU_RATIO_TARGET = 1.5  # WebSocket's marginal CPU per delivery over SSE's, same trial


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--chunks", type=int, default=None,
                        help="chunks per turn (default 100,000; quick 10,000)")
    parser.add_argument("--subscribers", type=int, default=8,
                        help="subscribers of the many-subscriber turns (default 8)")


def _daemon_ms(turn: TurnRun) -> float:
    if turn.cpu.daemon_ms is None:
        raise RuntimeError("the daemon's CPU time could not be read (/proc)")
    return turn.cpu.daemon_ms


def _per_1k_deliveries(turn: TurnRun) -> float:
    """Daemon CPU (ms) per 1,000 events delivered over the turn (all subscribers)."""
    return _daemon_ms(turn) / (turn.delivered / 1000)


def _marginal_ms_per_1k(one: TurnRun, many: TurnRun) -> float:
    """Daemon CPU (ms) per 1,000 deliveries of each subscriber past the first."""
    extra = many.subscribers - one.subscribers
    return (_daemon_ms(many) - _daemon_ms(one)) / (extra * many.published / 1000)


def run(ctx: Context, args: argparse.Namespace) -> list[Row]:
    chunks = args.chunks or ctx.pick(100_000, 10_000)
    many = args.subscribers
    if many < 2:
        raise ValueError("--subscribers must be at least 2 (the cost is the difference)")
    trials = ctx.trials(3, 1)
    turns = [("sse", 1), ("sse", many), ("ws", 1), ("ws", many)]
    runs: dict[tuple[str, int], list[TurnRun]] = {turn: [] for turn in turns}
    daemon = start_daemon()
    try:
        for trial in range(trials):
            order = turns[trial % len(turns):] + turns[:trial % len(turns)]
            for transport, subscribers in order:
                ctx.progress(f"trial {trial + 1}/{trials}: {chunks:,} chunks to "
                             f"{subscribers} {transport} subscriber(s)")
                runs[transport, subscribers].append(measure_turn(
                    daemon, chunks, subscribers, MAX_QUEUED_DEFAULT, transport=transport,
                    reconnect=False))
    finally:
        daemon.stop()
    ws_ms = [_per_1k_deliveries(t) for t in runs["ws", many]]
    sse_ms = [_per_1k_deliveries(t) for t in runs["sse", many]]
    ratios = [w / s for w, s in zip(ws_ms, sse_ms, strict=True)]
    ratio = statistics.median(ratios)
    params = {"chunks": chunks, "subscribers": many, "maxQueued": MAX_QUEUED_DEFAULT}
    cost_row = Row(
        benchmark=NAME, name="daemon CPU per 1,000 WebSocket deliveries",
        params=params, unit="ms", samples=ws_ms,
        baseline=statistics.median(sse_ms), baseline_label=f"{many} SSE, same trials",
        ratio=ratio, ratio_label="median of per-trial WS/SSE",
        target=f"<= {CPU_RATIO_TARGET:g}x SSE", ok=ratio <= CPU_RATIO_TARGET,
        cpu=_mean_cpu(runs["ws", many]), cpu_note=f"per {many}-WebSocket turn", quick=ctx.quick)

    def marginal(transport: str) -> str:
        return ", ".join(f"{_marginal_ms_per_1k(a, b):.2f}" for a, b in zip(
            runs[transport, 1], runs[transport, many], strict=True))

    cost_row.notes.append(
        "per-trial WS/SSE ratios: " + ", ".join(f"{r:.2f}" for r in ratios)
        + f"; marginal ms per 1,000 deliveries of one more subscriber: WS {marginal('ws')}, "
          f"SSE {marginal('sse')}")
    ws_many, sse_many = runs["ws", many], runs["sse", many]
    ws_rate = [t.rate for t in ws_many]
    sse_rate = [t.rate for t in sse_many]
    whole_row = Row(
        benchmark=NAME, name=f"{many} WebSockets receive the turn whole",
        params=params, unit="events/s", samples=ws_rate,
        baseline=statistics.median(sse_rate), baseline_label=f"{many} SSE, same trials",
        ratio=statistics.median(ws_rate) / statistics.median(sse_rate),
        ratio_label="delivered rate WS/SSE",
        target="every event to every subscriber, none evicted",
        ok=all(t.evicted == 0 for t in ws_many),
        cpu=_mean_cpu(ws_many), cpu_note=f"per {many}-WebSocket turn", quick=ctx.quick)
    whole_row.notes.append(
        f"{sum(t.delivered for t in ws_many):,} events delivered over {len(ws_many)} turn(s) "
        f"of {ws_many[0].published:,} events each, {sum(t.evicted for t in ws_many)} evicted")
    return [cost_row, whole_row]


def _mean_cpu(turns: list[TurnRun]) -> CpuUse:
    total = CpuUse()
    for turn in turns:
        total = total + turn.cpu
    return total.scaled(1 / len(turns))
