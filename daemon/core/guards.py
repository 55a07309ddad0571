"""Request guards: Host (DNS rebinding), Origin (CORS) and bearer auth. Pure.

Checks run in the order Host → Origin → auth; the first failure wins. A CORS preflight from
an allowed origin skips auth (browsers never send credentials on a preflight) and is answered
here; every other response to an allowed origin carries :meth:`Guard.cors_headers`. Origins
that are not allowed get a 403 and no CORS header at all.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Sequence

import msgspec

from sdk.protocol import routes
from sdk.protocol.headers import CORS_ALLOWED, CORS_EXPOSED
from sdk.protocol.http import ErrorBody

LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "[::1]", "::1"})

CORS_ALLOW_METHODS = "GET, POST, DELETE, OPTIONS"
# The protocol's header lists (what a browser client sends, what it reads), as CORS says them.
CORS_ALLOW_HEADERS = ", ".join(CORS_ALLOWED)
CORS_EXPOSE_HEADERS = ", ".join(CORS_EXPOSED)
CORS_MAX_AGE_S = 600
# The routes answered without a token (unless --require-auth): GET /health.
_ANONYMOUS = frozenset((route.method, route.path) for route in routes.ROUTES if not route.auth)


def _anonymous(method: str, path: str) -> bool:
    return (method, path) in _ANONYMOUS

Headers = list[tuple[bytes, bytes]]


def is_loopback_peer(client: Sequence[object] | None) -> bool:
    """Whether an ASGI scope's ``client`` (host, port) is a loopback address."""
    if not client or not isinstance(client[0], str):
        return False
    try:
        return ipaddress.ip_address(client[0]).is_loopback
    except ValueError:
        return False


class Denial(msgspec.Struct, frozen=True):
    status: int
    body: ErrorBody


def host_name(host_header: str) -> str:
    """The host part of a Host header, port removed (``[::1]:80`` → ``[::1]``)."""
    host = host_header.strip().lower()
    if host.startswith("["):
        end = host.find("]")
        return host[: end + 1] if end != -1 else host
    if host.count(":") == 1:
        return host.split(":", 1)[0]
    return host


def bearer_token(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, value = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    value = value.strip()
    return value or None


class Guard(msgspec.Struct, frozen=True):
    token: str | None
    loopback_bind: bool
    bind_hostname: str
    allow_origins: frozenset[str]
    require_auth: bool = False
    # GET /metrics from a loopback peer needs no token (--metrics-loopback-no-auth).
    metrics_loopback_no_auth: bool = False

    def check(self, method: str, path: str, headers: dict[str, str], *,
              peer_loopback: bool = False) -> Denial | None:
        if self.loopback_bind:
            allowed = LOOPBACK_HOSTS | {self.bind_hostname.lower()}
            host = headers.get("host")
            if host is None or host_name(host) not in allowed:
                return Denial(403, ErrorBody(error="Invalid Host header", code="invalid_host"))
        origin = headers.get("origin")
        if origin is not None and origin not in self.allow_origins \
                and not is_same_origin(origin, headers.get("host")):
            return Denial(403, ErrorBody(error="Request denied by CORS policy",
                                         code="origin_not_allowed"))
        if self.token is None or is_preflight(method, headers):
            return None
        if is_ui_asset(method, path):
            # The viewer's static files carry no data; the page must load to ask for the token.
            # Every API call the page makes still needs it.
            return None
        if not self.require_auth and _anonymous(method, path):
            return None
        if (method, path) == (routes.METRICS.method, routes.METRICS.path) \
                and self.metrics_loopback_no_auth \
                and peer_loopback:
            return None
        given = bearer_token(headers.get("authorization"))
        if given is None or not hmac.compare_digest(given.encode(), self.token.encode()):
            return Denial(401, ErrorBody(error="Unauthorized", code="unauthorized"))
        return None

    def allowed_origin(self, headers: dict[str, str]) -> str | None:
        """The request's Origin if it is one of ``--allow-origin``, else ``None``."""
        origin = headers.get("origin")
        return origin if origin is not None and origin in self.allow_origins else None

    def cors_headers(self, headers: dict[str, str]) -> Headers:
        """What every response (errors and the SSE stream included) adds for an allowed origin."""
        origin = self.allowed_origin(headers)
        if origin is None:
            return []
        return [(b"access-control-allow-origin", origin.encode("latin-1")),
                (b"access-control-expose-headers", CORS_EXPOSE_HEADERS.encode()),
                (b"vary", b"Origin")]

    def preflight_headers(self, headers: dict[str, str]) -> Headers | None:
        """The 204 answer's headers to a preflight from an allowed origin (any route);
        ``None`` when the request is not such a preflight."""
        origin = self.allowed_origin(headers)
        if origin is None or not is_preflight("OPTIONS", headers):
            return None
        return [(b"access-control-allow-origin", origin.encode("latin-1")),
                (b"access-control-allow-methods", CORS_ALLOW_METHODS.encode()),
                (b"access-control-allow-headers", CORS_ALLOW_HEADERS.encode()),
                (b"access-control-max-age", str(CORS_MAX_AGE_S).encode()),
                (b"vary", b"Origin")]


UI_PREFIX = "/ui"


UI_REDIRECTS = frozenset({"/", "/favicon.ico"})


def is_ui_asset(method: str, path: str) -> bool:
    """A GET/HEAD for the web viewer's static files (``/ui``, ``/ui/``, ``/ui/<file>``) or
    one of the redirects to them (``/`` to the viewer, ``/favicon.ico`` to its icon)."""
    return method in ("GET", "HEAD") and (path == UI_PREFIX or path.startswith(UI_PREFIX + "/")
                                          or path in UI_REDIRECTS)


def is_same_origin(origin: str, host_header: str | None) -> bool:
    """``Origin`` names the daemon itself (scheme + the request's own Host): the viewer page
    the daemon serves. Browsers send ``Origin`` on a same-origin POST, so without this the
    daemon's own page could not prompt. The Host guard has already vetted the Host."""
    if host_header is None:
        return False
    value = origin.strip().lower()
    host = host_header.strip().lower()
    return value in (f"http://{host}", f"https://{host}")


def is_preflight(method: str, headers: dict[str, str]) -> bool:
    """A CORS preflight: ``OPTIONS`` with ``Origin`` and ``Access-Control-Request-Method``."""
    return (method == "OPTIONS" and "origin" in headers
            and "access-control-request-method" in headers)
