"""The deterministic mock ACP agent, the daemon's embedded default.

Run as ``python -m daemon.mock_agent`` (the package's ``__main__``). It speaks ACP over
stdin/stdout, makes no network or model request, and is driven by environment variables and
by ``mock:<key>=<value>`` tokens in a prompt's text:

=========================  ==================================================================
``MOCK_ACP_MODE``          ``echo`` (default) | ``reject`` | ``crash-on-prompt`` | ``hang``
``MOCK_ACP_EMIT_CHUNKS``   agent_message_chunk updates per prompt, ``chunk-0`` ... (default 3)
``MOCK_ACP_PROMPT_DELAY_MS``  after the chunks, wait this long before answering (default 100)
``MOCK_ACP_PROMPT_LOG``    append ``{"sessionId", "text"}`` as one JSON line per prompt
``MOCK_ACP_END_LOG``       append ``{"sessionId", "text", "stopReason"}`` once a prompt's
                           answer is written (a test knows the agent has said all of it)
``MOCK_ACP_LOAD_SESSION``  ``1``: advertise ``loadSession`` and answer ``session/load``
``MOCK_ACP_GATE_DIR``      where ``mock:gate=`` / ``mock:start_gate=`` wait for their files
                           (``make serve`` sets it to ``<data dir>/gates``)
=========================  ==================================================================

Prompt tokens (override the variables for that prompt): ``mock:mode=<m>``,
``mock:chunks=<n>``, ``mock:delay_ms=<n>``, ``mock:bytes=<n>`` (pad each chunk's text to n bytes
with ``.``), ``mock:gate=<name>`` (after the chunks and the delay, wait until ``<dir>/<name>``
exists), ``mock:start_gate=<name>`` (before the first chunk, wait for ``<dir>/<name>``),
``mock:permission=ask``
(after the chunks, ask the client with ``session/request_permission`` — options
``allow-once`` / ``reject-once`` — wait for the answer, and report it as one more chunk
``permission:<optionId>`` or ``permission:cancelled``), ``mock:rich=1`` (before the chunks, a
sample of what agents send: a thought, a plan, a tool call that runs to completion and a
Markdown answer), ``mock:echo=1`` (after the chunks, one more chunk: the prompt's text without
its ``mock:`` words), ``mock:pace=LO-HI`` (instead of the chunks, an LLM-paced turn: LO to HI
chunks a second with jitter, thoughts and tool calls between, every update stamped with its
write time; ``mock:pace_ms=<n>`` long, default 10000, drawn from ``mock:seed=<n>``, starting at
``mock:start_ns=<n>`` of CLOCK_MONOTONIC if given; :mod:`daemon.mock_agent.paced`). A prompt
naming a gate when no gate
directory is set fails with an error that says so (JSON-RPC -32602), never runs ungated.

Every mode first streams its chunks, then: ``echo`` waits (the delay, then the gate) and answers
``{stopReason: "end_turn"}``; ``reject`` answers JSON-RPC error -32603 ``injected error``;
``crash-on-prompt`` exits with status 3; ``hang`` waits for ``session/cancel``. A
``session/cancel`` during the chunks, the delay, the gate or a hang answers
``{stopReason: "cancelled"}``. Each prompt runs in its own thread, so sessions and prompts are
concurrent. Stdlib only and no trio, so it starts fast; chunk lines are pre-built from a byte
template and written in large batches.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, BinaryIO, Final

if TYPE_CHECKING:
    from daemon.mock_agent.paced import PacedScheduler

MODES: Final = ("echo", "reject", "crash-on-prompt", "hang")
CRASH_EXIT_CODE: Final = 3
GATE_POLL_SECONDS: Final = 0.01
# One write (and flush) per this many bytes of chunk lines.
BATCH_BYTES: Final = 1 << 20
AGENT_NAME: Final = "turnkeeper-mock-agent"

_TOKEN = re.compile(r"mock:(mode|chunks|delay_ms|bytes|gate|start_gate|permission|rich|echo"
                    r"|pace_ms|pace|seed|start_ns)=(\S+)")


class PlanError(ValueError):
    """A bad variable or prompt token; loud, never silently defaulted."""


@dataclass(frozen=True)
class PromptPlan:
    """What one prompt does, after the environment and the prompt's tokens are combined."""

    mode: str = "echo"
    chunks: int = 3
    delay_ms: int = 100
    pad_bytes: int = 0
    gate: str | None = None
    start_gate: str | None = None
    ask_permission: bool = False
    rich: bool = False
    echo: bool = False
    pace: tuple[float, float] | None = None  # chunks a second, low and high
    pace_ms: int = 10_000
    seed: int = 0
    start_ns: int | None = None  # CLOCK_MONOTONIC ns the paced script starts at


def _non_negative(name: str, raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise PlanError(f"{name} must be a non-negative integer, got {raw!r}") from None
    if value < 0:
        raise PlanError(f"{name} must be a non-negative integer, got {raw!r}")
    return value


def _mode(name: str, raw: str) -> str:
    if raw not in MODES:
        raise PlanError(f"{name} must be one of {', '.join(MODES)}; got {raw!r}")
    return raw


def plan_from_env(env: dict[str, str] | os._Environ[str]) -> PromptPlan:
    return PromptPlan(
        mode=_mode("MOCK_ACP_MODE", env.get("MOCK_ACP_MODE", "echo")),
        chunks=_non_negative("MOCK_ACP_EMIT_CHUNKS", env.get("MOCK_ACP_EMIT_CHUNKS", "3")),
        delay_ms=_non_negative(
            "MOCK_ACP_PROMPT_DELAY_MS", env.get("MOCK_ACP_PROMPT_DELAY_MS", "100")
        ),
    )


def plan_for_prompt(base: PromptPlan, text: str) -> PromptPlan:
    """Apply the ``mock:key=value`` tokens of ``text`` (the last one of a key wins)."""
    fields: dict[str, Any] = {}
    for key, value in _TOKEN.findall(text):
        token = f"mock:{key}"
        if key == "mode":
            fields["mode"] = _mode(token, value)
        elif key == "chunks":
            fields["chunks"] = _non_negative(token, value)
        elif key == "delay_ms":
            fields["delay_ms"] = _non_negative(token, value)
        elif key == "bytes":
            fields["pad_bytes"] = _non_negative(token, value)
        elif key == "pace":
            # Imported here: every agent start would pay for the paced turns' modules.
            from daemon.mock_agent.paced import parse_pace

            try:
                fields["pace"] = parse_pace(value)
            except ValueError as exc:
                raise PlanError(str(exc)) from None
        elif key in ("pace_ms", "seed", "start_ns"):
            fields[key] = _non_negative(token, value)
        elif key in ("rich", "echo"):
            if value != "1":
                raise PlanError(f"{token} must be '1', got {value!r}")
            fields[key] = True
        elif key == "permission":
            if value != "ask":
                raise PlanError(f"{token} must be 'ask', got {value!r}")
            fields["ask_permission"] = True
        else:
            if "/" in value or value in (".", ".."):
                raise PlanError(f"{token} must be a plain file name, got {value!r}")
            fields[key] = value
    return PromptPlan(**{**base.__dict__, **fields})


def named_gate(text: str) -> str | None:
    """The first ``mock:gate=`` / ``mock:start_gate=`` token of ``text`` (as written), else None."""
    for key, value in _TOKEN.findall(text):
        if key in ("gate", "start_gate"):
            return f"mock:{key}={value}"
    return None


def gate_dir_missing(token: str) -> PlanError:
    return PlanError(
        f"{token} needs a gate directory: set MOCK_ACP_GATE_DIR in the agent's environment "
        "(make serve sets it to <data dir>/gates); then `turnkeeper release NAME` (or "
        "`touch $MOCK_ACP_GATE_DIR/NAME`) opens the gate")


def echo_text(text: str) -> str:
    """The prompt's text without its mock: words (mock:echo=1 answers with it)."""
    return re.sub(r"[ \t]*" + _TOKEN.pattern, "", text).strip()


RICH_ANSWER: Final = (
    "Here is what I found in **README.md**:\n\n"
    "## Layout\n\n"
    "- `daemon/`: the server (sessions, agents, journals, transcript)\n"
    "- `sdk/`: the client library and the `turnkeeper` command\n"
    "- `webui_model/`: the headless WebUI state\n\n"
    "Start it with:\n\n"
    "```sh\nmake serve\n```\n\n"
    "| command | what it does |\n|---|---|\n"
    "| `make serve` | run the daemon |\n| `make test` | lint, types and every test |\n\n"
    "More in the [Agent Client Protocol](https://agentclientprotocol.com) docs."
)


def rich_updates() -> list[dict[str, Any]]:
    plan = [{"content": "Read the README", "priority": "high", "status": "in_progress"},
            {"content": "Summarize the layout", "priority": "medium", "status": "pending"}]
    done = [{**entry, "status": "completed"} for entry in plan]
    read = {"toolCallId": "mock-read-1", "title": "Read README.md", "kind": "read"}
    words = RICH_ANSWER.split(" ")
    answer = [" ".join(words[i:i + 12]) + (" " if i + 12 < len(words) else "")
              for i in range(0, len(words), 12)]
    return [
        {"sessionUpdate": "agent_thought_chunk",
         "content": {"type": "text", "text": "The user wants an overview; the README has one."}},
        {"sessionUpdate": "plan", "entries": plan},
        {"sessionUpdate": "tool_call", **read, "status": "pending",
         "rawInput": {"path": "README.md"}, "locations": [{"path": "README.md"}]},
        {"sessionUpdate": "tool_call_update", "toolCallId": read["toolCallId"],
         "status": "in_progress"},
        {"sessionUpdate": "tool_call_update", "toolCallId": read["toolCallId"],
         "status": "completed", "content": [{"type": "content", "content": {
             "type": "text", "text": "# turnkeeper\n\nA Trio daemon that hosts ACP agents."}}]},
        {"sessionUpdate": "plan", "entries": done},
        *({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": part}}
          for part in answer),
    ]


def prompt_text(prompt: Any) -> str:
    """The text blocks of a session/prompt ``prompt`` list, joined by newlines."""
    if not isinstance(prompt, list):
        return ""
    return "\n".join(
        block["text"]
        for block in prompt
        if isinstance(block, dict)
        and block.get("type") == "text"
        and isinstance(block.get("text"), str)
    )


def chunk_lines(session_id: str, count: int, pad_bytes: int, start: int = 0) -> list[bytes]:
    """``count`` session/update lines for ``chunk-<start>`` ..., each text padded with dots."""
    head = (
        '{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":'
        + json.dumps(session_id)
        + ',"update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"'
    )
    tail = '"}}}}\n'
    if pad_bytes:
        texts = (f"chunk-{i}".ljust(pad_bytes, ".") for i in range(start, start + count))
    else:
        texts = (f"chunk-{i}" for i in range(start, start + count))
    return [(head + text + tail).encode() for text in texts]


@dataclass
class _Session:
    # (prompt text, plan) of each finished prompt, replayed on session/load.
    history: list[tuple[str, PromptPlan]] = field(default_factory=list)
    running: set[threading.Event] = field(default_factory=set)


class MockAgent:
    def __init__(self, env: dict[str, str] | os._Environ[str], out: BinaryIO) -> None:
        self.base_plan = plan_from_env(env)
        self.load_session_enabled = env.get("MOCK_ACP_LOAD_SESSION", "") == "1"
        self.prompt_log = env.get("MOCK_ACP_PROMPT_LOG") or None
        self.end_log = env.get("MOCK_ACP_END_LOG") or None
        self.gate_dir = env.get("MOCK_ACP_GATE_DIR") or None
        self._out = out
        self._write_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._sessions: dict[str, _Session] = {}
        # Our own requests to the client (permission asks): id -> (answered, answer).
        self._asks: dict[str, tuple[threading.Event, list[Any]]] = {}
        self._paced: PacedScheduler | None = None  # made by the first paced turn

    # -- output ---------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        with self._write_lock:
            try:
                self._out.write(data)
                self._out.flush()
            except (BrokenPipeError, ValueError):
                # The daemon is gone; nobody will read another byte.
                os._exit(0)

    def send(self, message: dict[str, Any]) -> None:
        self.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")

    def reply(self, request_id: Any, result: Any) -> None:
        self.send({"jsonrpc": "2.0", "id": request_id, "result": result})

    def reply_error(self, request_id: Any, code: int, message: str) -> None:
        self.send({"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}})

    def update(self, session_id: str, update: dict[str, Any]) -> None:
        self.send({"jsonrpc": "2.0", "method": "session/update",
                   "params": {"sessionId": session_id, "update": update}})

    def stream_rich(self, session_id: str) -> None:
        """A sample turn of what agents send: a thought, a plan, a tool call that runs, and a
        Markdown answer (mock:rich=1), so a viewer shows each kind of block."""
        for update in rich_updates():
            self.update(session_id, update)

    def stream_chunks(self, session_id: str, plan: PromptPlan, cancelled: threading.Event) -> bool:
        """Write the plan's chunks in large batches; False if cancelled part-way."""
        per_line = 120 + len(session_id) + max(plan.pad_bytes, 16)
        per_batch = max(1, BATCH_BYTES // per_line)
        for start in range(0, plan.chunks, per_batch):
            if cancelled.is_set():
                return False
            count = min(per_batch, plan.chunks - start)
            self.write(b"".join(chunk_lines(session_id, count, plan.pad_bytes, start)))
        return True

    def stream_paced(self, session_id: str, plan: PromptPlan,
                     cancelled: threading.Event) -> bool:
        """The plan's LLM-paced script (mock:pace=); False if cancelled part-way."""
        from daemon.mock_agent.paced import LATE_S, PacedRun, PacedScheduler, paced_steps

        assert plan.pace is not None
        with self._state_lock:
            if self._paced is None:
                self._paced = PacedScheduler(self.write)
            scheduler = self._paced
        steps = paced_steps(plan.seed, plan.pace[0], plan.pace[1], plan.pace_ms / 1000)
        # A prompt that arrives after its start time starts now: no backlog written at once.
        now = time.monotonic()
        start = now if plan.start_ns is None else max(now, plan.start_ns / 1e9)
        scheduler.run(PacedRun(session_id, steps, start, cancelled,
                                 cutoff=start + plan.pace_ms / 1000 + LATE_S))
        return not cancelled.is_set()

    # -- dispatch ---------------------------------------------------------------------------

    def handle_line(self, line: bytes) -> None:
        try:
            message = json.loads(line)
        except ValueError as exc:
            self.reply_error(None, -32700, f"Parse error: {exc}")
            return
        if not isinstance(message, dict):
            self.reply_error(None, -32600, "Invalid Request")
            return
        method = message.get("method")
        if not isinstance(method, str):
            self.take_answer(message)
            return
        params = message.get("params")
        if not isinstance(params, dict):
            params = {}
        if "id" not in message:
            if method == "session/cancel":
                self.cancel(params.get("sessionId"))
            return
        request_id = message["id"]
        try:
            self.handle_request(request_id, method, params)
        except PlanError as exc:
            self.reply_error(request_id, -32602, str(exc))

    def handle_request(self, request_id: Any, method: str, params: dict[str, Any]) -> None:
        if method == "initialize":
            self.reply(
                request_id,
                {
                    "protocolVersion": 1,
                    "agentCapabilities": {
                        "loadSession": self.load_session_enabled,
                        "promptCapabilities": {
                            "image": False,
                            "audio": False,
                            "embeddedContext": False,
                        },
                    },
                    "authMethods": [],
                    "agentInfo": {"name": AGENT_NAME, "version": "1"},
                },
            )
        elif method == "session/new":
            session_id = str(uuid.uuid4())
            with self._state_lock:
                self._sessions[session_id] = _Session()
            self.reply(request_id, {"sessionId": session_id})
        elif method == "session/load" and self.load_session_enabled:
            self.load_session(request_id, params)
        elif method == "session/prompt":
            self.start_prompt(request_id, params)
        else:
            self.reply_error(request_id, -32601, f"Method not found: {method}")

    def _session(self, session_id: str) -> _Session:
        # Unknown ids are adopted: after a daemon restart this process never saw them.
        with self._state_lock:
            return self._sessions.setdefault(session_id, _Session())

    def load_session(self, request_id: Any, params: dict[str, Any]) -> None:
        session_id = params.get("sessionId")
        if not isinstance(session_id, str) or not session_id:
            self.reply_error(request_id, -32602, "session/load needs a sessionId")
            return
        session = self._session(session_id)
        with self._state_lock:
            history = list(session.history)
        # Replay the conversation as real agents do, then answer.
        for text, plan in history:
            self.send(
                {
                    "jsonrpc": "2.0",
                    "method": "session/update",
                    "params": {
                        "sessionId": session_id,
                        "update": {
                            "sessionUpdate": "user_message_chunk",
                            "content": {"type": "text", "text": text},
                        },
                    },
                }
            )
            if plan.chunks:
                self.write(b"".join(chunk_lines(session_id, plan.chunks, plan.pad_bytes)))
        self.reply(request_id, {})

    def start_prompt(self, request_id: Any, params: dict[str, Any]) -> None:
        session_id = params.get("sessionId")
        if not isinstance(session_id, str) or not session_id:
            self.reply_error(request_id, -32602, "session/prompt needs a sessionId")
            return
        text = prompt_text(params.get("prompt"))
        plan = plan_for_prompt(self.base_plan, text)
        gate = named_gate(text) if self.gate_dir is None else None
        if gate is not None:
            raise gate_dir_missing(gate)
        if self.prompt_log:
            with (
                self._state_lock,
                open(self.prompt_log, "a", encoding="utf-8") as log_file,
            ):
                log_file.write(json.dumps({"sessionId": session_id, "text": text}) + "\n")
        session = self._session(session_id)
        cancelled = threading.Event()
        with self._state_lock:
            session.running.add(cancelled)
        threading.Thread(
            target=self.run_prompt,
            args=(request_id, session_id, session, text, plan, cancelled),
            daemon=True,
        ).start()

    def run_prompt(
        self,
        request_id: Any,
        session_id: str,
        session: _Session,
        text: str,
        plan: PromptPlan,
        cancelled: threading.Event,
    ) -> None:
        try:
            finished = plan.start_gate is None or self.wait_gate(plan.start_gate, cancelled)
            if finished and plan.rich:
                self.stream_rich(session_id)
            if plan.pace is not None:
                finished = finished and self.stream_paced(session_id, plan, cancelled)
            else:
                finished = finished and self.stream_chunks(session_id, plan, cancelled)
            if finished and plan.echo:
                self.update(session_id, {"sessionUpdate": "agent_message_chunk",
                                         "content": {"type": "text", "text": echo_text(text)}})
            if finished and plan.ask_permission:
                self.ask_permission(session_id, cancelled)
            if plan.mode == "crash-on-prompt":
                os._exit(CRASH_EXIT_CODE)
            if plan.mode == "reject":
                self.reply_error(request_id, -32603, "injected error")
                return
            if finished:
                if plan.mode == "hang":
                    cancelled.wait()
                elif not cancelled.wait(plan.delay_ms / 1000) and plan.gate is not None:
                    self.wait_gate(plan.gate, cancelled)
            stop_reason = "cancelled" if cancelled.is_set() else "end_turn"
            with self._state_lock:
                session.history.append((text, plan))
            self.reply(request_id, {"stopReason": stop_reason})
            if self.end_log:
                with self._state_lock, open(self.end_log, "a", encoding="utf-8") as log_file:
                    log_file.write(json.dumps({"sessionId": session_id, "text": text,
                                               "stopReason": stop_reason}) + "\n")
        finally:
            with self._state_lock:
                session.running.discard(cancelled)

    def wait_gate(self, name: str, cancelled: threading.Event) -> bool:
        """Wait until ``<gate dir>/<name>`` exists; False if cancelled first."""
        assert self.gate_dir is not None
        gate = os.path.join(self.gate_dir, name)
        while not os.path.exists(gate):
            if cancelled.wait(GATE_POLL_SECONDS):
                return False
        return True

    def take_answer(self, message: dict[str, Any]) -> None:
        """A reply to one of our requests (anything else without a method is noise)."""
        with self._state_lock:
            ask = self._asks.pop(str(message.get("id")), None)
        if ask is not None:
            ask[1].append(message.get("result"))
            ask[0].set()

    def ask_permission(self, session_id: str, cancelled: threading.Event) -> None:
        """``session/request_permission``, wait for the answer, report it as one chunk."""
        request_id = f"perm-{uuid.uuid4()}"
        answered: threading.Event = threading.Event()
        answer: list[Any] = []
        with self._state_lock:
            self._asks[request_id] = (answered, answer)
        self.send({"jsonrpc": "2.0", "id": request_id, "method": "session/request_permission",
                   "params": {"sessionId": session_id,
                              "toolCall": {"toolCallId": "mock-edit", "title": "Edit a file",
                                           "kind": "edit", "status": "pending"},
                              "options": [{"optionId": "allow-once", "name": "Allow",
                                           "kind": "allow_once"},
                                          {"optionId": "reject-once", "name": "Reject",
                                           "kind": "reject_once"}]}})
        while not answered.wait(GATE_POLL_SECONDS * 10):
            if cancelled.is_set():
                break
        result = answer[0] if answer else None
        outcome = result.get("outcome") if isinstance(result, dict) else None
        verdict = "cancelled"
        if isinstance(outcome, dict) and outcome.get("outcome") == "selected":
            verdict = str(outcome.get("optionId"))
        self.send({"jsonrpc": "2.0", "method": "session/update",
                   "params": {"sessionId": session_id,
                              "update": {"sessionUpdate": "agent_message_chunk",
                                         "content": {"type": "text",
                                                     "text": f"permission:{verdict}"}}}})

    def cancel(self, session_id: Any) -> None:
        if not isinstance(session_id, str):
            return
        with self._state_lock:
            session = self._sessions.get(session_id)
            running = list(session.running) if session is not None else []
        for event in running:
            event.set()


def main() -> None:
    try:
        agent = MockAgent(os.environ, sys.stdout.buffer)
    except PlanError as exc:
        print(f"mock agent: {exc}", file=sys.stderr, flush=True)
        sys.exit(2)
    stdin = sys.stdin.buffer
    while True:
        line = stdin.readline()
        if not line:
            break
        if line.strip():
            agent.handle_line(line)
    # Prompt threads may be parked in a delay, a gate or a hang; none of them matters now.
    os._exit(0)


if __name__ == "__main__":
    main()
