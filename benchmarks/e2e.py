"""Benchmark 3: end-to-end turn throughput, agent stdout to SSE subscribers.

The mock agent emits one turn of ``--chunks`` ``agent_message_chunk`` updates as fast as it can
(pre-built lines, written in 1 MiB batches); the daemon publishes them (ring, both live journals,
compactor, transcript) and streams them to 1, 8 and 64 subscribers held by the load generator
(one separate process, ``maxQueued=2048``; an evicted subscriber resumes from its last id, and
the row notes the eviction). Every subscriber's ids are checked against what the bus published
(contiguous, first to last, the terminal last); a turn not delivered whole makes the benchmark an
ERROR row instead of a figure. A trial runs from the prompt request to the moment
the last subscriber has read the turn's terminal, so it includes the transcript commit the
daemon waits for before publishing the terminal.

Baseline: the same mock agent's raw emission rate, measured in the same run with a pipe reader
that only counts lines (no daemon).

Ceiling rows (informational; ``--no-ceiling`` skips them): after each daemon turn, the same
turn's frames written by bare Hypercorn on Trio (``benchmarks.ceiling``: no daemon, every frame
pre-built, one send per the daemon's wake-up size) to the same load generator with as many
subscribers, checked the same way: what Hypercorn's own write path delivers to this client on
this machine, and what the fan-out targets need beside it. The daemon writes a stream's frames
past Hypercorn's write path, straight to the socket (``daemon.direct_body``), so it can beat
these rows: they are reference servers, not bounds.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from benchmarks.harness import Context, CpuMeter, CpuUse, Row, own_cpu_seconds, process_cpu_seconds
from benchmarks.launcher import Daemon, start_daemon
from benchmarks.loadgen import ANNOUNCED, LoadGen, LoadGenError, check_delivery

if TYPE_CHECKING:  # the ceiling servers run in their own processes
    from benchmarks.ceiling import ServerKind

NAME = "e2e"
TITLE = "end-to-end turn throughput (agent -> daemon -> SSE subscribers)"

# Targets are same-run ratios: absolute rates move with the machine and its load.
SINGLE_OF_AGENT_TARGET = 0.15  # 1-subscriber rate over the agent's raw emission rate
CPU_OF_AGENT_TARGET = 10.0  # daemon CPU per 1,000 events over the agent's, transcript on
FANOUT_8_TARGET = 6.0  # delivered rate with 8 subscribers over the 1-subscriber rate
FANOUT_64_TARGET = 16.0  # the same with 64 subscribers
# The reference daemon (qwen serve 0.24.4, same mock agent and caps, measured from outside on
# the same kind of 2-core machine; the side-by-side harness lives outside this repository).
REFERENCE = {
    1: "reference daemon: 47,600 events/s to 1 subscriber",
    8: "reference daemon: 163,000 events/s delivered to 8 subscribers",
    "cpu": "reference daemon: 22.6 ms of CPU per 1,000 events",
}


@dataclass
class TurnRun:
    """One measured turn."""

    subscribers: int
    published: int  # events the bus published for the turn (echo + chunks + terminal)
    delivered: int  # events (frames with an id) received, summed over the subscribers
    seconds: float
    evicted: int
    cpu: CpuUse

    @property
    def rate(self) -> float:
        return self.delivered / self.seconds

    @property
    def daemon_ms_per_1k(self) -> float | None:
        if self.cpu.daemon_ms is None:
            return None
        return self.cpu.daemon_ms / (self.published / 1000)


def measure_turn(daemon: Daemon, chunks: int, subscribers: int, max_queued: int = 2048,
                 timeout: float = 600.0, *, transport: str = "sse",
                 reconnect: bool = True) -> TurnRun:
    """Run one turn of ``chunks`` chunks to ``subscribers`` SSE readers (``transport="ws"``:
    WebSocket readers) and time it.

    Every subscriber must have received every event published for the turn, ids contiguous,
    the terminal last (:func:`benchmarks.loadgen.check_delivery`), or this raises: a figure
    for a turn that was not delivered whole is no figure. An evicted subscriber resumes from
    its last id (it is counted in ``evicted``), so eviction costs time, never events, unless it
    comes back after its next event has left the ring: the daemon then announces the gap and
    this raises :class:`EvictedPastRing`. Without ``reconnect`` an evicted subscriber misses
    the rest of the turn, and this raises.
    """
    session_id, client_id = daemon.create_session()
    host, port = daemon.host_port
    # Nothing is published before the prompt, so the head id is read before the readers
    # connect, outside the timed stretch.
    before = int(daemon.status(session_id)["lastEventId"])
    meter = CpuMeter(daemon.pid, daemon.agent_pids())
    loadgen = LoadGen(host, port, session_id, subscribers=subscribers, max_queued=max_queued,
                      until="turn_complete", timeout=timeout, reconnect=reconnect,
                      transport=transport)

    def start() -> None:
        daemon.prompt(session_id, f"mock:chunks={chunks} mock:delay_ms=0", client_id)

    subs, t0, cpu = _measured_turn(loadgen, meter, start)
    published = int(daemon.status(session_id)["lastEventId"])
    past_ring = evicted_past_ring(subs)
    if past_ring is not None:
        daemon.http.delete(f"/session/{session_id}")
        raise EvictedPastRing(past_ring)
    check_delivery(subs, before + 1, published)
    daemon.http.delete(f"/session/{session_id}")
    t_end = max(float(sub["t_done"]) for sub in subs)
    evicted = sum(1 for sub in subs if sub["evicted"])
    delivered = sum(int(sub["ids"]) for sub in subs)
    return TurnRun(subscribers, published - before, delivered, t_end - t0, evicted, cpu)


def evicted_past_ring(subs: Sequence[Mapping[str, Any]]) -> str | None:
    """Why a turn gave no figure when its only delivery faults are gaps the daemon announced
    (each subscriber with a gap has one ``state_resync_required`` announced), else ``None``."""
    gaps = [str(sub["id_error"]) for sub in subs if sub.get("id_error")]
    if not gaps or not all(ANNOUNCED in gap for gap in gaps):
        return None
    return (f"{len(gaps)} of {len(subs)} subscriber(s) were evicted and came back after the "
            f"ring had moved on, the daemon announcing each gap; the first: {gaps[0]}")


class EvictedPastRing(LoadGenError):
    """A turn whose only delivery faults are gaps the daemon announced: subscribers the load
    generator could not keep up with were evicted (as a slow client must be) and resumed after
    their next event had left the ring. No figure comes of such a turn; the benchmark runs it
    again (:data:`TURN_ATTEMPTS`) and says so in the row."""


#: Attempts at one measured turn when its subscribers are evicted past the ring.
TURN_ATTEMPTS = 3


def measure_turn_again(ctx: Context, daemon: Daemon, chunks: int, subscribers: int,
                       max_queued: int, repeats: dict[int, list[str]]) -> TurnRun:
    """:func:`measure_turn`, run again (up to :data:`TURN_ATTEMPTS` in all) when subscribers
    were evicted past the ring; each repeat's reason is added to ``repeats[subscribers]``.
    Any other delivery fault, or the last attempt's, raises."""
    for _ in range(TURN_ATTEMPTS - 1):
        try:
            return measure_turn(daemon, chunks, subscribers, max_queued)
        except EvictedPastRing as exc:
            repeats.setdefault(subscribers, []).append(str(exc))
            ctx.progress(f"  turn repeated: {exc}")
    return measure_turn(daemon, chunks, subscribers, max_queued)


def _measured_turn(loadgen: LoadGen, meter: CpuMeter,
                   start: Callable[[], None]) -> tuple[list[dict[str, Any]], float, CpuUse]:
    """Wait for the readers, then meter one turn that ``start`` sets off: its subscribers'
    results, the monotonic time it was started at (just before ``start`` sends its request)
    and the CPU used (server, agents and the load generator). The load generator is closed
    whatever happens."""
    try:
        loadgen.wait_ready()
        meter.start()
        t0 = time.monotonic()
        start()
        result = loadgen.result()
        meter.add_client(float(result["cpu_s"]))
        cpu = meter.stop()
    finally:
        loadgen.close()
    subs: list[dict[str, Any]] = result["rounds"][0]
    return subs, t0, cpu


@dataclass
class RawRun:
    seconds: float
    lines: int
    cpu: CpuUse

    @property
    def rate(self) -> float:
        return self.lines / self.seconds


def agent_raw_emission(chunks: int) -> RawRun:
    """The mock agent alone: ``chunks`` lines to a pipe reader that only counts newlines."""
    env = dict(os.environ, MOCK_ACP_PROMPT_DELAY_MS="0")
    env.pop("MOCK_ACP_GATE_DIR", None)
    proc = subprocess.Popen([sys.executable, "-m", "daemon.mock_agent"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, env=env)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        def request(rid: int, method: str, params: str) -> None:
            assert proc.stdin is not None
            proc.stdin.write(
                f'{{"jsonrpc":"2.0","id":{rid},"method":"{method}","params":{params}}}\n'
                .encode())
            proc.stdin.flush()

        request(1, "initialize", '{"protocolVersion":1}')
        proc.stdout.readline()
        request(2, "session/new", json.dumps({"cwd": os.getcwd(), "mcpServers": []}))
        reply = proc.stdout.readline()
        session = reply.split(b'"sessionId":"', 1)[1].split(b'"', 1)[0].decode()
        fd = proc.stdout.fileno()
        agent0 = process_cpu_seconds(proc.pid)
        self0 = own_cpu_seconds()
        t0 = time.monotonic()
        text = f"mock:chunks={chunks} mock:delay_ms=0"
        request(3, "session/prompt",
                f'{{"sessionId":"{session}","prompt":[{{"type":"text","text":"{text}"}}]}}')
        expected = chunks + 1  # every chunk, then the prompt's result
        lines = 0
        while lines < expected:
            data = os.read(fd, 1 << 20)
            if not data:
                raise RuntimeError(f"mock agent exited after {lines} of {expected} lines")
            lines += data.count(b"\n")
        seconds = time.monotonic() - t0
        agent1 = process_cpu_seconds(proc.pid)
        cpu = CpuUse(
            None,
            None if agent0 is None or agent1 is None else (agent1 - agent0) * 1000,
            (own_cpu_seconds() - self0) * 1000,
        )
    finally:
        proc.stdin.close()
        proc.wait(10)
        proc.stdout.close()
    return RawRun(seconds, chunks, cpu)


LISTEN_PREFIX = b"listening on http://"
# The ceiling servers' rows: (row name's start, what a note calls the server).
CEILING_SERVER = ("bare Hypercorn ceiling", "bare Hypercorn")
FLOOR_SERVER = ("Trio socket floor (no HTTP server)", "a bare Trio socket")
FLOOR_COUNTS = (1, 8)  # the floor is measured where the fan-out model takes its d


def ceiling_turn(chunks: int, subscribers: int, max_queued: int = 2048,
                 timeout: float = 600.0, server_kind: ServerKind = "hypercorn") -> TurnRun:
    """The same turn's frames written by bare Hypercorn (``benchmarks.ceiling``) to the same
    load generator: what Hypercorn's own write path delivers on this machine. Checked like a
    daemon turn (ids 1..chunks+1, the terminal last). ``server_kind="trio"``: the same frames
    written through Trio's socket stream with no HTTP server."""
    server = subprocess.Popen([sys.executable, "-m", "benchmarks.ceiling", "--chunks",
                               str(chunks), "--max-queued", str(max_queued),
                               "--server", server_kind],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        if not line.startswith(LISTEN_PREFIX):
            server.kill()
            err = server.stderr.read().decode(errors="replace") if server.stderr else ""
            raise RuntimeError(f"ceiling server did not start: {line!r} {err[-2000:]}")
        host, port = line[len(LISTEN_PREFIX):].strip().decode().rsplit(":", 1)
        meter = CpuMeter(server.pid)
        loadgen = LoadGen(host, int(port), "ceiling", subscribers=subscribers,
                          max_queued=max_queued, until="turn_complete", timeout=timeout)

        def start() -> None:
            with socket.create_connection((host, int(port))) as conn:
                conn.sendall(b"POST /start HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
                conn.recv(4096)

        subs, t0, cpu = _measured_turn(loadgen, meter, start)
        check_delivery(subs, 1, chunks + 1)
        t_end = max(float(sub["t_done"]) for sub in subs)
        delivered = sum(int(sub["ids"]) for sub in subs)
        return TurnRun(subscribers, chunks + 1, delivered, t_end - t0, 0, cpu)
    finally:
        if server.poll() is None:
            server.kill()
        server.wait(10)
        for stream in (server.stdout, server.stderr):
            if stream is not None:
                stream.close()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--chunks", type=int, default=None,
                        help="chunks in the measured turn (default 100,000; quick 5,000)")
    parser.add_argument("--subscribers", default="1,8,64",
                        help="comma-separated subscriber counts (default 1,8,64)")
    parser.add_argument("--max-queued", type=int, default=2048)
    parser.add_argument("--no-persistence", action="store_true",
                        help="run the daemon without the SQLite transcript")
    parser.add_argument("--no-ceiling", action="store_true",
                        help="skip the bare-Hypercorn ceiling rows")


def _mean_cpu(cpus: Sequence[CpuUse]) -> CpuUse:
    total = CpuUse()
    for cpu in cpus:
        total = total + cpu
    return total.scaled(1 / max(1, len(cpus)))


def run(ctx: Context, args: argparse.Namespace) -> list[Row]:
    chunks = args.chunks or ctx.pick(100_000, 5_000)
    counts = sorted({int(part) for part in str(args.subscribers).split(",") if part.strip()})
    trials = ctx.trials(3, 1)
    persistence = not args.no_persistence
    runs: dict[int, list[TurnRun]] = {n: [] for n in counts}
    ceilings: dict[int, list[TurnRun]] = {n: [] for n in counts}
    floors: dict[int, list[TurnRun]] = {n: [] for n in counts if n in FLOOR_COUNTS}
    raw: list[RawRun] = []
    repeats: dict[int, list[str]] = {}
    # Subscriber counts whose turn gave no figure in TURN_ATTEMPTS attempts: no more turns of
    # theirs are run, so the other counts and the rows computed from them still get figures.
    failed: dict[int, GaveUp] = {}
    ctx.progress(f"starting daemon (transcript {'on' if persistence else 'off'})")
    with start_daemon(persistence=persistence) as daemon:
        # Warm-up: start the agent and touch every code path once, unmeasured.
        measure_turn(daemon, min(chunks, 2000), 1, args.max_queued)
        for trial in range(trials):
            ctx.progress(f"trial {trial + 1}/{trials}: agent raw emission, {chunks:,} lines")
            raw.append(agent_raw_emission(chunks))
            for n in counts:
                if n in failed:
                    continue
                ctx.progress(f"trial {trial + 1}/{trials}: {n} subscriber(s), {chunks:,} chunks")
                try:
                    turn = measure_turn_again(ctx, daemon, chunks, n, args.max_queued, repeats)
                except EvictedPastRing as exc:
                    failed[n] = GaveUp(str(exc), trial, runs.pop(n))
                    ceilings.pop(n, None)
                    floors.pop(n, None)
                    ctx.progress(f"  no figure for {n} subscriber(s), no more of their turns: "
                                 f"{exc}")
                    continue
                runs[n].append(turn)
                ctx.progress(f"  {turn.rate:,.0f} events/s delivered in {turn.seconds:.2f}s, "
                             f"evicted {turn.evicted}")
                if not args.no_ceiling:
                    ctx.progress(f"trial {trial + 1}/{trials}: bare Hypercorn ceiling, "
                                 f"{n} subscriber(s)")
                    ceiling = ceiling_turn(chunks, n, args.max_queued)
                    ceilings[n].append(ceiling)
                    ctx.progress(f"  {ceiling.rate:,.0f} events/s delivered in "
                                 f"{ceiling.seconds:.2f}s")
                if not args.no_ceiling and n in floors:
                    ctx.progress(f"trial {trial + 1}/{trials}: Trio socket floor (no HTTP "
                                 f"server), {n} subscriber(s)")
                    floor = ceiling_turn(chunks, n, args.max_queued, server_kind="trio")
                    floors[n].append(floor)
                    ctx.progress(f"  {floor.rate:,.0f} events/s delivered in "
                                 f"{floor.seconds:.2f}s")
    rows = rows_for(ctx, chunks, args.max_queued, persistence, raw, runs)
    rows += gave_up_rows(ctx, chunks, args.max_queued, persistence, failed)
    note_repeats(rows, repeats)
    if not args.no_ceiling:
        rows += ceiling_rows(ctx, chunks, runs, ceilings)
        rows += ceiling_rows(ctx, chunks, runs, floors, server=FLOOR_SERVER)
        budget = targets_budget_row(ctx, chunks, raw, ceilings)
        if budget is not None:
            rows.append(budget)
        cores = cpu_budget_row(ctx, chunks, raw, runs, ceilings)
        if cores is not None:
            rows.append(cores)
    model = fanout_model_row(ctx, chunks, runs, ceilings, floors)
    if model is not None:
        rows.append(model)
    return rows


@dataclass
class GaveUp:
    """A subscriber count whose turn was evicted past the ring in every attempt of one trial."""

    reason: str
    trial: int  # the trial it happened in (0-based)
    earlier: list[TurnRun]  # the turns of earlier trials, delivered whole


def gave_up_rows(ctx: Context, chunks: int, max_queued: int, persistence: bool,
                 failed: dict[int, GaveUp]) -> list[Row]:
    """An ERROR throughput row per subscriber count that gave no figure: the reason, and the
    rates of earlier trials for information only (a figure from the trials that happened to be
    delivered whole would flatter the daemon)."""
    rows: list[Row] = []
    for n, gave_up in sorted(failed.items()):
        row = Row(benchmark=NAME, name=throughput_row_name(n),
                  params={"chunks": chunks, "subscribers": n, "maxQueued": max_queued,
                          "transcript": "on" if persistence else "off"},
                  unit="events/s", samples=[], quick=ctx.quick,
                  error=f"{EvictedPastRing.__name__}: {TURN_ATTEMPTS} attempts in trial "
                        f"{gave_up.trial + 1}: {gave_up.reason}")
        if gave_up.earlier:
            rates = ", ".join(f"{turn.rate:,.0f}" for turn in gave_up.earlier)
            row.notes.append(f"earlier trial(s) delivered whole: {rates} events/s (no figure "
                             "is made of them)")
        rows.append(row)
    return rows


def throughput_row_name(subscribers: int) -> str:
    return f"throughput, {subscribers} subscriber{'s' if subscribers > 1 else ''}"


def note_repeats(rows: list[Row], repeats: dict[int, list[str]]) -> None:
    """Say in each throughput row how many of its turns were run again, and why: a repeat is
    part of the figure's story (the load generator fell behind), never hidden."""
    for n, reasons in repeats.items():
        for row in rows:
            if row.name == throughput_row_name(n):
                row.notes.append(f"{len(reasons)} turn(s) run again: {reasons[0]}")


def _per_event_s(ms: float | None, events: int) -> float | None:
    return None if ms is None or not events else ms / 1000 / events


def cpu_budget_row(ctx: Context, chunks: int, raw: list[RawRun], runs: dict[int, list[TurnRun]],
                   ceilings: dict[int, list[TurnRun]],
                   cores: int | None = None) -> Row | None:
    """Informational: the CPU the three 1- and 8-subscriber targets need together on this
    machine, where the agent, the daemon and the load generator share the cores.

    At the targets' least demanding point the daemon delivers ``D8 = FANOUT_8_TARGET *
    SINGLE_OF_AGENT_TARGET * agent raw`` events/s to 8 subscribers, so it takes in ``D8 / 8``
    agent events a second. Each taken-in event costs the agent its CPU per event (measured in the
    1-subscriber turns) and the daemon at most ``CPU_OF_AGENT_TARGET`` times that, less what its
    one delivery costs (bare Hypercorn's server CPU per delivered event at 1 subscriber); each
    delivery costs at least what bare Hypercorn and the same client spend per delivered event at
    8 subscribers (server plus client CPU, same frames, same wake-up size). The value is the
    cores that adds up to, the baseline the cores this process may use; above 1x the targets
    cannot all pass here. The note gives the daemon CPU ratio at which they would just fit."""
    if not raw or not runs.get(1) or not ceilings.get(1) or not ceilings.get(8):
        return None
    agent = [_per_event_s(t.cpu.agent_ms, t.published) for t in runs[1]]
    bare1 = [_per_event_s(t.cpu.daemon_ms, t.delivered) for t in ceilings[1]]
    bare8 = [_per_event_s(None if t.cpu.daemon_ms is None or t.cpu.clients_ms is None
                          else t.cpu.daemon_ms + t.cpu.clients_ms, t.delivered)
             for t in ceilings[8]]
    cores = cores or len(os.sched_getaffinity(0))
    name = "CPU the 1- and 8-subscriber targets need together"
    params: dict[str, Any] = {"chunks": chunks, "subscribers": "1,8"}
    if None in agent or None in bare1 or None in bare8 or not all(agent):
        # A turn too short for the agent's CPU to register, or a process whose clock was gone.
        return Row(benchmark=NAME, name=name, params=params, unit="cores", samples=[],
                   baseline=float(cores), baseline_label="cores here", quick=ctx.quick,
                   cpu_note="computed from other rows: no CPU of its own",
                   notes=["agent CPU too small to measure in this run: nothing to add up"])
    a = statistics.median(x for x in agent if x is not None)
    d1 = statistics.median(x for x in bare1 if x is not None)
    d8 = statistics.median(x for x in bare8 if x is not None)
    raw_rate = statistics.median(r.rate for r in raw)
    delivered8 = FANOUT_8_TARGET * SINGLE_OF_AGENT_TARGET * raw_rate
    taken_in = delivered8 / 8
    ingest = max(CPU_OF_AGENT_TARGET * a - d1, 0.0)
    need = taken_in * (ingest + a) + delivered8 * d8
    row = Row(benchmark=NAME, name=name, params=params, unit="cores", samples=[need],
              value=need, baseline=float(cores), baseline_label="cores here",
              ratio=need / cores, ratio_label="of the cores", quick=ctx.quick,
              cpu_note="computed from other rows: no CPU of its own")
    spare = cores - delivered8 * d8
    fits_at = ((spare / taken_in - a) + d1) / a if spare > 0 else None
    row.notes.append(
        f"{delivered8:,.0f} events/s to 8 subscribers ({taken_in:,.0f}/s taken in): agent "
        f"{a * 1e6:.2f} us/event, daemon at the {CPU_OF_AGENT_TARGET:g}x CPU target "
        f"{CPU_OF_AGENT_TARGET * a * 1e6:.2f} us/event less {d1 * 1e6:.2f} for one delivery, "
        f"{d8 * 1e6:.2f} us per delivery (bare Hypercorn + client at 8): {need:.2f} cores of "
        f"{cores}; " + (f"they fit if the daemon's CPU per event is <= {fits_at:.1f}x the "
                         f"agent's" if fits_at is not None and fits_at > 0 else
                         "delivery alone fills the cores")
        + " (informational, computed from this run)")
    return row


def _marginal_delivery_s(turns1: Sequence[TurnRun], turns8: Sequence[TurnRun]
                         ) -> tuple[float, float] | None:
    """``(c1, d)`` from server CPU per taken-in event at 1 and at 8 subscribers (medians):
    ``c1`` at 1 subscriber, ``d`` what each of the 7 more deliveries added to it."""
    c1 = [_per_event_s(t.cpu.daemon_ms, t.published) for t in turns1]
    c8 = [_per_event_s(t.cpu.daemon_ms, t.published) for t in turns8]
    if not c1 or not c8 or None in c1 or None in c8:
        return None
    one = statistics.median(x for x in c1 if x is not None)
    eight = statistics.median(x for x in c8 if x is not None)
    return one, (eight - one) / 7


def fanout_model_row(ctx: Context, chunks: int, runs: dict[int, list[TurnRun]],
                     ceilings: dict[int, list[TurnRun]],
                     floors: dict[int, list[TurnRun]] | None = None) -> Row | None:
    """Informational: the fan-out the daemon's own measured costs allow, and why the fan-out
    targets ask for a delivery cheaper than bare Hypercorn's.

    With the daemon the bottleneck, an agent event taken in costs it ``I`` (ingest: parse,
    ring, journals, transcript) plus ``d`` per subscriber it is delivered to, so with ``n``
    subscribers it delivers ``n / (I + n d)`` events a second and the fan-out ratio is
    ``n (I + d) / (I + n d)``. ``d`` is the daemon CPU per taken-in event at 8 subscribers less
    that at 1, over 7; ``I`` the CPU at 1 less ``d``. A ratio of at least ``F`` at ``n``
    subscribers needs ``I / d >= n (F - 1) / (n - F)``: 20 for 6x at 8 and for 16x at 64 alike.
    The value is the ratio at 8 the model gives (it matches the measured one when the daemon,
    not the machine, is the limit); the note sets the ``d`` the targets need beside bare
    Hypercorn's own ``d`` (its server CPU measured the same way, same frames and client) and,
    when ``floors`` has them, beside the ``d`` of the same frames written with no HTTP server
    (Trio's socket stream alone). The daemon's own writes skip both layers (one ``writev`` per
    write), so its ``d`` can be below both; what is left of it is mostly the kernel's send."""
    ours = _marginal_delivery_s(runs.get(1, []), runs.get(8, []))
    if ours is None:
        return None
    c1, d = ours
    ingest = c1 - d
    name = "fan-out the daemon's measured costs allow, 8 subscribers"
    params: dict[str, Any] = {"chunks": chunks, "subscribers": "1,8"}
    row = Row(benchmark=NAME, name=name, params=params, unit="x", samples=[],
              baseline=FANOUT_8_TARGET, baseline_label="the 8-subscriber target",
              quick=ctx.quick, cpu_note="computed from other rows: no CPU of its own")
    if d <= 0 or ingest <= 0:
        row.notes.append(f"CPU per event {c1 * 1e6:.2f} us at 1 subscriber, delivery adds "
                         f"{d * 1e6:.3f} us: too small to model in this run")
        return row
    ratio8 = 8 * c1 / (ingest + 8 * d)
    row.samples, row.value = [ratio8], ratio8
    row.ratio, row.ratio_label = ratio8 / FANOUT_8_TARGET, "of the target"
    need = {n: n * (f - 1) / (n - f) for n, f in ((8, FANOUT_8_TARGET), (64, FANOUT_64_TARGET))}
    bare = _marginal_delivery_s(ceilings.get(1, []), ceilings.get(8, []))
    bare_note = ("" if bare is None or bare[1] <= 0 else
                 f"; bare Hypercorn's own delivery costs {bare[1] * 1e6:.2f} us, so the "
                 f"targets need {ingest / need[8] / bare[1]:.2f}x of it")
    floors = floors or {}
    floor = _marginal_delivery_s(floors.get(1, []), floors.get(8, []))
    if floor is not None and floor[1] > 0:
        bare_note += (f"; with no HTTP server (a Trio socket) it costs {floor[1] * 1e6:.2f} us, "
                      f"so {ingest / need[8] / floor[1]:.2f}x of that")
    row.notes.append(
        f"daemon CPU per event taken in: ingest {ingest * 1e6:.2f} us + {d * 1e6:.2f} us per "
        f"delivery (I/d = {ingest / d:.1f}); the model gives {ratio8:.2f}x at 8 and "
        f"{64 * c1 / (ingest + 64 * d):.2f}x at 64; {FANOUT_8_TARGET:g}x at 8 needs I/d >= "
        f"{need[8]:g} and {FANOUT_64_TARGET:g}x at 64 >= {need[64]:g}: a delivery of at most "
        f"{ingest / need[8] * 1e6:.2f} us at this ingest" + bare_note
        + " (informational, computed from this run)")
    return row


def targets_budget_row(ctx: Context, chunks: int, raw: list[RawRun],
                       ceilings: dict[int, list[TurnRun]]) -> Row | None:
    """Informational: can the 1-subscriber target and the 8-subscriber fan-out target hold
    together on this machine? Together they ask the daemon to deliver
    ``FANOUT_8_TARGET * SINGLE_OF_AGENT_TARGET * agent raw`` events/s to 8 subscribers, and no
    daemon on this stack delivers more than the bare-Hypercorn 8-subscriber ceiling measured in
    the same run. A computed row from this run's numbers, not a verdict on the daemon: the value
    is what the targets need, the baseline the ceiling, the ratio need over ceiling (<= 1: room
    for both; > 1: both cannot pass here, whatever the daemon does)."""
    if not raw or not ceilings.get(8):
        return None
    raw_rate = statistics.median(r.rate for r in raw)
    ceiling8 = statistics.median(t.rate for t in ceilings[8])
    need = FANOUT_8_TARGET * SINGLE_OF_AGENT_TARGET * raw_rate
    row = Row(benchmark=NAME, name="targets together under the 8-subscriber ceiling",
              params={"chunks": chunks, "subscribers": 8}, unit="events/s", samples=[need],
              value=need, baseline=ceiling8, baseline_label="bare Hypercorn, 8 subscribers",
              ratio=need / ceiling8 if ceiling8 else None, ratio_label="of the ceiling",
              quick=ctx.quick, cpu_note="computed from other rows: no CPU of its own")
    fits = "fit under" if need <= ceiling8 else "exceed"
    row.notes.append(
        f"{FANOUT_8_TARGET:g} x {SINGLE_OF_AGENT_TARGET:g} x agent raw {raw_rate:,.0f} = "
        f"{need:,.0f} events/s to 8 subscribers; the 8-subscriber ceiling measured "
        f"{ceiling8:,.0f}: the two targets together {fits} it "
        f"({need / ceiling8:.2f}x the ceiling) (informational, computed from this run)")
    return row


def ceiling_rows(ctx: Context, chunks: int, runs: dict[int, list[TurnRun]],
                 ceilings: dict[int, list[TurnRun]],
                 server: tuple[str, str] = CEILING_SERVER) -> list[Row]:
    """One informational row per subscriber count: bare Hypercorn's rate (or ``server``'s:
    the row name's start and how a note calls it), against the daemon's rate with as many
    subscribers (ratio: how many times the daemon's rate the stack allows), and what the
    fan-out targets would need."""
    title, called = server
    rows: list[Row] = []
    single = statistics.median(t.rate for t in runs[1]) if runs.get(1) else None
    for n, turns in ceilings.items():
        if not turns:
            continue
        row = Row(benchmark=NAME, name=f"{title}, {n} subscriber{'s' if n > 1 else ''}",
                  params={"chunks": chunks, "subscribers": n}, unit="events/s",
                  samples=[t.rate for t in turns], cpu=_mean_cpu([t.cpu for t in turns]),
                  quick=ctx.quick)
        daemon = statistics.median(t.rate for t in runs[n]) if runs.get(n) else None
        if daemon and row.value:
            row.baseline, row.baseline_label = daemon, "daemon"
            row.ratio, row.ratio_label = row.value / daemon, "of the daemon"
            row.notes.append(f"the daemon delivers {daemon / row.value:.0%} of what {called} "
                             "writes to the same client (same frames, same wake-up size; the "
                             "cpu column's d is the bare server)")
        fanout = {8: FANOUT_8_TARGET, 64: FANOUT_64_TARGET}.get(n)
        if fanout is not None and single and row.value:
            need = fanout * single
            verdict = "within" if need <= row.value else "above"
            row.notes.append(f"the {fanout:g}x fan-out target needs {need:,.0f} events/s, "
                             f"{verdict} this ceiling ({need / row.value:.2f}x it)")
        rows.append(row)
    return rows


def rows_for(ctx: Context, chunks: int, max_queued: int, persistence: bool,
             raw: list[RawRun], runs: dict[int, list[TurnRun]]) -> list[Row]:
    raw_rate = statistics.median(r.rate for r in raw)
    rows = [Row(
        benchmark=NAME, name="agent raw emission (pipe reader counting lines)",
        params={"chunks": chunks}, unit="events/s", samples=[r.rate for r in raw],
        cpu=_mean_cpu([r.cpu for r in raw]), quick=ctx.quick,
        notes=["the baseline of this benchmark: the mock agent alone, no daemon"],
    )]
    single = statistics.median(t.rate for t in runs[1]) if 1 in runs else None
    transcript = "on" if persistence else "off"
    for n, turns in runs.items():
        rates = [t.rate for t in turns]
        evicted = sum(t.evicted for t in turns)
        params = {"chunks": chunks, "subscribers": n, "maxQueued": max_queued,
                  "transcript": transcript}
        row = Row(benchmark=NAME, name=throughput_row_name(n),
                  params=params, unit="events/s", samples=rates,
                  cpu=_mean_cpu([t.cpu for t in turns]), quick=ctx.quick)
        value = row.value or 0.0
        if n in REFERENCE:
            row.notes.append(REFERENCE[n])
        if n == 1:
            row.baseline, row.baseline_label = raw_rate, "agent raw"
            row.ratio, row.ratio_label = value / raw_rate, "of agent"
            row.target = f">= {SINGLE_OF_AGENT_TARGET:g}x agent raw"
            row.ok = row.ratio >= SINGLE_OF_AGENT_TARGET
        else:
            if single is not None:
                row.baseline, row.baseline_label = single, "1 subscriber"
                row.ratio, row.ratio_label = value / single, "of 1 sub"
            else:
                row.baseline, row.baseline_label = raw_rate, "agent raw"
                row.ratio, row.ratio_label = value / raw_rate, "of agent"
            fanout = {8: FANOUT_8_TARGET, 64: FANOUT_64_TARGET}.get(n)
            if fanout is not None and single is not None:
                row.target = f">= {fanout:g}x 1-subscriber rate"
                row.ok = value / single >= fanout
        if evicted:
            row.ok = False if row.ok is not None else None
            row.notes.append(f"{evicted} subscriber(s) evicted over {len(turns)} trial(s)")
        rows.append(row)
        if n == 1:
            per_1k = [t.daemon_ms_per_1k for t in turns if t.daemon_ms_per_1k is not None]
            agent_per_1k = [t.cpu.agent_ms / (t.published / 1000) for t in turns
                            if t.cpu.agent_ms is not None]
            cpu_row = Row(
                benchmark=NAME, name="daemon CPU per 1,000 events, 1 subscriber",
                params={"chunks": chunks, "transcript": transcript}, unit="ms",
                samples=per_1k, cpu=_mean_cpu([t.cpu for t in turns]), quick=ctx.quick,
                target=f"<= {CPU_OF_AGENT_TARGET:g}x agent" if persistence else "",
                notes=[REFERENCE["cpu"]],
            )
            if agent_per_1k:
                cpu_row.baseline = statistics.median(agent_per_1k)
                cpu_row.baseline_label = "agent CPU per 1,000"
                if cpu_row.value is not None and cpu_row.baseline:
                    cpu_row.ratio = cpu_row.value / cpu_row.baseline
                    cpu_row.ratio_label = "of agent"
            if persistence and cpu_row.ratio is not None:
                cpu_row.ok = cpu_row.ratio <= CPU_OF_AGENT_TARGET
            elif cpu_row.target:
                # A turn too short for the agent's CPU to register, or an agent already gone:
                # there is nothing to judge the daemon's figure against in this run.
                cpu_row.target = ""
                cpu_row.notes.append("agent CPU too small to measure in this run: no verdict")
            rows.append(cpu_row)
    return rows
