"""What the daemon hands out survives a crash: a session id is on disk before the reply that
names it, and a prompt's 202 goes out only once its admission (the prompt ledger's
``in_flight`` row) is committed, so a restart ends that prompt with exactly one terminal,
``interrupted`` at worst, instead of forgetting a prompt the client was told was accepted.

Two proofs, both with a real daemon and the real mock agent:

- in-process, over a real SQLite store whose commits wait at a gate the test holds: no reply
  reaches the client while the commit that makes it true is held;
- as subprocesses: SIGKILL the moment the 202 arrives, while another session's full-speed turn
  keeps the group-commit writer gathering batches, restart on the same data directory and load.
"""

from __future__ import annotations

import io
import signal
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from daemon import server
from daemon.config import DaemonConfig, parse_config
from daemon.transcript_store import AdmitPrompt, Op, TranscriptDatabase, UpsertSession
from tests.builders.commit_gate import CommitGate
from tests.harness import running_daemon, start_daemon

pytestmark = pytest.mark.processes  # starts processes: not in make unit-fast

ROUNDS = 3
FAST_TURN = "busy mock:chunks=1000000 mock:delay_ms=0"  # outlasts every round
HELD_TURN = "held mock:gate=never"  # the mock waits for a gate file nobody creates
BUSY_EVENTS = 2000  # the busy session has streamed this far before the prompt is sent
TIMEOUT_S = 30.0


def daemon_config(tmp_path: Path) -> DaemonConfig:
    return parse_config(["--port", "0", "--data-dir", str(tmp_path / "data"),
                         "--workspace", str(tmp_path)], environ={})


async def reply_held_by_commit(gate: CommitGate, client: httpx.AsyncClient,
                               request: Callable[[], Awaitable[httpx.Response]],
                               nursery: trio.Nursery) -> tuple[httpx.Response, list[Op]]:
    """Send ``request`` with every commit held; check that no reply arrives while its commit
    waits at the gate; open it and return the reply with what was committed when it came."""
    got: dict[str, Any] = {}
    replied = trio.Event()

    async def send() -> None:
        got["response"] = await request()
        got["committed"] = gate.committed()  # read the moment the reply is in
        replied.set()

    entered = gate.close()
    try:
        nursery.start_soon(send)
        with trio.fail_after(TIMEOUT_S):
            await entered.wait()  # the request's own write is at the gate
        # A reply sent without waiting for that commit was written before the commit began:
        # one more round trip on another connection lets it arrive.
        async with httpx.AsyncClient(base_url=str(client.base_url)) as other:
            assert (await other.get("/health")).status_code == 200
        assert not replied.is_set(), "the daemon replied before the write it names committed"
    finally:
        gate.open()  # a held worker thread would keep the daemon from shutting down
    with trio.fail_after(TIMEOUT_S):
        await replied.wait()
    return got["response"], got["committed"]


async def test_no_reply_names_a_session_or_prompt_before_it_is_committed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gate_dir = tmp_path / "gates"
    gate_dir.mkdir()
    monkeypatch.setenv("MOCK_ACP_GATE_DIR", str(gate_dir))
    gate = CommitGate()

    def open_gated_store(config: DaemonConfig) -> TranscriptDatabase:
        return TranscriptDatabase(config.data_dir / server.TRANSCRIPT_FILE, hooks=gate.hooks)

    monkeypatch.setattr(server, "open_store", open_gated_store)
    async with trio.open_nursery() as nursery:
        binds: list[str] = await nursery.start(partial(
            server.run_daemon, daemon_config(tmp_path), handle_signals=False, out=io.StringIO()))
        async with httpx.AsyncClient(base_url=binds[0], timeout=TIMEOUT_S) as client:
            created, committed = await reply_held_by_commit(
                gate, client, partial(client.post, "/session", json={}), nursery)
            assert created.status_code == 200, created.text
            sid = created.json()["sessionId"]
            assert sid in {op.session_id for op in committed if isinstance(op, UpsertSession)}

            accepted, committed = await reply_held_by_commit(
                gate, client, partial(client.post, f"/session/{sid}/prompt",
                                       json={"prompt": [{"type": "text", "text": HELD_TURN}]}),
                nursery)
            assert accepted.status_code == 202, accepted.text
            pid = accepted.json()["promptId"]
            assert pid in {op.prompt_id for op in committed if isinstance(op, AdmitPrompt)}
        nursery.cancel_scope.cancel()


async def wait_streaming(client: httpx.AsyncClient, sid: str) -> None:
    """Until the session has published ``BUSY_EVENTS`` events (status read back to back)."""
    with trio.fail_after(TIMEOUT_S):
        while (await client.get(f"/session/{sid}/status")).json()["lastEventId"] < BUSY_EVENTS:
            pass


async def post_prompt(client: httpx.AsyncClient, replies: dict[str, httpx.Response],
                      sid: str, text: str) -> None:
    replies[sid] = await client.post(f"/session/{sid}/prompt", json={
        "prompt": [{"type": "text", "text": text}]})


async def test_a_prompt_answered_202_is_ended_after_a_crash(tmp_path: Path) -> None:
    """Each round: a busy session streams at full speed (so the writer is gathering a batch
    when the admission arrives); a new session of the same agent gets a prompt that never
    ends on its own, and the busy one a second prompt, queued behind its turn; the daemon is
    SIGKILLed as soon as both 202s are read. After a restart every one of those prompts is
    there, closed as interrupted."""
    answered: list[tuple[str, str]] = []
    for round_no in range(ROUNDS):
        daemon = start_daemon(tmp_path, data_dir=tmp_path / "data", tag=f"round{round_no}")
        try:
            async with httpx.AsyncClient(base_url=daemon.url, timeout=TIMEOUT_S) as client:
                busy = (await client.post("/session", json={})).json()["sessionId"]
                resp = await client.post(f"/session/{busy}/prompt", json={"prompt": [
                    {"type": "text", "text": FAST_TURN}]})
                assert resp.status_code == 202, resp.text
                await wait_streaming(client, busy)
                created = (await client.post("/session", json={"sessionScope": "thread"})).json()
                held = created["sessionId"]
                assert held != busy and created["attached"] is False
                replies: dict[str, httpx.Response] = {}

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(post_prompt, client, replies, held, HELD_TURN)
                    nursery.start_soon(post_prompt, client, replies, busy,
                                       "queued behind the busy turn")
                daemon.proc.send_signal(signal.SIGKILL)
                assert set(replies) == {held, busy}
                for sid, resp in replies.items():
                    assert resp.status_code == 202, resp.text
                    answered.append((sid, resp.json()["promptId"]))
        finally:
            daemon.kill()
        assert daemon.proc.returncode == -signal.SIGKILL
    with running_daemon(tmp_path, data_dir=tmp_path / "data", tag="last") as daemon:
        async with httpx.AsyncClient(base_url=daemon.url, timeout=TIMEOUT_S) as client:
            for sid, pid in answered:
                resp = await client.post(f"/session/{sid}/load", json={})
                assert resp.status_code == 200, f"session {sid} was lost: {resp.text}"
                ledger = {t["promptId"]: t["terminal"]
                          for t in resp.json().get("promptTerminals", [])}
                assert ledger.get(pid) == "interrupted", (sid, pid, ledger)
