"""Benchmark: what GET /metrics costs the daemon's throughput.

The end-to-end turn of ``benchmarks.e2e`` (one turn of ``--chunks`` chunks streamed to one SSE
subscriber, every event checked), on one daemon, alternately without a scraper, with one that
reads ``GET /metrics`` every second (as Prometheus would, from another connection), and with
pollers every 10 ms of ``GET /metrics`` and of ``GET /health`` (a hundred times harder: what
any request at that rate costs a streaming turn, and what collecting the metrics adds to it).
Trials rotate the order. Baselines: the no-scraper rate of the same run, and for the 10 ms
``/metrics`` poller the 10 ms ``/health`` poller's. On a shared machine one turn's rate varies by 10-20 %, far more than a scrape a second
can cost, so those rows are informational; the cost itself is the last row: the daemon's CPU
time per scrape (from ``/proc``, over ``--scrapes`` scrapes of an idle daemon), against a
``GET /health`` measured the same way, and what one scrape a second is of one core.
"""

from __future__ import annotations

import argparse
import statistics
import threading

import httpx

from benchmarks.e2e import measure_turn
from benchmarks.harness import Context, Row, process_cpu_seconds
from benchmarks.launcher import Daemon, start_daemon

NAME = "metrics_cost"
TITLE = "GET /metrics: e2e turn throughput with and without a scraper"

# One scrape a second must cost the daemon under 1 % of one core.
SCRAPE_SHARE_TARGET = 0.01


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--chunks", type=int, default=None,
                        help="chunks per turn (default 100000; quick 20000)")
    parser.add_argument("--scrapes", type=int, default=None,
                        help="scrapes timed for the CPU row (default 300; quick 50)")


class Scraper:
    """A thread that GETs ``path`` every ``interval_s`` until stopped; counts its requests."""

    def __init__(self, url: str, path: str, interval_s: float) -> None:
        self.url = url
        self.path = path
        self.interval_s = interval_s
        self.scrapes = 0
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as http:
            while not self._stop.is_set():
                response = http.get(self.path)
                if response.status_code == 200:
                    self.scrapes += 1
                else:
                    self.failures += 1
                self._stop.wait(self.interval_s)

    def __enter__(self) -> Scraper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)


#: (path, interval) of the poller beside the turn; None: none.
Variant = tuple[str, float] | None
VARIANTS: tuple[Variant, ...] = (None, ("/metrics", 1.0), ("/health", 0.01), ("/metrics", 0.01))


def _label(variant: Variant) -> str:
    if variant is None:
        return "no scraper"
    path, interval = variant
    return f"GET {path} every {'1 s' if interval == 1.0 else '10 ms'}"


def _rate(daemon: Daemon, chunks: int, variant: Variant) -> tuple[float, int]:
    if variant is None:
        return measure_turn(daemon, chunks, 1).rate, 0
    with Scraper(daemon.url, *variant) as scraper:
        run = measure_turn(daemon, chunks, 1)
    if scraper.failures:
        raise RuntimeError(f"{scraper.failures} request(s) of GET {variant[0]} failed")
    return run.rate, scraper.scrapes


def run(ctx: Context, args: argparse.Namespace) -> list[Row]:
    chunks = args.chunks or ctx.pick(100_000, 20_000)
    trials = ctx.trials(4, 1)
    rates: dict[Variant, list[float]] = {variant: [] for variant in VARIANTS}
    requests: dict[Variant, int] = dict.fromkeys(VARIANTS, 0)
    with start_daemon() as daemon:
        measure_turn(daemon, min(chunks, 2000), 1)  # warm-up: agent started, code paths hot
        for trial in range(trials):
            ctx.progress(f"trial {trial + 1}/{trials}: " + ", ".join(map(_label, VARIANTS)))
            # Each trial starts with another variant: the turns of one daemon slow down as its
            # history grows, and no variant may always come first.
            shift = trial % len(VARIANTS)
            for variant in VARIANTS[shift:] + VARIANTS[:shift]:
                rate, done = _rate(daemon, chunks, variant)
                rates[variant].append(rate)
                requests[variant] += done
    medians = {variant: statistics.median(found) for variant, found in rates.items()}
    # The 10 ms /metrics poller is compared with a /health poller at the same rate: what
    # collecting the metrics costs beyond answering a request at all.
    baselines: dict[Variant, Variant] = {("/metrics", 1.0): None, ("/health", 0.01): None,
                                         ("/metrics", 0.01): ("/health", 0.01)}
    rows: list[Row] = []
    for variant in VARIANTS:
        row = Row(benchmark=NAME, name=f"e2e 1 subscriber, {_label(variant)}",
                  params={"chunks": chunks, "requests": requests[variant]}, unit="events/s",
                  samples=rates[variant], quick=ctx.quick)
        if variant in baselines:
            base = baselines[variant]
            row.baseline, row.baseline_label = medians[base], _label(base)
            row.ratio = (row.value or 0.0) / medians[base] if medians[base] else None
        rows.append(row)
    rows.append(cpu_row(ctx, args.scrapes or ctx.pick(300, 50)))
    return rows


def _cpu_ms_per_request(daemon: Daemon, path: str, count: int) -> float:
    with httpx.Client(base_url=daemon.url, timeout=30) as http:
        http.get(path)
        before = process_cpu_seconds(daemon.pid)
        for _ in range(count):
            response = http.get(path)
            if response.status_code != 200:
                raise RuntimeError(f"GET {path} answered {response.status_code}")
        after = process_cpu_seconds(daemon.pid)
    if before is None or after is None:
        raise RuntimeError("the daemon's CPU time cannot be read (/proc)")
    return (after - before) / count * 1000


def cpu_row(ctx: Context, scrapes: int) -> Row:
    ctx.progress(f"daemon CPU: {scrapes} scrapes of GET /metrics and of GET /health")
    metrics_ms: list[float] = []
    health_ms: list[float] = []
    with start_daemon() as daemon:
        measure_turn(daemon, 2000, 1)  # the counters and the transcript are not empty
        for _ in range(3):
            metrics_ms.append(_cpu_ms_per_request(daemon, "/metrics", scrapes))
            health_ms.append(_cpu_ms_per_request(daemon, "/health", scrapes))
    row = Row(benchmark=NAME, name="daemon CPU per GET /metrics", params={"scrapes": scrapes},
              unit="ms", samples=metrics_ms, quick=ctx.quick)
    row.baseline, row.baseline_label = statistics.median(health_ms), "GET /health"
    row.ratio = (row.value or 0.0) / row.baseline if row.baseline else None
    share = (row.value or 0.0) / 1000
    row.notes.append(f"one scrape a second: {share:.2%} of one core")
    row.target = f"1/s <= {SCRAPE_SHARE_TARGET:.0%} of a core"
    row.ok = share <= SCRAPE_SHARE_TARGET
    return row
