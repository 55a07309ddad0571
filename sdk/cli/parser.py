"""The command line's grammar: global options, one sub-parser per command, exit codes.

A usage error names the command it is about: ``turnkeeper create --bogus`` prints ``create``'s
usage, not the top-level one. ``--json`` is accepted before the command (global) and after it.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Final, NoReturn

from sdk._client import TOKEN_ENV
from sdk.protocol import __version__
from sdk.protocol.http import SESSION_STATES

DEFAULT_URL: Final = "http://127.0.0.1:4170"
URL_ENV: Final = "TURNKEEPER_URL"
CA_FILE_ENV: Final = "TURNKEEPER_CA_FILE"

EXIT_OK: Final = 0
EXIT_TURN_ERROR: Final = 1
EXIT_USAGE: Final = 2
EXIT_UNREACHABLE: Final = 3
EXIT_AUTH: Final = 4
EXIT_NOT_FOUND: Final = 5
EXIT_DAEMON: Final = 6
EXIT_PERMISSION: Final = 7
EXIT_OUTCOME_UNKNOWN: Final = 8
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

COMMANDS: Final = ("create", "list", "prompt", "watch", "load", "status", "cancel", "close",
                   "export", "release")

EPILOG: Final = f"""\
environment:
  {URL_ENV}         default for --url
  {TOKEN_ENV}      default for --token (the daemon reads the same variable)
  {CA_FILE_ENV}     default for --ca-file
  MOCK_ACP_GATE_DIR      default gate directory for release

A session the daemon no longer holds in memory (after a restart) is restored automatically:
on the first "no session" answer the command asks the daemon to restore it, then retries once.

exit codes:
  0 ok, 1 the turn ended with turn_error, 2 usage error, 3 daemon unreachable,
  4 unauthorized, 5 no such session, 6 other daemon error, 7 a permission request nobody
  could answer, 8 not known whether the prompt was admitted (resend it with --key),
  124 prompt --timeout expired, 130 interrupted
"""


class UsageError(Exception):
    """A usage problem found after parsing (an unusable --url, a bad --timeout)."""


def version() -> str:
    """The package's version: the one ``__version__`` the daemon and the packaging also read."""
    return __version__


class _Parser(argparse.ArgumentParser):
    """Knows its sub-parsers, so that leftovers are reported by the command they follow."""

    commands: dict[str, argparse.ArgumentParser]

    def parse_command_line(self, argv: Sequence[str] | None) -> argparse.Namespace:
        args, extra = self.parse_known_args(argv)
        if extra:
            command = getattr(args, "command", None)
            owner = self.commands.get(command, self) if command else self
            owner.error(f"unrecognized arguments: {' '.join(extra)}")
        return args

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _json_flag(parser: argparse.ArgumentParser) -> None:
    # Also after the command (`turnkeeper list --json`); absent, the global flag decides.
    parser.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                        help="machine output, as the global --json (default: readable text)")


def build_parser() -> _Parser:
    url_default = os.environ.get(URL_ENV) or DEFAULT_URL
    parser = _Parser(
        prog="turnkeeper",
        description="Command-line client for the turnkeeper daemon.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--url", default=url_default,
        help=f"daemon URL (default: ${URL_ENV} if set, else {DEFAULT_URL}; now {url_default})",
    )
    parser.add_argument(
        "--token", default=None, help=f"bearer token (default: ${TOKEN_ENV}; none when unset)",
    )
    parser.add_argument(
        "--ca-file", default=os.environ.get(CA_FILE_ENV) or None, metavar="PEM",
        help=f"trust an https:// daemon's certificate through this PEM file only, e.g. a "
             f"self-signed one (default: ${CA_FILE_ENV}; else the system's CAs)",
    )
    parser.add_argument(
        "--json", action="store_true",
        help="machine output: one JSON object per line (default: readable text)",
    )
    parser.add_argument(
        "--version", action="version", version=f"turnkeeper {version()}",
        help="print the version and exit",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                parser_class=_Parser)
    parser.commands = {}

    def command(name: str, help: str, description: str) -> _Parser:
        made = sub.add_parser(name, help=help, description=description)
        assert isinstance(made, _Parser)
        made.commands = {}
        _json_flag(made)
        parser.commands[name] = made
        return made

    create = command("create", help="create a session and print its id",
                     description="Create a new session and print its id.")
    create.add_argument(
        "--cwd", default=None,
        help="workspace directory, absolute or relative to the current directory (default: "
        "the daemon's --workspace)",
    )
    create.add_argument(
        "--attach", action="store_true",
        help="join the workspace's live session if there is one (default: always a new "
        "session)",
    )

    listing = command(
        "list", help="list the daemon's sessions",
        description="List the daemon's sessions, newest first: id, state (running, queued, "
        "idle, or unloaded: stored, not in memory, restored by its next use), last activity "
        "and workspace (with its git branch).")
    listing.add_argument("--cwd", default=None,
                         help="only the sessions of this workspace, relative to the current "
                         "directory (default: every workspace)")
    listing.add_argument("--state", default=None, choices=SESSION_STATES,
                         help="only the sessions in this state (default: every state)")

    prompt = command(
        "prompt", help="send a prompt and stream the answer",
        description="Send a prompt, stream the answer's text to stdout, and end with the "
        "terminal. A permission request from the agent is shown on stderr; with a terminal on "
        "stdin you answer it there, otherwise --approve answers it (without either, the prompt "
        "is cancelled and the command exits 7 rather than hang or grant anything).",
    )
    prompt.add_argument("session", help="session id")
    prompt.add_argument("text", nargs="+", help="prompt text (words are joined by spaces)")
    prompt.add_argument(
        "--approve", choices=APPROVE_CHOICES, default=None,
        help="answer every permission request without asking: pick the agent's first option "
        "of that kind (a request offering none is cancelled: never a wider grant), or cancel "
        "(default: ask on the terminal; exit 7 when stdin is not one)",
    )
    prompt.add_argument(
        "--timeout", type=float, default=None, metavar="SECONDS",
        help="give up after this long: cancel the prompt on the daemon and exit 124; unless "
        "--deadline-ms is given, SECONDS + 5 is also sent as the daemon-side deadline, a "
        "backstop should the cancel not arrive (default: no limit)",
    )
    prompt.add_argument(
        "--key", default=None, metavar="KEY",
        help="the prompt's Idempotency-Key, 1-128 of letters, digits and _ . : ~ - : the "
        "daemon admits a key once per session, so running the command again with the key an "
        "earlier run printed resends that prompt without running it twice, and follows it "
        "(default: a fresh random key)",
    )
    prompt.add_argument(
        "--deadline-ms", type=int, default=None, metavar="MS",
        help="daemon-side deadline from the turn's start; the turn then ends with turn_error "
        "prompt_deadline_exceeded (default: none, or --timeout + 5 s)",
    )

    watch = command(
        "watch", help="show a session's replay, then follow its events",
        description="Print the session's replay (a load: what a client joining now sees), then "
        "follow its live events from the snapshot's cursor, one line each, resuming across "
        "reconnects and daemon restarts. Ends when the session is gone (exit 5), or with "
        "--until-idle once no turn runs.",
    )
    watch.add_argument("session", help="session id")
    start = watch.add_mutually_exclusive_group()
    start.add_argument(
        "--from", dest="from_id", type=int, default=None, metavar="ID",
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
        "--ws", action="store_true", help="use the WebSocket stream (default: Server-Sent Events)",
    )
    watch.add_argument(
        "--until-idle", action="store_true",
        help="exit 0 once no turn runs and none is queued: at once for an idle session, else "
        "when the last turn ends (default: follow until interrupted)",
    )

    load = command("load", help="load a snapshot and summarize it",
                   description="Load a snapshot and print its sizes and truncation markers.")
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

    status = command("status", help="show a session's state",
                     description="Show a session's state: the running prompt and the queue, "
                     "cursor and epoch, what is durable, subscribers, the live journal.")
    status.add_argument("session", help="session id")

    cancel = command("cancel", help="cancel the running prompt of a session",
                     description="Ask the agent to cancel the session's running prompt (its "
                     "turn then ends with stopReason cancelled). Queued prompts stay queued.")
    cancel.add_argument("session", help="session id")

    export = command("export", help="write a session's whole transcript to stdout",
                     description="Write the session's whole transcript, every turn in order, "
                     "to stdout as the daemon streams it: JSON Lines (one event a line, as the "
                     "transcript pages hold them) or Markdown. A stored session need not be "
                     "loaded.")
    export.add_argument("session", help="session id")
    export.add_argument("--format", choices=("jsonl", "markdown"), default="jsonl",
                        help="jsonl (default: jsonl) or markdown")

    close = command("close", help="close a session for good",
                    description="Close a session: a running prompt ends with turn_error, the "
                    "agent's session ends, and the daemon will not restore it again.")
    close.add_argument("session", help="session id")

    release = command(
        "release", help="open a gate of the bundled mock agent",
        description="Open the gate NAME of the bundled mock agent: a turn whose prompt says "
        "mock:gate=NAME (or mock:start_gate=NAME) goes on. The gate is a file in the mock's "
        "gate directory, so this runs on the daemon's machine.",
    )
    release.add_argument("gate", metavar="NAME", help="gate name, as in mock:gate=NAME")
    release.add_argument(
        "--gate-dir", default=None, metavar="DIR",
        help="the mock agent's gate directory (default: $MOCK_ACP_GATE_DIR, else gates in "
        "the daemon's default data directory: $TURNKEEPER_DATA_DIR, else "
        "$XDG_STATE_HOME/turnkeeper, else ~/.local/state/turnkeeper)",
    )
    return parser
