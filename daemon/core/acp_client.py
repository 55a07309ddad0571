"""The ACP client's rules, sans-IO: what the daemon asks an agent and how it reads the answers.

:class:`AcpClient` is the client side of one agent connection as a state machine in the h11
style: the shell (``daemon.agent``) hands it the lines the agent wrote and gets back what they
mean (updates grouped by the session they are routed to, replies matched to the requests
waiting for them, the agent's own requests, and what to log); it asks it for the bytes of each
request it sends. The rules it holds:

- The client speaks ACP protocol version 1; an agent whose ``initialize`` result names another
  version, or is not an object, or whose ``agentCapabilities`` is not an object, has not
  started. ``loadSession`` is supported only when the agent says ``true``.
- A ``session/update`` is routed by its ``sessionId`` to the session attached under that id;
  one for no attached session is dropped (and reported). While a ``session/load`` for a
  session is outstanding, the updates the agent replays for it are consumed, not routed: the
  daemon already holds that history. Suppression ends when the load's reply is read (updates
  after the reply, even in the same read, are routed) or when its caller stops waiting.
- Updates for a session whose ``session/new`` or ``session/load`` reply has been read but that
  nobody has attached yet (the daemon is still setting the session up; opencode writes its
  first update in the same read as its ``session/new`` reply) are held, up to
  ``MAX_HELD_UPDATES`` updates and ``MAX_HELD_BYTES`` per session and ``MAX_HELD_SESSIONS``
  sessions, and handed over when the daemon has the session ready (:meth:`AcpClient.take_held`;
  until then they are held even once its sink is attached, so that none overtakes them).
- Replies are matched to requests by id; ids are allocated here and never reused, and a reply
  with an id nobody waits for is reported, not delivered.
- The agent's ``session/request_permission`` is answered by the session it names (an unknown
  session gets an "invalid params" error, a session with ``MAX_PENDING_PERMISSIONS``
  unanswered requests a "too many requests" error, both decided as the line is read, so a flood
  costs no task); any other request the agent makes gets "method not found". Notifications
  other than ``session/update`` are reported and ignored.
- One ACP session id routes to one sink: attaching a second sink under an id that is attached
  already is refused (an agent that hands out one id twice must not merge two sessions).

No trio, no clock, no I/O, no logging: the shell moves the bytes, owns the process, the timers
and the tasks, and logs the reports. ``S`` is the shell's session sink and ``W`` the shell's
waiter for one reply; the core stores both and never calls them.
"""

from __future__ import annotations

from typing import Any, Final, Generic, TypeVar

import msgspec

from sdk.protocol import __version__
from sdk.protocol.acp import (
    NewSessionResultView,
    PermissionAnswer,
    PermissionParamsView,
    SessionUpdateView,
    view,
)

from .acp_codec import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    Notification,
    Pending,
    PendingRequests,
    Read,
    Request,
    Response,
    encode_error,
    encode_notification,
    encode_request,
    encode_result,
    parse_message,
    parse_update,
    prefix_of,
    splice_updates,
    update_prefix,
)
from .envelope import encode_json
from .updates import UpdateBatch, compact, compact_chunks, plain_chunk_lines

__all__ = [
    "DEFAULT_CLIENT_INFO",
    "MAX_HELD_BYTES",
    "MAX_HELD_SESSIONS",
    "MAX_HELD_UPDATES",
    "MAX_PENDING_PERMISSIONS",
    "PROTOCOL_VERSION",
    "TOO_MANY_REQUESTS",
    "AcpClient",
    "AgentProtocolError",
    "AgentRpcError",
    "BadUpdate",
    "Batch",
    "Event",
    "HeldUpdatesDropped",
    "Initialized",
    "MalformedLine",
    "NotificationIgnored",
    "PermissionAsked",
    "PermissionRefused",
    "Replied",
    "ReplyUnknown",
    "SessionIdInUse",
    "UnroutedPermission",
    "UnroutedUpdate",
    "UnsupportedRequest",
    "cancel_line",
    "check_initialize",
    "initialize_params",
    "load_session_params",
    "new_session_params",
    "permission_failed",
    "permission_granted",
    "prompt_params",
    "prompt_result",
    "session_id_of",
]

PROTOCOL_VERSION: Final = 1
DEFAULT_CLIENT_INFO: Final = {"name": "turnkeeper", "version": __version__}

# How much of an offending line a report keeps.
_EXCERPT_BYTES: Final = 200
# Unanswered permission requests one session may have; the agent's next one is refused.
MAX_PENDING_PERMISSIONS: Final = 64
# The JSON-RPC error (implementation-defined server range) refusing a request over a cap.
TOO_MANY_REQUESTS: Final = -32000
# Updates held for a session between its session/new or session/load reply and its attach.
MAX_HELD_UPDATES: Final = 256
MAX_HELD_BYTES: Final = 1024 * 1024
MAX_HELD_SESSIONS: Final = 64
# Requests whose successful reply starts holding updates for the session they name.
_HOLDING_METHODS: Final = frozenset({"session/new", "session/load"})

S = TypeVar("S")
W = TypeVar("W")


class AgentRpcError(Exception):
    """The agent answered a request with a JSON-RPC error."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"agent error {code}: {message}")
        self.code = code
        self.message = message


class SessionIdInUse(Exception):
    """An ACP session id the client already routes to another sink."""

    def __init__(self, acp_session_id: str) -> None:
        super().__init__(f"ACP session id {acp_session_id!r} is already in use by another "
                         f"session of this agent")
        self.acp_session_id = acp_session_id


class AgentProtocolError(AgentRpcError):
    """The agent answered with a result that does not have the shape ACP requires."""

    def __init__(self, message: str) -> None:
        super().__init__(INTERNAL_ERROR, message)


# --------------------------------------------------------------------------------------------
# Requests the client makes, and the checks on their results


def initialize_params(client_info: dict[str, Any]) -> dict[str, Any]:
    """The ``initialize`` request: our protocol version, no file-system capabilities."""
    return {
        "protocolVersion": PROTOCOL_VERSION,
        "clientCapabilities": {"fs": {"readTextFile": False, "writeTextFile": False}},
        "clientInfo": client_info,
    }


class Initialized(msgspec.Struct, frozen=True):
    """A valid ``initialize`` result."""

    capabilities: dict[str, Any]
    supports_load_session: bool
    agent_info: Any


def check_initialize(result: Any) -> Initialized | str:
    """The agent's ``initialize`` result, checked; a string says why the agent did not start."""
    if type(result) is not dict:
        return f"initialize result is not an object: {result!r:.200}"
    version = result.get("protocolVersion")
    if version != PROTOCOL_VERSION or type(version) is not int:
        return f"unsupported protocolVersion {version!r} (we speak {PROTOCOL_VERSION})"
    capabilities = result.get("agentCapabilities")
    if capabilities is None:
        capabilities = {}
    if type(capabilities) is not dict:
        return f"agentCapabilities is not an object: {capabilities!r:.200}"
    return Initialized(
        capabilities=capabilities,
        supports_load_session=capabilities.get("loadSession") is True,
        agent_info=result.get("agentInfo"),
    )


def new_session_params(cwd: str) -> dict[str, Any]:
    return {"cwd": cwd, "mcpServers": []}


def load_session_params(acp_session_id: str, cwd: str) -> dict[str, Any]:
    return {"sessionId": acp_session_id, "cwd": cwd, "mcpServers": []}


def prompt_params(acp_session_id: str, prompt: list[Any]) -> dict[str, Any]:
    return {"sessionId": acp_session_id, "prompt": prompt}


def cancel_line(acp_session_id: str) -> bytes:
    """The ``session/cancel`` notification (the running prompt's reply carries the outcome)."""
    return encode_notification("session/cancel", {"sessionId": acp_session_id})


def session_id_of(result: Any) -> str:
    """The new session's id from a ``session/new`` result; AgentProtocolError if it has none."""
    found = view(result, NewSessionResultView)
    session_id = None if found is None else found.session_id
    if type(session_id) is not str or not session_id:
        raise AgentProtocolError(f"session/new result has no sessionId: {result!r:.200}")
    return session_id


def prompt_result(result: Any) -> dict[str, Any]:
    """A ``session/prompt`` result, which must be an object; else AgentProtocolError."""
    if type(result) is not dict:
        raise AgentProtocolError(f"session/prompt result is not an object: {result!r:.200}")
    return result


def permission_granted(request: Request, result: PermissionAnswer) -> bytes:
    """The reply to a permission request, with the session's decision."""
    return encode_result(request.id, result)


def permission_failed(request: Request, exc: BaseException) -> bytes:
    """The reply to a permission request whose handler failed."""
    return encode_error(request.id, INTERNAL_ERROR, f"permission failed: {exc}")


# --------------------------------------------------------------------------------------------
# What one read batch meant (besides the updates): reports, replies, the agent's requests


class Replied(msgspec.Struct, Generic[W], frozen=True):
    """A reply to one of our requests: ``error`` is None on success."""

    waiter: W
    method: str
    result: Any
    error: AgentRpcError | None


class ReplyUnknown(msgspec.Struct, frozen=True):
    """A reply whose id no request is waiting for (never sent, answered, or given up on)."""

    id: Any


class PermissionAsked(msgspec.Struct, Generic[S], frozen=True):
    """The agent asks ``sink`` (attached under ``session_id``) for a permission; the shell
    answers it in its own task, then calls :meth:`AcpClient.permission_answered`."""

    request: Request
    session_id: str
    sink: S
    params: dict[str, Any]


class PermissionRefused(msgspec.Struct, frozen=True):
    """A permission request over the session's cap; ``reply`` is the error to send."""

    session_id: str
    reply: bytes


class UnsupportedRequest(msgspec.Struct, frozen=True):
    """The agent made a request the client does not serve; ``reply`` is the error to send."""

    method: str
    id: Any
    reply: bytes


class UnroutedUpdate(msgspec.Struct, frozen=True):
    """A ``session/update`` for a session nobody attached: dropped."""

    session_id: str


class HeldUpdatesDropped(msgspec.Struct, frozen=True):
    """Updates for a session not attached yet went past the hold's bounds (reported once per
    session): ``reason`` says which bound."""

    session_id: str
    reason: str


class BadUpdate(msgspec.Struct, frozen=True):
    """A ``session/update`` without a string ``sessionId`` and an object ``update``."""

    excerpt: bytes


class NotificationIgnored(msgspec.Struct, frozen=True):
    method: str


class MalformedLine(msgspec.Struct, frozen=True):
    """A line that is not a JSON-RPC 2.0 message."""

    reason: str
    excerpt: bytes


class UnroutedPermission(msgspec.Struct, frozen=True):
    """A permission request naming no attached session; ``reply`` is the error to send."""

    session_id: Any
    reply: bytes


# Generic in (S, W), in the order they first appear.
Event = (
    PermissionAsked[S] | Replied[W] | ReplyUnknown | PermissionRefused | UnroutedPermission
    | UnsupportedRequest | UnroutedUpdate | HeldUpdatesDropped | BadUpdate
    | NotificationIgnored | MalformedLine
)


class Batch(msgspec.Struct, Generic[S, W]):
    """What one read batch meant.

    ``updates`` maps each session that got updates to its sink and those updates (an
    :class:`~daemon.core.updates.UpdateBatch`: the agent's compact JSON bytes of each
    ``update`` object, in stdout order, with what the read found out about them), in the order
    the sessions first appeared; ``events`` is everything else, in line order.
    """

    updates: dict[str, tuple[S, UpdateBatch]]
    events: list[Event[S, W]]


class _Held:
    """Updates held for one session until it is attached (bounded)."""

    __slots__ = ("dropped", "nbytes", "updates")

    def __init__(self) -> None:
        self.updates: list[bytes] = []
        self.nbytes = 0
        self.dropped = False

    def add(self, session_id: str, raw: bytes) -> HeldUpdatesDropped | None:
        """Hold ``raw``; past a bound it is dropped, and the first drop is reported."""
        if len(self.updates) < MAX_HELD_UPDATES and self.nbytes + len(raw) <= MAX_HELD_BYTES:
            self.updates.append(raw)
            self.nbytes += len(raw)
            return None
        if self.dropped:
            return None
        self.dropped = True
        reason = (f"over_{MAX_HELD_UPDATES}_updates" if len(self.updates) >= MAX_HELD_UPDATES
                  else f"over_{MAX_HELD_BYTES}_bytes")
        return HeldUpdatesDropped(session_id, reason)


# --------------------------------------------------------------------------------------------
# The connection


class AcpClient(Generic[S, W]):
    """The client side of one agent connection: sessions, outstanding requests, loads."""

    __slots__ = ("_asking", "_by_prefix", "_held", "_load_of", "_loading", "pending", "sinks")

    def __init__(self) -> None:
        self.pending: PendingRequests[W] = PendingRequests()
        # The attached sinks by session id (read it, change it through attach and detach).
        self.sinks: dict[str, S] = {}
        # Unanswered permission requests per session id (only while there are some).
        self._asking: dict[str, int] = {}
        # The attached sessions by what their update lines start with (acp_codec.update_prefix):
        # a read's session is found in one lookup, however many sessions are attached.
        self._by_prefix: dict[bytes, str] = {}
        # Sessions being loaded (a count: two loads of one session may overlap), and which
        # request loads which session.
        self._loading: dict[str, int] = {}
        self._load_of: dict[int, str] = {}
        # Sessions created or loaded and not attached yet, oldest first, with their updates.
        self._held: dict[str, _Held] = {}

    # Sessions

    def attach(self, acp_session_id: str, sink: S) -> None:
        """Route the session's updates and permission requests to ``sink``. Raises
        :class:`SessionIdInUse` if another sink is attached under that id (attaching the same
        sink again is a no-op)."""
        current = self.sinks.get(acp_session_id)
        if current is not None:
            if current is sink:
                return
            raise SessionIdInUse(acp_session_id)
        self.sinks[acp_session_id] = sink
        self._by_prefix[update_prefix(acp_session_id)] = acp_session_id

    def take_held(self, acp_session_id: str) -> list[bytes]:
        """The updates held for ``acp_session_id`` since its ``session/new`` or
        ``session/load`` reply, in stdout order, and the end of holding for it: later updates
        go to the attached sink. Hand them to the sink before anything it reads next."""
        held = self._held.pop(acp_session_id, None)
        return [] if held is None else held.updates

    def holding(self, acp_session_id: str) -> bool:
        return acp_session_id in self._held

    def _hold(self, acp_session_id: str) -> None:
        if acp_session_id in self.sinks or acp_session_id in self._held:
            return
        while len(self._held) >= MAX_HELD_SESSIONS:  # never attached: the oldest goes
            del self._held[next(iter(self._held))]
        self._held[acp_session_id] = _Held()

    def is_attached(self, acp_session_id: str) -> bool:
        return acp_session_id in self.sinks

    def detach(self, acp_session_id: str, sink: S | None = None) -> None:
        """Stop routing ``acp_session_id``; with ``sink``, only if that sink is the one
        attached (a session never detaches another's id)."""
        if sink is not None and self.sinks.get(acp_session_id) is not sink:
            return
        self.sinks.pop(acp_session_id, None)
        self._by_prefix.pop(update_prefix(acp_session_id), None)
        self._held.pop(acp_session_id, None)

    def attached(self) -> list[S]:
        """The sinks attached now."""
        return list(self.sinks.values())

    def is_loading(self, acp_session_id: str) -> bool:
        return acp_session_id in self._loading

    # Requests

    def request(
        self, method: str, params: dict[str, Any], waiter: W, *, loading: str | None = None
    ) -> tuple[int, bytes]:
        """Register a request; returns its id and the line to write. ``loading`` names the
        session a ``session/load`` restores: its replayed updates are consumed until the reply
        is read or :meth:`finished` is called."""
        request_id = self.pending.allocate(method, waiter)
        if loading is not None:
            self._loading[loading] = self._loading.get(loading, 0) + 1
            self._load_of[request_id] = loading
        return request_id, encode_request(request_id, method, params)

    def finished(self, request_id: int) -> None:
        """The caller stopped waiting for ``request_id`` (answered, failed, or cancelled): a
        late reply is then reported as unknown, and a load it made ends."""
        self.pending.discard(request_id)
        self._release(request_id)

    def drain(self) -> list[Pending[W]]:
        """Remove and return every outstanding request (the connection closed). Loads end
        when their callers call :meth:`finished`."""
        return self.pending.drain()

    def _release(self, request_id: int) -> None:
        session_id = self._load_of.pop(request_id, None)
        if session_id is None:
            return
        remaining = self._loading[session_id] - 1
        if remaining > 0:
            self._loading[session_id] = remaining
        else:
            del self._loading[session_id]

    # Reading

    def receive(self, read: Read) -> Batch[S, W]:
        """What a read's complete lines mean, read in order (a read whose ``spaced`` is False
        holds no space, tab or CR: no update needs making compact)."""
        lines, spaced = read.lines, read.spaced
        if lines:
            # The usual read: one session's updates, each line the session's prefix, an
            # update object and "}}". Checked for all lines at once; else line by line.
            prefix = prefix_of(lines[0])
            session_id = None if prefix is None else self._by_prefix.get(prefix)
            if prefix is not None and session_id is not None:
                if lines[-1].startswith(prefix):
                    batch = _prefixed_batch(lines, prefix, spaced)
                    if batch is not None:
                        return self._route_one(session_id, batch.updates, batch)
                # Several sessions' updates (many paced turns on one agent): each session's
                # lines checked at once, as above.
                grouped = self._grouped(lines, spaced)
                if grouped is not None:
                    return grouped
        updates: dict[str, tuple[S, list[bytes]]] = {}
        events: list[Event[S, W]] = []
        sinks = self.sinks
        loading = self._loading
        # The session of the previous routed update and its list: most reads are one session's.
        last_id: str | None = None
        last: list[bytes] = []
        for line in lines:
            fast = parse_update(line)
            if fast is not None:
                # The common line: an update, its bytes handed on undecoded.
                session_id, raw = fast
                if spaced:
                    raw = compact(raw)
            else:
                msg = parse_message(line)
                if isinstance(msg, Notification):
                    if msg.method != "session/update":
                        events.append(NotificationIgnored(msg.method))
                        continue
                    params = msg.params
                    if type(params) is not dict:
                        events.append(BadUpdate(line[:_EXCERPT_BYTES]))
                        continue
                    found = view(params, SessionUpdateView)
                    assert found is not None  # params is an object
                    sid = found.session_id
                    update = found.update
                    if type(sid) is not str or type(update) is not dict:
                        events.append(BadUpdate(line[:_EXCERPT_BYTES]))
                        continue
                    session_id, raw = sid, encode_json(update)
                elif isinstance(msg, Response):
                    events.append(self._resolve(msg))
                    continue
                elif isinstance(msg, Request):
                    events.append(self._agent_request(msg))
                    continue
                else:
                    events.append(MalformedLine(msg.reason, msg.excerpt))
                    continue
            if session_id in loading:
                continue  # session/load replay: the daemon already has this history.
            if session_id == last_id:
                last.append(raw)
                continue
            entry = updates.get(session_id)
            if entry is None:
                held = self._held.get(session_id)
                if held is not None:
                    if (dropped := held.add(session_id, raw)) is not None:
                        events.append(dropped)
                    continue
                sink = sinks.get(session_id)
                if sink is None:
                    events.append(UnroutedUpdate(session_id))
                    continue
                entry = updates[session_id] = (sink, [])
            last_id, last = session_id, entry[1]
            last.append(raw)
        return Batch({session_id: (sink, UpdateBatch.of(raws))
                      for session_id, (sink, raws) in updates.items()}, events)

    def _grouped(self, lines: list[bytes], spaced: bool) -> Batch[S, W] | None:
        """A read of nothing but updates of attached, ready sessions, each line starting
        with its session's prefix: each session's lines read at once (``_prefixed_batch``),
        the sessions in the order of their first line. ``None`` when any line is not such an
        update (the caller then reads the lines one at a time, with the same result)."""
        by_prefix = self._by_prefix
        groups: dict[bytes, list[bytes]] = {}
        for line in lines:
            prefix = prefix_of(line)
            if prefix is None or prefix not in by_prefix:
                return None
            group = groups.get(prefix)
            if group is None:
                groups[prefix] = [line]
            else:
                group.append(line)
        updates: dict[str, tuple[S, UpdateBatch]] = {}
        for prefix, group in groups.items():
            session_id = by_prefix[prefix]
            if session_id in self._loading or session_id in self._held:
                return None
            batch = _prefixed_batch(group, prefix, spaced)
            if batch is None:
                return None
            updates[session_id] = (self.sinks[session_id], batch)
        return Batch(updates, [])

    def _route_one(self, session_id: str, raws: list[bytes],
                   batch: UpdateBatch | None = None) -> Batch[S, W]:
        """A read's updates all for one attached session (the usual read); ``batch``: theirs,
        when the read already found their run."""
        if session_id in self._loading:
            return Batch({}, [])  # session/load replay: the daemon already has this history.
        held = self._held.get(session_id)
        if held is not None:  # attached, but the session is not ready yet
            return Batch({}, [drop for raw in raws
                              if (drop := held.add(session_id, raw)) is not None])
        return Batch({session_id: (self.sinks[session_id],
                                   batch if batch is not None else UpdateBatch.of(raws))}, [])

    def _resolve(self, response: Response) -> Replied[W] | ReplyUnknown:
        pending = self.pending.resolve(response)
        if pending is None:
            return ReplyUnknown(response.id)
        error = response.error  # an error reply's result is None
        if error is None and pending.method in _HOLDING_METHODS:
            loaded = self._load_of.get(pending.id)
            found = view(response.result, NewSessionResultView) if loaded is None else None
            session_id = loaded if found is None else found.session_id
            if type(session_id) is str and session_id:
                self._hold(session_id)
        self._release(pending.id)
        return Replied(
            pending.waiter,
            pending.method,
            response.result,
            None if error is None else AgentRpcError(error.code, error.message),
        )

    def _agent_request(
        self, request: Request
    ) -> PermissionAsked[S] | PermissionRefused | UnroutedPermission | UnsupportedRequest:
        if request.method == "session/request_permission":
            return self._permission(request)
        reply = encode_error(request.id, METHOD_NOT_FOUND, f"Method not found: {request.method}")
        return UnsupportedRequest(request.method, request.id, reply)

    def _permission(
        self, request: Request
    ) -> PermissionAsked[S] | PermissionRefused | UnroutedPermission:
        """Who decides a permission request, looked up as it is read: the session it names,
        unless that session is unknown or has :data:`MAX_PENDING_PERMISSIONS` unanswered."""
        params = request.params
        found = view(params, PermissionParamsView)
        session_id = None if found is None else found.session_id
        sink = self.sinks.get(session_id) if type(session_id) is str else None
        if sink is None:
            reply = encode_error(request.id, INVALID_PARAMS, f"unknown session {session_id!r}")
            return UnroutedPermission(session_id, reply)
        assert type(session_id) is str and type(params) is dict
        asking = self._asking.get(session_id, 0)
        if asking >= MAX_PENDING_PERMISSIONS:
            reply = encode_error(
                request.id, TOO_MANY_REQUESTS,
                f"too many pending permission requests for session {session_id!r} "
                f"(limit {MAX_PENDING_PERMISSIONS})")
            return PermissionRefused(session_id, reply)
        self._asking[session_id] = asking + 1
        return PermissionAsked(request, session_id, sink, params)

    def permission_answered(self, session_id: str) -> None:
        """The answer to one :class:`PermissionAsked` of ``session_id`` went out (or failed)."""
        left = self._asking.get(session_id, 0) - 1
        if left > 0:
            self._asking[session_id] = left
        else:
            self._asking.pop(session_id, None)

    def pending_permissions(self, session_id: str) -> int:
        return self._asking.get(session_id, 0)


def _prefixed_batch(lines: list[bytes], prefix: bytes, spaced: bool) -> UpdateBatch | None:
    """The batch of ``lines``, each ``prefix``, one update object and ``}}``, read at once
    (plain text chunks of one kind in one decode, else the updates spliced out), made compact
    if the read was ``spaced``; ``None`` when any line is not such a line."""
    plain = plain_chunk_lines(lines, prefix)
    if plain is not None:  # the usual read of a turn: text chunks only
        raws, run = plain
        if spaced:
            raws = compact_chunks(raws, run[1])
        return UpdateBatch(raws, run)
    spliced = splice_updates(lines, prefix)
    if spliced is None:
        return None
    if spaced:
        spliced = list(map(compact, spliced))
    return UpdateBatch.of(spliced)
