"""Many sessions on one daemon: what each costs, alive and unloaded, as their number grows.

For each size N of ``--sizes`` (default 10, 1,000, 5,000; quick 10, 200) two fresh daemons run,
with the transcript on, ``--max-sessions 0`` and one workspace (so every session shares one
mock agent process):

1. *live*: N sessions are created (``sessionScope: thread``, 8 clients at once) and left idle
   (``--session-idle-ms 0``: never unloaded). Rows: the daemon's RSS above its own empty figure
   (read before the first create) per session; ``GET /daemon/status``, a page of 10 of
   ``GET /sessions`` (the newest, and from a cursor at the middle of the list): the daemon's
   CPU per request over 50 (read from its CPU clock), beside the wall time's p50 and p95, the
   body and the load average (:class:`RequestCost`); every session 500 a page; one
   ``--chunks`` turn of a new session to one SSE subscriber with the N idle
   sessions attached to the same agent process (events/s and daemon CPU per 1,000 events,
   :func:`benchmarks.e2e.measure_turn`: every event checked); the time from SIGTERM to exit.
2. *unloaded*: the same N sessions with ``--session-idle-ms`` short (``--idle-ms``); once
   ``GET /daemon/status`` counts no live session, the daemon's RSS above its empty figure; one
   session's ``load`` (it is restored from the transcript); the time from SIGTERM to exit.

Baselines are the smallest size's figures, measured in the same run: a cost that does not grow
with N keeps a ratio near 1. RSS is read once it holds still (``memory.settled_rss_mb``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx

from benchmarks.e2e import TurnRun, measure_turn
from benchmarks.harness import Context, CpuUse, Row, process_cpu_seconds
from benchmarks.launcher import Daemon, LaunchError, start_daemon
from benchmarks.memory import settled_rss_mb

NAME = "sessions"
TITLE = "many sessions on one daemon: memory per session, unload, routing, status, shutdown"

LIVE_SESSION_TARGET_KB = 64.0
UNLOADED_TARGET_MB = 60.0  # at 5,000 sessions
UNLOADED_TARGET_AT = 5000
ROUTING_RATE_TARGET = 0.9  # of the smallest size's events/s
ROUTING_CPU_TARGET = 1.1  # of the smallest size's daemon CPU per 1,000 events
STATUS_TARGET_KB = 64.0
STATUS_TARGET_MS = 5.0
SHUTDOWN_SLACK_S = 0.5  # shutdown within the smallest size's time plus this
CREATE_CLIENTS = 8
MB = 1e6


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sizes", default=None,
                        help="comma-separated session counts (default 10,1000,5000; "
                             "quick 10,200)")
    parser.add_argument("--chunks", type=int, default=None,
                        help="chunks of the routing turn (default 20,000; quick 5,000)")
    parser.add_argument("--idle-ms", type=int, default=1000,
                        help="--session-idle-ms of the unloading daemon (default 1000)")


@dataclass
class RequestCost:
    """One request's cost over ``reads`` of it: the daemon's CPU per request (its own CPU clock,
    read before and after: what a busy machine's waiting for a core does not blur), the wall
    time's p50 and p95 as a client sees it, the body's bytes and the 1-minute load average
    right after (how busy the machine was)."""

    cpu_ms: float | None
    p50_ms: float
    p95_ms: float
    body_bytes: int
    load: float

    def note(self) -> str:
        cpu = "" if self.cpu_ms is None else f"daemon CPU {self.cpu_ms:.2f} ms a request; "
        return (f"{cpu}wall p50 {self.p50_ms:.1f} ms, p95 {self.p95_ms:.1f} ms; body "
                f"{self.body_bytes / 1000:.1f} KB; load average {self.load:.1f}")


@dataclass
class LiveRun:
    sessions: int
    empty_mb: float
    rss_mb: float
    status: RequestCost
    list_first: RequestCost
    list_middle: RequestCost
    list_all_ms: float
    turns: list[TurnRun]
    shutdown_s: float
    shutdown_cpu_s: float | None
    create_s: float

    @property
    def per_session_kb(self) -> float:
        return (self.rss_mb - self.empty_mb) * MB / 1000 / self.sessions


@dataclass
class UnloadRun:
    sessions: int
    empty_mb: float
    rss_mb: float
    unload_s: float
    load_ms: float
    shutdown_s: float
    notes: list[str] = field(default_factory=list)

    @property
    def above_empty_mb(self) -> float:
        return self.rss_mb - self.empty_mb


def create_sessions(url: str, count: int, progress: Callable[[str], None],
                    clients: int = CREATE_CLIENTS) -> list[str]:
    """``count`` new sessions on the daemon at ``url``, created by ``clients`` clients at
    once."""
    local = threading.local()
    done = [0]
    lock = threading.Lock()

    def one(_: int) -> str:
        client = getattr(local, "client", None)
        if client is None:
            client = local.client = httpx.Client(base_url=url, timeout=120.0)
        response = client.post("/session", json={"sessionScope": "thread"})
        if response.status_code != 200:
            raise LaunchError(f"POST /session answered {response.status_code}: "
                              f"{response.text[:300]}")
        with lock:
            done[0] += 1
            if done[0] % 1000 == 0:
                progress(f"  {done[0]:,}/{count:,} sessions created")
        return str(response.json()["sessionId"])

    with ThreadPoolExecutor(clients) as pool:
        return list(pool.map(one, range(count)))


REQUEST_READS = 50  # requests per cost figure
LIST_PAGE = 10  # the page GET /sessions is timed with (the smallest default size: flat with N)


def request_cost(daemon: Daemon, path: str, params: dict[str, str] | None = None,
                 reads: int = REQUEST_READS) -> RequestCost:
    """``reads`` sequential ``GET path``s: see :class:`RequestCost`."""
    times: list[float] = []
    size = 0
    cpu_before = process_cpu_seconds(daemon.pid)
    for _ in range(reads):
        started = time.perf_counter()
        response = daemon.http.get(path, params=params)
        times.append((time.perf_counter() - started) * 1000)
        if response.status_code != 200:
            raise LaunchError(f"GET {path} answered {response.status_code}: "
                              f"{response.text[:300]}")
        size = len(response.content)
    cpu_after = process_cpu_seconds(daemon.pid)
    load = os.getloadavg()[0]
    cpu_ms = None if cpu_before is None or cpu_after is None else \
        (cpu_after - cpu_before) * 1000 / reads
    times.sort()
    return RequestCost(cpu_ms, statistics.median(times),
                       times[min(len(times) - 1, round(0.95 * (len(times) - 1)))], size, load)


def cursor_at(daemon: Daemon, position: int) -> str | None:
    """The ``nextCursor`` after the ``position`` newest sessions (``None`` at 0)."""
    cursor: str | None = None
    listed = 0
    while listed < position:
        params = {"limit": str(min(500, position - listed)),
                  **({"cursor": cursor} if cursor else {})}
        page = daemon.http.get("/sessions", params=params).json()
        listed += len(page["sessions"])
        cursor = page.get("nextCursor")
        if not page["hasMore"]:
            break
    return cursor


def list_everything(daemon: Daemon) -> tuple[float, int]:
    """The ms to page through every session 500 at a time, and the count listed."""
    started = time.perf_counter()
    listed = 0
    cursor: str | None = None
    while True:
        params = {"limit": "500", **({"cursor": cursor} if cursor else {})}
        page = daemon.http.get("/sessions", params=params).json()
        listed += len(page["sessions"])
        if not page["hasMore"]:
            break
        cursor = page["nextCursor"]
    return (time.perf_counter() - started) * 1000, listed


def stop_timed(daemon: Daemon) -> tuple[float, float | None]:
    """SIGTERM to exit: seconds, and the daemon's CPU seconds meanwhile (from its rusage at
    exit, less what its agents had used before: the rusage of a process that exits holds the
    CPU of the children it reaped, and the daemon reaps its agents as it stops; on a busy
    machine the wall time mostly says how long it waited for a core). The daemon must exit
    0."""
    agent_pids = daemon.agent_pids()
    daemon.http.close()
    pid = daemon.proc.pid
    agents = [process_cpu_seconds(agent) for agent in agent_pids]
    cpu_before = process_cpu_seconds(pid)
    if cpu_before is not None:
        cpu_before += sum(cpu for cpu in agents if cpu is not None)
    started = time.monotonic()
    daemon.proc.terminate()
    _, status, usage = os.wait4(pid, 0)
    elapsed = time.monotonic() - started
    code = daemon.proc.returncode = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise LaunchError(f"daemon exited {code} on SIGTERM:\n{daemon.stderr_tail()}")
    cpu = None if cpu_before is None else usage.ru_utime + usage.ru_stime - cpu_before
    return elapsed, cpu


def live_run(ctx: Context, count: int, chunks: int, turns: int) -> LiveRun:
    with start_daemon(["--max-sessions", "0", "--session-idle-ms", "0"]) as daemon:
        daemon.get_json("/health")
        _, empty = settled_rss_mb(daemon)
        ctx.progress(f"live, {count:,} sessions: empty RSS {empty:.1f} MB; creating")
        started = time.monotonic()
        create_sessions(daemon.url, count, ctx.progress)
        create_s = time.monotonic() - started
        _, rss = settled_rss_mb(daemon)
        status = request_cost(daemon, "/daemon/status")
        page = {"limit": str(LIST_PAGE)}
        list_first = request_cost(daemon, "/sessions", page)
        middle = cursor_at(daemon, count // 2)
        list_middle = request_cost(daemon, "/sessions",
                                   {**page, **({"cursor": middle} if middle else {})})
        list_all_ms, listed = list_everything(daemon)
        if listed != count:
            raise LaunchError(f"GET /sessions listed {listed} of {count} sessions")
        ctx.progress(f"  RSS {rss:.1f} MB ({(rss - empty) * 1000 / count:.1f} KB a session; "
                     f"created in {create_s:.1f} s)\n  status: {status.note()}\n  GET "
                     f"/sessions, {LIST_PAGE} newest: {list_first.note()}\n  GET /sessions, "
                     f"{LIST_PAGE} from the middle: {list_middle.note()}\n  all {listed:,} "
                     f"sessions, 500 a page, in {list_all_ms:.0f} ms")
        runs = []
        for trial in range(turns):
            run = measure_turn(daemon, chunks, 1)
            ctx.progress(f"  turn {trial + 1}/{turns}: {run.rate:,.0f} events/s, daemon "
                         f"{run.daemon_ms_per_1k or 0:.1f} ms CPU per 1,000 events")
            runs.append(run)
        shutdown, shutdown_cpu = stop_timed(daemon)
        ctx.progress(f"  shutdown {shutdown:.2f} s, daemon CPU {shutdown_cpu or 0:.2f} s")
        return LiveRun(count, empty, rss, status, list_first, list_middle, list_all_ms,
                       runs, shutdown, shutdown_cpu, create_s)


def unload_run(ctx: Context, count: int, idle_ms: int) -> UnloadRun:
    with start_daemon(["--max-sessions", "0", "--session-idle-ms", str(idle_ms)]) as daemon:
        daemon.get_json("/health")
        _, empty = settled_rss_mb(daemon)
        ctx.progress(f"unloading, {count:,} sessions (--session-idle-ms {idle_ms}): empty RSS "
                     f"{empty:.1f} MB; creating")
        ids = create_sessions(daemon.url, count, ctx.progress)
        started = time.monotonic()
        deadline = started + 120 + idle_ms / 1000
        while True:
            live = int(daemon.get_json("/daemon/status")["liveSessions"])
            if live == 0:
                break
            if time.monotonic() > deadline:
                raise LaunchError(f"{live} of {count} sessions still live after "
                                  f"{time.monotonic() - started:.0f} s")
            time.sleep(0.05)
        unload_s = time.monotonic() - started
        _, rss = settled_rss_mb(daemon)
        t0 = time.perf_counter()
        body = daemon.post_json(f"/session/{ids[0]}/load", {})
        load_ms = (time.perf_counter() - t0) * 1000
        if body.get("sessionId") != ids[0]:
            raise LaunchError(f"load of an unloaded session answered {body}")
        ctx.progress(f"  all unloaded {unload_s:.1f} s after the last create; RSS {rss:.1f} MB "
                     f"({rss - empty:+.1f} MB); a load restores one in {load_ms:.1f} ms")
        shutdown, _ = stop_timed(daemon)
        return UnloadRun(count, empty, rss, unload_s, load_ms, shutdown)


def run(ctx: Context, args: argparse.Namespace) -> list[Row]:
    sizes = ([int(s) for s in args.sizes.split(",")] if args.sizes
             else ctx.pick([10, 1000, 5000], [10, 200]))
    chunks = args.chunks or ctx.pick(20_000, 5_000)
    turns = ctx.trials(3, 1)
    live = [live_run(ctx, count, chunks, turns) for count in sizes]
    unloaded = [unload_run(ctx, count, args.idle_ms) for count in sizes]
    return rows_for(ctx, chunks, live, unloaded)


def _median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _turn_cpu(turns: Sequence[TurnRun]) -> CpuUse:
    total = CpuUse()
    for turn in turns:
        total = total + turn.cpu
    return total.scaled(1 / len(turns))


def _cpu_ratio(each: RequestCost, base: RequestCost) -> float | None:
    if each.cpu_ms is None or not base.cpu_ms:
        return None
    return each.cpu_ms / base.cpu_ms


def request_rows(ctx: Context, live: Sequence[LiveRun]) -> list[Row]:
    """GET /daemon/status and a page of GET /sessions as the sessions grow: the daemon's CPU
    per request is the figure (the wall time, beside it, also holds the waits for a core of a
    shared machine). Status at scale must be at most STATUS_TARGET_MS and STATUS_TARGET_KB."""
    rows: list[Row] = []
    base = live[0]
    kinds: list[tuple[str, Callable[[LiveRun], RequestCost]]] = [
        ("GET /daemon/status", lambda run: run.status),
        (f"GET /sessions, the {LIST_PAGE} newest", lambda run: run.list_first),
        (f"GET /sessions, {LIST_PAGE} from the middle (cursor)", lambda run: run.list_middle),
    ]
    for name, cost_of in kinds:
        for each in live:
            cost, base_cost = cost_of(each), cost_of(base)
            status_at_scale = cost is each.status and each.sessions >= UNLOADED_TARGET_AT
            figure = cost.cpu_ms if cost.cpu_ms is not None else cost.p50_ms
            notes = [cost.note()]
            if cost is each.list_first:
                notes.append(f"every session, 500 a page: {each.list_all_ms:.0f} ms")
            rows.append(Row(
                benchmark=NAME, name=f"{name}, daemon CPU a request",
                params={"sessions": each.sessions}, unit="ms", samples=[figure],
                baseline=base_cost.cpu_ms, baseline_label=f"{base.sessions} sessions",
                ratio=_cpu_ratio(cost, base_cost),
                target=f"<= {STATUS_TARGET_MS:g} ms and <= {STATUS_TARGET_KB:g} KB"
                if status_at_scale else "",
                ok=(figure <= STATUS_TARGET_MS
                    and cost.body_bytes <= STATUS_TARGET_KB * 1000) if status_at_scale
                else None,
                cpu_note="-", quick=ctx.quick, notes=notes))
    return rows


def rows_for(ctx: Context, chunks: int, live: Sequence[LiveRun],
             unloaded: Sequence[UnloadRun]) -> list[Row]:
    rows: list[Row] = []
    base = live[0]
    base_rate = statistics.median(t.rate for t in base.turns)
    base_cpu = _median([t.daemon_ms_per_1k for t in base.turns])
    for each in live:
        rows.append(Row(
            benchmark=NAME, name="RSS per live idle session", params={"sessions": each.sessions},
            unit="KB", samples=[each.per_session_kb], baseline=None,
            target=f"<= {LIVE_SESSION_TARGET_KB:g} KB",
            ok=each.per_session_kb <= LIVE_SESSION_TARGET_KB, cpu_note="-", quick=ctx.quick,
            notes=[f"RSS {each.empty_mb:.1f} MB empty -> {each.rss_mb:.1f} MB with "
                   f"{each.sessions:,} sessions (created in {each.create_s:.1f} s)"]))
    for each in live:
        rate = statistics.median(t.rate for t in each.turns)
        cpu = _median([t.daemon_ms_per_1k for t in each.turns])
        ok = rate >= ROUTING_RATE_TARGET * base_rate and (
            cpu is None or base_cpu is None or cpu <= ROUTING_CPU_TARGET * base_cpu)
        rows.append(Row(
            benchmark=NAME, name=f"a {chunks:,}-chunk turn beside idle sessions on its agent",
            params={"idle_sessions": each.sessions, "subscribers": 1}, unit="events/s",
            samples=[t.rate for t in each.turns], baseline=base_rate,
            baseline_label=f"{base.sessions} sessions",
            ratio=rate / base_rate,
            target="" if each is base else (f">= {ROUTING_RATE_TARGET:g}x and CPU <= "
                                            f"{ROUTING_CPU_TARGET:g}x"),
            ok=None if each is base else ok, cpu=_turn_cpu(each.turns), cpu_note="per turn",
            quick=ctx.quick,
            notes=[f"daemon CPU {cpu:.1f} ms per 1,000 events"
                   + (f" ({cpu / base_cpu:.2f}x the {base.sessions}-session figure)"
                      if cpu is not None and base_cpu else "")] if cpu is not None else []))
    rows += request_rows(ctx, live)
    for each in live:
        rows.append(Row(
            benchmark=NAME, name="shutdown (SIGTERM to exit), sessions live",
            params={"sessions": each.sessions}, unit="s", samples=[each.shutdown_s],
            baseline=base.shutdown_s, baseline_label=f"{base.sessions} sessions",
            ratio=each.shutdown_s / base.shutdown_s,
            target="" if each is base else f"<= baseline + {SHUTDOWN_SLACK_S:g} s",
            ok=None if each is base else each.shutdown_s <= base.shutdown_s + SHUTDOWN_SLACK_S,
            cpu_note="-", quick=ctx.quick,
            notes=[] if each.shutdown_cpu_s is None else [
                f"daemon CPU from SIGTERM to exit {each.shutdown_cpu_s:.2f} s"
                + ("" if not base.shutdown_cpu_s or each is base else
                   f" ({each.shutdown_cpu_s / base.shutdown_cpu_s:.1f}x the "
                   f"{base.sessions}-session figure)")]))
    ubase = unloaded[0]
    for gone in unloaded:
        at_scale = gone.sessions >= UNLOADED_TARGET_AT
        rows.append(Row(
            benchmark=NAME, name="RSS above empty, sessions unloaded when idle",
            params={"sessions": gone.sessions}, unit="MB", samples=[gone.above_empty_mb],
            baseline=None,
            target=f"<= {UNLOADED_TARGET_MB:g} MB" if at_scale else "",
            ok=gone.above_empty_mb <= UNLOADED_TARGET_MB if at_scale else None,
            cpu_note="-", quick=ctx.quick,
            notes=[f"RSS {gone.empty_mb:.1f} MB empty -> {gone.rss_mb:.1f} MB; "
                   f"{gone.above_empty_mb * MB / 1000 / gone.sessions:.1f} KB a session; all "
                   f"unloaded {gone.unload_s:.1f} s after the last create; a load then "
                   f"restores one in {gone.load_ms:.1f} ms; shutdown {gone.shutdown_s:.2f} s"
                   + (f" ({gone.shutdown_s / ubase.shutdown_s:.2f}x the "
                      f"{ubase.sessions}-session figure)" if gone is not ubase else "")]))
    return rows
