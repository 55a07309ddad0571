"""AgentChannel against real agent subprocesses: the bundled mock, inline scripts, a library agent."""

from __future__ import annotations

import json
import logging
import os
import sys
import textwrap
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio

from daemon.agent import (
    AgentChannel,
    AgentRpcError,
    AgentStartError,
    ChannelClosed,
)
from daemon.core.updates import ChunkRun, UpdateBatch, plain_chunk_run

pytestmark = pytest.mark.processes  # starts processes: not in make unit-fast

ROOT = Path(__file__).resolve().parents[2]
MOCK = [sys.executable, "-m", "daemon.mock_agent"]
LIB_AGENT = [sys.executable, str(ROOT / "tests" / "agents" / "acp_lib_agent.py")]
# Hang guard only: every wait below is on a condition; this turns a bug into a failure.
GUARD_SECONDS = 20


def agent_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MOCK_ACP_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


def text_prompt(text: str) -> list[dict[str, Any]]:
    return [{"type": "text", "text": text}]


class RecordingSink:
    """A SessionSink that records everything and lets a test wait for a condition."""

    def __init__(self, permission_result: dict[str, Any] | None = None,
                 group_lines: int = 64) -> None:
        self.group_lines = group_lines
        self.flow = self  # the channel paces its reads by it (SessionSink.flow)
        self.updates: list[dict[str, Any]] = []
        self.raw_updates: list[bytes] = []
        self.chunk_runs: list[ChunkRun | None] = []
        self.flushed_at: list[int] = []  # len(updates) at each flush
        self.permission_requests: list[dict[str, Any]] = []
        self.permission_result = permission_result or {
            "outcome": {"outcome": "selected", "optionId": "allow-once"}
        }
        self._changed = trio.Event()

    def publish(self, batch: UpdateBatch) -> None:
        # The channel hands on the agent's bytes of each update object, undecoded, with the
        # kind and texts of a run of plain text chunks it read on the way.
        assert batch.run == plain_chunk_run(batch.updates)
        for update in batch.updates:
            assert type(update) is bytes
            self.raw_updates.append(update)
            self.updates.append(msgspec.json.decode(update))
        self.chunk_runs.append(batch.run)
        self.flushed_at.append(len(self.updates))
        self._changed.set()
        self._changed = trio.Event()

    async def wait_for_subscribers(self) -> None:
        pass

    def permission_asked(self, params: dict[str, Any]) -> Awaitable[dict[str, Any]]:
        self.permission_requests.append(params)
        return self._decide()

    async def _decide(self) -> dict[str, Any]:
        return self.permission_result

    @property
    def texts(self) -> list[str]:
        return [
            u["content"]["text"] for u in self.updates if u.get("content", {}).get("type") == "text"
        ]

    async def wait_until(self, predicate: Callable[[], bool]) -> None:
        while not predicate():
            await self._changed.wait()


@asynccontextmanager
async def open_channel(
    argv: list[str], cwd: Path, *, env: dict[str, str] | None = None, **kwargs: Any
) -> AsyncIterator[AgentChannel]:
    with trio.fail_after(GUARD_SECONDS):
        async with trio.open_nursery() as nursery:
            channel = AgentChannel(
                argv, str(cwd), env=env if env is not None else agent_env(), **kwargs
            )
            await nursery.start(channel.run)
            try:
                yield channel
            finally:
                await channel.aclose()


def write_script(tmp_path: Path, name: str, body: str) -> list[str]:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return [sys.executable, str(path)]


# A stdlib agent scripted to misbehave in every way the channel must survive.
UNRULY_AGENT = r"""
import json, sys

def send(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()

def read_reply(want_id):
    for line in sys.stdin:
        msg = json.loads(line)
        if msg.get("id") == want_id and "method" not in msg:
            return msg
    sys.exit(0)

for line in sys.stdin:
    msg = json.loads(line)
    method = msg.get("method")
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": msg["id"], "result": {"protocolVersion": 1, "agentCapabilities": {}}})
    elif method == "session/new":
        send({"jsonrpc": "2.0", "id": msg["id"], "result": {"sessionId": "unruly-1"}})
    elif method == "session/prompt":
        sid = msg["params"]["sessionId"]
        sys.stdout.write("this is not json\n\n[1, 2]\n{\"jsonrpc\": \"2.0\"}\r\n")
        sys.stdout.write("x" * (17 * 1024 * 1024) + "\n")
        send({"jsonrpc": "2.0", "id": 999, "result": {"stray": True}})
        send({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": sid}})
        send({"jsonrpc": "2.0", "method": "unknown/notification", "params": {}})
        send({"jsonrpc": "2.0", "id": "q1", "method": "fs/read_text_file", "params": {"sessionId": sid, "path": "/x"}})
        unknown = read_reply("q1")
        send({"jsonrpc": "2.0", "id": "q2", "method": "session/request_permission",
              "params": {"sessionId": sid, "toolCall": {"toolCallId": "t1"},
                         "options": [{"optionId": "allow-once", "name": "Allow", "kind": "allow_once"}]}})
        permission = read_reply("q2")
        send({"jsonrpc": "2.0", "id": "q3", "method": "session/request_permission",
              "params": {"sessionId": "nobody", "toolCall": {"toolCallId": "t2"}, "options": []}})
        unrouted = read_reply("q3")
        report = json.dumps({"unknown": unknown, "permission": permission, "unrouted": unrouted})
        send({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": sid, "update":
              {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": report}}}})
        send({"jsonrpc": "2.0", "id": msg["id"], "result": {"stopReason": "end_turn"}})
"""


# -- the mock agent ----------------------------------------------------------------------------


async def test_initialize_and_new_session(tmp_path: Path) -> None:
    async with open_channel(MOCK, tmp_path) as channel:
        assert channel.pid is not None and not channel.closed
        assert channel.agent_capabilities["loadSession"] is False
        assert channel.supports_load_session is False
        first = await channel.new_session(str(tmp_path))
        second = await channel.new_session(str(tmp_path))
        assert uuid.UUID(first).version == 4 and first != second
    assert channel.closed
    assert (channel.exit_code, channel.signal_name) == (0, None)


async def test_prompt_streams_chunks_in_order_then_end_turn(tmp_path: Path) -> None:
    env = agent_env(MOCK_ACP_EMIT_CHUNKS="2000", MOCK_ACP_PROMPT_DELAY_MS="0")
    async with open_channel(MOCK, tmp_path, env=env) as channel:
        sid = await channel.new_session(str(tmp_path))
        sink = RecordingSink()
        channel.attach(sid, sink)
        result = await channel.prompt(sid, text_prompt("hello"))
        # Every update was delivered (and flushed) before the reply that followed it.
        assert result == {"stopReason": "end_turn"}
        assert sink.texts == [f"chunk-{i}" for i in range(2000)]
        assert sink.updates[0] == {
            "sessionUpdate": "agent_message_chunk",
            "content": {"type": "text", "text": "chunk-0"},
        }
        # The agent's own bytes of the update object, not a re-encoding of a decoded dict.
        assert sink.raw_updates[0] == (
            b'{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"chunk-0"}}')
        assert sink.flushed_at[-1] == 2000
        assert sink.flushed_at == sorted(set(sink.flushed_at))  # once per batch, never empty
        assert len(sink.flushed_at) < 2000  # batched, not per line


async def test_the_reader_yields_after_the_group_its_sinks_allow(tmp_path: Path) -> None:
    # Flow control relies on it: between two flushes (the points where subscribers are
    # checked and woken) the reader publishes at most the smallest group an attached session
    # allows, however much one read held.
    env = agent_env(MOCK_ACP_EMIT_CHUNKS="3000", MOCK_ACP_PROMPT_DELAY_MS="0")
    async with open_channel(MOCK, tmp_path, env=env) as channel:
        sid = await channel.new_session(str(tmp_path))
        other = await channel.new_session(str(tmp_path))
        sink, wide = RecordingSink(group_lines=7), RecordingSink(group_lines=1000)
        channel.attach(sid, sink)
        channel.attach(other, wide)
        await channel.prompt(sid, text_prompt("hello"))
        assert sink.flushed_at[-1] == 3000
        steps = [b - a for a, b in zip([0, *sink.flushed_at], sink.flushed_at, strict=False)]
        assert max(steps) <= 7
        assert len(steps) < 3000  # still whole groups, not one flush per line


async def test_updates_route_to_their_own_session(tmp_path: Path) -> None:
    env = agent_env(MOCK_ACP_PROMPT_DELAY_MS="0")
    async with open_channel(MOCK, tmp_path, env=env) as channel:
        sid_a = await channel.new_session(str(tmp_path))
        sid_b = await channel.new_session(str(tmp_path))
        sid_unattached = await channel.new_session(str(tmp_path))
        sink_a, sink_b = RecordingSink(), RecordingSink()
        channel.attach(sid_a, sink_a)
        channel.attach(sid_b, sink_b)
        results: dict[str, dict[str, Any]] = {}

        async def run(sid: str, text: str) -> None:
            results[sid] = await channel.prompt(sid, text_prompt(text))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run, sid_a, "mock:chunks=500 mock:bytes=64")
            nursery.start_soon(run, sid_b, "mock:chunks=700")
            nursery.start_soon(run, sid_unattached, "mock:chunks=50")
        assert all(r == {"stopReason": "end_turn"} for r in results.values()) and len(results) == 3
        assert sink_a.texts == [f"chunk-{i}".ljust(64, ".") for i in range(500)]
        assert sink_b.texts == [f"chunk-{i}" for i in range(700)]
        channel.detach(sid_b)
        assert await channel.prompt(sid_b, text_prompt("mock:chunks=5")) == {
            "stopReason": "end_turn"
        }
        assert len(sink_b.updates) == 700


async def test_reject_is_an_rpc_error_and_the_channel_stays_up(tmp_path: Path) -> None:
    async with open_channel(MOCK, tmp_path, env=agent_env(MOCK_ACP_MODE="reject")) as channel:
        sid = await channel.new_session(str(tmp_path))
        with pytest.raises(AgentRpcError) as info:
            await channel.prompt(sid, text_prompt("hi"))
        assert (info.value.code, info.value.message) == (-32603, "injected error")
        assert not channel.closed
        ok = await channel.prompt(sid, text_prompt("mock:mode=echo mock:delay_ms=0"))
        assert ok == {"stopReason": "end_turn"}


async def test_crash_on_prompt_closes_the_channel_and_reports_the_exit(tmp_path: Path) -> None:
    exits: list[tuple[int | None, str | None]] = []
    exited = trio.Event()

    def on_exit(code: int | None, signal_name: str | None) -> None:
        exits.append((code, signal_name))
        exited.set()

    async with open_channel(MOCK, tmp_path, on_exit=on_exit) as channel:
        sid = await channel.new_session(str(tmp_path))
        with pytest.raises(ChannelClosed):
            await channel.prompt(sid, text_prompt("mock:mode=crash-on-prompt"))
        await exited.wait()
        assert channel.closed
        with pytest.raises(ChannelClosed):
            await channel.new_session(str(tmp_path))
        with pytest.raises(ChannelClosed):
            await channel.cancel(sid)
    assert exits == [(3, None)]
    assert channel.exit_code == 3


async def test_hang_then_cancel_ends_cancelled(tmp_path: Path) -> None:
    async with open_channel(MOCK, tmp_path, env=agent_env(MOCK_ACP_MODE="hang")) as channel:
        sid = await channel.new_session(str(tmp_path))
        sink = RecordingSink()
        channel.attach(sid, sink)
        results: list[dict[str, Any]] = []

        async def run() -> None:
            results.append(await channel.prompt(sid, text_prompt("wait for me")))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run)
            await sink.wait_until(lambda: len(sink.updates) == 3)
            assert results == []
            await channel.cancel(sid)
        assert results == [{"stopReason": "cancelled"}]


async def test_cancelling_run_terminates_the_agent_and_fails_pending_requests(
    tmp_path: Path,
) -> None:
    exits: list[object] = []
    channel = AgentChannel(
        MOCK, str(tmp_path), env=agent_env(MOCK_ACP_MODE="hang"), on_exit=lambda *a: exits.append(a)
    )
    scope = trio.CancelScope()
    outcome: list[BaseException] = []

    async def run_channel(
        task_status: trio.TaskStatus[AgentChannel] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        with scope:
            await channel.run(task_status=task_status)

    async def prompt(sid: str) -> None:
        try:
            await channel.prompt(sid, text_prompt("x"))
        except ChannelClosed as exc:
            outcome.append(exc)

    with trio.fail_after(GUARD_SECONDS):
        async with trio.open_nursery() as nursery:
            await nursery.start(run_channel)
            sid = await channel.new_session(str(tmp_path))
            sink = RecordingSink()
            channel.attach(sid, sink)
            nursery.start_soon(prompt, sid)
            await sink.wait_until(lambda: len(sink.updates) == 3)
            scope.cancel()
    assert len(outcome) == 1 and isinstance(outcome[0], ChannelClosed)
    assert channel.closed
    assert channel.exit_code == 0  # it left on stdin EOF, no kill needed
    assert exits == []  # on_exit reports agent deaths, not our own shutdown


async def test_load_session_consumes_replayed_updates(tmp_path: Path) -> None:
    env = agent_env(MOCK_ACP_LOAD_SESSION="1", MOCK_ACP_PROMPT_DELAY_MS="0")
    async with open_channel(MOCK, tmp_path, env=env) as channel:
        assert channel.supports_load_session is True
        sid = await channel.new_session(str(tmp_path))
        sink = RecordingSink()
        channel.attach(sid, sink)
        await channel.prompt(sid, text_prompt("mock:chunks=40"))
        assert len(sink.updates) == 40
        # The mock replays the user message and all 40 chunks before answering session/load.
        await channel.load_session(sid, str(tmp_path))
        assert len(sink.updates) == 40
        await channel.prompt(sid, text_prompt("mock:chunks=2"))
        assert sink.texts[40:] == ["chunk-0", "chunk-1"]


async def test_load_session_without_support_is_an_rpc_error(tmp_path: Path) -> None:
    async with open_channel(MOCK, tmp_path) as channel:
        with pytest.raises(AgentRpcError) as info:
            await channel.load_session(str(uuid.uuid4()), str(tmp_path))
        assert info.value.code == -32601


# -- misbehaving agents ------------------------------------------------------------------------


async def test_garbage_unknown_requests_and_permissions(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="daemon.agent")
    argv = write_script(tmp_path, "unruly.py", UNRULY_AGENT)
    async with open_channel(argv, tmp_path) as channel:
        sid = await channel.new_session(str(tmp_path))
        assert sid == "unruly-1"
        sink = RecordingSink(
            permission_result={"outcome": {"outcome": "selected", "optionId": "allow-once"}}
        )
        channel.attach(sid, sink)
        result = await channel.prompt(sid, text_prompt("go"))
        assert result == {"stopReason": "end_turn"}
        assert len(sink.updates) == 1  # the malformed update was skipped
        # The agent wrote it with spaces (json.dumps): handed on compact, the spaces inside
        # its text kept.
        assert sink.raw_updates[0] == msgspec.json.encode(sink.updates[0])
        assert b", " in sink.raw_updates[0]
        report = json.loads(sink.texts[0])
        assert report["unknown"]["error"]["code"] == -32601
        assert "fs/read_text_file" in report["unknown"]["error"]["message"]
        assert report["permission"]["result"] == {
            "outcome": {"outcome": "selected", "optionId": "allow-once"}
        }
        assert report["unrouted"]["error"]["code"] == -32602
        assert [p["toolCall"]["toolCallId"] for p in sink.permission_requests] == ["t1"]
        # Still fully working after all of it.
        assert await channel.prompt(sid, text_prompt("again")) == {"stopReason": "end_turn"}
        assert not channel.closed
    logged = caplog.text
    assert "event=agent_malformed_line" in logged
    assert "event=agent_line_discarded" in logged
    assert "event=agent_reply_unknown_id" in logged and "id=999" in logged
    assert "event=agent_bad_update" in logged


async def test_agent_stderr_is_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="daemon.agent")
    argv = write_script(
        tmp_path,
        "chatty.py",
        """
        import json, sys
        for line in sys.stdin:
            msg = json.loads(line)
            print("hello from stderr", file=sys.stderr, flush=True)
            print(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": {"protocolVersion": 1}}), flush=True)
        """,
    )
    async with open_channel(argv, tmp_path) as channel:
        assert channel.agent_capabilities == {}
    assert "event=agent_stderr" in caplog.text and "hello from stderr" in caplog.text


async def test_agent_that_never_answers_initialize(tmp_path: Path) -> None:
    argv = write_script(tmp_path, "silent.py", "import sys\nsys.stdin.read()\n")
    channel = AgentChannel(argv, str(tmp_path), init_timeout=0.3, env=agent_env())
    with trio.fail_after(GUARD_SECONDS):
        async with trio.open_nursery() as nursery:
            # nursery.start raising proves the error came before task_status.started().
            with pytest.raises(AgentStartError, match="no initialize reply") as info:
                await nursery.start(channel.run)
    assert info.value.code == "agent_start_failed"
    assert channel.closed and channel.signal_name == "SIGKILL"


async def test_agent_that_exits_during_initialize(tmp_path: Path) -> None:
    argv = write_script(tmp_path, "quitter.py", "import sys\nsys.exit(7)\n")
    channel = AgentChannel(argv, str(tmp_path), env=agent_env())
    with trio.fail_after(GUARD_SECONDS):
        async with trio.open_nursery() as nursery:
            with pytest.raises(AgentStartError, match="exited during initialize"):
                await nursery.start(channel.run)
    assert channel.exit_code == 7


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        (
            '{"jsonrpc":"2.0","id":ID,"error":{"code":-32000,"message":"auth required"}}',
            "auth required",
        ),
        ('{"jsonrpc":"2.0","id":ID,"result":[]}', "not an object"),
        ('{"jsonrpc":"2.0","id":ID,"result":{"protocolVersion":2}}', "unsupported protocolVersion"),
        (
            '{"jsonrpc":"2.0","id":ID,"result":{"protocolVersion":1,"agentCapabilities":3}}',
            "agentCapabilities",
        ),
    ],
)
async def test_bad_initialize_reply(tmp_path: Path, reply: str, reason: str) -> None:
    argv = write_script(
        tmp_path,
        "bad_init.py",
        f"""
        import json, sys, time
        msg = json.loads(sys.stdin.readline())
        print({reply!r}.replace("ID", json.dumps(msg["id"])), flush=True)
        sys.stdin.read()
        """,
    )
    channel = AgentChannel(argv, str(tmp_path), env=agent_env())
    with trio.fail_after(GUARD_SECONDS):
        async with trio.open_nursery() as nursery:
            with pytest.raises(AgentStartError, match=reason):
                await nursery.start(channel.run)
    assert channel.closed and channel.signal_name == "SIGKILL"


async def test_unstartable_agent(tmp_path: Path) -> None:
    channel = AgentChannel([str(tmp_path / "no-such-agent")], str(tmp_path))
    with pytest.raises(AgentStartError, match="cannot start agent"):
        await channel.run()


async def test_aclose_kills_an_agent_that_ignores_stdin_eof(tmp_path: Path) -> None:
    argv = write_script(
        tmp_path,
        "stubborn.py",
        """
        import json, signal, sys, time
        msg = json.loads(sys.stdin.readline())
        print(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": {"protocolVersion": 1}}), flush=True)
        sys.stdin.read()
        while True:
            time.sleep(60)
        """,
    )
    exits: list[tuple[int | None, str | None]] = []
    async with open_channel(argv, tmp_path, on_exit=lambda c, s: exits.append((c, s))):
        pass
    assert exits == [(None, "SIGKILL")]


def test_constructor_rejects_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="argv"):
        AgentChannel([], str(tmp_path))
    with pytest.raises(ValueError, match="init_timeout"):
        AgentChannel(MOCK, str(tmp_path), init_timeout=0)


# -- a third-party agent built on the official ACP library ---------------------------------------


async def test_acp_library_agent_full_turn(tmp_path: Path) -> None:
    async with open_channel(
        LIB_AGENT, tmp_path, env=agent_env(ACP_LIB_AGENT_CHUNKS="4")
    ) as channel:
        assert channel.supports_load_session is False
        sid = await channel.new_session(str(tmp_path))
        assert sid.startswith("lib-")
        sink = RecordingSink()
        channel.attach(sid, sink)
        result = await channel.prompt(sid, text_prompt("hello"))
        assert result["stopReason"] == "end_turn"
        assert sink.texts == ["lib-chunk-0", "lib-chunk-1", "lib-chunk-2", "lib-chunk-3"]
        assert all(u["sessionUpdate"] == "agent_message_chunk" for u in sink.updates)


async def test_acp_library_agent_permission_round_trip(tmp_path: Path) -> None:
    async with open_channel(
        LIB_AGENT, tmp_path, env=agent_env(ACP_LIB_AGENT_CHUNKS="1")
    ) as channel:
        sid = await channel.new_session(str(tmp_path))
        allow = RecordingSink(
            permission_result={"outcome": {"outcome": "selected", "optionId": "allow-once"}}
        )
        channel.attach(sid, allow)
        await channel.prompt(sid, text_prompt("please ask-permission"))
        assert allow.texts == ["permission:allow-once", "lib-chunk-0"]
        (request,) = allow.permission_requests
        assert request["sessionId"] == sid
        assert request["toolCall"]["toolCallId"] == "call-1"
        assert [o["optionId"] for o in request["options"]] == ["allow-once", "reject-once"]

        refuse = RecordingSink(permission_result={"outcome": {"outcome": "cancelled"}})
        channel.detach(sid, allow)  # one sink per session id: the next one attaches after
        channel.attach(sid, refuse)
        await channel.prompt(sid, text_prompt("ask-permission again"))
        assert refuse.texts == ["permission:cancelled", "lib-chunk-0"]


# An agent that asks a permission and answers the prompt in the same write, without waiting.
ASK_AND_ANSWER_AGENT = r"""
import json, sys

for line in sys.stdin:
    msg = json.loads(line)
    method, rid = msg.get("method"), msg.get("id")
    if method == "initialize":
        out = {"jsonrpc": "2.0", "id": rid, "result": {"protocolVersion": 1}}
    elif method == "session/new":
        out = {"jsonrpc": "2.0", "id": rid, "result": {"sessionId": "s"}}
    elif method == "session/prompt":
        ask = {"jsonrpc": "2.0", "id": f"ask-{rid}", "method": "session/request_permission",
               "params": {"sessionId": "s", "options": []}}
        reply = {"jsonrpc": "2.0", "id": rid, "result": {"stopReason": "end_turn"}}
        sys.stdout.write(json.dumps(ask) + "\n" + json.dumps(reply) + "\n")
        sys.stdout.flush()
        continue
    else:
        continue
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
"""


async def test_a_permission_request_reaches_its_sink_before_the_reply_read_after_it(
    tmp_path: Path,
) -> None:
    """The sink learns of a permission request as the line is read, so the prompt's reply read
    after it (here in the same read) cannot end the turn first. Repeated: a hand-off through a
    task would lose that race about every other time (Trio runs a batch in either order)."""
    argv = write_script(tmp_path, "ask_and_answer.py", ASK_AND_ANSWER_AGENT)
    async with open_channel(argv, tmp_path) as channel:
        sid = await channel.new_session(str(tmp_path))
        sink = RecordingSink(permission_result={"outcome": {"outcome": "cancelled"}})
        channel.attach(sid, sink)
        for turn in range(1, 13):
            assert await channel.prompt(sid, text_prompt("go")) == {"stopReason": "end_turn"}
            assert len(sink.permission_requests) == turn


# -- many sessions on one agent: a read costs the same however many are attached ---------------


class CountingSink(RecordingSink):
    """Counts how often the channel asks it for its group size."""

    def __init__(self, group_lines: int = 64) -> None:
        self.asked = 0
        super().__init__(group_lines=group_lines)
        self.asked = 0

    @property  # type: ignore[override]
    def group_lines(self) -> int:
        self.asked += 1
        return self._group_lines

    @group_lines.setter
    def group_lines(self, value: int) -> None:
        self._group_lines = value


async def test_idle_sessions_are_not_asked_on_every_read(tmp_path: Path) -> None:
    # With N idle sessions attached, the reader used to ask every one of them for its group
    # size on every read of stdout: O(N) per read. It keeps the smallest and asks again only
    # when a session says its own changed.
    env = agent_env(MOCK_ACP_PROMPT_DELAY_MS="0")
    async with open_channel(MOCK, tmp_path, env=env) as channel:
        idle = [CountingSink() for _ in range(200)]
        for sink in idle:
            channel.attach(await channel.new_session(str(tmp_path)), sink)
        sid = await channel.new_session(str(tmp_path))
        busy = CountingSink()
        channel.attach(sid, busy)
        for turn in range(6):  # six turns: six reads at least
            await channel.prompt(sid, text_prompt(f"turn {turn} mock:chunks=40"))
        assert len(busy.texts) == 6 * 40
        assert max(sink.asked for sink in idle) <= 2
        # A session whose group size changes says so, and the next read honours it.
        busy.group_lines = 3
        channel.group_lines_changed()
        await channel.prompt(sid, text_prompt("mock:chunks=30"))
        steps = [b - a for a, b in zip(busy.flushed_at, busy.flushed_at[1:], strict=False)]
        assert max(steps[-10:]) <= 3
