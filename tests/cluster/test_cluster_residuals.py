"""Cluster mode's residual faults, each injected into real processes (a real redis-server,
real daemon nodes, SIGSTOP/SIGCONT/SIGKILL, Redis restarted on its AOF):

- a turn's terminal reaches a node's own readers only once Redis holds it, under a lease still
  valid; a prompt starts on the agent only once its admission is in Redis and was answered
  202 (one answered 503 never runs, even when its admission lands late);
- a takeover on a node at its ``--max-sessions`` cap is a 503 ``session_limit`` that takes
  no lease;
- a ``POST /session`` answered 503 leaves no session running;
- a request that comes right after a delete never takes the deleted session over again.
"""

from __future__ import annotations

import signal
import uuid
from pathlib import Path

import httpx
import pytest
import trio

from benchmarks.redis_launcher import HAVE_REDIS, SKIP_REASON, redis_server
from daemon.core.cluster import session_keys
from daemon.core.transcript_ops import AdmitPrompt, FinishTurn
from tests.builders.cluster import lease_gone, op_log, owner_of
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
    start_node,
)

pytestmark = [pytest.mark.skipif(not HAVE_REDIS, reason=SKIP_REASON), pytest.mark.processes]
coredis = pytest.importorskip("coredis", reason="coredis is not installed (pip install '.[cluster]')")


async def test_requests_during_and_right_after_a_delete_never_take_the_session_over(
        tmp_path: Path) -> None:
    """The owner deletes a session (its close is shipped to Redis in the background) while
    the same node is asked about it again and again, during the close and right after it,
    while that close is on its way to Redis: every answer is 200 (before the close) or 404,
    never a 500, and the session stays closed in Redis, its generation the first claim's
    raised once by the close (no request claimed it again, which would have reopened it)."""
    rounds = 10
    with redis_server(tmp_path / "redis") as redis, \
            nodes(tmp_path, redis.url, "A") as (a,):
        async with httpx.AsyncClient(base_url=a.url, timeout=TIMEOUT) as ca:
            answers: list[tuple[int, str]] = []  # (status, body) of every request
            sids = []
            for _ in range(rounds):
                sid = (await ca.post("/session", json={"sessionScope": "thread"})).json()[
                    "sessionId"]
                sids.append(sid)
                deleted = trio.Event()

                async def delete(sid: str = sid, deleted: trio.Event = deleted) -> None:
                    assert (await ca.delete(f"/session/{sid}")).status_code == 204
                    deleted.set()

                async def ask(sid: str = sid, deleted: trio.Event = deleted) -> None:
                    while True:  # back to back: during the close, then once after it
                        done = deleted.is_set()
                        resp = await ca.get(f"/session/{sid}/status")
                        answers.append((resp.status_code, resp.text[:300]))
                        if done:
                            return

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(delete)
                    for _ in range(3):
                        nursery.start_soon(ask)
            assert {status for status, _ in answers} <= {200, 404}, \
                [answer for answer in answers if answer[0] not in (200, 404)]
            for sid in sids:
                with trio.fail_after(10):
                    while redis.cli("HGET", session_keys(sid).directory, "closed") != "1":
                        await trio.sleep(0.02)  # the close reaches Redis
                # Claimed once (1), retired by the close's release (2): never taken over.
                assert redis.cli("HGET", session_keys(sid).directory, "gen") == "2"
                assert (await ca.get(f"/session/{sid}/status")).status_code == 404
    assert "Traceback" not in a.stderr()


async def test_a_takeover_at_the_session_cap_is_a_503_and_takes_no_lease(
        tmp_path: Path) -> None:
    """B is at its ``--max-sessions`` cap when A dies: a request for A's session through B is
    answered 503 ``session_limit`` with ``Retry-After`` (not a 500), B claims nothing (the
    lease stays free, its generation unchanged), and once B has a free slot it takes the
    session over."""
    with redis_server(tmp_path / "redis") as redis:
        a = start_node(tmp_path, redis.url, "A")
        b = start_node(tmp_path, redis.url, "B", "--max-sessions", "1")
        try:
            async with httpx.AsyncClient(base_url=a.url, timeout=TIMEOUT) as ca, \
                    httpx.AsyncClient(base_url=b.url, timeout=TIMEOUT) as cb:
                sid = (await ca.post("/session", json={})).json()["sessionId"]
                mine = (await cb.post("/session", json={"sessionScope": "thread"})).json()[
                    "sessionId"]
                a.kill()
                await lease_gone(redis.cli, sid)
                generation = redis.cli("HGET", session_keys(sid).directory, "gen")
                for method, path in (("GET", "status"), ("POST", "load"), ("POST", "prompt"),
                                     ("GET", "events")):
                    body = {"prompt": [{"type": "text", "text": "x"}]} if path == "prompt" \
                        else {}
                    resp = await cb.request(method, f"/session/{sid}/{path}",
                                            json=body if method == "POST" else None)
                    assert resp.status_code == 503, (path, resp.status_code, resp.text)
                    assert resp.json()["code"] == "session_limit", (path, resp.text)
                    assert int(resp.headers["retry-after"]) >= 1
                    assert redis.cli("EXISTS", session_keys(sid).lease) == "0", path
                    assert redis.cli("HGET", session_keys(sid).directory, "gen") == generation
                    assert redis.cli("HGET", session_keys(sid).directory, "owner") == "A"
                assert (await cb.delete(f"/session/{mine}")).status_code == 204
                with trio.fail_after(15):
                    while True:
                        status = await cb.get(f"/session/{sid}/status")
                        if status.status_code == 200:
                            break
                        assert status.json()["code"] == "session_limit", status.text
                        await trio.sleep(0.05)  # the slot frees once the close has ended
                assert status.json()["ownerNodeId"] == "B"
        finally:
            a.kill()
            b.kill()
    assert "Traceback" not in b.stderr()


async def test_a_new_session_answered_503_does_not_stay_running(tmp_path: Path) -> None:
    """Redis is frozen while a client creates a session: the answer is 503
    ``cluster_unavailable`` (Redis does not hold it), and the session it would have been
    ends on the node at once; once Redis is back, what reached it of that session is marked
    closed, so no node ever restores it."""
    with redis_server(tmp_path / "redis") as redis, \
            nodes(tmp_path, redis.url, "A") as (a,):
        async with httpx.AsyncClient(base_url=a.url, timeout=TIMEOUT) as ca:
            redis.proc.send_signal(signal.SIGSTOP)
            try:
                created = await ca.post("/session", json={"sessionScope": "thread"})
            finally:
                redis.proc.send_signal(signal.SIGCONT)
            assert created.status_code == 503, created.text
            assert created.json()["code"] == "cluster_unavailable"
            assert int(created.headers["retry-after"]) >= 1
            with trio.fail_after(10):
                while (await ca.get("/daemon/status")).json()["liveSessions"]:
                    await trio.sleep(0.05)  # the refused session ends
            with trio.fail_after(10):
                while True:  # its shipping (creation, then close) reaches Redis
                    keys = [k for k in redis.cli("KEYS", "tk:{*}:dir").split() if k]
                    if keys and all(redis.cli("HGET", k, "closed") == "1" for k in keys):
                        break
                    await trio.sleep(0.05)
            assert len(keys) == 1
            sid = keys[0].split("{", 1)[1].split("}", 1)[0]
            uuid.UUID(sid)
            assert (await ca.get(f"/session/{sid}/status")).status_code == 404
            assert (await ca.post("/session", json={"sessionId": sid})).status_code != 200
            assert not (await ca.get("/daemon/status")).json()["liveSessions"]


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
