"""Benchmark 6: what the durable SQLite transcript costs in end-to-end throughput.

Two daemons run side by side, one with the transcript (the default) and one with
``--no-persistence``; trials alternate between them so machine noise hits both alike. Each trial
is benchmark 3's single-subscriber turn (``--chunks`` chunks, agent stdout to one SSE client,
ending when the client reads the terminal, which the daemon publishes only after the transcript
has committed the turn). The baseline is the transcript-off rate; the target is that the
transcript costs at most 25% of it.

An informational row measures the store alone, which the throughput rows cannot separate from
the machine's noise: ``TranscriptDatabase.apply`` on a fresh file with the batches a fast turn hands
the writer (runs of 64 chunks as the bus hands them on, a template and the updates, 32 runs per
commit: 2,048 events, about 0.7 MB of envelopes, what a turn at ~160,000 events/s commits every
~13 ms), then the turn boundary that
deletes them; CPU of that thread (user + system) per 1,000 events over the whole turn, boundary
included, and the bytes written to the files per event. It runs in a child process with the
daemon's malloc settings (``daemon.malloc.tune``): what a batch costs depends on them (a block
above the daemon's fixed mmap threshold is a fresh mapping each time), and they must not leak
into the other benchmarks of this process. The first turn only warms up (it grows the file;
later turns reuse its free pages, as a daemon does).
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.e2e import TurnRun, measure_turn
from benchmarks.harness import Context, CpuUse, Row
from benchmarks.launcher import start_daemon
from daemon.core.envelope import encode_json
from daemon.core.frame_codec import EnvelopeSplicer
from daemon.transcript_store import AppendEvent, FinishTurn, TranscriptDatabase, UpsertSession
from sdk.protocol.events import SessionUpdateData

STORE_SESSION = "6f1d2c3b-4a59-4e68-8f7a-0b1c2d3e4f50"
STORE_PROMPT = "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d"
STORE_CLIENT = "client_3c4d5e6f-7a8b-4c9d-8e0f-1a2b3c4d5e6f"
RUN_EVENTS = 64  # events per bus run (one AppendEvent)
OPS_PER_BATCH = 32  # runs per commit: 2,048 events

NAME = "transcript_cost"
TITLE = "transcript durability cost: throughput with the SQLite transcript on vs off"

MAX_COST = 0.25


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--chunks", type=int, default=None,
                        help="chunks per turn (default 100,000; quick 5,000)")
    parser.add_argument("--subscribers", type=int, default=1)


def _written_bytes() -> int:
    with open("/proc/self/io") as io:
        for line in io:
            if line.startswith("wchar:"):
                return int(line.split()[1])
    raise RuntimeError("no wchar in /proc/self/io")


def store_turns(chunks: int, turns: int) -> list[tuple[float, float]]:
    """(CPU ms per 1,000 events, bytes written per event) of each turn after the first,
    through the real ``TranscriptDatabase.apply``; raises unless every turn's events were stored
    and the boundary removed them."""
    updates = [encode_json(SessionUpdateData(
        session_id=STORE_SESSION,
        update={"sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": f"chunk-{i}"}}).update)
        for i in range(chunks)]
    splicer = EnvelopeSplicer(STORE_SESSION, STORE_PROMPT, STORE_CLIENT, 1_796_204_622_728)
    ops = [AppendEvent(STORE_SESSION, i + len(updates[i:i + RUN_EVENTS]), STORE_PROMPT,
                       b"\n".join(updates[i:i + RUN_EVENTS]), splicer.template(i + 1))
           for i in range(0, chunks, RUN_EVENTS)]
    batches = [ops[i:i + OPS_PER_BATCH] for i in range(0, len(ops), OPS_PER_BATCH)]
    text = b"x" * (12 * chunks)  # the compacted turn: about the chunks' text
    base = Path(tempfile.mkdtemp(prefix="tk-bench-store-"))
    out: list[tuple[float, float]] = []
    try:
        store = TranscriptDatabase(base / "transcript.db")
        try:
            store.apply([UpsertSession(STORE_SESSION, str(base), 0)])
            for turn in range(turns + 1):
                before = resource.getrusage(resource.RUSAGE_THREAD)
                wrote = _written_bytes()
                for batch in batches:
                    store.apply(batch)
                if store.max_raw_event_id(STORE_SESSION) != chunks:
                    raise RuntimeError("the store did not keep the turn's events")
                store.apply([FinishTurn(STORE_SESSION, STORE_PROMPT, "completed", "end_turn", 0,
                                        [(f"record-{turn}", text)])])
                if store.raw_events(STORE_SESSION):
                    raise RuntimeError("the turn boundary left raw events behind")
                after = resource.getrusage(resource.RUSAGE_THREAD)
                cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
                if turn:
                    out.append((cpu_s * 1e6 / chunks, (_written_bytes() - wrote) / chunks))
        finally:
            store.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return out


def store_turns_as_daemon(chunks: int, turns: int) -> list[tuple[float, float]]:
    """:func:`store_turns` in a child process tuned like the daemon (``daemon.malloc.tune``)."""
    code = ("import json, sys\n"
            "from daemon.malloc import tune\n"
            "tune()\n"
            "from benchmarks.transcript_cost import store_turns\n"
            f"json.dump(store_turns({chunks:d}, {turns:d}), sys.stdout)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, check=False,
                          timeout=600)
    if done.returncode != 0:
        raise RuntimeError("the store measurement failed: "
                           + done.stderr.decode(errors="replace")[-2000:])
    return [(float(cpu), float(wrote)) for cpu, wrote in json.loads(done.stdout)]


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
    store_chunks = ctx.pick(100_000, 5_000)
    ctx.progress(f"in-process store: {store_chunks:,}-event turns through TranscriptDatabase.apply")
    measured = store_turns_as_daemon(store_chunks, ctx.trials(4, 1))
    store_params = {"chunks": store_chunks, "events/commit": RUN_EVENTS * OPS_PER_BATCH}
    store_row = Row(benchmark=NAME, name="store CPU per 1,000 events (one thread, boundary incl.)",
                    params=store_params, unit="ms", samples=[cpu for cpu, _ in measured],
                    cpu=CpuUse(), cpu_note="the storing thread only (the row's value)",
                    quick=ctx.quick)
    store_row.notes.append("bytes written to the transcript files per event: "
                           f"{statistics.median(w for _, w in measured):,.0f}")
    rows.append(store_row)
    return rows
