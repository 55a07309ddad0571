"""``turnkeeper`` (also ``python -m sdk``): a command-line client for the daemon.

    turnkeeper [--url URL] [--token TOKEN] [--json] COMMAND ...
    create [--cwd DIR] [--attach]        list [--cwd DIR] [--state STATE]
    prompt SESSION TEXT... [--approve CHOICE] [--timeout S] [--deadline-ms N]
    watch SESSION [--from ID | --live] [--epoch EPOCH] [--ws] [--until-idle]
    load SESSION [--page-size N] [--mode full|summary]
    status SESSION      cancel SESSION      close SESSION      release NAME [--gate-dir DIR]

The package is split by concern: :mod:`sdk.cli.parser` (the grammar and the exit codes),
:mod:`sdk.cli.output` (what is printed), :mod:`sdk.cli.permissions` (permission requests during a
prompt), :mod:`sdk.cli.commands` (one coroutine per command), :mod:`sdk.cli.gates` (the mock
agent's gate directory) and :mod:`sdk.cli.main` (running one, errors to exit codes).
"""

from sdk.cli.main import main
from sdk.cli.parser import build_parser, version

__all__ = ["build_parser", "main", "version"]
