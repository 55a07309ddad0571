"""``python -m daemon``: parse the command line and run the daemon."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from functools import partial

import trio

import daemon

from . import malloc
from .clash import clash_message
from .config import TOKEN_ENV, ConfigError, parse_config, program_name
from .logs import configure_logging

SWITCH_INTERVAL_S = 0.001  # GIL switch interval (see main)


def main(argv: Sequence[str] | None = None) -> int:
    malloc.tune()  # before the heap fills: the arena limit only binds threads started later
    # Errors name the program as the user typed it (turnkeeper-daemon, python -m daemon).
    prog = program_name()
    clash = clash_message(daemon)
    if clash is not None:
        print(f"{prog}: {clash}", file=sys.stderr)
    args = sys.argv[1:] if argv is None else list(argv)
    if args[:1] == ["prune"]:
        from .prune import run_prune

        return run_prune(args[1:], prog)
    if args[:1] == ["backup"]:
        from .backup_command import run_backup

        return run_backup(args[1:], prog)
    # argparse only reads the command line: a daemon that loaded it for that forgets it after,
    # and its code and objects go with the parser (nothing else holds them; see
    # tests/daemon/test_idle_footprint.py). One that had it already (in process) leaves it.
    forget_argparse = "argparse" not in sys.modules
    try:
        config = parse_config(args)
    except ConfigError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    if forget_argparse:
        sys.modules.pop("argparse", None)
    # The server and everything it runs on are imported once the command line is read: their
    # objects then take the memory the parser gave back instead of pages of their own.
    from .server import DaemonStartError, run_daemon

    configure_logging(config.log_level, config.log_format)
    if config.recover:
        from .recover import run_recovery

        return run_recovery(config.data_dir, sys.stdout)
    if config.token_source == "--token":
        logging.getLogger("daemon").warning(
            "event=token_on_command_line hint=%s",
            f"other users can read --token in ps; set ${TOKEN_ENV} instead")
    # The transcript commits in a worker thread, which needs the GIL between SQLite calls;
    # while a turn streams, the event loop holds it for whole switch intervals (5 ms by
    # default), and each commit waits several of them. 1 ms keeps commits (and so the
    # window a crash can take back) short at full speed.
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    try:
        trio.run(partial(run_daemon, config, exit_when_stopped=exit_now))
    except DaemonStartError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    exit_now(0)
    return 0


def exit_now(code: int) -> None:
    """Exit without freeing every object one by one: after a graceful stop everything is
    closed and committed (the transcript, its lock, the agents), and what the interpreter's
    own teardown would still do is return the memory of every session that was loaded, a
    cost that grows with their number (a third of a second for 2,000 sessions). The logs and
    the standard streams are flushed first."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass  # a closed or broken stream: nothing left to write to it
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
