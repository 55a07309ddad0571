"""A prompt sent through a non-owner node to a slow or paused owner, and resent, runs once: a
real redis-server, real nodes, SIGSTOP/SIGCONT, the SDK's own resends (same
``Idempotency-Key``), and the mock agents' prompt logs (one per node) as the witness of what ran.

Node A owns the session and is reached by the other nodes through a relay (tests/fault_proxy.py
in lockstep mode, as A's ``--node-url``): the test sees every request forwarded to A, can hold
A's answer to one, and knows when A has answered each of them, even those whose sender gave
up. An SDK client sends a prompt to node B, which forwards it to A; A admits it (its 202 is a
promise in Redis) but its answer is held by the relay past B's forward timeout (a lease):

- ``slow``: A is alive, only slow to answer: B answers 503 ``session_owner_unavailable``, the
  SDK sends the prompt again, B forwards it to A, which answers with the first admission
  (``Idempotent-Replayed``).
- ``paused``: A is SIGSTOPped once it admitted the prompt and its agent got it, past its
  lease: B takes the session over from Redis, where the admission and its key are, and
  answers the request it still holds (or a resend) with the first admission (the takeover
  never runs an in-flight prompt again); then A wakes up.

Either way the prompt ran once on all the nodes' agents together, the call returned that
prompt, ``find_prompt`` on either node says so, and every forward carried the client's key.
A third case stops A between its 202 and the hand-off to its agent (a test seam in the daemon
holds the runner there): the prompt ends ``interrupted`` on B, and A, once awake, never hands it
to its agent.

Broken on purpose: the forward without the key runs the prompt twice in both (on A twice; on A
and on B); the SDK resending with a new key runs it twice on A in ``slow``.
"""

from __future__ import annotations

import json
import signal
import socket
from pathlib import Path

import httpx
import pytest
import trio

from benchmarks.redis_launcher import HAVE_REDIS, SKIP_REASON, redis_server
from sdk import DaemonClient, PromptAccepted, PromptRetryPolicy
from tests.cluster_chaos import LEASE_MS, TIMEOUT, prompts_run, resume, start_node
from tests.fault_proxy import Chaos, FaultProxy, Request

pytestmark = [pytest.mark.skipif(not HAVE_REDIS, reason=SKIP_REASON), pytest.mark.processes]
pytest.importorskip("coredis", reason="coredis is not installed (pip install '.[cluster]')")

PROMPT_PATH = r"^/session/[^/]+/prompt$"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def runs(base: Path, text: str) -> dict[str, int]:
    return {name: sum(json.loads(line)["text"] == text for line in prompts_run(base, name))
            for name in "AB"}


async def wait_idle(client: httpx.AsyncClient, sid: str) -> None:
    with trio.fail_after(30):
        while True:
            resp = await client.get(f"/session/{sid}/status")
            if resp.status_code == 200 and not resp.json()["hasActivePrompt"] \
                    and resp.json()["pendingPrompts"] == 0:
                return
            await trio.sleep(0.05)  # polling the cluster's own answer


class HoldFirstAnswer:
    """The relay's plan: A's answer to the first prompt forwarded to it is held past B's
    forward timeout; everything else is relayed (in lockstep: answered in full)."""

    def __init__(self) -> None:
        self.prompts = 0

    def __call__(self, request: Request) -> Chaos | None:
        if request.method != "POST" or not request.path.endswith("/prompt"):
            return None
        self.prompts += 1
        return Chaos("stall_answer", stall_s=3 * LEASE_MS / 1000) if self.prompts == 1 else None


@pytest.mark.parametrize("owner", ["slow", "paused"])
async def test_a_prompt_forwarded_to_a_slow_owner_and_resent_runs_once(
        tmp_path: Path, owner: str) -> None:
    text = f"forwarded-once-{owner} mock:chunks=2"
    port = free_port()
    relay = FaultProxy(f"http://127.0.0.1:{port}")
    relay.chaos = HoldFirstAnswer()
    with redis_server(tmp_path / "redis") as redis:
        async with trio.open_nursery() as nursery:
            await nursery.start(relay.run)
            # A probes its --node-url (the relay) before it says it is up: start it off the loop.
            a = await trio.to_thread.run_sync(lambda: start_node(
                tmp_path, redis.url, "A", "--port", str(port), "--node-url", relay.url))
            b = await trio.to_thread.run_sync(lambda: start_node(tmp_path, redis.url, "B"))
            try:
                async with httpx.AsyncClient(base_url=a.url, timeout=TIMEOUT) as ca, \
                        httpx.AsyncClient(base_url=b.url, timeout=TIMEOUT) as cb, \
                        DaemonClient(b.url, timeout=30, prompt_retry=PromptRetryPolicy(
                            timeout_s=60)) as client:
                    sid = (await ca.post("/session", json={})).json()["sessionId"]
                    paused = False
                    try:
                        async with trio.open_nursery() as sending:
                            sent: list[PromptAccepted] = []

                            async def send() -> None:
                                with trio.fail_after(60):
                                    sent.append(await client.send_prompt(sid, text))

                            sending.start_soon(send)
                            # A admitted the prompt: its answer reached the relay, which holds it.
                            with trio.fail_after(30):
                                await relay.wait_for(lambda: any(
                                    r.path.endswith("/prompt") for r, _ in relay.answers))
                            if owner == "paused":
                                # A's agent got the prompt (A's runner handed it over) before
                                # A stops: the case proves "ran on A, not run again by B".
                                with trio.fail_after(30):
                                    while runs(tmp_path, text)["A"] == 0:
                                        await trio.sleep(0.02)  # polling A's agent's log
                                a.proc.send_signal(signal.SIGSTOP)
                                paused = True
                        [accepted] = sent
                    finally:
                        if paused:
                            a.proc.send_signal(signal.SIGCONT)
                    assert relay.count("POST", PROMPT_PATH) >= (1 if owner == "paused" else 2)
                    # A has answered every prompt forwarded to it (the relay read the answers
                    # of the forwards B gave up on), and the turn B admitted has ended.
                    with trio.fail_after(30):
                        await relay.wait_for(lambda: sum(
                            1 for r, _ in relay.answers if r.path.endswith("/prompt")) ==
                            relay.count("POST", PROMPT_PATH))
                    await wait_idle(cb, sid)
                    now_owner = (await cb.get(f"/session/{sid}/status")).json()["ownerNodeId"]
                    assert now_owner == ("A" if owner == "slow" else "B")
                    stale = [head.split(b"\r\n", 1)[0] for r, head in relay.answers
                             if r.path.endswith("/prompt")]
                    ran = runs(tmp_path, text)
                    print(f"\nruns={ran} owner={now_owner} forwards_to_A={stale} "
                          f"lease_ms={LEASE_MS}")
                    assert sum(ran.values()) == 1, ran
                    # Every forward carried the client's key.
                    key = {r.headers.get("idempotency-key") for r, _ in relay.answers
                           if r.path.endswith("/prompt")}
                    assert len(key) == 1 and None not in key, key
                    for node in (ca, cb):
                        found = await node.get(f"/session/{sid}/prompts/{next(iter(key))}")
                        assert found.status_code == 200, found.text
                        assert found.json()["promptId"] == accepted.prompt_id
                        assert found.json()["state"] in ("completed", "interrupted")
            finally:
                resume(a)
                a.kill()
                b.kill()
            nursery.cancel_scope.cancel()


async def poll(check: object, what: str, timeout: float = 30) -> None:
    """Wait (polling, under a deadline) until ``check()`` is true."""
    assert callable(check)
    with trio.fail_after(timeout):
        while not check():
            await trio.sleep(0.02)  # polling files the processes write


async def test_an_owner_stopped_between_its_202_and_the_hand_off_never_runs_the_prompt(
        tmp_path: Path) -> None:
    """A answers 202 for a prompt, then stops before its runner handed it to the agent (the
    daemon's test seam holds the runner there: ``TURNKEEPER_TEST_DISPATCH_HOLD``), past its
    lease. B takes the session over and ends the prompt ``interrupted``. A wakes, finds its
    lease lost, and only then is its runner let go: it must not hand the prompt to A's agent.
    Broken on purpose (the gate answering True without asking Redis): A's agent runs it."""
    from daemon.cluster import DISPATCH_HOLD_ENV

    hold = tmp_path / "hold"
    hold.mkdir()
    text = "stopped-before-hand-off mock:chunks=2"
    key = "stopped-before-hand-off-key"
    with redis_server(tmp_path / "redis") as redis:
        a = await trio.to_thread.run_sync(lambda: start_node(
            tmp_path, redis.url, "A", env={DISPATCH_HOLD_ENV: str(hold)}))
        b = await trio.to_thread.run_sync(lambda: start_node(tmp_path, redis.url, "B"))
        try:
            async with httpx.AsyncClient(base_url=a.url, timeout=TIMEOUT) as ca, \
                    httpx.AsyncClient(base_url=b.url, timeout=TIMEOUT) as cb:
                sid = (await ca.post("/session", json={})).json()["sessionId"]
                sent = await ca.post(f"/session/{sid}/prompt", headers={"Idempotency-Key": key},
                                     json={"prompt": [{"type": "text", "text": text}]})
                assert sent.status_code == 202, sent.text
                await poll(lambda: (hold / "held").exists(), "A's runner at the gate")
                a.proc.send_signal(signal.SIGSTOP)
                try:
                    with trio.fail_after(60):
                        while True:  # B forwards to A (stopped) until A's lease runs out
                            status = await cb.get(f"/session/{sid}/status")
                            if status.status_code == 200 and \
                                    status.json()["ownerNodeId"] == "B":
                                break
                            await trio.sleep(0.05)  # polling the cluster's own answer
                    found = await cb.get(f"/session/{sid}/prompts/{key}")
                    assert found.status_code == 200, found.text
                    assert found.json()["state"] == "interrupted", found.json()
                finally:
                    a.proc.send_signal(signal.SIGCONT)
                await poll(lambda: f"event=lease_lost session={sid}" in a.stderr(),
                           "A found its lease lost")
                (hold / "go").touch()
                await poll(lambda: f"event=session_ended session={sid}" in a.stderr(),
                           "A's session ended")
                ran = runs(tmp_path, text)
                print(f"\nruns={ran}")
                assert ran == {"A": 0, "B": 0}
                found = await cb.get(f"/session/{sid}/prompts/{key}")
                assert found.json()["state"] == "interrupted", found.json()
        finally:
            resume(a)
            a.kill()
            b.kill()
