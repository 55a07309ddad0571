"""A prompt sent with an ``Idempotency-Key`` is admitted once, however often it is sent: a real
daemon, raw HTTP (httpx), and the mock agent's prompt log as the witness of what ran.

- The same key again answers the first request's 202 body byte for byte (same promptId,
  cursor and epoch), marked ``Idempotent-Replayed: true``, and the agent runs the prompt once;
  the same request laid out differently (key order, spacing, a quoted key) is the same.
- The same key with another body: 409 ``idempotency_key_reused``, nothing admitted.
- A malformed key: 400 ``invalid_idempotency_key``, nothing admitted; no key: as before (two
  identical requests are two prompts).
- Concurrent requests with one key admit once, on a session made on this bus and on a restored
  one (whose keys are read from the ledger, with a checkpoint in between).
- A daemon restart in between, graceful or SIGKILL right after the 202: the key is in the
  ledger, the retry gets the first 202 body, and ``GET /session/{id}/prompts/{key}`` says how
  the prompt ended (``interrupted`` when the daemon died under it).
- Without a transcript (``--no-persistence``) the keys of a live session hold the same way.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
import trio
import trio.testing

from benchmarks.redis_launcher import HAVE_REDIS, SKIP_REASON, redis_server
from tests.harness import RunningDaemon, running_daemon, start_daemon

pytestmark = pytest.mark.processes  # starts processes: not in make unit-fast

TIMEOUT_S = 30.0
POLL_S = 0.02
KEY = "IDEMPOTENCY-KEY"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    """One daemon for the tests that need nothing else (each uses its own sessions, keys and
    prompt texts)."""
    with running_daemon(tmp_path_factory.mktemp("idempotency")) as d:
        yield d


def runs_of(daemon: RunningDaemon, text: str) -> int:
    """How many times the agent was sent a prompt with this text (its own log)."""
    return sum(json.loads(line)["text"] == text for line in daemon.prompts())


def prompt_body(text: str, **extra: Any) -> dict[str, Any]:
    return {"prompt": [{"type": "text", "text": text}], **extra}


async def create(client: httpx.AsyncClient) -> str:
    resp = await client.post("/session", json={"sessionScope": "thread"})
    assert resp.status_code == 200, resp.text
    return str(resp.json()["sessionId"])


async def send(client: httpx.AsyncClient, sid: str, key: str | None, body: Any,
               ) -> httpx.Response:
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Idempotency-Key"] = key
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return await client.post(f"/session/{sid}/prompt", content=content, headers=headers)


async def wait_idle(client: httpx.AsyncClient, sid: str) -> None:
    """Until the session runs and queues nothing (polled: the daemon pushes no such event)."""
    with trio.fail_after(TIMEOUT_S):
        while True:
            status = (await client.get(f"/session/{sid}/status")).json()
            if not status["hasActivePrompt"] and status["pendingPrompts"] == 0:
                return
            await trio.sleep(POLL_S)


async def lookup(client: httpx.AsyncClient, sid: str, key: str) -> httpx.Response:
    return await client.get(f"/session/{sid}/prompts/{key}")


async def test_a_repeated_key_gets_the_same_202_and_the_prompt_runs_once(
        daemon: RunningDaemon) -> None:
    text = "once mock:chunks=3"
    async with httpx.AsyncClient(base_url=daemon.url, timeout=TIMEOUT_S) as client:
        sid = await create(client)
        first = await send(client, sid, KEY, prompt_body(text, deadlineMs=60000))
        assert first.status_code == 202, first.text
        assert "idempotent-replayed" not in first.headers
        # The same request again, and laid out differently (members reordered, spaced, the
        # key quoted as a structured-field string): the same request, the same answer.
        again = await send(client, sid, KEY, prompt_body(text, deadlineMs=60000))
        relaid = json.dumps({"deadlineMs": 60000, "prompt": [{"text": text, "type": "text"}]},
                            indent=2).encode()
        quoted = await send(client, sid, f'"{KEY}"', relaid)
        for repeat in (again, quoted):
            assert repeat.status_code == 202, repeat.text
            assert repeat.content == first.content
            assert repeat.headers["idempotent-replayed"] == "true"
        await wait_idle(client, sid)
        # Asked again after it ran: still the same answer, still nothing new admitted.
        late = await send(client, sid, KEY, prompt_body(text, deadlineMs=60000))
        assert late.content == first.content
        await wait_idle(client, sid)
        found = await lookup(client, sid, KEY)
        assert found.status_code == 200, found.text
        got = found.json()
        assert {k: got[k] for k in ("promptId", "lastEventId", "eventEpoch")} == first.json()
        assert got["state"] == "completed" and got["stopReason"] == "end_turn"
        assert got["idempotencyKey"] == KEY and got["sessionId"] == sid
        assert got["admittedAt"] <= got["endedAt"]
        page = (await client.get(f"/session/{sid}/transcript")).json()["events"]
        assert sum(e["type"] == "turn_complete" for e in page) == 1
    assert runs_of(daemon, text) == 1


async def test_without_a_key_every_request_is_a_prompt(daemon: RunningDaemon) -> None:
    text = "twice mock:chunks=1"
    async with httpx.AsyncClient(base_url=daemon.url, timeout=TIMEOUT_S) as client:
        sid = await create(client)
        answers = [await send(client, sid, None, prompt_body(text)) for _ in range(2)]
        assert [a.status_code for a in answers] == [202, 202]
        assert answers[0].json()["promptId"] != answers[1].json()["promptId"]
        await wait_idle(client, sid)
    assert runs_of(daemon, text) == 2


async def test_a_key_reused_for_another_request_is_409_and_admits_nothing(
        daemon: RunningDaemon) -> None:
    async with httpx.AsyncClient(base_url=daemon.url, timeout=TIMEOUT_S) as client:
        sid = await create(client)
        first = await send(client, sid, KEY, prompt_body("original mock:chunks=1"))
        assert first.status_code == 202
        for other in (prompt_body("different mock:chunks=1"),
                      prompt_body("original mock:chunks=1", deadlineMs=5000)):
            resp = await send(client, sid, KEY, other)
            assert resp.status_code == 409, resp.text
            assert resp.json() == {
                "error": "This Idempotency-Key was used for a different prompt request on "
                         "this session",
                "code": "idempotency_key_reused", "idempotencyKey": KEY,
                "promptId": first.json()["promptId"]}
        # The key belongs to one session: on another it is a new prompt.
        other_sid = await create(client)
        elsewhere = await send(client, other_sid, KEY, prompt_body("different mock:chunks=1"))
        assert elsewhere.status_code == 202
        await wait_idle(client, sid)
        await wait_idle(client, other_sid)
    assert runs_of(daemon, "original mock:chunks=1") == 1
    assert runs_of(daemon, "different mock:chunks=1") == 1


MALFORMED = ["", "a b", "x" * 129, "a/b", '"unterminated', "ab\x7f", "naïve", '""']


async def test_a_malformed_key_is_400_and_admits_nothing(daemon: RunningDaemon) -> None:
    async with httpx.AsyncClient(base_url=daemon.url, timeout=TIMEOUT_S) as client:
        sid = await create(client)
        for key in MALFORMED:
            resp = await client.post(f"/session/{sid}/prompt", json=prompt_body("bad key"),
                                     headers={"Idempotency-Key": key.encode("utf-8")})
            assert resp.status_code == 400, (key, resp.text)
            assert resp.json()["code"] == "invalid_idempotency_key"
            if key and "/" not in key:  # a "/" cannot be in a path segment at all (404)
                bad = await client.get(f"/session/{sid}/prompts/{quote(key, safe='')}")
                assert bad.status_code == 400, (key, bad.text)
                assert bad.json()["code"] == "invalid_idempotency_key"
        status = (await client.get(f"/session/{sid}/status")).json()
        assert not status["hasActivePrompt"] and status["pendingPrompts"] == 0
        longest = "k" * 128
        assert (await send(client, sid, longest, prompt_body("long key"))).status_code == 202
        await wait_idle(client, sid)
    assert runs_of(daemon, "bad key") == 0


async def racing_sends(client_url: str, sid: str, key: str, text: str, count: int,
                       ) -> list[httpx.Response]:
    """``count`` requests with one key, each on its own connection, released together."""
    answers: list[httpx.Response] = []
    go = trio.Event()
    clients = [httpx.AsyncClient(base_url=client_url, timeout=TIMEOUT_S) for _ in range(count)]
    try:
        for client in clients:  # connected before the race, so nothing but the send differs
            assert (await client.get("/health")).status_code == 200

        async def one(client: httpx.AsyncClient) -> None:
            await go.wait()
            answers.append(await send(client, sid, key, prompt_body(text)))

        async with trio.open_nursery() as nursery:
            for client in clients:
                nursery.start_soon(one, client)
            await trio.testing.wait_all_tasks_blocked()
            go.set()
    finally:
        for client in clients:
            await client.aclose()
    return answers


async def test_concurrent_requests_with_one_key_admit_once(tmp_path: Path) -> None:
    """Eight requests with one key at once, first on a session made on this bus (its keys are
    all in memory), then on a restored one (its keys are read from the ledger, so each request
    waits for that read before it can admit)."""
    with running_daemon(tmp_path, tag="a") as first:
        async with httpx.AsyncClient(base_url=first.url, timeout=TIMEOUT_S) as client:
            sid = await create(client)
            answers = await racing_sends(first.url, sid, "race-1", "race one", 8)
            assert {a.status_code for a in answers} == {202}
            assert len({a.content for a in answers}) == 1
            assert sum("idempotent-replayed" in a.headers for a in answers) == 7
            first_body = answers[0].content
            await wait_idle(client, sid)
        assert runs_of(first, "race one") == 1
    with running_daemon(tmp_path, data_dir=first.data_dir, tag="b") as second:
        async with httpx.AsyncClient(base_url=second.url, timeout=TIMEOUT_S) as client:
            assert (await client.post(f"/session/{sid}/load", json={})).status_code == 200
            answers = await racing_sends(second.url, sid, "race-2", "race two", 8)
            assert {a.status_code for a in answers} == {202}
            assert len({a.content for a in answers}) == 1
            await wait_idle(client, sid)
            # The first key is known to the restored session too.
            again = await send(client, sid, "race-1", prompt_body("race one"))
            assert again.content == first_body
        assert runs_of(second, "race two") == 1
        assert runs_of(second, "race one") == 1  # the log is shared: still the one first run


async def test_a_key_survives_a_graceful_restart(tmp_path: Path) -> None:
    text = "before restart mock:chunks=2"
    with running_daemon(tmp_path, tag="a") as first:
        async with httpx.AsyncClient(base_url=first.url, timeout=TIMEOUT_S) as client:
            sid = await create(client)
            accepted = await send(client, sid, KEY, prompt_body(text))
            assert accepted.status_code == 202
            await wait_idle(client, sid)
    with running_daemon(tmp_path, data_dir=first.data_dir, tag="b") as second:
        async with httpx.AsyncClient(base_url=second.url, timeout=TIMEOUT_S) as client:
            # Not restored yet: the ledger answers, and the prompt route needs a live session.
            found = await lookup(client, sid, KEY)
            assert found.status_code == 200, found.text
            assert found.json()["state"] == "completed"
            assert (await send(client, sid, KEY, prompt_body(text))).status_code == 404
            assert (await client.post(f"/session/{sid}/load", json={})).status_code == 200
            retry = await send(client, sid, KEY, prompt_body(text))
            assert retry.status_code == 202, retry.text
            assert retry.content == accepted.content  # the first epoch and cursor, too
            assert retry.headers["idempotent-replayed"] == "true"
            conflict = await send(client, sid, KEY, prompt_body("something else"))
            assert conflict.status_code == 409
            missing = await lookup(client, sid, "never-sent")
            assert missing.status_code == 404 and missing.json()["code"] == "prompt_not_found"
            await wait_idle(client, sid)
    assert runs_of(second, text) == 1


async def test_a_key_survives_a_sigkill_right_after_the_202(tmp_path: Path) -> None:
    """The daemon dies with the prompt in flight: after the restart the ledger closes it as
    interrupted, the retry with its key gets the first 202 body (the prompt is not run again)
    and the lookup says it was interrupted."""
    text = "in flight mock:chunks=2 mock:gate=never"
    first = start_daemon(tmp_path, tag="a")
    try:
        async with httpx.AsyncClient(base_url=first.url, timeout=TIMEOUT_S) as client:
            sid = await create(client)
            accepted = await send(client, sid, KEY, prompt_body(text))
            assert accepted.status_code == 202
            running = await lookup(client, sid, KEY)
            assert running.json()["state"] == "running"
            queued = await send(client, sid, "second", prompt_body("queued"))
            assert (await lookup(client, sid, "second")).json()["state"] == "queued"
            assert queued.status_code == 202
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait()
    finally:
        first.stop()
    with running_daemon(tmp_path, data_dir=first.data_dir, tag="b") as second:
        async with httpx.AsyncClient(base_url=second.url, timeout=TIMEOUT_S) as client:
            before = (await lookup(client, sid, KEY)).json()
            assert before["state"] == "interrupted" and before["promptId"] == \
                accepted.json()["promptId"]
            assert (await client.post(f"/session/{sid}/load", json={})).status_code == 200
            retry = await send(client, sid, KEY, prompt_body(text))
            assert retry.status_code == 202 and retry.content == accepted.content
            after = (await lookup(client, sid, KEY)).json()
            assert after["state"] == "interrupted" and "endedAt" in after
            assert (await lookup(client, sid, "second")).json()["state"] == "interrupted"
    assert runs_of(second, text) == 1


async def test_keys_hold_without_a_transcript(tmp_path: Path) -> None:
    text = "memory only mock:chunks=1"
    with running_daemon(tmp_path, ["--no-persistence"]) as daemon:
        async with httpx.AsyncClient(base_url=daemon.url, timeout=TIMEOUT_S) as client:
            sid = await create(client)
            first = await send(client, sid, KEY, prompt_body(text))
            again = await send(client, sid, KEY, prompt_body(text))
            assert first.status_code == again.status_code == 202
            assert again.content == first.content
            assert (await send(client, sid, KEY, prompt_body("other"))).status_code == 409
            await wait_idle(client, sid)
            found = (await lookup(client, sid, KEY)).json()
            assert found["state"] == "completed" and found["stopReason"] == "end_turn"
            assert (await lookup(client, sid, "unknown")).status_code == 404
            gone = await lookup(client, "00000000-0000-4000-8000-000000000000", KEY)
            assert gone.status_code == 404 and gone.json()["code"] == "session_not_found"
    assert runs_of(daemon, text) == 1


# --- cluster mode ---------------------------------------------------------------------------


@pytest.mark.skipif(not HAVE_REDIS, reason=SKIP_REASON)
async def test_a_key_holds_through_a_forwarding_node_and_after_a_takeover(
        tmp_path: Path) -> None:
    """Two nodes on one Redis: the key's header goes through the node that forwards to the
    owner (and the replay's marker comes back), the admission with its key is in what Redis
    replicates, and after the owner is killed the node that takes the session over answers
    the retry with the first 202 body."""
    pytest.importorskip("coredis", reason="coredis is not installed (pip install '.[cluster]')")
    text = "clustered mock:chunks=2"
    env = {"MOCK_ACP_LOAD_SESSION": "1",
           "TURNKEEPER_CLUSTER_SECRET": "idempotency-tests-cluster-secret"}
    with redis_server(tmp_path / "redis") as redis:
        owner = start_daemon(tmp_path, ["--cluster-redis", redis.url, "--node-id", "A",
                                        "--lease-ms", "1500"], env, tag="A")
        other = start_daemon(tmp_path, ["--cluster-redis", redis.url, "--node-id", "B",
                                        "--lease-ms", "1500"], env, tag="B")
        try:
            async with httpx.AsyncClient(base_url=owner.url, timeout=TIMEOUT_S) as ca, \
                    httpx.AsyncClient(base_url=other.url, timeout=TIMEOUT_S) as cb:
                sid = await create(ca)
                first = await send(cb, sid, KEY, prompt_body(text))  # forwarded to A
                assert first.status_code == 202, first.text
                for client in (cb, ca):
                    again = await send(client, sid, KEY, prompt_body(text))
                    assert again.status_code == 202 and again.content == first.content
                    assert again.headers["idempotent-replayed"] == "true"
                assert (await send(cb, sid, KEY, prompt_body("other"))).status_code == 409
                await wait_idle(cb, sid)
                found = await lookup(cb, sid, KEY)
                assert found.status_code == 200 and found.json()["state"] == "completed"

                owner.kill()
                with trio.fail_after(TIMEOUT_S):  # 503 while A's lease runs, then B takes over
                    while (status := await cb.get(f"/session/{sid}/status")).status_code != 200:
                        await trio.sleep(0.1)
                assert status.json()["ownerNodeId"] == "B"
                retry = await send(cb, sid, KEY, prompt_body(text))
                assert retry.status_code == 202, retry.text
                assert retry.content == first.content
                assert (await send(cb, sid, KEY, prompt_body("other"))).status_code == 409
                await wait_idle(cb, sid)
        finally:
            owner.kill()
            other.stop()
    assert runs_of(other, text) == 1
