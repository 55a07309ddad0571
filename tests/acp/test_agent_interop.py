"""Quirks of popular ACP agents (found by the agent matrix, ``make test-agents``), reproduced by
a scripted agent (``tests/agents/interop_agent.py``) behind a real daemon:

- an update written in the same read as the ``session/new`` (or ``session/load``) reply, before
  the daemon attached the session, is kept (opencode, Gemini CLI);
- an agent whose own ``session/load`` fails is recreated, and the load answer, the status, the
  CLI and the viewer say so (Gemini CLI);
- an agent that echoes the prompt as ``user_message_chunk`` does not double it (Mistral Vibe).
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from benchmarks.launcher import alive, descendants
from sdk.protocol.constants import AGENT_CONTEXT_LOST
from sdk.protocol.envelope import DaemonEvent, decode_events
from tests.agents.interop_agent import COMMANDS, HELPER_PID_FILE, OTHER_USER_TEXT, reply_text
from tests.harness import RunningDaemon, running_daemon, start_daemon
from tests.sse_client import Subscriber, chunk_kind, is_terminal_for, text_of

pytestmark = pytest.mark.processes  # starts processes: not in make unit-fast

AGENT = Path(__file__).parents[1] / "agents" / "interop_agent.py"
AGENT_CMD = shlex.join([sys.executable, str(AGENT)])
TIMEOUT_S = 30.0


def interop(base: Path, flags: str, data_dir: Path | None = None) -> RunningDaemon:
    return start_daemon(base, ["--agent", AGENT_CMD], {"INTEROP_AGENT_FLAGS": flags},
                        data_dir=data_dir or base / "data")


def commands_updates(events: list[DaemonEvent]) -> list[DaemonEvent]:
    return [e for e in events if chunk_kind(e) == "available_commands_update"]


async def wait_durable(client: httpx.AsyncClient, sid: str) -> dict[str, Any]:
    """The session's status once everything published is committed (under a deadline)."""
    with trio.fail_after(TIMEOUT_S):
        while True:
            status: dict[str, Any] = (await client.get(f"/session/{sid}/status")).json()
            if status["durableEventId"] == status["lastEventId"]:
                return status
            await trio.sleep(0.02)


async def transcript(client: httpx.AsyncClient, sid: str) -> list[DaemonEvent]:
    await wait_durable(client, sid)
    resp = await client.get(f"/session/{sid}/transcript", params={"limit": 500})
    assert resp.status_code == 200, resp.text
    return decode_events(resp.json()["events"])


async def test_an_update_read_with_the_session_new_or_load_reply_is_kept(
        tmp_path: Path) -> None:
    daemon = interop(tmp_path, "eager-update")
    try:
        async with httpx.AsyncClient(base_url=daemon.url, timeout=TIMEOUT_S) as client:
            sid = (await client.post("/session", json={})).json()["sessionId"]
            first = commands_updates(await transcript(client, sid))
    finally:
        daemon.stop()
    assert len(first) == 1, "the update read with the session/new reply was dropped"
    assert first[0].data["update"]["availableCommands"] == COMMANDS
    assert first[0].prompt_id is None
    assert "agent_updates_held" in daemon.stderr()
    # After a restart the agent's session/load reply comes with the same update in one write.
    daemon = interop(tmp_path, "eager-update", tmp_path / "data")
    try:
        async with httpx.AsyncClient(base_url=daemon.url, timeout=TIMEOUT_S) as client:
            assert (await client.post(f"/session/{sid}/load", json={})).status_code == 200
            after = commands_updates(await transcript(client, sid))
    finally:
        daemon.stop()
    assert "via=session/load" in daemon.stderr()
    assert len(after) == 2, "the update read with the session/load reply was dropped"


@pytest.mark.parametrize("flags", ["echo-prompt,other-user", "other-user"])
async def test_an_agents_echo_of_the_prompt_is_kept_once_and_its_own_message_kept(
        tmp_path: Path, flags: str) -> None:
    """With ``other-user`` alone, the agent's different user message comes while the echo
    could still come: it is kept all the same."""
    prompt = "please summarise the design"
    with running_daemon(tmp_path, ["--agent", AGENT_CMD],
                        {"INTEROP_AGENT_FLAGS": flags}) as daemon:
        async with httpx.AsyncClient(base_url=daemon.url, timeout=TIMEOUT_S) as client, \
                trio.open_nursery() as nursery:
            sid = (await client.post("/session", json={})).json()["sessionId"]
            sub = Subscriber(client, f"/session/{sid}/events", {"Last-Event-ID": "0"})
            await nursery.start(sub.run)
            resp = await client.post(f"/session/{sid}/prompt", json={"prompt": [
                {"type": "text", "text": prompt}]})
            prompt_id = resp.json()["promptId"]
            await sub.wait_for(is_terminal_for(prompt_id), timeout=TIMEOUT_S)
            nursery.cancel_scope.cancel()
        async with httpx.AsyncClient(base_url=daemon.url, timeout=TIMEOUT_S) as client:
            stored = await transcript(client, sid)
            replay = decode_events((await client.post(f"/session/{sid}/load", json={})
                                    ).json()["compactedReplay"])
    for seen in (sub.events, stored):
        users = [text_of(e) for e in seen if chunk_kind(e) == "user_message_chunk"]
        assert users == [prompt, OTHER_USER_TEXT]
        answer = [text_of(e) for e in seen if chunk_kind(e) == "agent_message_chunk"]
        assert "".join(answer) == reply_text(prompt)
    users = [text_of(e) for e in replay if chunk_kind(e) == "user_message_chunk"]
    assert users == [prompt, OTHER_USER_TEXT]
    assert ("event=agent_prompt_echo_dropped" in daemon.stderr()) == ("echo-prompt" in flags)


async def run_turn(client: httpx.AsyncClient, sid: str, text: str) -> None:
    async with trio.open_nursery() as nursery:
        status = (await client.get(f"/session/{sid}/status")).json()
        sub = Subscriber(client, f"/session/{sid}/events",
                         {"Last-Event-ID": str(status["lastEventId"]),
                          "X-Qwen-Event-Epoch": status["eventEpoch"]})
        await nursery.start(sub.run)
        resp = await client.post(f"/session/{sid}/prompt", json={"prompt": [
            {"type": "text", "text": text}]})
        terminal = await sub.wait_for(is_terminal_for(resp.json()["promptId"]),
                                      timeout=TIMEOUT_S)
        nursery.cancel_scope.cancel()
    assert terminal.type == "turn_complete"


async def watch_until_live(url: str, sid: str) -> str:
    """``turnkeeper watch``'s output up to its ``-- N replayed ...`` line (everything about
    the replay is printed before it), then the command is stopped."""
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-m", "sdk", "--url", url, "watch", sid], stdout=subprocess.PIPE)
    out = b""
    try:
        assert proc.stdout is not None
        with trio.fail_after(TIMEOUT_S):
            while b"\n" not in out.partition(b" replayed; live after #")[2]:
                chunk = await proc.stdout.receive_some(65536)
                assert chunk, f"watch ended early: {out!r}"
                out += chunk
    finally:
        proc.kill()
        await proc.wait()
    return out.decode()


@pytest.mark.parametrize("flags", ["fail-load", ""])
async def test_a_failed_agent_side_load_is_reported_on_the_load_status_and_cli(
        tmp_path: Path, flags: str) -> None:
    """Gemini CLI's own session/load fails at times: the daemon recreates the agent session
    (the transcript is whole) and says ``agentSessionRestored: false`` wherever it reports
    the session; an agent whose load works gets ``true``."""
    restored = flags != "fail-load"
    daemon = interop(tmp_path, flags)
    try:
        async with httpx.AsyncClient(base_url=daemon.url, timeout=TIMEOUT_S) as client:
            sid = (await client.post("/session", json={})).json()["sessionId"]
            fresh = (await client.post(f"/session/{sid}/load", json={})).json()
            fresh_status = (await client.get(f"/session/{sid}/status")).json()
            await run_turn(client, sid, "before the restart")
    finally:
        daemon.stop()
    assert fresh["agentSessionRestored"] is True and fresh_status["agentSessionRestored"] is True
    daemon = interop(tmp_path, flags, tmp_path / "data")
    try:
        async with httpx.AsyncClient(base_url=daemon.url, timeout=TIMEOUT_S) as client:
            body = (await client.post(f"/session/{sid}/load", json={})).json()
            status = (await client.get(f"/session/{sid}/status")).json()
            users = [text_of(e) for e in decode_events(body["compactedReplay"])
                     if chunk_kind(e) == "user_message_chunk"]
            await run_turn(client, sid, "after the restart")
            cli = await trio.run_process(
                [sys.executable, "-m", "sdk", "--url", daemon.url, "load", sid],
                capture_stdout=True, capture_stderr=True, check=False)
            cli_json = await trio.run_process(
                [sys.executable, "-m", "sdk", "--url", daemon.url, "--json", "load", sid],
                capture_stdout=True, capture_stderr=True, check=False)
            watched = await watch_until_live(daemon.url, sid)
    finally:
        daemon.stop()
    assert users == ["before the restart"]  # the transcript is intact either way
    assert body["agentSessionRestored"] is restored
    assert status["agentSessionRestored"] is restored
    logged = "via=session/load" if restored else "via=session/new"
    assert f"{logged} agent_session_restored={str(restored).lower()}" in daemon.stderr()
    assert cli.returncode == 0, cli.stderr
    assert (f"warning: {AGENT_CONTEXT_LOST}" in cli.stdout.decode()) is not restored
    assert json.loads(cli_json.stdout)["agentSessionRestored"] is restored
    assert (f"-- warning: {AGENT_CONTEXT_LOST} --" in watched) is not restored


async def test_an_agents_helper_processes_end_with_it(tmp_path: Path) -> None:
    """Codex's npm wrapper ignores stdin EOF and starts the native binary: when the daemon kills
    the wrapper after the grace, the binary must not stay behind for ever."""
    daemon = interop(tmp_path, "helper,ignore-eof")
    try:
        async with httpx.AsyncClient(base_url=daemon.url, timeout=TIMEOUT_S) as client:
            assert (await client.post("/session", json={})).status_code == 200
        helper = int((tmp_path / HELPER_PID_FILE).read_text())
        agents = descendants(daemon.proc.pid)
        assert helper in agents and alive(helper)
        assert daemon.stop() == 0
        with trio.fail_after(TIMEOUT_S):
            while any(alive(pid) for pid in agents):
                await trio.sleep(0.05)
    finally:
        daemon.stop()
    assert "event=agent_kill" in daemon.stderr()  # the agent ignored EOF: killed
    assert "event=agent_helpers_left" in daemon.stderr()
