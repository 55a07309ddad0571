"""Benchmark: what transport attacks cost the daemon, and how fast ``/health`` answers under them.

Each attack runs against a fresh daemon while ``GET /health`` is probed on fresh connections
one after another (``Connection: close``); its rows give the slowest probe during the attack
against the median of probes of the same daemon just before it (the baseline), and the peak RSS
the attack added (``VmHWM``, reset before it):

- a WebSocket ``permessage-deflate`` bomb: one frame of ~1 MiB inflating to 1 GiB (4 at once;
  quick: 64 MiB), sent although the daemon agreed to no compression;
- 60 WebSockets each sending 15 MiB of fragments of a message that never ends (quick: 12 x 2);
- with ``--http2``, 64 streams on one connection whose flow-control window stays shut, over a
  turn of 1,500 events: the time from the first eviction to the daemon closing the connection,
  against the 1 s grace period; the RSS added, against 64 stalled HTTP/1.1 readers over the same
  turn (measured in the same run);
- ``--max-connections 256``: twice the cap of connection attempts at once while the cap is
  held, peak RSS against RSS at the cap.

Targets (the issue's): RSS +5 MB and ``/health`` 100 ms under the bombs, the fragments bounded
(RSS +10 MB; their ``/health`` figure is informational), all 64
HTTP/2 streams evicted and cut within the grace (plus 0.5 s of polling and scheduling) with
RSS +10 MB, RSS within 10% of the at-cap figure for the connection flood. Linux only.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from benchmarks.attack_clients import (
    OP_BINARY,
    OP_CONTINUATION,
    OP_TEXT,
    ZeroWindowClient,
    deflate_bomb,
    frame,
    handshake,
    health_latency_ms,
    read_close,
    reset_peak_rss,
    rss_kib,
)
from benchmarks.harness import Context, CpuUse, Row, process_cpu_seconds
from benchmarks.launcher import Daemon, start_daemon
from daemon.streams import EVICTED_WRITE_GRACE_S

NAME = "attacks"
TITLE = "transport attacks: RSS added and /health latency (WebSocket bombs, HTTP/2, floods)"

MIB = 1024 * 1024
HEALTH_TARGET_MS = 100.0
WS_RSS_TARGET_KIB = 5 * 1024
FRAGMENTS_RSS_TARGET_KIB = 10 * 1024
H2_RSS_TARGET_KIB = 10 * 1024
CUT_TARGET_MS = EVICTED_WRITE_GRACE_S * 1000 + 500
TURN = "mock:chunks=1500 mock:bytes=900 mock:delay_ms=0"
CONNECTION_CAP = 256


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bomb-mib", type=int, default=None,
                        help="what each bomb inflates to, MiB (default 1024; quick 64)")


def _idle_health(daemon: Daemon, n: int = 30) -> float:
    return statistics.median(health_latency_ms(daemon.url) for _ in range(n))


@contextmanager
def _probing(daemon: Daemon) -> Iterator[list[float]]:
    """Probe /health one after another while the block runs, from a process of its own (the
    attack's threads would otherwise delay the probe here); yields the latencies (ms), filled
    in once the block has run."""
    seen: list[float] = []
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.attack_clients", "probe",
                             daemon.url], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None
        proc.stdout.readline()  # its first answer, before the attack: the prober is up
        yield seen
    finally:
        out, _ = proc.communicate("", timeout=60)
    if proc.returncode != 0:
        raise RuntimeError(f"the /health prober failed (exit {proc.returncode})")
    seen.extend(float(line) for line in out.split())


def _in_threads(count: int, work: Callable[[], Any]) -> list[Any]:
    out: list[Any] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            out.append(work())
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, daemon=True) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    if errors:
        raise RuntimeError(f"attack failed: {errors[0]!r}")
    return out


def _attack_row(ctx: Context, name: str, params: dict[str, Any], daemon: Daemon,
                attack: Callable[[], object], rss_target_kib: int = WS_RSS_TARGET_KIB,
                health_target: bool = True) -> Row:
    idle = _idle_health(daemon)
    base = rss_kib(daemon.pid)
    reset_peak_rss(daemon.pid)
    with _probing(daemon) as latencies:
        cpu0 = process_cpu_seconds(daemon.pid) or 0.0
        attack()
        cpu = ((process_cpu_seconds(daemon.pid) or 0.0) - cpu0) * 1000
    peak = rss_kib(daemon.pid, "VmHWM") - base
    worst = max(latencies) if latencies else float("nan")
    row = Row(benchmark=NAME, name=name, params=params, unit="ms", samples=[worst],
              quick=ctx.quick, cpu=CpuUse(daemon_ms=cpu), cpu_note="daemon, whole attack")
    row.baseline, row.baseline_label = idle, "idle /health median"
    row.ratio = worst / idle if idle else None
    rss_target = f"RSS +<= {rss_target_kib // 1024} MB"
    row.target = f"/health <= {HEALTH_TARGET_MS:g} ms, {rss_target}" if health_target \
        else rss_target
    row.ok = peak <= rss_target_kib and (worst <= HEALTH_TARGET_MS or not health_target)
    row.notes.append(f"slowest /health of {len(latencies)} during the attack; peak RSS "
                     f"+{peak / 1024:.1f} MiB")
    return row


def _ws_bomb_rows(ctx: Context, bomb_mib: int) -> list[Row]:
    ctx.progress(f"building a deflate bomb inflating to {bomb_mib} MiB")
    bomb = deflate_bomb(bomb_mib * MIB)
    rows = []
    with start_daemon(persistence=False) as daemon:
        session_id, _ = daemon.create_session()
        for count in (1, 4):
            def attack(count: int = count) -> list[int | None]:
                def one() -> int | None:
                    sock, head = handshake(daemon.url, f"/session/{session_id}/ws",
                                           extensions="permessage-deflate")
                    with sock:
                        if b"sec-websocket-extensions" in head.lower():
                            raise RuntimeError("the daemon agreed to permessage-deflate")
                        try:
                            sock.sendall(frame(OP_BINARY, bomb, rsv1=True))
                        except OSError:
                            pass  # closed at the frame's header
                        return read_close(sock)
                return _in_threads(count, one)

            ctx.progress(f"{count} deflate bomb(s) at once")
            rows.append(_attack_row(
                ctx, f"WebSocket deflate bomb x{count}",
                {"inflates_to_mib": bomb_mib, "frame_kib": len(bomb) // 1024, "at_once": count},
                daemon, attack))
    return rows


def _ws_fragment_row(ctx: Context) -> Row:
    connections, each_mib = ctx.pick((60, 15), (12, 2))
    piece = 64 * 1024

    with start_daemon(persistence=False) as daemon:
        session_id, _ = daemon.create_session()

        def one() -> int | None:
            sock, _ = handshake(daemon.url, f"/session/{session_id}/ws")
            with sock:
                try:
                    sock.sendall(frame(OP_TEXT, b"a" * piece, fin=False))
                    for _ in range(each_mib * MIB // piece - 1):
                        sock.sendall(frame(OP_CONTINUATION, b"a" * piece, fin=False))
                except OSError:
                    pass  # closed at the cap
                return read_close(sock)

        ctx.progress(f"{connections} WebSockets x {each_mib} MiB of unfinished fragments")
        # The issue asks these to be bounded and released; its latency target is the bomb's.
        return _attack_row(ctx, "WebSocket fragments never finished",
                           {"connections": connections, "mib_each": each_mib}, daemon,
                           lambda: _in_threads(connections, one),
                           rss_target_kib=FRAGMENTS_RSS_TARGET_KIB, health_target=False)


def _turn(daemon: Daemon, session_id: str) -> None:
    daemon.prompt(session_id, TURN)
    daemon.wait_idle(session_id)


def _stalled_h11_readers(daemon: Daemon, session_id: str, count: int) -> list[socket.socket]:
    socks = []
    for _ in range(count):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.settimeout(30)
        sock.connect(daemon.host_port)
        sock.sendall(f"GET /session/{session_id}/events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
                     .encode())
        head = b""
        while b"\r\n\r\n" not in head:
            head += sock.recv(1)
        socks.append(sock)
    return socks


def _evicted_and_gone(daemon: Daemon, session_id: str, streams: int,
                      gone: Callable[[], bool]) -> tuple[float, int]:
    """Run turns until ``streams`` readers are evicted; (ms from the first eviction to
    ``gone()``, peak RSS KiB added)."""
    base = rss_kib(daemon.pid)
    reset_peak_rss(daemon.pid)
    daemon.prompt(session_id, TURN)
    first: float | None = None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        status = daemon.status(session_id)
        if first is None and int(status["clientsEvicted"]) > 0:
            first = time.monotonic()
        if int(status["subscribers"]) == 0 and gone():
            break
        if not status["hasActivePrompt"] and not status["pendingPrompts"] and first is None:
            daemon.prompt(session_id, TURN)
        time.sleep(0.01)
    else:
        raise RuntimeError("the stalled readers were not evicted and cut")
    daemon.wait_idle(session_id)
    if first is None:
        raise RuntimeError("no eviction seen")
    return (time.monotonic() - first) * 1000, rss_kib(daemon.pid, "VmHWM") - base


def _h2_rows(ctx: Context) -> list[Row]:
    streams = 64
    with start_daemon(["--http2"], persistence=False) as daemon:
        session_id, _ = daemon.create_session()
        for _ in range(6):  # the ring's steady state first
            _turn(daemon, session_id)
        ctx.progress("64 stalled HTTP/1.1 readers (the baseline)")
        socks = _stalled_h11_readers(daemon, session_id, streams)
        try:
            _, h11_kib = _evicted_and_gone(daemon, session_id, streams, lambda: True)
        finally:
            for sock in socks:
                sock.close()
        ctx.progress("64 zero-window HTTP/2 streams on one connection")
        attacker = ZeroWindowClient(daemon.url)
        try:
            for _ in range(streams):
                attacker.get(f"/session/{session_id}/events")
            deadline = time.monotonic() + 30
            while len(attacker.statuses) < streams and time.monotonic() < deadline:
                time.sleep(0.01)
            h2_ms, h2_kib = _evicted_and_gone(daemon, session_id, streams,
                                              attacker.ended.is_set)
            if attacker.body_bytes:
                raise RuntimeError(f"{attacker.body_bytes} body bytes past a zero window")
        finally:
            attacker.close()
    cut = Row(benchmark=NAME, name="HTTP/2 zero-window streams: first eviction -> cut",
              params={"streams": streams}, unit="ms", samples=[h2_ms], quick=ctx.quick)
    cut.baseline, cut.baseline_label = EVICTED_WRITE_GRACE_S * 1000, "grace period"
    cut.ratio = h2_ms / cut.baseline
    cut.target = f"<= {CUT_TARGET_MS:g} ms"
    cut.ok = h2_ms <= CUT_TARGET_MS
    rss = Row(benchmark=NAME, name="HTTP/2 zero-window streams: peak RSS added over the turn",
              params={"streams": streams}, unit="MiB", samples=[h2_kib / 1024],
              quick=ctx.quick)
    rss.baseline, rss.baseline_label = h11_kib / 1024, "64 stalled HTTP/1.1 readers"
    rss.ratio = h2_kib / h11_kib if h11_kib > 0 else None
    rss.target = f"+<= {H2_RSS_TARGET_KIB // 1024} MB"
    rss.ok = h2_kib <= H2_RSS_TARGET_KIB
    return [cut, rss]


def _connection_flood_row(ctx: Context) -> Row:
    cap = ctx.pick(CONNECTION_CAP, 64)
    with start_daemon(["--max-connections", str(cap)], persistence=False) as daemon:
        # The benchmark's own keep-alive client holds one slot; idle connections the rest.
        daemon.get_json("/daemon/status")
        held = []
        try:
            for _ in range(cap - 1):
                sock = socket.create_connection(daemon.host_port, timeout=30)
                sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                sock.recv(4096)
                held.append(sock)
            status = daemon.get_json("/daemon/status")
            if status["connections"]["open"] != cap:
                raise RuntimeError(f"not at the cap: {status['connections']}")
            idle = _idle_health(daemon)
            at_cap = rss_kib(daemon.pid)
            reset_peak_rss(daemon.pid)

            def attempt() -> bytes:
                with socket.create_connection(daemon.host_port, timeout=30) as sock:
                    sock.sendall(b"GET /capabilities HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                    data = b""
                    try:
                        while chunk := sock.recv(65536):
                            data += chunk
                    except ConnectionResetError:
                        pass
                    return data

            ctx.progress(f"{2 * cap} connection attempts at once at a cap of {cap}")
            with _probing(daemon) as latencies:
                cpu0 = process_cpu_seconds(daemon.pid) or 0.0
                answers = _in_threads(2 * cap, attempt)
                cpu = ((process_cpu_seconds(daemon.pid) or 0.0) - cpu0) * 1000
            peak = rss_kib(daemon.pid, "VmHWM")
            served = sum(1 for a in answers if a.startswith(b"HTTP/1.1 200"))
        finally:
            for sock in held:
                sock.close()
    row = Row(benchmark=NAME, name="--max-connections: 2x the cap attempted at once",
              params={"cap": cap, "attempts": 2 * cap}, unit="%", quick=ctx.quick,
              samples=[(peak / at_cap - 1) * 100], cpu=CpuUse(daemon_ms=cpu),
              cpu_note="daemon, whole attack")
    row.baseline, row.baseline_label = at_cap / 1024, "RSS at the cap (MiB)"
    row.target = "peak RSS <= +10% of the at-cap figure, none served, /health answers"
    row.ok = peak <= at_cap * 1.10 and served == 0
    worst = max(latencies) if latencies else float("nan")
    row.notes.append(f"served {served} of {2 * cap}; slowest /health {worst:.1f} ms of "
                     f"{len(latencies)} (idle median {idle:.1f} ms)")
    return row


def run(ctx: Context, args: argparse.Namespace) -> list[Row]:
    bomb_mib = args.bomb_mib or ctx.pick(1024, 64)
    rows = _ws_bomb_rows(ctx, bomb_mib)
    rows.append(_ws_fragment_row(ctx))
    rows += _h2_rows(ctx)
    rows.append(_connection_flood_row(ctx))
    return rows
