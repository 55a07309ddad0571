"""Request-guard details pinned down by mutation testing: Host parsing, the bearer
scheme, the order Host → Origin → auth with its exact denials, the CORS headers, preflights,
the viewer's assets and the same-origin page."""

from __future__ import annotations

import pytest

from daemon.core.guards import (
    CORS_ALLOW_HEADERS,
    CORS_ALLOW_METHODS,
    CORS_EXPOSE_HEADERS,
    Denial,
    Guard,
    bearer_token,
    host_name,
    is_preflight,
    is_same_origin,
    is_ui_asset,
)
from sdk.protocol.http import ErrorBody

HOST = Denial(403, ErrorBody(error="Invalid Host header", code="invalid_host"))
CORS = Denial(403, ErrorBody(error="Request denied by CORS policy", code="origin_not_allowed"))
AUTH = Denial(401, ErrorBody(error="Unauthorized", code="unauthorized"))
APP = "http://app.example"


def guard(token: str | None = "tok", *, loopback: bool = True, require_auth: bool = False
          ) -> Guard:
    return Guard(token=token, loopback_bind=loopback, bind_hostname="MyBox",
                 allow_origins=frozenset({APP}), require_auth=require_auth)


@pytest.mark.parametrize(("header", "host"), [
    ("LOCALHOST:8080", "localhost"), (" 127.0.0.1 ", "127.0.0.1"), ("[::1]:80", "[::1]"),
    ("[::1]", "[::1]"), ("[::1", "[::1"), ("::1", "::1"), ("example.com", "example.com"),
])
def test_host_name_drops_the_port(header: str, host: str) -> None:
    assert host_name(header) == host


@pytest.mark.parametrize(("header", "token"), [
    ("Bearer abc", "abc"), ("bearer  abc ", "abc"), ("  BEARER abc", "abc"), ("Bearer ", None),
    ("Basic abc", None), ("", None), (None, None), ("Bearerabc", None),
])
def test_bearer_token(header: str | None, token: str | None) -> None:
    assert bearer_token(header) == token


def test_host_guard_on_a_loopback_bind() -> None:
    g = guard()
    ok = {"host": "127.0.0.1:4000", "authorization": "Bearer tok"}
    assert g.check("GET", "/session", ok) is None
    assert g.check("GET", "/session", {**ok, "host": "mybox:4000"}) is None  # bind name, any case
    assert g.check("GET", "/session", {**ok, "host": "evil.example"}) == HOST
    assert g.check("GET", "/session", {"authorization": "Bearer tok"}) == HOST
    # Not bound to loopback: any Host passes this guard.
    assert guard(loopback=False).check("GET", "/session", {**ok, "host": "evil.example"}) is None


def test_origin_guard_and_order() -> None:
    g = guard()
    base = {"host": "localhost:4000"}
    assert g.check("GET", "/session", {**base, "origin": "http://evil.example"}) == CORS
    # Host is checked before Origin, Origin before auth.
    assert g.check("GET", "/session", {"host": "evil", "origin": "http://evil"}) == HOST
    assert g.check("GET", "/session", {**base, "origin": "http://evil"}) == CORS
    assert g.check("GET", "/session", {**base, "origin": APP}) == AUTH
    # The daemon's own page (same origin) is not a cross-origin request.
    assert g.check("GET", "/session", {**base, "origin": "http://localhost:4000",
                                       "authorization": "Bearer tok"}) is None


def test_auth_rules() -> None:
    g = guard()
    base = {"host": "localhost"}
    assert g.check("GET", "/session", base) == AUTH
    assert g.check("GET", "/session", {**base, "authorization": "Bearer nope"}) == AUTH
    assert g.check("GET", "/session", {**base, "authorization": "Bearer tok"}) is None
    assert g.check("GET", "/health", base) is None
    assert g.check("POST", "/health", base) == AUTH
    assert guard(require_auth=True).check("GET", "/health", base) == AUTH
    assert g.check("GET", "/ui/app.js", base) is None
    assert g.check("HEAD", "/ui", base) is None
    assert g.check("POST", "/ui/x", base) == AUTH
    assert guard(token=None).check("GET", "/session", base) is None
    preflight = {**base, "origin": APP, "access-control-request-method": "POST"}
    assert g.check("OPTIONS", "/session", preflight) is None
    assert g.check("OPTIONS", "/session", {**base, "origin": APP}) == AUTH


def test_cors_headers_only_for_an_allowed_origin() -> None:
    g = guard()
    assert g.allowed_origin({"origin": APP}) == APP
    assert g.allowed_origin({"origin": "http://evil"}) is None
    assert g.allowed_origin({}) is None
    assert g.cors_headers({"origin": APP}) == [
        (b"access-control-allow-origin", APP.encode()),
        (b"access-control-expose-headers", CORS_EXPOSE_HEADERS.encode()),
        (b"vary", b"Origin")]
    assert g.cors_headers({"origin": "http://evil"}) == []


def test_preflight_answer() -> None:
    g = guard()
    request = {"origin": APP, "access-control-request-method": "POST"}
    assert g.preflight_headers(request) == [
        (b"access-control-allow-origin", APP.encode()),
        (b"access-control-allow-methods", CORS_ALLOW_METHODS.encode()),
        (b"access-control-allow-headers", CORS_ALLOW_HEADERS.encode()),
        (b"access-control-max-age", b"600"),
        (b"vary", b"Origin")]
    assert g.preflight_headers({"origin": APP}) is None
    assert g.preflight_headers({**request, "origin": "http://evil"}) is None
    assert CORS_ALLOW_METHODS == "GET, POST, DELETE, OPTIONS"
    assert "Last-Event-ID" in CORS_ALLOW_HEADERS and "Authorization" in CORS_ALLOW_HEADERS


def test_small_predicates() -> None:
    assert is_ui_asset("GET", "/ui") and is_ui_asset("GET", "/ui/") and is_ui_asset("HEAD", "/ui/a")
    assert not is_ui_asset("GET", "/uix") and not is_ui_asset("DELETE", "/ui/a")
    assert is_same_origin("HTTP://LocalHost:4000 ", "localhost:4000")
    assert is_same_origin("https://localhost:4000", "localhost:4000")
    assert not is_same_origin("http://localhost:4001", "localhost:4000")
    assert not is_same_origin("http://localhost:4000", None)
    assert is_preflight("OPTIONS", {"origin": "o", "access-control-request-method": "GET"})
    assert not is_preflight("GET", {"origin": "o", "access-control-request-method": "GET"})
    assert not is_preflight("OPTIONS", {"access-control-request-method": "GET"})
    assert not is_preflight("OPTIONS", {"origin": "o"})
