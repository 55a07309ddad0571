"""The daemon's one seam with Hypercorn and Quart: everything that reaches into their internals.

Hypercorn serves the daemon's HTTP/1.1, WebSocket and (with ``--http2``) HTTP/2 connections;
Quart-Trio runs its JSON routes. What the daemon needs beyond their public interfaces lives
here and nowhere else, each part checking the shape it relies on before it touches anything
(``pyproject.toml`` pins Hypercorn to the versions they were written for):

- ``_patches``: installs the patches below once, at start (:func:`install`), and reports which
  are active (:func:`status`, ``GET /daemon/status``'s ``server``);
- ``_sockets``: every connection's socket is registered, so a stalled write can be cut
  (:func:`shutdown_connection`);
- ``_connection_limit``: ``--max-connections``, decided as a connection is accepted;
- ``_ws_keepalive``, ``_ws_limits``: WebSocket pongs counted, client messages bounded;
- ``_http2``: HTTP/2 only with ``--http2``, with real backpressure;
- ``_direct_body``, ``_direct_ws``, ``_probe``: an event stream's body (SSE) or messages
  (WebSocket) written straight to its socket, only after a start-up probe proved the bytes
  identical to Hypercorn's (:func:`probe_direct_body`);
- ``_quart``: a body written from parts, and Quart's own HTTP errors answered as JSON.

The rest of the daemon imports this package's public names, never its modules.
"""

from __future__ import annotations

from ._connection_limit import configure as configure_connections
from ._connection_limit import gate as connection_gate
from ._connection_limit import report_refusals as report_connection_refusals
from ._direct_body import BodyGone, DirectBody, direct_body
from ._direct_ws import DirectWebSocket, direct_ws
from ._patches import (
    TESTED_HYPERCORN,
    PatchStatus,
    hypercorn_shape_problems,
    hypercorn_version,
    install,
    probe_direct_body,
    shape_problems,
    status,
)
from ._quart import HttpErrorHandler, JsonErrorsQuart, PartsBody
from ._sockets import is_reserve, shutdown_connection
from ._ws_limits import MAX_CLIENT_MESSAGE_BYTES

__all__ = [
    "MAX_CLIENT_MESSAGE_BYTES",
    "TESTED_HYPERCORN",
    "BodyGone",
    "DirectBody",
    "DirectWebSocket",
    "HttpErrorHandler",
    "JsonErrorsQuart",
    "PartsBody",
    "PatchStatus",
    "configure_connections",
    "connection_gate",
    "direct_body",
    "direct_ws",
    "hypercorn_shape_problems",
    "hypercorn_version",
    "install",
    "is_reserve",
    "probe_direct_body",
    "report_connection_refusals",
    "shape_problems",
    "shutdown_connection",
    "status",
]
