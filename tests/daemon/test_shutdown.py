"""Graceful shutdown: SIGTERM/SIGINT stop accepting, end running prompts with
turn_error session_closed, flush the transcript, stop agents and exit 0 within 5 s."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import httpx
import pytest
import trio

from sdk.protocol.envelope import decode_events
from tests.harness import running_daemon, start_daemon
from tests.sse_client import Subscriber, is_terminal_for, text_of

pytestmark = pytest.mark.processes  # starts processes: not in make unit-fast


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
async def test_signal_ends_prompts_flushes_and_exits_zero(tmp_path: Path, sig: int) -> None:
    daemon = start_daemon(tmp_path, data_dir=tmp_path / "data", tag="first")
    try:
        async with httpx.AsyncClient(base_url=daemon.url) as client, \
                trio.open_nursery() as nursery:
            sid = (await client.post("/session", json={})).json()["sessionId"]
            sub = Subscriber(client, f"/session/{sid}/events", {"Last-Event-ID": "0"})
            await nursery.start(sub.run)
            pid = (await client.post(f"/session/{sid}/prompt", json={"prompt": [
                {"type": "text", "text": "mock:chunks=5 mock:gate=never"}]})).json()["promptId"]
            await sub.wait_for(lambda e: text_of(e) == "chunk-4")
            started = time.monotonic()
            daemon.proc.send_signal(sig)
            terminal = await sub.wait_for(is_terminal_for(pid))
            closed = await sub.wait_for(lambda e: e.type == "session_closed")
            await sub.wait_ended()
            nursery.cancel_scope.cancel()
        code = daemon.proc.wait(10)
        elapsed = time.monotonic() - started
    finally:
        daemon.stop()
    assert code == 0
    assert elapsed < 5.0, f"shutdown took {elapsed:.2f}s"
    assert terminal.type == "turn_error" and terminal.data["code"] == "session_closed"
    assert closed.data["reason"] == "daemon_shutdown"
    # The agent process is gone too.
    assert "event=shutdown" in daemon.stderr()

    # Everything was flushed: after a restart the turn is closed by its own terminal, not
    # by an "interrupted" one.
    with running_daemon(tmp_path, data_dir=tmp_path / "data", tag="second") as again:
        async with httpx.AsyncClient(base_url=again.url) as client:
            body = (await client.post(f"/session/{sid}/load", json={})).json()
    events = decode_events(body["compactedReplay"])
    terminals = [e for e in events if e.type in ("turn_complete", "turn_error")]
    assert [(t.data["promptId"], t.data["code"]) for t in terminals] == [(pid, "session_closed")]
    chunks = [text_of(e) for e in events if e.type == "session_update"]
    assert "chunk-0chunk-1chunk-2chunk-3chunk-4" in chunks
