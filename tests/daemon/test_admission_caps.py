"""Admission caps against a real daemon over real sockets (issue: 5,000 sessions were created
without refusal, and 1,000 WebSocket connections were all accepted, 936 of them refused only
after the upgrade).

``--max-connections``: at the cap a new connection is refused as it is accepted (503
``connection_limit``, never reaching the server), established streams are untouched, a loopback
``GET /health`` still gets through in the reserve slot, the refusals are logged once, and the
daemon's peak RSS while twice the cap is attempted stays within 10% of its RSS at the cap.
``--max-sessions``: twice the cap of concurrent creates yields exactly the cap, attaching,
prompting and streaming go on, a freed slot is taken again, and a restore past the cap is
refused too."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from benchmarks.attack_clients import host_port, reset_peak_rss, rss_kib
from tests.harness import RunningDaemon, running_daemon, start_daemon
from tests.sse_client import Subscriber, is_terminal_for
from tests.stalls import poll

# starts processes: not in make unit-fast; exec_daemon: real `python -m daemon` (memory test)
pytestmark = [pytest.mark.processes, pytest.mark.exec_daemon]

CAP = 48  # connections: one control client and 47 SSE readers fill it
READERS = CAP - 1
SESSION_CAP = 6


async def _exchange(url: str, request: bytes) -> bytes:
    """Send ``request`` on a new connection and read until the daemon closes it (a reset
    after what was read counts as a close)."""
    sock = trio.socket.socket()
    with sock:
        await sock.connect(host_port(url))
        await sock.send(request)
        out = b""
        while True:
            try:
                chunk = await sock.recv(65536)
            except OSError:
                return out
            if not chunk:
                return out
            out += chunk


def _get(path: str, close: bool = False) -> bytes:
    extra = "Connection: close\r\n" if close else ""
    return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{extra}\r\n".encode()


@asynccontextmanager
async def probing_health(url: str) -> AsyncIterator[list[bytes]]:
    """GET /health on a fresh connection, one after another, for the block's duration: the
    answers' status lines (and one more after the block)."""
    seen: list[bytes] = []
    done = trio.Event()
    async with trio.open_nursery() as nursery:
        async def probe() -> None:
            # Stopped between two probes, never cancelled in one: a probe cut after its
            # connect but before its request is a connection the daemon counts as refused.
            while not done.is_set():
                with trio.fail_after(10):
                    seen.append((await _exchange(url, _get("/health", close=True))).split(
                        b"\r\n", 1)[0])

        nursery.start_soon(probe)
        await poll(lambda: seen, 10, "a first /health answer")
        yield seen
        count = len(seen)
        await poll(lambda: len(seen) > count, 10, "a /health answer after the block")
        done.set()


async def _status(client: httpx.AsyncClient) -> dict[str, Any]:
    resp = await client.get("/daemon/status")
    assert resp.status_code == 200, resp.text
    body: dict[str, Any] = resp.json()
    return body


async def test_connection_cap_refuses_at_accept_and_keeps_health_and_streams(
        tmp_path: Path) -> None:
    with running_daemon(tmp_path, ["--no-persistence", "--max-connections", str(CAP)]) as daemon:
        pid = daemon.proc.pid
        one = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        async with httpx.AsyncClient(base_url=daemon.url, limits=one, timeout=30) as control, \
                httpx.AsyncClient(base_url=daemon.url, timeout=30) as streams, \
                trio.open_nursery() as nursery:
            sid = (await control.post("/session", json={})).json()["sessionId"]
            readers = [Subscriber(streams, f"/session/{sid}/events?maxQueued=2048")
                       for _ in range(READERS)]
            for reader in readers:
                await nursery.start(reader.run)
            status = await _status(control)
            assert status["connections"] == {"open": CAP, "reserve": 0, "refused": 0}
            assert status["limits"]["maxConnections"] == CAP
            warm = (await control.post(f"/session/{sid}/prompt", json={"prompt": [
                {"type": "text", "text": "mock:chunks=50 mock:delay_ms=0"}]})).json()["promptId"]
            for reader in readers:
                await reader.wait_for(is_terminal_for(warm))
            at_cap = rss_kib(pid)
            reset_peak_rss(pid)

            # Twice the cap, all at once, each asking for one more stream.
            answers: list[bytes] = []

            async def attempt() -> None:
                answers.append(await _exchange(daemon.url, _get(f"/session/{sid}/events")))

            async with probing_health(daemon.url) as health:
                # (a daemon that served them would hold the streams open: fail, not hang)
                with trio.fail_after(60):
                    async with trio.open_nursery() as flood:
                        for _ in range(2 * CAP):
                            flood.start_soon(attempt)
            peak = rss_kib(pid, "VmHWM")
            heads = [a.split(b"\r\n", 1)[0] for a in answers]
            # Every attempt refused (a 503, or closed at once while 64 refusals were under
            # way); none served.
            assert all(h in (b"HTTP/1.1 503 Service Unavailable", b"") for h in heads), heads
            assert heads.count(b"HTTP/1.1 503 Service Unavailable") >= 64
            assert all(b'"code":"connection_limit"' in a for a in answers if a)
            assert set(health) == {b"HTTP/1.1 200 "}, health
            assert peak <= at_cap * 1.10, f"peak {peak} KiB vs {at_cap} KiB at the cap"
            status = await _status(control)
            # (the last probe's reserve connection may still be closing)
            assert status["connections"]["open"] == CAP
            assert status["connections"]["refused"] == 2 * CAP
            assert status["sessions"][0]["subscribers"] == READERS

            # Nothing established was cut: every reader gets the next turn whole.
            turn = (await control.post(f"/session/{sid}/prompt", json={"prompt": [
                {"type": "text", "text": "mock:chunks=50 mock:delay_ms=0"}]})).json()["promptId"]
            for reader in readers:
                terminal = await reader.wait_for(is_terminal_for(turn))
                assert not reader.ended
                ids = [e.id for e in reader.events if e.id is not None]
                assert ids == list(range(ids[0], terminal.id + 1))  # type: ignore[operator]

            # Slots freed by readers that leave are taken by new connections.
            nursery.cancel_scope.cancel()
        await poll(partial(_open_below, daemon, CAP), 10, "the readers' slots to be freed")
        answer = await _exchange(daemon.url, _get("/capabilities", close=True))
        assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]
    log = daemon.stderr()
    # One line for the whole burst (the next would come a minute later), with the count.
    assert log.count("event=connections_refused") == 1, log[-3000:]


async def _open_below(daemon: RunningDaemon, cap: int) -> bool:
    answer = await _exchange(daemon.url, _get("/health", close=True))
    if not answer.startswith(b"HTTP/1.1 200"):
        return False
    async with httpx.AsyncClient(base_url=daemon.url, timeout=30) as client:
        resp = await client.get("/daemon/status")
        return resp.status_code == 200 and bool(resp.json()["connections"]["open"] < cap)


async def test_a_closed_keep_alive_connection_frees_its_slot_at_once(tmp_path: Path) -> None:
    """A client that closes an idle keep-alive connection gives its slot back at once, not
    after the server's 30 s keep-alive timer (a client opening one connection per request
    would otherwise fill the cap with connections it had already closed)."""
    with running_daemon(tmp_path, ["--no-persistence", "--max-connections", "4"]) as daemon:
        socks = []
        try:
            for _ in range(4):
                sock = socket.create_connection(host_port(daemon.url), timeout=10)
                sock.sendall(_get("/health"))
                assert sock.recv(4096).startswith(b"HTTP/1.1 200 ")
                socks.append(sock)
            refused = await _exchange(daemon.url, _get("/capabilities"))
            assert refused.startswith(b"HTTP/1.1 503 "), refused[:200]
        finally:
            for sock in socks:
                sock.close()

        async def served() -> bool:
            answer = await _exchange(daemon.url, _get("/capabilities", close=True))
            return answer.startswith(b"HTTP/1.1 200 ")

        await poll(served, 5, "a new connection to be served")


async def _create(client: httpx.AsyncClient, out: list[httpx.Response]) -> None:
    out.append(await client.post("/session", json={"sessionScope": "thread"}))


async def _all(client: httpx.AsyncClient, count: int,
               make: Callable[[httpx.AsyncClient, list[httpx.Response]], Any]
               ) -> list[httpx.Response]:
    out: list[httpx.Response] = []
    async with trio.open_nursery() as nursery:
        for _ in range(count):
            nursery.start_soon(make, client, out)
    return out


async def test_session_cap_holds_under_twice_the_attempts(tmp_path: Path) -> None:
    daemon = start_daemon(tmp_path, ["--max-sessions", str(SESSION_CAP)])
    try:
        pid = daemon.proc.pid
        async with httpx.AsyncClient(base_url=daemon.url, timeout=60) as client:
            first = await _all(client, 2 * SESSION_CAP, _create)
            ok = [r for r in first if r.status_code == 200]
            refused = [r for r in first if r.status_code == 503]
            assert len(ok) == SESSION_CAP and len(refused) == SESSION_CAP, \
                [r.status_code for r in first]
            for resp in refused:
                assert resp.json() == {"error": f"{SESSION_CAP} sessions are live, the most "
                                       "this daemon holds", "code": "session_limit",
                                       "limit": SESSION_CAP}
                assert resp.headers["Retry-After"] == "5"
            ids = [r.json()["sessionId"] for r in ok]
            status = (await client.get("/daemon/status")).json()
            assert status["liveSessions"] == SESSION_CAP
            assert status["limits"]["maxSessions"] == SESSION_CAP
            at_cap = rss_kib(pid)
            reset_peak_rss(pid)
            async with probing_health(daemon.url) as health:
                again = await _all(client, 2 * SESSION_CAP, _create)
            peak = rss_kib(pid, "VmHWM")
            assert [r.status_code for r in again] == [503] * (2 * SESSION_CAP)
            assert set(health) == {b"HTTP/1.1 200 "}, health
            assert peak <= at_cap * 1.10, f"peak {peak} KiB vs {at_cap} KiB at the cap"

            # Loaded sessions keep working: attach, prompt, stream, load.
            attach = await client.post("/session", json={"sessionId": ids[0]})
            assert attach.status_code == 200 and attach.json()["attached"] is True
            reader = Subscriber(client, f"/session/{ids[0]}/events")
            async with trio.open_nursery() as nursery:
                await nursery.start(reader.run)
                prompt = await client.post(f"/session/{ids[0]}/prompt", json={"prompt": [
                    {"type": "text", "text": "mock:chunks=3 mock:delay_ms=0"}]})
                assert prompt.status_code == 202, prompt.text
                await reader.wait_for(is_terminal_for(prompt.json()["promptId"]))
                nursery.cancel_scope.cancel()
            assert (await client.post(f"/session/{ids[1]}/load", json={})).status_code == 200

            # A slot freed is taken again.
            assert (await client.delete(f"/session/{ids[-1]}")).status_code == 204
            await poll(partial(_live, client, SESSION_CAP - 1), 10, "the slot to be freed")
            assert (await _all(client, 1, _create))[0].status_code == 200
        daemon.stop()

        # Restoring counts too: after a restart nothing is live; two loads fill a cap of 2,
        # the third is refused (an unknown id is still a 404).
        daemon = start_daemon(tmp_path, ["--max-sessions", "2"], data_dir=daemon.data_dir)
        async with httpx.AsyncClient(base_url=daemon.url, timeout=60) as client:
            assert (await client.get("/daemon/status")).json()["liveSessions"] == 0
            for sid in ids[:2]:
                assert (await client.post(f"/session/{sid}/load", json={})).status_code == 200
            third = await client.post(f"/session/{ids[2]}/load", json={})
            assert third.status_code == 503 and third.json()["code"] == "session_limit"
            unknown = await client.post("/session/00000000-0000-4000-8000-000000000000/load",
                                        json={})
            assert unknown.status_code == 404
            resumed = await client.post("/session", json={"sessionId": ids[3]})
            assert resumed.status_code == 503 and resumed.json()["code"] == "session_limit"
    finally:
        daemon.stop()
    assert "event=session_limit" in daemon.stderr()


async def _live(client: httpx.AsyncClient, count: int) -> bool:
    return bool((await client.get("/daemon/status")).json()["liveSessions"] == count)
