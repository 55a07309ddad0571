"""``turnkeeper`` / ``python -m sdk``: a small command-line client for the daemon.

    turnkeeper [--url URL] [--token TOKEN] [--json] create [--cwd DIR] [--attach]
    turnkeeper ... prompt SESSION TEXT... [--approve CHOICE] [--timeout S] [--deadline-ms N]
    turnkeeper ... watch SESSION [--from ID | --live] [--epoch EPOCH] [--ws]
    turnkeeper ... load SESSION [--page-size N] [--mode full|summary]

``--url`` defaults to ``$TURNKEEPER_URL``, else ``http://127.0.0.1:4170``; ``--token`` to
``$QWEN_SERVER_TOKEN``. ``--json`` prints one JSON object per line instead of text. A session
the daemon no longer holds in memory (it restarted) is restored on the first 404 and the
request is retried once. Exit codes: 0 success, 1 the turn ended with ``turn_error``, 2 usage
error, 3 daemon unreachable (or the connection failed), 4 unauthorized, 5 no such session,
6 any other daemon error, 7 the agent asked for permission and nobody could answer,
124 ``--timeout`` expired, 130 interrupted.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final, TextIO, TypeVar

import anyio
import msgspec
from anyio.abc import TaskGroup

from daemon._version import __version__
from sdk._lines import LineReader
from sdk.client import TOKEN_ENV, DaemonClient, LoadResult, PromptAccepted
from sdk.errors import (
    AuthError,
    DaemonError,
    InvalidTokenError,
    SessionNotFoundError,
    TransportError,
    TurnError,
)
from sdk.events import DaemonEvent, event_prompt_id
from sdk.protocol.constants import AGENT_CONTEXT_LOST, PERMISSION_TIMEOUT
from sdk.protocol.events import (
    AgentMessageChunk,
    AgentThoughtChunk,
    DaemonHistoryTruncatedData,
    PermissionOption,
    PermissionRequestData,
    PermissionResolvedData,
    SessionUpdateData,
    ToolCall,
    ToolCallUpdate,
    UserMessageChunk,
)
from sdk.protocol.terminals import terminal_fields
from sdk.session import SessionHandle, Transport
from sdk.truncation import parse_truncation, status_text

DEFAULT_URL: Final = "http://127.0.0.1:4170"
URL_ENV: Final = "TURNKEEPER_URL"

EXIT_OK: Final = 0
EXIT_TURN_ERROR: Final = 1
EXIT_USAGE: Final = 2
EXIT_UNREACHABLE: Final = 3
EXIT_AUTH: Final = 4
EXIT_NOT_FOUND: Final = 5
EXIT_DAEMON: Final = 6
EXIT_PERMISSION: Final = 7
EXIT_TIMEOUT: Final = 124
EXIT_INTERRUPTED: Final = 130

APPROVE_KINDS: Final = {
    "allow-once": "allow_once",
    "allow-always": "allow_always",
    "reject-once": "reject_once",
    "reject-always": "reject_always",
}
"""``--approve`` choices that pick an option by its ACP ``kind`` (``cancel`` picks none)."""
APPROVE_CHOICES: Final = (*APPROVE_KINDS, "cancel")

# Bounds the courtesy calls made while giving up (cancel on timeout, cancel on a refused
# permission): the command must end even when the daemon does not answer.
_CLEANUP_S: Final = 5.0

_encode = msgspec.json.Encoder().encode
_T = TypeVar("_T")


class _Usage(Exception):
    """A usage problem found after parsing (e.g. an unusable --url)."""


def version() -> str:
    """The package's version: the one ``__version__`` the daemon and the packaging also read."""
    return __version__


_EPILOG: Final = f"""\
environment:
  {URL_ENV}         default for --url
  {TOKEN_ENV}      default for --token (the daemon reads the same variable)

A session the daemon no longer holds in memory (after a restart) is restored automatically:
on the first "no session" answer the command asks the daemon to restore it, then retries once.

exit codes:
  0 ok, 1 the turn ended with turn_error, 2 usage error, 3 daemon unreachable,
  4 unauthorized, 5 no such session, 6 other daemon error, 7 a permission request nobody
  could answer, 124 prompt --timeout expired, 130 interrupted
"""


def build_parser() -> argparse.ArgumentParser:
    url_default = os.environ.get(URL_ENV) or DEFAULT_URL
    parser = argparse.ArgumentParser(
        prog="turnkeeper",
        description="Command-line client for the turnkeeper daemon.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--url",
        default=url_default,
        help=f"daemon URL (default: ${URL_ENV} if set, else {DEFAULT_URL}; now {url_default})",
    )
    parser.add_argument(
        "--token",
        default=None,
        help=f"bearer token (default: ${TOKEN_ENV}; none when unset)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="machine output: one JSON object per line (default: readable text)",
    )
    parser.add_argument(
        "--version", action="version", version=f"turnkeeper {version()}",
        help="print the version and exit",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    create = sub.add_parser(
        "create", help="create a session and print its id",
        description="Create a session and print its id.",
    )
    create.add_argument(
        "--cwd", default=None,
        help="absolute workspace directory (default: the daemon's --workspace)",
    )
    create.add_argument(
        "--attach", action="store_true",
        help="attach to the workspace's live session if there is one "
        "(default: always a new session)",
    )

    prompt = sub.add_parser(
        "prompt",
        help="send a prompt and stream the answer",
        description="Send a prompt, stream the answer's text to stdout, and end with the "
        "terminal. A permission request from the agent is shown on stderr; with a terminal on "
        "stdin you answer it there, otherwise --approve answers it (without either, the prompt "
        "is cancelled and the command exits 7 rather than hang or grant anything).",
    )
    prompt.add_argument("session", help="session id")
    prompt.add_argument("text", nargs="+", help="prompt text (words are joined by spaces)")
    prompt.add_argument(
        "--approve",
        choices=APPROVE_CHOICES,
        default=None,
        help="answer every permission request without asking: pick the agent's first option "
        "of that kind (a request offering none is cancelled: never a wider grant), or cancel "
        "(default: ask on the terminal; exit 7 when stdin is not one)",
    )
    prompt.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="give up after this long: cancel the prompt on the daemon and exit 124; unless "
        "--deadline-ms is given, SECONDS + 5 is also sent as the daemon-side deadline, a "
        "backstop should the cancel not arrive (default: no limit)",
    )
    prompt.add_argument(
        "--deadline-ms",
        type=int,
        default=None,
        metavar="MS",
        help="daemon-side deadline from the turn's start; the turn then ends with turn_error "
        "prompt_deadline_exceeded (default: none, or --timeout + 5 s)",
    )

    watch = sub.add_parser(
        "watch",
        help="show a session's replay, then follow its events",
        description="Print the session's replay (a load: what a client joining now sees), then "
        "follow its live events from the snapshot's cursor, one line each, resuming across "
        "reconnects and daemon restarts. Ends when the session is gone (exit 5).",
    )
    watch.add_argument("session", help="session id")
    start = watch.add_mutually_exclusive_group()
    start.add_argument(
        "--from",
        dest="from_id",
        type=int,
        default=None,
        metavar="ID",
        help="skip the replay and stream the event ring after this id (0 = the whole ring) "
        "(default: the replay, then live)",
    )
    start.add_argument(
        "--live", action="store_true",
        help="skip the replay: only events from now on (default: the replay, then live)",
    )
    watch.add_argument(
        "--epoch", default=None,
        help="the epoch the --from id belongs to (default: none; the daemon's current)",
    )
    watch.add_argument(
        "--ws", action="store_true",
        help="use the WebSocket stream (default: Server-Sent Events)",
    )

    load = sub.add_parser(
        "load", help="load a snapshot and summarize it",
        description="Load a snapshot and print its sizes and truncation markers.",
    )
    load.add_argument("session", help="session id")
    load.add_argument(
        "--page-size", type=int, default=None, metavar="N",
        help="configured replay: the newest N transcript records, 1..500 (default: memory "
        "replay)",
    )
    load.add_argument(
        "--mode", choices=("full", "summary"), default=None,
        help="liveReplayMode of the live journal (default: the daemon's, full)",
    )
    return parser


# --- output ---------------------------------------------------------------------------------


class Output:
    def __init__(self, as_json: bool, out: TextIO, err: TextIO) -> None:
        self.as_json = as_json
        self.out = out
        self.err = err

    def json(self, obj: Any) -> None:
        self.out.write(_encode(obj).decode() + "\n")
        self.out.flush()

    def line(self, text: str) -> None:
        self.out.write(text + "\n")
        self.out.flush()

    def text(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()

    def error(self, text: str) -> None:
        self.err.write(f"turnkeeper: {text}\n")
        self.err.flush()

    def error_raw(self, text: str) -> None:
        """Write to stderr as is (a question and its prompt)."""
        self.err.write(text)
        self.err.flush()


def _wire(event: DaemonEvent) -> Any:
    return msgspec.to_builtins(event)


def _chunk_text(event: DaemonEvent) -> str | None:
    """The text of an agent message chunk (the answer), else None."""
    payload = event.payload
    if not isinstance(payload, SessionUpdateData):
        return None
    update = payload.acp
    if not isinstance(update, AgentMessageChunk) or update.content is None:
        return None
    text = update.content.text
    return text if isinstance(text, str) else None


def describe(event: DaemonEvent) -> str:
    """One readable line for an event."""
    ident = f"#{event.id}" if event.id is not None else "#-"
    parts = [ident, event.type]
    payload = event.payload
    detail = ""
    if isinstance(payload, SessionUpdateData):
        if payload.kind is not None:
            parts.append(payload.kind)
        update = payload.acp
        if isinstance(update, UserMessageChunk | AgentMessageChunk | AgentThoughtChunk):
            if update.content is not None and isinstance(update.content.text, str):
                detail = _encode(update.content.text).decode()
        elif isinstance(update, ToolCall | ToolCallUpdate) and update.title is not None:
            detail = update.title
    elif event.type == "turn_complete":
        stop = terminal_fields(event).stop_reason
        detail = f"stopReason={stop if stop is not None else 'end_turn'}"
    elif event.type == "turn_error":
        fields = terminal_fields(event)
        code = fields.code
        detail = (f"[{code}] " if code is not None else "") + (fields.message or "")
    elif event.type == "history_truncated":
        marker = payload if isinstance(payload, DaemonHistoryTruncatedData) else None
        detail = status_text(marker) if marker is not None else "malformed payload"
    else:
        reason = getattr(payload, "reason", None)
        if isinstance(reason, str):
            detail = f"reason={reason}"
    prompt_id = event_prompt_id(event)
    if prompt_id:
        parts.append(f"prompt={prompt_id[:8]}")
    line = " ".join(parts)
    return f"{line} {detail}" if detail else line


# --- commands -------------------------------------------------------------------------------


async def _restoring(
    client: DaemonClient, session_id: str, call: Callable[[], Awaitable[_T]]
) -> _T:
    """Run ``call``; on a 404/410 restore the session once and run it again.

    The daemon brings a persisted session back on ``resume`` (as on ``load``, without sending
    a replay); a 404 from the restore itself means the session really does not exist.
    """
    try:
        return await call()
    except SessionNotFoundError:
        pass
    await client.resume_session(session_id)
    return await call()


async def cmd_create(client: DaemonClient, args: argparse.Namespace, out: Output) -> int:
    if args.cwd is not None and not os.path.isabs(args.cwd):
        raise _Usage(f"--cwd must be an absolute path, got {args.cwd!r}")
    created = await client.create_session(args.cwd, None, None if args.attach else "thread")
    if out.as_json:
        out.json(msgspec.to_builtins(created))
    else:
        out.line(created.session_id)
    return EXIT_OK


def _stdin_is_tty() -> bool:
    try:
        return sys.stdin is not None and sys.stdin.isatty()
    except (AttributeError, ValueError):
        return False


def pick_option(options: Sequence[PermissionOption], approve: str) -> PermissionOption | None:
    """The option ``--approve approve`` answers with: the first of that kind, else None."""
    kind = APPROVE_KINDS.get(approve)
    if kind is None:
        return None
    return next((option for option in options if option.kind == kind), None)


def describe_permission(request: PermissionRequestData) -> str:
    """One line naming what the agent wants to do."""
    tool = request.tool
    what = tool.title if tool.title else "(untitled tool call)"
    details = []
    if tool.tool_call_id is not None:
        details.append(f"tool call {tool.tool_call_id}")
    if tool.kind is not None:
        details.append(f"kind {tool.kind}")
    return what + (f" ({', '.join(details)})" if details else "")


class _Answer:
    """One decision on a permission request: an option, or cancel (``option is None``)."""

    __slots__ = ("option", "why")

    def __init__(self, option: PermissionOption | None, why: str) -> None:
        self.option = option
        self.why = why


def describe_resolution(resolved: PermissionResolvedData) -> str:
    """One line for a permission request answered while we were asking about it."""
    outcome = _encode(resolved.outcome).decode()
    request = f"permission request {resolved.request_id[:8]}"
    if resolved.reason == PERMISSION_TIMEOUT:
        return (f"{request} timed out: nobody answered within the daemon's permission "
                f"timeout, so the agent was answered {outcome}")
    if isinstance(resolved.reason, str):
        return f"{request} was answered by the daemon ({resolved.reason}): {outcome}"
    return f"{request} was answered elsewhere: {outcome}"


class Permissions:
    """Answers the permission requests of one prompt.

    Each request is shown on stderr. ``approve`` answers it at once; otherwise, with a terminal
    on stdin, the user picks an option there; with neither the request is cancelled, the
    prompt is cancelled and ``refused`` says why (the command exits 7). A request answered by
    another client first (``permission_resolved``) stops the question.
    """

    def __init__(
        self,
        client: DaemonClient,
        session_id: str,
        out: Output,
        nursery: TaskGroup,
        *,
        approve: str | None,
        interactive: bool,
        stdin: TextIO | None = None,
    ) -> None:
        self.client = client
        self.session_id = session_id
        self.out = out
        self.approve = approve
        self.interactive = interactive
        self.refused: str | None = None
        self.error: DaemonError | None = None
        self.answered = 0
        self._nursery = nursery
        self._stdin = stdin if stdin is not None else sys.stdin
        self._asking: dict[str, anyio.CancelScope] = {}
        self._lines: LineReader | None = None

    def on_event(self, event: DaemonEvent) -> None:
        payload = event.payload
        if isinstance(payload, PermissionRequestData) and payload.request_id:
            scope = anyio.CancelScope()
            self._asking[payload.request_id] = scope
            self._nursery.start_soon(self._answer, payload.request_id, payload, scope)
        elif isinstance(payload, PermissionResolvedData):
            asking = self._asking.pop(payload.request_id, None)
            if asking is not None:
                asking.cancel()
                self.out.error(describe_resolution(payload))

    async def _answer(
        self, request_id: str, request: PermissionRequestData, scope: anyio.CancelScope
    ) -> None:
        options = request.answers
        self.out.error(f"permission requested: {describe_permission(request)}")
        answer: _Answer | None = None
        with scope:
            if self.approve is not None:
                option = pick_option(options, self.approve)
                if option is None and self.approve != "cancel":
                    why = f"--approve {self.approve}: no option of that kind, cancelled"
                else:
                    why = f"--approve {self.approve}"
                answer = _Answer(option, why)
            elif self.interactive:
                answer = await self._ask(options)
        if answer is None and scope.cancelled_caught:
            return  # answered by another client meanwhile
        # Past this point a permission_resolved is our own vote's echo: nothing to cancel.
        if request_id in self._asking:
            del self._asking[request_id]
        try:
            if answer is None:
                await self._refuse(request_id)
                return
            await self._vote(request_id, answer)
        except DaemonError as exc:
            self.error = exc
            self._nursery.cancel_scope.cancel()

    async def _vote(self, request_id: str, answer: _Answer) -> None:
        option = answer.option
        try:
            if option is None:
                await self.client.vote_permission(self.session_id, request_id, cancelled=True)
                chosen = "cancelled"
            else:
                await self.client.vote_permission(
                    self.session_id, request_id, option_id=option.option_id
                )
                chosen = option.label
        except SessionNotFoundError as exc:
            if exc.code != "permission_not_found":
                raise
            self.out.error(f"permission request {request_id[:8]} was already answered")
            return
        self.answered += 1
        self.out.error(f"answered: {chosen} ({answer.why})")

    async def _refuse(self, request_id: str) -> None:
        self.refused = (
            "the agent asked for permission and stdin is not a terminal: nobody can answer, so "
            "the request and the prompt were cancelled (use --approve to answer without asking)"
        )
        with anyio.move_on_after(_CLEANUP_S):
            try:
                await self.client.vote_permission(self.session_id, request_id, cancelled=True)
            except SessionNotFoundError:
                pass  # answered meanwhile: the prompt is cancelled all the same
            await self.client.cancel(self.session_id)

    async def _ask(self, options: list[PermissionOption]) -> _Answer:
        valid = options
        for number, option in enumerate(valid, 1):
            self.out.error_raw(f"  {number}) {option.label}\n")
        self.out.error_raw("  c) cancel the request\n")
        choices = f"1-{len(valid)}, c" if valid else "c"
        while True:
            self.out.error_raw(f"answer ({choices}): ")
            line = await self._next_line()
            if line is None:
                self.out.error_raw("\n")
                return _Answer(None, "end of input")
            text = line.strip().lower()
            if text in ("c", "cancel"):
                return _Answer(None, "your answer")
            if text.isdigit() and 1 <= int(text) <= len(valid):
                return _Answer(valid[int(text) - 1], "your answer")
            self.out.error_raw(f"please answer {choices}\n")

    async def _next_line(self) -> str | None:
        # One reader for the whole prompt: what a question cancelled mid-read had read stays
        # buffered for the next question, and no thread is left behind blocked on the terminal.
        if self._lines is None:
            self._lines = LineReader(self._stdin.fileno())
        return await self._lines.readline()


class _PromptState:
    """What the command knows about its prompt: its id, and whether it is queued or running."""

    def __init__(self) -> None:
        self.prompt_id: str | None = None
        self.queued = False
        self.started = False
        self.deadline_ms: int | None = None

    def accepted(self, accepted: PromptAccepted) -> None:
        self.prompt_id = accepted.prompt_id

    def see(self, event: DaemonEvent) -> None:
        if event.type == "pending_prompt_added":
            self.queued = True
        else:
            self.started = True


async def cmd_prompt(client: DaemonClient, args: argparse.Namespace, out: Output) -> int:
    timeout: float | None = args.timeout
    if timeout is not None and not (timeout > 0 and math.isfinite(timeout)):
        raise _Usage(f"--timeout must be a positive number of seconds, got {timeout}")
    state = _PromptState()
    state.deadline_ms = args.deadline_ms
    if state.deadline_ms is None and timeout is not None:
        # A backstop behind the client's own timer and cancel (bounded by _CLEANUP_S): it ends
        # the prompt even if that cancel cannot be delivered, or the prompt was still queued.
        state.deadline_ms = math.ceil((timeout + _CLEANUP_S) * 1000)
    handle = SessionHandle(client, args.session, restore=True)
    at_line_start = True
    streamed = False

    def end_line() -> None:
        nonlocal at_line_start
        if not at_line_start and not out.as_json:
            out.line("")
            at_line_start = True

    result = None
    error: Exception | None = None
    with anyio.move_on_after(math.inf if timeout is None else timeout) as timer:
        async with anyio.create_task_group() as nursery:
            permissions = Permissions(
                client,
                args.session,
                out,
                nursery,
                approve=args.approve,
                interactive=args.approve is None and _stdin_is_tty(),
            )

            async def on_update(event: DaemonEvent) -> None:
                nonlocal at_line_start, streamed
                state.see(event)
                if event.type == "permission_request":
                    end_line()
                permissions.on_event(event)
                if out.as_json:
                    out.json(_wire(event))
                    return
                text = _chunk_text(event)
                if text:
                    out.text(text)
                    streamed = True
                    at_line_start = text.endswith("\n")

            try:
                result = await handle.prompt(
                    " ".join(args.text),
                    deadline_ms=state.deadline_ms,
                    on_update=on_update,
                    on_accepted=state.accepted,
                )
            except Exception as exc:  # raised outside the nursery, not as an exception group
                error = exc
            nursery.cancel_scope.cancel()
    end_line()
    if timer.cancelled_caught:
        return await _timed_out(client, args.session, timeout, state, out)
    if permissions.error is not None:
        raise permissions.error
    if isinstance(error, TurnError):
        if not out.as_json:
            out.error(
                f"turn failed: {error.message}" + (f" ({error.code})" if error.code else "")
            )
        return EXIT_PERMISSION if permissions.refused else EXIT_TURN_ERROR
    if error is not None:
        raise error
    if result is None:  # only the permission error path cancels the nursery
        return EXIT_DAEMON
    if not out.as_json:
        out.line(f"[turn_complete stopReason={result.stop_reason} prompt={result.prompt_id}]")
    if permissions.refused is not None:
        out.error(permissions.refused)
        return EXIT_PERMISSION
    return EXIT_OK


async def _timed_out(
    client: DaemonClient,
    session_id: str,
    timeout: float | None,
    state: _PromptState,
    out: Output,
) -> int:
    what = f"timed out after {timeout:g} s"
    prompt_id = state.prompt_id
    bound = (
        f"the daemon ends it within {state.deadline_ms} ms of its start"
        if state.deadline_ms is not None
        else "it runs to its end"
    )
    if prompt_id is None:
        out.error(f"{what} before the daemon accepted the prompt (if it was admitted, {bound})")
        return EXIT_TIMEOUT
    if state.queued and not state.started:
        # Cancel acts on the session's running prompt, which is another client's here.
        out.error(
            f"{what}; prompt {prompt_id} is still queued behind another prompt, which a cancel "
            f"would stop instead, so it was left queued ({bound})"
        )
        return EXIT_TIMEOUT
    with anyio.move_on_after(_CLEANUP_S) as cleanup:
        try:
            await client.cancel(session_id)
        except DaemonError as exc:
            out.error(f"{what}; cancelling prompt {prompt_id} failed ({bound}): {exc}")
            return EXIT_TIMEOUT
    if cleanup.cancelled_caught:
        out.error(f"{what}; the daemon did not answer the cancel of prompt {prompt_id} ({bound})")
        return EXIT_TIMEOUT
    out.error(f"{what}; prompt {prompt_id} was cancelled on the daemon")
    return EXIT_TIMEOUT


async def cmd_watch(client: DaemonClient, args: argparse.Namespace, out: Output) -> int:
    transport: Transport = "ws" if args.ws else "sse"

    async def on_event(event: DaemonEvent) -> None:
        if out.as_json:
            out.json(_wire(event))
        else:
            out.line(describe(event))

    if args.from_id is None and not args.live:
        # What a client joining now sees: the load snapshot, then live from its cursor. A
        # load also restores a session the daemon no longer holds in memory.
        handle, result = await SessionHandle.load(
            client, args.session, restore=True, transport=transport
        )
        for event in result.events:
            await on_event(event)
        if not out.as_json:
            if result.agent_session_restored is False:
                out.line(f"-- warning: {AGENT_CONTEXT_LOST} --")
            out.line(
                f"-- {len(result.events)} replayed; live after #{result.last_event_id} "
                f"(epoch {result.event_epoch}) --"
            )
    else:
        # Fail fast on a wrong URL, token or session id: the reader itself would retry forever
        # on an unreachable daemon, which is right mid-stream but unhelpful as a first answer.
        await _restoring(client, args.session, lambda: client.session_status(args.session))
        handle = SessionHandle(
            client,
            args.session,
            last_event_id=None if args.live else args.from_id,
            epoch=None if args.live else args.epoch,
            transport=transport,
            restore=True,
        )
    await handle.follow(on_event)  # returns only by raising the final error
    return EXIT_OK


def _bytes(events: Sequence[DaemonEvent]) -> int:
    return sum(len(_encode(event)) for event in events)


async def cmd_load(client: DaemonClient, args: argparse.Namespace, out: Output) -> int:
    result: LoadResult = await client.load_session(
        args.session, history_page_size=args.page_size, live_replay_mode=args.mode
    )
    markers: list[dict[str, Any]] = []
    for where, events in (
        ("compactedReplay", result.compacted_replay),
        ("liveJournal", result.live_journal),
    ):
        for event in events:
            if event.type != "history_truncated":
                continue
            marker = parse_truncation(event.data)
            markers.append(
                {
                    "in": where,
                    "scope": marker.scope if marker is not None else None,
                    "promptId": event.prompt_id,
                    "text": status_text(marker) if marker is not None else None,
                    "data": event.data,
                }
            )
    summary = {
        "sessionId": result.session_id,
        "hasActivePrompt": result.has_active_prompt,
        "lastEventId": result.last_event_id,
        "eventEpoch": result.event_epoch,
        "replayDegraded": result.replay_degraded,
        "historyHasMore": result.history_has_more,
        "compactedReplay": {
            "entries": len(result.compacted_replay),
            "bytes": _bytes(result.compacted_replay),
        },
        "liveJournal": {
            "entries": len(result.live_journal),
            "bytes": _bytes(result.live_journal),
        },
        "markers": markers,
        "agentSessionRestored": result.agent_session_restored,
    }
    if out.as_json:
        out.json(summary)
        return EXIT_OK
    active = "a prompt is running" if result.has_active_prompt else "idle"
    out.line(f"session {result.session_id} ({active})")
    out.line(f"cursor: lastEventId={result.last_event_id} epoch={result.event_epoch}")
    for name in ("compactedReplay", "liveJournal"):
        part = summary[name]
        assert isinstance(part, dict)
        out.line(f"{name}: {part['entries']} entries, {part['bytes']} bytes")
    if result.replay_degraded:
        out.line("warning: the replay is degraded (compaction failed on the daemon)")
    if result.agent_session_restored is False:
        out.line(f"warning: {AGENT_CONTEXT_LOST}")
    for marker_info in markers:
        text = marker_info["text"] or "malformed history_truncated payload"
        out.line(f"{marker_info['in']}: {text}")
    if not markers:
        out.line("no history was truncated")
    return EXIT_OK


_COMMANDS: Final = {
    "create": cmd_create,
    "prompt": cmd_prompt,
    "watch": cmd_watch,
    "load": cmd_load,
}


async def run(args: argparse.Namespace, out: Output) -> int:
    try:
        client = DaemonClient(args.url, token=args.token)
    except InvalidTokenError as exc:
        raise _Usage(str(exc)) from exc
    except ValueError as exc:
        raise _Usage(f"invalid --url: {exc}") from exc
    async with client:
        return await _COMMANDS[args.command](client, args, out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    out = Output(args.json, sys.stdout, sys.stderr)
    try:
        # asyncio: the standard library's loop, so an SDK-only install runs the command line too.
        return anyio.run(run, args, out)
    except _Usage as exc:
        out.error(str(exc))
        return EXIT_USAGE
    except AuthError as exc:
        out.error(f"unauthorized at {args.url}: {exc} (check --token or ${TOKEN_ENV})")
        return EXIT_AUTH
    except SessionNotFoundError as exc:
        session = getattr(args, "session", None)
        out.error(f"no session {session!r} at {args.url}: {exc}")
        return EXIT_NOT_FOUND
    except TransportError as exc:
        if getattr(exc, "status", None) is None:
            out.error(f"cannot reach daemon at {args.url}: {_first_line(exc)}")
            return EXIT_UNREACHABLE
        out.error(f"daemon error at {args.url}: {_first_line(exc)}")
        return EXIT_DAEMON
    except DaemonError as exc:
        out.error(f"daemon error at {args.url}: {_first_line(exc)}")
        return EXIT_DAEMON
    except KeyboardInterrupt:
        out.error("interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (e.g. ``| head``): stop quietly, and keep the interpreter's
        # final flush from failing on the same pipe.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK


def _first_line(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0]


if __name__ == "__main__":
    sys.exit(main())
