"""Benchmark 10: client-side decode and reduce, on each event loop, this checkout against another.

What a client spends per event once the bytes are in memory or on a loopback socket (no daemon):
the workload (:mod:`benchmarks.client_workload`, see there for the frames) runs in a child process
per checkout and event loop, so two checkouts and every loop can be measured in the same run::

    python -m benchmarks client                               # this checkout, every loop
    python -m benchmarks client --compare-tree ../old-checkout --trials 5
    python -m benchmarks client --backends trio,asyncio       # leave uvloop out

Each row's value is the client's CPU time (the child process's ``time.process_time``): on a
machine shared with other work the wall time mostly measures the neighbours, so the wall time is
only noted beside it. Rows (each the best of ``--trials`` child processes, one measured pass each
after a warm-up), each
reported once per event loop (``[trio]``, ``[asyncio]``, ``[uvloop]`` when it is installed); every
row runs inside that loop, the pure ones included (they do not depend on it, and show so):

- ``model: SSE bytes -> parser -> reducer/store``: 40,000 frames of one long agent turn, fed
  in 64 KiB reads to the SDK's SSE parser and dispatched into the WebUI model's store;
- ``sdk: SSE bytes -> SessionHandle subscription``: the same bytes through a real
  ``SessionHandle`` over an in-memory HTTP transport, to the terminal;
- ``sdk: SSE over a loopback socket -> SessionHandle`` and ``sdk: WebSocket over a loopback
  socket -> SessionHandle``: the same events from a server process on 127.0.0.1, through the
  loop's own network stack, to the terminal;
- ``model: replay history + live journal into the store``: ``benchmarks/repair_cost.py``'s
  scale row (200,000 history events + a 10,000-entry live journal, events built in code);
- ``model: load answer bytes -> load_session -> replay``: that snapshot as a load answer's
  bytes, decoded by ``DaemonClient.load_session`` and replayed the same way.

Baselines and targets:

- a ``[trio]`` row, with ``--compare-tree DIR``: the same row on that checkout's ``sdk`` and
  ``webui_model`` under Trio (child processes alternate between the checkouts, so load on the
  machine hits both alike), target "not slower": this checkout's best time at most the other's.
  Each row's digest (blocks built, text length) must be equal on both checkouts, or the row is an
  error. Without ``--compare-tree`` the baseline of the SSE rows is the floor of the bytes
  themselves (``msgspec.json`` decoding every frame into plain values), informational;
- an ``[asyncio]`` or ``[uvloop]`` row: this checkout's ``[trio]`` row of the same run, target
  "within 1.5x of Trio". The other checkout is measured on Trio only (the SDK ran only on Trio
  before it ran on anyio).
"""

from __future__ import annotations

import argparse
import importlib.util
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
TITLE = ("client decode/reduce on each event loop: SSE -> model store, SDK handle (in memory "
         "and on loopback sockets), snapshot replay")

ROOT = Path(__file__).resolve().parent.parent
WORKLOAD = Path(workload.__file__).resolve()

ROW_NAMES = {
    "model_sse": "model: SSE bytes -> parser -> reducer/store",
    "sdk_handle": "sdk: SSE bytes -> SessionHandle subscription",
    "sse_socket": "sdk: SSE over a loopback socket -> SessionHandle",
    "ws_socket": "sdk: WebSocket over a loopback socket -> SessionHandle",
    "replay": "model: replay history + live journal into the store",
    "load_replay": "model: load answer bytes -> load_session -> replay",
}
ASYNCIO_TARGET = 1.5  # an asyncio row's time at most this many times the Trio row's
SSE_ROWS = ("model_sse", "sdk_handle", "sse_socket")


def default_backends() -> list[str]:
    """Trio and asyncio, and uvloop when it is installed."""
    found = ["trio", "asyncio"]
    if importlib.util.find_spec("uvloop") is not None:
        found.append("uvloop")
    return found


def row_name(row: str, backend: str) -> str:
    return f"{ROW_NAMES[row]} [{backend}]"


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
    parser.add_argument("--backends", default=",".join(default_backends()),
                        help="the event loops this checkout is measured on (default: "
                             "trio,asyncio and uvloop when installed; the first is the baseline "
                             "of the others)")


def _child(tree: Path, rows: str, sizes: dict[str, int],
           backend: str) -> tuple[dict[str, Any], float]:
    """One child process measuring ``rows`` on ``tree`` under ``backend``: its results and its
    CPU seconds."""
    argv = [sys.executable, str(WORKLOAD), "--tree", str(tree), "--backend", backend,
            "--rows", rows, "--repeat", "1",
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
    backends = [b for b in args.backends.split(",") if b]
    strange = sorted(set(backends) - set(workload.BACKENDS))
    if strange or not backends:
        raise ValueError(f"unknown backends {strange}; known: {', '.join(workload.BACKENDS)}")
    trials = ctx.trials(5, 1)
    other: Path | None = args.compare_tree.resolve() if args.compare_tree else None
    if other is not None and not (other / "sdk").is_dir():
        raise ValueError(f"--compare-tree {other} holds no sdk/ package")
    # (checkout, loop) pairs; the other checkout is measured on Trio, as the SDK ran before.
    runs = [(ROOT, backend) for backend in backends]
    if other is not None:
        runs.append((other, "trio"))
    seconds: dict[tuple[Path, str], dict[str, list[float]]] = {r: {x: [] for x in rows}
                                                             for r in runs}
    wall: dict[tuple[Path, str], dict[str, list[float]]] = {r: {x: [] for x in rows}
                                                          for r in runs}
    digests: dict[tuple[Path, str], dict[str, Any]] = {r: {} for r in runs}
    cpu_s: dict[tuple[Path, str], list[float]] = {r: [] for r in runs}
    events: dict[str, int] = {}
    sse_bytes: dict[str, int] = {}
    for trial in range(trials):
        # Alternate the order, so no checkout or loop always runs on a warmer machine.
        order = runs if trial % 2 == 0 else runs[::-1]
        for tree, backend in order:
            label = "this checkout" if tree == ROOT else str(tree)
            ctx.progress(f"trial {trial + 1}/{trials}: {label} [{backend}]: {','.join(rows)}")
            results, cpu = _child(tree, ",".join(rows), sizes, backend)
            cpu_s[tree, backend].append(cpu)
            for row in rows:
                seconds[tree, backend][row].extend(results[row]["seconds"])
                wall[tree, backend][row].extend(results[row].get("wall") or [])
                digests[tree, backend][row] = results[row]["digest"]
                events[row] = int(results[row]["events"])
                if results[row].get("sse_bytes"):
                    sse_bytes[row] = int(results[row]["sse_bytes"])
    floor = _floor_seconds(sizes["frames"]) if other is None else None
    out: list[Row] = []
    for row in rows:
        baseline_backend = backends[0]
        for backend in backends:
            result = _row(ctx, row, backend, baseline_backend, other, seconds, digests,
                          cpu_s, events, sse_bytes, floor)
            if wall[ROOT, backend][row]:
                result.notes.append(f"wall: best {min(wall[ROOT, backend][row]) * 1000:,.1f} ms")
            out.append(result)
    return out


def _row(ctx: Context, row: str, backend: str, baseline_backend: str, other: Path | None,
         seconds: dict[tuple[Path, str], dict[str, list[float]]],
         digests: dict[tuple[Path, str], dict[str, Any]],
         cpu_s: dict[tuple[Path, str], list[float]], events: dict[str, int],
         sse_bytes: dict[str, int], floor: float | None) -> Row:
    mine = seconds[ROOT, backend][row]
    params: dict[str, Any] = {"events": events[row], "loop": backend}
    if row in sse_bytes:
        params["sse_MB"] = round(sse_bytes[row] / 1e6, 1)
    best = min(mine)
    result = Row(benchmark=NAME, name=row_name(row, backend), params=params, unit="ms",
                 samples=[s * 1000 for s in mine], value=best * 1000,
                 cpu=CpuUse(None, None, min(cpu_s[ROOT, backend]) * 1000), quick=ctx.quick,
                 cpu_note="the least CPU of one child process (all rows, with set-up)",
                 notes=[f"best of {len(mine)} child processes; "
                        f"{events[row] / best:,.0f} events per CPU second"])
    if backend != baseline_backend:
        # Another loop against this checkout's baseline loop (Trio), measured in the same run.
        base = min(seconds[ROOT, baseline_backend][row])
        result.baseline, result.baseline_label = base * 1000, f"[{baseline_backend}] here"
        result.ratio, result.ratio_label = best / base, f"time vs {baseline_backend}"
        result.target = f"within {ASYNCIO_TARGET:g}x of {baseline_backend} (ratio <= " \
                        f"{ASYNCIO_TARGET:.2f})"
        result.ok = best <= ASYNCIO_TARGET * base
        if digests[ROOT, backend][row] != digests[ROOT, baseline_backend][row]:
            result.error = (f"the loops built different results: {digests[ROOT, backend][row]} "
                            f"on {backend}, {digests[ROOT, baseline_backend][row]} on "
                            f"{baseline_backend}")
    elif other is not None and (other, backend) in seconds:
        theirs = min(seconds[other, backend][row])
        result.baseline, result.baseline_label = theirs * 1000, f"{other.name} checkout"
        result.ratio, result.ratio_label = best / theirs, "time vs it"
        result.target = "not slower (ratio <= 1.00)"
        result.ok = best <= theirs
        result.notes.append(f"{other.name}: {events[row] / theirs:,.0f} events per CPU second")
        if digests[ROOT, backend][row] != digests[other, backend][row]:
            result.error = (f"the checkouts built different results: "
                            f"{digests[ROOT, backend][row]} here, "
                            f"{digests[other, backend][row]} in {other}")
    elif floor is not None and row in SSE_ROWS:
        result.baseline, result.baseline_label = floor * 1000, "msgspec decode of frames"
        result.ratio, result.ratio_label = best / floor, "of the floor"
    return result
