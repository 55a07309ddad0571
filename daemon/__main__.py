"""``python -m daemon``: parse the command line and run the daemon."""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

import trio

from .config import ConfigError, parse_config
from .server import DaemonStartError, run_daemon


def main(argv: Sequence[str] | None = None) -> int:
    try:
        config = parse_config(sys.argv[1:] if argv is None else argv)
    except ConfigError as exc:
        print(f"daemon: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr,
        format="%(asctime)s level=%(levelname)s logger=%(name)s %(message)s",
    )
    try:
        trio.run(run_daemon, config)
    except DaemonStartError as exc:
        print(f"daemon: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
