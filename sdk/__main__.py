"""``python -m sdk`` and the ``turnkeeper`` script: the command line (:mod:`sdk.cli`)."""

import sys

# httpx imports its own command line (and through it rich, click and pygments) whenever those
# happen to be installed; this process runs ours, never httpx's, so it is not loaded. Only an
# entry point does this: the SDK imported as a library leaves httpx alone.
if "httpx" not in sys.modules:
    sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]

from sdk.cli import main

if __name__ == "__main__":
    sys.exit(main())
