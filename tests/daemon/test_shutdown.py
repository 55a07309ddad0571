"""Graceful shutdown: SIGTERM/SIGINT stop accepting, end running prompts with
turn_error session_closed, flush the transcript, stop agents and exit 0 within 5 s."""

from __future__ import annotations

import json
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


async def test_many_sessions_stop_in_one_batch_and_every_close_is_stored(tmp_path: Path) -> None:
    """Idle sessions are closed together: their closes are published at once and committed by
    one wait for the transcript (no wait, task or log line of their own); a session with a turn
    running still ends it first. After the stop every session's stored transcript ends with
    its close."""
    count = 40
    data = tmp_path / "data"
    daemon = start_daemon(tmp_path, ["--session-idle-ms", "0"], data_dir=data, tag="first")
    try:
        async with httpx.AsyncClient(base_url=daemon.url, timeout=30) as client, \
                trio.open_nursery() as nursery:
            ids = []
            for _ in range(count):
                created = await client.post("/session", json={"sessionScope": "thread"})
                ids.append(created.json()["sessionId"])
            busy, watched = ids[0], ids[1]
            pid = (await client.post(f"/session/{busy}/prompt", json={"prompt": [
                {"type": "text", "text": "mock:chunks=2 mock:gate=never"}]})).json()["promptId"]
            with trio.fail_after(20):
                while not (await client.get(f"/session/{busy}/status")).json()[
                        "hasActivePrompt"]:
                    await trio.sleep(0.02)
            sub = Subscriber(client, f"/session/{watched}/events")
            await nursery.start(sub.run)
            daemon.proc.send_signal(signal.SIGTERM)
            closed = await sub.wait_for(lambda e: e.type == "session_closed")
            await sub.wait_ended()
            nursery.cancel_scope.cancel()
        code = daemon.proc.wait(10)
    finally:
        daemon.stop()
    assert code == 0
    assert closed.data["reason"] == "daemon_shutdown"
    log = daemon.stderr()
    lines = [line for line in log.splitlines() if "event=sessions_closed" in line]
    assert len(lines) == 1, lines
    # Every idle session went the batched way; the busy one ended its turn first. The idle
    # ones without a subscriber (all but the watched one) were not woken at all: the process
    # exited once their closes were committed.
    assert f"count={count} batched={count - 1} parked={count - 2} " in lines[0], lines[0]
    commits = int(lines[0].rsplit("transcript_commits=", 1)[1].split()[0])
    assert 1 <= commits <= 4, lines[0]  # a handful, whatever the number of sessions
    assert "event=session_ended" not in log

    with running_daemon(tmp_path, data_dir=data, tag="second") as again:
        async with httpx.AsyncClient(base_url=again.url, timeout=30) as client:
            for sid in ids:
                exported = await client.get(f"/session/{sid}/export")
                assert exported.status_code == 200, exported.text
                events = [json.loads(line) for line in exported.text.splitlines()]
                assert (events[-1]["type"], events[-1]["data"]["reason"]) == (
                    "session_closed", "daemon_shutdown"), sid
            busy_events = [json.loads(line) for line in (
                await client.get(f"/session/{busy}/export")).text.splitlines()]
    terminals = [e for e in busy_events if e["type"] in ("turn_complete", "turn_error")]
    assert [(t["data"]["promptId"], t["data"]["code"]) for t in terminals] == [
        (pid, "session_closed")]


def test_a_signal_sent_as_soon_as_the_url_is_read_stops_the_daemon_gracefully(
        tmp_path: Path) -> None:
    """The shutdown handlers are in place before the daemon prints the URL it listens on. Before
    that, a SIGTERM right after the URL found the default disposition (exit -15) in most of
    such starts; eight starts in a row make the race visible."""
    for attempt in range(8):
        daemon = start_daemon(tmp_path / str(attempt))
        assert daemon.stop(signal.SIGTERM) == 0, daemon.stderr()[-2000:]


def test_a_stop_while_retention_removes_a_deleted_session_exits_zero(tmp_path: Path) -> None:
    """A session deleted just before SIGTERM is still being removed from the transcript (a
    retention step in the writer's worker thread) when the daemon stops: the connection is
    closed only once that step is over. Closing it under the step freed what SQLite was using
    in that thread (the daemon died of SIGSEGV, exit -11, at every such stop)."""
    daemon = start_daemon(tmp_path, data_dir=tmp_path / "data", tag="retention")
    try:
        with httpx.Client(base_url=daemon.url, timeout=60) as client:
            for _ in range(3):
                sid = client.post("/session", json={}).json()["sessionId"]
                reply = client.post(f"/session/{sid}/prompt", json={"prompt": [
                    {"type": "text", "text": "mock:chunks=20000"}]})
                assert reply.status_code == 202, reply.text
                deadline = time.monotonic() + 60
                while client.get(f"/session/{sid}/status").json()["hasActivePrompt"]:
                    assert time.monotonic() < deadline, "the turn did not end"
                    time.sleep(0.02)  # polling the daemon's own state
                assert client.delete(f"/session/{sid}").status_code in (200, 204)
        code = daemon.stop(signal.SIGTERM)
        assert code == 0, daemon.stderr()[-3000:]
    finally:
        daemon.kill()
