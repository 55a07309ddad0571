"""The SDK's answer to a cluster node's ``503 session_owner_unavailable`` (the session's node
died and its lease still runs): the request is sent again after the answer's ``Retry-After``,
within a bounded total wait; every other error is raised as before. Against a scripted
loopback transport (the waits are recorded, not slept); tests/cluster/test_cluster_nodes.py does it
against real nodes."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import msgspec
import pytest

from sdk._client import DaemonClient
from sdk._errors import PromptOutcomeUnknownError, PromptQueueFullError, ServerError
from tests.builders import wire_bodies

SID = "0b9c1d2e-0000-4000-8000-000000000001"
STATUS = wire_bodies.session_status(SID, lastEventId=3, durableEventId=3, eventEpoch="e",
                                    ownerNodeId="B")

pytestmark = pytest.mark.anyio


def unavailable(retry_after: str | None, *, code: str = "session_owner_unavailable",
                retryable: bool = True) -> httpx.Response:
    headers = {"retry-after": retry_after} if retry_after is not None else {}
    return httpx.Response(503, headers=headers, content=msgspec.json.encode(
        {"error": "owner gone", "code": code, "retryable": retryable, "sessionId": SID}))


def scripted(answers: list[httpx.Response]) -> tuple[httpx.MockTransport, list[str]]:
    seen: list[str] = []
    replies: Iterator[httpx.Response] = iter(answers)

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(f"{request.method} {request.url.path}")
        return next(replies)

    return httpx.MockTransport(handler), seen


class Waits:
    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


async def test_owner_unavailable_is_retried_after_retry_after() -> None:
    transport, seen = scripted([unavailable("2"), unavailable("1"), unavailable(None),
                                httpx.Response(200, json=STATUS)])
    waits = Waits()
    async with DaemonClient("http://node-b", transport=transport, sleep=waits) as client:
        status = await client.session_status(SID)
        stats = client.statistics()
    assert status.owner_node_id == "B"
    assert waits.waits == [2.0, 1.0, 1.0]  # Retry-After, and 1 s without one
    assert seen == [f"GET /session/{SID}/status"] * 4
    assert (stats.count("status"), stats.failures) == (4, 3)


async def test_the_wait_is_bounded() -> None:
    transport, seen = scripted([unavailable("5")] * 10)
    waits = Waits()
    async with DaemonClient("http://node-b", transport=transport, sleep=waits,
                            owner_wait_s=12) as client:
        with pytest.raises(ServerError) as raised:
            await client.session_status(SID)
    assert waits.waits == [5.0, 5.0]  # a third wait would pass the 12 s budget
    assert len(seen) == 3
    assert raised.value.code == "session_owner_unavailable"
    assert raised.value.retry_after == 5.0


async def test_a_prompt_is_resent_with_its_key_within_its_own_timeout() -> None:
    """A prompt answered 503 session_owner_unavailable may have been admitted (the owner took
    it and could not make it durable in time): it is sent again with the same key after
    Retry-After, within the call's timeout, and giving up says the outcome is unknown."""
    keys: list[str | None] = []
    answers = iter([unavailable("5")] * 10)

    def handler(request: httpx.Request) -> httpx.Response:
        keys.append(request.headers.get("idempotency-key"))
        return next(answers)

    waits = Waits()
    async with DaemonClient("http://node-b", transport=httpx.MockTransport(handler),
                            sleep=waits) as client:
        with pytest.raises(PromptOutcomeUnknownError) as raised:
            await client.send_prompt(SID, "hi", timeout=12)
    assert waits.waits == [5.0, 5.0]  # a third wait would pass the 12 s timeout
    assert len(keys) == 3 and len(set(keys)) == 1 and keys[0]
    unknown = raised.value
    assert (unknown.session_id, unknown.idempotency_key, unknown.attempts) == (SID, keys[0], 3)
    assert isinstance(unknown.last_error, ServerError)
    assert unknown.last_error.code == "session_owner_unavailable"


@pytest.mark.parametrize("answer", [
    unavailable("1", code="prompt_queue_full"),
    unavailable("1", retryable=False),
    unavailable("1", code="something_else"),
    httpx.Response(500, json={"error": "boom"}),
])
async def test_other_errors_are_not_resent(answer: httpx.Response) -> None:
    transport, seen = scripted([answer, httpx.Response(200, json=STATUS)])
    waits = Waits()
    async with DaemonClient("http://node-b", transport=transport, sleep=waits) as client:
        with pytest.raises((ServerError, PromptQueueFullError)):
            await client.session_status(SID)
    assert waits.waits == [] and len(seen) == 1


async def test_cluster_unavailable_is_resent_too() -> None:
    """While the cluster's Redis does not answer, nodes say ``cluster_unavailable``: resent
    the same way (within the same budget)."""
    transport, seen = scripted([unavailable("1", code="cluster_unavailable"),
                                unavailable("2", code="cluster_unavailable"),
                                httpx.Response(200, json=STATUS)])
    waits = Waits()
    async with DaemonClient("http://node-b", transport=transport, sleep=waits) as client:
        status = await client.session_status(SID)
    assert status.owner_node_id == "B"
    assert waits.waits == [1.0, 2.0]
    assert len(seen) == 3
