"""A third-party ACP agent (built on the official ``agent-client-protocol`` library) behind the
real daemon: create → prompt → stream → terminal → load, and the permission flow (client vote,
cancellation, and --approval-mode yolo)."""

from __future__ import annotations

import shlex
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import trio

from sdk.protocol.envelope import decode_events
from tests.harness import RunningDaemon, running_daemon
from tests.sse_client import Subscriber, chunk_kind, is_terminal_for, text_of

pytestmark = pytest.mark.processes  # starts processes: not in make unit-fast

AGENT = Path(__file__).parents[1] / "agents" / "acp_lib_agent.py"
# Creating a session starts this agent, which imports the ACP library: seconds on a busy
# machine, past httpx's 5 s default. A guard against hangs, not a bound on the start-up.
CLIENT_TIMEOUT_S = 60.0
AGENT_CMD = shlex.join([sys.executable, str(AGENT)])


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    with running_daemon(tmp_path_factory.mktemp("acplib"), ["--agent", AGENT_CMD],
                        env={"ACP_LIB_AGENT_CHUNKS": "4"}) as d:
        yield d


@pytest.fixture(scope="module")
def yolo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    with running_daemon(tmp_path_factory.mktemp("yolo"),
                        ["--agent", AGENT_CMD, "--approval-mode", "yolo"]) as d:
        yield d


async def test_create_prompt_stream_terminal_load(daemon: RunningDaemon) -> None:
    async with httpx.AsyncClient(base_url=daemon.url, timeout=CLIENT_TIMEOUT_S) as client, \
            trio.open_nursery() as nursery:
        sid = (await client.post("/session", json={})).json()["sessionId"]
        sub = Subscriber(client, f"/session/{sid}/events", {"Last-Event-ID": "0"})
        await nursery.start(sub.run)
        pid = (await client.post(f"/session/{sid}/prompt", json={"prompt": [
            {"type": "text", "text": "hello library"}]})).json()["promptId"]
        terminal = await sub.wait_for(is_terminal_for(pid))
        body = (await client.post(f"/session/{sid}/load", json={})).json()
        nursery.cancel_scope.cancel()
    assert terminal.type == "turn_complete" and terminal.data["stopReason"] == "end_turn"
    streamed = [text_of(e) for e in sub.events if chunk_kind(e) == "agent_message_chunk"]
    assert streamed == [f"lib-chunk-{i}" for i in range(4)]
    events = decode_events(body["compactedReplay"])
    assert [chunk_kind(e) for e in events[:2]] == ["user_message_chunk", "agent_message_chunk"]
    assert text_of(events[1]) == "lib-chunk-0lib-chunk-1lib-chunk-2lib-chunk-3"
    assert events[-1].type == "turn_complete" and events[-1].data["promptId"] == pid


async def run_permission_turn(daemon: RunningDaemon, vote: dict[str, str] | None
                              ) -> tuple[Subscriber, str]:
    async with httpx.AsyncClient(base_url=daemon.url, timeout=CLIENT_TIMEOUT_S) as client, \
            trio.open_nursery() as nursery:
        sid = (await client.post("/session", json={"sessionScope": "thread"})).json()["sessionId"]
        sub = Subscriber(client, f"/session/{sid}/events", {"Last-Event-ID": "0"})
        await nursery.start(sub.run)
        pid = (await client.post(f"/session/{sid}/prompt", json={"prompt": [
            {"type": "text", "text": "please ask-permission"}]})).json()["promptId"]
        if vote is not None:
            request = await sub.wait_for(lambda e: e.type == "permission_request")
            assert request.prompt_id == pid
            assert request.data["sessionId"] == sid
            assert [o["optionId"] for o in request.data["options"]] == ["allow-once",
                                                                         "reject-once"]
            request_id = request.data["requestId"]
            if vote == {"cancel": "prompt"}:
                assert (await client.post(f"/session/{sid}/cancel")).status_code == 204
            else:
                resp = await client.post(f"/session/{sid}/permission/{request_id}", json=vote)
                assert resp.status_code == 200
                assert resp.json()["requestId"] == request_id
                again = await client.post(f"/session/{sid}/permission/{request_id}", json=vote)
                assert again.status_code == 404
        await sub.wait_for(is_terminal_for(pid))
        nursery.cancel_scope.cancel()
    return sub, pid


async def test_permission_vote_reaches_the_agent(daemon: RunningDaemon) -> None:
    sub, _ = await run_permission_turn(daemon, {"optionId": "reject-once"})
    resolved = sub.of_type("permission_resolved")
    assert [r.data["outcome"] for r in resolved] == [{"outcome": "selected",
                                                      "optionId": "reject-once"}]
    assert "permission:reject-once" in [text_of(e) for e in sub.events]


async def test_cancelling_the_prompt_cancels_pending_permissions(daemon: RunningDaemon) -> None:
    sub, _ = await run_permission_turn(daemon, {"cancel": "prompt"})
    resolved = sub.of_type("permission_resolved")
    assert [r.data["outcome"] for r in resolved] == [{"outcome": "cancelled"}]
    assert "permission:cancelled" in [text_of(e) for e in sub.events]


async def test_yolo_mode_picks_the_first_allow_option(yolo: RunningDaemon) -> None:
    sub, _ = await run_permission_turn(yolo, None)
    assert [r.data["outcome"] for r in sub.of_type("permission_resolved")] == [
        {"outcome": "selected", "optionId": "allow-once"}]
    assert "permission:allow-once" in [text_of(e) for e in sub.events]
