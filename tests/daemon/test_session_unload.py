"""Idle sessions leave memory (--session-idle-ms) and come back as after a restart.

A real daemon with a short idle period: a session with no subscriber, no prompt and no request
is unloaded (its --max-sessions slot freed, nothing written for it); the next load, prompt or
stream restores it from the transcript, answering exactly what a restarted daemon answers, with
no agent prompt, its client ids still registered and a new event epoch. A session with a
subscriber or a running turn stays loaded however long it lasts.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from tests.harness import RunningDaemon, running_daemon
from tests.sse_client import Subscriber, is_terminal_for

pytestmark = pytest.mark.processes  # starts processes: not in make unit-fast

IDLE_MS = 300
ARGS = ["--session-idle-ms", str(IDLE_MS)]
ENV = {"MOCK_ACP_LOAD_SESSION": "1"}


async def until(what: str, check: Callable[[], Any], timeout: float = 20) -> Any:
    """Poll ``check`` (sync or async) until it returns something truthy, under a deadline."""
    with trio.move_on_after(timeout):
        while True:
            got = check()
            if hasattr(got, "__await__"):
                got = await got
            if got:
                return got
            await trio.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


async def live_ids(client: httpx.AsyncClient) -> set[str]:
    status = (await client.get("/daemon/status")).json()
    return {s["sessionId"] for s in status["sessions"]}


def unloads(daemon: RunningDaemon, sid: str) -> int:
    return daemon.stderr().count(f"event=session_unloaded session={sid}")


async def wait_unloaded(client: httpx.AsyncClient, daemon: RunningDaemon, sid: str,
                        after: int | None = None) -> None:
    """Wait until the session has left memory (it is not among the live sessions), and with
    ``after`` until it was unloaded more than ``after`` times. On a slow machine it may have
    been unloaded before this call, whenever a step took longer than the idle period; that
    counts (a count taken here would then wait for an unload that never comes)."""

    async def gone() -> bool:
        if after is not None and unloads(daemon, sid) <= after:
            return False
        return sid not in await live_ids(client) and unloads(daemon, sid) >= 1

    await until(f"the unload of {sid}", gone)


async def turn(client: httpx.AsyncClient, sid: str, text: str,
               headers: dict[str, str] | None = None) -> str:
    resp = await client.post(f"/session/{sid}/prompt", headers=headers,
                             json={"prompt": [{"type": "text", "text": text}]})
    assert resp.status_code == 202, resp.text
    prompt_id: str = resp.json()["promptId"]

    async def ended() -> bool:
        status = (await client.get(f"/session/{sid}/status")).json()
        return not status["hasActivePrompt"] and not status["pendingPrompts"]

    await until("the turn to end", ended)
    return prompt_id


def history(body: dict[str, Any]) -> list[tuple[str, Any]]:
    return [(e["type"], e["data"]) for e in body["compactedReplay"] + body["liveJournal"]]


def comparable(body: dict[str, Any]) -> dict[str, Any]:
    """A load body without what differs on every load (the caller's id, the new bus's epoch)."""
    return {k: v for k, v in body.items() if k not in ("clientId", "eventEpoch")}


async def test_an_idle_session_is_unloaded_and_restored_as_after_a_restart(
        tmp_path: Path) -> None:
    data = tmp_path / "data"
    with running_daemon(tmp_path, [*ARGS, "--max-sessions", "1"], ENV, data_dir=data,
                        tag="a") as daemon:
        async with httpx.AsyncClient(base_url=daemon.url, timeout=30) as client:
            created = (await client.post("/session", json={"sessionScope": "thread"})).json()
            sid, client_id = created["sessionId"], created["clientId"]
            mine = {"X-Qwen-Client-Id": client_id}
            await turn(client, sid, "first mock:chunks=3", mine)
            before = (await client.post(f"/session/{sid}/load", json={})).json()
            await wait_unloaded(client, daemon, sid)
            assert (await client.get("/daemon/status")).json()["liveSessions"] == 0

            # Its --max-sessions slot is free: another session can be created.
            other = await client.post("/session", json={"sessionScope": "thread"})
            assert other.status_code == 200, other.text
            await wait_unloaded(client, daemon, other.json()["sessionId"])

            # A load restores it with the same history and markers, a new epoch, no prompt.
            prompts = len(daemon.prompts())
            after = (await client.post(f"/session/{sid}/load", json={})).json()
            # The history seeded from the transcript gets the new bus's ids, as after a restart.
            assert history(after) == history(before)
            assert after["promptTerminals"] == before["promptTerminals"]
            assert after["eventEpoch"] != before["eventEpoch"]
            assert after["agentSessionRestored"] is True  # session/load, no new agent session
            assert len(daemon.prompts()) == prompts
            assert "via=session/load" in daemon.stderr()

            # A stream opened on it when unloaded restores it too, under the epoch rules: the
            # old epoch's cursor is told to resync; and the client's id still prompts it.
            await wait_unloaded(client, daemon, sid)
            async with trio.open_nursery() as nursery:
                sub = Subscriber(client, f"/session/{sid}/events", {
                    "Last-Event-ID": str(after["lastEventId"]),
                    "X-Qwen-Event-Epoch": after["eventEpoch"]})
                await nursery.start(sub.run)
                assert sub.status == 200
                first = await sub.wait_for(lambda e: e.type == "state_resync_required")
                assert isinstance(first.data, dict) and first.data["reason"] == "epoch_reset"
                resp = await client.post(f"/session/{sid}/prompt", headers=mine, json={
                    "prompt": [{"type": "text", "text": "second mock:chunks=2"}]})
                assert resp.status_code == 202, resp.text
                await sub.wait_for(is_terminal_for(resp.json()["promptId"]))
                nursery.cancel_scope.cancel()
            assert len(daemon.prompts()) == prompts + 1

            # Once it has left memory again, a prompt with its client's id brings it back.
            await wait_unloaded(client, daemon, sid)
            await turn(client, sid, "third mock:chunks=2", mine)
            assert len(daemon.prompts()) == prompts + 2
            await wait_unloaded(client, daemon, sid)
            unloaded = (await client.post(f"/session/{sid}/load", json={})).json()
            assert history(unloaded)[-1][0] == "turn_complete"
            await wait_unloaded(client, daemon, sid)
    # Stopped while it was unloaded: nothing was written for it at shutdown, so a restarted
    # daemon answers the load exactly as the unloading one did.
    with running_daemon(tmp_path, ARGS, ENV, data_dir=data, tag="b") as daemon:
        async with httpx.AsyncClient(base_url=daemon.url, timeout=30) as client:
            restarted = (await client.post(f"/session/{sid}/load", json={})).json()
    assert comparable(restarted) == comparable(unloaded)


async def test_a_session_with_a_subscriber_or_a_turn_stays_loaded(tmp_path: Path) -> None:
    with running_daemon(tmp_path, ARGS, ENV) as daemon:
        async with httpx.AsyncClient(base_url=daemon.url, timeout=30) as client, \
                trio.open_nursery() as nursery:

            async def create() -> str:
                body = (await client.post("/session", json={"sessionScope": "thread"})).json()
                return str(body["sessionId"])

            watched, running, idle = await create(), await create(), await create()
            sub = Subscriber(client, f"/session/{watched}/events")
            await nursery.start(sub.run)
            resp = await client.post(f"/session/{running}/prompt", json={"prompt": [
                {"type": "text", "text": "held mock:chunks=1 mock:gate=held"}]})
            assert resp.status_code == 202
            held = resp.json()["promptId"]
            # Both are busy from here on (on a slow machine either may have been unloaded,
            # and brought back by its stream or its prompt, before that).
            busy = {sid: unloads(daemon, sid) for sid in (watched, running)}
            # Three idle periods, counted by the third session's unloads.
            for _ in range(3):
                await client.post(f"/session/{idle}/load", json={})
                await wait_unloaded(client, daemon, idle)
            assert {watched, running} <= await live_ids(client)
            assert {sid: unloads(daemon, sid) for sid in busy} == busy
            # Once the turn ends and the subscriber leaves, both go too.
            daemon.open_gate("held")
            nursery.cancel_scope.cancel()
        async with httpx.AsyncClient(base_url=daemon.url, timeout=30) as client:
            await wait_unloaded(client, daemon, running, busy[running])
            await wait_unloaded(client, daemon, watched, busy[watched])
            body = (await client.post(f"/session/{running}/load", json={})).json()
            assert body["promptTerminals"][-1]["promptId"] == held
