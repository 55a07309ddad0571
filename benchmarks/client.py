"""Benchmark 10: client-side decode and reduce, this checkout against another one.

What a client spends per event once the bytes are in memory (no daemon, no network): the
workload (:mod:`benchmarks.client_workload`, see there for the frames) runs in a child process
per checkout, so two checkouts can be measured in the same run::

    python -m benchmarks client                               # this checkout, vs the floor
    python -m benchmarks client --compare-tree ../old-checkout --trials 5

Rows (each the best of ``--trials`` child processes, one measured pass each after a warm-up):

- ``model: SSE bytes -> parser -> reducer/store``: 40,000 frames of one long agent turn, fed
  in 64 KiB reads to the SDK's SSE parser and dispatched into the WebUI model's store;
- ``sdk: SSE bytes -> SessionHandle subscription``: the same bytes through a real
  ``SessionHandle`` over an in-memory HTTP transport, to the terminal;
- ``model: replay history + live journal into the store``: ``benchmarks/repair_cost.py``'s
  scale row (200,000 history events + a 10,000-entry live journal, events built in code);
- ``model: load answer bytes -> load_session -> replay``: that snapshot as a load answer's
  bytes, decoded by ``DaemonClient.load_session`` and replayed the same way.

Baseline: with ``--compare-tree DIR``, the same row measured on that checkout's ``sdk`` and
``webui_model`` (child processes alternate between the two checkouts, so load on the machine
hits both alike), and the target is "not slower": this checkout's best time at most the other's.
Each row's digest (blocks built, text length) must be equal on both checkouts, or the row is an
error. Without ``--compare-tree`` the baseline is the floor of the bytes themselves
(``msgspec.json`` decoding every frame into plain values) and the rows are informational.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgspec

from benchmarks import client_workload as workload
from benchmarks.harness import Context, CpuUse, Row

NAME = "client"
TITLE = "client decode/reduce: SSE -> model store, SDK handle, snapshot replay (in process)"

ROOT = Path(__file__).resolve().parent.parent
WORKLOAD = Path(workload.__file__).resolve()

ROW_NAMES = {
    "model_sse": "model: SSE bytes -> parser -> reducer/store",
    "sdk_handle": "sdk: SSE bytes -> SessionHandle subscription",
    "replay": "model: replay history + live journal into the store",
    "load_replay": "model: load answer bytes -> load_session -> replay",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--compare-tree", metavar="DIR", type=Path, default=None,
                        help="another checkout (e.g. a git worktree of an older commit) to "
                             "measure in the same run as the baseline")
    parser.add_argument("--frames", type=int, default=None,
                        help="SSE frames of the turn (default 40,000; quick 4,000)")
    parser.add_argument("--history", type=int, default=None,
                        help="history events of the replay rows (default 200,000; quick 20,000)")
    parser.add_argument("--live", type=int, default=None,
                        help="live-journal entries of the replay rows (default 10,000; "
                             "quick 1,000)")
    parser.add_argument("--rows", default=",".join(workload.ROWS),
                        help=f"which rows (default all: {','.join(workload.ROWS)})")


def _child(tree: Path, rows: str, sizes: dict[str, int]) -> tuple[dict[str, Any], float]:
    """One child process measuring ``rows`` on ``tree``: its results and its CPU seconds."""
    argv = [sys.executable, str(WORKLOAD), "--tree", str(tree), "--rows", rows, "--repeat", "1",
            *(f"--{key}={value}" for key, value in sizes.items())]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    if done.returncode != 0:
        raise RuntimeError(f"workload on {tree} failed (exit {done.returncode}): "
                           f"{done.stderr.strip()[-2000:]}")
    results: dict[str, Any] = json.loads(done.stdout)["rows"]
    return results, cpu


def _floor_seconds(frames: int) -> float:
    """Decoding every frame's envelope into plain values: what the bytes cost at least."""
    envelopes = workload.turn_envelopes(frames)
    decode = msgspec.json.Decoder().decode
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        for raw in envelopes:
            decode(raw)
        best = min(best, time.perf_counter() - started)
    return best


def run(ctx: Context, args: argparse.Namespace) -> list[Row]:
    sizes = {
        "frames": args.frames or ctx.pick(40_000, 4_000),
        "history": args.history or ctx.pick(200_000, 20_000),
        "live": args.live or ctx.pick(10_000, 1_000),
    }
    rows = [r for r in args.rows.split(",") if r]
    unknown = sorted(set(rows) - set(workload.ROWS))
    if unknown:
        raise ValueError(f"unknown rows {unknown}; known: {', '.join(workload.ROWS)}")
    trials = ctx.trials(5, 1)
    other: Path | None = args.compare_tree.resolve() if args.compare_tree else None
    if other is not None and not (other / "sdk").is_dir():
        raise ValueError(f"--compare-tree {other} holds no sdk/ package")
    trees = [ROOT] if other is None else [ROOT, other]
    seconds: dict[Path, dict[str, list[float]]] = {t: {r: [] for r in rows} for t in trees}
    digests: dict[Path, dict[str, Any]] = {t: {} for t in trees}
    events: dict[str, int] = {}
    cpu_s: dict[Path, list[float]] = {t: [] for t in trees}
    sse_bytes: dict[str, int] = {}
    for trial in range(trials):
        # Alternate which checkout goes first, so neither always runs on a warmer machine.
        order = trees if trial % 2 == 0 else trees[::-1]
        for tree in order:
            label = "this checkout" if tree == ROOT else str(tree)
            ctx.progress(f"trial {trial + 1}/{trials}: {label}: {','.join(rows)}")
            results, cpu = _child(tree, ",".join(rows), sizes)
            cpu_s[tree].append(cpu)
            for row in rows:
                seconds[tree][row].extend(results[row]["seconds"])
                digests[tree][row] = results[row]["digest"]
                events[row] = int(results[row]["events"])
                if results[row].get("sse_bytes"):
                    sse_bytes[row] = int(results[row]["sse_bytes"])
    floor = _floor_seconds(sizes["frames"]) if other is None else None
    out: list[Row] = []
    for row in rows:
        mine = seconds[ROOT][row]
        params: dict[str, Any] = {"events": events[row]}
        if row in sse_bytes:
            params["sse_MB"] = round(sse_bytes[row] / 1e6, 1)
        best = min(mine)
        result = Row(benchmark=NAME, name=ROW_NAMES[row], params=params, unit="ms",
                     samples=[s * 1000 for s in mine], value=best * 1000,
                     cpu=CpuUse(None, None, min(cpu_s[ROOT]) * 1000), quick=ctx.quick,
                     cpu_note="the least CPU of one child process (all rows, with set-up)",
                     notes=[f"best of {len(mine)} child processes; "
                            f"{events[row] / best:,.0f} events/s"])
        if other is not None:
            theirs = min(seconds[other][row])
            result.baseline, result.baseline_label = theirs * 1000, f"{other.name} checkout"
            result.ratio, result.ratio_label = best / theirs, "time vs it"
            result.target = "not slower (ratio <= 1.00)"
            result.ok = best <= theirs
            result.notes.append(f"{other.name}: {events[row] / theirs:,.0f} events/s")
            if digests[ROOT][row] != digests[other][row]:
                result.error = (f"the checkouts built different results: {digests[ROOT][row]} "
                                f"here, {digests[other][row]} in {other}")
        elif floor is not None and row in ("model_sse", "sdk_handle"):
            result.baseline, result.baseline_label = floor * 1000, "msgspec decode of frames"
            result.ratio, result.ratio_label = best / floor, "of the floor"
        out.append(result)
    return out
