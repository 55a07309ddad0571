"""Benchmark 2: load snapshot latency, in-process and over HTTP.

Sessions are filled by real turns of the bundled mock agent. A gated turn
(``mock:chunks=N mock:bytes=B mock:gate=G``) stays open while it is loaded, so its live journal
is what the load returns; the replay window is filled by completed turns first.

- *small*: one completed 3-chunk turn.
- *journal k MiB* (k = 1, 2, 4, 8): an open turn of 2 KiB chunks whose live journal holds about
  k MiB (the 8 MiB one is over the cap, so the journal is full and has evicted entries).
- *full caps*: a 4 MiB replay window (five completed ~1 MB turns) plus a full 8 MiB live journal.

Loads are ``POST /session/{id}/load`` with ``{}`` (memory replay) over one keep-alive httpx
client, interleaved round by round so machine noise hits every size alike.

Baselines, measured in the same run with the same client:

- the small load against ``GET /health`` on the same daemon: the smallest round trip through
  the daemon's HTTP stack, so the ratio is what the load itself adds;
- every large load against the same number of bytes fetched from a trivial static HTTP server
  (its own process, writing a pre-built response): the floor for moving and parsing that many
  bytes over loopback, so the ratio is the daemon's overhead over just delivering the bytes.

In-process: the same events are published into a :class:`daemon.bus.SessionBus` in this process
and ``SessionBus.load_snapshot`` plus the body encode (as the HTTP route does it) is timed, with
``b"".join`` of the same snapshot bytes as the baseline (one copy of the data).
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
import uuid
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass, field
from typing import Any

import httpx

from benchmarks.harness import MIB, Context, CpuMeter, CpuUse, Row, StaticByteServer
from benchmarks.launcher import Daemon, gate_name, start_daemon
from sdk.protocol.events import SessionUpdateData, TurnCompleteData

NAME = "load_latency"
TITLE = "load snapshot latency (full live journal and replay window), in-process and HTTP"

SMALL_TARGET_MS = 2.3
JOURNAL_8_STATIC_RATIO = 2.0  # full 8 MiB journal load over the same bytes served statically
LINEARITY_TARGET = 1.5  # cost per MB above the floor, largest size over the second
MIN_MS_PER_MB = 0.01

PAD_BYTES = 2048
# Envelope bytes around a mock chunk's text (ids, UUIDs, timestamps); only sizes the fill.
EVENT_OVERHEAD = 380
WINDOW_TURNS = 5
WINDOW_TURN_CHUNKS = 1000
WINDOW_TURN_PAD = 1000


@dataclass
class Target:
    """One thing loaded repeatedly: a session (or /health, or the static server)."""

    label: str
    fetch: Callable[[], int]  # one request; returns the response body size
    samples: list[float] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    cpu: CpuUse = field(default_factory=CpuUse)
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def p50_ms(self) -> float:
        return statistics.median(self.samples) * 1000

    @property
    def size(self) -> int:
        return self.sizes[-1] if self.sizes else 0


def chunks_for(mib: float) -> int:
    return math.ceil(mib * MIB / (PAD_BYTES + EVENT_OVERHEAD))


def open_turn(daemon: Daemon, session_id: str, client_id: str, chunks: int, pad: int) -> str:
    """Start a gated turn and wait until the daemon has published every chunk; returns the
    gate name (touch it to let the turn end)."""
    gate = gate_name()
    accepted = daemon.prompt(session_id, f"mock:chunks={chunks} mock:bytes={pad} mock:gate={gate}",
                             client_id)
    # The echo, then every chunk.
    daemon.wait_ingested(session_id, int(accepted["lastEventId"]) + 1 + chunks)
    return gate


def session_info(daemon: Daemon, session_id: str) -> dict[str, Any]:
    """The session's live-journal entries and bytes (from its own status, found however many
    sessions the daemon holds) and its replay window's bytes. Only ``GET /daemon/status`` has
    the window's size, and it lists at most 50 live sessions, the most recently loaded first:
    the session was loaded last (this is called once it is filled), so it leads that list."""
    journal = daemon.get_json(f"/session/{session_id}/status")["journal"]
    listed = daemon.get_json("/daemon/status")["sessions"]
    first = listed[0] if listed else {}
    if first.get("sessionId") != session_id:
        raise RuntimeError(f"session {session_id} is not the most recently loaded one in "
                           f"GET /daemon/status (first listed: {first.get('sessionId')})")
    return {"journalEntries": journal["entries"], "journalBytes": journal["bytes"],
            "replayWindowBytes": first["replayWindowBytes"]}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sizes", default=None,
                        help="live-journal sizes in MiB, comma-separated (default 1,2,4,8; "
                             "quick 0.25,0.5,1,2)")
    parser.add_argument("--loads", type=int, default=None,
                        help="loads per target (default 30; quick 5)")


def _loader(http: httpx.Client, path: str, method: str = "POST") -> Callable[[], int]:
    def fetch() -> int:
        response = http.post(path, json={}) if method == "POST" else http.get(path)
        if response.status_code != 200:
            raise RuntimeError(f"{method} {path} answered {response.status_code}: "
                               f"{response.text[:300]}")
        return len(response.content)

    return fetch


def run(ctx: Context, args: argparse.Namespace) -> list[Row]:
    sizes = [float(s) for s in (args.sizes or ctx.pick("1,2,4,8", "0.25,0.5,1,2")).split(",")]
    rounds = args.loads or ctx.trials(30, 5)
    journal_cap = max(sizes)
    window_cap_mib = journal_cap / 2
    caps = ["--max-journal-bytes", str(int(journal_cap * MIB)),
            "--compacted-replay-max-bytes", str(int(window_cap_mib * MIB))]
    window_turns = WINDOW_TURNS
    gates: list[str] = []
    ctx.progress(f"starting daemon (journal cap {journal_cap:g} MiB, window cap "
                 f"{window_cap_mib:g} MiB)")
    with closing(StaticByteServer()) as static, start_daemon(caps) as daemon, \
            httpx.Client(timeout=120) as static_http:
        targets: list[Target] = [Target("health", _loader(daemon.http, "/health", "GET"))]
        sid, cid = daemon.create_session()
        daemon.prompt(sid, "mock:chunks=3 mock:delay_ms=0", cid)
        daemon.wait_idle(sid)
        targets.append(Target("small", _loader(daemon.http, f"/session/{sid}/load")))
        for mib in sizes:
            # The largest size runs past the cap, so that journal is full and has evicted.
            chunks = chunks_for(mib * (1.1 if mib == journal_cap else 1.0))
            ctx.progress(f"filling a {mib:g} MiB live journal ({chunks:,} chunks of "
                         f"{PAD_BYTES} B, turn held open)")
            sid, cid = daemon.create_session()
            gates.append(open_turn(daemon, sid, cid, chunks, PAD_BYTES))
            targets.append(Target(f"journal {mib:g} MiB",
                                  _loader(daemon.http, f"/session/{sid}/load"),
                                  info=session_info(daemon, sid) | {"mib": mib}))
        ctx.progress(f"filling the full-caps session: {window_turns} completed turns, then a "
                     f"full live journal")
        sid, cid = daemon.create_session()
        window_pad = int(WINDOW_TURN_PAD * window_cap_mib / 4)
        for _ in range(window_turns):
            daemon.prompt(sid, f"mock:chunks={WINDOW_TURN_CHUNKS} mock:bytes={window_pad} "
                               "mock:delay_ms=0", cid)
            daemon.wait_idle(sid)
        gates.append(open_turn(daemon, sid, cid, chunks_for(journal_cap * 1.1), PAD_BYTES))
        targets.append(Target("full caps", _loader(daemon.http, f"/session/{sid}/load"),
                              info=session_info(daemon, sid)))
        # One unmeasured round warms every path and learns each response size.
        for target in targets:
            target.sizes.append(target.fetch())
        statics = [Target(f"static {target.label}",
                          _loader(static_http, f"{static.url}/bytes/{target.size}", "GET"))
                   for target in targets[1:]]
        for target in statics:
            target.sizes.append(target.fetch())
        targets.extend(statics)
        meter = CpuMeter(daemon.pid, daemon.agent_pids())
        ctx.progress(f"{rounds} interleaved rounds over {len(targets)} targets")
        for _ in range(rounds):
            for target in targets:
                meter.start()
                start = time.perf_counter()
                target.sizes.append(target.fetch())
                target.samples.append(time.perf_counter() - start)
                target.cpu = target.cpu + meter.stop()
        for target in targets:
            target.cpu = target.cpu.scaled(1 / rounds)
        for gate in gates:
            daemon.open_gate(gate)
    ctx.progress("in-process snapshots")
    in_process = measure_in_process(journal_cap, window_cap_mib, window_turns, window_pad,
                                    rounds)
    return rows_for(ctx, targets, sizes, journal_cap, in_process)


def rows_for(ctx: Context, targets: list[Target], sizes: list[float], journal_cap: float,
             in_process: list[Row]) -> list[Row]:
    by_label = {t.label: t for t in targets}
    health = by_label["health"]
    rows: list[Row] = []

    def http_row(target: Target, name: str, baseline: Target, baseline_label: str) -> Row:
        row = Row(benchmark=NAME, name=name,
                  params={"response_MB": round(target.size / 1e6, 3)},
                  unit="ms", samples=[s * 1000 for s in target.samples], cpu=target.cpu,
                  cpu_note="per load", quick=ctx.quick)
        row.baseline, row.baseline_label = baseline.p50_ms, baseline_label
        row.ratio = (row.value or 0.0) / row.baseline if row.baseline else None
        return row

    small = http_row(by_label["small"], "load p50, small session (HTTP)", health, "GET /health")
    small.target, small.ok = f"<= {SMALL_TARGET_MS} ms", (small.value or 0) <= SMALL_TARGET_MS
    small.notes.append(f"the same bytes from the static server take "
                       f"{by_label['static small'].p50_ms:.2f} ms (client + loopback floor); "
                       "GET /health is the daemon's own floor")
    rows.append(small)
    points: list[tuple[int, float]] = []
    for mib in sizes:
        target = by_label[f"journal {mib:g} MiB"]
        row = http_row(target, f"load p50, live journal {mib:g} MiB (HTTP)",
                       by_label[f"static {target.label}"], "static same bytes")
        row.params = {"journal_MiB": round(target.info["journalBytes"] / MIB, 2),
                      "entries": target.info["journalEntries"], **row.params}
        if mib == journal_cap:
            row.name = f"load p50, full live journal {mib:g} MiB (HTTP)"
            row.notes.append("reference daemon: 40 ms for a full 8 MiB journal "
                             "(7.3 MB response)")
            if journal_cap == 8:
                row.target = f"<= {JOURNAL_8_STATIC_RATIO:g}x static"
                row.ok = row.ratio is not None and row.ratio <= JOURNAL_8_STATIC_RATIO
            else:
                row.notes.append("quick sizes: the 8 MiB target applies to the full run")
        rows.append(row)
        points.append((target.size, row.value or 0.0))
    full = by_label["full caps"]
    row = http_row(full, f"load p50, full caps: {journal_cap:g} MiB journal + "
                   f"{journal_cap / 2:g} MiB window (HTTP)",
                   by_label["static full caps"], "static same bytes")
    row.params = {"journal_MiB": round(full.info["journalBytes"] / MIB, 2),
                  "window_MiB": round(full.info["replayWindowBytes"] / MIB, 2), **row.params}
    row.notes.append("reference daemon: 40 ms for a full 8 MiB journal (7.3 MB response)")
    rows.append(row)
    rows.append(linearity_row(ctx, points, by_label["small"].p50_ms,
                              [by_label[f"journal {m:g} MiB"].cpu for m in sizes]))
    rows.extend(in_process)
    return rows


def linearity_row(ctx: Context, points: list[tuple[int, float]], floor_ms: float,
                  cpus: list[CpuUse]) -> Row:
    """Cost per MB above the small-load floor, at the largest size over the second smallest:
    about 1 when the cost grows linearly with the bytes returned, above 1 when it grows faster
    (the floor is the fixed cost of any load, so it is taken out first)."""
    points = sorted(points)
    (b_ref, t_ref), (b_top, t_top) = points[min(1, len(points) - 1)], points[-1]
    per_mb_ref = (t_ref - floor_ms) / (b_ref / 1e6)
    per_mb_top = (t_top - floor_ms) / (b_top / 1e6)
    row = Row(benchmark=NAME, name="load cost growth: ms per MB, largest vs second size",
              params={"sizes_MB": "/".join(f"{b / 1e6:.1f}" for b, _ in points)},
              unit="x", samples=[per_mb_top / max(per_mb_ref, MIN_MS_PER_MB)],
              baseline=per_mb_ref, baseline_label=f"ms/MB at {b_ref / 1e6:.1f} MB",
              quick=ctx.quick, target=f"<= {LINEARITY_TARGET}x (linear)",
              cpu_note="per load, average")
    row.ok = (row.value or 0.0) <= LINEARITY_TARGET
    if per_mb_ref < MIN_MS_PER_MB:
        row.notes.append(f"the {b_ref / 1e6:.1f} MB load cost no more than the small one: noise")
    total = CpuUse()
    for cpu in cpus:
        total = total + cpu
    row.cpu = total.scaled(1 / max(1, len(cpus)))
    row.notes.append(f"p50 ms by response MB (small-load floor {floor_ms:.1f} ms): " + ", ".join(
        f"{b / 1e6:.2f} MB -> {t:.1f} ms" for b, t in points)
        + f"; {per_mb_top:.2f} ms/MB at the largest, {per_mb_ref:.2f} ms/MB at the second")
    return row


# --- in-process ------------------------------------------------------------------------------


def _chunk_update(text: str) -> dict[str, Any]:
    return {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}


def _publish_turn(bus: Any, session_id: str, chunks: int, pad: int, finish: bool) -> None:
    prompt_id = str(uuid.uuid4())
    client_id = f"client_{uuid.uuid4()}"
    bus.active_prompt_id = prompt_id
    bus.publish(SessionUpdateData(session_id=session_id, update={
        "sessionUpdate": "user_message_chunk", "content": {"type": "text", "text": "bench"},
        "_meta": {"serverTimestamp": 0, "source": "bridge-echo"}}),
        prompt_id=prompt_id, originator_client_id=client_id)
    for i in range(chunks):
        bus.publish(SessionUpdateData(session_id=session_id,
                                      update=_chunk_update(f"chunk-{i}".ljust(pad, "."))),
                    prompt_id=prompt_id, originator_client_id=client_id, flush=False)
    bus.flush()
    if finish:
        bus.publish_terminal(
            TurnCompleteData(session_id=session_id, stop_reason="end_turn", prompt_id=prompt_id),
            prompt_id=prompt_id, originator_client_id=client_id, ledger_terminal="completed",
            stop_reason="end_turn")
        bus.active_prompt_id = None


def _load_body(snapshot: Any) -> list[bytes]:
    """The load route's body, as ``daemon.http_api`` builds it: the writes that send it."""
    from daemon.http_api import spliced_body
    from sdk.protocol.http import LoadSessionResponse

    return spliced_body(LoadSessionResponse[bytes](
        session_id="s", workspace_cwd="/w", attached=True, client_id="c", created_at="t",
        state={}, has_active_prompt=True, has_running_background_tasks=False,
        last_event_id=snapshot.last_event_id, event_epoch=snapshot.epoch,
        live_journal=snapshot.live, compacted_replay=snapshot.compacted))


def measure_in_process(journal_mib: float, window_mib: float, window_turns: int,
                       window_pad: int, trials: int) -> list[Row]:
    """Time ``SessionBus.load_snapshot`` + the body encode on buses filled like the HTTP ones."""
    from daemon.bus import BusLimits, SessionBus

    limits = BusLimits(10_000, int(journal_mib * MIB), int(window_mib * MIB), 8000)
    rows: list[Row] = []
    for label, with_window in (("journal alone", False), ("journal + window", True)):
        bus = SessionBus(str(uuid.uuid4()), limits, None)
        if with_window:
            for _ in range(window_turns):
                _publish_turn(bus, bus.session_id, WINDOW_TURN_CHUNKS, window_pad, True)
        _publish_turn(bus, bus.session_id, chunks_for(journal_mib * 1.1), PAD_BYTES, False)
        snap_times: list[float] = []
        copy_times: list[float] = []
        size = 0
        for _ in range(max(trials, 3)):
            start = time.perf_counter()
            writes = _load_body(bus.load_snapshot("full"))
            snap_times.append(time.perf_counter() - start)
            size = sum(map(len, writes))
            snapshot = bus.load_snapshot("full")
            compacted = [item for item in snapshot.compacted if isinstance(item, bytes)]
            assert len(compacted) == len(snapshot.compacted)  # no transcript: nothing spilled
            start = time.perf_counter()
            b"".join((b"".join(compacted), b"".join(snapshot.live)))
            copy_times.append(time.perf_counter() - start)
        window = f" + {window_mib:g} MiB window" if with_window else ""
        row = Row(benchmark=NAME,
                  name=f"snapshot + encode in-process, {journal_mib:g} MiB journal{window}",
                  params={"body_MB": round(size / 1e6, 3),
                          "journal_MiB": round(bus.journals.full.total_bytes / MIB, 2)},
                  unit="ms", samples=[t * 1000 for t in snap_times],
                  baseline=statistics.median(copy_times) * 1000,
                  baseline_label="join-copy of the bytes", cpu_note="in-process",
                  notes=[] if label == "journal alone" else [
                      "SessionBus.load_snapshot + the load route's body encode, no HTTP; a "
                      "body this big is written part by part from the envelopes' own bytes, "
                      "so it can cost less than the join-copy"])
        if row.baseline:
            row.ratio = (row.value or 0.0) / row.baseline
        rows.append(row)
    return rows
