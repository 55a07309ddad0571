"""A request whose body never arrives costs a bounded time, then nothing (issue: 500 connections
sending complete headers with ``Content-Length: 1000`` and no body stayed open for good, and the
descriptor limit then locked everyone out).

Against a real daemon with ``--body-timeout-ms`` shrunk: raw connections that send headers and a
partial or no body are answered 408 and closed within the bound, the daemon's descriptor count
returns to its baseline, normal requests are served meanwhile, and the log says it once, without
a traceback."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import httpx
import pytest
import trio

from daemon.core.throttle import LogThrottle
from tests.harness import RunningDaemon, running_daemon
from tests.stalls import fd_count, host_port, poll

pytestmark = pytest.mark.processes  # starts processes: not in make unit-fast

BODY_TIMEOUT_MS = 1000
SLOW = 40
BOUND_S = BODY_TIMEOUT_MS / 1000 + 5  # generous


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    with running_daemon(tmp_path_factory.mktemp("slow-body"),
                        ["--no-persistence", "--body-timeout-ms", str(BODY_TIMEOUT_MS)]) as d:
        yield d


def open_slow_body(url: str, sent_body: bytes) -> socket.socket:
    sock = socket.create_connection(host_port(url), timeout=BOUND_S)
    sock.sendall(b"POST /session HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                 b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n" + sent_body)
    return sock


def read_to_eof(sock: socket.socket) -> bytes:
    data = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk


async def test_bodies_that_never_arrive_are_cut_and_cost_nothing(daemon: RunningDaemon) -> None:
    pid = daemon.proc.pid
    async with httpx.AsyncClient(base_url=daemon.url, timeout=10) as client:
        # (The first session starts the workspace's agent: its pipes are part of the baseline.)
        assert (await client.post("/session", json={})).status_code == 200
        baseline = fd_count(pid)
        started = time.monotonic()
        slow = [open_slow_body(daemon.url, b"" if i % 2 else b'{"cwd": ') for i in range(SLOW)]
        try:
            await poll(lambda: fd_count(pid) >= baseline + SLOW, 5, "the slow connections")
            # Everyone else is served while they hang.
            created = await client.post("/session", json={})
            assert created.status_code == 200, created.text
            assert (await client.get("/health")).status_code == 200
            # Each is answered 408 and closed by the daemon (EOF), within the bound.
            answers = [await trio.to_thread.run_sync(read_to_eof, sock) for sock in slow]
            elapsed = time.monotonic() - started
        finally:
            for sock in slow:
                sock.close()
        assert all(a.startswith(b"HTTP/1.1 408") for a in answers), answers[0][:200]
        assert b'"code":"body_timeout"' in answers[0]
        assert elapsed < BOUND_S
        await poll(lambda: fd_count(pid) <= baseline, 10, f"the descriptors back to {baseline}")
        assert (await client.get("/health")).status_code == 200
    log = daemon.stderr()
    assert "Traceback" not in log
    lines = [line for line in log.splitlines() if "event=body_timeout" in line]
    assert len(lines) == 1 and "count=1 " in lines[0], lines  # once, not once per request


def test_log_throttle_logs_the_first_then_one_summary_per_interval() -> None:
    throttle = LogThrottle(60)
    assert throttle.note(0.0) == 1
    assert [throttle.note(t) for t in (1.0, 2.0, 59.9)] == [None, None, None]
    assert throttle.note(60.0) == 4  # the three suppressed ones and this one
    assert throttle.note(61.0) is None
    assert throttle.note(200.0) == 2
    assert throttle.total == 7
