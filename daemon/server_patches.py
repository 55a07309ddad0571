"""The daemon's two additions to Hypercorn's private internals, installed in one place.

- ``ws_keepalive``: pongs are counted, two missed ones close a WebSocket with 1011;
- ``sockets``: every connection's socket is registered, so a stalled write can be cut.

Both replace or extend private Hypercorn code (``WSStream`` methods, the Trio worker's
``TCPServer``), so ``pyproject.toml`` pins Hypercorn to the range they were tested on, each
checks the shape it relies on before touching anything (and stays off, logging why, on a shape
it does not know), and ``tests/test_server_patches.py`` fails when that shape changes.
:func:`install` is called once, by ``daemon.server`` as the daemon starts (never at import);
:func:`status` is what ``GET /daemon/status`` reports as ``server``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version

from . import sockets, ws_keepalive

log = logging.getLogger("daemon.server_patches")

#: Hypercorn versions the patches were written and tested against (``pyproject.toml`` pins it).
TESTED_HYPERCORN = ">=0.18,<0.19"


@dataclass(frozen=True)
class PatchStatus:
    ws_keepalive: bool
    connection_registry: bool
    hypercorn_version: str


def hypercorn_version() -> str:
    try:
        return version("hypercorn")
    except PackageNotFoundError:  # pragma: no cover - a dependency
        return "unknown"


_status = PatchStatus(ws_keepalive=False, connection_registry=False,
                      hypercorn_version=hypercorn_version())


def install() -> PatchStatus:
    """Install both patches (idempotent); returns which are active."""
    global _status
    _status = PatchStatus(ws_keepalive=ws_keepalive.install(),
                          connection_registry=sockets.install(),
                          hypercorn_version=hypercorn_version())
    log.info("event=server_patches hypercorn=%s tested=%s ws_keepalive=%s "
             "connection_registry=%s", _status.hypercorn_version, TESTED_HYPERCORN,
             _status.ws_keepalive, _status.connection_registry)
    return _status


def status() -> PatchStatus:
    return _status
