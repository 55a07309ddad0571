"""Benchmark: how many LLM-paced sessions one daemon serves with p99 delivery <= 100 ms.

Real agents stream 30-100 chunks a second per session, with thoughts and tool calls between.
Each step of this benchmark runs N such sessions at once on one daemon and reads, for every
update, the time from the agent writing it to a subscriber reading it:

1. N sessions (``sessionScope: thread``; more are created as N grows, none deleted), each
   with ``--per-session`` (2) SSE subscribers at the daemon's default ``maxQueued``, held by
   ``--clients`` subscriber processes (:mod:`benchmarks.realload_client`: raw sockets, one
   ``selectors`` loop each, no JSON decoding), connected before the turns start;
2. one prompt per session for the bundled mock agent's LLM-paced script
   (``mock:pace=30-100``, :mod:`daemon.mock_agent.paced`): a rate drawn per session in
   ``--pace``, +-50% jitter on every gap, thoughts, tool calls that pause the stream, answers,
   every update stamped with the agent's write time (``CLOCK_MONOTONIC``, system-wide). Every
   script starts at the same moment (``mock:start_ns``), after all the prompts are in; seeds
   are ``--seed`` plus the session's number, so a run is repeatable;
3. a measuring window of ``--window`` seconds, after one second of warm-up: the latencies of the
   updates written inside it (p50, p99, the worst), the events published in it (from the
   stamps) against what the scripts meant to send in it (the agent kept pace, or the figure is
   not for N paced sessions), and the CPU of the daemon, its agents and the subscriber
   processes over it;
4. every stream is checked to the end of its turn: contiguous ids, its stamps numbered
   0, 1, 2, ... and as many as the turn's closing chunk says it sent, the terminal, no
   eviction. A step *holds* when p99 <= 100 ms, every stream got its turn whole and the
   scripts kept >= 90% of their pace.

The search doubles N from ``--start`` until a step does not hold (or ``--max``; halves it while
none holds, down to 5), then bisects
between the last N that held and the first that did not, until they are within 15% or the
time budget (``--budget`` seconds per daemon) is spent. ``--sizes`` measures a list instead.

``--reference URL`` runs the same search against another wire-compatible daemon already
running on this machine (its agent must be this repository's mock agent, which reads the
``mock:`` prompt tokens; its pid, for its CPU, is found from the port or given with
``--reference-pid``). The rows then carry the ratios: the largest N against the reference's,
and the daemon CPU per 1,000 events at the largest N both held.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx

from benchmarks.harness import CLOCK_TICKS, Context, CpuUse, Row, process_cpu_seconds
from benchmarks.launcher import Daemon, LaunchError, descendants, start_daemon
from benchmarks.realload_client import BIN_NS, RealloadClients
from benchmarks.sessions import create_sessions
from daemon.mock_agent.paced import paced_steps, parse_pace

NAME = "realload"
TITLE = ("LLM-paced sessions at once, 2 SSE subscribers each: the most with p99 "
         "publish-to-delivery <= 100 ms")

P99_TARGET_MS = 100.0
SESSIONS_TARGET = 2000
PACE_KEPT = 0.9  # the scripts must send at least this share of what they meant to
WARMUP_S = 1.0
TAIL_S = 0.5  # the scripts run this long past the window
HTTP_CLIENTS = 16  # threads creating sessions and sending prompts
LEAD_FACTOR = 2.0  # the scripts start after twice the time the prompts are expected to take
OVERRUN_RETRIES = 2
BISECT_UNTIL = 1.15
MIN_SESSIONS = 5  # the search halves no lower  # stop when the first failing N is within 15% of the last holding one


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--reference", metavar="URL", default=None,
                        help="also search a running wire-compatible daemon (its agent: this "
                             "repository's mock agent) for the ratio")
    parser.add_argument("--reference-pid", type=int, default=None,
                        help="the reference daemon's pid (default: found from its port)")
    parser.add_argument("--sizes", default=None,
                        help="comma-separated session counts to measure, no search")
    parser.add_argument("--start", type=int, default=None,
                        help="first N of the search (default 250; quick 50)")
    parser.add_argument("--max", type=int, default=None,
                        help="largest N tried (default 8,000; quick 800)")
    parser.add_argument("--window", type=float, default=None,
                        help="measured seconds per step (default 6; quick 3)")
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds of search per daemon (default 270; quick 45); a step "
                             "already started finishes")
    parser.add_argument("--pace", default="30-100", help="chunks a second per session, LO-HI")
    parser.add_argument("--per-session", type=int, default=2, help="SSE subscribers a session")
    parser.add_argument("--clients", type=int, default=None,
                        help="subscriber processes (default: 1 per 1,000 sessions, at most 4)")
    parser.add_argument("--seed", type=int, default=1)


# --- the daemon under test -------------------------------------------------------------------


def listening_pid(port: int) -> int | None:
    """The pid of the process with a listening TCP socket on ``port`` (this machine), else
    ``None``: the socket's inode from /proc/net/tcp{,6}, then the process holding it."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as file:
                next(file)
                for line in file:
                    parts = line.split()
                    if parts[3] == "0A" and int(parts[1].rsplit(":", 1)[1], 16) == port:
                        inodes.add(parts[9])
        except OSError:
            continue
    if not inodes:
        return None
    wanted = {f"socket:[{inode}]" for inode in inodes}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            for fd in os.listdir(f"/proc/{entry}/fd"):
                if os.readlink(f"/proc/{entry}/fd/{fd}") in wanted:
                    return int(entry)
        except OSError:
            continue
    return None


@dataclass
class SearchedDaemon:
    """A daemon to search: its URL, its pid (for its CPU), and the sessions made so far."""

    label: str
    url: str
    pid: int | None
    sessions: list[str] = field(default_factory=list)
    # Seconds per prompt that sending N prompts took, learned from each step (the next step's
    # scripts start once its prompts are expected to be in).
    prompt_s: float = 0.005

    @property
    def host_port(self) -> tuple[str, int]:
        parsed = httpx.URL(self.url)
        if parsed.port is None:
            raise LaunchError(f"daemon URL {self.url} has no port")
        return parsed.host, parsed.port

    def agent_pids(self) -> list[int]:
        return descendants(self.pid) if self.pid else []

    def ensure_sessions(self, count: int, progress: Callable[[str], None]) -> None:
        missing = count - len(self.sessions)
        if missing <= 0:
            return
        started = time.monotonic()
        self.sessions.extend(create_sessions(self.url, missing, progress, HTTP_CLIENTS))
        if len(self.sessions) == missing:  # no step ran yet: plan prompts at the create rate
            self.prompt_s = max(self.prompt_s, (time.monotonic() - started) / missing)
        progress(f"  {self.label}: created {missing:,} sessions in "
                 f"{time.monotonic() - started:.1f} s ({len(self.sessions):,} in all)")

    def prompt_all(self, sessions: Sequence[str], texts: Sequence[str]) -> None:
        local = threading.local()

        def one(pair: tuple[str, str]) -> None:
            client = getattr(local, "client", None)
            if client is None:
                client = local.client = httpx.Client(base_url=self.url, timeout=120.0)
            session, text = pair
            response = client.post(f"/session/{session}/prompt",
                                   json={"prompt": [{"type": "text", "text": text}]})
            if response.status_code >= 400:
                raise LaunchError(f"POST /session/{session}/prompt answered "
                                  f"{response.status_code}: {response.text[:300]}")

        with ThreadPoolExecutor(HTTP_CLIENTS) as pool:
            list(pool.map(one, zip(sessions, texts, strict=True)))


class Overrun(RuntimeError):
    """The prompts took so long that the scripts of the first ended before the window."""


# --- one step ----------------------------------------------------------------------------------


@dataclass
class Step:
    sessions: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    events: int  # published inside the window (stamps / subscribers a session)
    nominal: int  # what the scripts meant to publish inside it
    window_s: float
    cpu: CpuUse
    problems: list[str]
    prompt_s: float  # seconds to send the N prompts
    # Every stream's report (benchmarks.realload_client) and the turn each session ran.
    subs: list[dict[str, Any]] = field(default_factory=list, repr=False)
    scripts: list[int] = field(default_factory=list, repr=False)  # stamped updates a session
    daemon_threads: str = ""  # the daemon's threads' CPU over the window, % of a core

    @property
    def events_per_s(self) -> float:
        return self.events / self.window_s

    @property
    def pace_kept(self) -> float:
        return self.events / self.nominal if self.nominal else 0.0

    @property
    def daemon_ms_per_1k(self) -> float | None:
        if self.cpu.daemon_ms is None or not self.events:
            return None
        return self.cpu.daemon_ms / self.events * 1000

    @property
    def holds(self) -> bool:
        return (not self.problems and self.p99_ms <= P99_TARGET_MS
                and self.pace_kept >= PACE_KEPT)

    def why_not(self) -> str:
        reasons = list(self.problems[:3])
        if self.p99_ms > P99_TARGET_MS:
            reasons.append(f"p99 {self.p99_ms:.0f} ms > {P99_TARGET_MS:g} ms")
        if self.pace_kept < PACE_KEPT:
            reasons.append(f"the scripts kept {self.pace_kept:.0%} of their pace")
        return "; ".join(reasons)


def _percentile(hist: dict[int, int], q: float) -> float:
    """The ``q`` quantile (0-1) of a histogram of BIN_NS bins, in ms (a bin's upper edge)."""
    total = sum(hist.values())
    if not total:
        return float("nan")
    rank = q * total
    seen = 0
    for index in sorted(hist):
        seen += hist[index]
        if seen >= rank:
            return (index + 1) * BIN_NS / 1e6
    return (max(hist) + 1) * BIN_NS / 1e6


def thread_cpu_seconds(pid: int) -> dict[str, float]:
    """CPU seconds of each thread of ``pid`` (user + system, clock ticks), summed by thread
    name; the main thread is ``main``. Empty once the process is gone."""
    found: dict[str, float] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat", "rb") as stat:
                raw = stat.read()
        except OSError:
            continue
        name = "main" if int(tid) == pid else raw[raw.index(b"(") + 1:raw.rindex(b")")].decode(
            errors="replace")
        fields = raw[raw.rindex(b")") + 2:].split()
        found[name] = found.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    return found


def _threads_share(before: dict[str, float], after: dict[str, float], window_s: float) -> str:
    """The daemon's threads' CPU over the window, in % of a core, busiest first."""
    used = {name: after[name] - before.get(name, 0.0) for name in after}
    busy = sorted(((v, k) for k, v in used.items() if v > 0), reverse=True)
    return ", ".join(f"{name} {v / window_s:.0%}" for v, name in busy[:4]) or "none measured"


def _cpu_now(pids: Sequence[int]) -> list[float | None]:
    return [process_cpu_seconds(pid) for pid in pids]


def _cpu_ms(before: Sequence[float | None], after: Sequence[float | None]) -> float | None:
    pairs = [(b, a) for b, a in zip(before, after, strict=True) if b is not None and a is not None]
    return sum(a - b for b, a in pairs) * 1000 if pairs else None


def _sleep_until(moment_ns: int) -> None:
    """Wait for a moment of the measuring clock (the window's edges are times, not events)."""
    while (left := moment_ns - time.monotonic_ns()) > 0:
        time.sleep(left / 1e9)


def stream_problems(subs: Sequence[dict[str, Any]], per_session: int) -> list[str]:
    """What is wrong with what the streams received (empty when every one got its turn whole:
    contiguous ids, stamps 0..n-1 with n what the turn's closing chunk said, the terminal last,
    and the same n on every stream of a session)."""
    problems: list[str] = []
    by_session: dict[int, list[dict[str, Any]]] = {}
    for sub in subs:
        by_session.setdefault(int(sub["session"]), []).append(sub)
        name = f"session {sub['session']}"
        if sub.get("error"):
            problems.append(f"{name}: {sub['error']}")
        elif sub.get("evicted"):
            problems.append(f"{name}: a subscriber was evicted")
        elif not sub.get("done"):
            problems.append(f"{name}: the terminal never arrived")
        elif sub.get("terminal_id") != sub.get("last_id"):
            problems.append(f"{name}: frames after the terminal")
        if sub.get("id_error"):
            problems.append(f"{name}: ids not contiguous: {sub['id_error']}")
        if sub.get("stamp_error"):
            problems.append(f"{name}: {sub['stamp_error']}")
        elif sub.get("end_count") is None and sub.get("done"):
            problems.append(f"{name}: the turn's closing chunk never arrived")
    for index, mine in sorted(by_session.items()):
        counts = {int(sub["stamps"]) for sub in mine}
        if len(mine) != per_session or len(counts) != 1:
            problems.append(f"session {index}: {len(mine)} streams received "
                            f"{sorted(counts)} stamps")
    return problems


def run_step(ctx: Context, target: SearchedDaemon, count: int, args: argparse.Namespace,
             window_s: float, low: float, high: float) -> Step:
    target.ensure_sessions(count, ctx.progress)
    sessions = target.sessions[:count]
    host, port = target.host_port
    processes = args.clients or max(1, min(4, -(-count // 1000)))
    lead_s = 0.5 + count * target.prompt_s * LEAD_FACTOR
    script_ms = int((lead_s + WARMUP_S + window_s + TAIL_S) * 1000)
    script_s = script_ms / 1000  # as the agent reads mock:pace_ms
    clients = RealloadClients(host, port, sessions, processes=processes,
                              per_session=args.per_session, scratch=tempfile.gettempdir(),
                              timeout=script_s + 120)
    try:
        clients.wait_ready(60 + count / 100)
        start_ns = time.monotonic_ns() + int(lead_s * 1e9)
        seeds = [args.seed * 1_000_003 + index for index in range(count)]
        texts = [f"mock:pace={args.pace} mock:pace_ms={script_ms} mock:seed={seed} "
                 f"mock:start_ns={start_ns} mock:chunks=0 mock:delay_ms=0" for seed in seeds]
        sent = time.monotonic_ns()
        target.prompt_all(sessions, texts)
        prompted = time.monotonic_ns()
        prompt_s = (prompted - sent) / 1e9
        target.prompt_s = max(0.0005, prompt_s / count)
        t0 = max(start_ns, prompted) + int(WARMUP_S * 1e9)
        # The window ends with the scripts (less a tail) or after --window, the earlier: when
        # the prompts took longer than planned it is shorter (the row says how long it was).
        t1 = min(t0 + int(window_s * 1e9), start_ns + int((script_s - TAIL_S) * 1e9))
        if t1 - t0 < window_s * 0.5e9:
            # The turns run to their end (the next step's prompts must not queue behind them).
            clients.send_window(0, 0)
            clients.results()
            raise Overrun(f"sending {count:,} prompts took {prompt_s:.1f} s, {lead_s:.1f} s "
                          "were planned: no window was left to measure")
        clients.send_window(t0, t1)
        ctx.progress(f"  {target.label}: N={count:,}: {2 * count:,} streams open, prompts sent in "
                     f"{prompt_s:.1f} s; measuring {(t1 - t0) / 1e9:.1f} s from "
                     f"{(t0 - prompted) / 1e9:.1f} s from now")
        agents = target.agent_pids()
        pids = [target.pid] if target.pid else []
        _sleep_until(t0)
        before = (_cpu_now(pids), _cpu_now(agents), _cpu_now(clients.pids))
        threads_before = thread_cpu_seconds(target.pid) if target.pid else {}
        _sleep_until(t1)
        after = (_cpu_now(pids), _cpu_now(agents), _cpu_now(clients.pids))
        threads_after = thread_cpu_seconds(target.pid) if target.pid else {}
        results = clients.results()
    finally:
        clients.close()
    cpu = CpuUse(_cpu_ms(before[0], after[0]), _cpu_ms(before[1], after[1]),
                 _cpu_ms(before[2], after[2]))
    hist: dict[int, int] = {}
    subs: list[dict[str, Any]] = []
    for result in results:
        subs.extend(result["subs"])
        for key, n in result["hist"].items():
            hist[int(key)] = hist.get(int(key), 0) + int(n)
    problems = stream_problems(subs, args.per_session)
    if any(result.get("negative") for result in results):
        problems.append("a frame arrived before its stamp (clocks differ?)")
    stamps = sum(int(sub["in_window"]) for sub in subs)
    window = (t1 - t0) / 1e9
    offset0, offset1 = (t0 - start_ns) / 1e9, (t1 - start_ns) / 1e9
    scripts = [paced_steps(seed, low, high, script_s) for seed in seeds]
    nominal = sum(1 for script in scripts for at, _ in script if offset0 <= at < offset1)
    return Step(count, _percentile(hist, 0.5), _percentile(hist, 0.99),
                _percentile(hist, 1.0), stamps // args.per_session, nominal, window, cpu,
                problems, prompt_s, subs, [len(script) for script in scripts],
                _threads_share(threads_before, threads_after, window))


def describe(step: Step) -> str:
    cpu = step.daemon_ms_per_1k
    clients = step.cpu.clients_ms
    return (f"N={step.sessions:,}: p50 {step.p50_ms:.1f} ms, p99 {step.p99_ms:.1f} ms, max "
            f"{step.max_ms:.0f} ms; {step.events_per_s:,.0f} events/s ({step.pace_kept:.0%} of "
            f"the scripts' pace); daemon {cpu or 0:.1f} ms CPU per 1,000 events"
            + (f" (threads: {step.daemon_threads})" if step.daemon_threads else "")
            + "; subscriber "
            f"processes {(clients or 0) / step.window_s / 10:.0f}% of a core; "
            + ("holds" if step.holds else f"does not hold: {step.why_not()}"))


def search(ctx: Context, target: SearchedDaemon, args: argparse.Namespace) -> list[Step]:
    low, high = parse_pace(args.pace)
    window_s = args.window or ctx.pick(6.0, 3.0)
    steps: list[Step] = []

    def measure(count: int) -> Step:
        for attempt in range(OVERRUN_RETRIES + 1):
            try:
                step = run_step(ctx, target, count, args, window_s, low, high)
                break
            except Overrun as exc:
                if attempt == OVERRUN_RETRIES:
                    raise
                ctx.progress(f"  {target.label}: {exc}; again, planning for that rate")
        ctx.progress(f"  {target.label}: {describe(step)}")
        steps.append(step)
        return step

    if args.sizes:
        for count in (int(s) for s in args.sizes.split(",")):
            measure(count)
        return steps
    budget = args.budget or ctx.pick(270.0, 45.0)
    limit = args.max or ctx.pick(8000, 800)
    started = time.monotonic()
    good: int | None = None
    bad: int | None = None
    count = args.start or ctx.pick(250, 50)
    # Doubling from the start while steps hold; halving while they do not (to MIN_SESSIONS).
    while MIN_SESSIONS <= count <= limit:
        if measure(count).holds:
            good = count
            if bad is not None:
                break
            count *= 2
        else:
            bad = count
            if good is not None:
                break
            count //= 2
        if time.monotonic() - started > budget:
            return steps
    if good is None or bad is None:
        return steps
    while bad / good > BISECT_UNTIL and time.monotonic() - started <= budget:
        middle = (good + bad) // 2
        if measure(middle).holds:
            good = middle
        else:
            bad = middle
    return steps


def largest_held(steps: Sequence[Step]) -> Step | None:
    held = [step for step in steps if step.holds]
    return max(held, key=lambda step: step.sessions) if held else None


# --- the benchmark ----------------------------------------------------------------------------


def run(ctx: Context, args: argparse.Namespace) -> list[Row]:
    parse_pace(args.pace)
    ours: list[Step]
    with start_daemon(["--max-sessions", "0", "--max-connections", "0"]) as daemon:
        ours = search(ctx, _own_target(daemon), args)
    theirs: list[Step] | None = None
    if args.reference:
        port = httpx.URL(args.reference).port
        pid = args.reference_pid or (listening_pid(port) if port else None)
        if pid is None:
            ctx.progress("  reference: its pid was not found; its CPU is left out")
        reference = SearchedDaemon("reference", args.reference.rstrip("/"), pid)
        theirs = search(ctx, reference, args)
    return rows_for(ctx, args, ours, theirs)


def _own_target(daemon: Daemon) -> SearchedDaemon:
    target = SearchedDaemon("this daemon", daemon.url, daemon.pid)
    return target


def _step_row(ctx: Context, label: str, step: Step) -> Row:
    cpu = step.daemon_ms_per_1k
    return Row(
        benchmark=NAME, name=f"{label}: p99 publish-to-delivery",
        params={"sessions": step.sessions, "p50_ms": round(step.p50_ms, 1),
                "events_s": round(step.events_per_s),
                "daemon_ms_per_1k_events": None if cpu is None else round(cpu, 2)},
        unit="ms", samples=[step.p99_ms], target=f"<= {P99_TARGET_MS:g} ms", ok=step.holds,
        cpu=step.cpu, cpu_note=f"over the {step.window_s:.1f} s window", quick=ctx.quick,
        notes=[describe(step)])


def rows_for(ctx: Context, args: argparse.Namespace, ours: Sequence[Step],
             theirs: Sequence[Step] | None) -> list[Row]:
    rows = [_step_row(ctx, "this daemon", step) for step in ours]
    if theirs is not None:
        rows += [_step_row(ctx, "reference", step) for step in theirs]
    best = largest_held(ours)
    ref_best = largest_held(theirs) if theirs is not None else None
    notes = [f"{args.per_session} SSE subscribers a session, pace {args.pace} chunks/s, "
             f"steps: " + ", ".join(f"{s.sessions:,} {'held' if s.holds else 'no'}"
                                    for s in ours)]
    if best is None:
        notes.append("no N held")
    else:
        notes.append(describe(best))
    if theirs is not None:
        notes.append("reference: " + (describe(ref_best) if ref_best else "no N held"))
    best_n = float(best.sessions) if best else 0.0
    rows.append(Row(
        benchmark=NAME, name="largest N LLM-paced sessions with p99 <= 100 ms",
        params={"pace": args.pace, "subscribers_a_session": args.per_session},
        unit="sessions", samples=[best_n],
        baseline=None if ref_best is None else float(ref_best.sessions),
        baseline_label="" if ref_best is None else "reference",
        ratio=None if ref_best is None or best is None else best.sessions / ref_best.sessions,
        target=f">= {SESSIONS_TARGET:,}", ok=best_n >= SESSIONS_TARGET,
        cpu=best.cpu if best else CpuUse(), cpu_note="over the window at that N",
        quick=ctx.quick, notes=notes))
    if theirs is not None and best is not None and ref_best is not None:
        common = min(best.sessions, ref_best.sessions)
        mine = max((s for s in ours if s.holds and s.sessions <= common),
                   key=lambda s: s.sessions, default=None)
        other = max((s for s in theirs if s.holds and s.sessions <= common),
                    key=lambda s: s.sessions, default=None)
        if mine and other and mine.daemon_ms_per_1k and other.daemon_ms_per_1k:
            rows.append(Row(
                benchmark=NAME, name="daemon CPU per 1,000 events, largest N both held",
                params={"sessions": mine.sessions, "reference_sessions": other.sessions},
                unit="ms", samples=[mine.daemon_ms_per_1k], baseline=other.daemon_ms_per_1k,
                baseline_label="reference", ratio=mine.daemon_ms_per_1k / other.daemon_ms_per_1k,
                cpu=mine.cpu, cpu_note="over the window", quick=ctx.quick,
                notes=[f"p99 {mine.p99_ms:.1f} ms against the reference's "
                       f"{other.p99_ms:.1f} ms"]))
    return rows
