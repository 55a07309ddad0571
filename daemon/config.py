"""Daemon configuration: the command line, validated into one frozen record.

Pure: parsing never touches the network or the file system; a bad value raises
:class:`ConfigError` with a one-line reason and the daemon refuses to start.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_PORT = 4170
DEFAULT_MAX_JOURNAL_EVENTS = 10_000
DEFAULT_MAX_JOURNAL_BYTES = 8 * 1024 * 1024
DEFAULT_COMPACTED_REPLAY_MAX_BYTES = 4 * 1024 * 1024
DEFAULT_EVENT_RING_SIZE = 8000
# Twice the 8 MiB replay budget: every resume a replay can finish is served from the ring.
DEFAULT_EVENT_RING_BYTES = 16 * 1024 * 1024
DEFAULT_AGENT_IDLE_MS = 300_000
DEFAULT_AGENT_INIT_TIMEOUT_MS = 30_000
DEFAULT_BODY_TIMEOUT_MS = 10_000
APPROVAL_MODES = ("default", "plan", "auto-edit", "auto", "yolo")
TOKEN_ENV = "QWEN_SERVER_TOKEN"


class ConfigError(ValueError):
    """A configuration value the daemon refuses to start with."""


@dataclass(frozen=True)
class DaemonConfig:
    hostname: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    token: str | None = None
    data_dir: Path = field(default_factory=lambda: default_data_dir())
    agent_argv: tuple[str, ...] = ()
    approval_mode: str = "default"
    max_journal_events: int = DEFAULT_MAX_JOURNAL_EVENTS
    max_journal_bytes: int = DEFAULT_MAX_JOURNAL_BYTES
    compacted_replay_max_bytes: int = DEFAULT_COMPACTED_REPLAY_MAX_BYTES
    event_ring_size: int = DEFAULT_EVENT_RING_SIZE
    event_ring_bytes: int = DEFAULT_EVENT_RING_BYTES
    agent_idle_ms: int = DEFAULT_AGENT_IDLE_MS
    allow_origins: tuple[str, ...] = ()
    workspace: str = field(default_factory=os.getcwd)
    require_auth: bool = False
    agent_init_timeout_ms: int = DEFAULT_AGENT_INIT_TIMEOUT_MS
    persistence: bool = True
    # Timers shrinkable for out-of-process tests (defaults are the spec's values).
    heartbeat_ms: int = 15_000
    cancel_grace_ms: int = 10_000
    ws_ping_ms: int = 15_000
    # A request's body must have arrived this long after its headers, else 408 and close.
    body_timeout_ms: int = DEFAULT_BODY_TIMEOUT_MS

    @property
    def is_loopback(self) -> bool:
        return is_loopback_host(self.hostname)

    def effective_agent_argv(self) -> tuple[str, ...]:
        return self.agent_argv or (sys.executable, "-m", "daemon.mock_agent")


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


def _positive_int(name: str, raw: str) -> int:
    try:
        value = int(raw, 10)
    except ValueError:
        raise ConfigError(f"{name} must be a positive integer, got {raw!r}") from None
    if value <= 0:
        raise ConfigError(f"{name} must be a positive integer, got {raw!r}")
    return value


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise ConfigError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m daemon", description="Serve ACP agent sessions over HTTP/SSE/WS.")
    p.add_argument("--hostname", default="127.0.0.1")
    p.add_argument("--port", default=str(DEFAULT_PORT), help="TCP port (0 picks a free one)")
    p.add_argument("--token", default=None, help=f"bearer token (else ${TOKEN_ENV})")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--agent", default=None, help="agent command line (default: bundled mock agent)")
    p.add_argument("--approval-mode", default="default")
    p.add_argument("--max-journal-events", default=str(DEFAULT_MAX_JOURNAL_EVENTS))
    p.add_argument("--max-journal-bytes", default=str(DEFAULT_MAX_JOURNAL_BYTES))
    p.add_argument("--compacted-replay-max-bytes", default=str(DEFAULT_COMPACTED_REPLAY_MAX_BYTES))
    p.add_argument("--event-ring-size", default=str(DEFAULT_EVENT_RING_SIZE))
    p.add_argument("--event-ring-bytes", default=str(DEFAULT_EVENT_RING_BYTES),
                   help="byte cap of the resume ring (besides --event-ring-size)")
    p.add_argument("--agent-idle-ms", default=str(DEFAULT_AGENT_IDLE_MS),
                   help="stop a workspace's agent after this long without a session")
    p.add_argument("--allow-origin", action="append", default=[])
    p.add_argument("--workspace", default=None)
    p.add_argument("--require-auth", action="store_true")
    p.add_argument("--agent-init-timeout-ms", default=str(DEFAULT_AGENT_INIT_TIMEOUT_MS))
    p.add_argument("--no-persistence", action="store_true", help="run without the transcript")
    p.add_argument("--heartbeat-ms", default="15000", help=argparse.SUPPRESS)
    p.add_argument("--cancel-grace-ms", default="10000", help=argparse.SUPPRESS)
    p.add_argument("--ws-ping-ms", default="15000", help=argparse.SUPPRESS)
    p.add_argument("--body-timeout-ms", default=str(DEFAULT_BODY_TIMEOUT_MS),
                   help="close a connection whose request body has not arrived this long after "
                        "its headers (408)")
    return p


def parse_config(argv: Sequence[str], environ: dict[str, str] | None = None) -> DaemonConfig:
    """Validate ``argv`` into a :class:`DaemonConfig` or raise :class:`ConfigError`."""
    env = os.environ if environ is None else environ
    ns = build_parser().parse_args(list(argv))
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
    workspace = ns.workspace or os.getcwd()
    if not os.path.isabs(workspace):
        raise ConfigError(f"--workspace must be an absolute path, got {workspace!r}")
    for origin in ns.allow_origin:
        if not origin:
            raise ConfigError("--allow-origin must not be empty")
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
        allow_origins=tuple(ns.allow_origin),
        workspace=workspace,
        require_auth=bool(ns.require_auth),
        agent_init_timeout_ms=_positive_int("--agent-init-timeout-ms", ns.agent_init_timeout_ms),
        persistence=not ns.no_persistence,
        heartbeat_ms=_positive_int("--heartbeat-ms", ns.heartbeat_ms),
        cancel_grace_ms=_positive_int("--cancel-grace-ms", ns.cancel_grace_ms),
        ws_ping_ms=_positive_int("--ws-ping-ms", ns.ws_ping_ms),
        body_timeout_ms=_positive_int("--body-timeout-ms", ns.body_timeout_ms),
    )
