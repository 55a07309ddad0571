"""Benchmark 8: the crash-loss window, SIGKILL while a full-speed turn streams.

Each kill starts a fresh daemon (default settings), subscribes one raw-socket SSE reader (it
only scans for ``id:`` lines, so it keeps up with the agent and is never the bottleneck),
starts a turn of mock chunks at full agent speed, waits a random time (seeded, so a run is
reproducible) and SIGKILLs the daemon. The dead daemon's SQLite file is then read directly: the
highest event id that survived is compared with what the reader had received.

- **events lost**: events the subscriber had received beyond the last surviving one;
- **ms lost**: how long before the kill the subscriber had received the first event that did
  not survive (0 when nothing it saw was lost): the window of output a crash takes back.

Baselines, measured in the same run: for the events row, the events the stream delivers in
100 ms at the rate measured over the same kills (so the ratio reads as "fraction of a 100 ms
window"); the ms rows compare with the 100 ms target itself.
"""

from __future__ import annotations

import argparse
import random
import re
import signal
import socket
import threading
import time
from dataclasses import dataclass, field

from benchmarks.harness import Context, CpuUse, Row, percentile
from benchmarks.launcher import Daemon, start_daemon
from daemon.server import TRANSCRIPT_FILE
from daemon.transcript_store import TranscriptDatabase

NAME = "crash_loss"
TITLE = "crash-loss window: output a subscriber had that a SIGKILL takes back"

TARGET_MS = 100.0
ID_RE = re.compile(rb"(?:^|\n)id: ?(\d+)\n")


@dataclass
class RawReader:
    """A minimal SSE reader on a plain socket: remembers when each new highest id arrived."""

    host: str
    port: int
    path: str
    arrivals: list[tuple[float, int]] = field(default_factory=list)  # (monotonic s, max id)
    started: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        if not self.started.wait(30):
            raise RuntimeError("SSE reader did not connect")

    def _run(self) -> None:
        sock = socket.create_connection((self.host, self.port))
        sock.sendall(f"GET {self.path} HTTP/1.1\r\nHost: 127.0.0.1\r\nLast-Event-ID: 0\r\n"
                     "Accept: text/event-stream\r\n\r\n".encode())
        self.started.set()
        tail = b""
        best = 0
        try:
            while True:
                data = sock.recv(1 << 20)
                if not data:
                    return
                now = time.monotonic()
                buf = tail + data
                ids = ID_RE.findall(buf)
                if ids:
                    top = int(ids[-1])
                    if top > best:
                        best = top
                        self.arrivals.append((now, top))
                tail = buf[-64:]
        except OSError:
            return
        finally:
            sock.close()

    def join(self) -> None:
        if self.thread is not None:
            self.thread.join(30)

    def received_at(self, event_id: int) -> float | None:
        """When the reader first had ``event_id`` (or a later one)."""
        for at, top in self.arrivals:
            if top >= event_id:
                return at
        return None


@dataclass
class Kill:
    received: int  # highest id the subscriber had at the kill
    survived: int  # highest id in the dead daemon's database
    lost_events: int
    lost_ms: float
    rate: float  # events/s the subscriber received over the turn


def one_kill(rng: random.Random, chunks: int, min_s: float, max_s: float) -> Kill:
    daemon: Daemon
    with start_daemon() as daemon:
        session_id, client_id = daemon.create_session()
        host, port = daemon.host_port
        reader = RawReader(host, port, f"/session/{session_id}/events?maxQueued=2048")
        reader.start()
        daemon.prompt(session_id, f"mock:chunks={chunks} mock:delay_ms=0", client_id)
        deadline = time.monotonic() + 30
        while not reader.arrivals or reader.arrivals[-1][1] < 50:
            if time.monotonic() > deadline:
                raise RuntimeError("the turn did not start streaming")
            time.sleep(0.001)  # polling the reader thread's progress, not a synchronisation
        first_at, first_id = reader.arrivals[-1]
        time.sleep(rng.uniform(min_s, max_s))  # the random kill moment
        daemon.proc.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        daemon.proc.wait()
        reader.join()
        store = TranscriptDatabase(daemon.base / "data" / TRANSCRIPT_FILE)
        try:
            survived = store.max_raw_event_id(session_id)
        finally:
            store.close()
    before_kill = [(at, top) for at, top in reader.arrivals if at <= killed_at]
    received = before_kill[-1][1] if before_kill else 0
    lost = max(0, received - survived)
    lost_ms = 0.0
    if lost:
        at = reader.received_at(survived + 1)
        lost_ms = (killed_at - at) * 1000 if at is not None else 0.0
    span = (before_kill[-1][0] - first_at) if before_kill else 0.0
    rate = (received - first_id) / span if span > 0 else 0.0
    return Kill(received, survived, lost, lost_ms, rate)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kills", type=int, default=None,
                        help="daemons killed (default 30; quick 2)")
    parser.add_argument("--chunks", type=int, default=2_000_000,
                        help="chunks of the turn (it must outlast the kill)")
    parser.add_argument("--seed", type=int, default=11)


def run(ctx: Context, args: argparse.Namespace) -> list[Row]:
    kills = args.kills or ctx.trials(30, 2)
    rng = random.Random(args.seed)
    results: list[Kill] = []
    for i in range(kills):
        kill = one_kill(rng, args.chunks, 0.2, 1.5)
        results.append(kill)
        ctx.progress(f"kill {i + 1}/{kills}: received {kill.received:,}, survived "
                     f"{kill.survived:,}: lost {kill.lost_events:,} events / "
                     f"{kill.lost_ms:.1f} ms at {kill.rate:,.0f} events/s")
    params = {"kills": kills, "seed": args.seed}
    rate = sorted(k.rate for k in results)[len(results) // 2]
    per_window = rate * TARGET_MS / 1000
    ms = [k.lost_ms for k in results]
    events = [float(k.lost_events) for k in results]
    rows = []
    for q in (50, 99):
        row = Row(benchmark=NAME, name=f"ms of output lost at SIGKILL, p{q}", params=params,
                  unit="ms", samples=ms, value=percentile(ms, q), baseline=TARGET_MS,
                  baseline_label="target window", cpu=CpuUse(), cpu_note="not measured",
                  quick=ctx.quick)
        row.ratio = (row.value or 0.0) / TARGET_MS
        if q == 99:
            row.target = f"p99 <= {TARGET_MS:.0f} ms"
            row.ok = (row.value or 0.0) <= TARGET_MS
            row.notes.append(f"at {rate:,.0f} events/s (median over the kills); ms lost per "
                             f"kill: {', '.join(f'{m:.0f}' for m in ms)}")
        rows.append(row)
    for q in (50, 99):
        row = Row(benchmark=NAME, name=f"events lost at SIGKILL, p{q}", params=params,
                  unit="events", samples=events, value=percentile(events, q),
                  baseline=per_window, baseline_label="events in 100 ms", cpu=CpuUse(),
                  cpu_note="not measured", quick=ctx.quick)
        row.ratio = (row.value or 0.0) / per_window if per_window else None
        rows.append(row)
    behind = sum(1 for k in results if k.survived > k.received)
    if behind:
        rows[0].notes.append(f"{behind} kill(s) found more durable than the reader had got")
    return rows
