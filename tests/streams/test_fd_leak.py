"""Cutting stalled connections costs no descriptor (issue: ~12 leaked per cut, and leaked
duplicates of agent stdin pipes kept agents from seeing EOF at shutdown).

The daemon registers each connection's socket when Hypercorn starts serving it and forgets it
when the connection ends (``daemon.bridge``'s connection registry); a cut shuts down exactly that socket. Here a real
daemon cuts ten stalled subscribers, its descriptor count returns to its baseline, and SIGTERM
still ends it within 5 s with its agent exiting on stdin EOF (not killed)."""

from __future__ import annotations

import re
import signal
import socket
import time
from collections.abc import MutableMapping
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from hypercorn.config import Config as HyperConfig
from hypercorn.trio import run as hyper_run
from hypercorn.trio import serve
from hypercorn.trio.tcp_server import TCPServer

from daemon.bridge import _patches
from daemon.bridge import _sockets as sockets
from tests.harness import answer_lifespan, start_daemon
from tests.stalls import fd_count, holds_connection, open_stalled_sse, poll, run_turn, status

pytestmark = pytest.mark.processes  # starts processes: not in make unit-fast

ROUNDS = 2
PER_ROUND = 5  # ten cuts in all


async def test_registry_tracks_exactly_the_open_hypercorn_connections() -> None:
    """The patched shape: Hypercorn's worker builds its per-connection server through the
    module's ``TCPServer`` name, which now registers the socket the ASGI scope names, for as
    long as the connection lives. Fails if a Hypercorn upgrade moves any of it."""
    assert _patches.install().connection_registry  # through the one installer, as the daemon
    assert hyper_run.TCPServer is not TCPServer and issubclass(hyper_run.TCPServer, TCPServer)
    seen: list[bool] = []

    async def app(scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await answer_lifespan(receive, send)
            return
        key = (sockets.addr(scope["server"]), sockets.addr(scope["client"]))
        seen.append(sockets.registry.get(key) is not None)  # type: ignore[arg-type]
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    hconf = HyperConfig()
    hconf.bind = ["127.0.0.1:0"]
    hconf.accesslog = None
    hconf.keep_alive_timeout = 0.2  # Hypercorn ends a connection's task this long after it
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(partial(serve, app, hconf, shutdown_trigger=stop.wait))
        before = len(sockets.registry)
        async with httpx.AsyncClient(base_url=binds[0]) as client:
            for _ in range(3):
                assert (await client.get("/")).text == "ok"
            assert len(sockets.registry) == before + 1  # one keep-alive connection
        await poll(lambda: len(sockets.registry) == before, 5, "the registry to forget it")
        stop.set()
    assert seen == [True, True, True]


def daemon_port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def _all_closed(pid: int, port: int, peers: list[int]) -> bool:
    return not any(holds_connection(pid, port, peer) for peer in peers)


async def test_ten_cuts_leak_no_descriptor_and_shutdown_stays_graceful(tmp_path: Path) -> None:
    daemon = start_daemon(tmp_path)
    stalled: list[socket.socket] = []
    try:
        pid = daemon.proc.pid
        async with httpx.AsyncClient(base_url=daemon.url) as client:
            sid = (await client.post("/session", json={})).json()["sessionId"]
            await run_turn(client, sid, "warm-up: mock:chunks=3 mock:delay_ms=0")  # agent up
            baseline = fd_count(pid)
            port = daemon_port(daemon.url)
            for round_no in range(1, ROUNDS + 1):
                for _ in range(PER_ROUND):
                    stalled.append(open_stalled_sse(daemon.url, sid))
                await poll(lambda: fd_count(pid) >= baseline + PER_ROUND, 10, "the subscribers")
                # Turns until every stalled subscriber's write blocked and it was evicted.
                for _ in range(12):
                    await run_turn(client, sid)
                    if (await status(client, sid))["clientsEvicted"] >= PER_ROUND * round_no:
                        break
                assert (await status(client, sid))["clientsEvicted"] == PER_ROUND * round_no
                # Each one's write stayed stalled past the grace period: its connection is cut,
                # and every descriptor the daemon held for it is closed again.
                peers = [sock.getsockname()[1] for sock in stalled[-PER_ROUND:]]
                await poll(partial(_all_closed, pid, port, peers), 10,
                           "the stalled connections to be cut")
                await poll(lambda: fd_count(pid) <= baseline, 10,
                           f"the descriptor count to return to {baseline} after round {round_no}")
            assert daemon.stderr().count("event=connection_cut") == ROUNDS * PER_ROUND
            assert (await status(client, sid))["subscribers"] == 0
        started = time.monotonic()
        daemon.proc.send_signal(signal.SIGTERM)
        code = daemon.proc.wait(10)
        elapsed = time.monotonic() - started
    finally:
        for sock in stalled:
            sock.close()
        daemon.stop()
    log = daemon.stderr()
    assert code == 0, log[-3000:]
    assert elapsed < 5, f"SIGTERM took {elapsed:.1f} s"
    # The agent ended on its own when its stdin closed (no duplicate kept the pipe open).
    assert "event=agent_kill" not in log
    assert "event=shutdown_budget_exceeded" not in log
    assert re.search(r"event=agent_exited .*exit_code=0", log), log[-3000:]


@pytest.mark.parametrize("value", [None, (), ("x",), (1, 2), ("h", "p")])
def test_shutdown_connection_ignores_unusable_addresses(value: Any) -> None:
    assert sockets.shutdown_connection(value, ("127.0.0.1", 1)) is False
    assert sockets.shutdown_connection(("127.0.0.1", 1), value) is False


def test_shutdown_connection_unknown_pair_is_false() -> None:
    assert sockets.shutdown_connection(("127.0.0.1", 1), ("127.0.0.1", 2)) is False
