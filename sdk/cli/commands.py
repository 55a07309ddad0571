"""The commands: one coroutine each, taking the client, the parsed arguments and the output,
returning the exit status. Errors that end a command are raised (sdk.cli.main maps them)."""

from __future__ import annotations

import argparse
import codecs
import math
import os
import shlex
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final, TypeVar

import anyio
import msgspec
from msgspec import UNSET

from sdk._client import (
    DaemonClient,
    LoadResult,
    PromptAccepted,
    PromptByKeyResponse,
    SessionStatus,
)
from sdk._errors import DaemonError, PromptOutcomeUnknownError, TurnError
from sdk._session import SessionHandle, Transport
from sdk._submission import check_idempotency_key
from sdk._truncation import parse_truncation, status_text
from sdk.cli.gates import gate_dir, gate_name
from sdk.cli.output import Output, ago, chunk_text, table, wire_bytes
from sdk.cli.parser import (
    EXIT_DAEMON,
    EXIT_OK,
    EXIT_OUTCOME_UNKNOWN,
    EXIT_PERMISSION,
    EXIT_TIMEOUT,
    EXIT_TURN_ERROR,
    UsageError,
)
from sdk.cli.permissions import CLEANUP_S, Permissions, stdin_is_tty
from sdk.protocol.constants import AGENT_CONTEXT_LOST, TERMINAL_TYPES
from sdk.protocol.envelope import DaemonEvent
from sdk.protocol.http import ErrorBody, SessionStatusResponse

_T = TypeVar("_T")


async def restoring(
    client: DaemonClient, session_id: str, call: Callable[[], Awaitable[_T]]
) -> _T:
    """Run ``call``; on a 404/410 restore the session once and run it again.

    The daemon brings a persisted session back on ``resume`` (as on ``load``, without sending
    a replay); a 404 from the restore itself means the session really does not exist.
    """
    from sdk._errors import SessionNotFoundError

    try:
        return await call()
    except SessionNotFoundError:
        pass
    await client.resume_session(session_id)
    return await call()


# --- create, list ---------------------------------------------------------------------------


async def cmd_create(client: DaemonClient, args: argparse.Namespace, out: Output) -> int:
    # A relative --cwd is the user's: resolved against the directory the command runs in.
    cwd = os.path.abspath(args.cwd) if args.cwd is not None else None
    created = await client.create_session(cwd, None, None if args.attach else "thread")
    if out.as_json:
        out.json(msgspec.to_builtins(created))
    else:
        out.line(created.session_id)
    return EXIT_OK


async def cmd_list(client: DaemonClient, args: argparse.Namespace, out: Output) -> int:
    # Newest created first, as the daemon pages them (unloaded sessions have no activity yet).
    cwd = os.path.realpath(args.cwd) if args.cwd is not None else None
    sessions = await client.list_sessions(workspace=cwd, state=args.state)
    if out.as_json:
        for s in sessions:
            out.json(msgspec.to_builtins(s))
        return EXIT_OK
    if not sessions:
        out.line("no sessions (turnkeeper create makes one)")
        return EXIT_OK
    rows = [["SESSION", "STATE", "LAST ACTIVITY", "WORKSPACE"]]
    for s in sessions:
        state = f"queued ({s.pending_prompts})" if s.state == "queued" else s.state
        if s.state == "running" and s.pending_prompts:
            state = f"running, {s.pending_prompts} queued"
        where = s.workspace_cwd + (f" ({s.git_branch})" if s.git_branch else "")
        rows.append([s.session_id, state, ago(s.last_activity_at) if s.last_activity_at else "-",
                     where])
    for line in table(rows):
        out.line(line)
    return EXIT_OK


# --- prompt -----------------------------------------------------------------------------------


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
        raise UsageError(f"--timeout must be a positive number of seconds, got {timeout}")
    try:
        # One key for the prompt, every send and every rerun that names it: admitted once.
        key = check_idempotency_key(args.key) if args.key is not None else str(uuid.uuid4())
    except ValueError as exc:
        raise UsageError(f"--key: {exc}") from exc
    state = _PromptState()
    state.deadline_ms = args.deadline_ms
    if state.deadline_ms is None and timeout is not None:
        # A backstop behind the client's own timer and cancel (bounded by CLEANUP_S): it ends
        # the prompt even if that cancel cannot be delivered, or the prompt was still queued.
        state.deadline_ms = math.ceil((timeout + CLEANUP_S) * 1000)
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
                interactive=args.approve is None and stdin_is_tty(),
            )

            async def on_update(event: DaemonEvent) -> None:
                nonlocal at_line_start, streamed
                state.see(event)
                if event.type == "permission_request":
                    end_line()
                permissions.on_event(event)
                if out.as_json:
                    out.event(event)
                    return
                text = chunk_text(event)
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
                    idempotency_key=key,
                )
            except Exception as exc:  # raised outside the nursery, not as an exception group
                error = exc
            nursery.cancel_scope.cancel()
    end_line()
    if timer.cancelled_caught:
        return await _timed_out(client, args, key, timeout, state, out)
    if permissions.error is not None:
        raise permissions.error
    if isinstance(error, PromptOutcomeUnknownError):
        return await _outcome_unknown(client, args, key, error, out)
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


def _resend_hint(args: argparse.Namespace, key: str) -> str:
    """The command that resends this prompt safely: the same text and session, this key."""
    words = ["turnkeeper", "prompt", args.session, *args.text, "--key", key]
    return shlex.join(words)


async def _find(client: DaemonClient, session_id: str, key: str) -> PromptByKeyResponse | str | None:
    """What the daemon says it admitted with ``key`` (within CLEANUP_S), or why it cannot say."""
    with anyio.move_on_after(CLEANUP_S):
        try:
            return await client.find_prompt(session_id, key)
        except DaemonError as exc:
            return str(exc).splitlines()[0]
    return "no answer in time"


def _found_text(found: PromptByKeyResponse) -> str:
    ended = f" (stopReason {found.stop_reason})" if isinstance(found.stop_reason, str) else ""
    return f"the daemon admitted it as prompt {found.prompt_id}, which is {found.state}{ended}"


async def _outcome_unknown(
    client: DaemonClient,
    args: argparse.Namespace,
    key: str,
    error: PromptOutcomeUnknownError,
    out: Output,
) -> int:
    """The sends failed and one may have been admitted: ask the daemon, say what it knows,
    and how to resend the prompt without running it twice."""
    found = await _find(client, args.session, key)
    cause = str(error.last_error).splitlines()[0]
    if isinstance(found, str):
        known = f"not known whether the daemon admitted it (asking failed: {found})"
    elif found is None:
        known = "the daemon has not admitted it so far (a send still on its way could be)"
    else:
        known = _found_text(found)
    if out.as_json:
        body = msgspec.to_builtins(ErrorBody(
            error="prompt outcome unknown", code="prompt_outcome_unknown",
            session_id=args.session, idempotency_key=key))
        out.json({**body, "attempts": error.attempts, "lastError": cause,
                  "admitted": None if isinstance(found, str) else found is not None,
                  "promptId": None if found is None or isinstance(found, str)
                  else found.prompt_id,
                  "state": None if found is None or isinstance(found, str) else found.state})
    out.error(f"the prompt's {error.attempts} sends failed (last: {cause}); {known}. "
              f"Resend it safely (it runs at most once) and follow it: {_resend_hint(args, key)}")
    return EXIT_OUTCOME_UNKNOWN


async def _timed_out(
    client: DaemonClient,
    args: argparse.Namespace,
    key: str,
    timeout: float | None,
    state: _PromptState,
    out: Output,
) -> int:
    session_id = args.session
    what = f"timed out after {timeout:g} s"
    prompt_id = state.prompt_id
    bound = (
        f"the daemon ends it within {state.deadline_ms} ms of its start"
        if state.deadline_ms is not None
        else "it runs to its end"
    )
    if prompt_id is None:
        # No 202 reached us, but a send may have been admitted: the daemon knows by the key.
        found = await _find(client, session_id, key)
        if isinstance(found, str) or found is None:
            known = (f"asking the daemon failed ({found})" if isinstance(found, str)
                     else "the daemon has not admitted it so far")
            out.error(f"{what} before the daemon accepted the prompt; {known} (if a send of "
                      f"it is admitted later, {bound}). Resend it safely (it runs at most "
                      f"once): {_resend_hint(args, key)}")
            return EXIT_TIMEOUT
        if found.state not in ("queued", "running"):
            out.error(f"{what} before the daemon's answer reached us; {_found_text(found)}")
            return EXIT_TIMEOUT
        prompt_id = found.prompt_id
        state.queued = found.state == "queued"
        state.started = found.state == "running"
    if state.queued and not state.started:
        # Cancel acts on the session's running prompt, which is another client's here.
        out.error(
            f"{what}; prompt {prompt_id} is still queued behind another prompt, which a cancel "
            f"would stop instead, so it was left queued ({bound})"
        )
        return EXIT_TIMEOUT
    with anyio.move_on_after(CLEANUP_S) as cleanup:
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


# --- watch ------------------------------------------------------------------------------------


def _idle(status: SessionStatus) -> bool:
    return not status.has_active_prompt and status.pending_prompts == 0


async def cmd_watch(client: DaemonClient, args: argparse.Namespace, out: Output) -> int:
    transport: Transport = "ws" if args.ws else "sse"
    with anyio.CancelScope() as done:

        async def on_event(event: DaemonEvent) -> None:
            out.event(event)
            if args.until_idle and event.type in TERMINAL_TYPES:
                if _idle(await client.session_status(args.session)):
                    done.cancel()

        if args.from_id is None and not args.live:
            # What a client joining now sees: the load snapshot, then live from its cursor. A
            # load also restores a session the daemon no longer holds in memory.
            handle, result = await SessionHandle.load(
                client, args.session, restore=True, transport=transport
            )
            for event in result.events:
                out.event(event)
            if not out.as_json:
                # Everything about the replay comes before the line that ends it.
                if result.agent_session_restored is False:
                    out.line(f"-- warning: {AGENT_CONTEXT_LOST} --")
                out.line(
                    f"-- {len(result.events)} replayed; live after #{result.last_event_id} "
                    f"(epoch {result.event_epoch}) --"
                )
            if args.until_idle and not result.has_active_prompt and _idle(
                    await client.session_status(args.session)):
                return EXIT_OK
        else:
            # Fail fast on a wrong URL, token or session id: the reader itself would retry
            # forever on an unreachable daemon, which is right mid-stream but unhelpful as a
            # first answer.
            status = await restoring(client, args.session,
                                     lambda: client.session_status(args.session))
            if args.until_idle and _idle(status) and args.live:
                return EXIT_OK
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


# --- load, status -----------------------------------------------------------------------------


def _bytes(events: Sequence[DaemonEvent]) -> int:
    return sum(len(wire_bytes(event)) for event in events)


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
        "replayDegraded": result.replay_degraded is True,
        "historyHasMore": result.history_has_more is True,
        "compactedReplay": {
            "entries": len(result.compacted_replay),
            "bytes": _bytes(result.compacted_replay),
        },
        "liveJournal": {
            "entries": len(result.live_journal),
            "bytes": _bytes(result.live_journal),
        },
        "markers": markers,
        "agentSessionRestored": None if result.agent_session_restored is UNSET
        else result.agent_session_restored,
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
    if result.replay_degraded is True:
        out.line("warning: the replay is degraded (compaction failed on the daemon)")
    if result.agent_session_restored is False:
        out.line(f"warning: {AGENT_CONTEXT_LOST}")
    for marker_info in markers:
        text = marker_info["text"] or "malformed history_truncated payload"
        out.line(f"{marker_info['in']}: {text}")
    if not markers:
        out.line("no history was truncated")
    return EXIT_OK


async def _status(client: DaemonClient, session_id: str) -> SessionStatusResponse:
    """The session's status as the protocol's own type (restoring the session if needed)."""
    return await restoring(client, session_id, lambda: client.session_status(session_id))


async def cmd_status(client: DaemonClient, args: argparse.Namespace, out: Output) -> int:
    status = await _status(client, args.session)
    if out.as_json:
        out.json(status)
        return EXIT_OK
    state = f"running prompt {status.active_prompt_id}" if status.has_active_prompt else "idle"
    if status.pending_prompts:
        state += f", {status.pending_prompts} queued"
    journal = status.journal
    lines = [
        f"session {status.session_id}",
        f"workspace: {status.workspace_cwd}",
        f"state: {state}",
        f"cursor: lastEventId={status.last_event_id} durableEventId={status.durable_event_id} "
        f"epoch={status.event_epoch}",
        f"subscribers: {status.subscribers}",
        f"live journal: {journal.entries} entries, {journal.bytes} bytes"
        + (f", {journal.truncated_events} events dropped" if journal.truncated_events else ""),
    ]
    if status.transcript_degraded:
        lines.append("warning: the transcript is degraded (writes to it failed on the daemon)")
    if status.agent_session_restored is False:
        lines.append(f"warning: {AGENT_CONTEXT_LOST}")
    for line in lines:
        out.line(line)
    return EXIT_OK


# --- cancel, close ----------------------------------------------------------------------------


async def cmd_cancel(client: DaemonClient, args: argparse.Namespace, out: Output) -> int:
    status = await _status(client, args.session)
    running = status.active_prompt_id if status.has_active_prompt else None
    if running is not None:
        await client.cancel(args.session)
    if out.as_json:
        out.json({"sessionId": args.session, "promptId": running,
                  "cancelRequested": running is not None})
    elif running is not None:
        out.line(f"asked the agent to cancel prompt {running}; its turn ends with stopReason "
                 "cancelled" + (f" ({status.pending_prompts} queued prompts stay queued)"
                                if status.pending_prompts else ""))
    else:
        out.line(f"no turn is running in session {args.session}: nothing to cancel")
    return EXIT_OK


async def cmd_close(client: DaemonClient, args: argparse.Namespace, out: Output) -> int:
    await restoring(client, args.session, lambda: client.close_session(args.session))
    if out.as_json:
        out.json({"sessionId": args.session, "closed": True})
    else:
        out.line(f"closed session {args.session}")
    return EXIT_OK


# --- export -----------------------------------------------------------------------------------


async def cmd_export(client: DaemonClient, args: argparse.Namespace, out: Output) -> int:
    """The session's whole transcript on stdout as the daemon streams it (a stored session is
    exported without being loaded)."""
    binary = getattr(out.out, "buffer", None)
    decoder = codecs.getincrementaldecoder("utf-8")()
    async with client.export_session(args.session, args.format) as chunks:
        async for chunk in chunks:
            if binary is not None:
                binary.write(chunk)
            else:
                out.out.write(decoder.decode(chunk))
    if binary is not None:
        binary.flush()
    else:
        out.out.write(decoder.decode(b"", final=True))
        out.out.flush()
    return EXIT_OK


# --- release ----------------------------------------------------------------------------------


def cmd_release(args: argparse.Namespace, out: Output) -> int:
    """Open a gate of the bundled mock agent: create the file it waits for (no daemon call)."""
    name = gate_name(args.gate)
    directory = gate_dir(args.gate_dir, os.environ)
    if not directory.is_dir():
        raise UsageError(
            f"no gate directory at {directory}: the daemon makes it when it runs the bundled "
            "mock agent (make serve); give the daemon's with --gate-dir or $MOCK_ACP_GATE_DIR")
    path = directory / name
    existed = path.exists()
    path.touch()
    if out.as_json:
        out.json({"gate": name, "path": str(path), "released": True, "wasOpen": existed})
    else:
        out.line(f"released gate {name}" + (" (it was already open)" if existed else "")
                 + f": {path}")
    return EXIT_OK


COMMANDS: Final[dict[str, Callable[[DaemonClient, argparse.Namespace, Output],
                                   Awaitable[int]]]] = {
    "create": cmd_create,
    "list": cmd_list,
    "prompt": cmd_prompt,
    "watch": cmd_watch,
    "load": cmd_load,
    "status": cmd_status,
    "cancel": cmd_cancel,
    "close": cmd_close,
    "export": cmd_export,
}
