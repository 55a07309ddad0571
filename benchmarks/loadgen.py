"""The load-generating SSE client: one separate process serving every subscriber.

Run as ``python -m benchmarks.loadgen`` (a benchmark starts it through :class:`LoadGen`). It
opens ``--subscribers`` raw HTTP/1.1 connections to ``GET /session/{id}/events``, decodes the
chunked transfer encoding and counts frames by scanning for the blank-line separator ``\\n\\n``;
it never decodes JSON, so one process keeps up with many subscribers and its own CPU stays
small beside the daemon's. A subscriber is done when it sees ``event: <until>``, is evicted
(``event: client_evicted``) or its stream ends.

Protocol on stdout, one JSON object per line:

* ``{"ready": true, "t": <monotonic>}`` once every subscriber has its response headers (only
  with ``--announce-ready``; the benchmark sends its prompt after this line);
* ``{"rounds": [[<subscriber>, ...], ...], "cpu_s": <float>}`` at the end, where a subscriber is
  ``{"status", "frames", "bytes", "t_start", "t_headers", "t_done", "done", "evicted", "error"}``
  and times are ``time.monotonic()`` values (CLOCK_MONOTONIC is system-wide, so the benchmark
  compares them with its own clock).

Stdlib only, no trio: it starts fast and measures only itself.
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
from dataclasses import dataclass, field
from typing import IO, Any
from urllib.parse import quote

RECV_BYTES = 1 << 20
EVICTED = b"event: client_evicted\n"
MARKER_WINDOW = 16 * 1024


def _cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


class SSECounter:
    """Counts SSE frames in an HTTP/1.1 response, fed raw socket bytes. Pure."""

    def __init__(self, until: bytes) -> None:
        self.markers = (until, EVICTED)
        self._seam = max(len(m) for m in self.markers) - 1
        self.status: int | None = None
        self.error: str | None = None
        self.frames = 0
        self.bytes = 0
        self.done = False
        self.evicted = False
        self.ended = False
        self._head = b""
        self._chunked = False
        self._left = 0  # data bytes left in the current chunk
        self._skip = 0  # CRLF after a chunk's data still to skip
        self._partial = b""  # an incomplete chunk-size line
        self._last_newline = False
        self._tail = b""

    @property
    def has_headers(self) -> bool:
        return self.status is not None

    @property
    def finished(self) -> bool:
        return self.done or self.evicted or self.ended or self.error is not None

    def feed(self, data: bytes | bytearray, length: int | None = None) -> None:
        """Account for ``data[:length]`` (a reused receive buffer is never copied whole)."""
        n = len(data) if length is None else length
        if self.status is None:
            self._head += bytes(data[:n])
            end = self._head.find(b"\r\n\r\n")
            if end < 0:
                return
            head, data = self._head[:end], self._head[end + 4:]
            n = len(data)
            self._head = b""
            self._parse_head(head)
            if self.status != 200:
                self.error = f"HTTP {self.status}: {data[:300].decode(errors='replace')}"
                return
        if not self._chunked:
            if n:
                self._body(data, 0, n)
            return
        if self._partial:
            data, self._partial = self._partial + bytes(data[:n]), b""
            n = len(data)
        pos = 0
        while pos < n and not self.ended:
            if self._left:
                take = min(self._left, n - pos)
                self._body(data, pos, pos + take)
                pos += take
                self._left -= take
                if not self._left:
                    self._skip = 2
            elif self._skip:
                take = min(self._skip, n - pos)
                pos += take
                self._skip -= take
            else:
                end = data.find(b"\r\n", pos, n)
                if end < 0:
                    self._partial = bytes(data[pos:n])
                    return
                size = int(data[pos:end].split(b";", 1)[0], 16)
                pos = end + 2
                if size == 0:
                    self.ended = True
                else:
                    self._left = size

    def eof(self) -> None:
        self.ended = True
        if self.status is None and self.error is None:
            self.error = "connection closed before the response headers"

    def _parse_head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        parts = lines[0].split(None, 2)
        self.status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"transfer-encoding" and b"chunked" in value.lower():
                self._chunked = True

    def _body(self, data: bytes | bytearray, start: int, end: int) -> None:
        if start >= end:
            return
        self.bytes += end - start
        count = data.count(b"\n\n", start, end)
        if self._last_newline and data[start] == 0x0A:
            count += 1  # a separator split across two reads
        self.frames += count
        self._last_newline = data[end - 1] == 0x0A
        # The frames that finish a subscriber are the last ones the daemon sends it (the turn's
        # terminal, replay_complete, client_evicted), so only the tail of each read is searched:
        # scanning every byte for them would double this process's CPU at 64 subscribers.
        seam = self._tail + data[start:min(end, start + self._seam)]
        tail_start = max(start, end - MARKER_WINDOW)
        for index, marker in enumerate(self.markers):
            if data.find(marker, tail_start, end) >= 0 or marker in seam:
                if index == 0:
                    self.done = True
                else:
                    self.evicted = True
        self._tail = bytes(self._tail + data[max(start, end - self._seam):end])[-self._seam:]


@dataclass
class Subscriber:
    sock: socket.socket
    counter: SSECounter
    t_start: float
    t_headers: float | None = None
    t_done: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def report(self) -> dict[str, Any]:
        c = self.counter
        return {"status": c.status, "frames": c.frames, "bytes": c.bytes,
                "t_start": self.t_start, "t_headers": self.t_headers, "t_done": self.t_done,
                "done": c.done, "evicted": c.evicted, "error": c.error}


def _request(host: str, port: int, session: str, max_queued: int, last_event_id: int | None,
             epoch: str | None) -> bytes:
    lines = [
        f"GET /session/{quote(session)}/events?maxQueued={max_queued} HTTP/1.1",
        f"Host: {host}:{port}",
        "Accept: text/event-stream",
        "Cache-Control: no-cache",
    ]
    if last_event_id is not None:
        lines.append(f"Last-Event-ID: {last_event_id}")
        if epoch:
            lines.append(f"X-Qwen-Event-Epoch: {epoch}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("ascii")


def run_round(args: argparse.Namespace, out: IO[str], announce: bool, deadline: float
              ) -> list[dict[str, Any]]:
    """Open every subscriber, read until each is finished, return their reports."""
    request = _request(args.host, args.port, args.session, args.max_queued, args.last_event_id,
                       args.epoch)
    until = f"event: {args.until}\n".encode()
    subs: list[Subscriber] = []
    # One receive buffer for every socket: a fresh 1 MiB bytes object per read would cost more
    # (allocation and page faults) than counting the frames in it.
    buf = bytearray(RECV_BYTES)
    with selectors.DefaultSelector() as sel:
        for _ in range(args.subscribers):
            t_start = time.monotonic()
            sock = socket.create_connection((args.host, args.port))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.sendall(request)
            sock.setblocking(False)
            sub = Subscriber(sock, SSECounter(until), t_start)
            subs.append(sub)
            sel.register(sock, selectors.EVENT_READ, sub)
        open_count = len(subs)
        announced = not announce
        try:
            while open_count:
                if not announced and all(s.counter.has_headers for s in subs):
                    print(json.dumps({"ready": True, "t": time.monotonic()}), file=out,
                          flush=True)
                    announced = True
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    for s in subs:
                        if not s.counter.finished:
                            s.counter.error = f"timed out after {args.timeout:.0f} s"
                    break
                for key, _ in sel.select(min(remaining, 1.0)):
                    sub = key.data
                    try:
                        length = sub.sock.recv_into(buf)
                    except BlockingIOError:
                        continue
                    now = time.monotonic()
                    if length:
                        had_headers = sub.counter.has_headers
                        sub.counter.feed(buf, length)
                        if not had_headers and sub.counter.has_headers:
                            sub.t_headers = now
                    else:
                        sub.counter.eof()
                    if sub.counter.finished:
                        sub.t_done = now
                        sel.unregister(sub.sock)
                        sub.sock.close()
                        open_count -= 1
        finally:
            for s in subs:
                if s.sock.fileno() >= 0:
                    s.sock.close()
    return [s.report() for s in subs]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.loadgen", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--session", required=True)
    parser.add_argument("--subscribers", type=int, default=1)
    parser.add_argument("--max-queued", type=int, default=2048)
    parser.add_argument("--last-event-id", type=int, default=None)
    parser.add_argument("--epoch", default=None)
    parser.add_argument("--until", default="turn_complete",
                        help="event type that finishes a subscriber")
    parser.add_argument("--rounds", type=int, default=1,
                        help="connect this many times in sequence (each round measured alone)")
    parser.add_argument("--announce-ready", action="store_true")
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args(argv)
    deadline = time.monotonic() + args.timeout
    cpu0 = _cpu_seconds()
    rounds = [run_round(args, sys.stdout, args.announce_ready and index == 0, deadline)
              for index in range(args.rounds)]
    print(json.dumps({"rounds": rounds, "cpu_s": _cpu_seconds() - cpu0}), flush=True)
    return 0


# --- the benchmark's side ------------------------------------------------------------------------


class LoadGenError(RuntimeError):
    """The load generator failed or a subscriber could not be served."""


class LoadGen:
    """Runs ``python -m benchmarks.loadgen`` and reads its JSON lines."""

    def __init__(self, host: str, port: int, session: str, *, subscribers: int = 1,
                 max_queued: int = 2048, until: str = "turn_complete",
                 last_event_id: int | None = None, epoch: str | None = None,
                 rounds: int = 1, announce_ready: bool = True, timeout: float = 300.0) -> None:
        argv = [sys.executable, "-m", "benchmarks.loadgen", "--host", host, "--port", str(port),
                "--session", session, "--subscribers", str(subscribers),
                "--max-queued", str(max_queued), "--until", until, "--rounds", str(rounds),
                "--timeout", str(timeout)]
        if last_event_id is not None:
            argv += ["--last-event-id", str(last_event_id)]
        if epoch is not None:
            argv += ["--epoch", epoch]
        if announce_ready:
            argv.append("--announce-ready")
        self.timeout = timeout + 30.0
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self._buf = b""

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _line(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + self.timeout
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in self._buf:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self.kill()
                    raise LoadGenError("load generator produced no result in time")
                if not sel.select(remaining):
                    continue
                chunk = os.read(fd, 65536)
                if not chunk:
                    self.proc.wait(5)
                    err = self.proc.stderr.read().decode(errors="replace") \
                        if self.proc.stderr else ""
                    raise LoadGenError(f"load generator exited ({self.proc.returncode}):\n{err}")
                self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        value = json.loads(line)
        if not isinstance(value, dict):
            raise LoadGenError(f"unexpected load generator line {line[:200]!r}")
        return value

    def wait_ready(self) -> float:
        """Block until every subscriber has its headers; returns the loadgen's timestamp."""
        line = self._line()
        if not line.get("ready"):
            raise LoadGenError(f"load generator did not get ready: {line}")
        return float(line["t"])

    def result(self) -> dict[str, Any]:
        """The final report (see the module docstring); raises when a subscriber failed."""
        line = self._line()
        self.proc.wait(30)
        for round_ in line["rounds"]:
            for sub in round_:
                if sub["error"]:
                    raise LoadGenError(f"subscriber failed: {sub['error']}")
        return line

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def close(self) -> None:
        self.kill()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


if __name__ == "__main__":
    sys.exit(main())
