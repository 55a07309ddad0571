"""The daemon's root: lock the data directory, open the transcript, run Hypercorn and the
session manager in one nursery, and shut down gracefully on SIGTERM/SIGINT/SIGHUP."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import resource
import shlex
import signal
import ssl
import sys
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import IO, Any

import trio
from hypercorn.config import Config as HyperConfig
from hypercorn.trio import serve

from . import bridge
from .asgi import DaemonASGI
from .config import DaemonConfig, program_name
from .core.guards import Guard
from .core.retention import RetentionPolicy
from .errors import DaemonStartError as DaemonStartError  # re-exported: python -m daemon catches it
from .http_api import create_app
from .logs import ACCESS_LOG_FORMAT
from .manager import SessionManager
from .reclaimer import Reclaimer
from .retention import Retention
from .transcript_check import check_transcript
from .transcript_store import TranscriptDamagedError, TranscriptDatabase, TranscriptSchemaError
from .transcript_writer import TranscriptWriter

log = logging.getLogger("daemon.server")

TRANSCRIPT_FILE = "transcript.sqlite3"
LOCK_FILE = "daemon.lock"
SHUTDOWN_BUDGET_S = 4.0
SHUTDOWN_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# Descriptors beyond --max-connections: agents' pipes, the transcript, connections being refused
# or let in for a health probe, and some slack.
SPARE_DESCRIPTORS = 256
LISTEN_BACKLOG = 1024


def prepare_data_dir(data_dir: Path) -> None:
    """Create the data directory; a path that is not (or cannot be) a directory is refused."""
    if data_dir.exists() and not data_dir.is_dir():
        raise DaemonStartError(f"data directory {data_dir} is not a directory")
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DaemonStartError(
            f"cannot create data directory {data_dir}: {exc.strerror or exc}") from None


def sole_leaf(exc: BaseException) -> BaseException:
    """The one exception a (nested) exception group holds, else ``exc`` itself."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def acquire_lock(data_dir: Path) -> IO[str]:
    try:
        handle = open(data_dir / LOCK_FILE, "a+")
    except OSError as exc:
        raise DaemonStartError(
            f"cannot use data directory {data_dir}: {exc.strerror or exc}") from None
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise DaemonStartError(
            f"another daemon is already using data directory {data_dir}") from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle


def recovery_hint(config: DaemonConfig) -> str:
    """The command that salvages a damaged transcript of ``config``'s data directory."""
    return f"{program_name()} --recover --data-dir {shlex.quote(str(config.data_dir))}"


def open_store(config: DaemonConfig) -> TranscriptDatabase | None:
    """The transcript, checked (bounded by ``--transcript-check-ms``) before it is served; a
    damaged one stops the start with one line that names the command to recover it."""
    if not config.persistence:
        return None
    try:
        store = TranscriptDatabase(config.data_dir / TRANSCRIPT_FILE,
                                quick_check_s=config.transcript_check_ms / 1000)
    except TranscriptDamagedError as exc:
        raise DaemonStartError(f"{exc}. Stop here and recover what is readable with: "
                               f"{recovery_hint(config)}") from None
    except TranscriptSchemaError as exc:
        raise DaemonStartError(str(exc)) from None
    if store.quick_check == "incomplete":
        log.warning("event=transcript_quick_check_incomplete budget_ms=%d hint=%s",
                    config.transcript_check_ms, "the full check continues in the background")
    return store


def ensure_descriptors(max_connections: int) -> None:
    """Raise the soft descriptor limit to what ``max_connections`` needs (up to the hard one):
    otherwise accept() would fail with EMFILE before the cap is reached. Logs when it cannot."""
    if max_connections == 0:
        return
    needed = max_connections + SPARE_DESCRIPTORS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft != resource.RLIM_INFINITY and soft < needed:
        log.warning("event=descriptor_limit_low limit=%d needed=%d max_connections=%d "
                    "hint=\"raise ulimit -n or lower --max-connections\"", soft, needed,
                    max_connections)


def hypercorn_config(config: DaemonConfig) -> HyperConfig:
    hconf = HyperConfig()
    host = config.hostname
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    hconf.bind = [f"{host}:{config.port}"]
    # The access log goes through the daemon's formatter (logfmt or JSON, values quoted).
    hconf.accesslog = logging.getLogger("hypercorn.access") if config.access_log else None
    hconf.access_log_format = ACCESS_LOG_FORMAT
    hconf.errorlog = logging.getLogger("hypercorn.error")
    hconf.graceful_timeout = 1.0
    # Room for a burst of connections waiting to be accepted (and refused past
    # --max-connections) rather than dropped by the kernel: a dropped SYN is tried again only
    # a second later (a loopback GET /health took 1.1 s during 512 attempts at once with 100).
    hconf.backlog = LISTEN_BACKLOG
    hconf.keep_alive_timeout = 30
    hconf.websocket_ping_interval = config.ws_ping_ms / 1000
    # A WebSocket client's messages are never used: a few KiB at most (daemon.bridge).
    hconf.websocket_max_message_size = bridge.MAX_CLIENT_MESSAGE_BYTES
    # HTTP/2 (h2c and prior knowledge as well as TLS's ALPN) only when asked for
    # (daemon.bridge's HTTP/2 patch reads this list).
    hconf.alpn_protocols = ["h2", "http/1.1"] if config.http2 else ["http/1.1"]
    # TLS is Hypercorn's own (its default context: TLS 1.2 and later, strong ciphers only).
    hconf.certfile = config.certfile
    hconf.keyfile = config.keyfile
    return hconf


def check_tls(hconf: HyperConfig) -> None:
    """Load the certificate and key once before serving, so a bad pair stops the start with one
    line that names it (Hypercorn would fail later, inside its worker)."""
    if not hconf.ssl_enabled:
        return
    try:
        hconf.create_ssl_context()
    except (OSError, ssl.SSLError) as exc:
        raise DaemonStartError(f"cannot serve TLS with --certfile {hconf.certfile} --keyfile "
                               f"{hconf.keyfile}: {getattr(exc, 'strerror', None) or exc}"
                               ) from None


def startup_hint(config: DaemonConfig) -> str:
    """Where the token came from (never the token) and where the data lives."""
    if config.token_source == "--token":
        token = ("token: from --token (export it as $QWEN_SERVER_TOKEN for the curl below; "
                 "prefer the variable, a command line is visible in ps)")
    elif config.token is not None:
        token = f"token: from {config.token_source or '$QWEN_SERVER_TOKEN'}"
    else:
        token = "token: none (loopback only; set $QWEN_SERVER_TOKEN to require one)"
    data = (f"data: {config.data_dir}" if config.persistence
            else f"data: none (--no-persistence; lock in {config.data_dir})")
    return f"{token}\n{data}"


def prepare_gate_dir(config: DaemonConfig) -> Path | None:
    """The bundled mock agent's gate directory, created (``None`` with ``--agent``)."""
    gates = config.mock_gate_dir(os.environ)
    if gates is None:
        return None
    try:
        gates.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DaemonStartError(
            f"cannot create the mock agent's gate directory {gates}: {exc.strerror or exc}"
        ) from None
    return gates


def banner(config: DaemonConfig, url: str, gates: Path | None) -> str:
    """The start-up lines after the address: the viewer, a first request, the mock's gates."""
    auth = ' -H "Authorization: Bearer $QWEN_SERVER_TOKEN"' if config.token else ""
    lines = [
        f"viewer: {url}/ui/",
        # The same rule as `turnkeeper create`, the SDK and the viewer: a new session each time
        # (without sessionScope "thread", POST /session joins the workspace's live session).
        f"try: curl -s{auth} -X POST {url}/session -H 'Content-Type: application/json'"
        """ -d '{"sessionScope":"thread"}'""",
    ]
    if gates is not None:
        lines.append(f"mock agent: a prompt with mock:gate=NAME holds its turn open until "
                     f"`turnkeeper release NAME` (gates in {gates})")
    return "\n".join(lines)


async def check_then_trim(writer: TranscriptWriter, reclaimer: Reclaimer) -> None:
    """The transcript's full check, then a trim: the check read pages of the whole file into
    SQLite's cache, which the idle daemon has no use for."""
    await check_transcript(writer)
    reclaimer.trim_now("transcript_checked", quiet=True)


async def run_daemon(
    config: DaemonConfig,
    *,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
    handle_signals: bool = True,
    out: Any = None,
    exit_when_stopped: Callable[[int], None] | None = None,
) -> None:
    """Run the daemon until a shutdown signal (or cancellation), then stop gracefully.

    ``exit_when_stopped`` (the command line's): once the stop has committed and closed the
    transcript and released the lock, the process exits through it at once instead of
    unwinding every task (idle sessions are then closed without waking theirs)."""
    prepare_data_dir(config.data_dir)
    gates = prepare_gate_dir(config)
    lock = acquire_lock(config.data_dir)
    store = open_store(config)
    # Hypercorn gets the daemon's keepalive and connection registry before it serves anything
    # (the one call site; GET /daemon/status reports what is active). After the store opens, so
    # a refusal to start stays the one line that says why.
    bridge.install()
    bridge.configure_connections(config.max_connections)
    ensure_descriptors(config.max_connections)
    stream = out if out is not None else sys.stdout
    try:
        async with trio.open_nursery() as root:
            writer: TranscriptWriter | None = None
            cluster: Any = None
            if config.cluster_redis is not None and store is not None:
                # Only here is cluster mode (and coredis) imported: single-node mode never is.
                from .cluster import Cluster, ClusterStartError
                cluster = Cluster(
                    config.cluster_redis, config.node_id or f"node-{uuid.uuid4().hex[:12]}",
                    config.node_url or f"{config.scheme}://{config.hostname}:{config.port}",
                    config.lease_ms, config.event_ring_size, config.cluster_secret or "")
                # Every op also ships to Redis: committed once both have it.
                writer = TranscriptWriter(store, replicas=[cluster.shipping])
                await root.start(writer.run)
                try:
                    await root.start(cluster.run)
                except ClusterStartError as exc:
                    raise DaemonStartError(str(exc)) from None
            elif store is not None:
                writer = TranscriptWriter(store)
                await root.start(writer.run)
            reclaimer = Reclaimer()
            if writer is not None:
                reclaimer.releasers.append(writer.release_memory)
            await root.start(reclaimer.run)
            root.start_soon(bridge.report_connection_refusals)
            manager = SessionManager(config, writer, root, reclaimer=reclaimer)
            if writer is not None and cluster is None:
                retention = Retention(writer, manager, RetentionPolicy(
                    config.retain_days, config.retain_bytes),
                    interval_s=config.retention_interval_ms / 1000)
                manager.on_closed_for_good = retention.wake
                manager.retention_stats = retention.stats
                root.start_soon(retention.run)
            guard = Guard(token=config.token, loopback_bind=config.is_loopback,
                          bind_hostname=config.hostname,
                          allow_origins=frozenset(config.allow_origins),
                          require_auth=config.require_auth,
                          metrics_loopback_no_auth=config.metrics_loopback_no_auth)
            asgi = DaemonASGI(create_app(config, manager), manager, guard,
                              config.heartbeat_ms / 1000)
            if cluster is not None:
                assert writer is not None
                asgi.cluster = router = cluster.attach(manager, writer, token=config.token)
                manager.cluster_stats = lambda: (len(cluster.membership.leases),
                                                 router.takeovers)
            stop_http = trio.Event()
            hconf = hypercorn_config(config)
            check_tls(hconf)
            try:
                binds: list[str] = await root.start(partial(
                    serve, asgi, hconf,  # type: ignore[arg-type]
                    shutdown_trigger=stop_http.wait))
            except (OSError, BaseExceptionGroup) as exc:
                bind_error = sole_leaf(exc)  # Hypercorn's nurseries wrap the bind error
                if not isinstance(bind_error, OSError):
                    raise
                raise DaemonStartError(
                    f"cannot listen on {config.hostname}:{config.port}: "
                    f"{bind_error.strerror or bind_error}") from None
            if writer is not None:  # once serving is sure: a refusal stays one line
                root.start_soon(check_then_trim, writer, reclaimer)
            # Event streams write their bodies straight to the socket only once this
            # Hypercorn, patched, is seen to write the very same bytes (daemon.bridge's probe):
            # before the daemon says it listens, so its clients' streams all get the verdict.
            await bridge.probe_direct_body(hypercorn_config(config))
            url = binds[0] if binds else f"{config.scheme}://{config.hostname}:{config.port}"
            if cluster is not None:
                if config.node_url is None:
                    cluster.node_url = url  # the bound port (--port 0 picks one)
                # Before any session: the other nodes must be able to forward to this one.
                await cluster.verify_url(asgi.cluster.probe)
                asgi.cluster.ready = True
                print(f"cluster: node {cluster.node_id} at {cluster.node_url} on "
                      f"{config.cluster_redis}", file=stream, flush=True)
            # Start-up (imports, the schema, the app and its OpenAPI document) left freed heap
            # pages behind, below live objects where glibc never returns them on its own.
            reclaimer.trim_now("startup", quiet=True)
            # The handlers are in place before the daemon says it listens: a SIGTERM sent as
            # soon as the URL is read stops it gracefully, never by the default disposition.
            # SIGHUP (the terminal went away) ends the daemon as gracefully as SIGTERM.
            with (trio.open_signal_receiver(*SHUTDOWN_SIGNALS) if handle_signals
                  else contextlib.nullcontext()) as signals:
                print(f"turnkeeper daemon listening on {url}", file=stream, flush=True)
                print(startup_hint(config), file=stream, flush=True)
                print(banner(config, url, gates), file=stream, flush=True)
                log.info("event=listening url=%s data_dir=%s persistence=%s", url,
                         config.data_dir, store is not None)
                task_status.started(binds)
                if signals is None:
                    await trio.sleep_forever()
                async for signum in signals:
                    log.info("event=shutdown signal=%s", signal.Signals(signum).name)
                    break
            with trio.move_on_after(SHUTDOWN_BUDGET_S) as budget:
                await manager.shutdown(process_exits=exit_when_stopped is not None)
                if cluster is not None:
                    await cluster.release_all()
                    await asgi.cluster.aclose()
                stop_http.set()
                if writer is not None:
                    await writer.aclose()
            if budget.cancelled_caught:
                log.warning("event=shutdown_budget_exceeded budget_s=%s", SHUTDOWN_BUDGET_S)
            elif exit_when_stopped is not None:
                # Everything is committed: what is left of the tasks holds nothing to keep.
                # The connection is closed once no worker thread uses it (a retention step
                # may still run there); should that not come in time, the exit closes it.
                if writer is not None:
                    with trio.move_on_after(SHUTDOWN_BUDGET_S):
                        await writer.close_store()
                elif store is not None:
                    store.close()
                lock.close()
                exit_when_stopped(0)
            root.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        failure = sole_leaf(group)
        if not isinstance(failure, DaemonStartError):
            raise
        raise failure from None  # one line for the operator, not a nursery traceback
    finally:
        if store is not None:
            store.close()
        lock.close()
