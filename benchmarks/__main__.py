"""``python -m benchmarks``: run the benchmarks and print the results table.

    python -m benchmarks                 # everything (a few minutes)
    python -m benchmarks --quick         # smoke run, same code paths, small sizes (< 30 s)
    python -m benchmarks e2e --chunks 200000 --subscribers 1,8
    python -m benchmarks --out results.json

Progress goes to stderr (one line per step, with the elapsed time); the table goes to stdout.
The exit status is 1 when a benchmark failed to run (ERROR), and with ``--strict`` also when a
target was missed (MISS); otherwise 0, so a MISS on a busy machine does not break ``make test``.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks import (
    crash_loss,
    e2e,
    load_latency,
    memory,
    repair_cost,
    resume,
    stall_cut,
    transcript_cost,
)
from benchmarks.harness import (
    Context,
    CpuUse,
    Progress,
    Row,
    error_row,
    format_table,
    own_cpu_seconds,
    run_meta,
    summary_line,
    write_json,
)


@dataclass(frozen=True)
class Benchmark:
    name: str
    title: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[Context, argparse.Namespace], list[Row]]


# --- benchmark 1 lives in benchmarks/journal.py with its own row shape: adapt it ---------------


def _journal_arguments(parser: argparse.ArgumentParser) -> None:
    del parser  # journal.run takes only the quick flag


def _journal_run(ctx: Context, args: argparse.Namespace) -> list[Row]:
    from benchmarks import journal

    del args
    ctx.progress("LiveJournal append empty vs at caps, and the pure publish pipeline")
    cpu0 = own_cpu_seconds()
    raw_rows: list[dict[str, Any]] = journal.run(ctx.quick)
    cpu = CpuUse(None, None, (own_cpu_seconds() - cpu0) * 1000)
    return journal_rows(raw_rows, cpu, ctx.quick)


def journal_rows(raw_rows: Sequence[dict[str, Any]], cpu: CpuUse, quick: bool) -> list[Row]:
    """Turn ``benchmarks.journal.run`` rows into table rows.

    At-cap rows compare with the paired empty-journal rate (the ratio the 1.3x target is about);
    every other row compares with the ``deque.append`` baseline measured in the same run.
    """
    missing = [key for key in ("benchmark", "events", "events_per_s", "targets")
               if raw_rows and key not in raw_rows[0]]
    if missing:
        raise RuntimeError(f"benchmarks.journal.run rows lack {missing}: {sorted(raw_rows[0])}")
    deque_rate = next((float(r["events_per_s"]) for r in raw_rows
                       if "deque" in str(r["benchmark"]) and "encode" not in str(r["benchmark"])),
                      None)
    rows: list[Row] = []
    for raw in raw_rows:
        if raw.get("error"):
            rows.append(Row(benchmark="journal", name=str(raw["benchmark"]),
                            params={"events": int(raw["events"])}, unit="events/s", samples=[],
                            cpu=cpu, cpu_note="whole journal benchmark, in-process",
                            error=str(raw["error"]), quick=quick))
            continue
        rate = float(raw["events_per_s"])
        targets = raw.get("targets") or []
        row = Row(benchmark="journal", name=str(raw["benchmark"]),
                  params={"events": int(raw["events"])}, unit="events/s", samples=[rate],
                  cpu=cpu, cpu_note="whole journal benchmark, in-process", quick=quick)
        cap_vs_empty = raw.get("cap_vs_empty")
        if cap_vs_empty:
            # cap_vs_empty is a time ratio (at-cap seconds / empty seconds).
            row.baseline, row.baseline_label = rate * float(cap_vs_empty), "empty journal"
            row.ratio, row.ratio_label = float(cap_vs_empty), "cost vs empty"
        elif deque_rate:
            row.baseline, row.baseline_label = deque_rate, "deque.append"
            row.ratio, row.ratio_label = deque_rate / rate, "cost vs deque"
        if targets:
            row.target = "; ".join(str(t["target"]) for t in targets)
            row.ok = all(bool(t["ok"]) for t in targets)
        if raw.get("note"):
            row.notes.append(str(raw["note"]))
        rows.append(row)
    return rows


BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark("journal", "journal append at the caps (benchmarks/journal.py)",
              _journal_arguments, _journal_run),
    Benchmark(load_latency.NAME, load_latency.TITLE, load_latency.add_arguments,
              load_latency.run),
    Benchmark(e2e.NAME, e2e.TITLE, e2e.add_arguments, e2e.run),
    Benchmark(memory.NAME, memory.TITLE, memory.add_arguments, memory.run),
    Benchmark(resume.NAME, resume.TITLE, resume.add_arguments, resume.run),
    Benchmark(transcript_cost.NAME, transcript_cost.TITLE, transcript_cost.add_arguments,
              transcript_cost.run),
    Benchmark(repair_cost.NAME, repair_cost.TITLE, repair_cost.add_arguments, repair_cost.run),
    Benchmark(crash_loss.NAME, crash_loss.TITLE, crash_loss.add_arguments, crash_loss.run),
    Benchmark(stall_cut.NAME, stall_cut.TITLE, stall_cut.add_arguments, stall_cut.run),
)


def _common(parser: argparse.ArgumentParser, suppress: bool) -> None:
    # Sub-commands repeat the common options with SUPPRESS defaults, so an option given before
    # the benchmark name is not reset by the sub-parser.
    def default(value: Any) -> Any:
        return argparse.SUPPRESS if suppress else value

    parser.add_argument("--quick", action="store_true", default=default(False),
                        help="smoke run: small sizes, one trial, same code paths (< 30 s)")
    parser.add_argument("--out", metavar="FILE", default=default(None),
                        help="write the raw results as JSON")
    parser.add_argument("--trials", type=int, default=default(None),
                        help="trials per figure (default: per benchmark; 1 with --quick)")
    parser.add_argument("--strict", action="store_true", default=default(False),
                        help="exit 1 when a target is missed")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(parser, suppress=False)
    subs = parser.add_subparsers(dest="benchmark", metavar="BENCHMARK")
    for bench in BENCHMARKS:
        aliases = [bench.name.replace("_", "-")] if "_" in bench.name else []
        sub = subs.add_parser(bench.name, aliases=aliases, help=bench.title,
                              description=bench.title)
        _common(sub, suppress=True)
        bench.add_arguments(sub)
    return parser


def _defaults(bench: Benchmark) -> argparse.Namespace:
    parser = argparse.ArgumentParser(add_help=False)
    bench.add_arguments(parser)
    return parser.parse_args([])


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    started = time.time()
    selected = BENCHMARKS
    if args.benchmark:
        name = args.benchmark.replace("-", "_")
        selected = tuple(b for b in BENCHMARKS if b.name == name)
    progress = Progress()
    ctx = Context(quick=args.quick, progress=progress, trials_override=args.trials)
    progress(f"running {', '.join(b.name for b in selected)}"
             f"{' (quick)' if args.quick else ''}")
    rows: list[Row] = []
    for bench in selected:
        bench_args = args if args.benchmark else _defaults(bench)
        with progress.section(bench.name):
            try:
                rows.extend(bench.run(ctx, bench_args))
            except Exception as exc:
                traceback.print_exc(file=sys.stderr)
                rows.append(error_row(bench.name, exc, args.quick))
    print(format_table(rows))
    print()
    print(summary_line(rows) + (" (quick: small sizes, targets indicative only)"
                                if args.quick else ""))
    if args.out:
        write_json(args.out, rows, run_meta(argv, args.quick, started))
        progress(f"wrote {args.out}")
    if any(row.verdict == "ERROR" for row in rows):
        return 1
    if args.strict and any(row.verdict == "MISS" for row in rows):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
