"""Request guards: Host (DNS rebinding), Origin (CORS) and bearer auth (SPEC §6). Pure.

Checks run in the order Host → Origin → auth; the first failure wins.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Any

LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "[::1]", "::1"})


@dataclass(frozen=True)
class Denial:
    status: int
    body: dict[str, Any]


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


@dataclass(frozen=True)
class Guard:
    token: str | None
    loopback_bind: bool
    bind_hostname: str
    allow_origins: frozenset[str]
    require_auth: bool = False

    def check(self, method: str, path: str, headers: dict[str, str]) -> Denial | None:
        if self.loopback_bind:
            allowed = LOOPBACK_HOSTS | {self.bind_hostname.lower()}
            host = headers.get("host")
            if host is None or host_name(host) not in allowed:
                return Denial(403, {"error": "Invalid Host header", "code": "invalid_host"})
        origin = headers.get("origin")
        if origin is not None and origin not in self.allow_origins:
            return Denial(403, {"error": "Request denied by CORS policy",
                                "code": "origin_not_allowed"})
        if self.token is None:
            return None
        if path == "/health" and method == "GET" and not self.require_auth:
            return None
        given = bearer_token(headers.get("authorization"))
        if given is None or not hmac.compare_digest(given.encode(), self.token.encode()):
            return Denial(401, {"error": "Unauthorized", "code": "unauthorized"})
        return None
