"""The subscribers of the ``realload`` benchmark: many SSE streams, each frame's latency read.

Run as ``python -m benchmarks.realload_client`` (:class:`RealloadClients` starts it). One
process opens ``--per-session`` raw HTTP/1.1 connections to ``GET /session/{id}/events`` for
every session id it reads from ``--sessions`` (a JSON list in a file), and reads them all from
one ``selectors`` loop with :class:`benchmarks.loadgen.SSECounter` (chunked decoding, contiguous
ids, the terminal). On top of that, :class:`StampCounter` finds every stamp the mock agent's
LLM-paced turns put in their updates (``~t<ns>.<seq>~``, :mod:`daemon.mock_agent.paced`):
the stamps of a stream must number 0, 1, 2, ... and end with the turn's ``~end<n>~`` naming
how many there were; each stamp's latency is the ``CLOCK_MONOTONIC`` time of the read that
brought it less the stamp (the agent's write time; the clock is system-wide, so this works for
any daemon on this machine). Only stamps written inside the measuring window (sent on stdin
once the benchmark knows it) go into the latency histogram (:data:`BIN_NS` bins).

Protocol on stdout, one JSON object per line: ``{"ready": true}`` once every stream has its
response headers; at the end ``{"subs": [...], "hist": {bin: count}, "cpu_s": <float>}``. On
stdin: ``{"window": [t0_ns, t1_ns]}``.

Stdlib only, no trio and no JSON decoding of frames: it starts fast and its CPU per frame stays
small beside the daemon's (the benchmark reports it).
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import IO, Any
from urllib.parse import quote

from benchmarks.loadgen import RECV_BYTES, SSECounter
from daemon.mock_agent.paced import END_RE, STAMP_RE

BIN_NS = 100_000  # 0.1 ms
BINS = 100_000  # up to 10 s; slower lands in the last bin
UNTIL = b"event: turn_complete\n"


class Window:
    """The measuring window and the latency histogram every stream of the process adds to."""

    def __init__(self) -> None:
        self.t0 = -1
        self.t1 = -1
        self.hist = [0] * (BINS + 1)
        self.negative = 0


class StampCounter(SSECounter):
    """An :class:`SSECounter` that also reads the stamps of the frames it scans."""

    def __init__(self, until: bytes, window: Window) -> None:
        super().__init__(until)
        self.window = window
        self.now_ns = 0  # the CLOCK_MONOTONIC time of the read being fed
        self.stamps = 0
        self.in_window = 0
        self.stamp_error: str | None = None
        self.end_count: int | None = None
        self.max_latency_ns = 0

    def _check_ids(self, found: list[bytes], frames: bytes) -> None:
        super()._check_ids(found, frames)
        window = self.window
        t0, t1, hist, now = window.t0, window.t1, window.hist, self.now_ns
        seq = self.stamps
        inside = 0
        worst = self.max_latency_ns
        for raw_ns, raw_seq in STAMP_RE.findall(frames):
            if int(raw_seq) != seq and self.stamp_error is None:
                self.stamp_error = f"stamp {int(raw_seq)} after stamp {seq - 1}"
            seq += 1
            ns = int(raw_ns)
            if t0 <= ns < t1:
                latency = now - ns
                if latency < 0:
                    window.negative += 1
                    continue
                inside += 1
                hist[min(latency // BIN_NS, BINS)] += 1
                if latency > worst:
                    worst = latency
        self.stamps = seq
        self.in_window += inside
        self.max_latency_ns = worst
        if self.end_count is None:
            end = END_RE.search(frames)
            if end is not None:
                self.end_count = int(end.group(1))
                if self.end_count != seq and self.stamp_error is None:
                    self.stamp_error = f"the turn sent {self.end_count} stamps, {seq} arrived"


@dataclass
class Stream:
    session: int
    sock: socket.socket
    counter: StampCounter

    def report(self) -> dict[str, Any]:
        c = self.counter
        return {"session": self.session, "status": c.status, "error": c.error, "done": c.done,
                "evicted": c.evicted, "ids": c.ids, "id_error": c.id_error,
                "first_id": c.first_id, "last_id": c.last_id, "terminal_id": c.terminal_id,
                "stamps": c.stamps, "in_window": c.in_window, "stamp_error": c.stamp_error,
                "end_count": c.end_count, "max_latency_ns": c.max_latency_ns}


def _request(host: str, port: int, session: str) -> bytes:
    return (f"GET /session/{quote(session)}/events HTTP/1.1\r\nHost: {host}:{port}\r\n"
            "Accept: text/event-stream\r\nCache-Control: no-cache\r\n\r\n").encode("ascii")


def run(args: argparse.Namespace, out: IO[str]) -> dict[str, Any]:
    with open(args.sessions, encoding="utf-8") as file:
        sessions: list[str] = json.load(file)
    window = Window()
    streams: list[Stream] = []
    buf = bytearray(RECV_BYTES)
    deadline = time.monotonic() + args.timeout
    stdin_open = True
    stdin_buf = b""
    with selectors.DefaultSelector() as sel:
        sel.register(sys.stdin.buffer.fileno(), selectors.EVENT_READ, None)
        for index, session in enumerate(sessions):
            for _ in range(args.per_session):
                sock = socket.create_connection((args.host, args.port))
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.sendall(_request(args.host, args.port, session))
                sock.setblocking(False)
                stream = Stream(args.first_index + index, sock, StampCounter(UNTIL, window))
                streams.append(stream)
                sel.register(sock, selectors.EVENT_READ, stream)
        open_count = len(streams)
        announced = False
        try:
            while open_count:
                if not announced and all(s.counter.has_headers for s in streams):
                    print(json.dumps({"ready": True}), file=out, flush=True)
                    announced = True
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    for s in streams:
                        if not s.counter.finished:
                            s.counter.error = f"timed out after {args.timeout:.0f} s"
                    break
                for key, _ in sel.select(min(remaining, 1.0)):
                    stream = key.data
                    if stream is None:
                        chunk = os.read(key.fd, 4096)
                        if not chunk:
                            sel.unregister(key.fd)
                            stdin_open = False
                            continue
                        stdin_buf += chunk
                        while b"\n" in stdin_buf:
                            line, stdin_buf = stdin_buf.split(b"\n", 1)
                            if line.strip():
                                window.t0, window.t1 = json.loads(line)["window"]
                        continue
                    try:
                        length = stream.sock.recv_into(buf)
                    except BlockingIOError:
                        continue
                    except ConnectionResetError:
                        length = 0
                    counter = stream.counter
                    if length:
                        counter.now_ns = time.monotonic_ns()
                        counter.feed(buf, length)
                    else:
                        counter.eof()
                    if counter.finished:
                        sel.unregister(stream.sock)
                        stream.sock.close()
                        open_count -= 1
        finally:
            for s in streams:
                if s.sock.fileno() >= 0:
                    s.sock.close()
    del stdin_open
    times = os.times()
    return {"subs": [s.report() for s in streams],
            "hist": {str(i): n for i, n in enumerate(window.hist) if n},
            "negative": window.negative, "cpu_s": times.user + times.system}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.realload_client",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--sessions", required=True, help="a JSON file: a list of session ids")
    parser.add_argument("--first-index", type=int, default=0,
                        help="the number of the file's first session in the whole run")
    parser.add_argument("--per-session", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args(argv)
    print(json.dumps(run(args, sys.stdout)), flush=True)
    return 0


# --- the benchmark's side ------------------------------------------------------------------------


class ClientError(RuntimeError):
    """A subscriber process failed or said something unexpected."""


class RealloadClients:
    """``processes`` subscriber processes sharing ``sessions`` between them."""

    def __init__(self, host: str, port: int, sessions: Sequence[str], *, processes: int,
                 per_session: int, scratch: str, timeout: float) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.timeout = timeout
        share = -(-len(sessions) // max(1, processes))
        for part in range(processes):
            mine = list(sessions[part * share:(part + 1) * share])
            if not mine:
                continue
            path = os.path.join(scratch, f"realload-sessions-{os.getpid()}-{part}.json")
            with open(path, "w", encoding="utf-8") as file:
                json.dump(mine, file)
            self.procs.append(subprocess.Popen(
                [sys.executable, "-m", "benchmarks.realload_client", "--host", host,
                 "--port", str(port), "--sessions", path, "--first-index", str(part * share),
                 "--per-session", str(per_session), "--timeout", str(timeout)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE))

    @property
    def pids(self) -> list[int]:
        return [proc.pid for proc in self.procs]

    def _line(self, proc: subprocess.Popen[bytes], deadline: float) -> dict[str, Any]:
        assert proc.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            if not sel.select(max(0.0, deadline - time.monotonic())):
                raise ClientError(f"subscriber process {proc.pid} said nothing in time")
        line = proc.stdout.readline()
        if not line:
            proc.wait(10)
            err = proc.stderr.read().decode(errors="replace")[-3000:] if proc.stderr else ""
            raise ClientError(f"subscriber process {proc.pid} exited {proc.returncode}: {err}")
        return dict(json.loads(line))

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            line = self._line(proc, deadline)
            if not line.get("ready"):
                raise ClientError(f"subscriber process {proc.pid}: {line}")

    def send_window(self, t0_ns: int, t1_ns: int) -> None:
        for proc in self.procs:
            assert proc.stdin is not None
            proc.stdin.write(json.dumps({"window": [t0_ns, t1_ns]}).encode() + b"\n")
            proc.stdin.flush()

    def results(self) -> list[dict[str, Any]]:
        deadline = time.monotonic() + self.timeout + 30
        found = [self._line(proc, deadline) for proc in self.procs]
        for proc in self.procs:
            proc.wait(10)
        return found

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            for pipe in (proc.stdin, proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()


if __name__ == "__main__":
    sys.exit(main())
