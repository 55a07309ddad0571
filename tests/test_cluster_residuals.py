"""Cluster mode's residual faults, each injected into real processes (a real redis-server,
real daemon nodes, SIGSTOP/SIGCONT/SIGKILL, Redis restarted on its AOF):

- a turn's terminal reaches a node's own readers only once Redis holds it, under a lease still
  valid; a prompt starts on the agent only once its admission is in Redis and was answered
  202 (one answered 503 never runs, even when its admission lands late);
"""

from __future__ import annotations

import signal
import uuid
from pathlib import Path

import httpx
import pytest
import trio

from benchmarks.redis_launcher import HAVE_REDIS, SKIP_REASON, redis_server
from daemon.core.cluster import decode_op, session_keys
from daemon.core.transcript_ops import AdmitPrompt, FinishTurn
from tests.cluster_chaos import (
    LEASE_MS,
    TIMEOUT,
    Answer,
    DurableWatch,
    Follower,
    Prompter,
    check,
    final_transcript,
    nodes,
    prompts_run,
)

pytestmark = pytest.mark.skipif(not HAVE_REDIS, reason=SKIP_REASON)
coredis = pytest.importorskip("coredis", reason="coredis is not installed (pip install '.[cluster]')")


async def op_log(redis_port: int, sid: str) -> list[object]:
    client = coredis.Redis(host="127.0.0.1", port=redis_port)
    async with client:
        return [decode_op(raw) for raw in await client.lrange(session_keys(sid).ops, 0, -1)]


async def owner_of(client: httpx.AsyncClient, sid: str, timeout: float = 20) -> str:
    """The session's owner once a status answers (a takeover may be needed first)."""
    with trio.fail_after(timeout):
        while True:
            resp = await client.get(f"/session/{sid}/status")
            if resp.status_code == 200:
                return str(resp.json()["ownerNodeId"])
            await trio.sleep(0.05)  # polling the cluster's own answer


async def test_a_terminal_reaches_the_owner_s_readers_only_once_redis_holds_it(
        tmp_path: Path) -> None:
    """A turn ends while Redis is down (every event before its terminal already in Redis);
    the owner is paused the moment its own reader has the turn's terminal, Redis comes back
    (restarted on its AOF) and B takes the session over. Whatever the reader was shown is
    what the cluster's transcript says: the owner shows a terminal only once Redis holds it
    under its lease (else B's transcript would end the turn ``interrupted`` while the
    reader saw ``turn_complete``)."""
    with redis_server(tmp_path / "redis") as redis, \
            nodes(tmp_path, redis.url, "AB") as (a, b):
        async with httpx.AsyncClient(base_url=a.url, timeout=TIMEOUT) as ca, \
                httpx.AsyncClient(base_url=b.url, timeout=TIMEOUT) as cb, \
                trio.open_nursery() as nursery:
            sid = (await ca.post("/session", json={})).json()["sessionId"]
            on_a, on_b = Follower(ca, sid, "on-A"), Follower(cb, sid, "on-B")
            for follower in (on_a, on_b):
                nursery.start_soon(follower.run)
            watch = DurableWatch(sid, [ca, cb])
            nursery.start_soon(watch.run)
            prompts = Prompter(sid)
            first = await prompts.send(ca, "A", "p1 mock:chunks=3 mock:gate=g1")
            assert first.status == 202, first.body
            p1 = first.body["promptId"]
            for follower in (on_a, on_b):
                await follower.wait_for(lambda s: s.prompt_id == p1 and s.chunk == "chunk-2")
            ended = lambda s: s.prompt_id == p1 and s.terminal is not None  # noqa: E731
            paused = False
            redis.stop()
            try:
                a.open_gate("g1")  # p1 ends while Redis is away
                with trio.move_on_after(3 * LEASE_MS / 1000):
                    await on_a.wait_for(ended, timeout=60)
                    a.proc.send_signal(signal.SIGSTOP)  # the moment A's reader has it
                    paused = True
            finally:
                await trio.to_thread.run_sync(redis.start)
            if not paused:  # A held the terminal back while Redis was away
                await on_a.wait_for(ended, timeout=30)
                a.proc.send_signal(signal.SIGSTOP)
            try:
                assert await owner_of(cb, sid, timeout=30) == "B"
            finally:
                a.proc.send_signal(signal.SIGCONT)
            for follower in (on_a, on_b):
                await follower.wait_for_ends([p1])
            transcript = await final_transcript(cb, redis.port, sid)
            nursery.cancel_scope.cancel()
    check(transcript, prompts.accepted, [on_a, on_b], watch.durable)


async def _post_prompt(client: httpx.AsyncClient, prompts: Prompter, text: str,
                       key: str | None) -> Answer:
    headers = {"Idempotency-Key": key} if key is not None else {}
    started = trio.current_time()
    resp = await client.post(f"/session/{prompts.session_id}/prompt", headers=headers,
                             json={"prompt": [{"type": "text", "text": text}]})
    answer = Answer("A", resp.status_code, resp.json() if resp.content else {},
                    dict(resp.headers), trio.current_time() - started)
    prompts.answers.append(answer)
    return answer


@pytest.mark.parametrize("keyed", [False, True], ids=["plain", "idempotency-key"])
async def test_a_prompt_answered_503_never_runs_even_when_its_admission_lands_late(
        tmp_path: Path, keyed: bool) -> None:
    """Redis is frozen while the owner admits a prompt: its admission does not reach Redis
    within the bound, so the prompt is answered 503, and Redis then takes the admission late.
    The client sends the prompt again (with the same Idempotency-Key, if it used one) and it
    is answered 202. The agent runs the prompt exactly once: the one answered 503 never
    starts (it ends ``interrupted`` in the transcript), whatever Redis did with it later."""
    key = str(uuid.uuid4()) if keyed else None
    text = f"once-{uuid.uuid4().hex[:8]} mock:chunks=2"
    with redis_server(tmp_path / "redis") as redis, \
            nodes(tmp_path, redis.url, "A") as (a,):
        async with httpx.AsyncClient(base_url=a.url, timeout=TIMEOUT) as ca, \
                trio.open_nursery() as nursery:
            sid = (await ca.post("/session", json={})).json()["sessionId"]
            follower = Follower(ca, sid, "on-A")
            nursery.start_soon(follower.run)
            prompts = Prompter(sid)
            with trio.fail_after(10):  # right after a renewal: the lease is A's for a while
                while int(redis.cli("PTTL", session_keys(sid).lease)) < LEASE_MS - 150:
                    await trio.sleep(0.01)
            redis.proc.send_signal(signal.SIGSTOP)
            try:
                refused = await _post_prompt(ca, prompts, text, key)
            finally:
                redis.proc.send_signal(signal.SIGCONT)
            assert refused.status == 503, refused.body
            assert refused.body["code"] == "session_owner_unavailable"
            again = await _post_prompt(ca, prompts, text, key)
            assert again.status == 202, again.body
            with trio.fail_after(20):
                while True:  # every admission in Redis has its FinishTurn
                    ops = await op_log(redis.port, sid)
                    admitted = [op.prompt_id for op in ops if isinstance(op, AdmitPrompt)]
                    finished = {op.prompt_id for op in ops if isinstance(op, FinishTurn)}
                    if again.body["promptId"] in finished and set(admitted) <= finished:
                        break
                    await trio.sleep(0.05)  # polling Redis' own state
            late = [p for p in admitted if p != again.body["promptId"]]
            assert len(late) == 1, admitted  # the refused admission did land, late
            await follower.wait_for_ends([*prompts.accepted, *late])
            transcript = await final_transcript(ca, redis.port, sid)
            nursery.cancel_scope.cancel()
    ran = [line for line in prompts_run(tmp_path, "A") if text.split()[0] in line]
    assert len(ran) == 1, ran
    check(transcript, prompts.accepted, [follower], {}, all_admitted=late)
    assert transcript.terminals(late[0]) == [("turn_error", "interrupted")]
