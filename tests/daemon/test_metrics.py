"""GET /metrics read over a real socket from a real daemon: the Prometheus text format, parsed by
Prometheus' own parser, with each counter and gauge moved by the thing it counts (a turn, two
subscribers on two transports, a stalled reader evicted, a killed agent started again)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families
from trio_websocket import open_websocket_url

from daemon.core.guards import Guard, is_loopback_peer
from tests.harness import RunningDaemon, running_daemon
from tests.stalls import TURN_TEXT, open_stalled_sse, poll, run_turn

pytestmark = pytest.mark.processes  # starts processes: not in make unit-fast

TOKEN = "metrics-token-1234"
AUTH = {"Authorization": f"Bearer {TOKEN}"}

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    with running_daemon(tmp_path_factory.mktemp("metrics"), ["--token", TOKEN]) as d:
        yield d


async def scrape(client: httpx.AsyncClient) -> Samples:
    resp = await client.get("/metrics")
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("text/plain")
    samples: Samples = {}
    for family in text_string_to_metric_families(resp.text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def test_metrics_need_the_token(daemon: RunningDaemon) -> None:
    async with httpx.AsyncClient(base_url=daemon.url) as anonymous:
        resp = await anonymous.get("/metrics")
    assert resp.status_code == 401
    assert resp.json()["code"] == "unauthorized"


async def test_a_turn_moves_the_counters(daemon: RunningDaemon) -> None:
    async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH, timeout=30) as client:
        before = await scrape(client)
        sid = (await client.post("/session", json={"sessionScope": "thread"})).json()[
            "sessionId"]
        ws_url = daemon.url.replace("http://", "ws://") + f"/session/{sid}/ws"
        async with client.stream("GET", f"/session/{sid}/events") as sse, \
                open_websocket_url(ws_url, extra_headers=list(AUTH.items())):
            during = await scrape(client)
            assert value(during, "turnkeeper_subscribers", transport="sse") \
                == value(before, "turnkeeper_subscribers", transport="sse") + 1
            assert value(during, "turnkeeper_subscribers", transport="ws") \
                == value(before, "turnkeeper_subscribers", transport="ws") + 1
            await run_turn(client, sid, "mock:chunks=10")
            last_id = (await client.get(f"/session/{sid}/status")).json()["lastEventId"]
            assert sse.status_code == 200

            async def delivered_to_both() -> bool:
                now = await scrape(client)
                return (value(now, "turnkeeper_events_delivered_total")
                        - value(before, "turnkeeper_events_delivered_total")) >= 2 * last_id
            await poll(delivered_to_both, 30, "both subscribers to be handed every event")
        after = await scrape(client)

        async def subscribers_gone() -> bool:
            now = await scrape(client)
            return value(now, "turnkeeper_subscribers", transport="sse") \
                == value(before, "turnkeeper_subscribers", transport="sse") \
                and value(now, "turnkeeper_subscribers", transport="ws") \
                == value(before, "turnkeeper_subscribers", transport="ws")
        await poll(subscribers_gone, 30, "the subscriber gauges to fall back")
    # The user echo, ten chunks and the terminal at least: every event id of the session.
    published = value(after, "turnkeeper_events_published_total") \
        - value(before, "turnkeeper_events_published_total")
    assert published >= last_id >= 12
    assert value(after, "turnkeeper_prompts_total", outcome="completed") \
        == value(before, "turnkeeper_prompts_total", outcome="completed") + 1
    assert value(after, "turnkeeper_transcript_commit_seconds_count") \
        > value(before, "turnkeeper_transcript_commit_seconds_count")
    assert value(after, "turnkeeper_sessions", state="idle") >= 1
    assert value(after, "turnkeeper_agents") >= 1
    data = Path(daemon.data_dir)
    on_disk = sum(os.stat(p).st_size for p in data.glob("transcript.sqlite3*")
                  if p.name in ("transcript.sqlite3", "transcript.sqlite3-wal"))
    assert 0 < value(after, "turnkeeper_transcript_bytes") <= on_disk + (1 << 20)
    assert value(after, "process_resident_memory_bytes") > 0


async def test_an_eviction_is_counted_by_reason(daemon: RunningDaemon) -> None:
    async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH, timeout=30) as client:
        sid = (await client.post("/session", json={"sessionScope": "thread"})).json()[
            "sessionId"]
        before = await scrape(client)
        stalled = open_stalled_sse(daemon.url, sid, headers=AUTH)
        try:
            for _ in range(10):
                await run_turn(client, sid, TURN_TEXT)
                if (await client.get(f"/session/{sid}/status")).json()["clientsEvicted"]:
                    break
            after = await scrape(client)
        finally:
            stalled.close()
    evicted_before = sum(v for (name, _), v in before.items()
                         if name == "turnkeeper_clients_evicted_total")
    by_reason = {dict(labels)["reason"]: v for (name, labels), v in after.items()
                 if name == "turnkeeper_clients_evicted_total"}
    assert sum(by_reason.values()) == evicted_before + 1, by_reason
    assert all(reason.startswith("queue_") for reason in by_reason), by_reason


async def test_a_killed_agent_started_again_is_a_restart(daemon: RunningDaemon) -> None:
    async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH, timeout=30) as client:
        sid = (await client.post("/session", json={"sessionScope": "thread"})).json()[
            "sessionId"]
        await run_turn(client, sid, "mock:chunks=1")
        before = await scrape(client)
        pids = [agent["pid"] for agent in (await client.get("/daemon/status")).json()["agents"]]
        assert pids
        for pid in pids:
            os.kill(pid, signal.SIGKILL)

        async def agents_gone() -> bool:
            return not (await client.get("/daemon/status")).json()["agents"]
        await poll(agents_gone, 30, "the agent's exit to be seen")
        created = await client.post("/session", json={"sessionScope": "thread"})
        assert created.status_code == 200, created.text
        after = await scrape(client)
    assert value(after, "turnkeeper_agent_restarts_total") \
        == value(before, "turnkeeper_agent_restarts_total") + 1


async def test_loopback_scraper_without_token(tmp_path: Path) -> None:
    with running_daemon(tmp_path, ["--token", TOKEN, "--metrics-loopback-no-auth"]) as d:
        async with httpx.AsyncClient(base_url=d.url, timeout=30) as anonymous:
            samples = await scrape(anonymous)
            assert ("turnkeeper_events_published_total", ()) in samples
            # Only the metrics: every other route still needs the token.
            assert (await anonymous.get("/daemon/status")).status_code == 401
    await trio.lowlevel.checkpoint()


def test_the_loopback_exemption_is_for_loopback_peers_and_metrics_only() -> None:
    guard = Guard(token=TOKEN, loopback_bind=False, bind_hostname="0.0.0.0",
                  allow_origins=frozenset(), metrics_loopback_no_auth=True)
    headers = {"host": "example.test"}
    assert guard.check("GET", "/metrics", headers, peer_loopback=True) is None
    denied = guard.check("GET", "/metrics", headers, peer_loopback=False)
    assert denied is not None and denied.status == 401
    denied = guard.check("GET", "/daemon/status", headers, peer_loopback=True)
    assert denied is not None and denied.status == 401
    strict = Guard(token=TOKEN, loopback_bind=False, bind_hostname="0.0.0.0",
                   allow_origins=frozenset())
    denied = strict.check("GET", "/metrics", headers, peer_loopback=True)
    assert denied is not None and denied.status == 401
    assert is_loopback_peer(("127.0.0.1", 5)) and is_loopback_peer(("::1", 5))
    assert not is_loopback_peer(("10.0.0.1", 5)) and not is_loopback_peer(None)


async def test_cluster_leases_and_takeovers(tmp_path: Path) -> None:
    """Two nodes on a real redis-server: the owner holds the session's lease; once it is killed
    and its lease ran out, the other node takes the session over and counts it."""
    from benchmarks.redis_launcher import HAVE_REDIS, SKIP_REASON, redis_server

    if not HAVE_REDIS:
        pytest.skip(SKIP_REASON)
    pytest.importorskip("coredis", reason="coredis is not installed (pip install '.[cluster]')")
    from tests.cluster_chaos import nodes

    with redis_server(tmp_path / "redis") as redis, \
            nodes(tmp_path, redis.url, "AB", lease_ms=1000) as (a, b):
        async with httpx.AsyncClient(base_url=a.url, timeout=30) as ca, \
                httpx.AsyncClient(base_url=b.url, timeout=30) as cb:
            sid = (await ca.post("/session", json={})).json()["sessionId"]
            assert value(await scrape(ca), "turnkeeper_cluster_leases") == 1
            before = await scrape(cb)
            assert value(before, "turnkeeper_cluster_leases") == 0
            a.kill()

            async def taken_over() -> bool:
                resp = await cb.post(f"/session/{sid}/load", json={})
                return resp.status_code == 200
            await poll(taken_over, 30, "node B to take the session over")
            after = await scrape(cb)
    assert value(after, "turnkeeper_cluster_leases") == 1
    assert value(after, "turnkeeper_cluster_takeovers_total") \
        == value(before, "turnkeeper_cluster_takeovers_total") + 1
