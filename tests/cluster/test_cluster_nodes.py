"""Cluster mode with real parts: a real redis-server (AOF on) and real daemon processes on
loopback, the bundled mock agent behind each.

- A node refuses a Redis without AOF: exit status 1, one line, nothing served.
- Three nodes: a session created on A, subscribers on B and C, a prompt through C, a mid-turn
  load through B equal to A's, SIGKILL of A mid-turn, 503 + Retry-After while its lease runs,
  takeover by C, every event up to the last durableEventId survives, exactly one terminal
  (interrupted) for the cut prompt, resync of a new epoch for the surviving subscribers, and a
  new prompt that works.
- Fencing: the owner SIGSTOPped past its lease, a takeover, SIGCONT: its late events never
  reach Redis.
- One flow on a 3-master Redis Cluster.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from benchmarks.redis_launcher import HAVE_REDIS, SKIP_REASON, redis_cluster, redis_server
from daemon.core.cluster import event_run, session_keys
from daemon.core.envelope import decode_json
from daemon.core.transcript_ops import AppendEvent, FinishTurn
from sdk._client import DaemonClient
from tests.builders.cluster import op_log, stream_entries
from tests.harness import RunningDaemon, start_daemon
from tests.sse_client import Subscriber, chunk_kind, is_terminal_for

pytestmark = [pytest.mark.skipif(not HAVE_REDIS, reason=SKIP_REASON), pytest.mark.processes]
coredis = pytest.importorskip("coredis", reason="coredis is not installed (pip install '.[cluster]')")

LEASE_MS = 1500
SECRET = "node-tests-cluster-secret"
TIMEOUT = httpx.Timeout(30)


@contextmanager
def nodes(base: Path, redis_url: str, names: str, *extra: str, token: str | None = None,
          env: dict[str, str] | None = None) -> Iterator[list[RunningDaemon]]:
    env = {"TURNKEEPER_CLUSTER_SECRET": SECRET, **(env or {})}
    if token is not None:
        env["QWEN_SERVER_TOKEN"] = token
    with ExitStack() as stack:
        out = []
        for name in names:
            daemon = start_daemon(base, ["--cluster-redis", redis_url, "--node-id", name,
                                         "--lease-ms", str(LEASE_MS), *extra], env, tag=name)
            stack.callback(daemon.kill)
            stack.callback(_resume, daemon)  # a SIGSTOPped node must be able to die
            out.append(daemon)
        yield out


def _resume(daemon: RunningDaemon) -> None:
    if daemon.proc.poll() is None:
        daemon.proc.send_signal(signal.SIGCONT)


async def wait_status(client: httpx.AsyncClient, sid: str, *, timeout: float = 20
                      ) -> tuple[list[httpx.Response], dict[str, Any]]:
    """Ask for the session's status until one answers 200 (a takeover may be needed first);
    every answer before it is returned too."""
    seen: list[httpx.Response] = []
    with trio.fail_after(timeout):
        while True:
            resp = await client.get(f"/session/{sid}/status")
            if resp.status_code == 200:
                return seen, resp.json()
            seen.append(resp)
            await trio.sleep(0.1)  # polling the cluster's own answer


async def cut_quietly(sub: Subscriber, *,
                      task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    try:
        await sub.run(task_status=task_status)
    except (httpx.RemoteProtocolError, httpx.ReadError):
        pass


def without_client(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k != "clientId"}


def test_node_refuses_redis_without_aof(tmp_path: Path) -> None:
    with redis_server(tmp_path / "redis", appendonly=False) as server:
        done = subprocess.run(
            [sys.executable, "-m", "daemon", "--port", "0", "--data-dir", str(tmp_path / "d"),
             "--workspace", str(tmp_path), "--cluster-redis", server.url],
            capture_output=True, timeout=60, cwd=str(tmp_path),
            env={**os.environ, "TURNKEEPER_CLUSTER_SECRET": SECRET})
    assert done.returncode == 1
    assert b"listening" not in done.stdout  # nothing was served
    lines = [line for line in done.stderr.decode().splitlines()
             if line.startswith("python -m daemon:")]
    assert len(lines) == 1, done.stderr.decode()
    assert "AOF persistence off" in lines[0] and f"127.0.0.1:{server.port}" in lines[0]


async def test_three_nodes_subscribe_forward_load_kill_take_over(tmp_path: Path) -> None:
    with redis_server(tmp_path / "redis") as redis, \
            nodes(tmp_path, redis.url, "ABC", env={"MOCK_ACP_LOAD_SESSION": "1"}) as (a, b, c):
        async with httpx.AsyncClient(base_url=a.url, timeout=TIMEOUT) as ca, \
                httpx.AsyncClient(base_url=b.url, timeout=TIMEOUT) as cb, \
                httpx.AsyncClient(base_url=c.url, timeout=TIMEOUT) as cc, \
                trio.open_nursery() as nursery:
            created = (await ca.post("/session", json={})).json()
            sid, epoch_a = created["sessionId"], created["eventEpoch"]
            _, status = await wait_status(cc, sid)
            assert status["ownerNodeId"] == "A"  # placement: the node that got POST /session
            assert status["eventEpoch"] == epoch_a
            subs = [Subscriber(client, f"/session/{sid}/events", {"Last-Event-ID": "0"})
                    for client in (cb, cc)]
            for sub in subs:
                await nursery.start(cut_quietly, sub)
                assert sub.status == 200
                assert sub.response_headers is not None
                assert sub.response_headers["x-qwen-event-epoch"] == epoch_a
            # A prompt through C, held by its gate after five chunks.
            resp = await cc.post(f"/session/{sid}/prompt", json={"prompt": [
                {"type": "text", "text": "first mock:chunks=5 mock:gate=g1"}]})
            assert resp.status_code == 202, resp.text
            p1 = resp.json()["promptId"]
            for sub in subs:
                await sub.wait_for(lambda e: e.prompt_id == p1 and chunk_kind(e)
                                   == "agent_message_chunk" and e.data["update"]["content"]
                                   ["text"] == "chunk-4")
            # Both readers saw the same frames with the owner's ids.
            seen = [[(e.id, e.type) for e in sub.events if e.id is not None] for sub in subs]
            assert seen[0] == seen[1] and seen[0]
            # A mid-turn load through B answers what the owner answers (markers included).
            load_b = (await cb.post(f"/session/{sid}/load", json={})).json()
            load_a = (await ca.post(f"/session/{sid}/load", json={})).json()
            assert load_b["hasActivePrompt"] is True and load_b["liveJournal"]
            assert without_client(load_b) == without_client(load_a)
            # Everything published is acknowledged by Redis while the turn waits at its gate.
            last_chunk = max(i for i, _ in seen[0])
            with trio.fail_after(10):
                while True:
                    durable = (await cb.get(f"/session/{sid}/status")).json()["durableEventId"]
                    if durable >= last_chunk:
                        break
                    await trio.sleep(0.05)  # the group commit to Redis is under way

            a.proc.send_signal(signal.SIGKILL)
            await trio.to_thread.run_sync(a.proc.wait)
            survived = [op for op in await op_log(redis.port, sid)
                        if isinstance(op, AppendEvent)]
            ids = [int(decode_json(line)["id"]) for op in survived
                   for line in event_run(op)[2].split(b"\n")]
            assert ids == list(range(ids[0], ids[0] + len(ids)))
            assert ids[-1] >= durable  # every event up to the last durableEventId survived

            # While A's lease runs, B answers 503 with Retry-After (the owner is gone). The
            # lease's remaining time is read from Redis first: with half a second or more
            # left, the answer must be the 503 (it is, but for a machine slow enough to take
            # that long between the two calls).
            left_ms = int(redis.cli("PTTL", session_keys(sid).lease))
            early = await cb.get(f"/session/{sid}/status")
            if left_ms >= 500:
                assert early.status_code == 503, early.text
            if early.status_code == 503:
                body = early.json()
                assert body["retryable"] is True and body["code"] == "session_owner_unavailable"
                assert 1 <= int(early.headers["retry-after"]) <= 2
            # After it ran out, the first request takes the session over (here: C).
            _, status = await wait_status(cc, sid)
            assert status["ownerNodeId"] == "C"
            assert "via=session/load" in c.stderr()  # the agent session itself came back
            epoch_c = status["eventEpoch"]
            assert epoch_c != epoch_a
            # The readers on B and C keep their streams: the resync of a new epoch, then the
            # new owner's events.
            last_id = max(i for i, _ in seen[0])
            for sub in subs:
                resync = await sub.wait_for(lambda e: e.type == "state_resync_required")
                assert resync.data["reason"] == "epoch_reset"
                assert resync.data["detail"] == "epoch_mismatch"
                assert resync.data["lastDeliveredId"] == last_id
                assert not sub.ended
            # A reader that reconnects with the old epoch gets the same resync.
            again = Subscriber(cb, f"/session/{sid}/events", {
                "Last-Event-ID": str(last_id), "X-Qwen-Event-Epoch": epoch_a})
            await nursery.start(cut_quietly, again)
            resync = await again.wait_for(lambda e: e.type == "state_resync_required")
            assert resync.data["reason"] == "epoch_reset"
            assert resync.data.get("detail") == "epoch_mismatch"

            # Exactly one terminal for the cut prompt: interrupted, after what survived.
            load = (await cb.post(f"/session/{sid}/load", json={})).json()
            ledger = [t for t in load["promptTerminals"] if t["promptId"] == p1]
            assert [t["terminal"] for t in ledger] == ["interrupted"]
            records = (await cb.get(f"/session/{sid}/transcript", params={"limit": 500})
                       ).json()["events"]
            mine = [e for e in records if e.get("promptId") == p1]
            terminals = [e for e in mine if e["type"] in ("turn_complete", "turn_error")]
            assert len(terminals) == 1 and terminals[0]["data"]["code"] == "interrupted"
            text = "".join(e["data"]["update"]["content"]["text"] for e in mine
                           if e["type"] == "session_update" and e["data"]["update"]
                           .get("sessionUpdate") == "agent_message_chunk")
            assert text == "".join(f"chunk-{n}" for n in range(5))

            # A new prompt works, through B, on the new owner.
            resp = await cb.post(f"/session/{sid}/prompt", json={"prompt": [
                {"type": "text", "text": "second"}]})
            assert resp.status_code == 202, resp.text
            p2 = resp.json()["promptId"]
            for reader in (again, *subs):
                done = await reader.wait_for(is_terminal_for(p2))
                assert done.type == "turn_complete"
            # After the resync, the kept streams carry exactly the new epoch's events, in order.
            for sub in subs:
                at = next(i for i, e in enumerate(sub.events)
                          if e.type == "state_resync_required")
                ids = [e.id for e in sub.events[at + 1:] if e.id is not None]
                assert ids == list(range(ids[0], ids[0] + len(ids)))
                assert not [e for e in sub.events[at + 1:] if e.prompt_id == p1
                            and e.type in ("turn_complete", "turn_error")]
            nursery.cancel_scope.cancel()


async def test_fencing_a_paused_owner_cannot_append_after_a_takeover(tmp_path: Path) -> None:
    with redis_server(tmp_path / "redis") as redis, \
            nodes(tmp_path, redis.url, "AB") as (a, b):
        async with httpx.AsyncClient(base_url=a.url, timeout=TIMEOUT) as ca, \
                httpx.AsyncClient(base_url=b.url, timeout=TIMEOUT) as cb:
            sid = (await ca.post("/session", json={})).json()["sessionId"]
            resp = await ca.post(f"/session/{sid}/prompt", json={"prompt": [
                {"type": "text", "text": "late mock:chunks=2 mock:gate=g2"}]})
            p1 = resp.json()["promptId"]
            with trio.fail_after(10):
                while (await ca.get(f"/session/{sid}/status")).json()["durableEventId"] < 3:
                    await trio.sleep(0.05)  # the chunks reach Redis
            a.proc.send_signal(signal.SIGSTOP)
            # Past the lease: Redis drops it; then B takes the session over.
            with trio.fail_after(10):
                while redis.cli("PTTL", session_keys(sid).lease) != "-2":
                    await trio.sleep(0.05)
            _, status = await wait_status(cb, sid)
            assert status["ownerNodeId"] == "B"
            before = await stream_entries(redis.port, sid)
            # The old owner's agent finishes the turn while its daemon is paused; then the
            # daemon resumes and publishes the late events.
            a.open_gate("g2")
            a.proc.send_signal(signal.SIGCONT)
            with trio.fail_after(15):
                while "event=lease_lost" not in a.stderr():
                    await trio.sleep(0.05)  # the old owner finds out from Redis
            after = await stream_entries(redis.port, sid)
            assert after[:len(before)] == before
            late = [e for e in after[len(before):] if e[b"e"].decode() != status["eventEpoch"]]
            assert late == []  # nothing of the old owner's epoch after the takeover
            assert b"turn_complete" not in b"".join(e[b"b"] for e in after)
            ops = await op_log(redis.port, sid)
            finishes = [op for op in ops if isinstance(op, FinishTurn) and op.prompt_id == p1]
            assert [op.terminal for op in finishes] == ["interrupted"]
            load = (await cb.post(f"/session/{sid}/load", json={})).json()
            assert [t["terminal"] for t in load["promptTerminals"]
                    if t["promptId"] == p1] == ["interrupted"]


async def test_fencing_a_paused_owner_s_late_appends_meet_the_generation_check(
        tmp_path: Path) -> None:
    """The append path's own fence. The owner is paused right after a renewal (its next one is
    lease/3 away), its lease is gone (dropped here as its expiry would drop it) and another
    node claims the session: the window between a new owner's claim and its first write,
    where the op log is still exactly as the old owner left it, so only the generation tells
    the old owner's appends apart. On SIGCONT the old owner publishes the rest of its turn
    before any renewal could tell it anything: its append is refused by the generation check
    (nothing of it lands), then the session goes on on a real node."""
    from daemon.core.cluster import CLAIM_SCRIPT, IDLE_RETENTION_MS

    lease_ms = 15_000
    keys = session_keys
    with redis_server(tmp_path / "redis") as redis, \
            nodes(tmp_path, redis.url, "AB", "--lease-ms", str(lease_ms)) as (a, b):
        async with httpx.AsyncClient(base_url=a.url, timeout=TIMEOUT) as ca, \
                httpx.AsyncClient(base_url=b.url, timeout=TIMEOUT) as cb:
            sid = (await ca.post("/session", json={})).json()["sessionId"]
            resp = await ca.post(f"/session/{sid}/prompt", json={"prompt": [
                {"type": "text", "text": "late mock:chunks=2 mock:gate=g3"}]})
            p1 = resp.json()["promptId"]
            with trio.fail_after(10):
                while (await ca.get(f"/session/{sid}/status")).json()["durableEventId"] < 3:
                    await trio.sleep(0.05)  # the chunks reach Redis
            with trio.fail_after(10):  # a renewal just happened (its PX was set < 1 s ago)
                while int(redis.cli("PTTL", keys(sid).lease)) < lease_ms - 1000:
                    await trio.sleep(0.02)
            a.proc.send_signal(signal.SIGSTOP)
            redis.cli("DEL", keys(sid).lease)  # what its expiry does
            client = coredis.Redis(host="127.0.0.1", port=redis.port)
            async with client:
                claim = client.register_script(CLAIM_SCRIPT)
                # Node T claims it (its URL answers nothing: until its short lease runs out,
                # requests elsewhere get 503) and has not written anything yet.
                got = await claim(keys=keys(sid).all(), args=[
                    "T", "http://127.0.0.1:9", str(tmp_path), "epoch-t", 800,
                    IDLE_RETENTION_MS])
                assert got[0] == 1
            before = await stream_entries(redis.port, sid)
            ops_before = await op_log(redis.port, sid)
            a.open_gate("g3")
            a.proc.send_signal(signal.SIGCONT)
            with trio.fail_after(15):
                while "event=lease_lost" not in a.stderr():
                    await trio.sleep(0.05)  # the old owner finds out from Redis
            assert await stream_entries(redis.port, sid) == before  # nothing landed
            assert await op_log(redis.port, sid) == ops_before
            # ... because its append met the generation check (not a renewal, not the length).
            assert f'event=lease_lost session={sid} reason="append fenced"' in a.stderr()
            # B takes the session over once T's lease is gone: one interrupted terminal.
            _, status = await wait_status(cb, sid)
            assert status["ownerNodeId"] == "B"
            finishes = [op for op in await op_log(redis.port, sid)
                        if isinstance(op, FinishTurn) and op.prompt_id == p1]
            assert [op.terminal for op in finishes] == ["interrupted"]


async def test_op_log_is_compacted_and_a_closed_session_expires(tmp_path: Path) -> None:
    """Each finished turn's raw events leave the Redis op log (its FinishTurn holds the
    compacted records); a takeover of the compacted log restores exactly the transcript the
    owner served; the session's keys carry the idle retention while it lives and the closed
    retention once a client deleted it."""
    from daemon.core.cluster import CLOSED_RETENTION_MS, IDLE_RETENTION_MS

    keys = session_keys
    with redis_server(tmp_path / "redis") as redis, \
            nodes(tmp_path, redis.url, "AB", env={"MOCK_ACP_LOAD_SESSION": "1"}) as (a, b):
        async with httpx.AsyncClient(base_url=a.url, timeout=TIMEOUT) as ca, \
                httpx.AsyncClient(base_url=b.url, timeout=TIMEOUT) as cb, \
                trio.open_nursery() as nursery:
            sid = (await ca.post("/session", json={})).json()["sessionId"]
            sub = Subscriber(ca, f"/session/{sid}/events")
            await nursery.start(cut_quietly, sub)
            for n in range(2):
                resp = await ca.post(f"/session/{sid}/prompt", json={"prompt": [
                    {"type": "text", "text": f"turn{n} mock:chunks=4"}]})
                assert resp.status_code == 202, resp.text
                await sub.wait_for(is_terminal_for(resp.json()["promptId"]))
            # A terminal is shown once Redis holds it, and the turn's compaction is part of
            # that: no deadline to wait out (a loaded machine missed one), the log is compact.
            ops = await op_log(redis.port, sid)
            assert not [op for op in ops if isinstance(op, AppendEvent)], ops
            assert [type(op).__name__ for op in ops].count("FinishTurn") == 2
            for key in (keys(sid).directory, keys(sid).ops, keys(sid).events):
                assert IDLE_RETENTION_MS - 60_000 < int(redis.cli("PTTL", key)) \
                    <= IDLE_RETENTION_MS
            served = (await ca.get(f"/session/{sid}/transcript", params={"limit": 500})
                      ).json()["events"]
            assert len(served) > 2
            nursery.cancel_scope.cancel()
        a.kill()
        # The SDK asks B at once: 503 + Retry-After while A's lease runs, resent until B
        # took the session over.
        async with DaemonClient(b.url) as sdk_client:
            sdk_status = await sdk_client.session_status(sid)
            stats = sdk_client.statistics()
        assert sdk_status.owner_node_id == "B"
        assert stats.count("status") >= 2 and stats.failures == stats.count("status") - 1
        async with httpx.AsyncClient(base_url=b.url, timeout=TIMEOUT) as cb:
            restored = (await cb.get(f"/session/{sid}/transcript", params={"limit": 500})
                        ).json()["events"]
            assert restored == served
            assert (await cb.delete(f"/session/{sid}")).status_code == 204
            with trio.fail_after(10):
                while redis.cli("HGET", keys(sid).directory, "closed") != "1":
                    await trio.sleep(0.05)
            for key in (keys(sid).directory, keys(sid).ops, keys(sid).events):
                assert 0 < int(redis.cli("PTTL", key)) <= CLOSED_RETENTION_MS
            assert redis.cli("EXISTS", keys(sid).lease) == "0"
            assert (await cb.get(f"/session/{sid}/status")).status_code == 404


async def test_status_counts_the_readers_of_mirrors_on_other_nodes(tmp_path: Path) -> None:
    """``subscribers`` in a session's status is the whole cluster's (the owner's own readers
    and those of the mirrors on other nodes), ``subscribersByNode`` the breakdown; the same on
    every node. A reader leaving is withdrawn; a dead node's report goes stale and drops out."""
    async def by_node(client: httpx.AsyncClient, sid: str, want: dict[str, int]) -> None:
        with trio.fail_after(15):
            while True:
                status = (await client.get(f"/session/{sid}/status")).json()
                if status.get("subscribersByNode") == want:
                    assert status["subscribers"] == sum(want.values())
                    return
                await trio.sleep(0.05)  # polling the owner's own answer

    with redis_server(tmp_path / "redis") as redis, \
            nodes(tmp_path, redis.url, "ABC") as (a, b, c):
        async with httpx.AsyncClient(base_url=a.url, timeout=TIMEOUT) as ca, \
                httpx.AsyncClient(base_url=b.url, timeout=TIMEOUT) as cb, \
                httpx.AsyncClient(base_url=c.url, timeout=TIMEOUT) as cc, \
                trio.open_nursery() as nursery:
            sid = (await ca.post("/session", json={})).json()["sessionId"]
            async with trio.open_nursery() as leaves:
                for client, where in ((ca, nursery), (cb, nursery), (cb, leaves), (cc, nursery)):
                    await where.start(cut_quietly, Subscriber(client, f"/session/{sid}/events"))
                await by_node(ca, sid, {"A": 1, "B": 2, "C": 1})
                await by_node(cc, sid, {"A": 1, "B": 2, "C": 1})  # forwarded: the owner's
                leaves.cancel_scope.cancel()  # one of B's readers leaves
            await by_node(cb, sid, {"A": 1, "B": 1, "C": 1})
            # C dies: its report is never withdrawn and goes stale (B's refreshes keep the
            # hash itself alive), so it drops out.
            c.kill()
            await by_node(ca, sid, {"A": 1, "B": 1})
            nursery.cancel_scope.cancel()


async def test_one_flow_on_a_redis_cluster(tmp_path: Path) -> None:
    auth = {"Authorization": "Bearer cluster-secret"}
    with redis_cluster(tmp_path / "rc") as cluster, \
            nodes(tmp_path, cluster.url, "AB", token="cluster-secret") as (a, b):
        async with httpx.AsyncClient(base_url=a.url, timeout=TIMEOUT, headers=auth) as ca, \
                httpx.AsyncClient(base_url=b.url, timeout=TIMEOUT, headers=auth) as cb, \
                trio.open_nursery() as nursery:
            assert "redis_cluster=True" in a.stderr()
            for _ in range(3):  # sessions land on different slots
                sid = (await ca.post("/session", json={"sessionScope": "thread"})).json()[
                    "sessionId"]
                sub = Subscriber(cb, f"/session/{sid}/events", {"Last-Event-ID": "0"})
                await nursery.start(cut_quietly, sub)
                resp = await cb.post(f"/session/{sid}/prompt", json={"prompt": [
                    {"type": "text", "text": "hello"}]})
                assert resp.status_code == 202, resp.text
                done = await sub.wait_for(is_terminal_for(resp.json()["promptId"]))
                assert done.type == "turn_complete"
                # The owner shows a terminal once Redis holds it, so B's mirror can see it a
                # moment before the owner's status counts it as published: wait for both.
                with trio.fail_after(20):
                    while True:
                        _, status = await wait_status(cb, sid)
                        if status["durableEventId"] == status["lastEventId"]:
                            break
                        await trio.sleep(0.05)
                assert status["ownerNodeId"] == "A"
                # POST /session naming it, on B: attached to A's session, not a new one.
                attached = (await cb.post("/session", json={"sessionId": sid})).json()
                assert attached["attached"] is True and attached["sessionId"] == sid
                assert attached["eventEpoch"] == status["eventEpoch"]
                # The same auth on the forwarded path: without the token, 401 (B's guard).
                bare = await cb.get(f"/session/{sid}/status", headers={"Authorization": ""})
                assert bare.status_code == 401
            # Deleted through B (forwarded to A): gone on every node, never restored.
            assert (await cb.delete(f"/session/{sid}")).status_code == 204
            for client in (ca, cb):
                for method, path in (("GET", "status"), ("POST", "load")):
                    gone = await client.request(method, f"/session/{sid}/{path}", json={})
                    assert gone.status_code == 404, (method, path, gone.text)
                    assert gone.json()["code"] == "session_not_found"
            nursery.cancel_scope.cancel()


async def test_webui_repair_episode_across_nodes(tmp_path: Path) -> None:
    """The WebUI model's repair of a truncated live turn (its tab on B, the prompt on A):
    B forwards both loads to A and serves the stream from A's Redis stream."""
    from sdk._client import DaemonClient
    from sdk._repair_driver import RepairOutcomeKind
    from tests.builders.webui_e2e import TWENTY, CountingTransport, chunk_counts, is_live_marker
    from webui_model import WebUIProvider

    token = "cluster-repair"
    with redis_server(tmp_path / "redis") as redis, \
            nodes(tmp_path, redis.url, "AB", "--max-journal-events", "3",
                  "--max-journal-bytes", "300") as (a, b):
        counted = CountingTransport()
        async with DaemonClient(a.url) as direct, \
                DaemonClient(b.url, transport=counted) as ui_client, \
                WebUIProvider(ui_client) as provider:
            sid = (await direct.create_session(scope="thread")).session_id
            accepted = await direct.send_prompt(sid, f"{token} mock:chunks=20 mock:gate={token}")
            with trio.fail_after(30):
                async with direct.events(sid, 0) as stream:
                    async for event in stream:
                        if chunk_kind(event) == "agent_message_chunk" \
                                and event.data["update"]["content"]["text"] == "chunk-19":
                            break
            await provider.open_session(sid)
            markers = [blk for blk in provider.store.blocks if is_live_marker(blk)]
            assert len(markers) == 1 and markers[0].prompt_id == accepted.prompt_id
            counts = chunk_counts(provider)
            assert 0 not in counts and counts[19] == 1
            assert counted.loads == 1
            a.open_gate(token)
            with trio.fail_after(30):
                await provider.wait_for(lambda: provider.repair_attempts == 1)
            (outcome,) = provider.repair_outcomes
            assert outcome.kind is RepairOutcomeKind.REPAIRED
            assert counted.loads == 2
            assert chunk_counts(provider) == TWENTY
            assert not any(is_live_marker(blk) for blk in provider.store.blocks)
            assert [h for h in counted.requests if h[1].endswith("/events")]  # streamed from B


async def test_durable_event_id_is_what_redis_acknowledged(tmp_path: Path) -> None:
    """With Redis paused (SIGSTOP), the owner keeps publishing a turn admitted before, but
    durableEventId does not move: it counts what Redis acknowledged, not what the local store
    committed. Once Redis resumes, the queued ops land and it catches up. (The lease is long
    here so that the owner's status answers from memory all along; with a short one the
    owner's lease falls in doubt and its status waits for Redis, see test_cluster_faults.)"""
    with redis_server(tmp_path / "redis") as redis, \
            nodes(tmp_path, redis.url, "A", "--lease-ms", "8000") as (a,):
        async with httpx.AsyncClient(base_url=a.url, timeout=TIMEOUT) as ca:
            sid = (await ca.post("/session", json={})).json()["sessionId"]
            resp = await ca.post(f"/session/{sid}/prompt", json={"prompt": [
                {"type": "text", "text": "paused mock:start_gate=s3 mock:chunks=3 mock:gate=g3"}]})
            assert resp.status_code == 202
            with trio.fail_after(10):
                while True:  # the admission and the echo are in Redis
                    before = (await ca.get(f"/session/{sid}/status")).json()
                    if before["durableEventId"] == before["lastEventId"] > 0:
                        break
                    await trio.sleep(0.02)
            redis.proc.send_signal(signal.SIGSTOP)
            try:
                a.open_gate("s3")
                with trio.fail_after(10):
                    while True:
                        status = (await ca.get(f"/session/{sid}/status")).json()
                        if status["lastEventId"] >= before["lastEventId"] + 3:
                            break
                        await trio.sleep(0.02)  # the three chunks are published
                assert status["durableEventId"] == before["durableEventId"]
            finally:
                redis.proc.send_signal(signal.SIGCONT)
            with trio.fail_after(10):
                while (await ca.get(f"/session/{sid}/status")).json()["durableEventId"] \
                        < status["lastEventId"]:
                    await trio.sleep(0.02)  # the queued ops reach Redis
            a.open_gate("g3")


async def test_a_full_speed_turn_reaches_a_reader_on_another_node_whole(tmp_path: Path) -> None:
    """A turn at the agent's full speed, read on B through A's Redis stream: every id, in
    order, the terminal last, no eviction or resync (the mirror publishes the owner's batches
    one by one). The turn is sized to fit one reader's queue (1,900 chunks against
    ``maxQueued=2048``), so however slowly a loaded machine runs this reader it cannot be
    evicted for being slow; what is checked is that the owner's batches (dozens of Redis
    entries) arrive whole and in order. A reader slower than the agent over more than its
    queue is evicted by design, as on a single node."""
    with redis_server(tmp_path / "redis") as redis, \
            nodes(tmp_path, redis.url, "AB") as (a, b):
        async with httpx.AsyncClient(base_url=a.url, timeout=TIMEOUT) as ca, \
                httpx.AsyncClient(base_url=b.url, timeout=TIMEOUT) as cb, \
                trio.open_nursery() as nursery:
            sid = (await ca.post("/session", json={})).json()["sessionId"]
            sub = Subscriber(cb, f"/session/{sid}/events?maxQueued=2048")
            await nursery.start(cut_quietly, sub)
            resp = await ca.post(f"/session/{sid}/prompt", json={"prompt": [
                {"type": "text", "text": "fast mock:chunks=1900 mock:delay_ms=0"}]})
            done = await sub.wait_for(is_terminal_for(resp.json()["promptId"]), timeout=60)
            assert done.type == "turn_complete"
            ids = sub.ids()
            assert ids == list(range(1, done.id + 1))  # type: ignore[operator]
            assert not sub.of_type("client_evicted") and not sub.of_type("state_resync_required")
            nursery.cancel_scope.cancel()


async def test_votes_and_cancel_through_a_non_owner(tmp_path: Path) -> None:
    """A permission vote and a cancel sent to B reach the session on A (forwarded), with the
    client id B's caller registered through a forwarded load."""
    with redis_server(tmp_path / "redis") as redis, \
            nodes(tmp_path, redis.url, "AB") as (a, b):
        async with httpx.AsyncClient(base_url=a.url, timeout=TIMEOUT) as ca, \
                httpx.AsyncClient(base_url=b.url, timeout=TIMEOUT) as cb, \
                trio.open_nursery() as nursery:
            sid = (await ca.post("/session", json={})).json()["sessionId"]
            client_id = (await cb.post(f"/session/{sid}/load", json={})).json()["clientId"]
            mine = {"X-Qwen-Client-Id": client_id}
            sub = Subscriber(cb, f"/session/{sid}/events")
            await nursery.start(cut_quietly, sub)
            resp = await cb.post(f"/session/{sid}/prompt", headers=mine, json={"prompt": [
                {"type": "text", "text": "ask mock:chunks=1 mock:permission=ask"}]})
            assert resp.status_code == 202, resp.text
            p1 = resp.json()["promptId"]
            ask = await sub.wait_for(lambda e: e.type == "permission_request")
            vote = await cb.post(f"/session/{sid}/permission/{ask.data['requestId']}",
                                 json={"optionId": "allow-once"})
            assert vote.status_code == 200, vote.text
            done = await sub.wait_for(is_terminal_for(p1))
            assert done.type == "turn_complete"
            assert any(e.type == "session_update" and e.data["update"]["content"]["text"]
                       == "permission:allow-once" for e in sub.events if chunk_kind(e))
            unknown = await cb.post(f"/session/{sid}/permission/nope", json={"optionId": "x"})
            assert unknown.status_code == 404  # the owner's answer, as it is
            assert unknown.json()["code"] == "permission_not_found"
            # A held turn, cancelled through B.
            resp = await cb.post(f"/session/{sid}/prompt", headers=mine, json={"prompt": [
                {"type": "text", "text": "hold mock:chunks=1 mock:gate=never"}]})
            p2 = resp.json()["promptId"]
            await sub.wait_for(lambda e: e.prompt_id == p2 and chunk_kind(e)
                               == "agent_message_chunk")
            assert (await cb.post(f"/session/{sid}/cancel", headers=mine)).status_code == 204
            done = await sub.wait_for(is_terminal_for(p2))
            assert done.data["stopReason"] == "cancelled"
            cancelled = [e for e in sub.of_type("prompt_cancelled") if e.prompt_id == p2]
            assert len(cancelled) == 1 and cancelled[0].originator_client_id == client_id
            nursery.cancel_scope.cancel()


async def test_websocket_and_heartbeats_on_another_node(tmp_path: Path) -> None:
    """A WebSocket reader on B of a session owned by A (the mirror serves WebSocket as well),
    and the SSE heartbeat of a quiet mirror stream."""
    import msgspec
    from trio_websocket import open_websocket_url

    with redis_server(tmp_path / "redis") as redis, \
            nodes(tmp_path, redis.url, "AB", "--heartbeat-ms", "300") as (a, b):
        async with httpx.AsyncClient(base_url=a.url, timeout=TIMEOUT) as ca, \
                httpx.AsyncClient(base_url=b.url, timeout=TIMEOUT) as cb, \
                trio.open_nursery() as nursery:
            sid = (await ca.post("/session", json={})).json()["sessionId"]
            quiet = Subscriber(cb, f"/session/{sid}/events")
            await nursery.start(cut_quietly, quiet)
            await quiet.wait_raw(b": heartbeat\n\n")
            url = b.url.replace("http://", "ws://") + f"/session/{sid}/ws?lastEventId=0"
            async with open_websocket_url(url) as ws:
                pid = (await ca.post(f"/session/{sid}/prompt", json={"prompt": [
                    {"type": "text", "text": "mock:chunks=50 mock:delay_ms=0"}]})).json()[
                    "promptId"]
                frames: list[dict[str, Any]] = []
                with trio.fail_after(20):
                    while not frames or frames[-1].get("type") != "turn_complete":
                        frames.append(msgspec.json.decode(await ws.get_message()))
            assert frames[0]["type"] == "replay_complete"
            ids = [f["id"] for f in frames if "id" in f]
            assert ids == list(range(1, len(ids) + 1))
            assert frames[-1]["data"]["promptId"] == pid
            nursery.cancel_scope.cancel()


async def test_slow_client_rules_on_another_node(tmp_path: Path) -> None:
    """On B, a reader that stops reading (a raw socket with a small receive buffer) of a
    session owned by A is warned and evicted by B's mirror, with the single-node rules, while
    a healthy reader beside it on B loses nothing (turns of 1,500 events, each under the
    healthy reader's caps even unread, the next one only once it has the terminal)."""
    from tests.stalls import TURN_TEXT, open_stalled_sse

    with redis_server(tmp_path / "redis") as redis, \
            nodes(tmp_path, redis.url, "AB") as (a, b):
        async with httpx.AsyncClient(base_url=a.url, timeout=TIMEOUT) as ca, \
                httpx.AsyncClient(base_url=b.url, timeout=TIMEOUT) as cb, \
                trio.open_nursery() as nursery:
            sid = (await ca.post("/session", json={})).json()["sessionId"]
            healthy = Subscriber(cb, f"/session/{sid}/events?maxQueued=2048",
                                 {"Last-Event-ID": "0"})
            await nursery.start(cut_quietly, healthy)
            stalled = open_stalled_sse(b.url, sid)
            last = None
            for _ in range(10):
                resp = await ca.post(f"/session/{sid}/prompt", json={"prompt": [
                    {"type": "text", "text": TURN_TEXT}]})
                last = await healthy.wait_for(is_terminal_for(resp.json()["promptId"]),
                                              timeout=60)
                if "event=client_evicted" in b.stderr():
                    break
            stalled.close()
            log = b.stderr()
            assert "event=slow_client_warning" in log and "event=client_evicted" in log
            assert "event=client_evicted" not in a.stderr()  # B's rule, on B's readers
            assert last is not None and last.type == "turn_complete" and last.id is not None
            assert healthy.ids() == list(range(1, last.id + 1))
            assert not healthy.of_type("client_evicted")
            assert not healthy.of_type("state_resync_required")
            nursery.cancel_scope.cancel()


async def test_sessions_on_a_node_lists_the_sessions_it_runs(tmp_path: Path) -> None:
    """GET /sessions in cluster mode is the node's: its live sessions, not those another node
    runs (even one it could forward to), nor sessions its own store holds for others."""
    with redis_server(tmp_path / "redis") as redis, \
            nodes(tmp_path, redis.url, "AB") as (a, b):
        async with httpx.AsyncClient(base_url=a.url, timeout=TIMEOUT) as ca, \
                httpx.AsyncClient(base_url=b.url, timeout=TIMEOUT) as cb:
            on_a = [(await ca.post("/session", json={"sessionScope": "thread"})).json()[
                "sessionId"] for _ in range(3)]
            on_b = (await cb.post("/session", json={"sessionScope": "thread"})).json()[
                "sessionId"]
            # B answers for A's sessions (it forwards), but lists only its own.
            assert (await cb.get(f"/session/{on_a[0]}/status")).status_code == 200
            for client, mine in ((ca, on_a), (cb, [on_b])):
                listed, cursor = [], None
                while True:
                    params = {"limit": "2", **({"cursor": cursor} if cursor else {})}
                    page = (await client.get("/sessions", params=params)).json()
                    listed.extend(page["sessions"])
                    if not page["hasMore"]:
                        break
                    cursor = page["nextCursor"]
                assert sorted(s["sessionId"] for s in listed) == sorted(mine)
                assert {s["state"] for s in listed} == {"idle"}
            assert (await ca.get("/sessions", params={"state": "unloaded"})).json()[
                "sessions"] == []
