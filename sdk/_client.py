"""The async HTTP client for the daemon and its SSE event stream.

One :class:`DaemonClient` owns one ``httpx.AsyncClient`` (one connection pool); like httpx it
runs on anyio, so under ``trio.run`` and ``asyncio.run`` alike. Every route returns a typed
msgspec Struct; every failure is mapped to the hierarchy in :mod:`sdk._errors`.
:meth:`DaemonClient.events` opens an :class:`EventStream` that parses SSE with
:class:`sdk.protocol.sse.SSEParser` and tracks the cursor and epoch.

Session handles, reconnecting subscriptions, the WebSocket variant and the repair driver build
on this module; it deliberately holds no background tasks.
"""

from __future__ import annotations

import logging
import os
import random
import re
import ssl
import uuid
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from types import MappingProxyType, TracebackType
from typing import Any, Final, Literal, TypeAlias, TypeVar

import anyio
import httpx
import msgspec
from msgspec import UnsetType

from sdk._errors import (
    DaemonError,
    DaemonHTTPError,
    InvalidTokenError,
    SessionNotFoundError,
    SSEBufferOverflow,
    TransportError,
    error_for_status,
    is_retriable,
)
from sdk._httpcore import load_httpcore
from sdk._submission import PromptRetryPolicy, Submission, check_idempotency_key
from sdk.protocol import headers as wire_headers
from sdk.protocol import routes
from sdk.protocol.cursor import FollowsCursor, ResumeCursor
from sdk.protocol.envelope import DaemonEvent, decode_events, normalize_page_event
from sdk.protocol.http import (
    CapabilitiesResponse,
    CreateSessionResponse,
    DaemonStatusResponse,
    HealthResponse,
    LoadSessionResponse,
    PermissionVoteResponse,
    PromptAccepted,
    PromptByKeyResponse,
    PromptTerminal,
    ResumeSessionResponse,
    SessionList,
    SessionListing,
    SessionStatusResponse,
    view_status_sessions,
)
from sdk.protocol.http import (
    TranscriptPage as _TranscriptPage,
)
from sdk.protocol.sse import SSEParser

__all__ = [
    "DEFAULT_MAX_QUEUED",
    "TOKEN_ENV",
    "Capabilities",
    "ClientStatistics",
    "DaemonClient",
    "DaemonStatus",
    "EventStream",
    "Health",
    "LoadResult",
    "PermissionVote",
    "PromptAccepted",
    "PromptByKeyResponse",
    "PromptRetryPolicy",
    "PromptTerminal",
    "ResumeResult",
    "SessionCreated",
    "SessionPage",
    "SessionStatus",
    "SessionSummary",
    "TranscriptPage",
]

TOKEN_ENV: Final = "QWEN_SERVER_TOKEN"
SESSIONS_PAGE_SIZE: Final = 500
"""The page size :meth:`DaemonClient.list_sessions` reads with (the largest the daemon serves)."""
DEFAULT_MAX_QUEUED: Final = 1024
"""The ``maxQueued`` every event stream asks for unless told otherwise: a queue deep enough that
ordinary bursts do not evict a consumer that is briefly slow."""

_CLIENT_ID_RE: Final = re.compile(r"[A-Za-z0-9._:-]{1,128}")
# Failures that mean the request was never written: no connection could be had.
_NOT_SENT: Final = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout,
                    httpx.UnsupportedProtocol)

log = logging.getLogger("sdk.client")

_json_encode = msgspec.json.Encoder().encode
_json_decode = msgspec.json.Decoder().decode


# --- typed results ----------------------------------------------------------------------------
# The route results are the protocol's bodies (sdk.protocol.http), under the names the SDK has
# always exported. Load answers and transcript pages are generic in their list of envelopes:
# a client reads them as LoadSessionResponse[DaemonEvent] / TranscriptPage[DaemonEvent].
Health = HealthResponse
Capabilities = CapabilitiesResponse
DaemonStatus = DaemonStatusResponse
SessionCreated = CreateSessionResponse
ResumeResult = ResumeSessionResponse
LoadResult: TypeAlias = LoadSessionResponse[DaemonEvent]
PermissionVote = PermissionVoteResponse
SessionStatus = SessionStatusResponse
TranscriptPage: TypeAlias = _TranscriptPage[DaemonEvent]
SessionSummary = SessionListing
"""One session of :meth:`DaemonClient.list_sessions`: where it runs, its ``state`` —
``running`` (a turn runs), ``queued`` (prompts wait, none runs yet), ``idle`` (loaded, nothing
to do) or ``unloaded`` (stored, not in memory: a load or resume restores it) — and when
something last happened in it (``last_event_id`` and ``last_activity_at`` are ``None`` while it
is unloaded)."""
SessionPage = SessionList
"""One page of :meth:`DaemonClient.list_sessions_page` (``GET /sessions``), newest created
first; ``next_cursor`` (``UNSET`` on the last page) asks for the next page while
``has_more``."""


_R = TypeVar("_R", bound=msgspec.Struct)
_W = TypeVar("_W", bound=msgspec.Struct)


@dataclass(frozen=True)
class ClientStatistics:
    """What :meth:`DaemonClient.statistics` reports: requests sent through one connection pool.

    ``by_route`` counts every request by route name (``create``, ``load``, ``resume``,
    ``prompt``, ``cancel``, ``permission``, ``transcript``, ``status``, ``close``, ``detach``,
    ``heartbeat``, ``health``, ``capabilities``, ``daemon_status``, ``events`` for SSE and ``ws``
    for WebSocket opens); a request counts when it is sent, whatever its answer. ``failures``
    counts requests answered with a non-2xx status or that failed in transit.
    """

    requests: int
    failures: int
    by_route: Mapping[str, int]

    def count(self, route: str) -> int:
        return self.by_route.get(route, 0)

    @property
    def loads(self) -> int:
        return self.count("load")

    @property
    def prompts(self) -> int:
        return self.count("prompt")

    @property
    def streams(self) -> int:
        """Event streams opened (SSE and WebSocket), reconnects included."""
        return self.count("events") + self.count("ws")


class _Counters:
    """The mutable tallies behind :class:`ClientStatistics`, shared by a client and its views."""

    __slots__ = ("by_route", "failures", "requests")

    def __init__(self) -> None:
        self.requests = 0
        self.failures = 0
        self.by_route: dict[str, int] = {}

    def sent(self, route: str) -> None:
        self.requests += 1
        self.by_route[route] = self.by_route.get(route, 0) + 1

    def snapshot(self) -> ClientStatistics:
        return ClientStatistics(self.requests, self.failures, MappingProxyType(dict(self.by_route)))


# The statistics key of each route (its operation id, where the key is another word).
_ROUTE_NAMES: Final = {
    routes.CREATE_SESSION: "create", routes.DELETE_SESSION: "close",
    routes.LOAD_SESSION: "load", routes.RESUME_SESSION: "resume",
    routes.VOTE_PERMISSION: "permission", routes.SESSION_STATUS: "status",
    routes.DAEMON_STATUS: "daemon_status", routes.EVENTS_WS: "ws",
    routes.PROMPT_BY_KEY: "find_prompt",
}


def route_name(method: str, path: str) -> str:
    """The statistics key of a request (see :class:`ClientStatistics`)."""
    path = path.split("?", 1)[0]
    for route in routes.ROUTES:
        if route.method == method and route.match(path) is not None:
            return _ROUTE_NAMES.get(route, route.operation_id)
    return "/".join(part for part in path.split("/") if part) or "root"


def _object(body: Any, what: str) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise TransportError(f"{what}: expected a JSON object, got {type(body).__name__}")
    return body


def _convert(body: Any, result_type: type[_R], what: str) -> _R:
    body = _object(body, what)
    try:
        return msgspec.convert(body, result_type)
    except msgspec.ValidationError as exc:
        raise TransportError(f"{what}: malformed response body: {exc}") from exc


# --- the client -------------------------------------------------------------------------------


# A cluster node answers this (503, ``retryable: true``, ``Retry-After``) while the session's
# owner is gone but its lease still runs; once it expires the next request restores it.
OWNER_UNAVAILABLE: Final = "session_owner_unavailable"
# ... and this while the cluster's Redis does not answer (restarting, paused, unreachable).
CLUSTER_UNAVAILABLE: Final = "cluster_unavailable"
_RESENT_CODES: Final = frozenset({OWNER_UNAVAILABLE, CLUSTER_UNAVAILABLE})
_MIN_OWNER_RETRY_S: Final = 0.05


def owner_retry_delay(error: DaemonHTTPError, waited_s: float, budget_s: float) -> float | None:
    """How long to wait before resending a request answered ``503 session_owner_unavailable``
    or ``503 cluster_unavailable`` (its ``Retry-After``, 1 s without one), or ``None`` when it
    is not such an answer or the wait would go past ``budget_s`` in all (``waited_s`` so far)."""
    if error.status != 503 or error.code not in _RESENT_CODES or not is_retriable(error):
        return None
    delay = max(error.retry_after if error.retry_after is not None else 1.0, _MIN_OWNER_RETRY_S)
    return delay if waited_s + delay <= budget_s else None


class DaemonClient:
    """An async context manager over one connection pool to one daemon.

    ``token`` falls back to the ``QWEN_SERVER_TOKEN`` environment variable. ``client_id`` is
    sent as ``X-Qwen-Client-Id`` once known; the id the daemon returns from create, load or
    resume is adopted. ``transport`` replaces the network (tests).

    Against a cluster node, a request answered ``503 session_owner_unavailable`` (the
    session's node died and its lease still runs) is sent again after the answer's
    ``Retry-After``, for at most ``owner_wait_s`` seconds of waiting in all; then the error is
    raised (a prompt's sends have their own rules: :meth:`send_prompt`). ``prompt_retry``
    spaces the sends of one prompt. ``sleep`` replaces ``anyio.sleep`` and ``uniform`` the
    jitter source, ``random.uniform`` (tests).

    An ``https://`` daemon's certificate is checked against the system's CAs, or, with
    ``ca_file`` (a PEM file), against that file's only (a self-signed daemon's certificate).
    """

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        client_id: str | None = None,
        *,
        timeout: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
        owner_wait_s: float = 30.0,
        prompt_retry: PromptRetryPolicy | None = None,
        sleep: Callable[[float], Awaitable[None]] | None = None,
        ca_file: str | os.PathLike[str] | None = None,
        uniform: Callable[[float, float], float] | None = None,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be an http(s) URL, got {base_url!r}")
        if client_id is not None and not _CLIENT_ID_RE.fullmatch(client_id):
            raise ValueError(f"client_id must match [A-Za-z0-9._:-]{{1,128}}, got {client_id!r}")
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        self.base_url = base_url.rstrip("/")
        self.token = token if token is not None else (os.environ.get(TOKEN_ENV) or None)
        if self.token and not all("!" <= ch <= "~" for ch in self.token):
            source = "token" if token is not None else f"token from ${TOKEN_ENV}"
            raise InvalidTokenError(
                f"{source} must be visible ASCII (characters '!' to '~', no spaces):"
                " an HTTP Authorization header cannot carry anything else")
        self.client_id = client_id
        self.timeout = timeout
        self.owner_wait_s = owner_wait_s
        self.prompt_retry = prompt_retry if prompt_retry is not None else PromptRetryPolicy()
        self._sleep: Callable[[float], Awaitable[None]] = sleep or anyio.sleep
        self._uniform: Callable[[float, float], float] = uniform or random.uniform
        if transport is None:
            load_httpcore()  # before httpx does: without Trio unless the program runs it
        # An https:// daemon is verified against the system's CAs, or only against ca_file's
        # (a self-signed daemon's certificate, or its private CA).
        verify: ssl.SSLContext | bool = (
            ssl.create_default_context(cafile=os.fspath(ca_file)) if ca_file is not None else True)
        self._http = httpx.AsyncClient(
            base_url=self.base_url, timeout=timeout, transport=transport, follow_redirects=False,
            verify=verify,
        )
        self._owns_pool = True
        self._counters = _Counters()

    def with_client_id(self, client_id: str | None) -> DaemonClient:
        """A view on the same connection pool that sends (and adopts) its own client id.

        Each session handle needs its own daemon-side registration: with one shared
        ``client_id``, detaching one handle would unregister every other. ``None`` lets the
        daemon issue a fresh id on the next create or load. Closing a view leaves the pool open.
        """
        if client_id is not None and not _CLIENT_ID_RE.fullmatch(client_id):
            raise ValueError(f"client_id must match [A-Za-z0-9._:-]{{1,128}}, got {client_id!r}")
        view = object.__new__(DaemonClient)
        view.base_url = self.base_url
        view.token = self.token
        view.client_id = client_id
        view.timeout = self.timeout
        view.owner_wait_s = self.owner_wait_s
        view.prompt_retry = self.prompt_retry
        view._sleep = self._sleep
        view._uniform = self._uniform
        view._http = self._http
        view._owns_pool = False
        view._counters = self._counters
        return view

    async def __aenter__(self) -> DaemonClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._owns_pool:
            await self._http.aclose()

    def statistics(self) -> ClientStatistics:
        """Requests sent so far through this connection pool (views included), by route."""
        return self._counters.snapshot()

    def _count(self, method: str, path: str) -> None:
        """Tally one request (also used by the WebSocket variant)."""
        self._counters.sent(route_name(method, path))

    def _count_failure(self) -> None:
        self._counters.failures += 1

    # -- plumbing --------------------------------------------------------------------------

    def headers(self, *, accept: str = "application/json") -> dict[str, str]:
        """The headers every request carries (also used by the WebSocket variant)."""
        headers = {"Accept": accept}
        if self.token:
            headers[wire_headers.AUTHORIZATION] = f"Bearer {self.token}"
        if self.client_id:
            headers[wire_headers.CLIENT_ID] = self.client_id
        return headers

    def _adopt(self, client_id: str | None) -> None:
        if isinstance(client_id, str) and client_id:
            self.client_id = client_id

    async def _request(
        self,
        method: str,
        path: str,
        *,
        body: Mapping[str, Any] | None = None,
        params: Mapping[str, str | int] | None = None,
    ) -> httpx.Response:
        headers = self.headers()
        content: bytes | None = None
        if body is not None:
            content = _json_encode(body)
            headers["Content-Type"] = "application/json"
        waited = 0.0
        while True:
            self._count(method, path)
            try:
                response = await self._http.request(
                    method, path, content=content, params=params, headers=headers
                )
            except httpx.TimeoutException as exc:
                self._count_failure()
                raise TransportError(f"{method} {path}: timed out: {exc!r}") from exc
            except httpx.TransportError as exc:
                self._count_failure()
                raise TransportError(f"{method} {path}: {exc!r}") from exc
            if 200 <= response.status_code < 300:
                return response
            self._count_failure()
            error = error_for_status(response.status_code, response.content, response.headers)
            delay = owner_retry_delay(error, waited, self.owner_wait_s)
            if delay is None:
                raise error
            await self._sleep(delay)
            waited += delay

    async def _json(
        self,
        method: str,
        path: str,
        *,
        body: Mapping[str, Any] | None = None,
        params: Mapping[str, str | int] | None = None,
    ) -> Any:
        response = await self._request(method, path, body=body, params=params)
        try:
            return _json_decode(response.content)
        except msgspec.DecodeError as exc:
            ctype = response.headers.get("content-type", "")
            raise TransportError(
                f"{method} {path}: response is not JSON (content-type {ctype!r})",
                status=response.status_code,
            ) from exc

    async def _typed(
        self,
        method: str,
        path: str,
        result_type: type[_W],
        *,
        body: Mapping[str, Any] | None = None,
        params: Mapping[str, str | int] | None = None,
    ) -> _W:
        """Decode the answer straight into ``result_type`` (one pass over the bytes)."""
        response = await self._request(method, path, body=body, params=params)
        try:
            return msgspec.json.decode(response.content, type=result_type)
        except msgspec.ValidationError as exc:
            raise TransportError(f"{method} {path}: malformed response body: {exc}") from exc
        except msgspec.DecodeError as exc:
            ctype = response.headers.get("content-type", "")
            raise TransportError(
                f"{method} {path}: response is not JSON (content-type {ctype!r})",
                status=response.status_code,
            ) from exc

    # -- daemon routes ---------------------------------------------------------------------

    async def health(self) -> Health:
        path = routes.HEALTH.url()
        return _convert(await self._json("GET", path), Health, f"GET {path}")

    async def capabilities(self) -> Capabilities:
        path = routes.CAPABILITIES.url()
        return _convert(await self._json("GET", path), Capabilities, f"GET {path}")

    async def daemon_status(self) -> DaemonStatus:
        return await self._typed("GET", routes.DAEMON_STATUS.url(), DaemonStatus)

    async def list_sessions_page(
        self,
        limit: int | None = None,
        cursor: str | UnsetType | None = None,
        *,
        workspace: str | None = None,
        state: Literal["running", "queued", "idle", "unloaded"] | None = None,
    ) -> SessionPage:
        """One page of ``GET /sessions``: at most ``limit`` sessions (the daemon's default:
        100; at most 500), from ``cursor`` (a page's ``next_cursor``; without one, the first
        page), only those in ``workspace`` (an absolute path) and in ``state`` when given."""
        params: dict[str, str | int] = {}
        if limit is not None:
            params["limit"] = limit
        if isinstance(cursor, str):
            params["cursor"] = cursor
        if workspace is not None:
            params["workspace"] = workspace
        if state is not None:
            params["state"] = state
        return await self._typed("GET", routes.LIST_SESSIONS.url(), SessionPage, params=params)

    async def list_sessions(
        self,
        *,
        workspace: str | None = None,
        state: Literal["running", "queued", "idle", "unloaded"] | None = None,
        page_size: int = SESSIONS_PAGE_SIZE,
    ) -> list[SessionSummary]:
        """Every session, loaded or unloaded (with the filters of :meth:`list_sessions_page`),
        newest created first, read a page of ``page_size`` at a time. A daemon without
        ``GET /sessions`` (it answers 404 ``route_not_found``) is read from its
        ``GET /daemon/status`` instead, which lists its live sessions only."""
        found: list[SessionSummary] = []
        cursor: str | None = None
        while True:
            try:
                page = await self.list_sessions_page(page_size, cursor, workspace=workspace,
                                                     state=state)
            except DaemonHTTPError as exc:
                if exc.status != 404 or exc.code != "route_not_found" or cursor is not None:
                    raise
                return await self._live_sessions_from_status(workspace, state)
            found.extend(page.sessions)
            if not page.has_more or not isinstance(page.next_cursor, str):
                return found
            cursor = page.next_cursor

    async def _live_sessions_from_status(self, workspace: str | None,
                                         state: str | None) -> list[SessionSummary]:
        response = await self._request("GET", routes.DAEMON_STATUS.url())
        try:
            live = view_status_sessions(response.content)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            raise TransportError(f"GET /daemon/status: malformed sessions: {exc}") from exc
        return [s for s in live if (workspace is None or s.workspace_cwd == workspace)
                and (state is None or s.state == state)]

    # -- session routes --------------------------------------------------------------------

    async def create_session(
        self,
        cwd: str | None = None,
        session_id: str | None = None,
        scope: Literal["single", "thread"] | None = None,
    ) -> SessionCreated:
        body: dict[str, Any] = {}
        if cwd is not None:
            body["cwd"] = cwd
        if session_id is not None:
            body["sessionId"] = session_id
        if scope is not None:
            body["sessionScope"] = scope
        result = _convert(
            await self._json("POST", routes.CREATE_SESSION.url(), body=body), SessionCreated,
            "POST /session"
        )
        self._adopt(result.client_id)
        return result

    async def load_session(
        self,
        session_id: str,
        cwd: str | None = None,
        history_page_size: int | None = None,
        live_replay_mode: Literal["full", "summary"] | None = None,
    ) -> LoadResult:
        """Load a snapshot. Without ``history_page_size`` the daemon answers from memory."""
        request: dict[str, Any] = {}
        if cwd is not None:
            request["cwd"] = cwd
        if history_page_size is not None:
            request["historyPageSize"] = history_page_size
        if live_replay_mode is not None:
            request["liveReplayMode"] = live_replay_mode
        path = routes.LOAD_SESSION.url(sessionId=session_id)
        # The frames are kept raw, then each decoded by the envelope decoder in one pass
        # (frames that fail the envelope rules are dropped, as the SSE parser drops them).
        wire = await self._typed("POST", path, LoadSessionResponse[msgspec.Raw], body=request)
        result: LoadResult = msgspec.structs.replace(
            wire,  # type: ignore[arg-type]
            compacted_replay=decode_events(wire.compacted_replay),
            live_journal=decode_events(wire.live_journal),
        )
        self._adopt(result.client_id)
        return result

    async def resume_session(self, session_id: str, cwd: str | None = None) -> ResumeResult:
        path = routes.RESUME_SESSION.url(sessionId=session_id)
        request: dict[str, Any] = {} if cwd is None else {"cwd": cwd}
        body = await self._json("POST", path, body=request)
        if isinstance(body, dict):
            # A daemon that answers resume with a full load body: the lists are not wanted here.
            body.pop("compactedReplay", None)
            body.pop("liveJournal", None)
        result = _convert(body, ResumeResult, f"POST {path}")
        self._adopt(result.client_id)
        return result

    async def send_prompt(
        self,
        session_id: str,
        prompt: Sequence[Mapping[str, Any]] | str,
        deadline_ms: int | None = None,
        *,
        idempotency_key: str | None = None,
        timeout: float | None = None,
    ) -> PromptAccepted:
        """Submit a prompt (a plain string becomes one text block); returns the daemon's 202.

        The prompt is admitted at most once: every send carries one ``Idempotency-Key`` (a
        fresh UUID per call unless ``idempotency_key`` names one, e.g. to resend a prompt whose
        outcome was unknown), and a failed send is sent again with the same key after a
        :class:`~sdk._submission.PromptRetryPolicy` wait when that may succeed (network
        failures, timeouts, 408/429/502/503/504; see :mod:`sdk._submission`). A send the daemon
        already admitted is answered with the first 202 body. The whole call ends within
        ``timeout`` seconds (default: the policy's ``timeout_s``, else the client's
        ``timeout``), each send within the client's ``timeout`` and the time left.

        Raises :class:`~sdk._errors.PromptOutcomeUnknownError` (with the key and session id)
        when a send may have been admitted and none was answered: ask
        :meth:`find_prompt`, or call again with ``idempotency_key=`` that key. Any other error
        means nothing was admitted: a refusal (a 4xx, e.g.
        :class:`~sdk._errors.IdempotencyKeyReusedError`, or
        :class:`~sdk._errors.PromptQueueFullError`), or a daemon that could not be reached at
        all (:class:`~sdk._errors.TransportError`). If you cancel the call, the outcome is
        unknown: pass your own key to be able to ask.
        """
        budget = timeout if timeout is not None else self.prompt_retry.timeout_s or self.timeout
        if not budget > 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        blocks: list[Any] = (
            [{"type": "text", "text": prompt}] if isinstance(prompt, str) else list(prompt)
        )
        request: dict[str, Any] = {"prompt": blocks}
        if deadline_ms is not None:
            request["deadlineMs"] = deadline_ms
        path = routes.PROMPT.url(sessionId=session_id)
        key = str(uuid.uuid4()) if idempotency_key is None else idempotency_key
        submission = Submission(session_id, key)
        content = _json_encode(request)
        headers = self.headers()
        headers["Content-Type"] = "application/json"
        headers[wire_headers.IDEMPOTENCY_KEY] = key
        start = anyio.current_time()
        waited = 0.0  # the waits asked for: an injected sleep may take no time at all

        def spent() -> float:
            return max(anyio.current_time() - start, waited)

        while True:
            left = budget - spent()
            if left <= 0:  # the last wait overslept the deadline: no send without time for it
                raise submission.give_up()
            answer = await self._send_prompt_once(path, content, headers, left)
            if isinstance(answer, PromptAccepted):
                return answer
            error, delivered = answer
            again = submission.failed(error, delivered=delivered)
            delay = self.prompt_retry.delay(
                submission.attempts, self._uniform, submission.retry_after())
            if not again or spent() + delay >= budget:
                final = submission.give_up()
                log.info("event=prompt_send_failed session=%s key=%s attempts=%d "
                         "outcome=%s error=%r", session_id, key, submission.attempts,
                         "unknown" if final is not error else "not_admitted", error)
                raise final
            log.info("event=prompt_resend session=%s key=%s attempt=%d delay_s=%.3f error=%r",
                     session_id, key, submission.attempts + 1, delay, error)
            await self._sleep(delay)
            waited += delay

    async def _send_prompt_once(
        self, path: str, content: bytes, headers: dict[str, str], left: float
    ) -> PromptAccepted | tuple[DaemonError, bool]:
        """One send of a prompt within ``left`` seconds: the 202, or the failure and whether
        the request may have left (False only when no connection could be had)."""
        what = f"POST {path}"
        self._count("POST", path)
        response: httpx.Response | None = None
        failure: DaemonError | None = None
        delivered = True
        limit = max(min(self.timeout, left), 0.001)
        with anyio.move_on_after(limit):  # the whole send, not only each phase of it
            try:
                response = await self._http.post(
                    path, content=content, headers=headers, timeout=httpx.Timeout(limit))
            except _NOT_SENT as exc:
                failure, delivered = TransportError(f"{what}: {exc!r}"), False
            except httpx.TimeoutException as exc:
                failure = TransportError(f"{what}: timed out: {exc!r}")
            except httpx.TransportError as exc:
                failure = TransportError(f"{what}: {exc!r}")
        if response is None:
            self._count_failure()
            if failure is None:
                failure = TransportError(f"{what}: no answer within {limit:.3g} s")
            return failure, delivered
        if not 200 <= response.status_code < 300:
            self._count_failure()
            return error_for_status(response.status_code, response.content,
                                    response.headers), True
        try:
            return _convert(_json_decode(response.content), PromptAccepted, what)
        except (msgspec.DecodeError, TransportError) as exc:
            # Admitted, most likely, but the answer cannot be read: the resend's answer is the
            # same 202 body, readable this time or not.
            self._count_failure()
            return TransportError(f"{what}: unreadable answer {response.status_code}: {exc}",
                                  status=response.status_code), True

    async def find_prompt(
        self, session_id: str, idempotency_key: str
    ) -> PromptByKeyResponse | None:
        """The prompt this session admitted with ``idempotency_key``, and how far it got
        (``state``: ``queued``, ``running``, ``completed``, ``cancelled``, ``error`` or
        ``interrupted``), or ``None`` when the daemon admitted none with it. Also answers for
        a session the daemon holds only in its transcript (after a restart). ``None`` is what
        the daemon knows now: a send of that key still on its way could still arrive;
        resending with the same key settles it for good."""
        path = routes.PROMPT_BY_KEY.url(sessionId=session_id,
                                        idempotencyKey=check_idempotency_key(idempotency_key))
        try:
            return await self._typed("GET", path, PromptByKeyResponse)
        except SessionNotFoundError as exc:
            if exc.code == "prompt_not_found":
                return None
            raise

    async def cancel(self, session_id: str) -> None:
        await self._request("POST", routes.CANCEL.url(sessionId=session_id))

    async def vote_permission(
        self,
        session_id: str,
        request_id: str,
        option_id: str | None = None,
        cancelled: bool = False,
    ) -> PermissionVote:
        """Answer a ``permission_request`` with one option, or cancel it."""
        if (option_id is None) == (not cancelled):
            raise ValueError("give exactly one of option_id or cancelled=True")
        request: dict[str, Any] = {"outcome": "cancelled"} if cancelled else {"optionId": option_id}
        path = routes.VOTE_PERMISSION.url(sessionId=session_id, requestId=request_id)
        return _convert(
            await self._json("POST", path, body=request), PermissionVote, f"POST {path}"
        )

    async def transcript_page(
        self,
        session_id: str,
        limit: int | None = None,
        cursor: str | None = None,
        before_record_id: str | None = None,
    ) -> TranscriptPage:
        """One page of the durable transcript, newest first across pages."""
        if cursor is not None and before_record_id is not None:
            raise ValueError("give cursor or before_record_id, not both")
        params: dict[str, str | int] = {}
        if limit is not None:
            params["limit"] = limit
        if cursor is not None:
            params["cursor"] = cursor
        if before_record_id is not None:
            params["beforeRecordId"] = before_record_id
        path = routes.TRANSCRIPT.url(sessionId=session_id)
        wire = await self._typed("GET", path, _TranscriptPage[msgspec.Raw], params=params)
        events = [
            normalized
            for event in decode_events(wire.events)
            if (normalized := normalize_page_event(event, wire.session_id)) is not None
        ]
        page: TranscriptPage = msgspec.structs.replace(
            wire, events=events)  # type: ignore[arg-type]
        return page

    async def session_status(self, session_id: str) -> SessionStatus:
        path = routes.SESSION_STATUS.url(sessionId=session_id)
        body = await self._json("GET", path)
        return _convert(body, SessionStatusResponse, f"GET {path}")

    async def close_session(self, session_id: str) -> None:
        await self._request("DELETE", routes.DELETE_SESSION.url(sessionId=session_id))

    async def detach(self, session_id: str) -> None:
        await self._request("POST", routes.DETACH.url(sessionId=session_id))

    async def heartbeat(self, session_id: str) -> None:
        await self._request("POST", routes.HEARTBEAT.url(sessionId=session_id))

    def events(
        self,
        session_id: str,
        last_event_id: int | None = None,
        epoch: str | None = None,
        *,
        max_queued: int | None = DEFAULT_MAX_QUEUED,
    ) -> EventStream:
        """An SSE subscription; use it as ``async with client.events(...) as stream``.

        ``epoch`` is sent only together with a cursor (``last_event_id``), as the daemon
        ignores an epoch without one. ``max_queued`` is sent as ``maxQueued`` (the same default
        as :class:`~sdk._session.SessionHandle`); ``None`` leaves it to the daemon.
        """
        return EventStream(self, session_id, last_event_id, epoch, max_queued=max_queued)

    @asynccontextmanager
    async def export_session(
        self, session_id: str, format: Literal["jsonl", "markdown"] = "jsonl"
    ) -> AsyncIterator[AsyncIterator[bytes]]:
        """The session's whole transcript as the daemon streams it (``GET
        /session/{id}/export``): ``async with client.export_session(sid) as chunks: async for
        chunk in chunks``. JSON Lines hold one event envelope a line, oldest first; Markdown is
        for reading. The body is never held in memory whole."""
        path = routes.EXPORT_SESSION.url(sessionId=session_id)
        request = self._http.build_request(
            "GET", path, headers=self.headers(accept="*/*"), params={"format": format},
            timeout=httpx.Timeout(self.timeout, read=None))
        self._count("GET", path)
        try:
            response = await self._http.send(request, stream=True)
        except httpx.TransportError as exc:
            self._count_failure()
            raise TransportError(f"GET {path}: {exc!r}") from exc
        try:
            if response.status_code != 200:
                self._count_failure()
                try:
                    content = await response.aread()
                except httpx.HTTPError:
                    content = b""
                raise error_for_status(response.status_code, content, response.headers)
            yield _body_chunks(response, path)
        finally:
            await response.aclose()

    # -- used by EventStream ---------------------------------------------------------------

    async def _open_stream(
        self, path: str, headers: dict[str, str], params: dict[str, str | int]
    ) -> httpx.Response:
        request = self._http.build_request(
            "GET",
            path,
            headers=headers,
            params=params,
            # The body is open-ended: only the connect/write/pool phases may time out.
            timeout=httpx.Timeout(self.timeout, read=None),
        )
        self._count("GET", path)
        try:
            response = await self._http.send(request, stream=True)
        except httpx.TimeoutException as exc:
            self._count_failure()
            raise TransportError(f"GET {path}: timed out: {exc!r}") from exc
        except httpx.TransportError as exc:
            self._count_failure()
            raise TransportError(f"GET {path}: {exc!r}") from exc
        if response.status_code != 200:
            self._count_failure()
            try:
                content = await response.aread()
            except httpx.HTTPError:
                content = b""
            finally:
                await response.aclose()
            raise error_for_status(response.status_code, content, response.headers)
        ctype = response.headers.get("content-type", "")
        if ctype.split(";", 1)[0].strip().lower() != "text/event-stream":
            self._count_failure()
            await response.aclose()
            raise TransportError(
                f"GET {path}: expected text/event-stream, got {ctype!r}",
                status=response.status_code,
            )
        return response


async def _body_chunks(response: httpx.Response, path: str) -> AsyncIterator[bytes]:
    try:
        async for chunk in response.aiter_bytes():
            yield chunk
    except httpx.TransportError as exc:
        raise TransportError(f"GET {path}: the body broke off: {exc!r}") from exc


class EventStream(FollowsCursor):
    """One SSE response read as typed events.

    ``last_event_id`` starts at the requested cursor and follows :class:`ResumeCursor`'s rules
    as each event is handed to the caller (advance to ``max(previous, id)`` from frames with an
    id, back to 0 on an ``epoch_reset``). ``epoch`` is the ``X-Qwen-Event-Epoch`` the daemon
    answered with (the requested one until then).
    Errors before the first event (401/403, 404/410, other statuses, a non-SSE answer) are
    raised by ``__aenter__``; network failures while reading raise :class:`TransportError`;
    a clean end of the body ends the iteration (``ended`` becomes True).
    """

    def __init__(
        self,
        client: DaemonClient,
        session_id: str,
        last_event_id: int | None = None,
        epoch: str | None = None,
        *,
        max_queued: int | None = DEFAULT_MAX_QUEUED,
    ) -> None:
        self.cursor = ResumeCursor(last_event_id, epoch)
        """The resume cursor and epoch (:mod:`sdk.protocol.cursor`'s rules)."""
        self.session_id = session_id
        self.stream_id: str | None = None
        self.events_received = 0
        self.ended = False
        self._client = client
        self._requested_cursor = last_event_id
        self._requested_epoch = epoch
        self._max_queued = max_queued
        self._parser = SSEParser()
        self._pending: deque[DaemonEvent] = deque()
        self._response: httpx.Response | None = None
        self._chunks: AsyncIterator[bytes] | None = None
        self._opened = False

    @property
    def retry_ms(self) -> int | None:
        """The reconnection time the stream's last valid ``retry:`` field asked for, if any."""
        return self._parser.retry_ms

    @property
    def buffered(self) -> int:
        """Events already parsed and not yet handed over (the next ones need no read)."""
        return len(self._pending)

    def request_headers(self) -> dict[str, str]:
        """The headers this stream sends (the cursor pair only together)."""
        headers = self._client.headers(accept="text/event-stream")
        headers["Cache-Control"] = "no-cache"
        if self._requested_cursor is not None:
            headers[wire_headers.LAST_EVENT_ID] = str(self._requested_cursor)
            if self._requested_epoch:
                headers[wire_headers.EVENT_EPOCH] = self._requested_epoch
        return headers

    async def __aenter__(self) -> EventStream:
        if self._opened:
            raise RuntimeError("an EventStream can be opened only once; make a new one")
        self._opened = True
        params: dict[str, str | int] = {}
        if self._max_queued is not None:
            params["maxQueued"] = self._max_queued
        response = await self._client._open_stream(
            routes.EVENTS.url(sessionId=self.session_id), self.request_headers(), params
        )
        self._response = response
        self.cursor.answered(response.headers.get(wire_headers.EVENT_EPOCH))
        self.stream_id = response.headers.get(wire_headers.SSE_STREAM_ID)
        self._chunks = response.aiter_bytes()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        chunks, self._chunks = self._chunks, None
        response, self._response = self._response, None
        closer = getattr(chunks, "aclose", None)
        try:
            if closer is not None:
                await closer()
        finally:
            # Runs even when the caller's scope is cancelled, so the connection is released.
            if response is not None:
                await response.aclose()

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> DaemonEvent:
        if not self._opened:
            raise RuntimeError("use 'async with client.events(...) as stream' before iterating")
        while not self._pending:
            chunks = self._chunks
            if chunks is None:
                raise StopAsyncIteration
            try:
                chunk = await chunks.__anext__()
            except StopAsyncIteration:
                self._pending.extend(self._parser.close())
                self.ended = True
                await self.aclose()
                continue
            except (httpx.TransportError, httpx.StreamError) as exc:
                await self.aclose()
                raise TransportError(f"event stream {self.session_id}: {exc!r}") from exc
            try:
                self._pending.extend(self._parser.feed(chunk))
            except SSEBufferOverflow:
                await self.aclose()
                raise
        event = self._pending.popleft()
        self.events_received += 1
        self.cursor.observe(event)
        return event
