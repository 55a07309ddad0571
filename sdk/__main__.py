"""``python -m sdk``: the ``turnkeeper`` command line (:mod:`sdk.cli`)."""

import sys

from sdk.cli import main

if __name__ == "__main__":
    sys.exit(main())
