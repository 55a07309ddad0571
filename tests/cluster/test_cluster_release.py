"""A release retires the lease: nothing the former owner sent before it lands after it.

Two nodes' lease machinery (:class:`daemon.cluster._membership.Membership`, each with a Redis
client of its own) on a real redis-server. The owner's renewal is held between the node and
Redis by a seam on its script (it is "on the wire") until the release has run, so Redis runs
the two in the harmful order every time: no sleeps, no timing. The lease is long (a minute):
nothing here can pass because a lease ran out.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from benchmarks.redis_launcher import HAVE_REDIS, SKIP_REASON, RedisServer, redis_server
from daemon.core.cluster import session_keys

pytestmark = [pytest.mark.skipif(not HAVE_REDIS, reason=SKIP_REASON), pytest.mark.processes]
pytest.importorskip("coredis", reason="coredis is not installed (pip install '.[cluster]')")

LEASE_MS = 60_000
SID = "2f0c1d6e-6d55-4c4a-9a8b-5d0c8a3f1e01"
Script = Callable[..., Awaitable[Any]]


@asynccontextmanager
async def node(server: RedisServer, name: str) -> AsyncIterator[Any]:
    """One node's Membership on ``server``, its ``on_lost`` calls recorded in ``.lost_calls``."""
    from daemon.cluster._membership import Membership
    from daemon.cluster._redis import Redis

    redis = Redis(server.url, name, LEASE_MS / 1000)
    async with redis.open():
        membership = Membership(redis, name, f"http://{name}.invalid", LEASE_MS)
        lost: list[str] = []
        membership.on_lost.append(lost.append)
        membership.lost_calls = lost  # type: ignore[attr-defined]
        yield membership


def hold(membership: Any, name: str, wrap: Callable[[Script], Script]) -> None:
    """Put ``wrap(script)`` in place of the node's script ``name`` (the test's seam between
    the node and Redis)."""
    redis = membership.redis
    real = getattr(redis.scripts, name)
    redis._scripts = dataclasses.replace(redis.scripts, **{name: wrap(real)})


def held_until(sent: trio.Event, go: trio.Event) -> Callable[[Script], Script]:
    """A script call that reports it was sent, then reaches Redis only once ``go`` is set."""
    def wrap(real: Script) -> Script:
        async def call(**kw: Any) -> Any:
            sent.set()
            await go.wait()
            return await real(**kw)
        return call
    return wrap


def lease_of(server: RedisServer) -> str:
    return server.cli("GET", session_keys(SID).lease)


async def test_a_renewal_sent_before_a_graceful_release_cannot_bring_the_lease_back(
        tmp_path: Path) -> None:
    """A renews, its renewal is held on the wire, A releases the session (idle, or a
    draining node); then the renewal reaches Redis. It is refused: the lease stays gone, B
    claims the session at once, and A does not take the refusal for a loss (nothing fenced,
    nobody told). The same when A itself claimed the session again before its late renewal
    landed: A keeps its new lease."""
    with redis_server(tmp_path / "r") as server:
        async with node(server, "A") as a, node(server, "B") as b:
            assert await a.claim(SID, "/w", "e1") == 1
            sent, go = trio.Event(), trio.Event()
            hold(a, "renew", held_until(sent, go))
            renewed: list[bool] = []

            async def renew() -> None:
                renewed.append(await a.renew(SID))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(renew)
                await sent.wait()  # the renewal is on its way, with generation 1
                await a.release(SID, closed=False)
                assert not a.owns(SID) and lease_of(server) == ""
                go.set()  # now Redis runs it, after the release
            assert renewed == [False]
            assert lease_of(server) == ""  # not brought back
            assert a.lost_calls == [] and SID not in a.fenced
            assert await b.claim(SID, "/w", "e2") is not None  # at once, not a lease later
            assert lease_of(server).startswith("B ")
            assert await b.renew(SID) and b.lost_calls == []
            await b.release(SID, closed=False)

            # A claims it again before its late renewal lands: refused, A keeps the new lease.
            generation = await a.claim(SID, "/w", "e3")
            assert generation is not None
            sent, go = trio.Event(), trio.Event()
            hold(a, "renew", held_until(sent, go))
            renewed.clear()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(renew)
                await sent.wait()
                await a.release(SID, closed=False)
                again = await a.claim(SID, "/w", "e4")
                assert again is not None and again > generation
                go.set()
            assert renewed == [False]
            assert a.owns(SID) and a.generation(SID) == again
            assert lease_of(server) == f"A {again}"
            assert a.lost_calls == [] and SID not in a.fenced


async def test_a_refused_renewal_read_before_the_release_s_answer_is_no_loss(
        tmp_path: Path) -> None:
    """Redis ran the release first, but the node reads the renewal's refusal before the
    release's answer (two connections; the release's answer is held by the seam): the
    renewal waits for that answer, which says the lease was given up, so no loss is
    reported. A release Redis did not run (it fails) leaves the refusal a real loss."""
    with redis_server(tmp_path / "r") as server:
        async with node(server, "A") as a:
            assert await a.claim(SID, "/w", "e1") == 1
            landed, answer, refused = trio.Event(), trio.Event(), trio.Event()

            def release_answer_held(real: Script) -> Script:
                async def call(**kw: Any) -> Any:
                    result = await real(**kw)
                    landed.set()  # Redis ran the release ...
                    await answer.wait()  # ... its answer is not read yet
                    return result
                return call

            def renew_after_release(real: Script) -> Script:
                async def call(**kw: Any) -> Any:
                    await landed.wait()
                    result = await real(**kw)
                    refused.set()  # read by the node: it goes on without a checkpoint
                    return result
                return call

            scripts = a.redis.scripts  # the real ones
            hold(a, "release", release_answer_held)
            hold(a, "renew", renew_after_release)
            renewed: list[bool] = []

            async def renew() -> None:
                renewed.append(await a.renew(SID))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(functools.partial(a.release, SID, closed=False))
                nursery.start_soon(renew)
                await refused.wait()
                # The refusal was read while A still held the lease in its books: no loss.
                assert a.lost_calls == [] and a.owns(SID)
                answer.set()
            assert renewed == [False] and not a.owns(SID)
            assert a.lost_calls == [] and SID not in a.fenced

            # Another node took it over while A's release failed: that refusal is a loss.
            from daemon.cluster._redis import ClusterUnavailable

            assert await a.claim(SID, "/w", "e2") is not None

            def release_fails(real: Script) -> Script:
                async def call(**kw: Any) -> Any:
                    raise ConnectionError("the release never reached Redis")
                return call

            hold(a, "release", release_fails)
            with pytest.raises(ClusterUnavailable):
                await a.release(SID, closed=False)
            server.cli("DEL", session_keys(SID).lease)  # as its expiry would
            async with node(server, "B") as b:
                assert await b.claim(SID, "/w", "e3") is not None
            a.redis._scripts = dataclasses.replace(scripts, release=a.redis.scripts.release)
            assert not await a.renew(SID)
            assert a.lost_calls == [SID] and SID in a.fenced


async def test_the_dispatch_gate_settles_a_lease_in_doubt_with_redis(tmp_path: Path) -> None:
    """The session runner's gate (``Membership.may_act``) before a prompt reaches the agent.
    A's lease is in doubt (its lease clock ran out: A was paused). Nobody took the session:
    the gate confirms the lease with Redis and answers True. Then A is "paused" again, its
    lease expires and B claims the session meanwhile: the gate answers False, and A takes
    it for a loss (fenced, ``on_lost`` told)."""
    with redis_server(tmp_path / "r") as server:
        async with node(server, "A") as a, node(server, "B") as b, \
                trio.open_nursery() as nursery:
            await a.join()
            await nursery.start(a.run)  # runs the confirmations the gate starts
            assert await a.claim(SID, "/w", "e1") == 1
            assert not a.in_doubt(SID)
            assert await a.may_act(SID)  # sure: no Redis round trip needed
            a.lease.forget(SID)  # the lease clock ran out
            assert a.in_doubt(SID)
            with trio.fail_after(30):
                assert await a.may_act(SID)
            assert not a.in_doubt(SID) and a.lost_calls == []

            a.lease.forget(SID)
            server.cli("DEL", session_keys(SID).lease)  # A's lease expired...
            assert await b.claim(SID, "/w", "e2") is not None  # ...and B took the session
            with trio.fail_after(30):
                assert not await a.may_act(SID)
            assert a.lost_calls == [SID] and SID in a.fenced and not a.owns(SID)
            assert lease_of(server).startswith("B ")
            nursery.cancel_scope.cancel()
