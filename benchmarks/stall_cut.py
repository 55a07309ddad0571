"""Benchmark: how long a stalled peer keeps its connection (and descriptor) in the daemon.

Two rows, both against one daemon started with ``--body-timeout-ms 1000``:

- a stalled SSE subscriber (a raw socket with a 4 KiB receive buffer that never reads,
  ``maxQueued=2048``) is evicted once a few turns filled its buffers; the figure is the time
  from the eviction (``clientsEvicted`` in the session status) to the daemon closing the
  connection's descriptor. Baseline: the grace period a stalled write is given after the
  eviction (1 s), so the ratio is the overhead of the cut itself.
- a request that sends its headers with ``Content-Length: 1000`` and never its body; the figure
  is the time from sending the headers to the daemon's 408 and EOF. Baseline: the configured
  body timeout.

Both are polled from outside (status every 10 ms, the daemon's ``/proc/<pid>/fd``), so figures
carry ~10-20 ms of polling resolution. Linux only (``/proc``).
"""

from __future__ import annotations

import argparse
import os
import socket
import time

from benchmarks.harness import Context, Row
from benchmarks.launcher import Daemon, start_daemon
from daemon.streams import EVICTED_WRITE_GRACE_S

NAME = "stall_cut"
TITLE = "stalled peers: eviction -> cut, and a body that never arrives -> 408 + close"

BODY_TIMEOUT_MS = 1000
TURN = "mock:chunks=1500 mock:bytes=900 mock:delay_ms=0"
CUT_TARGET_MS = 1500.0
BODY_TARGET_RATIO = 1.5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cuts", type=int, default=None, help="stalled subscribers (default 8)")
    parser.add_argument("--bodies", type=int, default=None, help="slow bodies (default 8)")


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _connect(daemon: Daemon, rcvbuf: int | None = None) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(30)
    sock.connect(daemon.host_port)
    return sock


def _wait(pred: object, timeout: float, what: str) -> float:
    deadline = time.monotonic() + timeout
    while not pred():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.01)
    return time.monotonic()


def _one_cut(daemon: Daemon, session_id: str) -> float:
    before = _fds(daemon.pid)
    evicted = int(daemon.status(session_id)["clientsEvicted"])
    sock = _connect(daemon, rcvbuf=4096)
    try:
        sock.sendall(f"GET /session/{session_id}/events?maxQueued=2048 HTTP/1.1\r\n"
                     "Host: 127.0.0.1\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            head += sock.recv(1024)
        for _ in range(12):
            daemon.prompt(session_id, TURN)
            # Poll the eviction while the turn streams: its moment is the start of the figure.
            t_evicted = None
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                status = daemon.status(session_id)
                if int(status["clientsEvicted"]) > evicted:
                    t_evicted = time.monotonic()
                    break
                if not status["hasActivePrompt"] and not status["pendingPrompts"]:
                    break
                time.sleep(0.01)
            if t_evicted is not None:
                t_cut = _wait(lambda: _fds(daemon.pid) <= before, 30, "the cut")
                daemon.wait_idle(session_id)
                return (t_cut - t_evicted) * 1000
        raise RuntimeError("the stalled subscriber was never evicted")
    finally:
        sock.close()


def _one_slow_body(daemon: Daemon) -> float:
    sock = _connect(daemon)
    try:
        start = time.monotonic()
        sock.sendall(b"POST /session HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
        if not data.startswith(b"HTTP/1.1 408"):
            raise RuntimeError(f"expected a 408, got {data[:100]!r}")
        return (time.monotonic() - start) * 1000
    finally:
        sock.close()


def run(ctx: Context, args: argparse.Namespace) -> list[Row]:
    cuts = args.cuts or ctx.trials(8, 2)
    bodies = args.bodies or ctx.trials(8, 2)
    with start_daemon(["--body-timeout-ms", str(BODY_TIMEOUT_MS)], persistence=False) as daemon:
        session_id, _client = daemon.create_session()
        daemon.prompt(session_id, "warm-up mock:chunks=1")
        daemon.wait_idle(session_id)
        cut_ms: list[float] = []
        for i in range(cuts):
            ctx.progress(f"stalled subscriber {i + 1}/{cuts}")
            cut_ms.append(_one_cut(daemon, session_id))
        body_ms: list[float] = []
        for i in range(bodies):
            ctx.progress(f"slow body {i + 1}/{bodies}")
            body_ms.append(_one_slow_body(daemon))
    grace_ms = EVICTED_WRITE_GRACE_S * 1000
    cut = Row(benchmark=NAME, name="stalled subscriber: eviction -> connection closed",
              params={"cuts": cuts, "maxQueued": 2048, "rcvbuf": 4096}, unit="ms",
              samples=cut_ms, quick=ctx.quick)
    cut.baseline, cut.baseline_label = grace_ms, "grace period"
    cut.ratio = (cut.value or 0.0) / grace_ms
    cut.target = f"<= {CUT_TARGET_MS:g} ms"
    cut.ok = (cut.value or 0.0) <= CUT_TARGET_MS
    body = Row(benchmark=NAME, name="body never sent: headers -> 408 and EOF",
               params={"requests": bodies, "Content-Length": 1000}, unit="ms",
               samples=body_ms, quick=ctx.quick)
    body.baseline, body.baseline_label = float(BODY_TIMEOUT_MS), "--body-timeout-ms"
    body.ratio = (body.value or 0.0) / BODY_TIMEOUT_MS
    body.target = f"<= {BODY_TARGET_RATIO:g}x the timeout"
    body.ok = body.ratio <= BODY_TARGET_RATIO
    return [cut, body]
