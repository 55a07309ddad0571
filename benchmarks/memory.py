"""Benchmark 4: daemon memory (RSS) idle, at full caps, and over a very long open turn.

RSS is ``VmRSS`` from ``/proc/<pid>/status`` of the daemon process only (the agent is another
process). Sizes are MB = 10^6 bytes. Steps, all in one daemon with the default caps (8 MiB
live journal, 4 MiB replay window, 8,000-event ring) and the transcript on:

1. *idle*: started, its start-up check of the transcript over, a few ``GET /health`` served,
   no session; read once RSS holds still.
2. *full caps*: one session whose replay window is full (five completed ~1 MB turns) and whose
   open turn has pushed the live journal to its 8 MiB cap (short ``chunk-N`` texts, so the
   open turn's own compacted text stays small). Read once RSS holds still (see
   ``settled_rss_mb``), as are the RSS figures of step 3.
3. that turn ends; a second turn of ``--chunks`` (default 1,000,000) short chunks runs and is
   held open by a gate; RSS is read once every chunk is published and committed. The caps were
   already reached, so the growth over step 2 should be the open turn's compacted text (kept
   until the terminal compacts the turn) and little else.

Each step waits until the transcript has committed everything published (``durableEventId``),
so a backlog in the writer queue is not counted as resident state.

The project's packages are byte-compiled first (``compileall``, as ``make test`` and any
install do): the stack's modules the floor imports come from their bytecode, and a daemon run
from sources that were never compiled (``PYTHONDONTWRITEBYTECODE``) would compile its own at
every start and keep the compiler's leftovers in its heap (about 0.4 MB at idle).

Baselines: for *idle*, a Python process that imports only the third-party stack the daemon is
built on and does nothing (the floor no daemon on this stack goes below; target: idle <= that
+ 4 MB), with the same process importing the daemon's modules as a note; for *full caps*, the
idle RSS (target: <= idle + 14 MB); for the growth, the open turn's text size in UTF-8 bytes
(target: growth <= 1.3x that text).
"""

from __future__ import annotations

import argparse
import compileall
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.harness import MIB, Context, CpuMeter, CpuUse, Row
from benchmarks.launcher import Daemon, gate_name, start_daemon
from benchmarks.load_latency import WINDOW_TURN_CHUNKS, WINDOW_TURN_PAD, WINDOW_TURNS, session_info

NAME = "memory"
TITLE = "daemon RSS: idle, one session at full caps, and a 1,000,000-chunk open turn"

# Idle: at most this far above a Python process that imports only the third-party stack (measured
# in the same run); one session at full caps: at most this far above the idle daemon.
IDLE_ABOVE_STACK_MB = 4.0
FULL_ABOVE_IDLE_MB = 14.0
GROWTH_TEXT_FACTOR = 1.3
GROWTH_SLACK = 0.0
MB = 1e6
# Unpadded mock chunks are ~350 B events: this many fill the 8 MiB journal with room to spare.
FILL_CHUNKS = 30_000

# What the daemon imports: its own modules (and through them everything else), and the
# third-party stack it is built on alone (the modules it imports at idle; trio-websocket is not
# among them: the server side of WebSocket is Hypercorn's).
DAEMON_IMPORTS = "daemon.server, daemon.http_api, daemon.manager, daemon.streams, daemon.asgi"
# What the daemon's processes import from the project (byte-compiled before measuring).
PROJECT_PACKAGES = ("daemon", "sdk")
STACK_IMPORTS = "trio, msgspec, sqlite3, quart_trio, hypercorn.trio"
_PRINT_RSS = (
    "for line in open('/proc/self/status'):\n"
    "    if line.startswith('VmRSS:'): print(line.split()[1])\n"
)


def import_floor_kib(modules: str = DAEMON_IMPORTS) -> int:
    """RSS of a Python process that imports ``modules`` (by default the daemon's) and does
    nothing else."""
    out = subprocess.run([sys.executable, "-c", f"import {modules}\n{_PRINT_RSS}"], check=True,
                         capture_output=True, text=True, timeout=60)
    return int(out.stdout.strip())


def byte_compile() -> None:
    """Compile the project's packages to bytecode where it is missing or stale."""
    root = Path(__file__).resolve().parent.parent
    for package in PROJECT_PACKAGES:
        compileall.compile_dir(root / package, quiet=1)


def text_bytes(chunks: int) -> int:
    """UTF-8 size of the mock's ``chunk-0`` ... ``chunk-(n-1)`` texts joined."""
    return sum(len(f"chunk-{i}") for i in range(chunks))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--chunks", type=int, default=None,
                        help="chunks in the long open turn (default 1,000,000; quick 50,000)")


def _rss_mb(daemon: Daemon) -> float:
    return daemon.rss_kib() * 1024 / MB


# The daemon hands freed heap pages back once publishing pauses (``daemon.core.reclaim``: 50 ms
# of quiet): a figure read the moment the last event is committed can still hold them. RSS is
# read until it holds still (SETTLE_READS reads SETTLE_STEP_S apart within SETTLE_MB), at most
# SETTLE_MAX_S; the row reports that, and its notes the first read.
SETTLE_STEP_S = 0.05
SETTLE_READS = 4
SETTLE_MB = 0.1
SETTLE_MAX_S = 2.0


def settled_rss_mb(daemon: Daemon) -> tuple[float, float]:
    """(RSS read at once, RSS once it holds still) of the daemon, in MB."""
    reads = [_rss_mb(daemon)]
    deadline = time.monotonic() + SETTLE_MAX_S
    while time.monotonic() < deadline:
        last = reads[-SETTLE_READS:]
        if len(last) == SETTLE_READS and max(last) - min(last) <= SETTLE_MB:
            break
        time.sleep(SETTLE_STEP_S)
        reads.append(_rss_mb(daemon))
    return reads[0], reads[-1]


def rss_split(pid: int) -> str:
    """``VmRSS`` split into its anonymous part (heap, Python objects) and its file-backed part
    (the interpreter and the shared libraries' pages), from ``/proc/<pid>/status``."""
    fields: dict[str, float] = {}
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                key, _, rest = line.partition(":")
                if key in ("RssAnon", "RssFile", "RssShmem"):
                    fields[key] = int(rest.split()[0]) * 1024 / MB
    except OSError:
        return "split unavailable"
    return (f"anon {fields.get('RssAnon', 0.0):.1f} MB + file {fields.get('RssFile', 0.0):.1f} MB"
            + (f" + shmem {fields['RssShmem']:.1f} MB" if fields.get("RssShmem") else ""))


CHECK_WAIT_S = 30.0


def wait_checked(daemon: Daemon) -> None:
    """Wait until the daemon's start-up check of its transcript is over (``GET /daemon/status``,
    ``transcript.check.full``): the idle figure is the daemon's, not the check's."""
    deadline = time.monotonic() + CHECK_WAIT_S
    while daemon.get_json("/daemon/status")["transcript"]["check"]["full"] == "running":
        if time.monotonic() > deadline:
            raise RuntimeError(f"the transcript check still runs after {CHECK_WAIT_S:g} s")
        time.sleep(SETTLE_STEP_S)


@dataclass
class FullCaps:
    """One session brought to full caps, its turn held open by ``gate``."""

    session_id: str
    client_id: str
    gate: str
    info: dict[str, Any]
    cpu: CpuUse


def fill_to_caps(ctx: Context, daemon: Daemon) -> FullCaps:
    """A full replay window (completed turns), then an open turn past the journal's byte cap;
    returns once every event is published and committed."""
    session_id, client_id = daemon.create_session()
    meter = CpuMeter(daemon.pid, daemon.agent_pids())
    meter.start()
    for _ in range(WINDOW_TURNS):
        daemon.prompt(session_id, f"mock:chunks={WINDOW_TURN_CHUNKS} "
                                  f"mock:bytes={WINDOW_TURN_PAD} mock:delay_ms=0", client_id)
        daemon.wait_idle(session_id)
    ctx.progress(f"filling the live journal ({FILL_CHUNKS:,} chunks, turn held open)")
    gate = gate_name()
    accepted = daemon.prompt(session_id, f"mock:chunks={FILL_CHUNKS} mock:gate={gate}",
                             client_id)
    daemon.wait_ingested(session_id, int(accepted["lastEventId"]) + 1 + FILL_CHUNKS,
                         durable=True)
    cpu = meter.stop()
    return FullCaps(session_id, client_id, gate, session_info(daemon, session_id), cpu)


@dataclass
class LongTurn:
    chunks: int
    rss_open_mb: float
    rss_ended_mb: float
    split_open: str
    info: dict[str, Any]
    cpu: CpuUse


def long_turn(ctx: Context, daemon: Daemon, caps: FullCaps, chunks: int) -> LongTurn:
    """End the fill turn, then hold a ``chunks``-chunk turn open and read RSS."""
    daemon.open_gate(caps.gate)
    daemon.wait_idle(caps.session_id)
    ctx.progress(f"long turn: {chunks:,} chunks, held open")
    gate = gate_name()
    meter = CpuMeter(daemon.pid, daemon.agent_pids())
    meter.start()
    started = time.monotonic()
    accepted = daemon.prompt(caps.session_id, f"mock:chunks={chunks} mock:gate={gate}",
                             caps.client_id)
    last = int(accepted["lastEventId"]) + 1 + chunks

    def report(status: dict[str, Any]) -> None:
        ctx.progress(f"  published {status['lastEventId']:,}/{last:,}, durable "
                     f"{status['durableEventId']:,}, RSS {_rss_mb(daemon):.1f} MB")

    daemon.wait_ingested(caps.session_id, last, durable=True, report=report)
    cpu = meter.stop()
    elapsed = time.monotonic() - started
    info = session_info(daemon, caps.session_id)
    _, rss_open = settled_rss_mb(daemon)
    split_open = rss_split(daemon.pid)
    ctx.progress(f"RSS with the long turn open {rss_open:.1f} MB "
                 f"({chunks / elapsed:,.0f} chunks/s ingested and committed)")
    daemon.open_gate(gate)
    daemon.wait_idle(caps.session_id)
    return LongTurn(chunks, rss_open, settled_rss_mb(daemon)[1], split_open, info, cpu)


def run(ctx: Context, args: argparse.Namespace) -> list[Row]:
    chunks = args.chunks or ctx.pick(1_000_000, 50_000)
    trials = ctx.trials(3, 1)
    byte_compile()
    floor: list[float] = []
    stack: list[float] = []
    splits: dict[str, str] = {}
    idle: list[float] = []
    full: list[float] = []
    caps: list[FullCaps] = []
    long: LongTurn | None = None
    for trial in range(trials):
        ctx.progress(f"trial {trial + 1}/{trials}: import floor (python + the daemon's modules)")
        floor.append(import_floor_kib() * 1024 / MB)
        stack.append(import_floor_kib(STACK_IMPORTS) * 1024 / MB)
        ctx.progress(f"trial {trial + 1}/{trials}: starting daemon (default caps, transcript on)")
        with start_daemon() as daemon:
            wait_checked(daemon)
            for _ in range(5):
                daemon.get_json("/health")
            idle.append(settled_rss_mb(daemon)[1])
            splits["idle"] = rss_split(daemon.pid)
            ctx.progress(f"idle RSS {idle[-1]:.1f} MB; filling the replay window")
            caps.append(fill_to_caps(ctx, daemon))
            at_once, settled = settled_rss_mb(daemon)
            full.append(settled)
            splits["full"] = (f"{rss_split(daemon.pid)}; read as the fill was committed: "
                              f"{at_once:.1f} MB")
            info = caps[-1].info
            ctx.progress(f"full-caps RSS {full[-1]:.1f} MB (journal "
                         f"{info['journalBytes'] / MIB:.2f} MiB, window "
                         f"{info['replayWindowBytes'] / MIB:.2f} MiB)")
            # The long turn runs once, in the last trial, from that trial's full-caps state.
            if trial == trials - 1:
                long = long_turn(ctx, daemon, caps[-1], chunks)
    assert long is not None
    return rows_for(ctx, floor, idle, full, caps, long, splits, stack)


def rows_for(ctx: Context, floor: list[float], idle_mb: list[float], full_mb: list[float],
             caps: list[FullCaps], long: LongTurn, splits: dict[str, str] | None,
             stack_mb: list[float]) -> list[Row]:
    splits = splits or {}
    info = caps[-1].info
    fill_cpu = CpuUse()
    for each in caps:
        fill_cpu = fill_cpu + each.cpu
    fill_cpu = fill_cpu.scaled(1 / len(caps))
    last_full = full_mb[-1]
    text_mb = text_bytes(long.chunks) / MB
    caps_params = {"journal_MiB": round(info["journalBytes"] / MIB, 2),
                   "window_MiB": round(info["replayWindowBytes"] / MIB, 2)}
    stack_floor = statistics.median(stack_mb)
    daemon_floor = statistics.median(floor)
    idle_limit = stack_floor + IDLE_ABOVE_STACK_MB
    idle = Row(benchmark=NAME, name="daemon RSS idle", params={"sessions": 0}, unit="MB",
               samples=idle_mb, baseline=stack_floor, baseline_label="stack import floor",
               target=f"<= stack + {IDLE_ABOVE_STACK_MB:g} MB ({idle_limit:.1f} MB)",
               cpu_note="-", quick=ctx.quick,
               notes=["reference daemon: 212 MB idle",
                      f"a Python process importing the daemon's modules (and doing nothing): "
                      f"{daemon_floor:.1f} MB (this run)",
                      *([f"last trial: {splits['idle']}"] if "idle" in splits else [])])
    assert idle.value is not None
    full_limit = idle.value + FULL_ABOVE_IDLE_MB
    full = Row(benchmark=NAME, name="daemon RSS, one session at full caps", params=caps_params,
               unit="MB", samples=full_mb, baseline=idle.value, baseline_label="idle",
               target=f"<= idle + {FULL_ABOVE_IDLE_MB:g} MB ({full_limit:.1f} MB)",
               cpu=fill_cpu, cpu_note="to fill",
               quick=ctx.quick, notes=["reference daemon: 237 MB with a full journal",
                                       *([f"last trial: {splits['full']}"]
                                         if "full" in splits else [])])
    for row, limit in ((idle, idle_limit), (full, full_limit)):
        assert row.value is not None and row.baseline
        row.ratio = row.value / row.baseline
        row.ok = row.value <= limit
    growth_mb = long.rss_open_mb - last_full
    allowed = GROWTH_TEXT_FACTOR * text_mb + GROWTH_SLACK * last_full
    growth = Row(
        benchmark=NAME, name=f"RSS growth over an open {long.chunks:,}-chunk turn (caps reached)",
        params={"chunks": long.chunks, "text_MB": round(text_mb, 2),
                "journal_MiB": round(long.info["journalBytes"] / MIB, 2)},
        unit="MB", samples=[growth_mb], baseline=text_mb, baseline_label="open turn's text",
        ratio=growth_mb / text_mb if text_mb else None, ratio_label="of text",
        target=f"<= {GROWTH_TEXT_FACTOR:g}x text ({allowed:.1f} MB)", ok=growth_mb <= allowed,
        cpu=long.cpu, cpu_note="whole turn", quick=ctx.quick,
        notes=[f"RSS {last_full:.1f} MB at full caps -> {long.rss_open_mb:.1f} MB with the turn "
               f"open (text {text_mb:.2f} MB) -> {long.rss_ended_mb:.1f} MB after its terminal "
               f"(one run, in the last trial's daemon); with the turn open: {long.split_open}"])
    ended = Row(benchmark=NAME, name=f"daemon RSS after the {long.chunks:,}-chunk turn ended",
                params=caps_params, unit="MB", samples=[long.rss_ended_mb], baseline=last_full,
                baseline_label="full caps", ratio=long.rss_ended_mb / last_full, cpu_note="-",
                quick=ctx.quick)
    rows = [idle, full, growth, ended]
    rows.insert(1, Row(
        benchmark=NAME, name="import floor of the third-party stack alone",
        params={"imports": STACK_IMPORTS}, unit="MB", samples=stack_mb,
        baseline=idle.value, baseline_label="daemon idle",
        ratio=stack_floor / idle.value if idle.value else None, ratio_label="of idle",
        cpu_note="-", quick=ctx.quick,
        notes=[f"python importing only the stack the daemon is built on reaches "
               f"{stack_floor:.1f} MB; importing the daemon's modules too, {daemon_floor:.1f} MB; "
               f"the idle daemon holds {idle.value - stack_floor:.1f} MB above the stack "
               f"(target {IDLE_ABOVE_STACK_MB:g} MB; informational, measured in this run)"]))
    return rows
