"""Benchmark 4: daemon memory (RSS) idle, at full caps, and over a very long open turn.

RSS is ``VmRSS`` from ``/proc/<pid>/status`` of the daemon process only (the agent is another
process). Sizes are MB = 10^6 bytes. Steps, all in one daemon with the default caps (8 MiB
live journal, 4 MiB replay window, 8,000-event ring) and the transcript on:

1. *idle*: started, a few ``GET /health`` served, no session.
2. *full caps*: one session whose replay window is full (five completed ~1 MB turns) and whose
   open turn has pushed the live journal to its 8 MiB cap (short ``chunk-N`` texts, so the
   open turn's own compacted text stays small).
3. that turn ends; a second turn of ``--chunks`` (default 1,000,000) short chunks runs and is
   held open by a gate; RSS is read once every chunk is published and committed. The caps were
   already reached, so the growth over step 2 should be the open turn's compacted text (kept
   until the terminal, SPEC §3.1) and little else.

Each step waits until the transcript has committed everything published (``durableEventId``),
so a backlog in the writer queue is not counted as resident state.

Baselines: for *idle*, a Python process that imports the daemon's modules and does nothing (the
floor); for *full caps*, the idle RSS; for the growth, the open turn's text size in UTF-8 bytes
(target: growth <= 1.5x that text + 5% of the full-caps RSS).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

from benchmarks.harness import MIB, Context, CpuMeter, CpuUse, Row
from benchmarks.launcher import Daemon, gate_name, start_daemon
from benchmarks.load_latency import WINDOW_TURN_CHUNKS, WINDOW_TURN_PAD, WINDOW_TURNS, session_info

NAME = "memory"
TITLE = "daemon RSS: idle, one session at full caps, and a 1,000,000-chunk open turn"

IDLE_TARGET_MB = 60.0
FULL_TARGET_MB = 79.0
GROWTH_TEXT_FACTOR = 1.5
GROWTH_SLACK = 0.05
MB = 1e6
# Unpadded mock chunks are ~350 B events: this many fill the 8 MiB journal with room to spare.
FILL_CHUNKS = 30_000

IMPORT_FLOOR = (
    "import daemon.server, daemon.http_api, daemon.manager, daemon.streams, daemon.asgi\n"
    "for line in open('/proc/self/status'):\n"
    "    if line.startswith('VmRSS:'): print(line.split()[1])\n"
)


def import_floor_kib() -> int:
    """RSS of a Python process that imports the daemon's modules and does nothing else."""
    out = subprocess.run([sys.executable, "-c", IMPORT_FLOOR], check=True, capture_output=True,
                         text=True, timeout=60)
    return int(out.stdout.strip())


def text_bytes(chunks: int) -> int:
    """UTF-8 size of the mock's ``chunk-0`` ... ``chunk-(n-1)`` texts joined."""
    return sum(len(f"chunk-{i}") for i in range(chunks))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--chunks", type=int, default=None,
                        help="chunks in the long open turn (default 1,000,000; quick 50,000)")


def _rss_mb(daemon: Daemon) -> float:
    return daemon.rss_kib() * 1024 / MB


def run(ctx: Context, args: argparse.Namespace) -> list[Row]:
    chunks = args.chunks or ctx.pick(1_000_000, 50_000)
    ctx.progress("import floor (python + the daemon's modules)")
    floor_mb = import_floor_kib() * 1024 / MB
    ctx.progress("starting daemon (default caps, transcript on)")
    with start_daemon() as daemon:
        for _ in range(5):
            daemon.get_json("/health")
        idle_mb = _rss_mb(daemon)
        ctx.progress(f"idle RSS {idle_mb:.1f} MB; filling the replay window")
        session_id, client_id = daemon.create_session()
        meter = CpuMeter(daemon.pid, daemon.agent_pids())
        meter.start()
        for _ in range(WINDOW_TURNS):
            daemon.prompt(session_id, f"mock:chunks={WINDOW_TURN_CHUNKS} "
                                      f"mock:bytes={WINDOW_TURN_PAD} mock:delay_ms=0", client_id)
            daemon.wait_idle(session_id)
        ctx.progress(f"filling the live journal ({FILL_CHUNKS:,} chunks, turn held open)")
        fill_gate = gate_name()
        accepted = daemon.prompt(session_id, f"mock:chunks={FILL_CHUNKS} mock:gate={fill_gate}",
                                 client_id)
        daemon.wait_ingested(session_id, int(accepted["lastEventId"]) + 1 + FILL_CHUNKS,
                             durable=True)
        full_cpu = meter.stop()
        info = session_info(daemon, session_id)
        full_mb = _rss_mb(daemon)
        ctx.progress(f"full-caps RSS {full_mb:.1f} MB (journal "
                     f"{info['journalBytes'] / MIB:.2f} MiB, window "
                     f"{info['replayWindowBytes'] / MIB:.2f} MiB)")
        daemon.open_gate(fill_gate)
        daemon.wait_idle(session_id)
        ctx.progress(f"long turn: {chunks:,} chunks, held open")
        long_gate = gate_name()
        meter.start()
        started = time.monotonic()
        accepted = daemon.prompt(session_id, f"mock:chunks={chunks} mock:gate={long_gate}",
                                 client_id)
        daemon.wait_ingested(session_id, int(accepted["lastEventId"]) + 1 + chunks,
                             durable=True)
        long_cpu = meter.stop()
        long_s = time.monotonic() - started
        long_info = session_info(daemon, session_id)
        after_mb = _rss_mb(daemon)
        ctx.progress(f"RSS with the long turn open {after_mb:.1f} MB "
                     f"({chunks / long_s:,.0f} chunks/s ingested and committed)")
        daemon.open_gate(long_gate)
        daemon.wait_idle(session_id)
        ended_mb = _rss_mb(daemon)
    text_mb = text_bytes(chunks) / MB
    return rows_for(ctx, chunks, floor_mb, idle_mb, full_mb, after_mb, ended_mb, text_mb, info,
                    long_info, full_cpu, long_cpu)


def rows_for(ctx: Context, chunks: int, floor_mb: float, idle_mb: float, full_mb: float,
             after_mb: float, ended_mb: float, text_mb: float, info: dict[str, int],
             long_info: dict[str, int], full_cpu: CpuUse, long_cpu: CpuUse) -> list[Row]:
    caps = {"journal_MiB": round(info["journalBytes"] / MIB, 2),
            "window_MiB": round(info["replayWindowBytes"] / MIB, 2)}
    idle = Row(benchmark=NAME, name="daemon RSS idle", params={"sessions": 0}, unit="MB",
               samples=[idle_mb], baseline=floor_mb, baseline_label="import floor",
               ratio=idle_mb / floor_mb, target=f"<= {IDLE_TARGET_MB:g} MB",
               ok=idle_mb <= IDLE_TARGET_MB, cpu_note="-", quick=ctx.quick,
               notes=["reference daemon: 212 MB idle"])
    full = Row(benchmark=NAME, name="daemon RSS, one session at full caps", params=caps,
               unit="MB", samples=[full_mb], baseline=idle_mb, baseline_label="idle",
               ratio=full_mb / idle_mb, target=f"<= {FULL_TARGET_MB:g} MB",
               ok=full_mb <= FULL_TARGET_MB, cpu=full_cpu, cpu_note="to fill", quick=ctx.quick,
               notes=["reference daemon: 237 MB with a full journal"])
    growth_mb = after_mb - full_mb
    allowed = GROWTH_TEXT_FACTOR * text_mb + GROWTH_SLACK * full_mb
    growth = Row(
        benchmark=NAME, name=f"RSS growth over an open {chunks:,}-chunk turn (caps reached)",
        params={"chunks": chunks, "text_MB": round(text_mb, 2),
                "journal_MiB": round(long_info["journalBytes"] / MIB, 2)},
        unit="MB", samples=[growth_mb], baseline=text_mb, baseline_label="open turn's text",
        ratio=growth_mb / text_mb if text_mb else None, ratio_label="of text",
        target=f"<= 1.5x text + 5% ({allowed:.1f} MB)", ok=growth_mb <= allowed,
        cpu=long_cpu, cpu_note="whole turn", quick=ctx.quick,
        notes=[f"RSS {full_mb:.1f} MB at full caps -> {after_mb:.1f} MB with the turn open "
               f"(text {text_mb:.2f} MB) -> {ended_mb:.1f} MB after its terminal"])
    ended = Row(benchmark=NAME, name=f"daemon RSS after the {chunks:,}-chunk turn ended",
                params=caps, unit="MB", samples=[ended_mb], baseline=full_mb,
                baseline_label="full caps", ratio=ended_mb / full_mb, cpu_note="-",
                quick=ctx.quick)
    return [idle, full, growth, ended]
