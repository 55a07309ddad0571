"""``turnkeeper`` / ``python -m sdk``: a small command-line client for the daemon.

    turnkeeper [--url URL] [--token TOKEN] [--json] create [--cwd DIR] [--attach]
    turnkeeper ... prompt SESSION TEXT... [--deadline-ms N]
    turnkeeper ... watch SESSION [--from ID] [--epoch EPOCH] [--ws]
    turnkeeper ... load SESSION [--page-size N] [--mode full|summary]

``--json`` prints one JSON object per line instead of text. Exit codes: 0 success, 1 the turn
ended with ``turn_error``, 2 usage error, 3 daemon unreachable (or the connection failed),
4 unauthorized, 5 no such session, 6 any other daemon error, 130 interrupted.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any, Final, TextIO

import msgspec
import trio

from sdk.client import TOKEN_ENV, DaemonClient, LoadResult
from sdk.errors import (
    AuthError,
    DaemonError,
    InvalidTokenError,
    SessionNotFoundError,
    TransportError,
    TurnError,
)
from sdk.events import DaemonEvent, event_prompt_id
from sdk.session import SessionHandle
from sdk.truncation import parse_truncation, status_text

DEFAULT_URL: Final = "http://127.0.0.1:4170"

EXIT_OK: Final = 0
EXIT_TURN_ERROR: Final = 1
EXIT_USAGE: Final = 2
EXIT_UNREACHABLE: Final = 3
EXIT_AUTH: Final = 4
EXIT_NOT_FOUND: Final = 5
EXIT_DAEMON: Final = 6
EXIT_INTERRUPTED: Final = 130

_encode = msgspec.json.Encoder().encode


class _Usage(Exception):
    """A usage problem found after parsing (e.g. an unusable --url)."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="turnkeeper", description="Command-line client for the turnkeeper daemon."
    )
    parser.add_argument("--url", default=DEFAULT_URL, help=f"daemon URL (default {DEFAULT_URL})")
    parser.add_argument("--token", default=None, help=f"bearer token (default ${TOKEN_ENV})")
    parser.add_argument(
        "--json", action="store_true", help="machine output: one JSON object per line"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    create = sub.add_parser("create", help="create a session and print its id")
    create.add_argument("--cwd", default=None, help="absolute workspace directory")
    create.add_argument(
        "--attach", action="store_true", help="attach to the workspace's live session if any"
    )

    prompt = sub.add_parser("prompt", help="send a prompt and stream the answer")
    prompt.add_argument("session", help="session id")
    prompt.add_argument("text", nargs="+", help="prompt text (words are joined by spaces)")
    prompt.add_argument("--deadline-ms", type=int, default=None)

    watch = sub.add_parser("watch", help="follow a session's events, resuming across reconnects")
    watch.add_argument("session", help="session id")
    watch.add_argument(
        "--from",
        dest="from_id",
        type=int,
        default=None,
        help="resume after this event id (0 = the whole ring; default: live only)",
    )
    watch.add_argument("--epoch", default=None, help="the epoch the --from id belongs to")
    watch.add_argument("--ws", action="store_true", help="use the WebSocket stream")

    load = sub.add_parser("load", help="load a snapshot and summarize it")
    load.add_argument("session", help="session id")
    load.add_argument("--page-size", type=int, default=None, help="configured replay page size")
    load.add_argument("--mode", choices=("full", "summary"), default=None)
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


def _wire(event: DaemonEvent) -> Any:
    return msgspec.to_builtins(event)


def _update(event: DaemonEvent) -> dict[str, Any]:
    data = event.data if isinstance(event.data, dict) else {}
    update = data.get("update")
    return update if isinstance(update, dict) else {}


def _chunk_text(event: DaemonEvent) -> str | None:
    """The text of an agent message chunk (the answer), else None."""
    if event.type != "session_update":
        return None
    update = _update(event)
    if update.get("sessionUpdate") != "agent_message_chunk":
        return None
    content = update.get("content")
    if isinstance(content, dict) and isinstance(content.get("text"), str):
        text: str = content["text"]
        return text
    return None


def describe(event: DaemonEvent) -> str:
    """One readable line for an event."""
    ident = f"#{event.id}" if event.id is not None else "#-"
    parts = [ident, event.type]
    data = event.data if isinstance(event.data, dict) else {}
    detail = ""
    if event.type == "session_update":
        update = _update(event)
        kind = update.get("sessionUpdate")
        if isinstance(kind, str):
            parts.append(kind)
        content = update.get("content")
        if isinstance(content, dict) and isinstance(content.get("text"), str):
            detail = _encode(content["text"]).decode()
        elif isinstance(update.get("title"), str):
            detail = update["title"]
    elif event.type == "turn_complete":
        detail = f"stopReason={data.get('stopReason', 'end_turn')}"
    elif event.type == "turn_error":
        code = data.get("code")
        detail = (f"[{code}] " if code is not None else "") + str(data.get("message", ""))
    elif event.type == "history_truncated":
        marker = parse_truncation(event.data)
        detail = status_text(marker) if marker is not None else "malformed payload"
    else:
        reason = data.get("reason")
        if isinstance(reason, str):
            detail = f"reason={reason}"
    prompt_id = event_prompt_id(event)
    if prompt_id:
        parts.append(f"prompt={prompt_id[:8]}")
    line = " ".join(parts)
    return f"{line} {detail}" if detail else line


# --- commands -------------------------------------------------------------------------------


async def cmd_create(client: DaemonClient, args: argparse.Namespace, out: Output) -> int:
    if args.cwd is not None and not os.path.isabs(args.cwd):
        raise _Usage(f"--cwd must be an absolute path, got {args.cwd!r}")
    created = await client.create_session(args.cwd, None, None if args.attach else "thread")
    if out.as_json:
        out.json(msgspec.to_builtins(created))
    else:
        out.line(created.session_id)
    return EXIT_OK


async def cmd_prompt(client: DaemonClient, args: argparse.Namespace, out: Output) -> int:
    handle = SessionHandle(client, args.session)
    streamed = False

    async def on_update(event: DaemonEvent) -> None:
        nonlocal streamed
        if out.as_json:
            out.json(_wire(event))
            return
        text = _chunk_text(event)
        if text:
            out.text(text)
            streamed = True

    try:
        result = await handle.prompt(
            " ".join(args.text), deadline_ms=args.deadline_ms, on_update=on_update
        )
    except TurnError as exc:
        if not out.as_json:
            if streamed:
                out.line("")
            out.error(f"turn failed: {exc.message}" + (f" ({exc.code})" if exc.code else ""))
        return EXIT_TURN_ERROR
    if not out.as_json:
        if streamed:
            out.line("")
        out.line(f"[turn_complete stopReason={result.stop_reason} prompt={result.prompt_id}]")
    return EXIT_OK


async def cmd_watch(client: DaemonClient, args: argparse.Namespace, out: Output) -> int:
    # Fail fast on a wrong URL, token or session id: the reader itself would retry forever on
    # an unreachable daemon, which is right mid-stream but unhelpful as a first answer.
    await client.session_status(args.session)
    handle = SessionHandle(
        client,
        args.session,
        last_event_id=args.from_id,
        epoch=args.epoch,
        transport="ws" if args.ws else "sse",
    )

    async def on_event(event: DaemonEvent) -> None:
        if out.as_json:
            out.json(_wire(event))
        else:
            out.line(describe(event))

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
        return trio.run(run, args, out)
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
