"""Running a command: parse, build the client, run on asyncio (an SDK-only install has no
Trio), and turn what went wrong into one line on stderr and an exit status."""

from __future__ import annotations

import argparse
import errno
import os
import socket
import ssl
import sys
from collections.abc import Sequence

import anyio
import httpx

from sdk._client import TOKEN_ENV, DaemonClient
from sdk._errors import (
    AuthError,
    DaemonError,
    InvalidTokenError,
    SessionNotFoundError,
    TransportError,
)
from sdk.cli.commands import COMMANDS, cmd_release
from sdk.cli.output import Output
from sdk.cli.parser import (
    EXIT_AUTH,
    EXIT_DAEMON,
    EXIT_INTERRUPTED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    UsageError,
    build_parser,
)

START_HINT = "is turnkeeper-daemon running? start it with make serve (or turnkeeper-daemon)"


async def run(args: argparse.Namespace, out: Output) -> int:
    try:
        client = DaemonClient(args.url, token=args.token, ca_file=args.ca_file)
    except InvalidTokenError as exc:
        raise UsageError(str(exc)) from exc
    except OSError as exc:  # missing, unreadable, or not PEM (ssl.SSLError)
        raise UsageError(f"cannot use --ca-file {args.ca_file}: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise UsageError(f"invalid --url: {exc}") from exc
    async with client:
        return await COMMANDS[args.command](client, args, out)


def why_unreachable(exc: BaseException) -> str:
    """A few words for why a connection failed (refused, timed out, unknown host)."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, httpx.TimeoutException | TimeoutError):
            return "no answer in time"
        if isinstance(cause, socket.gaierror):
            return "unknown host"
        if isinstance(cause, ssl.SSLCertVerificationError):
            return f"its certificate is not trusted: {cause.verify_message}; see --ca-file"
        if isinstance(cause, ConnectionRefusedError) or (
                isinstance(cause, OSError) and cause.errno == errno.ECONNREFUSED):
            return "connection refused"
        cause = cause.__cause__ or cause.__context__
    text = str(exc.__cause__ or exc)
    return "connection refused" if "All connection attempts failed" in text else "cannot connect"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_command_line(argv)
    out = Output(args.json)
    try:
        if args.command == "release":
            return cmd_release(args, out)
        # asyncio: the standard library's loop, so an SDK-only install runs the command line.
        return anyio.run(run, args, out)
    except UsageError as exc:
        out.error(str(exc))
        return EXIT_USAGE
    except AuthError as exc:
        out.error(f"unauthorized at {args.url}: {exc} (check --token or ${TOKEN_ENV})")
        return EXIT_AUTH
    except SessionNotFoundError:
        out.error(f"no session {getattr(args, 'session', '')!r} at {args.url} "
                  "(turnkeeper list shows the live ones)")
        return EXIT_NOT_FOUND
    except TransportError as exc:
        if getattr(exc, "status", None) is None and not _answered(exc):
            out.error(f"cannot reach the daemon at {args.url} ({why_unreachable(exc)}): "
                      f"{START_HINT}")
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


def _answered(exc: TransportError) -> bool:
    """The daemon answered, but not in a way we could read (a malformed body)."""
    return "malformed" in str(exc) or "expected a JSON object" in str(exc)


def _first_line(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0]
