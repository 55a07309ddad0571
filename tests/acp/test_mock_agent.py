"""The bundled mock agent, driven over raw stdin/stdout pipes (independent of AgentChannel)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from daemon.core.acp_codec import LineSplitter
from daemon.mock_agent import PromptPlan, plan_for_prompt

pytestmark = pytest.mark.processes  # starts processes: not in make unit-fast

ROOT = Path(__file__).resolve().parents[2]
# Hang guard only; every wait is on a message or on the process exiting.
GUARD_SECONDS = 20


class MockProcess:
    """One mock agent subprocess and a line-oriented JSON-RPC view of its pipes."""

    def __init__(self, proc: trio.Process) -> None:
        self.proc = proc
        self._splitter = LineSplitter()
        self._lines: list[bytes] = []
        self._next_id = 100

    async def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        await self.proc.stdin.send_all(json.dumps({"jsonrpc": "2.0", **message}).encode() + b"\n")

    async def request(self, method: str, params: dict[str, Any]) -> int:
        self._next_id += 1
        await self.send({"id": self._next_id, "method": method, "params": params})
        return self._next_id

    async def recv(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        while not self._lines:
            data = await self.proc.stdout.receive_some(1 << 18)
            if not data:
                raise EOFError("mock agent closed stdout")
            self._lines.extend(self._splitter.feed(bytes(data)))
        message: dict[str, Any] = json.loads(self._lines.pop(0))
        return message

    async def until_reply(self, request_id: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """Notifications received before the reply to ``request_id``, and that reply."""
        before: list[dict[str, Any]] = []
        while True:
            message = await self.recv()
            if message.get("id") == request_id and "method" not in message:
                return before, message
            before.append(message)

    async def call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        _, reply = await self.until_reply(await self.request(method, params))
        return reply

    async def initialize(self) -> dict[str, Any]:
        return await self.call("initialize", {"protocolVersion": 1, "clientCapabilities": {}})

    async def new_session(self) -> str:
        reply = await self.call("session/new", {"cwd": str(ROOT), "mcpServers": []})
        session_id: str = reply["result"]["sessionId"]
        return session_id

    async def prompt(self, session_id: str, text: str) -> int:
        return await self.request(
            "session/prompt", {"sessionId": session_id, "prompt": [{"type": "text", "text": text}]}
        )

    async def close_stdin_and_wait(self) -> int:
        assert self.proc.stdin is not None
        await self.proc.stdin.aclose()
        return await self.proc.wait()


@asynccontextmanager
async def mock_agent(**variables: str) -> AsyncIterator[MockProcess]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MOCK_ACP_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.update(variables)
    with trio.fail_after(GUARD_SECONDS):
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-m", "daemon.mock_agent"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        try:
            agent = MockProcess(proc)
            await agent.initialize()
            yield agent
        finally:
            if proc.returncode is None:
                proc.kill()
            await proc.wait()


def texts(notifications: list[dict[str, Any]]) -> list[str]:
    return [n["params"]["update"]["content"]["text"] for n in notifications]


# -- handshake ---------------------------------------------------------------------------------


async def test_initialize_reply() -> None:
    async with mock_agent() as agent:
        reply = await agent.initialize()
        assert reply["result"]["protocolVersion"] == 1
        assert reply["result"]["agentCapabilities"]["loadSession"] is False
    async with mock_agent(MOCK_ACP_LOAD_SESSION="1") as agent:
        reply = await agent.initialize()
        assert reply["result"]["agentCapabilities"]["loadSession"] is True


async def test_session_new_returns_fresh_uuid4s() -> None:
    async with mock_agent() as agent:
        ids = [await agent.new_session() for _ in range(3)]
    assert len(set(ids)) == 3
    assert all(uuid.UUID(i).version == 4 for i in ids)


async def test_unknown_method_and_parse_error() -> None:
    async with mock_agent() as agent:
        reply = await agent.call("session/set_mode", {})
        assert reply["error"]["code"] == -32601
        assert agent.proc.stdin is not None
        await agent.proc.stdin.send_all(b"{not json\n")
        assert (await agent.recv())["error"]["code"] == -32700
        # Without MOCK_ACP_LOAD_SESSION, session/load does not exist.
        reply = await agent.call("session/load", {"sessionId": "s", "cwd": "/", "mcpServers": []})
        assert reply["error"]["code"] == -32601


# -- modes -------------------------------------------------------------------------------------


async def test_echo_default_streams_three_chunks_then_end_turn() -> None:
    async with mock_agent(MOCK_ACP_PROMPT_DELAY_MS="0") as agent:
        sid = await agent.new_session()
        notes, reply = await agent.until_reply(await agent.prompt(sid, "hello"))
    assert reply["result"] == {"stopReason": "end_turn"}
    assert notes[0] == {
        "jsonrpc": "2.0",
        "method": "session/update",
        "params": {
            "sessionId": sid,
            "update": {
                "sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": "chunk-0"},
            },
        },
    }
    assert texts(notes) == ["chunk-0", "chunk-1", "chunk-2"]


async def test_emit_chunks_variable_and_tokens() -> None:
    async with mock_agent(MOCK_ACP_EMIT_CHUNKS="5", MOCK_ACP_PROMPT_DELAY_MS="0") as agent:
        sid = await agent.new_session()
        notes, _ = await agent.until_reply(await agent.prompt(sid, "plain"))
        assert texts(notes) == [f"chunk-{i}" for i in range(5)]
        notes, _ = await agent.until_reply(await agent.prompt(sid, "say mock:chunks=2 please"))
        assert texts(notes) == ["chunk-0", "chunk-1"]
        notes, _ = await agent.until_reply(await agent.prompt(sid, "mock:chunks=0"))
        assert notes == []
        notes, _ = await agent.until_reply(await agent.prompt(sid, "mock:chunks=3 mock:bytes=40"))
        assert texts(notes) == [f"chunk-{i}".ljust(40, ".") for i in range(3)]
        assert all(len(t.encode()) == 40 for t in texts(notes))


async def test_many_chunks_arrive_complete_and_in_order() -> None:
    async with mock_agent(MOCK_ACP_PROMPT_DELAY_MS="0") as agent:
        sid = await agent.new_session()
        notes, reply = await agent.until_reply(await agent.prompt(sid, "mock:chunks=20000"))
    assert reply["result"]["stopReason"] == "end_turn"
    assert texts(notes) == [f"chunk-{i}" for i in range(20000)]


@pytest.mark.parametrize("how", ["env", "token"])
async def test_reject(how: str) -> None:
    variables = {"MOCK_ACP_MODE": "reject"} if how == "env" else {}
    text = "hi" if how == "env" else "hi mock:mode=reject"
    async with mock_agent(**variables) as agent:
        sid = await agent.new_session()
        notes, reply = await agent.until_reply(await agent.prompt(sid, text))
        assert reply["error"] == {"code": -32603, "message": "injected error"}
        assert texts(notes) == ["chunk-0", "chunk-1", "chunk-2"]
        # The agent is still serving.
        assert (await agent.new_session()) != sid


@pytest.mark.parametrize("how", ["env", "token"])
async def test_crash_on_prompt_exits_non_zero(how: str) -> None:
    variables = {"MOCK_ACP_MODE": "crash-on-prompt"} if how == "env" else {}
    text = "x" if how == "env" else "mock:mode=crash-on-prompt"
    async with mock_agent(**variables) as agent:
        sid = await agent.new_session()
        await agent.prompt(sid, text)
        with pytest.raises(EOFError):
            await agent.until_reply(-1)
        assert await agent.proc.wait() != 0


async def test_hang_answers_only_after_cancel() -> None:
    async with mock_agent(MOCK_ACP_MODE="hang") as agent:
        sid = await agent.new_session()
        prompt_id = await agent.prompt(sid, "x")
        for expected in ("chunk-0", "chunk-1", "chunk-2"):
            assert texts([await agent.recv()]) == [expected]
        # Still hanging: a later request is answered first.
        probe = await agent.request("session/new", {"cwd": "/", "mcpServers": []})
        assert (await agent.recv())["id"] == probe
        await agent.send({"method": "session/cancel", "params": {"sessionId": sid}})
        notes, reply = await agent.until_reply(prompt_id)
        assert notes == [] and reply["result"] == {"stopReason": "cancelled"}


async def test_cancel_during_the_delay_ends_cancelled() -> None:
    async with mock_agent(MOCK_ACP_PROMPT_DELAY_MS="600000") as agent:
        sid = await agent.new_session()
        prompt_id = await agent.prompt(sid, "x")
        for _ in range(3):
            await agent.recv()
        await agent.send({"method": "session/cancel", "params": {"sessionId": sid}})
        _, reply = await agent.until_reply(prompt_id)
        assert reply["result"] == {"stopReason": "cancelled"}


async def test_delay_token_overrides_the_variable() -> None:
    # With the variable's 10-minute delay in force this would trip the hang guard.
    async with mock_agent(MOCK_ACP_PROMPT_DELAY_MS="600000") as agent:
        sid = await agent.new_session()
        _, reply = await agent.until_reply(await agent.prompt(sid, "mock:delay_ms=0"))
        assert reply["result"] == {"stopReason": "end_turn"}


async def test_concurrent_sessions_do_not_block_each_other() -> None:
    async with mock_agent(MOCK_ACP_PROMPT_DELAY_MS="0") as agent:
        held, free = await agent.new_session(), await agent.new_session()
        held_id = await agent.prompt(held, "mock:mode=hang mock:chunks=1")
        free_id = await agent.prompt(free, "mock:chunks=2")
        seen: list[dict[str, Any]] = []
        while True:
            message = await agent.recv()
            if message.get("id") == free_id:
                break
            seen.append(message)
        assert sorted(texts([m for m in seen if m["params"]["sessionId"] == free])) == [
            "chunk-0",
            "chunk-1",
        ]
        await agent.send({"method": "session/cancel", "params": {"sessionId": held}})
        _, reply = await agent.until_reply(held_id)
        assert reply["result"]["stopReason"] == "cancelled"


async def test_bad_token_is_a_loud_error() -> None:
    async with mock_agent() as agent:
        sid = await agent.new_session()
        _, reply = await agent.until_reply(await agent.prompt(sid, "mock:mode=bogus"))
        assert reply["error"]["code"] == -32602 and "bogus" in reply["error"]["message"]


async def test_bad_variable_refuses_to_start() -> None:
    env = {**os.environ, "MOCK_ACP_MODE": "bogus"}
    env["PYTHONPATH"] = str(ROOT)
    with trio.fail_after(GUARD_SECONDS):
        result = await trio.run_process(
            [sys.executable, "-m", "daemon.mock_agent"],
            env=env,
            stdin=b"",
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert result.returncode == 2
    assert b"MOCK_ACP_MODE" in result.stderr


# -- controls ----------------------------------------------------------------------------------


async def test_prompt_log_records_every_prompt(tmp_path: Path) -> None:
    log = tmp_path / "prompts.jsonl"
    async with mock_agent(MOCK_ACP_PROMPT_LOG=str(log), MOCK_ACP_PROMPT_DELAY_MS="0") as agent:
        a, b = await agent.new_session(), await agent.new_session()
        await agent.until_reply(await agent.prompt(a, "first"))
        await agent.until_reply(await agent.prompt(b, "second mock:mode=reject"))
        await agent.call(
            "session/prompt",
            {
                "sessionId": a,
                "prompt": [
                    {"type": "text", "text": "x"},
                    {"type": "image"},
                    {"type": "text", "text": "y"},
                ],
            },
        )
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert lines == [
        {"sessionId": a, "text": "first"},
        {"sessionId": b, "text": "second mock:mode=reject"},
        {"sessionId": a, "text": "x\ny"},
    ]


async def test_gate_holds_the_turn_until_its_file_exists(tmp_path: Path) -> None:
    async with mock_agent(MOCK_ACP_GATE_DIR=str(tmp_path), MOCK_ACP_PROMPT_DELAY_MS="0") as agent:
        sid = await agent.new_session()
        named = await agent.prompt(sid, "mock:gate=turn-1 mock:chunks=2")
        assert texts([await agent.recv(), await agent.recv()]) == ["chunk-0", "chunk-1"]
        # Held at the gate: a later request overtakes it.
        probe = await agent.request("session/new", {"cwd": "/", "mcpServers": []})
        assert (await agent.recv())["id"] == probe
        (tmp_path / "turn-1").touch()
        notes, reply = await agent.until_reply(named)
        assert notes == [] and reply["result"] == {"stopReason": "end_turn"}

        # Without a gate token there is no gate: the turn ends after the delay.
        _, reply = await agent.until_reply(await agent.prompt(sid, "mock:chunks=0"))
        assert reply["result"] == {"stopReason": "end_turn"}
        assert sorted(p.name for p in tmp_path.iterdir()) == ["turn-1"]


async def test_the_delay_and_the_gate_both_hold_a_turn(tmp_path: Path) -> None:
    """mock:delay_ms waits after the chunks whether or not a gate directory is set, and a
    gate is waited for after it (a gate directory used to switch the delay off)."""
    async with mock_agent(MOCK_ACP_GATE_DIR=str(tmp_path)) as agent:
        sid = await agent.new_session()
        delayed = await agent.prompt(sid, "mock:chunks=1 mock:delay_ms=600000")
        assert texts([await agent.recv()]) == ["chunk-0"]
        probe = await agent.request("session/new", {"cwd": "/", "mcpServers": []})
        assert (await agent.recv())["id"] == probe  # still inside the delay
        await agent.send({"method": "session/cancel", "params": {"sessionId": sid}})
        _, reply = await agent.until_reply(delayed)
        assert reply["result"] == {"stopReason": "cancelled"}


async def test_start_gate_holds_the_chunks_until_its_file_exists(tmp_path: Path) -> None:
    async with mock_agent(MOCK_ACP_GATE_DIR=str(tmp_path)) as agent:
        sid = await agent.new_session()
        held = await agent.prompt(sid, "mock:start_gate=go mock:chunks=2")
        # Nothing streams while the start gate is shut: a later request is answered first.
        probe = await agent.request("session/new", {"cwd": "/", "mcpServers": []})
        assert (await agent.recv())["id"] == probe
        (tmp_path / "go").touch()
        notes, reply = await agent.until_reply(held)
        assert texts(notes) == ["chunk-0", "chunk-1"]
        assert reply["result"] == {"stopReason": "end_turn"}

        # A cancel at the start gate ends the turn cancelled, with no chunk at all.
        cancelled = await agent.prompt(sid, "mock:start_gate=never mock:chunks=2")
        await agent.send({"method": "session/cancel", "params": {"sessionId": sid}})
        notes, reply = await agent.until_reply(cancelled)
        assert notes == [] and reply["result"] == {"stopReason": "cancelled"}


@pytest.mark.parametrize("token", ["mock:start_gate=go", "mock:gate=go"])
async def test_a_gate_without_a_gate_dir_is_an_error_that_says_what_to_set(token: str) -> None:
    """Both gate tokens fail the same way without a gate directory (mock:gate used to be
    ignored silently and the turn ran ungated): the error names the variable to set and how
    to open the gate."""
    async with mock_agent() as agent:
        sid = await agent.new_session()
        notes, reply = await agent.until_reply(await agent.prompt(sid, f"hello {token}"))
        assert reply["error"]["code"] == -32602
        message = reply["error"]["message"]
        assert message.startswith(f"{token} needs a gate directory: set MOCK_ACP_GATE_DIR")
        assert "turnkeeper release NAME" in message
        assert notes == []  # refused before any chunk


async def test_cancel_at_the_gate_ends_cancelled(tmp_path: Path) -> None:
    async with mock_agent(MOCK_ACP_GATE_DIR=str(tmp_path)) as agent:
        sid = await agent.new_session()
        prompt_id = await agent.prompt(sid, "mock:gate=never mock:chunks=1")
        await agent.recv()
        await agent.send({"method": "session/cancel", "params": {"sessionId": sid}})
        _, reply = await agent.until_reply(prompt_id)
        assert reply["result"] == {"stopReason": "cancelled"}


async def test_load_session_replays_then_answers_empty() -> None:
    async with mock_agent(MOCK_ACP_LOAD_SESSION="1", MOCK_ACP_PROMPT_DELAY_MS="0") as agent:
        sid = await agent.new_session()
        await agent.until_reply(await agent.prompt(sid, "hello mock:chunks=2"))
        notes, reply = await agent.until_reply(
            await agent.request("session/load", {"sessionId": sid, "cwd": "/", "mcpServers": []})
        )
        assert reply["result"] == {}
        assert [n["params"]["update"]["sessionUpdate"] for n in notes] == [
            "user_message_chunk",
            "agent_message_chunk",
            "agent_message_chunk",
        ]
        assert texts(notes) == ["hello mock:chunks=2", "chunk-0", "chunk-1"]
        # A session this process never saw (the daemon restarted it) is adopted, empty.
        other = str(uuid.uuid4())
        notes, reply = await agent.until_reply(
            await agent.request("session/load", {"sessionId": other, "cwd": "/", "mcpServers": []})
        )
        assert notes == [] and reply["result"] == {}
        _, reply = await agent.until_reply(await agent.prompt(other, "mock:chunks=0"))
        assert reply["result"] == {"stopReason": "end_turn"}


@pytest.mark.parametrize(
    ("variables", "text"),
    [
        ({}, "idle"),
        ({"MOCK_ACP_MODE": "hang"}, "x"),
        ({"MOCK_ACP_PROMPT_DELAY_MS": "600000"}, "x"),
        ({"MOCK_ACP_GATE_DIR": "GATE"}, "mock:gate=never"),
        ({"MOCK_ACP_MODE": "reject"}, "x"),
    ],
)
async def test_exits_on_stdin_eof_in_every_mode(
    tmp_path: Path, variables: dict[str, str], text: str
) -> None:
    variables = {k: (str(tmp_path) if v == "GATE" else v) for k, v in variables.items()}
    async with mock_agent(**variables) as agent:
        if text != "idle":
            sid = await agent.new_session()
            await agent.prompt(sid, text)
            await agent.recv()  # chunk-0: the prompt is running
        assert await agent.close_stdin_and_wait() == 0


# -- the pure parts ----------------------------------------------------------------------------


def test_plan_tokens_override_and_last_one_wins() -> None:
    base = PromptPlan(mode="echo", chunks=3, delay_ms=100)
    plan = plan_for_prompt(
        base, "mock:chunks=9 text mock:mode=hang mock:chunks=4 mock:bytes=12 mock:gate=g"
    )
    assert plan == PromptPlan(mode="hang", chunks=4, delay_ms=100, pad_bytes=12, gate="g")
    assert plan_for_prompt(base, "mock:start_gate=s mock:gate=g") == PromptPlan(
        mode="echo", chunks=3, delay_ms=100, gate="g", start_gate="s")
    assert plan_for_prompt(base, "no tokens here") == base
    with pytest.raises(ValueError, match="mock:chunks"):
        plan_for_prompt(base, "mock:chunks=-1")
    with pytest.raises(ValueError, match="mock:gate"):
        plan_for_prompt(base, "mock:gate=../escape")
    with pytest.raises(ValueError, match="mock:start_gate"):
        plan_for_prompt(base, "mock:start_gate=a/b")


async def test_rich_and_echo_show_what_a_viewer_renders() -> None:
    """mock:rich=1 streams one of each update kind before the chunks; mock:echo=1 answers with
    the prompt's text (its mock: words removed) after them."""
    async with mock_agent(MOCK_ACP_PROMPT_DELAY_MS="0") as agent:
        sid = await agent.new_session()
        text = "Tell me **more**\n- a list mock:rich=1 mock:chunks=1 mock:echo=1"
        notes, reply = await agent.until_reply(await agent.prompt(sid, text))
        kinds = [n["params"]["update"]["sessionUpdate"] for n in notes]
        assert kinds[:6] == ["agent_thought_chunk", "plan", "tool_call", "tool_call_update",
                             "tool_call_update", "plan"]
        statuses = [n["params"]["update"].get("status") for n in notes[2:5]]
        assert statuses == ["pending", "in_progress", "completed"]
        answer = "".join(n["params"]["update"]["content"]["text"] for n in notes[6:-2])
        assert answer.startswith("Here is what I found") and "```sh\nmake serve\n```" in answer
        assert texts(notes[-2:]) == ["chunk-0", "Tell me **more**\n- a list"]
        assert reply["result"] == {"stopReason": "end_turn"}
        _, bad = await agent.until_reply(await agent.prompt(sid, "mock:rich=yes"))
        assert bad["error"]["code"] == -32602 and "mock:rich must be '1'" in bad["error"]["message"]
