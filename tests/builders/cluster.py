"""Builders shared by the cluster-mode tests (tests/cluster/): what they ask a node and Redis
while faults run. Node and redis-server start-up is :mod:`tests.cluster_chaos` and
:mod:`benchmarks.redis_launcher`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import trio

from daemon.core.cluster import decode_op, session_keys


async def owner_of(client: httpx.AsyncClient, sid: str, timeout: float = 20) -> str:
    """The session's owner once a status answers (a takeover may be needed first)."""
    with trio.fail_after(timeout):
        while True:
            resp = await client.get(f"/session/{sid}/status")
            if resp.status_code == 200:
                return str(resp.json()["ownerNodeId"])
            await trio.sleep(0.05)  # polling the cluster's own answer


async def lease_gone(redis_cli: Callable[..., str], sid: str, timeout: float = 20) -> None:
    """Until the session's lease key is gone from Redis (``redis_cli``: a RedisServer's cli)."""
    with trio.fail_after(timeout):
        while redis_cli("PTTL", session_keys(sid).lease) != "-2":
            await trio.sleep(0.02)  # polling Redis' own state


async def op_log(redis_port: int, sid: str) -> list[Any]:
    """The session's transcript operations in Redis, decoded, oldest first."""
    import coredis  # the cluster extra; the modules that call this skip without it

    client = coredis.Redis(host="127.0.0.1", port=redis_port)
    async with client:
        return [decode_op(raw) for raw in await client.lrange(session_keys(sid).ops, 0, -1)]


async def stream_entries(redis_port: int, sid: str) -> list[dict[bytes, bytes]]:
    """The session's event stream in Redis, each entry's fields."""
    import coredis

    client = coredis.Redis(host="127.0.0.1", port=redis_port)
    async with client:
        return [dict(e.field_values) for e in await client.xrange(session_keys(sid).events)]
