"""The daemon's additions to Hypercorn's private internals, installed in one place.

- ``ws_keepalive``: pongs are counted, two missed ones close a WebSocket with 1011;
- ``sockets``: every connection's socket is registered, so a stalled write can be cut;
- ``ws_limits``: a WebSocket client's messages are uncompressed and a few KiB at most;
- ``http2``: HTTP/2 only with ``--http2``, and then a stream's writes stall when its reader's
  flow-control window stays shut, as a socket write does over HTTP/1.1.

All replace or extend private Hypercorn code (``WSStream`` methods, its ``Handshake``, the Trio
worker's ``TCPServer``, the protocol choice, the HTTP/2 stream buffers), so ``pyproject.toml``
pins Hypercorn to the range they were tested on, each checks the shape it relies on before
touching anything (and stays off, logging why, on a shape it does not know), and
``tests/daemon/test_server_patches.py`` fails when that shape changes.
:func:`install` is called once, by ``daemon.server`` as the daemon starts (never at import),
then :func:`probe_direct_body` (see :mod:`daemon.bridge._probe`); :func:`status` is what
``GET /daemon/status`` reports as ``server``.
"""

from __future__ import annotations

import inspect
import logging
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import msgspec

from . import _direct_body as direct_body
from . import _direct_ws as direct_ws
from . import _http2 as http2
from . import _probe as probe
from . import _sockets as sockets
from . import _ws_keepalive as ws_keepalive
from . import _ws_limits as ws_limits

log = logging.getLogger("daemon.bridge")

#: Hypercorn versions the patches were written and tested against (``pyproject.toml`` pins it).
TESTED_HYPERCORN = ">=0.18,<0.19"


class PatchStatus(msgspec.Struct, frozen=True):
    ws_keepalive: bool
    connection_registry: bool
    ws_limits: bool
    http2_flow_control: bool
    hypercorn_version: str
    # Event stream bodies go straight to the socket (the start-up probe proved it safe).
    direct_body: bool = False
    # So do WebSocket event streams' messages (their own probe proved it safe).
    direct_ws: bool = False


def hypercorn_version() -> str:
    try:
        return version("hypercorn")
    except PackageNotFoundError:  # pragma: no cover - a dependency
        return "unknown"


_status = PatchStatus(ws_keepalive=False, connection_registry=False, ws_limits=False,
                      http2_flow_control=False, hypercorn_version=hypercorn_version())


# What the patches rely on: method -> its parameters, and names its code must use.
WS_STREAM_SHAPE: dict[str, tuple[tuple[str, ...], frozenset[str]]] = {
    "__init__": (("self", "app", "config", "context", "task_group", "ssl", "client", "server",
                  "send", "stream_id"),
                 frozenset({"closed", "config", "context", "task_group", "send", "server",
                            "client", "stream_id"})),
    "_accept": (("self", "message"), frozenset({"connection", "task_group", "_send_pings"})),
    "_send_pings": (("self",), frozenset({"closed", "context", "sleep", "config",
                                          "websocket_ping_interval"})),
    "_send_wsproto_event": (("self", "event"), frozenset({"connection", "send", "stream_id"})),
    "_handle_events": (("self",), frozenset({
        "connection", "events", "buffer", "extend", "clear", "to_message", "app_put",
        "_send_wsproto_event", "send", "stream_id", "state", "FrameTooLargeError"})),
}
HANDSHAKE_SHAPE: dict[str, tuple[tuple[str, ...], frozenset[str]]] = {
    "accept": (("self", "subprotocol", "additional_headers"),
               frozenset({"extensions", "server_extensions_handshake", "Connection"})),
}
H11_PROTOCOL_SHAPE: dict[str, tuple[tuple[str, ...], frozenset[str]]] = {
    "_check_protocol": (("self", "event"), frozenset({
        "method", "target", "http_version", "H2ProtocolAssumedError",
        "H2CProtocolRequiredError"})),
}
PROTOCOL_WRAPPER_SHAPE: dict[str, tuple[tuple[str, ...], frozenset[str]]] = {
    "handle": (("self", "event"), frozenset({"protocol", "handle", "H2ProtocolAssumedError"})),
}
H2_PROTOCOL_SHAPE: dict[str, tuple[tuple[str, ...], frozenset[str]]] = {
    "__init__": (("self", "app", "config", "context", "task_group", "connection_state", "ssl",
                  "client", "server", "send"), frozenset({"stream_buffers"})),
    "handle": (("self", "event"), frozenset({"Closed", "closed", "_close_stream"})),
    # Its stream buffers: built by the module's StreamBuffer name, used through these names.
    "_create_stream": (("self", "request"), frozenset({"StreamBuffer", "event_class",
                                                       "stream_buffers"})),
    "_send_data": (("self", "stream_id"), frozenset({"pop", "complete", "close",
                                                     "stream_buffers"})),
    "stream_send": (("self", "event"), frozenset({"push", "set_complete", "drain",
                                                  "stream_buffers", "BufferCompleteError"})),
    "_handle_events": (("self", "events"), frozenset({
        "DataReceived", "streams", "acknowledge_received_data", "flow_controlled_length"})),
}
TCP_SERVER_SHAPE: dict[str, tuple[tuple[str, ...], frozenset[str]]] = {
    "__init__": (("self", "app", "config", "context", "state", "stream"),
                 frozenset({"stream", "send_lock"})),
    "run": (("self",), frozenset({"stream", "_read_data", "_close"})),
    # Every write to the socket holds send_lock (a direct WebSocket writer holds it too).
    "protocol_send": (("self", "event"), frozenset({"send_lock", "send_all", "RawData"})),
    "_read_data": (("self",), frozenset({"stream", "receive_some", "protocol", "handle"})),
    "_idle_timeout": (("self",), frozenset({"keep_alive_timeout"})),
}


def _method_problems(cls: type, shape: dict[str, tuple[tuple[str, ...], frozenset[str]]],
                     sync: tuple[str, ...] = ()) -> list[str]:
    problems = []
    for name, (params, uses) in shape.items():
        func = cls.__dict__.get(name)
        if not inspect.isfunction(func):
            problems.append(f"{cls.__name__}.{name} is missing")
            continue
        got = tuple(inspect.signature(func).parameters)
        if got != params:
            problems.append(f"{cls.__name__}.{name}{got} is not {params}")
        if name not in ("__init__", *sync) and not inspect.iscoroutinefunction(func):
            problems.append(f"{cls.__name__}.{name} is no longer a coroutine function")
        missing = uses - set(func.__code__.co_names)
        if missing:
            problems.append(f"{cls.__name__}.{name} no longer uses {sorted(missing)}")
    return problems


def shape_problems(ws_stream_cls: type, stream_closed: Any, tcp_server_cls: type,
                   worker_serve: Any, *, handshake_cls: type | None = None,
                   h11_protocol_cls: type | None = None,
                   protocol_wrapper_cls: type | None = None,
                   h2_module: Any = None) -> list[str]:
    """How the given Hypercorn classes differ from the shape the patches were written for
    (empty: they match). Pure inspection; call it before patching. The keyword-only ones are
    checked when given (:func:`hypercorn_shape_problems` gives them all)."""
    problems = _method_problems(ws_stream_cls, WS_STREAM_SHAPE)
    problems += _method_problems(tcp_server_cls, TCP_SERVER_SHAPE)
    if handshake_cls is not None:
        problems += _method_problems(handshake_cls, HANDSHAKE_SHAPE, sync=("accept",))
    if h11_protocol_cls is not None:
        problems += _method_problems(h11_protocol_cls, H11_PROTOCOL_SHAPE)
    if protocol_wrapper_cls is not None:
        problems += _method_problems(protocol_wrapper_cls, PROTOCOL_WRAPPER_SHAPE)
    if h2_module is not None:
        problems += _h2_problems(h2_module)
    if not hasattr(tcp_server_cls, "__await__"):
        problems.append("TCPServer is no longer awaitable")
    fields = getattr(stream_closed, "__dataclass_fields__", {})
    if "stream_id" not in fields:
        problems.append("StreamClosed has no stream_id field")
    code = getattr(worker_serve, "__code__", None)
    if code is None or "TCPServer" not in code.co_names:
        problems.append("worker_serve no longer builds TCPServer through its module")
    return problems


def _h2_problems(h2_module: Any) -> list[str]:
    problems = []
    for name in ("StreamBuffer", "H2Protocol", "BufferCompleteError"):
        if not isinstance(getattr(h2_module, name, None), type):
            problems.append(f"hypercorn's h2 module has no class {name}")
    for name in ("BUFFER_HIGH_WATER", "BUFFER_LOW_WATER"):
        if not isinstance(getattr(h2_module, name, None), (int, float)):
            problems.append(f"hypercorn's h2 module has no number {name}")
    if problems:
        return problems
    return _method_problems(h2_module.H2Protocol, H2_PROTOCOL_SHAPE)


def hypercorn_shape_problems() -> list[str]:
    """:func:`shape_problems` of the installed Hypercorn (before the patches replace anything:
    the classes are read from the modules that define them)."""
    from hypercorn import protocol
    from hypercorn.protocol import h2, h11, ws_stream
    from hypercorn.trio import run, tcp_server

    problems = shape_problems(
        ws_stream.WSStream, getattr(ws_stream, "StreamClosed", None), tcp_server.TCPServer,
        run.worker_serve, handshake_cls=ws_stream.Handshake,
        h11_protocol_cls=h11.H11Protocol, protocol_wrapper_cls=protocol.ProtocolWrapper,
        h2_module=h2)
    if not isinstance(getattr(ws_stream, "FrameTooLargeError", None), type):
        problems.append("hypercorn's ws_stream module has no class FrameTooLargeError")
    return problems


def install() -> PatchStatus:
    """Install the patches (idempotent); returns which are active. A Hypercorn whose shape
    differs from the one they were written for is left alone (logged)."""
    global _status
    if not (_status.ws_keepalive or _status.connection_registry or _status.ws_limits
            or _status.http2_flow_control):
        problems = hypercorn_shape_problems()
        if problems:
            log.warning("event=server_patches_unavailable hypercorn=%s tested=%s problems=%s",
                        hypercorn_version(), TESTED_HYPERCORN, "; ".join(problems))
            return _status
    _status = PatchStatus(ws_keepalive=ws_keepalive.install(),
                          connection_registry=sockets.install(),
                          ws_limits=ws_limits.install(),
                          http2_flow_control=http2.install(),
                          hypercorn_version=hypercorn_version(),
                          direct_body=_status.direct_body, direct_ws=_status.direct_ws)
    log.info("event=server_patches hypercorn=%s tested=%s ws_keepalive=%s "
             "connection_registry=%s ws_limits=%s http2_flow_control=%s",
             _status.hypercorn_version, TESTED_HYPERCORN, _status.ws_keepalive,
             _status.connection_registry, _status.ws_limits, _status.http2_flow_control)
    return _status


def status() -> PatchStatus:
    return _status


async def probe_direct_body(config: Any) -> bool:
    """Run the start-up probes (:mod:`daemon.bridge._probe`) against this Hypercorn with the
    patches installed, and let event streams write their bodies (SSE) and their messages
    (WebSocket) straight to the socket only when the probe of each found the bytes identical.
    ``config``: a Hypercorn config to copy the settings from (its bind is replaced). Logs the
    outcome of each either way; returns the SSE probe's verdict."""
    global _status
    results: list[probe.ProbeResult] = []
    for kind, run, writer in (("direct_body", probe.probe, direct_body),
                              ("direct_ws", probe.probe_ws, direct_ws)):
        if not _status.connection_registry:
            result = probe.ProbeResult(False, "the connection registry is not installed")
        elif kind == "direct_ws" and not _status.ws_limits:
            result = probe.ProbeResult(False, "the WebSocket limits are not installed")
        else:
            result = await run(config)
        writer.enable(result.identical)
        results.append(result)
        if result.identical:
            log.info("event=%s_enabled hypercorn=%s probe=identical", kind,
                     _status.hypercorn_version)
        else:
            log.warning("event=%s_disabled hypercorn=%s reason=%r path=asgi", kind,
                        _status.hypercorn_version, result.reason)
    _status = msgspec.structs.replace(_status, direct_body=results[0].identical,
                                      direct_ws=results[1].identical)
    return results[0].identical
