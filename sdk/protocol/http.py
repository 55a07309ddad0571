"""Request and response bodies of the daemon's HTTP routes, as msgspec Structs.

Pure: no trio, no I/O. One definition per body: the daemon validates request bodies by
converting them to these types (the constraints live in the types, as ``msgspec.Meta``), builds
its answers from the response types, and ``/openapi.json`` is generated from the same classes
(``msgspec.json.schema_components``), so the description and the checks cannot drift.

Wire names are camelCase (``rename="camel"``). Every field a response always carries is
required (no defaults), so the generated schema says so. Request types never forbid unknown fields: body
fields the protocol does not name are ignored, never rejected. Optional request fields accept
``null`` as "omitted". Optional response fields are ``UNSET`` when absent (left out of the JSON,
not ``null``).

Which 400 a failed request conversion answers is :func:`request_error_code`: the first key of
the failing location names the field, and each field has its machine code (``REQUEST_ERRORS``).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Annotated, Any, Final, Generic, Literal, TypeVar

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

__all__ = [
    "ABSOLUTE_PATH_PATTERN",
    "CLIENT_ID_PATTERN",
    "DEFAULT_SESSIONS_LIMIT",
    "DEFAULT_TRANSCRIPT_LIMIT",
    "ECHO_MAX_CHARS",
    "IDEMPOTENCY_KEY_PATTERN",
    "MAX_DEADLINE_MS",
    "MAX_PAGE_SIZE",
    "PERMISSION_VOTE_RULE",
    "REQUEST_ERRORS",
    "REQUEST_TYPES",
    "RESPONSE_TYPES",
    "SESSION_STATES",
    "STATUS_SESSIONS_MAX",
    "TRANSCRIPT_QUERY_RULE",
    "UUID_PATTERN",
    "AgentInfo",
    "CapabilitiesResponse",
    "ConnectionCounts",
    "ContentBlock",
    "CreateSessionRequest",
    "CreateSessionResponse",
    "DaemonStatusResponse",
    "ErrorBody",
    "ErrorBodyView",
    "EventT",
    "HealthResponse",
    "HeartbeatResponse",
    "JournalStatus",
    "LedgerTerminal",
    "Limits",
    "LoadSessionRequest",
    "LoadSessionResponse",
    "PermissionOutcome",
    "PermissionVoteRequest",
    "PermissionVoteResponse",
    "PromptAccepted",
    "PromptByKeyResponse",
    "PromptProgress",
    "PromptRequest",
    "PromptTerminal",
    "ResumeSessionRequest",
    "ResumeSessionResponse",
    "Sent",
    "ServerPatches",
    "SessionCounts",
    "SessionList",
    "SessionListing",
    "SessionState",
    "SessionStatusResponse",
    "SessionTotals",
    "SessionsQuery",
    "TranscriptCheck",
    "TranscriptHealth",
    "TranscriptPage",
    "TranscriptQuery",
    "TranscriptRecovery",
    "WorkspaceInfo",
    "body_schemas",
    "body_too_large",
    "convert_request",
    "echo",
    "error_body",
    "method_not_allowed",
    "parse_idempotency_key",
    "request_error_code",
    "route_not_found",
    "session_not_found",
    "session_state",
    "view_error_body",
    "view_prompt_blocks",
    "view_session_id",
    "view_status_sessions",
    "vote_outcome",
]

# --- constraints -------------------------------------------------------------------------------

#: Page sizes: ``historyPageSize`` of a load, ``limit`` of a transcript page.
MAX_PAGE_SIZE: Final = 500
DEFAULT_TRANSCRIPT_LIMIT: Final = 100
#: ``limit`` of ``GET /sessions`` (1 .. MAX_PAGE_SIZE).
DEFAULT_SESSIONS_LIMIT: Final = 100
#: How many live sessions ``GET /daemon/status`` lists at most (the newest loaded first); the
#: whole list is ``GET /sessions``.
STATUS_SESSIONS_MAX: Final = 50
#: ``deadlineMs`` of a prompt: 1 ms .. 24 h.
MAX_DEADLINE_MS: Final = 86_400_000
#: ``headers.CLIENT_ID``.
CLIENT_ID_PATTERN: Final = "^[A-Za-z0-9._:-]{1,128}$"
#: The value of an ``Idempotency-Key`` header (``headers.IDEMPOTENCY_KEY``; the name and
#: meaning of the IETF httpapi draft and of the payment APIs that made it common): one value per
#: logical prompt, any number of sends. 1-128 of letters, digits and ``_ . : ~ -`` (a UUID, a
#: ULID, base64url all fit, and it goes into a URL path as it is), sent bare or as a quoted
#: structured-field string (``"..."``).
IDEMPOTENCY_KEY_PATTERN: Final = "^[A-Za-z0-9_.:~-]{1,128}$"
#: An absolute path without NUL (``""`` and relative paths are refused: ``invalid_cwd``).
ABSOLUTE_PATH_PATTERN: Final = "^/[^\\x00]*$"
#: A session id a client may choose: a hyphenated UUID (any case; the daemon lower-cases it).
UUID_PATTERN: Final = (
    "^[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}$"
)

AbsolutePath = Annotated[str, Meta(
    min_length=1, pattern=ABSOLUTE_PATH_PATTERN,
    description="absolute path of an existing directory (the workspace)")]
PageSize = Annotated[int, Meta(ge=1, le=MAX_PAGE_SIZE)]
DeadlineMs = Annotated[int, Meta(ge=1, le=MAX_DEADLINE_MS)]
SessionIdChoice = Annotated[str, Meta(pattern=UUID_PATTERN, extra_json_schema={"format": "uuid"})]
OptionId = Annotated[str, Meta(min_length=1)]
EventId = Annotated[int, Meta(ge=0)]
IdempotencyKey = Annotated[str, Meta(pattern=IDEMPOTENCY_KEY_PATTERN)]
_IDEMPOTENCY_KEY_RE: Final = re.compile(IDEMPOTENCY_KEY_PATTERN)


def parse_idempotency_key(value: str) -> str | None:
    """The key an ``Idempotency-Key`` header value names (a quoted form unquoted), or ``None``
    when it is not a valid key (400 ``invalid_idempotency_key``)."""
    if len(value) >= 2 and value[0] == value[-1] == '"':
        value = value[1:-1]
    return value if _IDEMPOTENCY_KEY_RE.fullmatch(value) else None


#: A member this daemon always sends that has a default all the same: the daemon's answers
#: carry it whatever its value (so the schema lists it as required: :func:`body_schemas`),
#: and a client still reads an answer without it (the reference daemon, or an earlier
#: version of this one, leaves it out).
Sent: Final = Meta(extra={"sent": True})


class _Body(Struct, rename="camel", kw_only=True):
    """Base of every body: camelCase on the wire, keyword-only construction."""


# The frames inside ``compactedReplay``, ``liveJournal`` and transcript pages are envelopes
# (sdk.protocol.envelope.DaemonEvent, the one definition): the daemon splices the published
# bytes in unchanged, and the schema of those lists is generated from that Struct.


# --- requests ----------------------------------------------------------------------------------


class CreateSessionRequest(_Body, kw_only=True):
    """``POST /session``."""

    cwd: AbsolutePath | None = None
    session_id: SessionIdChoice | None = None
    session_scope: Literal["single", "thread"] = "single"


class LoadSessionRequest(_Body, kw_only=True):
    """``POST /session/{id}/load``; with ``historyPageSize`` (and no prompt running) the replay
    comes from the transcript."""

    cwd: AbsolutePath | None = None
    history_page_size: PageSize | None = None
    live_replay_mode: Literal["full", "summary"] = "full"


class ResumeSessionRequest(_Body, kw_only=True):
    """``POST /session/{id}/resume``."""

    cwd: AbsolutePath | None = None


class ContentBlock(Struct):
    """An ACP content block: an object with a string ``type``. Its other fields are the
    agent's business: the daemon forwards the block as it was sent."""

    type: str


class PromptRequest(_Body, kw_only=True):
    """``POST /session/{id}/prompt``."""

    prompt: Annotated[list[ContentBlock], Meta(min_length=1)]
    deadline_ms: DeadlineMs | None = None


#: A vote names an option or refuses: at least one of the two fields (``optionId`` wins).
PERMISSION_VOTE_RULE: Final[dict[str, Any]] = {"anyOf": [
    {"required": ["optionId"], "properties": {"optionId": {"type": "string"}}},
    {"required": ["outcome"], "properties": {"outcome": {"const": "cancelled"}}},
]}


class PermissionVoteRequest(_Body, kw_only=True):
    """``POST /session/{id}/permission/{requestId}``: ``{optionId}`` or
    ``{outcome: "cancelled"}`` (see :data:`PERMISSION_VOTE_RULE`)."""

    option_id: OptionId | None = None
    outcome: Literal["cancelled"] | None = None


class PermissionOutcome(_Body, kw_only=True):
    outcome: Literal["selected", "cancelled"]
    option_id: str | UnsetType = UNSET


def vote_outcome(vote: PermissionVoteRequest) -> PermissionOutcome | None:
    """The outcome a vote asks for; None when it names neither (400)."""
    if vote.option_id is not None:
        return PermissionOutcome(outcome="selected", option_id=vote.option_id)
    if vote.outcome == "cancelled":
        return PermissionOutcome(outcome="cancelled")
    return None


#: A session as ``GET /sessions`` lists it: ``running`` (a turn runs), ``queued`` (prompts wait,
#: none runs yet), ``idle`` (loaded, nothing to do) or ``unloaded`` (stored, not in memory: it was
#: unloaded when idle, or the daemon restarted since; a load or resume restores it).
SessionState = Literal["running", "queued", "idle", "unloaded"]
SESSION_STATES: Final[tuple[str, ...]] = ("running", "queued", "idle", "unloaded")


class SessionsQuery(_Body, kw_only=True):
    """The query of ``GET /sessions``: ``limit`` sessions a page, from ``cursor`` (the previous
    page's ``nextCursor``, opaque), only those in ``workspace`` (an absolute path) and in
    ``state`` when given."""

    limit: PageSize = DEFAULT_SESSIONS_LIMIT
    cursor: Annotated[str, Meta(min_length=1)] | UnsetType = UNSET
    workspace: Annotated[str, Meta(min_length=1, pattern=ABSOLUTE_PATH_PATTERN)] | UnsetType \
        = UNSET
    state: SessionState | UnsetType = UNSET


class TranscriptQuery(_Body, kw_only=True):
    """The query of ``GET /session/{id}/transcript``. ``cursor`` (a page's ``nextCursor``) and
    ``beforeRecordId`` page back from different places: at most one of them
    (:data:`TRANSCRIPT_QUERY_RULE`; both → 400 ``invalid_transcript_cursor``)."""

    limit: PageSize = DEFAULT_TRANSCRIPT_LIMIT
    cursor: Annotated[str, Meta(min_length=1)] | UnsetType = UNSET
    before_record_id: Annotated[str, Meta(min_length=1)] | UnsetType = UNSET

    def __post_init__(self) -> None:
        if self.cursor is not UNSET and self.before_record_id is not UNSET:
            raise ValueError("Pass either cursor or beforeRecordId, not both")


#: What :meth:`TranscriptQuery.__post_init__` enforces, as JSON Schema.
TRANSCRIPT_QUERY_RULE: Final[dict[str, Any]] = {"not": {"required": ["cursor", "beforeRecordId"]}}


BodyT = TypeVar("BodyT", bound=Struct)


@functools.cache
def _integer_fields(kind: type[Struct]) -> frozenset[str]:
    """Wire names of ``kind``'s fields that hold an integer (alone or in a union)."""
    info = msgspec.inspect.type_info(kind)
    assert isinstance(info, msgspec.inspect.StructType)
    out = set()
    for field in info.fields:
        options = field.type.types if isinstance(field.type, msgspec.inspect.UnionType) \
            else (field.type,)
        if any(isinstance(option, msgspec.inspect.IntType) for option in options):
            out.add(field.encode_name)
    return frozenset(out)


def convert_request(body: dict[str, Any], kind: type[BodyT]) -> BodyT:
    """A decoded JSON body as its request type (raises ``msgspec.ValidationError``).

    JSON Schema's ``integer`` is any number with a zero fractional part, so ``220.0`` is as
    much an integer as ``220``: such numbers are read as the integer for integer fields.
    """
    ints = _integer_fields(kind)
    if ints:
        body = {key: int(value) if key in ints and isinstance(value, float)
                and value.is_integer() else value for key, value in body.items()}
    return msgspec.convert(body, kind)


#: The machine code of a request body field that fails its type.
REQUEST_ERRORS: Final[dict[str, str]] = {
    "cwd": "invalid_cwd",
    "sessionId": "invalid_session_id",
    "sessionScope": "invalid_session_scope",
    "historyPageSize": "invalid_transcript_limit",
    "liveReplayMode": "invalid_live_replay_mode",
    "prompt": "invalid_prompt",
    "deadlineMs": "invalid_deadline_ms",
    "optionId": "invalid_permission_vote",
    "outcome": "invalid_permission_vote",
    "limit": "invalid_transcript_limit",
    "cursor": "invalid_transcript_cursor",
    "beforeRecordId": "invalid_transcript_cursor",
}
_LOCATION = re.compile(r" - at `\$\.([A-Za-z_][A-Za-z0-9_]*)")
_MISSING = re.compile(r"^Object missing required field `([^`]+)`$")


def request_error_code(error: msgspec.ValidationError) -> str | None:
    """The code for a failed request conversion: by the first key of its location (or the
    missing top-level field); None when the body itself is not an object."""
    text = str(error)
    field = _LOCATION.search(text)
    if field is not None:
        return REQUEST_ERRORS.get(field.group(1))
    missing = _MISSING.match(text)
    if missing is not None:
        return REQUEST_ERRORS.get(missing.group(1))
    return None


# --- responses ---------------------------------------------------------------------------------


class HealthResponse(_Body, kw_only=True):
    status: Literal["ok"]


class Limits(_Body, kw_only=True):
    """The effective limits (``/capabilities`` and ``/daemon/status``)."""

    max_journal_events: int
    max_journal_bytes: int
    compacted_replay_max_bytes: int
    event_ring_size: int
    event_ring_bytes: int
    agent_idle_ms: int
    session_restore_timeout_ms: int
    max_pending_prompts: int
    max_subscribers_per_session: int
    max_request_body_bytes: int
    max_sessions: int  # live sessions (0: no cap)
    max_connections: int  # open connections (0: no cap)


class CapabilitiesResponse(_Body, kw_only=True):
    v: Literal[1]
    mode: str
    features: list[str]
    limits: Limits

    def supports(self, feature: str) -> bool:
        """Whether ``features`` names ``feature`` (``session_transcript_pagination``, ...)."""
        return feature in self.features


class TranscriptCheck(_Body, kw_only=True):
    """The transcript file's check: ``quick`` the bounded ``quick_check`` at start (``ok``, or
    ``incomplete`` when it ran out of time), ``full`` the background ``integrity_check`` and
    row checksum scan (``running``, then ``ok`` or ``damaged``); ``off`` without a
    transcript."""

    quick: Literal["ok", "incomplete", "off"]
    full: Literal["running", "ok", "damaged", "off"]


class TranscriptHealth(_Body, kw_only=True):
    """``degraded``: a write failed (``failedSessions``) or damage was found in the file
    (``damagedSessions`` and ``damage``, what was found, at most 100 lines)."""

    enabled: bool
    degraded: bool
    failed_sessions: list[str]
    last_error: str | None
    damaged_sessions: list[str]
    damage: list[str]
    check: TranscriptCheck


class AgentInfo(_Body, kw_only=True):
    workspace_cwd: str
    pid: int | None


class WorkspaceInfo(_Body, kw_only=True):
    """A workspace directory and the git branch checked out in it (``null``: not a checkout)."""

    workspace_cwd: str
    git_branch: str | None


class SessionCounts(_Body, kw_only=True):
    """One live session in ``/daemon/status``."""

    session_id: str
    workspace_cwd: str
    has_active_prompt: bool
    pending_prompts: int
    journal_entries: int
    journal_bytes: int
    summary_journal_entries: int
    replay_window_bytes: int
    replay_window_held_bytes: int
    replay_window_spilled_turns: int
    ring_events: int
    ring_bytes: int
    subscribers: int
    slow_client_warnings: int
    clients_evicted: int
    last_event_id: int
    transcript_degraded: bool
    created_at: str  # ISO 8601 UTC, as the create answer's createdAt
    last_activity_at: str  # the last event published (else when it was created or restored)
    git_branch: str | None  # the branch checked out in the workspace, if it is a git checkout


class ServerPatches(_Body, kw_only=True):
    """Whether the daemon's additions to its HTTP server are active (they check the server's
    shape when installed, and stay off on a version they do not know)."""

    ws_keepalive: bool
    connection_registry: bool
    ws_limits: bool
    http2_flow_control: bool
    hypercorn_version: str


class ConnectionCounts(_Body, kw_only=True):
    """The daemon's connections (``--max-connections``)."""

    open: int  # served now, under the cap
    reserve: int  # loopback health probes served over the cap now
    refused: int  # refused as they were accepted, since the daemon started


class DaemonStatusResponse(_Body, kw_only=True):
    v: Literal[1]
    limits: Limits
    persistence: bool
    transcript: TranscriptHealth
    agents: list[AgentInfo]
    agents_reaped: int
    restore_locks: int
    known_clients: int
    server: ServerPatches
    live_sessions: int  # loaded sessions, counted against limits.maxSessions
    approval_mode: str  # --approval-mode: how permission requests are answered by default
    default_workspace: WorkspaceInfo  # --workspace: where a session without a cwd runs
    connections: ConnectionCounts
    #: At most STATUS_SESSIONS_MAX live sessions, the newest loaded first; ``sessionsTruncated``
    #: says whether live sessions were left out (``totals`` counts all of them, and
    #: ``GET /sessions`` lists them all, unloaded ones too).
    sessions: list[SessionCounts]
    sessions_truncated: bool
    totals: SessionTotals


class SessionTotals(_Body, kw_only=True):
    """``GET /daemon/status``: counts over every session, listed or not (each kept as it
    changes, so reading them costs the same whatever the number of sessions)."""

    sessions: int  # live sessions (as liveSessions)
    unloaded_sessions: int  # unloaded when idle since the start (still restorable)
    subscribers: int  # open event streams (SSE and WebSocket) of every session


class SessionListing(_Body, kw_only=True):
    """One session of ``GET /sessions``. ``lastEventId`` and ``lastActivityAt`` are ``null`` for
    an unloaded session (they are known once it is loaded)."""

    # A client also reads the live sessions of a GET /daemon/status into this type (a daemon
    # without GET /sessions, view_status_sessions): those rows may leave the Sent members out.

    session_id: str
    workspace_cwd: str
    state: SessionState
    has_active_prompt: bool
    pending_prompts: int
    subscribers: Annotated[int, Sent] = 0
    last_event_id: Annotated[int | None, Sent] = None
    # ISO 8601 UTC, as the create answer's createdAt ("" read from a daemon that leaves it out)
    created_at: Annotated[str, Sent] = ""
    last_activity_at: Annotated[str | None, Sent] = None
    # the branch checked out in the workspace (loaded sessions only)
    git_branch: Annotated[str | None, Sent] = None


class SessionList(_Body, kw_only=True):
    """``GET /sessions``: one page, newest created first (ties by session id, descending), an
    order that sessions created meanwhile do not shift: they come before the first page."""

    v: Annotated[Literal[1], Sent] = 1
    sessions: list[SessionListing]
    has_more: bool
    next_cursor: str | UnsetType = UNSET


def session_state(has_active_prompt: bool, pending_prompts: int | bool) -> SessionState:
    """A live session's :data:`SessionState`: ``running`` while a turn runs, else ``queued``
    while prompts wait, else ``idle``."""
    if has_active_prompt:
        return "running"
    return "queued" if pending_prompts else "idle"


class CreateSessionResponse(_Body, kw_only=True):
    session_id: str
    workspace_cwd: str
    attached: bool
    client_id: str
    created_at: str
    # The reference daemon's create answer has no epoch: read as "" (not known yet; the first
    # stream or load names it).
    event_epoch: Annotated[str, Sent] = ""


#: How a prompt ended, as its ledger says: ``interrupted`` when the daemon stopped while it ran
#: (restoring the session closed it so).
LedgerTerminal = Literal["completed", "cancelled", "error", "interrupted"]


class PromptTerminal(_Body, kw_only=True):
    """A ledger terminal as load answers carry them (``promptTerminals``)."""

    v: Annotated[Literal[1], Sent] = 1
    prompt_id: str
    terminal: LedgerTerminal
    stop_reason: str | UnsetType = UNSET
    at: int


class _Attachment(_Body, kw_only=True):
    """Who and where: the members resume and load answers share, first."""

    session_id: str
    workspace_cwd: str
    attached: bool
    client_id: str
    created_at: str
    state: dict[str, Any]
    has_active_prompt: bool
    has_running_background_tasks: bool


class ResumeSessionResponse(_Attachment, kw_only=True):
    """``POST /session/{id}/resume``: who and where, and the cursor to subscribe from."""

    last_event_id: EventId
    event_epoch: str


#: What a list of envelopes holds: ``DaemonEvent`` as a client reads them, ``msgspec.Raw``
#: (each envelope's JSON, untouched) as they are decoded first, or ``bytes`` as the daemon
#: builds its answer: each envelope's encoding as published, spliced in as it is (the daemon's
#: writer cuts the Struct's encoding open where the list goes; msgspec alone would write bytes
#: as base64).
EventT = TypeVar("EventT")


class LoadSessionResponse(_Attachment, Generic[EventT], kw_only=True):
    """``POST /session/{id}/load``: the resume members plus the snapshot, rebuilt from
    ``compactedReplay`` then ``liveJournal``. Members in wire order; the daemon builds a
    ``LoadSessionResponse[bytes]`` whose lists are the published envelopes (written without a
    copy), a client reads a ``LoadSessionResponse[DaemonEvent]``."""

    history_has_more: bool | UnsetType = UNSET
    history_anchor_record_id: str | UnsetType = UNSET
    last_event_id: EventId
    event_epoch: str
    replay_degraded: bool | UnsetType = UNSET
    prompt_terminals: list[PromptTerminal] | UnsetType = UNSET
    # false when the agent session behind it had to be recreated (the agent's own
    # session/load failed, or it has none): the transcript is whole, the agent's context is
    # not (constants.AGENT_CONTEXT_LOST). Not sent by every daemon.
    agent_session_restored: bool | UnsetType = UNSET
    live_journal: list[EventT]
    compacted_replay: list[EventT]

    @property
    def events(self) -> list[EventT]:
        """The replay in rebuild order: ``compactedReplay``, then ``liveJournal``."""
        return [*self.compacted_replay, *self.live_journal]


class PromptAccepted(_Body, kw_only=True):
    """The 202 of a prompt: its id, and the cursor read before admission."""

    prompt_id: str
    last_event_id: EventId
    event_epoch: str


#: How far a prompt got (``GET /session/{id}/prompts/{idempotencyKey}``).
PromptProgress = Literal["queued", "running", "completed", "cancelled", "error", "interrupted"]


class PromptByKeyResponse(_Body, kw_only=True):
    """``GET /session/{id}/prompts/{idempotencyKey}``: the prompt admitted with that key, the
    202 body it was answered with (``promptId``, ``lastEventId``, ``eventEpoch``), and how far
    it got. ``state`` is ``queued`` or ``running`` while it is in flight, else its ledger
    terminal: ``completed``, ``cancelled``, ``error``, or ``interrupted`` (the daemon stopped
    while it was in flight; also while such a session is not yet restored)."""

    v: Literal[1]
    session_id: str
    idempotency_key: str
    prompt_id: str
    last_event_id: EventId
    event_epoch: str
    state: PromptProgress
    stop_reason: str | UnsetType = UNSET
    admitted_at: int | UnsetType = UNSET
    ended_at: int | UnsetType = UNSET


class PermissionVoteResponse(_Body, kw_only=True):
    request_id: str
    outcome: PermissionOutcome


class TranscriptPage(_Body, Generic[EventT], kw_only=True):
    """``GET /session/{id}/transcript``: one page, chronological inside, newest page first.
    The daemon builds a ``TranscriptPage[bytes]`` (the events as stored, written without a
    copy), a client reads a ``TranscriptPage[DaemonEvent]``."""

    v: Annotated[Literal[1], Sent] = 1
    session_id: str
    has_more: bool
    next_cursor: str | UnsetType = UNSET
    events: list[EventT]


class JournalStatus(_Body, kw_only=True):
    entries: int
    bytes: int
    truncated_events: int
    retained_events: int


class TranscriptRecovery(_Body, kw_only=True):
    """Cluster mode: the session's transcript lagged behind Redis (``laggedAt``, ms) and has
    caught up (``recoveredAt``): ``caughtUpEvents`` events reached Redis meanwhile, and
    ``lostEvents`` of those published before it caught up never did (0: nothing lost)."""

    lagged_at: int
    recovered_at: int
    caught_up_events: int
    lost_events: int


class SessionStatusResponse(_Body, kw_only=True):
    session_id: str
    workspace_cwd: str
    has_active_prompt: bool
    active_prompt_id: str | None
    pending_prompts: int
    last_event_id: EventId
    durable_event_id: EventId
    event_epoch: str
    transcript_degraded: bool
    full_transcript_available: bool
    replay_degraded: bool
    subscribers: int
    slow_client_warnings: int
    clients_evicted: int
    journal: JournalStatus
    server_time: int
    # Cluster mode only: the node that runs the session, and the session's stream readers per
    # node (the owner's own and those of mirrors on other nodes; ``subscribers`` is their sum).
    owner_node_id: str | UnsetType = UNSET
    subscribers_by_node: dict[str, int] | UnsetType = UNSET
    # As on the load answer: false when the agent session had to be recreated.
    agent_session_restored: bool | UnsetType = UNSET
    # Cluster mode, once the session's transcript lagged behind Redis and recovered: when,
    # and what was lost (see TranscriptRecovery).
    transcript_recovery: TranscriptRecovery | UnsetType = UNSET


class HeartbeatResponse(_Body, kw_only=True):
    session_id: str
    server_time: int


class ErrorBody(_Body, kw_only=True):
    """Every error the daemon makes: ``{error, code, ...details}``; the details a code carries
    are named here, in wire order."""

    error: str
    code: str
    session_id: str | UnsetType = UNSET
    request_id: str | UnsetType = UNSET
    cwd: str | UnsetType = UNSET
    limit: int | UnsetType = UNSET
    pending_count: int | UnsetType = UNSET
    idempotency_key: str | UnsetType = UNSET
    prompt_id: str | UnsetType = UNSET
    # A 503 a client should simply repeat (cluster mode): after ``retryAfterMs`` (also sent
    # as ``Retry-After``, in seconds).
    retryable: bool | UnsetType = UNSET
    retry_after_ms: int | UnsetType = UNSET


#: An error body repeats request input (a cwd, an id from the path, an agent's message) at most
#: this many characters per member, so a huge input never comes back huge.
ECHO_MAX_CHARS: Final = 300


def echo(value: Any) -> Any:
    """``value`` as an error body may carry it: a long string is cut, with its length said."""
    if isinstance(value, str) and len(value) > ECHO_MAX_CHARS:
        return f"{value[:ECHO_MAX_CHARS]}… ({len(value)} characters)"
    return value


def error_body(code: str, error: str, **details: Any) -> ErrorBody:
    """An :class:`ErrorBody` (``details`` by field name: ``session_id=``, ``limit=`` …), each
    string it carries cut to :data:`ECHO_MAX_CHARS`."""
    return ErrorBody(error=echo(error), code=code,
                     **{name: echo(value) for name, value in details.items()})


# An error body is built with error_body (which bounds what it repeats of the request) or one
# of these builders: the errors more than one part of the daemon answers, each written once.


def session_not_found(session_id: str) -> ErrorBody:
    """404: no session with this id (never created, closed, or not restored)."""
    return error_body("session_not_found", f'No session with id "{session_id}"',
                      session_id=session_id)


def route_not_found() -> ErrorBody:
    """404: no route has this path."""
    return ErrorBody(error="Route not found", code="route_not_found")


def method_not_allowed() -> ErrorBody:
    """405: the path's route answers other methods (``Allow`` names them)."""
    return ErrorBody(error="Method not allowed", code="method_not_allowed")


def body_too_large() -> ErrorBody:
    """413: a request body over the 10 MB limit."""
    return ErrorBody(error="Request body too large (max 10 MB)", code="body_too_large")


REQUEST_TYPES: Final = (CreateSessionRequest, LoadSessionRequest, ResumeSessionRequest,
                        PromptRequest, PermissionVoteRequest, TranscriptQuery, SessionsQuery)
RESPONSE_TYPES: Final = (HealthResponse, CapabilitiesResponse, DaemonStatusResponse,
                         CreateSessionResponse, LoadSessionResponse, ResumeSessionResponse,
                         PromptAccepted, PromptByKeyResponse, PermissionVoteResponse,
                         TranscriptPage, SessionStatusResponse, HeartbeatResponse, SessionList,
                         ErrorBody)
# The generic bodies whose lists of envelopes the schema describes as DaemonEvent.
_DESCRIBED: Final = (LoadSessionResponse, TranscriptPage)


def body_schemas(ref_template: str) -> dict[str, dict[str, Any]]:
    """JSON Schema of every request and response body, by class name, generated from the
    Structs (``msgspec.json.schema_components``): the lists of envelopes as
    :class:`~sdk.protocol.envelope.DaemonEvent`, and each :data:`Sent` member required (and
    without the default a client falls back to)."""
    # The envelope's types load here, not with the bodies: a daemon serves these bodies from
    # its start, and builds no event until its first session.
    from sdk.protocol.envelope import DaemonEvent

    described: dict[type, Any] = {kind: kind[DaemonEvent] for kind in _DESCRIBED}
    types = [described.get(kind, kind) for kind in (*REQUEST_TYPES, *RESPONSE_TYPES)]
    _, generated = msgspec.json.schema_components(types, ref_template=ref_template)
    # A generic body's component is named for its parameter (TranscriptPage_DaemonEvent_).
    renamed = {f"{kind.__name__}_DaemonEvent_": kind.__name__ for kind in _DESCRIBED}
    text = msgspec.json.encode(generated).decode()
    for old, new in renamed.items():
        text = text.replace(ref_template.format(name=old), ref_template.format(name=new))
    schemas: dict[str, dict[str, Any]] = {
        renamed.get(name, name): schema
        for name, schema in msgspec.json.decode(text).items()}
    for name in renamed.values():
        schemas[name]["title"] = name
    for kind in _struct_types(types):
        schema = schemas[kind.__name__]
        sent = _sent_members(kind)
        if sent:
            order = [field.encode_name for field in _fields(kind)]
            required = set(schema.get("required", ())) | set(sent)
            schema["required"] = [name for name in order if name in required]
            for name in sent:
                schema["properties"][name].pop("default", None)
    return schemas


def _fields(kind: type) -> tuple[msgspec.inspect.Field, ...]:
    info = msgspec.inspect.type_info(kind)
    assert isinstance(info, msgspec.inspect.StructType)
    return info.fields


def _sent_members(kind: type) -> list[str]:
    """Wire names of ``kind``'s :data:`Sent` members."""
    return [field.encode_name for field in _fields(kind)
            if isinstance(field.type, msgspec.inspect.Metadata)
            and (field.type.extra or {}).get("sent")]


def _struct_types(types: list[Any]) -> list[type]:
    """Every Struct class the bodies hold, the bodies included (each once)."""
    seen: dict[type, None] = {}

    def visit(node: msgspec.inspect.Type) -> None:
        if isinstance(node, msgspec.inspect.StructType):
            if node.cls in seen:
                return
            seen[node.cls] = None
            for field in node.fields:
                visit(field.type)
        elif isinstance(node, msgspec.inspect.Metadata):
            visit(node.type)
        elif isinstance(node, msgspec.inspect.UnionType):
            for option in node.types:
                visit(option)
        elif isinstance(node, msgspec.inspect.ListType | msgspec.inspect.DictType):
            visit(node.item_type if isinstance(node, msgspec.inspect.ListType)
                  else node.value_type)

    for info in msgspec.inspect.multi_type_info(types):
        visit(info)
    return list(seen)


# --- views of a body as sent --------------------------------------------------------------------
# A route that forwards part of a body unchanged (the prompt's blocks go to the agent with every
# member the client sent) reads that part through a view: only the named member is picked, and
# its value is the very object of the decoded body.


class _PromptBlocksView(msgspec.Struct, frozen=True, gc=False):
    prompt: Any = None


class _SessionIdView(msgspec.Struct, frozen=True, rename="camel", gc=False):
    session_id: Any = None


def view_prompt_blocks(body: object) -> list[Any] | None:
    """The ``prompt`` blocks of a prompt body exactly as sent (a body :class:`PromptRequest`
    accepted), or ``None`` when ``body`` has no list there."""
    if type(body) is not dict:
        return None
    found = msgspec.convert(body, _PromptBlocksView).prompt
    return found if type(found) is list else None


def view_session_id(body: object) -> object:
    """The ``sessionId`` member of a body as sent (any value; ``None`` when absent or when
    ``body`` is not an object)."""
    if type(body) is not dict:
        return None
    return msgspec.convert(body, _SessionIdView).session_id


class ErrorBodyView(msgspec.Struct, frozen=True, rename="camel", gc=False):
    """An error answer's body as a client reads it: every member any value (a proxy or an older
    daemon may send anything), absent ones ``None``. :class:`ErrorBody` is the strict shape."""

    error: Any = None
    message: Any = None
    code: Any = None
    retryable: Any = None
    limit: Any = None
    pending_count: Any = None


def view_error_body(body: object) -> ErrorBodyView | None:
    """:class:`ErrorBodyView` of a decoded error body (any mapping), ``None`` for anything else."""
    if isinstance(body, Mapping):
        return msgspec.convert(dict(body), ErrorBodyView)
    return None


class _StatusSessionsView(msgspec.Struct, frozen=True, gc=False):
    sessions: list[dict[str, Any]] | None = None


def view_status_sessions(body: bytes) -> list[SessionListing]:
    """The live sessions of a ``GET /daemon/status`` answer as :class:`SessionListing` rows, each
    ``state`` worked out by :func:`session_state` (what a client lists from a daemon without
    ``GET /sessions``). Only the ``sessions`` rows are read: the rest of the status may differ
    from this daemon's. Raises ``msgspec.DecodeError`` / ``msgspec.ValidationError`` for rows a
    listing cannot hold."""
    rows = msgspec.json.decode(body, type=_StatusSessionsView).sessions or []
    return [msgspec.convert({**row, "state": session_state(row.get("hasActivePrompt") is True,
                                                           bool(row.get("pendingPrompts")))},
                            SessionListing)
            for row in rows]
