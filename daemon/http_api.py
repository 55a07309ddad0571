"""The JSON routes (sessions, prompts, permissions, load, transcript, status) as a Quart-Trio app (the SSE and WebSocket routes live in
``streams``; Host/Origin/auth run before either, in ``asgi``).

Every error the application produces is ``{error, code, ...details}``. Request bodies are
checked by converting them to their ``sdk.protocol.http`` types (the same types
``/openapi.json`` is generated from); a field that fails its type answers that field's 400.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Awaitable, Callable, Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec
import trio
from quart import Response, request

from sdk.protocol import headers, routes
from sdk.protocol import http as wire

from . import bridge
from .clock import now_ms
from .config import MAX_PENDING_PROMPTS, DaemonConfig
from .core.json_codec import decode_json, encode_json
from .manager import (
    SESSION_LIMIT_RETRY_AFTER_S,
    AgentSessionConflict,
    AgentUnavailable,
    InvalidWorkspace,
    SessionLimit,
    SessionManager,
)
from .session_list import InvalidListQuery, list_page, status_sessions, totals
from .transcript_store import InvalidCursor, TranscriptDamaged
from .transcript_writer import TranscriptWriter
from .workspace_git import branches

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from .core.idempotency import KeyedAdmission
    from .session import Session

log = logging.getLogger("daemon.http")

MAX_BODY_BYTES = 10 * 1024 * 1024
CLIENT_ID_RE = re.compile(wire.CLIENT_ID_PATTERN)
FEATURES = [
    "session_create", "session_load", "session_resume", "session_prompt", "session_cancel",
    "session_events_sse", "session_events_ws", "session_transcript_pagination",
    "live_journal_truncation_marker", "live_journal_prompt_id", "permission_vote",
    "prompt_queue", "session_status", "prompt_idempotency_key",
]


Handler = Callable[..., Awaitable[Response]]


class ApiError(Exception):
    """An error answer: ``status`` and the protocol's :class:`~sdk.protocol.http.ErrorBody`
    (``details`` by its field names: ``session_id=``, ``limit=`` …)."""

    def __init__(self, status: int, code: str, error: str, headers: dict[str, str] | None = None,
                 **details: Any) -> None:
        self.__init_body(status, wire.error_body(code, error, **details), headers)

    def __init_body(self, status: int, body: wire.ErrorBody,
                    headers: dict[str, str] | None) -> None:
        super().__init__(body.error)
        self.status = status
        self.body = body
        self.headers = headers or {}

    @classmethod
    def of(cls, status: int, body: wire.ErrorBody,
           headers: dict[str, str] | None = None) -> ApiError:
        """The answer of a body the protocol builds (``wire.session_not_found(...)`` …)."""
        error = cls.__new__(cls)
        error.__init_body(status, body, headers)
        return error


# A body with spliced lists at least this big is written part by part (``bridge.PartsBody``);
# smaller ones are joined. Runs of small parts are joined into writes of about WRITE_BYTES.
SPLICED_WRITE_MIN_BYTES = 1024 * 1024
WRITE_BYTES = 256 * 1024


def spliced_body(body: msgspec.Struct) -> list[bytes]:
    """The bytes of a response Struct with lists of envelope bytes (``spliced_parts``), as the
    writes that send it: one joined body when small, else the parts grouped by
    ``write_groups`` (the large envelopes as they are, the small pieces between them joined)."""
    # The envelope's module (and the event types with it) loads with the first such answer,
    # not with the routes: a daemon with no session yet has no envelope to splice.
    from .core.envelope import spliced_parts, write_groups

    parts = spliced_parts(body)
    if sum(map(len, parts)) < SPLICED_WRITE_MIN_BYTES:
        return [b"".join(parts)]
    return write_groups(parts, WRITE_BYTES)


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    if isinstance(body, bytes):
        resp = Response(body, status=status, content_type="application/json")
    elif isinstance(body, wire.LoadSessionResponse | wire.TranscriptPage):
        writes = spliced_body(body)
        if len(writes) == 1:
            resp = Response(writes[0], status=status, content_type="application/json")
        else:
            resp = Response(bridge.PartsBody(writes), status=status, content_type="application/json")
            resp.headers["Content-Length"] = str(sum(map(len, writes)))
    else:
        resp = Response(encode_json(body), status=status, content_type="application/json")
    for key, value in (headers or {}).items():
        resp.headers[key] = value
    return resp


def session_not_found(session_id: str) -> ApiError:
    return ApiError.of(404, wire.session_not_found(session_id))


async def read_json_object() -> dict[str, Any]:
    raw = await request.get_data(cache=False)
    if not isinstance(raw, bytes):
        raw = raw.encode()
    if len(raw) > MAX_BODY_BYTES:
        raise ApiError.of(413, wire.body_too_large())
    if not raw.strip():
        return {}
    try:
        body = decode_json(raw)
    except (msgspec.DecodeError, UnicodeDecodeError, ValueError, RecursionError):
        raise ApiError(400, "invalid_json", "Invalid JSON in request body") from None
    if not isinstance(body, dict):
        raise ApiError(400, "invalid_json", "Request body must be a JSON object")
    return body


# The ``error`` text of each 400 a request body's type can fail with.
REQUEST_ERROR_TEXT = {
    "invalid_cwd": "cwd must be an absolute path",
    "invalid_session_id": "sessionId must be a UUID",
    "invalid_session_scope": 'sessionScope must be "single" or "thread"',
    "invalid_transcript_limit": "historyPageSize must be an integer between 1 and 500",
    "invalid_live_replay_mode": 'liveReplayMode must be "full" or "summary"',
    "invalid_prompt": "prompt must be a non-empty array of content blocks",
    "invalid_deadline_ms": "deadlineMs must be an integer between 1 and 86400000",
    "invalid_permission_vote": 'Body must be {"optionId": string} or {"outcome": "cancelled"}',
    "invalid_idempotency_key": "Idempotency-Key must be 1-128 of letters, digits and _ . : ~ -",
}
BodyT = TypeVar("BodyT", bound=msgspec.Struct)


def parse_body(body: dict[str, Any], kind: type[BodyT]) -> BodyT:
    """``body`` as its protocol type; a field that fails its type answers that field's 400."""
    try:
        return wire.convert_request(body, kind)
    except msgspec.ValidationError as exc:
        code = wire.request_error_code(exc) or "invalid_json"
        raise ApiError(400, code, REQUEST_ERROR_TEXT.get(code, "Invalid request body")) from None


def header_client_id() -> str | None:
    value = request.headers.get(headers.CLIENT_ID)
    if value is None:
        return None
    if not CLIENT_ID_RE.fullmatch(value):
        raise ApiError(400, "invalid_client_id", f"Invalid {headers.CLIENT_ID} header")
    return value


def transcript_health(writer: TranscriptWriter | None) -> wire.TranscriptHealth:
    """The ``transcript`` member of ``GET /daemon/status``."""
    if writer is None:
        return wire.TranscriptHealth(enabled=False, degraded=False, failed_sessions=[],
                                     last_error=None, damaged_sessions=[], damage=[],
                                     check=wire.TranscriptCheck(quick="off", full="off"))
    damaged = writer.store_damaged or bool(writer.damaged_sessions)
    return wire.TranscriptHealth(
        enabled=True,
        degraded=writer.degraded or damaged,
        failed_sessions=sorted(writer.failed_sessions),
        last_error=writer.last_error,
        damaged_sessions=sorted(writer.damaged_sessions),
        damage=list(writer.damage),
        check=wire.TranscriptCheck(quick=writer.quick_check, full=writer.full_check),
    )


_PROGRESS: dict[str, wire.PromptProgress] = {
    "completed": "completed", "cancelled": "cancelled", "error": "error",
    "interrupted": "interrupted", "running": "running", "queued": "queued"}


def prompt_by_key_body(session_id: str, key: str, admission: KeyedAdmission, state: str, *,
                       stop_reason: str | None = None, admitted_at: int | None = None,
                       ended_at: int | None = None) -> wire.PromptByKeyResponse:
    accepted = admission.accepted
    admitted = admitted_at if admitted_at is not None else admission.admitted_at
    return wire.PromptByKeyResponse(
        v=1, session_id=session_id, idempotency_key=key, prompt_id=accepted.prompt_id,
        last_event_id=accepted.last_event_id, event_epoch=accepted.event_epoch,
        state=_PROGRESS[state],
        stop_reason=stop_reason if stop_reason is not None else msgspec.UNSET,
        admitted_at=admitted if admitted is not None else msgspec.UNSET,
        ended_at=ended_at if ended_at is not None else msgspec.UNSET)


def header_idempotency_key() -> str | None:
    value = request.headers.get(headers.IDEMPOTENCY_KEY)
    if value is None:
        return None
    key = wire.parse_idempotency_key(value)
    if key is None:
        raise ApiError(400, "invalid_idempotency_key",
                       REQUEST_ERROR_TEXT["invalid_idempotency_key"])
    return key


def metrics_registry(manager: SessionManager) -> CollectorRegistry:
    """The daemon's metrics: its collector (with cluster mode's, once a node is attached).
    Loads the Prometheus client library (the first scrape does)."""
    from .metrics_exposition import DaemonCollector, build_registry

    def cluster() -> tuple[int, int] | None:
        stats = manager.cluster_stats
        return stats() if stats is not None else None

    def transcript() -> Path | None:
        writer = manager.writer
        return Path(writer.store.path) if writer is not None else None

    return build_registry(DaemonCollector(manager, transcript,
                                          lambda: bridge.connection_gate.served, cluster))


def create_app(config: DaemonConfig, manager: SessionManager) -> bridge.JsonErrorsQuart:
    # No static folder: the daemon serves no files, and Quart's default /static/<path> rule
    # would be an undocumented file-serving route.
    app = bridge.JsonErrorsQuart("daemon", static_folder=None)
    # Werkzeug would answer "/session//load" with a 308 and an HTML body; an empty path segment
    # is simply a route that does not exist.
    app.url_map.merge_slashes = False
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES
    app.config["PROVIDE_AUTOMATIC_OPTIONS"] = False

    def serve(route: routes.Route) -> Callable[[Handler], Handler]:
        """Register a handler for ``route`` (its method and path, from the protocol's table)."""
        return app.route(route.rule, methods=[route.method])

    async def brought(session_id: str,
                      find: Callable[[str], Awaitable[Session | None]]) -> Session:
        try:
            session = await find(session_id)
        except AgentSessionConflict as exc:
            raise ApiError(502, "agent_session_id_reused", f"Agent session conflict: {exc}") \
                from None
        except AgentUnavailable as exc:
            raise ApiError(502, "agent_start_failed", f"Agent failed to start: {exc}") from None
        if session is None:
            raise session_not_found(session_id)
        return session

    async def live_session(session_id: str) -> Session:
        """A live session; one unloaded when idle is restored first, as load would."""
        return await brought(session_id, manager.live)

    async def live_or_restored(session_id: str) -> Session:
        """Load and resume (and only they) bring any persisted session back."""
        return await brought(session_id, manager.restore)

    @app.errorhandler(ApiError)
    async def on_api_error(exc: ApiError) -> Response:
        return json_response(exc.body, exc.status, exc.headers)

    @app.errorhandler(SessionLimit)
    async def on_session_limit(exc: SessionLimit) -> Response:
        # Attaching to a loaded session still works; a new or restored one waits for a slot.
        return json_response(wire.error_body("session_limit", str(exc), limit=exc.limit), 503,
                             {headers.RETRY_AFTER: str(SESSION_LIMIT_RETRY_AFTER_S)})

    async def on_http_error(status: int, description: str | None,
                            allowed: Collection[str] | None) -> Response:
        if status == 404:
            return json_response(wire.route_not_found(), 404)
        if status == 405:
            return json_response(wire.method_not_allowed(), 405,
                                 {"Allow": ", ".join(sorted(allowed or ()))})
        if status == 413:
            return json_response(wire.body_too_large(), 413)
        return json_response(wire.error_body("http_error", description or "HTTP error"),
                             status)

    app.http_error_handler = on_http_error

    @app.errorhandler(TranscriptDamaged)
    async def on_damaged(exc: TranscriptDamaged) -> Response:
        # Found, not served: the one answer a read of damaged history gets (what the daemon
        # found is logged once and listed by GET /daemon/status).
        details: dict[str, Any] = {}
        if exc.session_id is not None:
            details["session_id"] = exc.session_id
        return json_response(wire.error_body(
            "transcript_damaged",
            "The transcript is damaged where this request reads it; nothing of it is served. "
            "GET /daemon/status lists the damage; stop the daemon and run it with --recover "
            "to keep what is intact", **details), 500)

    @app.errorhandler(Exception)
    async def on_internal(exc: Exception) -> Response:
        log.exception("event=internal_error path=%s", request.path)
        return json_response(wire.error_body("internal_error", "Internal server error"), 500)

    # Built at the first request: its schemas, the backup and the export code are imported
    # there too, so that a plain start does not pay for what only those routes use.
    openapi_document: list[bytes] = []

    limits = wire.Limits(
        max_journal_events=config.max_journal_events,
        max_journal_bytes=config.max_journal_bytes,
        compacted_replay_max_bytes=config.compacted_replay_max_bytes,
        event_ring_size=config.event_ring_size,
        event_ring_bytes=config.event_ring_bytes,
        agent_idle_ms=config.agent_idle_ms,
        session_restore_timeout_ms=config.agent_init_timeout_ms,
        max_pending_prompts=MAX_PENDING_PROMPTS,
        max_subscribers_per_session=64,
        max_request_body_bytes=MAX_BODY_BYTES,
        max_sessions=config.max_sessions,
        max_connections=config.max_connections,
    )
    health_body = encode_json(wire.HealthResponse(status="ok"))

    @serve(routes.HEALTH)
    async def health() -> Response:
        return json_response(health_body)

    @serve(routes.OPENAPI)
    async def openapi() -> Response:
        if not openapi_document:
            from .core.openapi import build_openapi

            openapi_document.append(encode_json(build_openapi()))
        return json_response(openapi_document[0])

    @serve(routes.CAPABILITIES)
    async def capabilities() -> Response:
        return json_response(wire.CapabilitiesResponse(v=1, mode="http-bridge", features=FEATURES,
                                                       limits=limits))

    metrics: list[CollectorRegistry] = []  # made at the first scrape

    @serve(routes.METRICS)
    async def metrics_route() -> Response:
        from .metrics_exposition import CONTENT_TYPE, exposition

        if not metrics:
            metrics.append(metrics_registry(manager))
        return Response(exposition(metrics[0]), status=200,
                        headers={"Content-Type": CONTENT_TYPE,
                                 "Cache-Control": "no-store"})

    backing_up = trio.Lock()

    @serve(routes.BACKUP)
    async def backup_route() -> Response:
        from .backup import BackupFailed, file_body, take_backup

        writer = manager.writer
        if writer is None:
            raise ApiError(409, "transcript_unavailable",
                           "The daemon runs without a transcript (--no-persistence): there is "
                           "nothing to back up")
        if backing_up.locked():
            raise ApiError(409, "backup_running", "A backup is being taken; try again once "
                           "it is done")
        async with backing_up:
            try:
                handle, size = await take_backup(writer, config.data_dir)
            except BackupFailed as exc:
                log.error("event=backup_failed error=%r", str(exc))
                raise ApiError(500, "backup_failed", f"The backup failed: {exc}") from None
        return Response(file_body(handle), status=200, headers={
            "Content-Type": routes.BACKUP.media_type, "Content-Length": str(size),
            "Cache-Control": "no-store",
            "Content-Disposition": 'attachment; filename="transcript.sqlite3"'})

    @serve(routes.DAEMON_STATUS)
    async def daemon_status() -> Response:
        listed = status_sessions(manager)
        git = await branches([config.workspace, *(session.workspace_cwd for session in listed)])
        writer = manager.writer
        patches = bridge.status()
        return json_response(wire.DaemonStatusResponse(
            v=1,
            limits=limits,
            persistence=writer is not None,
            transcript=transcript_health(writer),
            agents=[wire.AgentInfo(workspace_cwd=cwd, pid=agent.pid)
                    for cwd, agent in manager.agents.items()],
            agents_reaped=manager.agents_reaped,
            restore_locks=manager.restore_lock_count,
            known_clients=len(manager.clients),
            server=wire.ServerPatches(ws_keepalive=patches.ws_keepalive,
                                      connection_registry=patches.connection_registry,
                                      ws_limits=patches.ws_limits,
                                      http2_flow_control=patches.http2_flow_control,
                                      hypercorn_version=patches.hypercorn_version),
            live_sessions=manager.live_count,
            approval_mode=config.approval_mode,
            default_workspace=wire.WorkspaceInfo(workspace_cwd=config.workspace,
                                                 git_branch=git[config.workspace]),
            connections=wire.ConnectionCounts(open=bridge.connection_gate.served,
                                              reserve=bridge.connection_gate.reserved,
                                              refused=bridge.connection_gate.refused),
            sessions=manager.status(git, listed),
            sessions_truncated=len(listed) < manager.live_count,
            totals=totals(manager),
        ))

    @serve(routes.LIST_SESSIONS)
    async def list_sessions() -> Response:
        try:
            return json_response(await list_page(manager, dict(request.args)))
        except InvalidListQuery as exc:
            raise ApiError(400, exc.code, str(exc)) from None

    @serve(routes.CREATE_SESSION)
    async def create_session() -> Response:
        hint = header_client_id()
        req = parse_body(await read_json_object(), wire.CreateSessionRequest)
        cwd = req.cwd if req.cwd is not None else config.workspace
        # The type's pattern admits exactly the hyphenated form; the id is kept lower-case.
        session_id = str(uuid.UUID(req.session_id)) if req.session_id is not None else None
        try:
            session, attached, client_id = await manager.create(cwd, session_id,
                                                                req.session_scope, hint)
        except InvalidWorkspace as exc:
            raise ApiError(400, "invalid_cwd", f"Invalid workspace directory: {exc}",
                           cwd=cwd) from None
        except AgentSessionConflict as exc:
            raise ApiError(502, "agent_session_id_reused", f"Agent session conflict: {exc}") \
                from None
        except AgentUnavailable as exc:
            raise ApiError(502, "agent_start_failed", f"Agent failed to start: {exc}") from None
        return json_response(wire.CreateSessionResponse(
            session_id=session.id, workspace_cwd=session.workspace_cwd, attached=attached,
            client_id=client_id, created_at=session.created_at, event_epoch=session.bus.epoch))

    @serve(routes.LOAD_SESSION)
    async def load_session(session_id: str) -> Response:
        hint = header_client_id()
        body = await read_json_object()
        session = await live_or_restored(session_id)
        await session.terminal_settled()
        req = parse_body(body, wire.LoadSessionRequest)
        page_size, mode = req.history_page_size, req.live_replay_mode
        client_id = manager.register_client(session, hint)
        terminals = list(session.terminals)
        bus = session.bus
        has_active_prompt = session.active is not None
        writer = manager.writer
        live: list[bytes] = []
        history_has_more: bool | msgspec.UnsetType = msgspec.UNSET
        anchor: str | msgspec.UnsetType = msgspec.UNSET
        if page_size is not None and session.active is None and writer is not None \
                and not bus.transcript_degraded and not bus.transcript_damaged:
            last_event_id, epoch = bus.ring.last_id, bus.epoch
            size = page_size
            page = await writer.read(lambda store: store.page(session_id, limit=size),
                                     session_id=session_id)
            compacted = page.events
            history_has_more = page.has_more
        else:
            snap = bus.load_snapshot(mode)
            last_event_id, epoch = snap.last_event_id, snap.epoch
            has_active_prompt = session.active is not None
            live = snap.live
            if bus.window.truncated_events > 0:
                history_has_more = True
            oldest = bus.window.oldest_record_id
            if oldest is not None and (bus.window.truncated_events > 0
                                       or bus.journals.full.truncated_events > 0):
                anchor = oldest
            # An over-cap turn is read back from the transcript here, after the snapshot.
            from .load_snapshot import resolve_compacted

            compacted = await resolve_compacted(snap, bus.writer, bus.session_id)
        # The envelopes are spliced in as published (json_response: spliced_parts).
        return json_response(wire.LoadSessionResponse[bytes](
            session_id=session.id, workspace_cwd=session.workspace_cwd, attached=True,
            client_id=client_id, created_at=session.created_at, state={},
            has_active_prompt=has_active_prompt, has_running_background_tasks=False,
            history_has_more=history_has_more, history_anchor_record_id=anchor,
            last_event_id=last_event_id, event_epoch=epoch,
            replay_degraded=True if bus.degraded else msgspec.UNSET,
            prompt_terminals=terminals if terminals else msgspec.UNSET,
            agent_session_restored=session.agent_session_restored,
            live_journal=live, compacted_replay=compacted))

    @serve(routes.RESUME_SESSION)
    async def resume_session(session_id: str) -> Response:
        hint = header_client_id()
        body = await read_json_object()
        session = await live_or_restored(session_id)
        parse_body(body, wire.ResumeSessionRequest)
        client_id = manager.register_client(session, hint)
        return json_response(wire.ResumeSessionResponse(
            session_id=session.id, workspace_cwd=session.workspace_cwd, attached=True,
            client_id=client_id, created_at=session.created_at, state={},
            has_active_prompt=session.active is not None,
            has_running_background_tasks=False,
            last_event_id=session.bus.ring.last_id, event_epoch=session.bus.epoch))

    def registered_client(session: Session) -> str | None:
        client_id = header_client_id()
        if client_id is not None and not manager.clients.is_registered(session.id, client_id):
            raise ApiError(400, "invalid_client_id",
                           f"Client {client_id} is not registered for this session")
        return client_id

    @serve(routes.PROMPT)
    async def prompt(session_id: str) -> Response:
        # Keyed prompts' rules load with the first prompt, as the session's machinery does.
        from .core.idempotency import Conflict, Replay, decide, request_digest
        from .session import PromptQueueFull

        key = header_idempotency_key()
        body = await read_json_object()
        session = await live_session(session_id)
        client_id = registered_client(session)
        req = parse_body(body, wire.PromptRequest)
        # Checked by the type; forwarded to the agent as sent (every field of every block).
        sent = wire.view_prompt_blocks(body)
        blocks: list[dict[str, Any]] = sent if sent is not None else []
        digest = None
        if key is not None:
            digest = request_digest(body)
            earlier = decide(await session.find_keyed(key), digest)
            if isinstance(earlier, Conflict):
                raise ApiError(409, "idempotency_key_reused",
                               "This Idempotency-Key was used for a different prompt request "
                               "on this session", idempotency_key=key,
                               prompt_id=earlier.prompt_id)
            if isinstance(earlier, Replay):
                # The admission it repeats is acknowledged as that 202 was: once it is durable
                # (in cluster mode: in Redis, else 503 as for the first request).
                await acknowledge_admission(session, earlier.accepted.prompt_id)
                return json_response(earlier.accepted, 202,
                                     {headers.IDEMPOTENT_REPLAYED: "true"})
            if not session.live:  # it ended while its ledger was read
                raise session_not_found(session_id)
        # No checkpoint from the key's lookup to here: a request with the same key that comes
        # meanwhile finds this admission (Session.find_keyed).
        try:
            accepted = session.admit(blocks, client_id, req.deadline_ms, key=key,
                                     digest=digest)
        except PromptQueueFull as exc:
            raise ApiError(503, "prompt_queue_full", "Prompt queue is full",
                           {headers.RETRY_AFTER: "5"}, limit=MAX_PENDING_PROMPTS,
                           pending_count=exc.pending) from None
        # The 202 is a promise that survives a crash: it goes out once the admission (the
        # ledger's in_flight row, and for a queued prompt its pending_prompt_added event) is
        # committed, so a restart ends this prompt with a terminal, at worst "interrupted".
        # The prompt is already queued and running meanwhile: this costs the reply one commit
        # (the writer stops gathering while someone waits), never the turn's first token.
        await acknowledge_admission(session, accepted.prompt_id)
        return json_response(accepted, 202)

    async def acknowledge_admission(session: Session, prompt_id: str) -> None:
        """Wait until the admission just made (or repeated) may be acknowledged. In cluster
        mode an admission Redis did not take in time (this node lost the session, or Redis is
        away) is not acknowledged: 503, the prompt never runs, and the client asks again."""
        if not await session.wait_admitted(prompt_id):
            retry_s = max(1, round(manager.config.lease_ms / 1000))
            raise ApiError(503, "session_owner_unavailable",
                           "The prompt's admission did not reach the cluster's Redis in time "
                           "(this node may have lost the session); retry",
                           {headers.RETRY_AFTER: str(retry_s)}, session_id=session.id,
                           retryable=True, retry_after_ms=retry_s * 1000)

    @serve(routes.PROMPT_BY_KEY)
    async def prompt_by_key(session_id: str, idempotency_key: str) -> Response:
        key = idempotency_key
        if wire.parse_idempotency_key(key) != key:
            raise ApiError(400, "invalid_idempotency_key",
                           REQUEST_ERROR_TEXT["invalid_idempotency_key"])
        found = await find_prompt(session_id, key)
        if found is None:
            raise ApiError(404, "prompt_not_found",
                           f'No prompt of session "{session_id}" was admitted with '
                           f'Idempotency-Key "{key}"', session_id=session_id,
                           idempotency_key=key)
        return json_response(found)

    async def find_prompt(session_id: str, key: str) -> wire.PromptByKeyResponse | None:
        """The prompt admitted with ``key``, from the live session when there is one, else
        from the ledger (a session not restored since the daemon stopped: a prompt still in
        flight there was interrupted)."""
        writer = manager.writer
        session = manager.get(session_id)
        admission: KeyedAdmission | None = None
        if session is not None:
            admission = await session.find_keyed(key)
            if admission is None:
                return None
            accepted = admission.accepted
            state = session.prompt_state(accepted.prompt_id)
            if state is not None:
                return prompt_by_key_body(session_id, key, admission, state)
            ended = session.keyed_ends.get(accepted.prompt_id)
            if ended is not None or writer is None:
                if ended is None:
                    return None
                return prompt_by_key_body(session_id, key, admission, ended[0],
                                          stop_reason=ended[1], ended_at=ended[2])
        if writer is None:
            raise session_not_found(session_id)
        row_session, row = await writer.read(lambda store: (
            store.get_session(session_id), store.find_keyed_prompt(session_id, key)),
            session_id=session_id)
        if row_session is None or row_session.closed:
            raise session_not_found(session_id)
        if row is None:
            return None
        if admission is None:
            from .core.idempotency import KeyedAdmission  # a session not loaded since a start

            admission = KeyedAdmission(key, row.request_digest, wire.PromptAccepted(
                prompt_id=row.prompt_id, last_event_id=row.accepted_event_id,
                event_epoch=row.accepted_epoch))
        state = row.state
        if state == "in_flight":
            # Live: between its end on the bus and the ledger's terminal; else the daemon
            # stopped while it was in flight.
            state = "running" if session is not None else "interrupted"
        return prompt_by_key_body(session_id, key, admission, state,
                                  stop_reason=row.stop_reason, admitted_at=row.admitted_at_ms,
                                  ended_at=row.ended_at_ms)

    @serve(routes.CANCEL)
    async def cancel(session_id: str) -> Response:
        session = await live_session(session_id)
        client_id = registered_client(session)
        await session.cancel(client_id)
        return Response(b"", status=204)

    @serve(routes.VOTE_PERMISSION)
    async def vote(session_id: str, request_id: str) -> Response:
        body = await read_json_object()
        session = await live_session(session_id)
        outcome = wire.vote_outcome(parse_body(body, wire.PermissionVoteRequest))
        if outcome is None:
            raise ApiError(400, "invalid_permission_vote",
                           REQUEST_ERROR_TEXT["invalid_permission_vote"])
        from .session import VoteResult

        voted = session.vote(request_id, outcome)
        if voted is VoteResult.NOT_FOUND:
            raise ApiError(404, "permission_not_found",
                           f'No pending permission request "{request_id}"',
                           request_id=request_id)
        if voted is VoteResult.UNKNOWN_OPTION:
            raise ApiError(400, "invalid_permission_option",
                           "optionId is not one of the options the agent offered",
                           request_id=request_id)
        return json_response(wire.PermissionVoteResponse(request_id=request_id, outcome=outcome))

    @serve(routes.TRANSCRIPT)
    async def transcript(session_id: str) -> Response:
        session = await live_session(session_id)
        args = request.args
        limit_raw = args.get("limit")
        limit = wire.DEFAULT_TRANSCRIPT_LIMIT
        if limit_raw is not None:
            # isascii: str.isdigit() also accepts digits int() refuses ("²"); the length
            # bound keeps int() clear of its 4300-digit limit.
            if not (limit_raw.isascii() and limit_raw.isdigit() and len(limit_raw) <= 64) \
                    or not 1 <= int(limit_raw) <= wire.MAX_PAGE_SIZE:
                raise ApiError(400, "invalid_transcript_limit",
                               "limit must be an integer between 1 and 500")
            limit = int(limit_raw)
        try:
            given = {name: args[name] for name in ("cursor", "beforeRecordId") if name in args}
            query = msgspec.convert({"limit": limit, **given}, wire.TranscriptQuery)
        except msgspec.ValidationError as exc:
            both = wire.request_error_code(exc) is None  # the type's rule, not one field
            raise ApiError(400, "invalid_transcript_cursor",
                           "Pass either cursor or beforeRecordId, not both" if both
                           else "Unknown transcript cursor or record id") from None
        cursor = query.cursor if isinstance(query.cursor, str) else None
        before = query.before_record_id if isinstance(query.before_record_id, str) else None
        writer = manager.writer
        if writer is None:
            return json_response(wire.TranscriptPage[bytes](session_id=session.id,
                                                            has_more=False, events=[]))
        try:
            page = await writer.read(lambda store: store.page(
                session.id, limit=limit, cursor=cursor, before_record_id=before),
                session_id=session.id)
        except InvalidCursor:
            raise ApiError(400, "invalid_transcript_cursor",
                           "Unknown transcript cursor or record id") from None
        return json_response(wire.TranscriptPage[bytes](
            session_id=session.id, has_more=page.has_more,
            next_cursor=page.next_cursor if page.next_cursor is not None else msgspec.UNSET,
            events=page.events))

    @serve(routes.EXPORT_SESSION)
    async def export(session_id: str) -> Response:
        from .export import CONTENT_TYPES as EXPORT_CONTENT_TYPES
        from .export import EXPORT_FORMATS, export_body

        fmt = request.args.get("format", "jsonl")
        if fmt not in EXPORT_FORMATS:
            raise ApiError(400, "invalid_export_format",
                           f"format must be one of {', '.join(EXPORT_FORMATS)}")
        writer = manager.writer
        live = manager.get(session_id)
        if writer is None:
            if live is None:
                raise session_not_found(session_id)
            raise ApiError(409, "transcript_unavailable",
                           "The daemon runs without a transcript (--no-persistence): there is "
                           "nothing to export")
        if live is None:
            row = await writer.read(lambda store: store.get_session(session_id))
            if row is None or row.closed:
                raise session_not_found(session_id)
            cwd = row.workspace_cwd
        else:
            cwd = live.workspace_cwd
        name = f"session-{session_id}.{'md' if fmt == 'markdown' else 'jsonl'}"
        return Response(export_body(writer, session_id, fmt, cwd), status=200, headers={
            "Content-Type": EXPORT_CONTENT_TYPES[fmt], "Cache-Control": "no-store",
            "Content-Disposition": f'attachment; filename="{name}"'})

    @serve(routes.SESSION_STATUS)
    async def status(session_id: str) -> Response:
        session = await live_session(session_id)
        bus = session.bus
        journal = bus.journals.full
        subscribers = len(bus.subscribers)
        by_node: dict[str, int] | msgspec.UnsetType = msgspec.UNSET
        if manager.cluster_readers is not None:  # cluster mode: mirrors' readers count too
            by_node = await manager.cluster_readers(session.id, subscribers)
            subscribers = sum(by_node.values())
        recovery = manager.cluster_recovery(session.id) \
            if manager.cluster_recovery is not None else None
        return json_response(wire.SessionStatusResponse(
            session_id=session.id,
            workspace_cwd=session.workspace_cwd,
            has_active_prompt=session.active is not None,
            active_prompt_id=session.active.prompt_id if session.active else None,
            pending_prompts=len(session.queue),
            last_event_id=bus.ring.last_id,
            durable_event_id=bus.durable_event_id(),
            event_epoch=bus.epoch,
            transcript_degraded=bus.transcript_degraded or bus.transcript_damaged,
            full_transcript_available=bus.full_transcript_available,
            replay_degraded=bus.degraded,
            subscribers=subscribers,
            slow_client_warnings=bus.slow_client_warnings,
            clients_evicted=bus.clients_evicted,
            journal=wire.JournalStatus(entries=journal.entry_count, bytes=journal.total_bytes,
                                       truncated_events=journal.truncated_events,
                                       retained_events=journal.retained_events),
            server_time=now_ms(),
            owner_node_id=manager.node_id if manager.node_id is not None else msgspec.UNSET,
            subscribers_by_node=by_node,
            agent_session_restored=session.agent_session_restored,
            transcript_recovery=recovery if recovery is not None else msgspec.UNSET,
        ))

    @serve(routes.DETACH)
    async def detach(session_id: str) -> Response:
        session = await live_session(session_id)
        client_id = header_client_id()
        if client_id is not None:
            manager.clients.detach(session.id, client_id)
        return Response(b"", status=204)

    @serve(routes.HEARTBEAT)
    async def heartbeat(session_id: str) -> Response:
        session = await live_session(session_id)
        return json_response(wire.HeartbeatResponse(session_id=session.id, server_time=now_ms()))

    @serve(routes.DELETE_SESSION)
    async def delete_session(session_id: str) -> Response:
        session = await live_session(session_id)
        with trio.CancelScope(shield=True):
            await manager.close_session(session, "client_close")
        return Response(b"", status=204)

    return app
