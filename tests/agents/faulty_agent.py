"""A scriptable misbehaving ACP agent for the daemon's fault tests.

Run as ``python tests/agents/faulty_agent.py``. The daemon starts one agent per workspace with
the workspace as cwd, so the fault is chosen per workspace: the file ``faulty-agent-mode`` in the
cwd names it, else the variable ``FAULTY_AGENT_MODE``, else ``mock``.

=================  ===========================================================================
``mock``           exactly the bundled mock agent (``daemon.mock_agent``)
``silent-init``    never answers ``initialize`` (reads stdin until EOF, then exits)
``exit-on-init``   exits with status 4 when ``initialize`` arrives, without answering
``bad-init``       answers ``initialize`` with an unsupported ``protocolVersion``
``garbage``        mid-turn, between the mock's chunks: lines that are not JSON, not UTF-8,
                   not objects, not JSON-RPC, updates with bad params, an unknown
                   notification and an agent request the daemon does not serve
``oversized``      mid-turn, between the mock's chunks: one valid-looking update line of
                   more than 16 MiB (``FAULTY_AGENT_OVERSIZED_BYTES``, default 17 MiB)
``deep-line``      mid-turn, between the mock's chunks: one well-formed update line whose
                   ``update`` is nested 100,000 arrays deep
``unknown-reply``  before answering a prompt: replies for request ids nobody sent
                   (``stopReason: "refusal"``, so taking one for the prompt's reply shows)
``ignore-cancel``  ignores ``session/cancel`` (a ``mock:mode=hang`` prompt then never ends
                   by itself: the daemon's cancel grace must end it)
``stop-reading``   a prompt whose text holds ``stop-reading`` gets one chunk
                   ``stopped-reading``, then the agent never reads its stdin again (it stays
                   alive, its pipe fills); other prompts are the mock's
``same-id``        answers every ``session/new`` with the same ``sessionId``
``permission-flood``  a prompt sends ``FAULTY_AGENT_PERMISSIONS`` (default 1000) permission
                   requests at once and answers ``end_turn`` without waiting for them; once
                   every request has an answer it writes one stderr line
                   ``permission-flood: answered=<n> refused=<n> codes=<error codes>``
``stderr-flood``   a prompt first writes ``FAULTY_AGENT_STDERR_LINES`` (default 200,000)
                   stderr lines of 100 bytes, then one ``stderr-flood: done`` line, then runs
                   as the mock's
=================  ===========================================================================

In the mid-turn modes everything else is the mock's behaviour (its variables and prompt
tokens apply), so a turn still streams ``chunk-0`` ... and ends with ``end_turn``.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path
from typing import Any, BinaryIO

# Run as a script: make the repository importable whatever the cwd (the workspace).
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from daemon.mock_agent import MockAgent, PromptPlan, chunk_lines, prompt_text
from daemon.mock_agent import main as mock_main

MODE_FILE = "faulty-agent-mode"
MODES = ("mock", "silent-init", "exit-on-init", "bad-init", "garbage", "oversized",
         "deep-line", "unknown-reply", "ignore-cancel", "stop-reading", "same-id",
         "permission-flood", "stderr-flood")
MID_TURN_MODES = ("garbage", "oversized", "deep-line")
DEEP_LEVELS = 100_000
EXIT_ON_INIT_CODE = 4
SIXTEEN_MIB = 16 * 1024 * 1024
SAME_SESSION_ID = "the-one-session"
STDERR_LINE = b"x" * 99 + b"\n"


def selected_mode(cwd: Path, env: dict[str, str] | os._Environ[str]) -> str:
    marker = cwd / MODE_FILE
    mode = marker.read_text().strip() if marker.exists() else env.get("FAULTY_AGENT_MODE", "mock")
    if mode not in MODES:
        raise SystemExit(f"faulty agent: unknown mode {mode!r}; one of {', '.join(MODES)}")
    return mode


def garbage_lines(session_id: str) -> list[bytes]:
    """One line of each kind of malformed input a broken agent could write."""
    update = {"jsonrpc": "2.0", "method": "session/update"}
    return [
        b"this is not json",
        b"\xff\xfe\xfd invalid utf-8 \xc3\x28",
        b"[1, 2, 3]",
        b"42",
        b'"a string"',
        b"null",
        b'{"jsonrpc": "2.0"',  # truncated
        b'{"no": "jsonrpc fields"}',
        b'{"jsonrpc": "1.0", "method": "session/update", "params": {}}',
        b'{"jsonrpc": "2.0", "id": {"an": "object id"}, "result": {}}',
        b'{"jsonrpc": "2.0", "result": {"stopReason": "refusal"}}',  # reply without an id
        json.dumps({**update, "params": "not an object"}).encode(),
        json.dumps({**update, "params": {"sessionId": session_id, "update": "nope"}}).encode(),
        json.dumps({**update, "params": {"sessionId": 7, "update": {}}}).encode(),
        json.dumps({**update, "params": {"sessionId": "unknown-session", "update": {
            "sessionUpdate": "agent_message_chunk",
            "content": {"type": "text", "text": "for nobody"}}}}).encode(),
        json.dumps({"jsonrpc": "2.0", "method": "agent/unknown_notification",
                    "params": {}}).encode(),
        json.dumps({"jsonrpc": "2.0", "id": "fs-1", "method": "fs/read_text_file",
                    "params": {"sessionId": session_id, "path": "/etc/hostname"}}).encode(),
        b"{" * 100_000,  # deep nesting on one line
        b"   ",
    ]


def deep_line(session_id: str) -> bytes:
    head = json.dumps({"jsonrpc": "2.0", "method": "session/update",
                       "params": {"sessionId": session_id, "update": 0}}).encode()
    return head.replace(b'"update": 0', b'"update": ' + b"[" * DEEP_LEVELS + b"]" * DEEP_LEVELS)


def oversized_line(session_id: str, size: int) -> bytes:
    head = chunk_lines(session_id, 1, 0)[0].split(b'"text":"')[0] + b'"text":"'
    return head + b"x" * size + b'"}}}}'


class FaultyAgent(MockAgent):
    def __init__(self, env: dict[str, str] | os._Environ[str], out: BinaryIO, mode: str) -> None:
        super().__init__(env, out)
        self.mode = mode
        self.oversized_bytes = int(env.get("FAULTY_AGENT_OVERSIZED_BYTES",
                                           str(SIXTEEN_MIB + 1024 * 1024)))
        self.permissions = int(env.get("FAULTY_AGENT_PERMISSIONS", "1000"))
        self.stderr_lines = int(env.get("FAULTY_AGENT_STDERR_LINES", "200000"))
        self.stopped_reading = threading.Event()
        # permission-flood: the error codes of refused requests, and how many were answered.
        self.flood_lock = threading.Lock()
        self.flood_codes: list[Any] = []
        self.flood_answered = 0

    def handle_request(self, request_id: Any, method: str, params: dict[str, Any]) -> None:
        if method == "initialize":
            if self.mode == "silent-init":
                return
            if self.mode == "exit-on-init":
                print("faulty agent: exiting during initialize", file=sys.stderr, flush=True)
                os._exit(EXIT_ON_INIT_CODE)
            if self.mode == "bad-init":
                self.reply(request_id, {"protocolVersion": 99, "agentCapabilities": {}})
                return
        if method == "session/prompt" and self.mode == "unknown-reply":
            for bogus in (10_000_000, "never-sent"):
                self.reply(bogus, {"stopReason": "refusal"})
            self.reply_error(20_000_000, -32603, "error for a request nobody sent")
        if method == "session/new" and self.mode == "same-id":
            self.reply(request_id, {"sessionId": SAME_SESSION_ID})
            return
        if method == "session/prompt" and self.mode == "stop-reading" \
                and "stop-reading" in prompt_text(params.get("prompt")):
            session_id = str(params.get("sessionId"))
            self.write(self.chunk(session_id, "stopped-reading"))
            self.stopped_reading.set()  # the main loop reads nothing more
            return
        if method == "session/prompt" and self.mode == "permission-flood":
            self.flood(request_id, str(params.get("sessionId")))
            return
        if method == "session/prompt" and self.mode == "stderr-flood":
            err = sys.stderr.buffer
            for _ in range(self.stderr_lines):
                err.write(STDERR_LINE)
            err.write(b"stderr-flood: done\n")
            err.flush()
        super().handle_request(request_id, method, params)

    @staticmethod
    def chunk(session_id: str, text: str) -> bytes:
        return json.dumps({"jsonrpc": "2.0", "method": "session/update", "params": {
            "sessionId": session_id, "update": {
                "sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": text}}}}).encode() + b"\n"

    def flood(self, prompt_request_id: Any, session_id: str) -> None:
        """Ask for many permissions at once, answer the prompt at once, then report on stderr
        what the daemon answered each request."""
        lines = []
        for i in range(self.permissions):
            lines.append(json.dumps({
                "jsonrpc": "2.0", "id": f"flood-{i}", "method": "session/request_permission",
                "params": {"sessionId": session_id,
                           "toolCall": {"toolCallId": f"flood-{i}", "title": "Flood"},
                           "options": [{"optionId": "allow-once", "name": "Allow",
                                        "kind": "allow_once"}]}}).encode() + b"\n")
        # One write: the daemon reads the requests and the prompt's reply together.
        lines.append(json.dumps({"jsonrpc": "2.0", "id": prompt_request_id,
                                 "result": {"stopReason": "end_turn"}}).encode() + b"\n")
        self.write(b"".join(lines))

    def take_answer(self, message: dict[str, Any]) -> None:
        if self.mode != "permission-flood" or not str(message.get("id")).startswith("flood-"):
            super().take_answer(message)
            return
        with self.flood_lock:
            error = message.get("error")
            if isinstance(error, dict):
                self.flood_codes.append(error.get("code"))
            else:
                self.flood_answered += 1
            done = self.flood_answered + len(self.flood_codes) == self.permissions
            report = (f"permission-flood: answered={self.flood_answered} "
                      f"refused={len(self.flood_codes)} codes={sorted(set(self.flood_codes))}")
        if done:
            print(report, file=sys.stderr, flush=True)

    def cancel(self, session_id: Any) -> None:
        if self.mode != "ignore-cancel":
            super().cancel(session_id)

    def stream_chunks(self, session_id: str, plan: PromptPlan, cancelled: threading.Event) -> bool:
        if self.mode not in MID_TURN_MODES or plan.chunks < 2:
            return super().stream_chunks(session_id, plan, cancelled)
        half = plan.chunks // 2
        self.write(b"".join(chunk_lines(session_id, half, plan.pad_bytes)))
        if self.mode == "garbage":
            self.write(b"".join(line + b"\n" for line in garbage_lines(session_id)))
        elif self.mode == "deep-line":
            self.write(deep_line(session_id) + b"\n")
        else:
            self.write(oversized_line(session_id, self.oversized_bytes) + b"\n")
        if cancelled.is_set():
            return False
        self.write(b"".join(chunk_lines(session_id, plan.chunks - half, plan.pad_bytes, half)))
        return True


def main() -> None:
    mode = selected_mode(Path.cwd(), os.environ)
    if mode == "mock":
        mock_main()
        return
    agent = FaultyAgent(os.environ, sys.stdout.buffer, mode)
    stdin = sys.stdin.buffer
    while line := stdin.readline():
        if line.strip():
            agent.handle_line(line)
        if agent.stopped_reading.is_set():
            threading.Event().wait()  # alive, never reading stdin again
    os._exit(0)


if __name__ == "__main__":
    main()
