"""The daemon's HTTP routes, each written once: method, path template, body types, parameters,
success status and the error codes it can answer.

This table drives everything that names a route: the daemon's Quart app registers its handlers
by it (:attr:`Route.rule`), its ASGI layer recognises the stream routes by it
(:meth:`Route.match`), cluster mode finds the session a request is for by it
(:func:`session_of`), the OpenAPI document is generated from it, and the SDK builds its request
paths with it (:meth:`Route.url`). The request and response bodies are the Structs of
:mod:`sdk.protocol.http`; header names are :mod:`sdk.protocol.headers`.

Pure: no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Final, Literal
from urllib.parse import quote

from sdk.protocol import headers
from sdk.protocol import http as wire

__all__ = [
    "BACKUP",
    "CANCEL",
    "CAPABILITIES",
    "CREATE_SESSION",
    "DAEMON_STATUS",
    "DELETE_SESSION",
    "DETACH",
    "EVENTS",
    "EVENTS_WS",
    "EXPORT_SESSION",
    "HEALTH",
    "HEARTBEAT",
    "LIST_SESSIONS",
    "LOAD_SESSION",
    "METRICS",
    "NODE_PROBE",
    "OPENAPI",
    "PROMPT",
    "PROMPT_BY_KEY",
    "RESUME_SESSION",
    "ROUTES",
    "SCHEMA_REF",
    "SESSION_STATUS",
    "TRANSCRIPT",
    "VOTE_PERMISSION",
    "ErrorSpec",
    "Param",
    "Route",
    "session_of",
]

JsonSchema = dict[str, Any]
#: A status and the machine codes an answer with it can carry.
ErrorSpec = tuple[int, tuple[str, ...]]
#: Where the OpenAPI document keeps the body schemas (:func:`sdk.protocol.http.body_schemas`).
SCHEMA_REF: Final = "#/components/schemas/{name}"

_PARAM = re.compile(r"\{([A-Za-z]+)\}")


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


@dataclass(frozen=True)
class Param:
    name: str
    location: Literal["path", "query", "header"]
    schema: JsonSchema
    description: str
    required: bool = False
    style: Literal["form"] | None = None  # "form": an object exploded into its fields


@dataclass(frozen=True, eq=False)  # one object per route: hashed and compared by identity
class Route:
    method: Literal["GET", "POST", "DELETE"]
    path: str  # the template: /session/{sessionId}/load
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
    other_media_types: tuple[str, ...] = ()  # a success body also served as these (a parameter)
    # Answered by the daemon's ASGI layer (the event streams), not its application.
    streams: bool = False
    _pattern: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        regex = _PARAM.sub(lambda m: f"(?P<{m.group(1)}>[^/]+)", re.escape(self.path)
                           .replace(r"\{", "{").replace(r"\}", "}"))
        object.__setattr__(self, "_pattern", re.compile(f"^{regex}$"))

    @property
    def path_params(self) -> tuple[str, ...]:
        """The template's parameters, in order (``sessionId``, ``requestId`` …)."""
        return tuple(_PARAM.findall(self.path))

    @property
    def rule(self) -> str:
        """The path as a Quart/Werkzeug rule: each ``{camelName}`` becomes ``<snake_name>``,
        the handler's argument."""
        return _PARAM.sub(lambda m: f"<{_snake(m.group(1))}>", self.path)

    def match(self, path: str) -> dict[str, str] | None:
        """The path parameters when ``path`` is this route's (each one non-empty segment),
        else None."""
        found = self._pattern.match(path)
        return None if found is None else found.groupdict()

    def session_id(self, path: str) -> str | None:
        """The session ``path`` names when it is this route's, else None."""
        found = self.match(path)
        return None if found is None else found.get("sessionId")

    def url(self, **values: str) -> str:
        """The path with each parameter filled in, percent-encoded (``/`` included)."""
        missing = set(self.path_params) - values.keys()
        if missing or values.keys() - set(self.path_params):
            raise TypeError(f"{self.operation_id} takes {self.path_params}, got {sorted(values)}")
        for name, value in values.items():
            if not value:
                raise ValueError(f"{name} must be a non-empty string")
        return _PARAM.sub(lambda m: quote(values[m.group(1)], safe=""), self.path)


# --- parameters ------------------------------------------------------------------------------

_STR: Final[JsonSchema] = {"type": "string"}
_SESSION_ID: Final = Param("sessionId", "path", _STR, "the daemon's session id")
_SESSION_GONE: Final[ErrorSpec] = (404, ("session_not_found",))
_IDEMPOTENCY_KEY: Final = Param(
    headers.IDEMPOTENCY_KEY, "header",
    {"type": "string", "pattern": wire.IDEMPOTENCY_KEY_PATTERN},
    "one value per logical prompt, the same on every retry of it (also accepted as a quoted "
    "string)")
_STREAM_PARAMS: Final = (
    Param("maxQueued", "query", {"type": "integer", "minimum": 16, "maximum": 2048},
          "live queue cap in frames (default 256)"),
    Param("lastEventId", "query", _STR, f"cursor when the {headers.LAST_EVENT_ID} header is "
          "absent"),
    Param("epoch", "query", _STR, f"epoch when the {headers.EVENT_EPOCH} header is absent"),
)
_SSE_SCHEMA: Final[JsonSchema] = {
    "type": "string",
    "description": "Server-Sent Events: `retry: 3000`, then one frame per event (`id:` line "
                   "when the event has an id, `event: <type>`, one `data:` line holding the "
                   "envelope), `: heartbeat` comments when quiet. The stream does not end "
                   "while the session lives.",
    "x-event-schema": {"$ref": SCHEMA_REF.format(name="DaemonEvent")},
}
_AGENT_START: Final[ErrorSpec] = (502, ("agent_start_failed", "agent_session_id_reused"))

# --- the routes ------------------------------------------------------------------------------

HEALTH: Final = Route("GET", "/health", "health", "Liveness probe", 200, wire.HealthResponse,
                      auth=False)
CAPABILITIES: Final = Route("GET", "/capabilities", "capabilities",
                            "Features and effective limits", 200, wire.CapabilitiesResponse)
DAEMON_STATUS: Final = Route(
    "GET", "/daemon/status", "daemonStatus",
    "Limits, transcript health, agents, server patches and per-session counts", 200,
    wire.DaemonStatusResponse)
LIST_SESSIONS: Final = Route(
    "GET", "/sessions", "listSessions",
    "One page of the sessions, loaded and unloaded, newest created first", 200,
    wire.SessionList,
    params=(Param("page", "query", {"$ref": SCHEMA_REF.format(name="SessionsQuery")},
                  "limit (sessions per page, default 100), cursor (nextCursor of the previous "
                  "page), workspace (an absolute path: only its sessions), state (running, "
                  "queued, idle or unloaded)", style="form"),),
    errors=((400, ("invalid_sessions_limit", "invalid_sessions_cursor",
                   "invalid_sessions_workspace", "invalid_sessions_state")),))
OPENAPI: Final = Route("GET", "/openapi.json", "openapi", "This document", 200, None,
                       response_schema={"type": "object"})
METRICS: Final = Route(
    "GET", "/metrics", "metrics",
    "Prometheus metrics in the text exposition format (sessions, subscribers, events, "
    "evictions, prompts, commit times, agents, transcript size)", 200, None,
    media_type="text/plain", response_schema={"type": "string"})
BACKUP: Final = Route(
    "POST", "/daemon/backup", "backupTranscript",
    "A consistent copy of the transcript database (an SQLite file), taken while the daemon "
    "runs without holding up its commits, and streamed once it is complete", 200, None,
    media_type="application/vnd.sqlite3", response_schema={"type": "string",
                                                           "format": "binary"},
    errors=((409, ("transcript_unavailable", "backup_running")), (500, ("backup_failed",))))
CREATE_SESSION: Final = Route(
    "POST", "/session", "createSession",
    "Create a session, or attach to the workspace's live one", 200,
    wire.CreateSessionResponse, body_type=wire.CreateSessionRequest,
    errors=((400, ("invalid_cwd", "invalid_session_id", "invalid_session_scope")),
            _AGENT_START),
    uses_client_id=True)
LOAD_SESSION: Final = Route(
    "POST", "/session/{sessionId}/load", "loadSession",
    "Snapshot: replay window and live journal (or a transcript page), plus the cursor",
    200, wire.LoadSessionResponse, params=(_SESSION_ID,),
    body_type=wire.LoadSessionRequest,
    errors=((400, ("invalid_cwd", "invalid_transcript_limit", "invalid_live_replay_mode")),
            _SESSION_GONE, _AGENT_START),
    uses_client_id=True)
RESUME_SESSION: Final = Route(
    "POST", "/session/{sessionId}/resume", "resumeSession",
    "Re-register the client; the cursor without the snapshot", 200,
    wire.ResumeSessionResponse, params=(_SESSION_ID,), body_type=wire.ResumeSessionRequest,
    errors=((400, ("invalid_cwd",)), _SESSION_GONE, _AGENT_START),
    uses_client_id=True)
PROMPT: Final = Route(
    "POST", "/session/{sessionId}/prompt", "prompt",
    "Admit a prompt (it runs FIFO; the outcome is a terminal event). With an "
    "Idempotency-Key, a repeated request is answered the first one's 202 body and "
    "admits nothing", 202,
    wire.PromptAccepted, params=(_SESSION_ID, _IDEMPOTENCY_KEY),
    body_type=wire.PromptRequest, body_required=True,
    errors=((400, ("invalid_prompt", "invalid_deadline_ms", "invalid_idempotency_key")),
            _SESSION_GONE, (409, ("idempotency_key_reused",)),
            (503, ("prompt_queue_full",))),
    uses_client_id=True)
PROMPT_BY_KEY: Final = Route(
    "GET", "/session/{sessionId}/prompts/{idempotencyKey}", "promptByKey",
    "Whether a prompt was admitted with this Idempotency-Key, its 202 body and how far "
    "it got", 200, wire.PromptByKeyResponse,
    params=(_SESSION_ID, Param("idempotencyKey", "path",
                               {"type": "string", "pattern": wire.IDEMPOTENCY_KEY_PATTERN},
                               "the Idempotency-Key the prompt was sent with")),
    errors=((400, ("invalid_idempotency_key",)),
            (404, ("session_not_found", "prompt_not_found"))))
CANCEL: Final = Route("POST", "/session/{sessionId}/cancel", "cancel",
                      "Cancel the running prompt", 204, None, params=(_SESSION_ID,),
                      errors=(_SESSION_GONE,), uses_client_id=True)
VOTE_PERMISSION: Final = Route(
    "POST", "/session/{sessionId}/permission/{requestId}", "votePermission",
    "Answer a pending permission request", 200, wire.PermissionVoteResponse,
    params=(_SESSION_ID, Param("requestId", "path", _STR, "the permission request id")),
    body_type=wire.PermissionVoteRequest, body_required=True,
    errors=((400, ("invalid_permission_vote", "invalid_permission_option")),
            (404, ("session_not_found", "permission_not_found"))))
EVENTS: Final = Route(
    "GET", "/session/{sessionId}/events", "events",
    "Server-Sent Events: resume from a cursor, then live frames", 200, None,
    media_type="text/event-stream", response_schema=_SSE_SCHEMA,
    params=(_SESSION_ID,
            Param(headers.LAST_EVENT_ID, "header", _STR, "resume cursor (decimal, >= 0)"),
            Param(headers.EVENT_EPOCH, "header", _STR, "the epoch the cursor belongs to"),
            *_STREAM_PARAMS,
            Param("snapshot", "query", _STR, "observability only"),
            Param("connectReason", "query", _STR, "observability only"),
            Param("previousStreamId", "query", _STR, "observability only")),
    errors=((400, ("invalid_max_queued",)), _SESSION_GONE,
            (429, ("subscriber_limit_exceeded",))),
    streams=True)
EVENTS_WS: Final = Route(
    "GET", "/session/{sessionId}/ws", "eventsWebSocket",
    "WebSocket upgrade carrying the same envelopes as JSON text messages", 101, None,
    params=(_SESSION_ID, *_STREAM_PARAMS),
    errors=((400, ("invalid_max_queued",)), _SESSION_GONE,
            (426, ("upgrade_required",)), (429, ("subscriber_limit_exceeded",))),
    streams=True)
TRANSCRIPT: Final = Route(
    "GET", "/session/{sessionId}/transcript", "transcript",
    "One page of the durable transcript, newest first page", 200, wire.TranscriptPage,
    params=(_SESSION_ID,
            # One exploded object (limit=..&cursor=..): the schema can then say that
            # cursor and beforeRecordId exclude each other.
            Param("page", "query", {"$ref": SCHEMA_REF.format(name="TranscriptQuery")},
                  "limit (records per page), and at most one of cursor (nextCursor of "
                  "the previous page) and beforeRecordId (records older than this one); "
                  "both → 400 invalid_transcript_cursor", style="form")),
    errors=((400, ("invalid_transcript_limit", "invalid_transcript_cursor")),
            _SESSION_GONE))
EXPORT_SESSION: Final = Route(
    "GET", "/session/{sessionId}/export", "exportSession",
    "The whole transcript, oldest first, streamed: JSON Lines (one event envelope a line, as "
    "transcript pages hold them) or Markdown; a stored session need not be loaded", 200, None,
    media_type="application/x-ndjson", other_media_types=("text/markdown",),
    response_schema={"type": "string"},
    params=(_SESSION_ID, Param("format", "query", {"enum": ["jsonl", "markdown"]},
                               "jsonl (default) or markdown (text/markdown)")),
    errors=((400, ("invalid_export_format",)), _SESSION_GONE,
            (409, ("transcript_unavailable",))))
SESSION_STATUS: Final = Route(
    "GET", "/session/{sessionId}/status", "sessionStatus",
    "Prompt, cursor, durability and journal state of one session", 200,
    wire.SessionStatusResponse, params=(_SESSION_ID,), errors=(_SESSION_GONE,))
DETACH: Final = Route("POST", "/session/{sessionId}/detach", "detach", "Unregister the client",
                      204, None, params=(_SESSION_ID,), errors=(_SESSION_GONE,),
                      uses_client_id=True)
HEARTBEAT: Final = Route("POST", "/session/{sessionId}/heartbeat", "heartbeat", "Keep-alive",
                         200, wire.HeartbeatResponse, params=(_SESSION_ID,),
                         errors=(_SESSION_GONE,))
DELETE_SESSION: Final = Route(
    "DELETE", "/session/{sessionId}", "deleteSession",
    "Close the session (a running prompt ends with turn_error session_closed)", 204, None,
    params=(_SESSION_ID,), errors=(_SESSION_GONE,))

#: Every route a client may call, in the order the OpenAPI document lists them.
ROUTES: Final[tuple[Route, ...]] = (
    HEALTH, CAPABILITIES, DAEMON_STATUS, LIST_SESSIONS, OPENAPI, METRICS, BACKUP,
    CREATE_SESSION, LOAD_SESSION, RESUME_SESSION, PROMPT, PROMPT_BY_KEY, CANCEL, VOTE_PERMISSION,
    EVENTS, EVENTS_WS,
    TRANSCRIPT, EXPORT_SESSION, SESSION_STATUS, DETACH, HEARTBEAT, DELETE_SESSION,
)

#: Between the nodes of a cluster, never a client's (not in the OpenAPI document): a node asks
#: its own ``--node-url`` for a nonce only it knows (headers.CLUSTER_PROBE), to prove the URL
#: reaches itself.
NODE_PROBE: Final = Route("GET", "/cluster/probe", "nodeProbe", "A node's check of its own URL",
                          204, None)

_SESSION_ROUTES: Final = tuple(route for route in ROUTES if "sessionId" in route.path_params)


def session_of(path: str) -> str | None:
    """The session a request path is for (the ``sessionId`` of the route it names), or None
    for a path that names no session's route."""
    for route in _SESSION_ROUTES:
        session_id = route.session_id(path)
        if session_id is not None:
            return session_id
    return None
