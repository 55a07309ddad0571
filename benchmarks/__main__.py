"""``python -m benchmarks``: run the benchmarks and print the results table.

    python -m benchmarks                 # everything (a few minutes)
    python -m benchmarks --quick         # smoke run, same code paths, small sizes (< 30 s)
    python -m benchmarks e2e --chunks 200000 --subscribers 1,8
    python -m benchmarks --out results.json

Progress goes to stderr (one line per step, with the elapsed time); the table goes to stdout,
fitted to the terminal's width (``--wide``: one line per row, however long).
The exit status is 1 when a benchmark failed to run (ERROR), and with ``--strict`` also when a
target was missed (MISS); otherwise 0, so a MISS on a busy machine does not break ``make test``.

SIGTERM or SIGINT (Ctrl-C) stops the run: every daemon, agent and client it started is killed,
its scratch directory is removed, the rows finished so far are printed (and written to
``--out``) with the interrupted benchmark marked INTERRUPTED, and the exit status is 128 plus
the signal number (143, 130).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import textwrap
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from benchmarks import (
    attacks,
    client,
    cluster,
    crash_loss,
    e2e,
    launcher,
    load_latency,
    memory,
    metrics_cost,
    realload,
    repair_cost,
    resume,
    sessions,
    stall_cut,
    transcript_cost,
    viewer,
    ws_cost,
)
from benchmarks.harness import (
    Context,
    CpuUse,
    Progress,
    Row,
    error_row,
    format_table,
    git_commit,
    interrupted_row,
    own_cpu_seconds,
    run_meta,
    summary_line,
    terminal_width,
    write_json,
)


@dataclass(frozen=True)
class Benchmark:
    name: str
    title: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[Context, argparse.Namespace], list[Row]]
    # False: run only when named (``python -m benchmarks cluster``), not by a bare run.
    in_default_run: bool = True


# --- benchmark 1 lives in benchmarks/journal.py with its own row shape: adapt it ---------------


def _journal_arguments(parser: argparse.ArgumentParser) -> None:
    del parser  # journal.run takes only the quick flag


def _journal_run(ctx: Context, args: argparse.Namespace) -> list[Row]:
    from benchmarks import journal

    del args
    ctx.progress("LiveJournal append empty vs at caps, and the pure publish pipeline")
    cpu0 = own_cpu_seconds()
    raw_rows: list[dict[str, Any]] = journal.run(ctx.quick, ctx.progress)
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
    Benchmark(client.NAME, client.TITLE, client.add_arguments, client.run),
    # Builds a 1 GiB deflate bomb and floods a daemon from many threads: only when named.
    Benchmark(attacks.NAME, attacks.TITLE, attacks.add_arguments, attacks.run,
              in_default_run=False),
    # Thousands of sessions on two daemons per size (minutes at 5,000): only when named.
    Benchmark(sessions.NAME, sessions.TITLE, sessions.add_arguments, sessions.run,
              in_default_run=False),
    # Three turns per trial (no scraper, 1 s, 10 ms): only when named.
    Benchmark(metrics_cost.NAME, metrics_cost.TITLE, metrics_cost.add_arguments,
              metrics_cost.run, in_default_run=False),
    # Needs chromium and a browser page per size: only when named.
    Benchmark(viewer.NAME, viewer.TITLE, viewer.add_arguments, viewer.run, in_default_run=False),
    # Four turns per trial on one daemon (a minute at 100,000 chunks): only when named.
    Benchmark(ws_cost.NAME, ws_cost.TITLE, ws_cost.add_arguments, ws_cost.run,
              in_default_run=False),
    # A search over session counts (minutes; --quick under 2): only when named.
    Benchmark(realload.NAME, realload.TITLE, realload.add_arguments, realload.run,
              in_default_run=False),
    # Needs redis-server and starts three nodes: only when named.
    Benchmark(cluster.NAME, cluster.TITLE, cluster.add_arguments, cluster.run,
              in_default_run=False),
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
    parser.add_argument("--wide", action="store_true", default=default(False),
                        help="print the full table, one line per row, whatever the terminal's "
                             "width (default: wrap to the terminal, or 100 columns)")


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


@dataclass
class _Run:
    """What an interrupted run needs to clean up and report."""

    args: argparse.Namespace
    argv: list[str]
    started: float
    commit: str | None
    scratch: str
    progress: Progress
    rows: list[Row] = field(default_factory=list)
    current: str | None = None
    reported: bool = False


def _write_fd(fd: int, text: str) -> None:
    # Straight to the file descriptor: a signal handler must not re-enter a buffered stream
    # the interrupted code was writing to.
    data = text.encode()
    while data:
        data = data[os.write(fd, data):]


def _report(run: _Run, write: Callable[[str], None], note: Callable[[str], None]) -> None:
    """Print the table and the summary, write ``--out``."""
    run.reported = True
    args = run.args
    width = None if args.wide else terminal_width()
    write(format_table(run.rows, width) + "\n\n")
    summary = summary_line(run.rows) + (" (quick: small sizes, targets indicative only)"
                                        if args.quick else "")
    write((summary if width is None else "\n".join(textwrap.wrap(summary, max(width, 20))))
          + "\n")
    if args.out:
        write_json(args.out, run.rows, run_meta(run.argv, args.quick, run.started, run.commit))
        note(f"wrote {args.out}")


def _install_stop_handlers(run: _Run) -> None:
    def stop(signum: int, frame: FrameType | None) -> None:
        del frame
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)  # one clean-up, however many signals follow
        name = signal.Signals(signum).name
        elapsed = time.time() - run.started
        _write_fd(2, f"[{elapsed:7.1f}s] {name}: stopping every process this run started\n")
        killed = launcher.kill_everything(run.scratch)
        shutil.rmtree(run.scratch, ignore_errors=True)
        _write_fd(2, f"[{time.time() - run.started:7.1f}s] {name}: killed pids "
                     f"{' '.join(map(str, killed)) or '(none)'}; removed {run.scratch}\n")
        if not run.reported:
            if run.current is not None:
                run.rows.append(interrupted_row(
                    run.current, f"stopped by {name} after {elapsed:.1f}s of the run",
                    run.args.quick))
            try:
                sys.stdout.flush()
            except (OSError, RuntimeError, ValueError):
                pass
            _report(run, lambda text: _write_fd(1, text),
                    lambda text: _write_fd(2, f"[{time.time() - run.started:7.1f}s] {text}\n"))
        os._exit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    started = time.time()
    selected = tuple(b for b in BENCHMARKS if b.in_default_run)
    if args.benchmark:
        name = args.benchmark.replace("-", "_")
        selected = tuple(b for b in BENCHMARKS if b.name == name)
    progress = Progress()
    # Every scratch file of the run (daemons' data dirs, clients' temp files) goes under one
    # directory, which each process started inherits as TMPDIR: an interrupted run finds its
    # processes by it and removes it.
    scratch = tempfile.mkdtemp(prefix="tk-bench-run-")
    saved_tmpdir, saved_env = tempfile.tempdir, os.environ.get("TMPDIR")
    tempfile.tempdir = scratch
    os.environ["TMPDIR"] = scratch
    run = _Run(args, argv, started, git_commit(), scratch, progress)
    saved_handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    _install_stop_handlers(run)
    launcher.set_reporter(progress)
    try:
        ctx = Context(quick=args.quick, progress=progress, trials_override=args.trials)
        progress(f"running {', '.join(b.name for b in selected)}"
                 f"{' (quick)' if args.quick else ''}; scratch directory {scratch}")
        for bench in selected:
            bench_args = args if args.benchmark else _defaults(bench)
            run.current = bench.name
            with progress.section(bench.name):
                try:
                    rows = bench.run(ctx, bench_args)
                except Exception as exc:
                    traceback.print_exc(file=sys.stderr)
                    rows = [error_row(bench.name, exc, args.quick)]
            run.rows.extend(rows)
            run.current = None
        _report(run, lambda text: print(text, end=""), progress)
        sys.stdout.flush()
    finally:
        launcher.set_reporter(None)
        for sig, handler in saved_handlers.items():
            signal.signal(sig, handler)
        tempfile.tempdir = saved_tmpdir
        if saved_env is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = saved_env
        shutil.rmtree(scratch, ignore_errors=True)
    rows = run.rows
    if any(row.verdict == "ERROR" for row in rows):
        return 1
    if args.strict and any(row.verdict == "MISS" for row in rows):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
