"""The OpenAPI 3.1 description of the daemon's HTTP API (SPEC §4.2, §4.4, §6), built from one
table of routes. Pure: no trio, no I/O.

``ROUTES`` is the single source: the document served at ``GET /openapi.json`` is generated from
it, and the tests hold it against the routes the daemon really serves (the Quart app's URL map
plus the two ASGI-level stream routes), so the table cannot drift from the code silently.

Every error body is ``{error, code, ...details}``; each documented error response lists the
machine ``code`` values it can carry in the ``x-error-codes`` extension, and the ``Error`` schema
enumerates all of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Literal

from daemon._version import __version__

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


@dataclass(frozen=True)
class Param:
    name: str
    location: Literal["path", "query", "header"]
    schema: JsonSchema
    description: str
    required: bool = False


@dataclass(frozen=True)
class Route:
    method: Literal["GET", "POST", "DELETE"]
    path: str  # OpenAPI template: /session/{sessionId}/load
    operation_id: str
    summary: str
    status: int  # the success status
    response: JsonSchema | None  # None: no body
    media_type: str = "application/json"
    body: JsonSchema | None = None  # request body schema (always optional: {} is the default)
    params: tuple[Param, ...] = ()
    errors: tuple[ErrorSpec, ...] = ()
    auth: bool = True  # False: answered without a token (unless --require-auth)
    uses_client_id: bool = False  # reads X-Qwen-Client-Id


# --- schema fragments ------------------------------------------------------------------------

_STR: Final[JsonSchema] = {"type": "string"}
_INT: Final[JsonSchema] = {"type": "integer"}
_BOOL: Final[JsonSchema] = {"type": "boolean"}
_OBJ: Final[JsonSchema] = {"type": "object"}
_ENVELOPES: Final[JsonSchema] = {"type": "array", "items": {"$ref": "#/components/schemas/Envelope"}}
_CWD: Final[JsonSchema] = {"type": "string", "description": "absolute path of the workspace"}


def _object(required: tuple[str, ...], **props: JsonSchema) -> JsonSchema:
    out: JsonSchema = {"type": "object", "properties": dict(props)}
    if required:
        out["required"] = list(required)
    return out


_SESSION_ID: Final = Param("sessionId", "path", _STR, "the daemon's session id")
_SESSION_GONE: Final[ErrorSpec] = (404, ("session_not_found",))
_LOAD_BODY: Final = _object(
    ("sessionId", "workspaceCwd", "attached", "clientId", "createdAt", "state",
     "hasActivePrompt", "hasRunningBackgroundTasks", "lastEventId", "eventEpoch"),
    sessionId=_STR, workspaceCwd=_STR, attached=_BOOL, clientId=_STR, createdAt=_STR,
    state=_OBJ, hasActivePrompt=_BOOL, hasRunningBackgroundTasks=_BOOL,
    compactedReplay=_ENVELOPES, liveJournal=_ENVELOPES, lastEventId=_INT, eventEpoch=_STR,
    replayDegraded=_BOOL, historyHasMore=_BOOL, historyAnchorRecordId=_STR,
    promptTerminals={"type": "array", "items": _OBJ},
)
_STREAM_PARAMS: Final = (
    Param("maxQueued", "query", {"type": "integer", "minimum": 16, "maximum": 2048},
          "live queue cap in frames (default 256)"),
    Param("lastEventId", "query", _STR, "cursor when the Last-Event-ID header is absent"),
    Param("epoch", "query", _STR, "epoch when the X-Qwen-Event-Epoch header is absent"),
)

ROUTES: Final[tuple[Route, ...]] = (
    Route("GET", "/health", "health", "Liveness probe", 200,
          _object(("status",), status={"const": "ok"}), auth=False),
    Route("GET", "/capabilities", "capabilities", "Features and effective limits", 200,
          _object(("v", "mode", "features", "limits"), v=_INT, mode=_STR,
                  features={"type": "array", "items": _STR}, limits=_OBJ)),
    Route("GET", "/daemon/status", "daemonStatus",
          "Limits, transcript health, agents and per-session counts", 200,
          _object(("v", "limits", "persistence", "transcript", "sessions"), v=_INT,
                  limits=_OBJ, persistence=_BOOL,
                  transcript=_object(("enabled", "degraded", "failedSessions", "lastError"),
                                     enabled=_BOOL, degraded=_BOOL,
                                     failedSessions={"type": "array", "items": _STR},
                                     lastError={"type": ["string", "null"]}),
                  agents={"type": "array", "items": _OBJ},
                  sessions={"type": "array", "items": _OBJ})),
    Route("GET", "/openapi.json", "openapi", "This document", 200, _OBJ),
    Route("POST", "/session", "createSession",
          "Create a session, or attach to the workspace's live one", 200,
          _object(("sessionId", "workspaceCwd", "attached", "clientId", "createdAt",
                   "eventEpoch"), sessionId=_STR, workspaceCwd=_STR, attached=_BOOL,
                  clientId=_STR, createdAt=_STR, eventEpoch=_STR),
          body=_object((), cwd=_CWD, sessionId={"type": "string", "format": "uuid"},
                       sessionScope={"enum": ["single", "thread"]}),
          errors=((400, ("invalid_cwd", "invalid_session_id", "invalid_session_scope")),
                  (502, ("agent_start_failed",))),
          uses_client_id=True),
    Route("POST", "/session/{sessionId}/load", "loadSession",
          "Snapshot: replay window and live journal (or a transcript page), plus the cursor",
          200, _LOAD_BODY, params=(_SESSION_ID,),
          body=_object((), cwd=_CWD,
                       historyPageSize={"type": "integer", "minimum": 1, "maximum": 500},
                       liveReplayMode={"enum": ["full", "summary"]}),
          errors=((400, ("invalid_cwd", "invalid_transcript_limit",
                         "invalid_live_replay_mode")), _SESSION_GONE),
          uses_client_id=True),
    Route("POST", "/session/{sessionId}/resume", "resumeSession",
          "Re-register the client; the cursor without the snapshot", 200, _LOAD_BODY,
          params=(_SESSION_ID,), body=_object((), cwd=_CWD),
          errors=((400, ("invalid_cwd",)), _SESSION_GONE), uses_client_id=True),
    Route("POST", "/session/{sessionId}/prompt", "prompt",
          "Admit a prompt (it runs FIFO; the outcome is a terminal event)", 202,
          _object(("promptId", "lastEventId", "eventEpoch"), promptId=_STR, lastEventId=_INT,
                  eventEpoch=_STR),
          params=(_SESSION_ID,),
          body=_object(("prompt",), prompt={"type": "array", "minItems": 1, "items": _object(
              ("type",), type=_STR)},
              deadlineMs={"type": "integer", "minimum": 1, "maximum": 86_400_000}),
          errors=((400, ("invalid_prompt", "invalid_deadline_ms")), _SESSION_GONE,
                  (503, ("prompt_queue_full",))),
          uses_client_id=True),
    Route("POST", "/session/{sessionId}/cancel", "cancel", "Cancel the running prompt", 204,
          None, params=(_SESSION_ID,), errors=(_SESSION_GONE,), uses_client_id=True),
    Route("POST", "/session/{sessionId}/permission/{requestId}", "votePermission",
          "Answer a pending permission request", 200,
          _object(("requestId", "outcome"), requestId=_STR, outcome=_OBJ),
          params=(_SESSION_ID, Param("requestId", "path", _STR, "the permission request id")),
          body={"oneOf": [_object(("optionId",), optionId=_STR),
                          _object(("outcome",), outcome={"const": "cancelled"})]},
          errors=((400, ("invalid_permission_vote",)),
                  (404, ("session_not_found", "permission_not_found")))),
    Route("GET", "/session/{sessionId}/events", "events",
          "Server-Sent Events: resume from a cursor, then live frames", 200,
          {"type": "string", "description": "SSE frames carrying envelopes"},
          media_type="text/event-stream",
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
                  (429, ("subscriber_limit_exceeded",)))),
    Route("GET", "/session/{sessionId}/transcript", "transcript",
          "One page of the durable transcript, newest first page", 200,
          _object(("v", "sessionId", "events", "hasMore"), v=_INT, sessionId=_STR,
                  events=_ENVELOPES, nextCursor=_STR, hasMore=_BOOL),
          params=(_SESSION_ID,
                  Param("limit", "query", {"type": "integer", "minimum": 1, "maximum": 500},
                        "records per page (default 100)"),
                  Param("cursor", "query", _STR, "nextCursor of the previous page"),
                  Param("beforeRecordId", "query", _STR, "page of records older than this")),
          errors=((400, ("invalid_transcript_limit", "invalid_transcript_cursor")),
                  _SESSION_GONE)),
    Route("GET", "/session/{sessionId}/status", "sessionStatus",
          "Prompt, cursor, durability and journal state of one session", 200,
          _object(("sessionId", "hasActivePrompt", "pendingPrompts", "lastEventId",
                   "durableEventId", "eventEpoch", "transcriptDegraded"),
                  sessionId=_STR, hasActivePrompt=_BOOL, pendingPrompts=_INT, lastEventId=_INT,
                  durableEventId=_INT, eventEpoch=_STR, transcriptDegraded=_BOOL,
                  fullTranscriptAvailable=_BOOL, replayDegraded=_BOOL),
          params=(_SESSION_ID,), errors=(_SESSION_GONE,)),
    Route("POST", "/session/{sessionId}/detach", "detach", "Unregister the client", 204, None,
          params=(_SESSION_ID,), errors=(_SESSION_GONE,), uses_client_id=True),
    Route("POST", "/session/{sessionId}/heartbeat", "heartbeat", "Keep-alive", 200,
          _object(("sessionId", "serverTime"), sessionId=_STR, serverTime=_INT),
          params=(_SESSION_ID,), errors=(_SESSION_GONE,)),
    Route("DELETE", "/session/{sessionId}", "deleteSession",
          "Close the session (a running prompt ends with turn_error session_closed)", 204, None,
          params=(_SESSION_ID,), errors=(_SESSION_GONE,)),
)

# Answers any route can give, from the guards and the request plumbing (SPEC §6).
_GUARD_ERRORS: Final[tuple[ErrorSpec, ...]] = ((403, ("invalid_host", "origin_not_allowed")),)
_AUTH_ERRORS: Final[tuple[ErrorSpec, ...]] = ((401, ("unauthorized",)),)
_BODY_ERRORS: Final[tuple[ErrorSpec, ...]] = (
    (400, ("invalid_json",)), (413, ("body_too_large",)),
)
_CLIENT_ID_ERRORS: Final[tuple[ErrorSpec, ...]] = ((400, ("invalid_client_id",)),)
# Not per-route: an unknown path or method never reaches an operation.
_ROUTING_ERRORS: Final[tuple[ErrorSpec, ...]] = (
    (404, ("route_not_found",)), (405, ("method_not_allowed",)),
)

_STATUS_TEXT: Final = {
    400: "Bad request", 401: "Missing or wrong bearer token",
    403: "Host or Origin refused", 404: "Not found", 405: "Method not allowed",
    413: "Body over 10 MB", 429: "Too many subscribers (Retry-After: 5)",
    502: "The workspace's agent could not be started",
    503: "Prompt queue full (Retry-After: 5)",
}


def _is_stream(route: Route) -> bool:
    return route.operation_id in ("events", "eventsWebSocket")


def _route_errors(route: Route) -> dict[int, list[str]]:
    specs: list[ErrorSpec] = [*_GUARD_ERRORS, *route.errors]
    if route.auth:
        specs += _AUTH_ERRORS
    if route.body is not None:
        specs += _BODY_ERRORS
    elif not _is_stream(route):
        # Every non-stream request body is buffered under the limit, even one nobody reads.
        specs.append((413, ("body_too_large",)))
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
    codes.add("internal_error")
    for route in ROUTES:
        for group in _route_errors(route).values():
            codes.update(group)
    return frozenset(codes)


def _parameter(param: Param) -> dict[str, Any]:
    return {"name": param.name, "in": param.location, "required": param.location == "path"
            or param.required, "description": param.description, "schema": param.schema}


def _operation(route: Route) -> dict[str, Any]:
    success: dict[str, Any] = {"description": route.summary}
    if route.response is not None:
        success["content"] = {route.media_type: {"schema": route.response}}
    responses: dict[str, Any] = {str(route.status): success}
    for status, codes in _route_errors(route).items():
        responses[str(status)] = {
            "description": _STATUS_TEXT.get(status, "Error"),
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
            "x-error-codes": codes,
        }
    responses["default"] = {"$ref": "#/components/responses/InternalError"}
    op: dict[str, Any] = {"operationId": route.operation_id, "summary": route.summary,
                          "responses": responses}
    params = [_parameter(p) for p in route.params]
    if route.uses_client_id:
        params.append(_parameter(Param("X-Qwen-Client-Id", "header",
                                       {"type": "string", "pattern": "^[A-Za-z0-9._:-]{1,128}$"},
                                       "client identity")))
    if params:
        op["parameters"] = params
    if route.body is not None:
        op["requestBody"] = {"required": False,
                             "content": {"application/json": {"schema": route.body}}}
    if not route.auth:
        op["security"] = [{}, {"bearer": []}]  # optional unless --require-auth
    return op


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
                "unknown methods 405 method_not_allowed. Every route needs the bearer token "
                "when the daemon has one, except GET /health (unless --require-auth)."
            ),
        },
        "paths": paths,
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Error": {
                    "type": "object",
                    "required": ["error", "code"],
                    "properties": {"error": _STR,
                                   "code": {"enum": sorted(documented_error_codes())}},
                },
                "Envelope": _object(("v", "type"), id={"type": "integer", "minimum": 1},
                                    v={"const": 1}, type=_STR, data={}, promptId=_STR,
                                    originatorClientId=_STR, _meta=_OBJ),
            },
            "responses": {
                "InternalError": {
                    "description": "Unexpected failure (logged); code internal_error",
                    "content": {"application/json": {
                        "schema": {"$ref": "#/components/schemas/Error"}}},
                    "x-error-codes": ["internal_error"],
                },
            },
        },
        "security": [{"bearer": []}],
        "x-routing-errors": {str(status): list(codes) for status, codes in _ROUTING_ERRORS},
    }
    if server_url is not None:
        doc["servers"] = [{"url": server_url}]
    return doc
