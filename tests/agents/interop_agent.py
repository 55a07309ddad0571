"""A scripted ACP agent that behaves like the popular agents the daemon's agent matrix found
quirks in, for the normal suite (no npm, no network).

Run as ``python tests/agents/interop_agent.py``; ``INTEROP_AGENT_FLAGS`` (comma-separated) picks
the behaviours:

================  ===========================================================================
``eager-update``  the ``session/new`` and ``session/load`` replies are written in one write
                  together with an ``available_commands_update`` for that session, as opencode
                  does (the update follows the reply in the same read)
``fail-load``     ``session/load`` answers a JSON-RPC error, as Gemini CLI 0.61.0 does for its
                  own earlier sessions
``echo-prompt``   a prompt's text comes back first as ``user_message_chunk`` updates (in two
                  pieces), as Mistral Vibe does, before the agent's answer
``other-user``    a ``user_message_chunk`` that is not the prompt comes before the answer
``helper``        at ``initialize``, starts a helper process that sleeps for 10 minutes,
                  holding the agent's stdout and stderr pipes open and ignoring SIGTERM (only
                  SIGKILL ends it), and writes its pid to
                  ``interop-helper.pid`` in the cwd (Codex's npm wrapper starts its native
                  binary so: the binary inherits the wrapper's stdio)
``ignore-eof``    keeps running after stdin EOF, until killed (the Claude Code adapter and
                  Codex's wrapper do)
================  ===========================================================================

A prompt is answered with the agent text ``interop reply to <prompt text>`` (two chunks) and
``end_turn``. Standard library only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

HELPER_PID_FILE = "interop-helper.pid"
HELPER_SCRIPT = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
OTHER_USER_TEXT = "a different user message from the agent"
COMMANDS = [{"name": "init", "description": "create AGENTS.md"}]


def reply_text(prompt: str) -> str:
    return f"interop reply to {prompt}"


def line(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def update(session_id: str, body: dict[str, Any]) -> bytes:
    return line({"jsonrpc": "2.0", "method": "session/update",
                 "params": {"sessionId": session_id, "update": body}})


def chunk(session_id: str, kind: str, text: str) -> bytes:
    return update(session_id, {"sessionUpdate": kind,
                               "content": {"type": "text", "text": text}})


def result(request_id: Any, value: Any) -> bytes:
    return line({"jsonrpc": "2.0", "id": request_id, "result": value})


class Agent:
    def __init__(self, flags: set[str]) -> None:
        self.flags = flags
        self.out = sys.stdout.buffer

    def write(self, data: bytes) -> None:
        # One write per call: what is written together arrives in one read.
        self.out.write(data)
        self.out.flush()

    def commands_update(self, session_id: str) -> bytes:
        if "eager-update" not in self.flags:
            return b""
        return update(session_id, {"sessionUpdate": "available_commands_update",
                                   "availableCommands": COMMANDS})

    def handle(self, message: dict[str, Any]) -> None:
        method = message.get("method")
        request_id = message.get("id")
        params = message.get("params") or {}
        if method == "initialize":
            if "helper" in self.flags:
                helper = subprocess.Popen(
                    [sys.executable, "-c", HELPER_SCRIPT],
                    stdin=subprocess.DEVNULL)
                Path(HELPER_PID_FILE).write_text(f"{helper.pid}\n")
            self.write(result(request_id, {
                "protocolVersion": 1, "agentCapabilities": {"loadSession": True},
                "agentInfo": {"name": "interop-agent", "version": "1"}, "authMethods": []}))
        elif method == "session/new":
            session_id = f"interop-{uuid.uuid4()}"
            self.write(result(request_id, {"sessionId": session_id})
                       + self.commands_update(session_id))
        elif method == "session/load":
            session_id = params.get("sessionId", "")
            if "fail-load" in self.flags:
                self.write(line({"jsonrpc": "2.0", "id": request_id,
                                 "error": {"code": -32603, "message": "Internal error"}}))
                return
            self.write(result(request_id, None) + self.commands_update(session_id))
        elif method == "session/prompt":
            session_id = params.get("sessionId", "")
            text = "".join(block.get("text", "") for block in params.get("prompt", [])
                           if isinstance(block, dict) and block.get("type") == "text")
            out = b""
            if "echo-prompt" in self.flags:
                half = len(text) // 2
                out += chunk(session_id, "user_message_chunk", text[:half])
                out += chunk(session_id, "user_message_chunk", text[half:])
            if "other-user" in self.flags:
                out += chunk(session_id, "user_message_chunk", OTHER_USER_TEXT)
            answer = reply_text(text)
            out += chunk(session_id, "agent_message_chunk", answer[:8])
            out += chunk(session_id, "agent_message_chunk", answer[8:])
            self.write(out)
            self.write(result(request_id, {"stopReason": "end_turn"}))
        elif method == "session/cancel":
            pass
        elif request_id is not None:
            self.write(line({"jsonrpc": "2.0", "id": request_id,
                             "error": {"code": -32601, "message": f"no method {method}"}}))


def main() -> None:
    flags = {f for f in os.environ.get("INTEROP_AGENT_FLAGS", "").split(",") if f}
    agent = Agent(flags)
    for raw in sys.stdin.buffer:
        try:
            message = json.loads(raw)
        except ValueError:
            continue
        if isinstance(message, dict):
            agent.handle(message)
    if "ignore-eof" in flags:
        threading.Event().wait()  # until killed


if __name__ == "__main__":
    main()
