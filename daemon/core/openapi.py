"""The OpenAPI 3.1 description of the daemon's HTTP API, built from the protocol's table of
routes (:mod:`sdk.protocol.routes`) and its body types. Pure: no trio, no I/O.

``ROUTES`` is the single source of the paths: the document served at ``GET /openapi.json`` is
generated from it, the daemon registers its handlers by it, and the tests hold it against the
routes the daemon really serves (the Quart app's URL map plus the two ASGI-level stream
routes). The request and response bodies are not
described here at all: each route names its ``sdk.protocol.http`` Struct, the components are
generated from those classes (``msgspec.json.schema_components``), and the daemon validates
request bodies by converting them to the same classes, so the schema and the checks cannot drift.

Every error body is ``{error, code, ...details}``; each documented error response lists the
machine ``code`` values it can carry in the ``x-error-codes`` extension, and the ``Error`` schema
enumerates all of them.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from sdk.protocol import __version__, headers
from sdk.protocol import http as wire
from sdk.protocol.routes import ROUTES, SCHEMA_REF, ErrorSpec, Param, Route

__all__ = [
    "OPENAPI_VERSION",
    "body_schema",
    "build_openapi",
    "documented_error_codes",
    "response_schema",
]

OPENAPI_VERSION: Final = "3.1.0"
API_VERSION: Final = __version__

JsonSchema = dict[str, Any]
_REF: Final = SCHEMA_REF
#: The generated component schemas, by name (``ErrorBody`` is served as ``Error``).
COMPONENTS: Final[dict[str, JsonSchema]] = wire.body_schemas(_REF)
# A vote names an option or refuses: at least one of optionId / outcome.
COMPONENTS["PermissionVoteRequest"].update(wire.PERMISSION_VOTE_RULE)
COMPONENTS["TranscriptQuery"].update(wire.TRANSCRIPT_QUERY_RULE)


def _ref(kind: type) -> JsonSchema:
    return {"$ref": _REF.format(name="Error" if kind is wire.ErrorBody else kind.__name__)}


def response_schema(route: Route) -> JsonSchema | None:
    """The success body's schema (a generated component, resolved), if it has one."""
    if route.response_type is not None:
        return COMPONENTS[route.response_type.__name__]
    return route.response_schema


def body_schema(route: Route) -> JsonSchema | None:
    """The request body's schema (a generated component, resolved), if it reads one."""
    return COMPONENTS[route.body_type.__name__] if route.body_type is not None else None


# Answers any route can give, from the guards and the request plumbing.
_GUARD_ERRORS: Final[tuple[ErrorSpec, ...]] = ((403, ("invalid_host", "origin_not_allowed")),)
_AUTH_ERRORS: Final[tuple[ErrorSpec, ...]] = ((401, ("unauthorized",)),)
_JSON_ERRORS: Final[tuple[ErrorSpec, ...]] = ((400, ("invalid_json",)),)
# Every non-stream request body is read in full before the app runs, even one nobody reads:
# over 10 MB is 413, and one that does not arrive within --body-timeout-ms is 408 (the
# connection then closes).
_BUFFERED_BODY_ERRORS: Final[tuple[ErrorSpec, ...]] = (
    (408, ("body_timeout",)), (413, ("body_too_large",)),
)
_CLIENT_ID_ERRORS: Final[tuple[ErrorSpec, ...]] = ((400, ("invalid_client_id",)),)
# Any route: a bug, or damaged history a request would read (the default response).
_INTERNAL_ERRORS: Final = ("internal_error", "transcript_damaged")
# Not per-route: an unknown path or method never reaches an operation (a 405 carries Allow).
_ROUTING_ERRORS: Final[tuple[ErrorSpec, ...]] = (
    (404, ("route_not_found",)), (405, ("method_not_allowed",)),
)

_STATUS_TEXT: Final = {
    400: "Bad request", 401: "Missing or wrong bearer token",
    403: "Host or Origin refused", 404: "Not found", 405: "Method not allowed",
    408: "Request body not received within --body-timeout-ms (the connection closes)",
    409: "Idempotency-Key already used for a different request; or, for an export, the "
         "daemon keeps no transcript (--no-persistence)",
    413: "Body over 10 MB", 426: "Not a WebSocket upgrade (Upgrade: websocket)",
    429: "Too many subscribers (Retry-After: 5)",
    502: "The workspace's agent could not be started",
    503: "Prompt queue full (Retry-After: 5)",
}
# Headers an answer carries that a client acts on.
_RETRY_AFTER: Final = {headers.RETRY_AFTER: {"description": "seconds to wait before retrying",
                                       "schema": {"type": "integer"}}}
_STATUS_HEADERS: Final[dict[int, dict[str, Any]]] = {
    426: {"Upgrade": {"description": "the protocol to upgrade to",
                      "schema": {"const": "websocket"}}},
    429: _RETRY_AFTER,
    503: _RETRY_AFTER,
}


def _route_errors(route: Route) -> dict[int, list[str]]:
    specs: list[ErrorSpec] = [*_GUARD_ERRORS, *route.errors]
    if route.auth:
        specs += _AUTH_ERRORS
    if route.body_type is not None:
        specs += _JSON_ERRORS
    if not route.streams:
        specs += _BUFFERED_BODY_ERRORS
    if route.uses_client_id:
        specs += _CLIENT_ID_ERRORS
    merged: dict[int, list[str]] = {}
    for status, codes in specs:
        bucket = merged.setdefault(status, [])
        bucket.extend(code for code in codes if code not in bucket)
    return dict(sorted(merged.items()))


def documented_error_codes() -> frozenset[str]:
    """Every machine ``code`` the document names."""
    codes = {code for _, group in _ROUTING_ERRORS for code in group}
    codes.update(_INTERNAL_ERRORS)
    for route in ROUTES:
        for group in _route_errors(route).values():
            codes.update(group)
    return frozenset(codes)


def _parameter(param: Param) -> dict[str, Any]:
    out = {"name": param.name, "in": param.location, "required": param.location == "path"
           or param.required, "description": param.description, "schema": param.schema}
    if param.style is not None:
        out.update(style=param.style, explode=True)
    return out


def _operation(route: Route) -> dict[str, Any]:
    success: dict[str, Any] = {"description": route.summary}
    if route.response_type is not None:
        success["content"] = {route.media_type: {"schema": _ref(route.response_type)}}
    elif route.response_schema is not None:
        success["content"] = {media: {"schema": route.response_schema}
                              for media in (route.media_type, *route.other_media_types)}
    responses: dict[str, Any] = {str(route.status): success}
    for status, codes in _route_errors(route).items():
        answer: dict[str, Any] = {
            "description": _STATUS_TEXT.get(status, "Error"),
            "content": {"application/json": {"schema": _ref(wire.ErrorBody)}},
            "x-error-codes": codes,
        }
        if status in _STATUS_HEADERS:
            answer["headers"] = _STATUS_HEADERS[status]
        responses[str(status)] = answer
    responses["default"] = {"$ref": "#/components/responses/InternalError"}
    op: dict[str, Any] = {"operationId": route.operation_id, "summary": route.summary,
                          "responses": responses}
    if route.media_type == "text/event-stream":
        op["x-stream"] = "text/event-stream"  # never ends by itself: bound any reader
    params = [_parameter(p) for p in route.params]
    if route.uses_client_id:
        params.append(_parameter(Param(headers.CLIENT_ID, "header",
                                       {"type": "string", "pattern": wire.CLIENT_ID_PATTERN},
                                       "client identity")))
    if params:
        op["parameters"] = params
    if route.body_type is not None:
        op["requestBody"] = {"required": route.body_required,
                             "content": {"application/json": {"schema": _ref(route.body_type)}}}
    if not route.auth:
        op["security"] = [{}, {"bearer": []}]  # optional unless --require-auth
    return op


def _schemas() -> dict[str, JsonSchema]:
    schemas = {name: dict(schema) for name, schema in COMPONENTS.items()}
    error = schemas.pop("ErrorBody")
    error["properties"] = {**error["properties"],
                           "code": {"enum": sorted(documented_error_codes())}}
    schemas["Error"] = error
    return dict(sorted(schemas.items()))


def build_openapi(server_url: str | None = None) -> dict[str, Any]:
    """The OpenAPI 3.1 document (a fresh dict each call, safe to mutate)."""
    paths: dict[str, dict[str, Any]] = {}
    for route in ROUTES:
        paths.setdefault(route.path, {})[route.method.lower()] = _operation(route)
    doc: dict[str, Any] = {
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": "turnkeeper daemon",
            "version": API_VERSION,
            "description": (
                "ACP agent sessions over HTTP, SSE and WebSocket. Every error body is "
                "{error, code, ...details}; unknown paths answer 404 route_not_found and "
                "unknown methods 405 method_not_allowed with an Allow header. Every route "
                "needs the bearer token when the daemon has one, except GET /health (unless "
                "--require-auth). Body fields not described here are ignored."
            ),
        },
        "paths": paths,
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": _schemas(),
            "responses": {
                "InternalError": {
                    "description": "Unexpected failure (logged; code internal_error), or the "
                                   "transcript is damaged where the request reads it (code "
                                   "transcript_damaged: nothing of it is served)",
                    "content": {"application/json": {"schema": _ref(wire.ErrorBody)}},
                    "x-error-codes": list(_INTERNAL_ERRORS),
                },
            },
        },
        "security": [{"bearer": []}],
        "x-routing-errors": {str(status): list(codes) for status, codes in _ROUTING_ERRORS},
    }
    if server_url is not None:
        doc["servers"] = [{"url": server_url}]
    fresh: dict[str, Any] = msgspec.json.decode(msgspec.json.encode(doc))  # a deep copy
    return fresh
