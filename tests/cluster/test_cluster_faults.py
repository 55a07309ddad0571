"""Cluster mode through the faults a real deployment meets, injected into real processes (a
real redis-server, real daemon nodes, SIGSTOP/SIGCONT/SIGKILL, Redis restarted), each run
judged by the checker of :mod:`tests.cluster_chaos`: every 202 has exactly one terminal, the
same on every node's followers and in the transcript; nothing at or below a ``durableEventId``
a client saw is lost; no id twice on one stream.

Leases are short (``LEASE_MS``) so the suite stays bounded; ``make chaos-cluster`` runs the
same faults longer and repeatedly (``TK_CHAOS_ROUNDS``).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import httpx
import pytest
import trio

from benchmarks.redis_launcher import HAVE_REDIS, SKIP_REASON, redis_server
from daemon.core.cluster import session_keys
from tests.builders.cluster import lease_gone, owner_of
from tests.cluster_chaos import (
    LEASE_MS,
    TIMEOUT,
    DurableWatch,
    Exited,
    Follower,
    Prompter,
    check,
    final_transcript,
    nodes,
    phantoms,
    prompts_ended,
    prompts_run,
    run_until_exit,
    start_node,
)

pytestmark = [pytest.mark.skipif(not HAVE_REDIS, reason=SKIP_REASON), pytest.mark.processes]
coredis = pytest.importorskip("coredis", reason="coredis is not installed (pip install '.[cluster]')")

ROUNDS = int(os.environ.get("TK_CHAOS_ROUNDS", "1"))


@pytest.fixture(autouse=True, params=range(ROUNDS))
def chaos_round(request: pytest.FixtureRequest) -> int:
    """Every test once in ``make test``; ``make chaos-cluster`` repeats each of them."""
    return int(request.param)


async def test_owner_paused_past_its_lease(tmp_path: Path) -> None:
    """The owner is SIGSTOPped while its turn waits to start streaming, with a prompt sent to
    it meanwhile; B takes the session over; the old owner's agent streams the turn and ends it
    while the old owner sleeps, then it wakes up. None of its late events reaches any client
    (its own readers are cut), the prompt it admitted after losing the lease is not answered
    202 unless the new owner took it, a request to B while the frozen owner's lease runs is
    answered within about a lease (not after 10 s), and every promise holds."""
    with redis_server(tmp_path / "redis") as redis, \
            nodes(tmp_path, redis.url, "AB") as (a, b):
        async with httpx.AsyncClient(base_url=a.url, timeout=TIMEOUT) as ca, \
                httpx.AsyncClient(base_url=b.url, timeout=TIMEOUT) as cb, \
                trio.open_nursery() as nursery:
            sid = (await ca.post("/session", json={})).json()["sessionId"]
            followers = [Follower(ca, sid, "on-A"), Follower(cb, sid, "on-B")]
            for follower in followers:
                nursery.start_soon(follower.run)
            watch = DurableWatch(sid, [ca, cb])
            nursery.start_soon(watch.run)
            prompts = Prompter(sid)
            first = await prompts.send(ca, "A", "p1 mock:start_gate=g1 mock:chunks=3")
            assert first.status == 202, first.body
            p1 = first.body["promptId"]
            for follower in followers:  # the turn started (its echo reached Redis)
                await follower.wait_for(lambda s: s.prompt_id == p1)

            a.proc.send_signal(signal.SIGSTOP)
            late: list[object] = []

            async def prompt_to_paused_owner() -> None:
                late.append(await prompts.send(ca, "A", "p2 mock:chunks=2", timeout=60))

            nursery.start_soon(prompt_to_paused_owner)
            # B forwards to the paused owner: the forward gives up with the lease, not after
            # 10 s; then B answers 503 (the lease still runs) or takes the session over.
            early = await prompts.send(cb, "B", "p-early mock:chunks=1")
            if early.status == 503:
                assert early.body["code"] == "session_owner_unavailable"
                assert "retry-after" in early.headers
            else:
                assert early.status == 202, early.body
            assert early.seconds < 3 * LEASE_MS / 1000 + 2, early.seconds
            assert await owner_of(cb, sid) == "B"  # once the lease ran out
            a.open_gate("g1")  # the old owner's agent streams and ends the turn meanwhile
            with trio.fail_after(10):
                while not any("p1" in line for line in prompts_ended(tmp_path, "A")):
                    await trio.sleep(0.02)  # the agent has written all of it (its log says)
            a.proc.send_signal(signal.SIGCONT)
            with trio.fail_after(30):
                while not late:
                    await trio.sleep(0.05)  # the paused owner's answer to the prompt
            after = await prompts.send(ca, "A", "p3 mock:chunks=2")
            assert after.status == 202, after.body  # through A, to the new owner
            for follower in followers:
                await follower.wait_for_ends(prompts.accepted)
            transcript = await final_transcript(cb, redis.port, sid)
            nursery.cancel_scope.cancel()
    check(transcript, prompts.accepted, followers, watch.durable, all_admitted=[p1])
    assert transcript.terminals(p1) == [("turn_error", "interrupted")]
    assert phantoms(transcript, followers, [p1]) == []


OUTAGE_S = 3 * LEASE_MS / 1000  # past the lease and past the terminal's durability bound


@pytest.mark.parametrize("fault", ["restart", "freeze"])
async def test_redis_outage_past_the_lease(tmp_path: Path, fault: str) -> None:
    """Redis goes away for three leases mid-turn: stopped with SIGTERM and started again on
    its AOF ("restart"), or frozen with SIGSTOP ("freeze"). Meanwhile every node answers 503
    with Retry-After (never a 500, never a hang), a prompt is not acknowledged, and a turn
    that ends meanwhile keeps its terminal back (Redis cannot take it) and degrades its
    session; the queued turn runs once it is shown. Afterwards the owner, alive all along,
    keeps its session (the other node takes nothing over in its grace), the turns end
    ``turn_complete`` as the agent answered, the degradation clears, and every promise
    holds."""
    with redis_server(tmp_path / "redis") as redis, \
            nodes(tmp_path, redis.url, "AB") as (a, b):
        async with httpx.AsyncClient(base_url=a.url, timeout=TIMEOUT) as ca, \
                httpx.AsyncClient(base_url=b.url, timeout=TIMEOUT) as cb, \
                trio.open_nursery() as nursery:
            sid = (await ca.post("/session", json={})).json()["sessionId"]
            followers = [Follower(ca, sid, "on-A"), Follower(cb, sid, "on-B")]
            for follower in followers:
                nursery.start_soon(follower.run)
            watch = DurableWatch(sid, [ca, cb])
            nursery.start_soon(watch.run)
            prompts = Prompter(sid)
            first = await prompts.send(ca, "A", "p1 mock:chunks=3 mock:gate=g1")
            assert first.status == 202, first.body
            p1 = first.body["promptId"]
            queued = await prompts.send(ca, "A", "p2 mock:chunks=3")  # runs after p1's terminal
            assert queued.status == 202, queued.body
            p2 = queued.body["promptId"]
            for follower in followers:
                await follower.wait_for(lambda s: s.prompt_id == p1 and s.chunk == "chunk-2")

            started = trio.current_time()
            if fault == "restart":
                redis.stop()
            else:
                redis.proc.send_signal(signal.SIGSTOP)
            try:
                bound = 2 * LEASE_MS / 1000 + 1  # a lease at most, plus the call's deadline
                for client, name in ((cb, "B"), (ca, "A")):
                    during = await prompts.send(client, name, f"during-{name} mock:chunks=1")
                    assert during.status == 503, (name, during.status, during.body)
                    assert during.body["code"] in ("cluster_unavailable",
                                                   "session_owner_unavailable"), during.body
                    assert int(during.headers["retry-after"]) >= 1
                    assert during.seconds < bound, (name, during.seconds)
                    status = await cb.get(f"/session/{sid}/status")
                    assert status.status_code == 503, status.text
                    assert status.json()["code"] == "cluster_unavailable"
                a.open_gate("g1")  # p1 ends during the outage
                with trio.fail_after(20):
                    while "event=transcript_lagging" not in a.stderr():
                        await trio.sleep(0.05)  # p1's terminal waits past the bound
                await trio.sleep(max(0.0, started + OUTAGE_S - trio.current_time()))  # the fault
                # The owner is the slower one to see Redis again (held for a moment): B is
                # asked first, when every lease has expired.
                a.proc.send_signal(signal.SIGSTOP)
            finally:
                if fault == "restart":
                    redis.start()
                else:
                    redis.proc.send_signal(signal.SIGCONT)
            try:
                first_after = await cb.get(f"/session/{sid}/status")
            finally:
                a.proc.send_signal(signal.SIGCONT)
            # B took nothing over: it forwarded to A (silent: 503 until A is back).
            assert first_after.status_code == 503, first_after.text
            assert first_after.json()["code"] == "session_owner_unavailable"
            assert await owner_of(cb, sid) == "A"
            with trio.move_on_after(20) as stuck:
                while (await ca.get(f"/session/{sid}/status")).json().get(
                        "transcriptDegraded", True):
                    await trio.sleep(0.05)  # Redis catches up; the degradation clears
            assert not stuck.cancelled_caught, "transcriptDegraded stayed true after Redis " \
                "came back and acknowledged everything"
            # The recovery says what was lost: nothing, and what caught up meanwhile.
            recovery = (await ca.get(f"/session/{sid}/status")).json()["transcriptRecovery"]
            assert recovery["lostEvents"] == 0, recovery
            assert recovery["caughtUpEvents"] >= 1, recovery  # p1's terminal at least
            assert recovery["laggedAt"] < recovery["recoveredAt"], recovery
            recovered = [line for line in a.stderr().splitlines()
                         if "event=transcript_recovered" in line]
            assert recovered and "lost_events=0" in recovered[0], recovered
            after = await prompts.send(cb, "B", "p3 mock:chunks=2")
            assert after.status == 202, after.body
            for follower in followers:
                await follower.wait_for_ends(prompts.accepted)
            transcript = await final_transcript(cb, redis.port, sid)
            nursery.cancel_scope.cancel()
    check(transcript, prompts.accepted, followers, watch.durable)
    for prompt_id in (p1, p2):  # as the agent answered: nothing interrupted
        assert transcript.terminals(prompt_id) == [("turn_complete", "end_turn")]
    assert transcript.text(p2) == "chunk-0chunk-1chunk-2"
    assert "event=session_taken_over" not in b.stderr()


async def test_owner_paused_while_admitting_a_prompt(tmp_path: Path) -> None:
    """The issue's lost 202: the owner admits a prompt whose admission cannot reach Redis
    yet (Redis frozen), is paused before it could, B takes the session over, and the owner
    wakes up with its admission refused by the fence. The prompt is answered 503 (its
    admission is not durable), never 202; every promise holds."""
    with redis_server(tmp_path / "redis") as redis, \
            nodes(tmp_path, redis.url, "AB") as (a, b):
        async with httpx.AsyncClient(base_url=a.url, timeout=TIMEOUT) as ca, \
                httpx.AsyncClient(base_url=b.url, timeout=TIMEOUT) as cb, \
                trio.open_nursery() as nursery:
            sid = (await ca.post("/session", json={})).json()["sessionId"]
            followers = [Follower(cb, sid, "on-B")]
            nursery.start_soon(followers[0].run)
            prompts = Prompter(sid)
            answered: list[object] = []
            with trio.fail_after(10):  # right after a renewal: the lease is A's for a while
                while int(redis.cli("PTTL", session_keys(sid).lease)) < LEASE_MS - 150:
                    await trio.sleep(0.01)
            redis.proc.send_signal(signal.SIGSTOP)
            try:
                async def admit() -> None:
                    answered.append(await prompts.send(ca, "A", "p1 mock:chunks=2", timeout=60))

                nursery.start_soon(admit)
                with trio.fail_after(10):
                    while not (await ca.get(f"/session/{sid}/status")).json()[
                            "pendingPrompts"]:
                        await trio.sleep(0.01)  # admitted: it waits for its 202 to run
                a.proc.send_signal(signal.SIGSTOP)
            finally:
                redis.proc.send_signal(signal.SIGCONT)
            try:
                assert await owner_of(cb, sid, timeout=30) == "B"
            finally:
                a.proc.send_signal(signal.SIGCONT)
            with trio.fail_after(30):
                while not answered:
                    await trio.sleep(0.05)  # the woken owner's answer
            assert prompts.answers[0].status == 503, prompts.answers[0].body
            with trio.fail_after(15):
                while "event=lease_lost" not in a.stderr():
                    await trio.sleep(0.05)
            after = await prompts.send(ca, "A", "p2 mock:chunks=2")  # to B, through A
            assert after.status == 202, after.body
            await followers[0].wait_for_ends(prompts.accepted)
            transcript = await final_transcript(cb, redis.port, sid)
            nursery.cancel_scope.cancel()
    check(transcript, prompts.accepted, followers, {})


async def test_owner_killed_mid_turn(tmp_path: Path) -> None:
    """SIGKILL of the owner mid-turn with readers on every node: B and C keep their streams
    (a resync of the new epoch), the cut prompt ends ``interrupted`` after every chunk that
    was durable, a prompt sent through B (503 + Retry-After while the lease runs, then the
    takeover) runs, and every promise holds."""
    with redis_server(tmp_path / "redis") as redis, \
            nodes(tmp_path, redis.url, "ABC") as (a, b, c):
        async with httpx.AsyncClient(base_url=a.url, timeout=TIMEOUT) as ca, \
                httpx.AsyncClient(base_url=b.url, timeout=TIMEOUT) as cb, \
                httpx.AsyncClient(base_url=c.url, timeout=TIMEOUT) as cc, \
                trio.open_nursery() as nursery:
            sid = (await ca.post("/session", json={})).json()["sessionId"]
            on_a = Follower(ca, sid, "on-A")
            followers = [on_a, Follower(cb, sid, "on-B"), Follower(cc, sid, "on-C")]
            for follower in followers:
                nursery.start_soon(follower.run)
            watch = DurableWatch(sid, [cb, cc, ca])
            nursery.start_soon(watch.run)
            prompts = Prompter(sid)
            first = await prompts.send(cc, "C", "p1 mock:chunks=5 mock:gate=g1")
            assert first.status == 202, first.body
            p1 = first.body["promptId"]
            chunk4 = await followers[1].wait_for(lambda s: s.prompt_id == p1
                                                 and s.chunk == "chunk-4")
            with trio.fail_after(10):
                while watch.durable.get(chunk4.epoch, 0) < chunk4.id:
                    await trio.sleep(0.02)  # a client saw the turn's chunks durable
            a.proc.send_signal(signal.SIGKILL)
            await trio.to_thread.run_sync(a.proc.wait)
            refused = 0
            with trio.fail_after(30):
                while True:  # what the SDK does: resend after Retry-After
                    answer = await prompts.send(cb, "B", "p2 mock:chunks=2")
                    if answer.status == 202:
                        break
                    assert answer.status == 503, answer.body
                    assert answer.body["code"] == "session_owner_unavailable", answer.body
                    refused += 1
                    await trio.sleep(0.1)
            for follower in followers[1:]:
                await follower.wait_for_ends(prompts.accepted)
            transcript = await final_transcript(cb, redis.port, sid)
            nursery.cancel_scope.cancel()
    check(transcript, prompts.accepted, followers[1:], watch.durable)
    check(transcript, [], [on_a], watch.durable)  # what A's reader saw before A died
    assert transcript.terminals(p1) == [("turn_error", "interrupted")]
    assert transcript.text(p1) == "".join(f"chunk-{n}" for n in range(5))


async def test_a_node_id_is_one_live_process(tmp_path: Path) -> None:
    """A second process with a live node's id is refused (one line, exit 1) and the live
    node keeps its sessions; once that node is dead, its id starts again at once. A process
    that was paused while another one took its id over leaves the cluster when it wakes
    (one line, exit 1) instead of fighting over its sessions."""
    with redis_server(tmp_path / "redis") as redis:
        with nodes(tmp_path, redis.url, "A") as (a,):
            async with httpx.AsyncClient(base_url=a.url, timeout=TIMEOUT) as ca:
                sid = (await ca.post("/session", json={})).json()["sessionId"]
                twin = run_until_exit(tmp_path, redis.url, "A")
                assert twin.returncode == 1, twin.stderr[-2000:]
                assert len(twin.daemon_lines) == 1, twin.stderr[-2000:]
                assert "in use by a live node" in twin.daemon_lines[0]
                assert a.url in twin.daemon_lines[0]
                assert "listening" not in twin.stdout  # nothing was served
                status = (await ca.get(f"/session/{sid}/status")).json()
                assert status["ownerNodeId"] == "A"
                assert redis.cli("HGET", session_keys(sid).directory, "gen") == "1"
            a.kill()
        with nodes(tmp_path, redis.url, "A") as (again,):  # the dead one's id, at once
            async with httpx.AsyncClient(base_url=again.url, timeout=TIMEOUT) as cagain:
                assert await owner_of(cagain, sid) == "A"
            again.proc.send_signal(signal.SIGSTOP)  # looks dead: its beat stops
            third = start_node(tmp_path, redis.url, "A", tag="A-third")
            try:
                # It watched the paused process's beat stand still, or (on a machine slow
                # enough to take three leases to start) found its registration expired.
                log = third.stderr()
                assert "event=node_id_taken_from_dead_process" in log \
                    or "event=node_id_held" not in log
                again.proc.send_signal(signal.SIGCONT)
                code = await trio.to_thread.run_sync(again.proc.wait, 30)
                assert code == 1
                lines = [line for line in again.stderr().splitlines()
                         if line.startswith("python -m daemon:")]
                assert len(lines) == 1 and "taken over by another process" in lines[0], lines
                async with httpx.AsyncClient(base_url=third.url, timeout=TIMEOUT) as cthird:
                    assert await owner_of(cthird, sid) == "A"
                    ok = await cthird.post(f"/session/{sid}/prompt", json={"prompt": [
                        {"type": "text", "text": "after mock:chunks=1"}]})
                    assert ok.status_code == 202, ok.text
            finally:
                third.kill()


async def test_a_spoofed_forward_is_routed_as_a_client_request(tmp_path: Path) -> None:
    """``X-Turnkeeper-Forwarded`` from a client, with no signature, a forged one or one made
    with another secret, proves nothing: B (which holds a stale copy of the session, A owns
    it) routes such requests like any other and forwards them to A. Nothing runs on B, the
    prompts reach Redis, A keeps the session."""
    from daemon.core.cluster_auth import sign

    with redis_server(tmp_path / "redis") as redis, \
            nodes(tmp_path, redis.url, "AB") as (a, b):
        async with httpx.AsyncClient(base_url=a.url, timeout=TIMEOUT) as ca, \
                httpx.AsyncClient(base_url=b.url, timeout=TIMEOUT) as cb:
            sid = (await cb.post("/session", json={})).json()["sessionId"]
            done = await cb.post(f"/session/{sid}/prompt", json={"prompt": [
                {"type": "text", "text": "on-b mock:chunks=1"}]})
            assert done.status_code == 202
            # B's agent dies: the session ends there, its lease is let go; A takes it over.
            agents = (await cb.get("/daemon/status")).json()["agents"]
            os.kill(int(agents[0]["pid"]), signal.SIGKILL)
            await lease_gone(redis.cli, sid)
            assert await owner_of(ca, sid) == "A"
            generation = redis.cli("HGET", session_keys(sid).directory, "gen")
            path = f"/session/{sid}/prompt"
            forged = {"x-turnkeeper-forwarded": "A", "x-turnkeeper-signature":
                      sign(b"not-the-cluster-secret", "POST", path, "A", 0, "n" * 16, b"")}
            spoofs = [{"x-turnkeeper-forwarded": "1"},
                      {"x-turnkeeper-forwarded": "A",
                       "x-turnkeeper-signature": "t=1,n=abcdefgh,s=" + "0" * 64},
                      forged]
            texts = []
            for n, headers in enumerate(spoofs):
                load = await cb.post(f"/session/{sid}/load", json={}, headers=headers)
                assert load.status_code == 200, load.text
                text = f"spoofed-{n} mock:chunks=1"
                resp = await cb.post(path, headers=headers, json={"prompt": [
                    {"type": "text", "text": text}]})
                assert resp.status_code == 202, resp.text
                texts.append(text)
            with trio.fail_after(15):
                while len([t for t in texts if any(t in line for line in
                                                   prompts_ended(tmp_path, "A"))]) < 3:
                    await trio.sleep(0.05)  # they ran on A
            assert not [t for t in texts if any(t in line for line in prompts_run(tmp_path, "B"))]
            status = (await cb.get(f"/session/{sid}/status")).json()
            assert status["ownerNodeId"] == "A"
            assert redis.cli("HGET", session_keys(sid).directory, "gen") == generation
            assert b.stderr().count("event=forward_rejected") >= 6
            transcript = await final_transcript(ca, redis.port, sid)
            records = [e for e in transcript.records if e["type"] == "session_update"]
            for text in texts:
                assert any(text in str(e) for e in records), text


async def test_a_node_url_that_does_not_reach_the_node_is_refused(tmp_path: Path) -> None:
    """``--node-url`` must reach the node itself: a URL nobody answers, and a URL another
    daemon answers, each stop the node at start with one line and status 1."""
    from benchmarks.redis_launcher import free_port

    with redis_server(tmp_path / "redis") as redis, \
            nodes(tmp_path, redis.url, "A") as (a,):
        refusals: dict[str, Exited] = {}

        async def refused(name: str, url: str) -> None:
            refusals[name] = await trio.to_thread.run_sync(
                lambda: run_until_exit(tmp_path, redis.url, name, "--node-url", url))

        async with trio.open_nursery() as both:  # the two starts at once
            both.start_soon(refused, "X", f"http://127.0.0.1:{free_port()}")
            both.start_soon(refused, "Y", a.url)
        nobody, other = refusals["X"], refusals["Y"]
    for refused, why in ((nobody, "does not reach this node"),
                         (other, "another server answered")):
        assert refused.returncode == 1, refused.stderr[-2000:]
        assert len(refused.daemon_lines) == 1, refused.stderr[-2000:]
        assert why in refused.daemon_lines[0] and "--node-url" in refused.daemon_lines[0]
        assert "turnkeeper daemon listening" not in refused.stdout
