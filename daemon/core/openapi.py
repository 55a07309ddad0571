"""The OpenAPI 3.1 description of the daemon's HTTP API, built from one
table of routes and the protocol's body types. Pure: no trio, no I/O.

``ROUTES`` is the single source of the paths: the document served at ``GET /openapi.json`` is
generated from it, and the tests hold it against the routes the daemon really serves (the Quart
app's URL map plus the two ASGI-level stream routes). The request and response bodies are not
described here at all: each route names its ``sdk.protocol.http`` Struct, the components are
generated from those classes (``msgspec.json.schema_components``), and the daemon validates
request bodies by converting them to the same classes, so the schema and the checks cannot drift.

Every error body is ``{error, code, ...details}``; each documented error response lists the
machine ``code`` values it can carry in the ``x-error-codes`` extension, and the ``Error`` schema
enumerates all of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Literal

import msgspec

from sdk.protocol import __version__
from sdk.protocol import http as wire

__all__ = [
    "OPENAPI_VERSION",
    "ROUTES",
    "Param",
    "Route",
    "build_openapi",
    "documented_error_codes",
]

OPENAPI_VERSION: Final = "3.1.0"
API_VERSION: Final = __version__

JsonSchema = dict[str, Any]
ErrorSpec = tuple[int, tuple[str, ...]]
_REF: Final = "#/components/schemas/{name}"
#: The generated component schemas, by name (``ErrorBody`` is served as ``Error``).
COMPONENTS: Final[dict[str, JsonSchema]] = wire.body_schemas(_REF)
# A vote names an option or refuses: at least one of optionId / outcome.
COMPONENTS["PermissionVoteRequest"].update(wire.PERMISSION_VOTE_RULE)
COMPONENTS["TranscriptQuery"].update(wire.TRANSCRIPT_QUERY_RULE)


def _ref(kind: type) -> JsonSchema:
    return {"$ref": _REF.format(name="Error" if kind is wire.ErrorBody else kind.__name__)}


@dataclass(frozen=True)
class Param:
    name: str
    location: Literal["path", "query", "header"]
    schema: JsonSchema
    description: str
    required: bool = False
    style: Literal["form"] | None = None  # "form": an object exploded into its fields


@dataclass(frozen=True)
class Route:
    method: Literal["GET", "POST", "DELETE"]
    path: str  # OpenAPI template: /session/{sessionId}/load
    operation_id: str
    summary: str
    status: int  # the success status
    response_type: type | None  # the sdk.protocol.http Struct of the success body; None: none
    media_type: str = "application/json"
    body_type: type | None = None  # the request body's Struct
    body_required: bool = False  # False: no body (or an empty one) means {}
    params: tuple[Param, ...] = ()
    errors: tuple[ErrorSpec, ...] = ()
    auth: bool = True  # False: answered without a token (unless --require-auth)
    uses_client_id: bool = False  # reads X-Qwen-Client-Id
    response_schema: JsonSchema | None = None  # a success body that is no Struct (stream, doc)

    @property
    def response(self) -> JsonSchema | None:
        """The success body's schema (a generated component, resolved), if it has one."""
        if self.response_type is not None:
            return COMPONENTS[self.response_type.__name__]
        return self.response_schema

    @property
    def body(self) -> JsonSchema | None:
        """The request body's schema (a generated component, resolved), if it reads one."""
        return COMPONENTS[self.body_type.__name__] if self.body_type is not None else None


# --- parameters ------------------------------------------------------------------------------

_STR: Final[JsonSchema] = {"type": "string"}
_SESSION_ID: Final = Param("sessionId", "path", _STR, "the daemon's session id")
_SESSION_GONE: Final[ErrorSpec] = (404, ("session_not_found",))
_IDEMPOTENCY_KEY: Final = Param(
    wire.IDEMPOTENCY_KEY_HEADER, "header",
    {"type": "string", "pattern": wire.IDEMPOTENCY_KEY_PATTERN},
    "one value per logical prompt, the same on every retry of it (also accepted as a quoted "
    "string)")
_STREAM_PARAMS: Final = (
    Param("maxQueued", "query", {"type": "integer", "minimum": 16, "maximum": 2048},
          "live queue cap in frames (default 256)"),
    Param("lastEventId", "query", _STR, "cursor when the Last-Event-ID header is absent"),
    Param("epoch", "query", _STR, "epoch when the X-Qwen-Event-Epoch header is absent"),
)
_SSE_SCHEMA: Final[JsonSchema] = {
    "type": "string",
    "description": "Server-Sent Events: `retry: 3000`, then one frame per event (`id:` line "
                   "when the event has an id, `event: <type>`, one `data:` line holding the "
                   "envelope), `: heartbeat` comments when quiet. The stream does not end "
                   "while the session lives.",
    "x-event-schema": {"$ref": _REF.format(name="DaemonEvent")},
}

ROUTES: Final[tuple[Route, ...]] = (
    Route("GET", "/health", "health", "Liveness probe", 200, wire.HealthResponse, auth=False),
    Route("GET", "/capabilities", "capabilities", "Features and effective limits", 200,
          wire.CapabilitiesResponse),
    Route("GET", "/daemon/status", "daemonStatus",
          "Limits, transcript health, agents, server patches and per-session counts", 200,
          wire.DaemonStatusResponse),
    Route("GET", "/openapi.json", "openapi", "This document", 200, None,
          response_schema={"type": "object"}),
    Route("GET", "/metrics", "metrics",
          "Prometheus metrics in the text exposition format (sessions, subscribers, events, "
          "evictions, prompts, commit times, agents, transcript size)", 200, None,
          media_type="text/plain", response_schema={"type": "string"}),
    Route("POST", "/session", "createSession",
          "Create a session, or attach to the workspace's live one", 200,
          wire.CreateSessionResponse, body_type=wire.CreateSessionRequest,
          errors=((400, ("invalid_cwd", "invalid_session_id", "invalid_session_scope")),
                  (502, ("agent_start_failed", "agent_session_id_reused"))),
          uses_client_id=True),
    Route("POST", "/session/{sessionId}/load", "loadSession",
          "Snapshot: replay window and live journal (or a transcript page), plus the cursor",
          200, wire.LoadSessionResponse, params=(_SESSION_ID,),
          body_type=wire.LoadSessionRequest,
          errors=((400, ("invalid_cwd", "invalid_transcript_limit",
                         "invalid_live_replay_mode")), _SESSION_GONE,
                  (502, ("agent_start_failed", "agent_session_id_reused"))),
          uses_client_id=True),
    Route("POST", "/session/{sessionId}/resume", "resumeSession",
          "Re-register the client; the cursor without the snapshot", 200,
          wire.ResumeSessionResponse, params=(_SESSION_ID,),
          body_type=wire.ResumeSessionRequest,
          errors=((400, ("invalid_cwd",)), _SESSION_GONE,
                  (502, ("agent_start_failed", "agent_session_id_reused"))),
          uses_client_id=True),
    Route("POST", "/session/{sessionId}/prompt", "prompt",
          "Admit a prompt (it runs FIFO; the outcome is a terminal event). With an "
          "Idempotency-Key, a repeated request is answered the first one's 202 body and "
          "admits nothing", 202,
          wire.PromptAccepted, params=(_SESSION_ID, _IDEMPOTENCY_KEY),
          body_type=wire.PromptRequest, body_required=True,
          errors=((400, ("invalid_prompt", "invalid_deadline_ms", "invalid_idempotency_key")),
                  _SESSION_GONE, (409, ("idempotency_key_reused",)),
                  (503, ("prompt_queue_full",))),
          uses_client_id=True),
    Route("GET", "/session/{sessionId}/prompts/{idempotencyKey}", "promptByKey",
          "Whether a prompt was admitted with this Idempotency-Key, its 202 body and how far "
          "it got", 200, wire.PromptByKeyResponse,
          params=(_SESSION_ID, Param("idempotencyKey", "path",
                                     {"type": "string",
                                      "pattern": wire.IDEMPOTENCY_KEY_PATTERN},
                                     "the Idempotency-Key the prompt was sent with")),
          errors=((400, ("invalid_idempotency_key",)),
                  (404, ("session_not_found", "prompt_not_found")))),
    Route("POST", "/session/{sessionId}/cancel", "cancel", "Cancel the running prompt", 204,
          None, params=(_SESSION_ID,), errors=(_SESSION_GONE,), uses_client_id=True),
    Route("POST", "/session/{sessionId}/permission/{requestId}", "votePermission",
          "Answer a pending permission request", 200, wire.PermissionVoteResponse,
          params=(_SESSION_ID, Param("requestId", "path", _STR, "the permission request id")),
          body_type=wire.PermissionVoteRequest, body_required=True,
          errors=((400, ("invalid_permission_vote", "invalid_permission_option")),
                  (404, ("session_not_found", "permission_not_found")))),
    Route("GET", "/session/{sessionId}/events", "events",
          "Server-Sent Events: resume from a cursor, then live frames", 200, None,
          media_type="text/event-stream", response_schema=_SSE_SCHEMA,
          params=(_SESSION_ID,
                  Param("Last-Event-ID", "header", _STR, "resume cursor (decimal, >= 0)"),
                  Param("X-Qwen-Event-Epoch", "header", _STR, "the epoch the cursor belongs to"),
                  *_STREAM_PARAMS,
                  Param("snapshot", "query", _STR, "observability only"),
                  Param("connectReason", "query", _STR, "observability only"),
                  Param("previousStreamId", "query", _STR, "observability only")),
          errors=((400, ("invalid_max_queued",)), _SESSION_GONE,
                  (429, ("subscriber_limit_exceeded",)))),
    Route("GET", "/session/{sessionId}/ws", "eventsWebSocket",
          "WebSocket upgrade carrying the same envelopes as JSON text messages", 101, None,
          params=(_SESSION_ID, *_STREAM_PARAMS),
          errors=((400, ("invalid_max_queued",)), _SESSION_GONE,
                  (426, ("upgrade_required",)), (429, ("subscriber_limit_exceeded",)))),
    Route("GET", "/session/{sessionId}/transcript", "transcript",
          "One page of the durable transcript, newest first page", 200, wire.TranscriptPage,
          params=(_SESSION_ID,
                  # One exploded object (limit=..&cursor=..): the schema can then say that
                  # cursor and beforeRecordId exclude each other.
                  Param("page", "query", _ref(wire.TranscriptQuery),
                        "limit (records per page), and at most one of cursor (nextCursor of "
                        "the previous page) and beforeRecordId (records older than this one); "
                        "both → 400 invalid_transcript_cursor", style="form")),
          errors=((400, ("invalid_transcript_limit", "invalid_transcript_cursor")),
                  _SESSION_GONE)),
    Route("GET", "/session/{sessionId}/status", "sessionStatus",
          "Prompt, cursor, durability and journal state of one session", 200,
          wire.SessionStatusResponse, params=(_SESSION_ID,), errors=(_SESSION_GONE,)),
    Route("POST", "/session/{sessionId}/detach", "detach", "Unregister the client", 204, None,
          params=(_SESSION_ID,), errors=(_SESSION_GONE,), uses_client_id=True),
    Route("POST", "/session/{sessionId}/heartbeat", "heartbeat", "Keep-alive", 200,
          wire.HeartbeatResponse, params=(_SESSION_ID,), errors=(_SESSION_GONE,)),
    Route("DELETE", "/session/{sessionId}", "deleteSession",
          "Close the session (a running prompt ends with turn_error session_closed)", 204, None,
          params=(_SESSION_ID,), errors=(_SESSION_GONE,)),
)

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
    409: "Idempotency-Key already used for a different request",
    413: "Body over 10 MB", 426: "Not a WebSocket upgrade (Upgrade: websocket)",
    429: "Too many subscribers (Retry-After: 5)",
    502: "The workspace's agent could not be started",
    503: "Prompt queue full (Retry-After: 5)",
}
# Headers an answer carries that a client acts on.
_RETRY_AFTER: Final = {"Retry-After": {"description": "seconds to wait before retrying",
                                       "schema": {"type": "integer"}}}
_STATUS_HEADERS: Final[dict[int, dict[str, Any]]] = {
    426: {"Upgrade": {"description": "the protocol to upgrade to",
                      "schema": {"const": "websocket"}}},
    429: _RETRY_AFTER,
    503: _RETRY_AFTER,
}


def _is_stream(route: Route) -> bool:
    return route.operation_id in ("events", "eventsWebSocket")


def _route_errors(route: Route) -> dict[int, list[str]]:
    specs: list[ErrorSpec] = [*_GUARD_ERRORS, *route.errors]
    if route.auth:
        specs += _AUTH_ERRORS
    if route.body_type is not None:
        specs += _JSON_ERRORS
    if not _is_stream(route):
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
        success["content"] = {route.media_type: {"schema": route.response_schema}}
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
        params.append(_parameter(Param("X-Qwen-Client-Id", "header",
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
