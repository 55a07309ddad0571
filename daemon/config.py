"""Daemon configuration: the command line and the environment, validated into one frozen record.

Every flag ``--some-flag`` can also be set by the environment variable ``TURNKEEPER_SOME_FLAG``
(the command line wins); the token's variable is ``QWEN_SERVER_TOKEN``, shared with the SDK.
Switches take ``1``/``true``/``yes``/``on`` or ``0``/``false``/``no``/``off``; ``--allow-origin``
takes a comma-separated list. ``--help`` shows each flag's default and variable.

Pure: parsing never touches the network or the file system (relative agent paths are made
absolute against the working directory, without looking at the disk); a bad value raises
:class:`ConfigError` with a one-line reason and the daemon refuses to start.
"""

from __future__ import annotations

import ipaddress
import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import msgspec

from sdk.protocol import __version__

from .core.retention import parse_size
from .logs import LOG_FORMATS, LOG_LEVELS

# argparse is imported by the functions that parse, never with this module: nothing of it is
# needed once the command line is read, and the daemon forgets it then (daemon.__main__).
if TYPE_CHECKING:
    import argparse

DEFAULT_PORT = 4170
DEFAULT_MAX_JOURNAL_EVENTS = 10_000
DEFAULT_MAX_JOURNAL_BYTES = 8 * 1024 * 1024
DEFAULT_COMPACTED_REPLAY_MAX_BYTES = 4 * 1024 * 1024
DEFAULT_EVENT_RING_SIZE = 8000
# Twice the 8 MiB replay budget: every resume a replay can finish is served from the ring.
DEFAULT_EVENT_RING_BYTES = 16 * 1024 * 1024
DEFAULT_AGENT_IDLE_MS = 300_000
DEFAULT_SESSION_IDLE_MS = 600_000
DEFAULT_AGENT_INIT_TIMEOUT_MS = 30_000
DEFAULT_AGENT_WRITE_TIMEOUT_MS = 30_000
DEFAULT_BODY_TIMEOUT_MS = 10_000
DEFAULT_STALLED_WRITE_MS = 30_000  # two heartbeat intervals
DEFAULT_LEASE_MS = 10_000
DEFAULT_MAX_SESSIONS = 1000
DEFAULT_MAX_CONNECTIONS = 1024
DEFAULT_TRANSCRIPT_CHECK_MS = 5_000
# Prompts a session queues behind the running one (fixed; capabilities' maxPendingPrompts).
MAX_PENDING_PROMPTS = 5
NODE_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")
APPROVAL_MODES = ("default", "plan", "auto-edit", "auto", "yolo")
TOKEN_ENV = "QWEN_SERVER_TOKEN"
# The bundled mock agent's gate directory (daemon.mock_agent) and its default in the data dir.
MOCK_GATE_ENV = "MOCK_ACP_GATE_DIR"
MOCK_GATES = "gates"
ENV_PREFIX = "TURNKEEPER_"
MIN_CLUSTER_SECRET_CHARS = 16
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off", ""})


class ConfigError(ValueError):
    """A configuration value the daemon refuses to start with."""


# A Struct, not a dataclass: a dataclass compiles its generated methods when the class is made
# (for this many fields, tens of kilobytes of code held for the daemon's whole life, and the
# compiler's scratch memory at start); msgspec makes a Struct's methods without compiling.
class DaemonConfig(msgspec.Struct, frozen=True, kw_only=True):
    hostname: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    token: str | None = None
    data_dir: Path = msgspec.field(default_factory=lambda: default_data_dir())
    agent_argv: tuple[str, ...] = ()
    approval_mode: str = "default"
    max_journal_events: int = DEFAULT_MAX_JOURNAL_EVENTS
    max_journal_bytes: int = DEFAULT_MAX_JOURNAL_BYTES
    compacted_replay_max_bytes: int = DEFAULT_COMPACTED_REPLAY_MAX_BYTES
    event_ring_size: int = DEFAULT_EVENT_RING_SIZE
    event_ring_bytes: int = DEFAULT_EVENT_RING_BYTES
    agent_idle_ms: int = DEFAULT_AGENT_IDLE_MS
    # A session idle this long (no subscriber, no prompt, no request) is unloaded; 0: never.
    session_idle_ms: int = DEFAULT_SESSION_IDLE_MS
    allow_origins: tuple[str, ...] = ()
    workspace: str = msgspec.field(default_factory=os.getcwd)
    require_auth: bool = False
    agent_init_timeout_ms: int = DEFAULT_AGENT_INIT_TIMEOUT_MS
    # An agent whose stdin accepts nothing this long is declared dead (killed).
    agent_write_timeout_ms: int = DEFAULT_AGENT_WRITE_TIMEOUT_MS
    # A permission request nobody answers within this is cancelled; 0: wait for ever.
    permission_response_timeout_ms: int = 0
    persistence: bool = True
    # Where the token came from ("--token" or "$QWEN_SERVER_TOKEN"), for the startup hint.
    token_source: str | None = None
    log_level: str = "info"
    log_format: str = "logfmt"
    access_log: bool = False
    # Timers shrinkable for out-of-process tests (the defaults are the documented values).
    heartbeat_ms: int = 15_000
    cancel_grace_ms: int = 10_000
    ws_ping_ms: int = 15_000
    # A request's body must have arrived this long after its headers, else 408 and close.
    body_timeout_ms: int = DEFAULT_BODY_TIMEOUT_MS
    # An SSE write that makes no progress this long is cut (the peer stopped reading).
    stalled_write_ms: int = DEFAULT_STALLED_WRITE_MS
    # Cluster mode (daemon/cluster/): the Redis URL it joins (None: single node), how other
    # nodes reach this one (None: from the bound address), this node's id (None: random,
    # chosen at start) and the session lease.
    cluster_redis: str | None = None
    node_url: str | None = None
    node_id: str | None = None
    lease_ms: int = DEFAULT_LEASE_MS
    # Serve HTTP/2 (h2c upgrade and prior knowledge) besides HTTP/1.1.
    http2: bool = False
    # The key of the HMAC that proves a request was forwarded by a node (cluster mode).
    cluster_secret: str | None = None
    # Admission caps (0 = off): live sessions, and open connections (refused as accepted).
    max_sessions: int = DEFAULT_MAX_SESSIONS
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    # The start-up quick_check of the transcript stops after this long (the full check then
    # runs in the background); --recover salvages a damaged transcript instead of serving.
    transcript_check_ms: int = DEFAULT_TRANSCRIPT_CHECK_MS
    recover: bool = False
    # TLS (Hypercorn's own): HTTPS and WSS served directly when both are set.
    certfile: str | None = None
    keyfile: str | None = None
    # GET /metrics from a loopback peer needs no token (a local scraper).
    metrics_loopback_no_auth: bool = False
    # Retention (None: off): sessions idle this many days, and the transcript's size cap.
    retain_days: float | None = None
    retain_bytes: int | None = None
    retention_interval_ms: int = 60_000

    @property
    def scheme(self) -> str:
        return "https" if self.certfile is not None else "http"

    @property
    def is_loopback(self) -> bool:
        return is_loopback_host(self.hostname)

    def effective_agent_argv(self) -> tuple[str, ...]:
        return self.agent_argv or (sys.executable, "-m", "daemon.mock_agent")

    def mock_gate_dir(self, env: Mapping[str, str]) -> Path | None:
        """Where the bundled mock agent's ``mock:gate=NAME`` waits for ``NAME`` (``None`` with
        ``--agent``): ``$MOCK_ACP_GATE_DIR`` if set, else ``gates`` in the data directory."""
        if self.agent_argv:
            return None
        given = env.get(MOCK_GATE_ENV)
        return Path(given) if given else self.data_dir / MOCK_GATES


def default_data_dir() -> Path:
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "turnkeeper"


def is_loopback_host(hostname: str) -> bool:
    if hostname == "localhost":
        return True
    try:
        return ipaddress.ip_address(hostname.strip("[]")).is_loopback
    except ValueError:
        return False


def is_header_safe_token(token: str) -> bool:
    """A bearer token every HTTP client sends and every server reads back unchanged.

    Visible ASCII only (RFC 5234 VCHAR, ``!`` to ``~``): header values are bytes that clients
    encode as ASCII or latin-1 and servers decode as latin-1, so anything beyond ASCII either
    fails to encode or arrives as different characters; spaces and tabs are trimmed or folded
    by parsers. This is wider than RFC 6750's ``b64token`` on purpose: the daemon compares the
    raw string, so punctuation in a generated password is harmless.
    """
    return bool(token) and all("!" <= ch <= "~" for ch in token)


def env_var(flag: str) -> str:
    """The environment variable of ``flag`` (``--max-journal-events`` →
    ``TURNKEEPER_MAX_JOURNAL_EVENTS``; ``--token`` → ``QWEN_SERVER_TOKEN``)."""
    if flag == "--token":
        return TOKEN_ENV
    return ENV_PREFIX + flag.lstrip("-").replace("-", "_").upper()


def resolve_agent_argv(argv: Sequence[str], base: str) -> tuple[str, ...]:
    """Relative paths in an agent command line, made absolute against ``base`` (the daemon's
    working directory at startup), because every workspace's agent runs with that workspace as
    its working directory. A path is the program when it contains a ``/`` (``./agent.py``,
    ``bin/agent``), or a later argument starting with ``./`` or ``../``; a bare program name
    (``qwen``, ``python``) is left for the ``PATH`` lookup."""
    out: list[str] = []
    for index, arg in enumerate(argv):
        relative = not os.path.isabs(arg) and (
            ("/" in arg) if index == 0 else arg.startswith(("./", "../")))
        out.append(os.path.normpath(os.path.join(base, arg)) if relative else arg)
    return tuple(out)


def _positive_int(name: str, raw: str) -> int:
    try:
        value = int(raw, 10)
    except ValueError:
        raise ConfigError(f"{name} must be a positive integer, got {raw!r}") from None
    if value <= 0:
        raise ConfigError(f"{name} must be a positive integer, got {raw!r}")
    return value


def _non_negative_int(name: str, raw: str) -> int:
    try:
        value = int(raw, 10)
    except ValueError:
        raise ConfigError(f"{name} must be a non-negative integer, got {raw!r}") from None
    if value < 0:
        raise ConfigError(f"{name} must be a non-negative integer, got {raw!r}")
    return value


def program_name(argv0: str | None = None) -> str:
    """How the daemon was invoked, for ``--help`` and ``--version``: ``turnkeeper-daemon`` from
    the console script, ``python -m daemon`` from the module."""
    name = os.path.basename(argv0 if argv0 is not None else (sys.argv[0] if sys.argv else ""))
    return "python -m daemon" if name in ("", "__main__.py", "-c") else name


EPILOG = f"""\
Every flag can also be set by an environment variable, shown with it (the command line wins).

Data: the transcript (transcript.sqlite3 and its -wal file) and the lock (daemon.lock) live in
--data-dir, by default $XDG_STATE_HOME/turnkeeper, else ~/.local/state/turnkeeper. To reset
everything, stop the daemon and delete that directory.

Agents: --agent is split like a shell command line, e.g. --agent "qwen --acp" or
--agent "gemini --experimental-acp"; a relative program path (./my_agent.py) resolves against
the directory the daemon was started in. Without --agent the bundled mock agent runs.

A damaged transcript (empty, not SQLite, failing SQLite's quick_check) stops the start with
one line; --recover then copies what is readable and checksum-intact into a new transcript
and keeps the damaged file beside it.

SIGTERM, SIGINT and SIGHUP stop the daemon gracefully. Exit status: 0 after a graceful stop,
1 when it cannot start (port in use, data directory locked or unusable, damaged transcript),
2 for a bad flag.
Version {__version__}.
"""

# Shown as the default of flags whose default is computed at startup.
_DEFAULT_TEXT = {
    "token": "none",
    "data_dir": "$XDG_STATE_HOME/turnkeeper, else ~/.local/state/turnkeeper",
    "agent": "the bundled mock agent",
    "workspace": "the directory the daemon starts in",
    "allow_origin": "none",
    "cluster_redis": "none (single node)",
    "node_url": "http://<--hostname>:<bound port>",
    "node_id": "random, printed at start",
    "cluster_secret": "none (required with --cluster-redis)",
    "certfile": "none (plain HTTP)",
    "retain_days": "off",
    "retain_bytes": "off",
    "keyfile": "none",
}


def _document(p: argparse.ArgumentParser) -> None:
    """Append every flag's default and environment variable to its help text."""
    import argparse
    for action in p._actions:
        flags = [s for s in action.option_strings if s.startswith("--")]
        if not flags or action.help == argparse.SUPPRESS or action.dest in ("help", "version"):
            continue
        if isinstance(action, argparse._StoreTrueAction):
            default = "off"
        else:
            default = _DEFAULT_TEXT.get(action.dest, str(action.default))
        extra = f"default: {default}; env: {env_var(flags[0])}".replace("%", "%%")
        action.help = f"{action.help} ({extra})" if action.help else extra


def _apply_env(p: argparse.ArgumentParser, environ: Mapping[str, str]) -> dict[str, str]:
    """Take each flag's environment variable as its default; returns ``{flag: variable}`` for
    the variables used (so an error can name where a bad value came from)."""
    import argparse
    used: dict[str, str] = {}
    for action in p._actions:
        flags = [s for s in action.option_strings if s.startswith("--")]
        if not flags or action.dest in ("help", "version", "token"):
            continue
        name = env_var(flags[0])
        raw = environ.get(name)
        if raw is None:
            continue
        value: object = raw
        if isinstance(action, argparse._StoreTrueAction):
            if raw.strip().lower() not in _TRUE | _FALSE:
                raise ConfigError(f"${name} must be one of 1/true/yes/on or 0/false/no/off,"
                                  f" got {raw!r}")
            value = raw.strip().lower() in _TRUE
        elif isinstance(action, argparse._AppendAction):
            value = [part.strip() for part in raw.split(",") if part.strip()]
        p.set_defaults(**{action.dest: value})
        used[flags[0]] = name
    return used


def _choices(values: Sequence[str]) -> str:
    return "{" + ",".join(values) + "}"


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    import argparse

    class _Parser(argparse.ArgumentParser):
        def error(self, message: str) -> NoReturn:
            raise ConfigError(message)

    p = _Parser(prog=prog or program_name(),
                description="Serve ACP agent sessions over HTTP, SSE and WebSocket.",
                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    p.add_argument("--hostname", default="127.0.0.1",
                   help="address to bind; anything but loopback needs a token")
    p.add_argument("--port", default=str(DEFAULT_PORT), help="TCP port (0 picks a free one)")
    p.add_argument("--token", default=None,
                   help="bearer token every request must carry (prefer the environment: "
                        "a command line is visible to other users in ps)")
    p.add_argument("--data-dir", default=None,
                   help="directory of the transcript database and the lock file")
    p.add_argument("--agent", default=None,
                   help="ACP agent command line, split like a shell would")
    p.add_argument("--approval-mode", default="default", metavar=_choices(APPROVAL_MODES),
                   help="yolo answers the agent's permission requests with its first allow "
                        "option; every other mode waits for a client's vote")
    p.add_argument("--max-journal-events", default=str(DEFAULT_MAX_JOURNAL_EVENTS),
                   help="live-journal cap in entries (merged text chunks count once)")
    p.add_argument("--max-journal-bytes", default=str(DEFAULT_MAX_JOURNAL_BYTES),
                   help="live-journal cap in bytes")
    p.add_argument("--compacted-replay-max-bytes", default=str(DEFAULT_COMPACTED_REPLAY_MAX_BYTES),
                   help="replay-window cap in bytes (completed turns kept in memory)")
    p.add_argument("--event-ring-size", default=str(DEFAULT_EVENT_RING_SIZE),
                   help="events kept per session for resume (Last-Event-ID)")
    p.add_argument("--event-ring-bytes", default=str(DEFAULT_EVENT_RING_BYTES),
                   help="byte cap of the resume ring (besides --event-ring-size)")
    p.add_argument("--agent-idle-ms", default=str(DEFAULT_AGENT_IDLE_MS),
                   help="stop a workspace's agent after this long without a session")
    p.add_argument("--session-idle-ms", default=str(DEFAULT_SESSION_IDLE_MS),
                   help="unload a session from memory after this long with no subscriber, no "
                        "prompt and no request; its next request restores it from the "
                        "transcript (0: never)")
    p.add_argument("--allow-origin", action="append", default=[],
                   help="a browser origin allowed to call the daemon (repeatable)")
    p.add_argument("--workspace", default=None,
                   help="absolute workspace directory of sessions created without a cwd")
    p.add_argument("--require-auth", action="store_true",
                   help="also require the token on GET /health")
    p.add_argument("--agent-init-timeout-ms", default=str(DEFAULT_AGENT_INIT_TIMEOUT_MS),
                   help="how long an agent gets to answer initialize")
    p.add_argument("--agent-write-timeout-ms", default=str(DEFAULT_AGENT_WRITE_TIMEOUT_MS),
                   help="declare an agent dead (kill it) when its stdin accepts nothing for "
                        "this long")
    p.add_argument("--permission-response-timeout-ms", default="0",
                   help="answer a permission request nobody voted on within this long with "
                        "cancelled (0: wait for a vote)")
    p.add_argument("--no-persistence", action="store_true",
                   help="run without the transcript (nothing is written to --data-dir but the "
                        "lock; markers then say fullTranscriptAvailable: false)")
    p.add_argument("--log-level", default="info", metavar=_choices(LOG_LEVELS),
                   help="least severe level logged")
    p.add_argument("--log-format", default="logfmt", metavar=_choices(LOG_FORMATS),
                   help="log lines on stderr as logfmt key=value pairs or JSON objects")
    p.add_argument("--access-log", action="store_true", help="log one line per HTTP request")
    p.add_argument("--heartbeat-ms", default="15000", help=argparse.SUPPRESS)
    p.add_argument("--cancel-grace-ms", default="10000", help=argparse.SUPPRESS)
    p.add_argument("--ws-ping-ms", default="15000", help=argparse.SUPPRESS)
    p.add_argument("--body-timeout-ms", default=str(DEFAULT_BODY_TIMEOUT_MS),
                   help="close a connection whose request body has not arrived this long after "
                        "its headers (408)")
    p.add_argument("--stalled-write-ms", default=str(DEFAULT_STALLED_WRITE_MS),
                   help="cut an event stream whose write has made no progress this long")
    p.add_argument("--max-sessions", default=str(DEFAULT_MAX_SESSIONS),
                   help="live sessions at most: past it, creating or restoring one answers 503 "
                        "session_limit (0: no cap)")
    p.add_argument("--max-connections", default=str(DEFAULT_MAX_CONNECTIONS),
                   help="open connections at most: past it, new ones are refused as they are "
                        "accepted; one more is kept for GET /health from loopback (0: no cap)")
    p.add_argument("--http2", action="store_true",
                   help="also serve HTTP/2 (h2c upgrade and prior knowledge); HTTP/1.1 only "
                        "without it")
    p.add_argument("--cluster-redis", default=None, metavar="URL",
                   help="join a cluster of daemons on this Redis (redis://host:port/db); "
                        "the transcript and the event streams then live there")
    p.add_argument("--node-url", default=None, metavar="URL",
                   help="how the other nodes of the cluster reach this node's HTTP API")
    p.add_argument("--node-id", default=None, metavar="ID",
                   help="this node's id in the cluster (letters, digits, '-', '_', '.')")
    p.add_argument("--lease-ms", default=str(DEFAULT_LEASE_MS),
                   help="how long a node owns a session without renewing its lease")
    p.add_argument("--cluster-secret", default=None, metavar="SECRET",
                   help="shared by every node of the cluster: the key that signs forwarded "
                        "requests (required with --cluster-redis, at least "
                        f"{MIN_CLUSTER_SECRET_CHARS} characters; prefer the environment)")
    p.add_argument("--transcript-check-ms", default=str(DEFAULT_TRANSCRIPT_CHECK_MS),
                   help="how long the start-up check of the transcript may take; past it the "
                        "daemon starts and the full check finishes in the background")
    p.add_argument("--certfile", default=None, metavar="PATH",
                   help="serve HTTPS and WSS with this PEM certificate (chain); needs --keyfile")
    p.add_argument("--keyfile", default=None, metavar="PATH",
                   help="the PEM private key of --certfile")
    p.add_argument("--retain-days", default=None, metavar="N",
                   help="remove stored sessions idle (not loaded, no prompt) for more than N "
                        "days (fractions allowed)")
    p.add_argument("--retain-bytes", default=None, metavar="SIZE",
                   help="remove the least recently active stored sessions while the transcript "
                        "is bigger than SIZE (500M, 2GiB, bytes)")
    p.add_argument("--retention-interval-ms", default="60000", help=argparse.SUPPRESS)
    p.add_argument("--metrics-loopback-no-auth", action="store_true",
                   help="GET /metrics from a loopback address needs no token (for a scraper "
                        "on the same machine); every other request still does")
    p.add_argument("--recover", action="store_true",
                   help="do not serve: salvage a damaged transcript in --data-dir into a new "
                        "one (the damaged file is kept beside it), print what was kept, exit")
    _document(p)
    return p


def parse_config(argv: Sequence[str], environ: dict[str, str] | None = None) -> DaemonConfig:
    """Validate ``argv`` into a :class:`DaemonConfig` or raise :class:`ConfigError`."""
    env = os.environ if environ is None else environ
    parser = build_parser()
    from_env = _apply_env(parser, env)
    try:
        return _validate(parser.parse_args(list(argv)), env)
    except ConfigError as exc:
        flag = str(exc).split(" ", 1)[0]
        if flag in from_env and flag not in argv:
            raise ConfigError(f"{exc} (from ${from_env[flag]})") from None
        raise


def _validate(ns: argparse.Namespace, env: Mapping[str, str]) -> DaemonConfig:
    port_raw: str = ns.port
    try:
        port = int(port_raw, 10)
    except ValueError:
        raise ConfigError(f"--port must be an integer 0..65535, got {port_raw!r}") from None
    if not 0 <= port <= 65535:
        raise ConfigError(f"--port must be an integer 0..65535, got {port_raw!r}")
    token = ns.token if ns.token is not None else env.get(TOKEN_ENV) or None
    if token is not None and not token.strip():
        raise ConfigError("--token must not be empty")
    if token is not None and not is_header_safe_token(token):
        source = "--token" if ns.token is not None else f"${TOKEN_ENV}"
        raise ConfigError(
            f"the token ({source}) must be visible ASCII (characters '!' to '~', no spaces):"
            " an HTTP Authorization header cannot carry anything else byte for byte"
        )
    hostname: str = ns.hostname
    if not hostname:
        raise ConfigError("--hostname must not be empty")
    if not is_loopback_host(hostname) and token is None:
        raise ConfigError(
            f"refusing to bind non-loopback address {hostname!r} without a token "
            f"(--token or ${TOKEN_ENV})"
        )
    if ns.require_auth and token is None:
        raise ConfigError("--require-auth needs a token (--token or $QWEN_SERVER_TOKEN)")
    for flag, value, choices in (("--log-level", ns.log_level, LOG_LEVELS),
                                 ("--log-format", ns.log_format, LOG_FORMATS)):
        if value not in choices:
            raise ConfigError(f"{flag} must be one of {', '.join(choices)}, got {value!r}")
    if ns.approval_mode not in APPROVAL_MODES:
        raise ConfigError(
            f"--approval-mode must be one of {', '.join(APPROVAL_MODES)}, got {ns.approval_mode!r}"
        )
    agent_argv: tuple[str, ...] = ()
    if ns.agent is not None:
        try:
            agent_argv = tuple(shlex.split(ns.agent))
        except ValueError as exc:
            raise ConfigError(f"--agent is not a valid command line: {exc}") from None
        if not agent_argv:
            raise ConfigError("--agent must not be empty")
        agent_argv = resolve_agent_argv(agent_argv, os.getcwd())
    workspace = ns.workspace or os.getcwd()
    if not os.path.isabs(workspace):
        raise ConfigError(f"--workspace must be an absolute path, got {workspace!r}")
    for origin in ns.allow_origin:
        if not origin:
            raise ConfigError("--allow-origin must not be empty")
    cluster_redis: str | None = ns.cluster_redis or None
    if cluster_redis is not None:
        if not cluster_redis.startswith(("redis://", "rediss://")):
            raise ConfigError(f"--cluster-redis must be a redis:// or rediss:// URL, "
                              f"got {cluster_redis!r}")
        if ns.no_persistence:
            raise ConfigError("--cluster-redis needs the transcript: it cannot be combined "
                              "with --no-persistence")
        secret = ns.cluster_secret or ""
        if len(secret) < MIN_CLUSTER_SECRET_CHARS:
            raise ConfigError(f"--cluster-secret must be set for --cluster-redis (at least "
                              f"{MIN_CLUSTER_SECRET_CHARS} characters, the same on every node): "
                              "it signs the requests nodes forward to each other")
    node_url: str | None = ns.node_url or None
    if node_url is not None and not node_url.startswith(("http://", "https://")):
        raise ConfigError(f"--node-url must be an http:// or https:// URL, got {node_url!r}")
    node_id: str | None = ns.node_id or None
    if node_id is not None and (len(node_id) > 64 or not set(node_id) <= NODE_ID_CHARS):
        raise ConfigError(f"--node-id must be 1-64 letters, digits, '-', '_' or '.', "
                          f"got {node_id!r}")
    certfile: str | None = ns.certfile or None
    keyfile: str | None = ns.keyfile or None
    if (certfile is None) != (keyfile is None):
        raise ConfigError("--certfile and --keyfile go together: give both to serve HTTPS, "
                          "or neither")
    return DaemonConfig(
        hostname=hostname,
        port=port,
        token=token,
        data_dir=Path(ns.data_dir) if ns.data_dir else default_data_dir(),
        agent_argv=agent_argv,
        approval_mode=ns.approval_mode,
        max_journal_events=_positive_int("--max-journal-events", ns.max_journal_events),
        max_journal_bytes=_positive_int("--max-journal-bytes", ns.max_journal_bytes),
        compacted_replay_max_bytes=_positive_int(
            "--compacted-replay-max-bytes", ns.compacted_replay_max_bytes
        ),
        event_ring_size=_positive_int("--event-ring-size", ns.event_ring_size),
        event_ring_bytes=_positive_int("--event-ring-bytes", ns.event_ring_bytes),
        agent_idle_ms=_positive_int("--agent-idle-ms", ns.agent_idle_ms),
        session_idle_ms=_non_negative_int("--session-idle-ms", ns.session_idle_ms),
        allow_origins=tuple(ns.allow_origin),
        workspace=workspace,
        require_auth=bool(ns.require_auth),
        agent_init_timeout_ms=_positive_int("--agent-init-timeout-ms", ns.agent_init_timeout_ms),
        agent_write_timeout_ms=_positive_int("--agent-write-timeout-ms",
                                             ns.agent_write_timeout_ms),
        permission_response_timeout_ms=_non_negative_int(
            "--permission-response-timeout-ms", ns.permission_response_timeout_ms),
        persistence=not ns.no_persistence,
        token_source=None if token is None else "--token" if ns.token is not None
        else f"${TOKEN_ENV}",
        log_level=ns.log_level,
        log_format=ns.log_format,
        access_log=bool(ns.access_log),
        heartbeat_ms=_positive_int("--heartbeat-ms", ns.heartbeat_ms),
        cancel_grace_ms=_positive_int("--cancel-grace-ms", ns.cancel_grace_ms),
        ws_ping_ms=_positive_int("--ws-ping-ms", ns.ws_ping_ms),
        body_timeout_ms=_positive_int("--body-timeout-ms", ns.body_timeout_ms),
        stalled_write_ms=_positive_int("--stalled-write-ms", ns.stalled_write_ms),
        cluster_redis=cluster_redis,
        node_url=node_url,
        node_id=node_id,
        lease_ms=_positive_int("--lease-ms", ns.lease_ms),
        http2=bool(ns.http2),
        cluster_secret=ns.cluster_secret or None,
        max_sessions=_non_negative_int("--max-sessions", ns.max_sessions),
        max_connections=_non_negative_int("--max-connections", ns.max_connections),
        transcript_check_ms=_positive_int("--transcript-check-ms", ns.transcript_check_ms),
        recover=bool(ns.recover),
        certfile=certfile,
        keyfile=keyfile,
        metrics_loopback_no_auth=bool(ns.metrics_loopback_no_auth),
        retain_days=_retain_days(ns.retain_days),
        retain_bytes=_retain_bytes(ns.retain_bytes),
        retention_interval_ms=_positive_int("--retention-interval-ms",
                                            ns.retention_interval_ms),
    )


def _retain_days(raw: str | None) -> float | None:
    if raw is None or raw == "":
        return None
    try:
        days = float(raw)
    except ValueError:
        days = -1.0
    if not days > 0 or days != days or days == float("inf"):
        raise ConfigError(f"--retain-days must be a positive number of days, got {raw!r}")
    return days


def _retain_bytes(raw: str | None) -> int | None:
    if raw is None or raw == "":
        return None
    try:
        return parse_size(raw)
    except ValueError:
        raise ConfigError(f"--retain-bytes must be a size like 500M, 2GiB or 1000000, "
                          f"got {raw!r}") from None
