"""The session manager: one agent process per workspace, the live sessions, client ids.

Agents and sessions run as tasks in the manager's nursery (the daemon's root nursery owns it).
An agent's death ends its own sessions only; the next request for that workspace starts a new
agent.

Client input cannot grow the daemon's resources without bound: a workspace is named by its
canonical path (so spellings of one directory share one agent), an agent whose workspace has had
no session for ``--agent-idle-ms`` is stopped (stdin EOF) and started again on demand, and the
per-key locks live only while somebody holds or waits for them. Requests that need a
workspace's agent while it is starting share that one start attempt and its outcome.

An agent cannot merge sessions: the ACP session id it answers ``session/new`` with is attached
to the new daemon session before anything else can run, and an id already attached to another
live session of that agent fails the create (502 ``agent_session_id_reused``).

``--max-sessions`` bounds the live (loaded) sessions: past it, creating or restoring one raises
:class:`SessionLimit` (503), while attaching to a loaded session, its prompts and its streams go
on as ever. A session that ends, or is unloaded when idle, frees its slot.

``--session-idle-ms`` unloads a session that has had no subscriber, no prompt and no request
for that long (with a transcript, in single-node mode): it ends without a frame or a write, and
any request naming it (:meth:`SessionManager.live`, or a load or resume) restores it from the
transcript as after a restart. One task looks at every session a few times per idle period.
"""

from __future__ import annotations

import gc
import logging
import os
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from datetime import UTC, datetime
from functools import partial
from typing import TYPE_CHECKING

import trio

from sdk.protocol import __version__
from sdk.protocol.http import SessionCounts, TranscriptRecovery

from .clock import now_ms
from .config import MOCK_GATE_ENV, DaemonConfig
from .core.clients import ClientRegistry
from .core.session_list import ListIndex
from .core.throttle import LogThrottle
from .metrics import totals
from .transcript_store import MarkClosed, SessionRow, UpsertSession
from .transcript_writer import TranscriptWriter

if TYPE_CHECKING:
    # A session's machinery (its agent channel, bus and session, and their code) is imported
    # by the first session created or restored, not by the daemon's start: an idle daemon
    # never holds it (tests/daemon/test_idle_footprint.py).
    from .agent import AgentChannel
    from .bus import BusLimits, HeapReclaimer, SessionBus
    from .session import Session

log = logging.getLogger("daemon.manager")


def iso_from_ms(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace(
        "+00:00", "Z")


def _mint_client_id() -> str:
    return f"client_{uuid.uuid4()}"


# The longest path Linux resolves (PATH_MAX); a longer cwd cannot name a directory.
PATH_MAX = 4096


class AgentUnavailable(Exception):
    """The workspace's agent could not be started (HTTP 502 ``agent_start_failed``)."""


class AgentSessionConflict(AgentUnavailable):
    """The agent answered ``session/new`` with an id another live session of it holds
    (HTTP 502 ``agent_session_id_reused``)."""


class _StartAttempt:
    """One agent start that concurrent requests for a workspace share (and its failure)."""

    __slots__ = ("agent", "done", "error")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.agent: AgentChannel | None = None
        self.error: AgentUnavailable | None = None

    async def outcome(self) -> AgentChannel:
        await self.done.wait()
        if self.agent is None:
            assert self.error is not None
            raise AgentUnavailable(str(self.error))
        return self.agent


class SessionLimit(Exception):
    """``--max-sessions`` live sessions are loaded: a new or restored one is refused (HTTP 503
    ``session_limit``)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"{limit} sessions are live, the most this daemon holds")
        self.limit = limit


SESSION_LIMIT_LOG_INTERVAL_S = 60.0
# Ids of sessions unloaded when idle that any request restores (beyond that many, the oldest
# are forgotten: like a session not loaded since a restart, a load or resume restores it).
MAX_UNLOADED_REMEMBERED = 100_000
# The idle sweep looks at every session this many times per --session-idle-ms (bounded below
# and above), so a session is unloaded between one and 1 + 1/8 idle periods after its last use.
IDLE_SWEEPS_PER_PERIOD = 8
IDLE_SWEEP_MIN_S = 0.01
IDLE_SWEEP_MAX_S = 30.0
# The Retry-After of a 503 session_limit.
SESSION_LIMIT_RETRY_AFTER_S = 5


class InvalidWorkspace(ValueError):
    """A ``cwd`` that is not an existing directory (HTTP 400 ``invalid_cwd``)."""


def canonical_workspace(cwd: str) -> str:
    """The one name of the directory ``cwd``: absolute, ``.``/``..``/``//`` resolved and
    symlinks followed. Raises :class:`InvalidWorkspace` if it is not an existing directory."""
    if not os.path.isabs(cwd) or "\x00" in cwd:
        raise InvalidWorkspace(f"cwd must be an absolute path, got {cwd[:200]!r}")
    if len(cwd) > PATH_MAX:
        # Before realpath, which would look at every component of a megabyte path.
        raise InvalidWorkspace(f"cwd is longer than {PATH_MAX} characters ({len(cwd)})")
    path = os.path.realpath(cwd)
    if not os.path.exists(path):
        raise InvalidWorkspace(f"cwd {cwd[:200]!r} does not exist")
    if not os.path.isdir(path):
        raise InvalidWorkspace(f"cwd {cwd[:200]!r} is not a directory")
    return path


class _KeyedLocks:
    """One trio.Lock per key, kept only while somebody holds or waits for it: a request for a
    key that leads nowhere (an unknown session id) leaves nothing behind."""

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: dict[str, tuple[trio.Lock, list[int]]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    @asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = (trio.Lock(), [0])
        lock, users = entry
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if users[0] == 0 and self._entries.get(key) is entry:
                del self._entries[key]


class SessionManager:
    def __init__(
        self,
        config: DaemonConfig,
        writer: TranscriptWriter | None,
        nursery: trio.Nursery,
        *,
        agent_env: Mapping[str, str] | None = None,
        reclaimer: HeapReclaimer | None = None,
    ) -> None:
        self.config = config
        self.reclaimer = reclaimer  # given to every bus (see SessionBus)
        self.writer = writer
        self.nursery = nursery
        self.agent_env = dict(os.environ if agent_env is None else agent_env)
        gates = config.mock_gate_dir(self.agent_env)
        if gates is not None:  # the bundled mock: mock:gate=NAME works (docs/viewer.md)
            self.agent_env[MOCK_GATE_ENV] = str(gates)
        self.sessions: dict[str, Session] = {}
        # The sessions of ``sessions`` in GET /sessions' order, all and per workspace: a page
        # starts at its cursor instead of looking at every session.
        self.order = ListIndex()
        self.order_by_workspace: dict[str, ListIndex] = {}
        # Sessions that had a prompt admitted and may still run or queue one (a superset:
        # :meth:`occupied` drops the ones found idle), for GET /sessions?state=running|queued.
        self._occupied: set[str] = set()
        # Live sessions per workspace (the agent's idle stop and the joinable session ask).
        self._per_workspace: dict[str, int] = {}
        # Sessions unloaded when idle, oldest first (see MAX_UNLOADED_REMEMBERED).
        self.unloaded: OrderedDict[str, None] = OrderedDict()
        self.sessions_unloaded = 0
        self._closed_at_shutdown = 0
        # Sessions being created or restored, by id: they hold a --max-sessions slot until
        # they are in ``sessions`` (or failed).
        self._starting: set[str] = set()
        self.sessions_refused = 0
        self._limit_log = LogThrottle(SESSION_LIMIT_LOG_INTERVAL_S)
        self.agents: dict[str, AgentChannel] = {}
        self.clients = ClientRegistry()
        self._agent_locks = _KeyedLocks()
        self._restore_locks = _KeyedLocks()
        self._starts: dict[str, _StartAttempt] = {}
        # Requests between "got the workspace's agent" and "its session is registered": the
        # idle reaper must not stop an agent one of them is about to use.
        self._agent_users: dict[str, int] = {}
        self._idle_timers: dict[str, trio.CancelScope] = {}
        self.agents_reaped = 0
        self._agents_started: set[str] = set()  # workspaces that had an agent (restarts)
        # Cluster mode: (leases held, takeovers so far), for GET /metrics.
        self.cluster_stats: Callable[[], tuple[int, int]] | None = None
        # Told when a session is closed for good (DELETE): retention removes it.
        self.on_closed_for_good: Callable[[], None] | None = None
        self.retention_stats: object = None  # daemon.retention.RetentionStats (GET /metrics)
        self._limits: BusLimits | None = None
        self.shutting_down = False
        # Cluster mode: this node's id (GET /session/{id}/status shows it as ownerNodeId).
        self.node_id: str | None = None
        # Cluster mode: (session id, own subscribers) -> subscribers per node, for the status.
        self.cluster_readers: Callable[[str, int], Awaitable[dict[str, int]]] | None = None
        # Cluster mode: the session's last recovery from a lagging Redis, if any.
        self.cluster_recovery: Callable[[str], TranscriptRecovery | None] | None = None
        # Cluster mode: a session's bus guard (is this node still certainly its owner?).
        self.publish_guard: Callable[[str], Callable[[], bool]] | None = None
        # Cluster mode: a session's dispatch gate (may its runner hand a prompt to the agent
        # now?, see Session.may_act).
        self.dispatch_gate: Callable[[str], Callable[[], Awaitable[bool]]] | None = None
        # Unloading needs the transcript to restore from; a cluster node's sessions move
        # between nodes by their own rules, so it keeps them loaded.
        if config.session_idle_ms and writer is not None and config.cluster_redis is None:
            nursery.start_soon(self._unload_idle_sessions)

    @property
    def restore_lock_count(self) -> int:
        """Restore locks alive now (only while a restore of that id runs or waits)."""
        return len(self._restore_locks)

    def _spawn(self, fn: Callable[[], Awaitable[None]]) -> None:
        self.nursery.start_soon(fn)

    # -- clients ------------------------------------------------------------------------------

    @property
    def limits(self) -> BusLimits:
        """Every bus's caps (from the configuration), made with the first bus."""
        if self._limits is None:
            from .bus import BusLimits

            config = self.config
            self._limits = BusLimits(
                max_journal_events=config.max_journal_events,
                max_journal_bytes=config.max_journal_bytes,
                compacted_replay_max_bytes=config.compacted_replay_max_bytes,
                event_ring_size=config.event_ring_size,
                event_ring_bytes=config.event_ring_bytes,
            )
        return self._limits

    def register_client(self, session: Session, hint: str | None) -> str:
        """Register the caller on ``session``: a known id is kept, anything else replaced."""
        return self.clients.register(session.id, hint, _mint_client_id)

    # -- agents -------------------------------------------------------------------------------

    @asynccontextmanager
    async def _using_agent(self, cwd: str) -> AsyncIterator[None]:
        """Marks ``cwd``'s agent as in use for the block (no idle stop meanwhile)."""
        self._agent_users[cwd] = self._agent_users.get(cwd, 0) + 1
        self._cancel_idle_timer(cwd)
        try:
            yield
        finally:
            left = self._agent_users[cwd] - 1
            if left:
                self._agent_users[cwd] = left
            else:
                del self._agent_users[cwd]
            self._maybe_idle(cwd)

    def _in_use(self, cwd: str) -> bool:
        return cwd in self._agent_users or cwd in self._per_workspace

    def _cancel_idle_timer(self, cwd: str) -> None:
        scope = self._idle_timers.pop(cwd, None)
        if scope is not None:
            scope.cancel()

    def _maybe_idle(self, cwd: str) -> None:
        """Start the idle timer of ``cwd``'s agent if nothing uses it any more."""
        agent = self.agents.get(cwd)
        if agent is None or agent.closed or self.shutting_down or self._in_use(cwd) \
                or cwd in self._idle_timers:
            return
        scope = trio.CancelScope()
        self._idle_timers[cwd] = scope
        self.nursery.start_soon(self._stop_when_idle, cwd, agent, scope)

    async def _stop_when_idle(self, cwd: str, agent: AgentChannel, scope: trio.CancelScope) -> None:
        with scope:
            await trio.sleep(self.config.agent_idle_ms / 1000)
            async with self._agent_locks.hold(cwd):
                if self._idle_timers.get(cwd) is scope:
                    del self._idle_timers[cwd]
                if self.agents.get(cwd) is not agent or self._in_use(cwd):
                    return
                del self.agents[cwd]
                self.agents_reaped += 1
                log.info("event=agent_idle_stop cwd=%s pid=%s idle_ms=%d", cwd, agent.pid,
                         self.config.agent_idle_ms)
                with trio.CancelScope(shield=True):
                    await agent.aclose()  # stdin EOF; the agent ends on its own
        if self._idle_timers.get(cwd) is scope:
            del self._idle_timers[cwd]

    async def agent_for(self, cwd: str) -> AgentChannel:
        """The workspace's live agent, started if there is none. Concurrent callers share one
        start attempt: an agent that never initializes costs one timeout, not one per caller
        in turn. The attempt runs in the manager's nursery, so a caller that goes away does not
        end it for the others."""
        agent = self.agents.get(cwd)
        if agent is not None and not agent.closed:
            return agent
        attempt = self._starts.get(cwd)
        if attempt is None:
            attempt = self._starts[cwd] = _StartAttempt()
            self.nursery.start_soon(self._start_agent, cwd, attempt)
        return await attempt.outcome()

    async def _start_agent(self, cwd: str, attempt: _StartAttempt) -> None:
        try:
            async with self._agent_locks.hold(cwd):
                agent = self.agents.get(cwd)
                if agent is None or agent.closed:
                    agent = await self._spawn_agent(cwd)
                attempt.agent = agent
        except AgentUnavailable as exc:
            attempt.error = exc
        finally:
            if attempt.agent is None and attempt.error is None:
                attempt.error = AgentUnavailable("the agent start was cancelled")
            if self._starts.get(cwd) is attempt:
                del self._starts[cwd]
            attempt.done.set()

    async def _spawn_agent(self, cwd: str) -> AgentChannel:
        from .agent import AgentChannel, AgentStartError

        argv = self.config.effective_agent_argv()
        agent = AgentChannel(
            argv, cwd, init_timeout=self.config.agent_init_timeout_ms / 1000,
            write_timeout=self.config.agent_write_timeout_ms / 1000,
            env=self.agent_env, client_info={"name": "turnkeeper", "version": __version__},
        )
        agent.on_exit = partial(self._agent_exited, cwd, agent)
        try:
            await self.nursery.start(agent.run)
        except AgentStartError as exc:
            log.warning("event=agent_start_failed cwd=%s reason=%s", cwd, exc)
            raise AgentUnavailable(str(exc)) from exc
        except OSError as exc:
            log.warning("event=agent_start_failed cwd=%s reason=%s", cwd, exc)
            raise AgentUnavailable(f"cannot start agent: {exc}") from exc
        self.agents[cwd] = agent
        if cwd in self._agents_started:
            totals.agent_restarts += 1
        self._agents_started.add(cwd)
        log.info("event=agent_started cwd=%s pid=%s", cwd, agent.pid)
        return agent

    def _agent_exited(self, cwd: str, agent: AgentChannel, exit_code: int | None,
                      signal_code: str | None) -> None:
        if self.agents.get(cwd) is agent:
            del self.agents[cwd]
            self._cancel_idle_timer(cwd)
        log.info("event=agent_exited cwd=%s pid=%s exit_code=%s signal=%s reason=%s", cwd,
                 agent.pid, exit_code, signal_code, agent.death_reason or "exited")
        # Only the sessions of this agent: a new one may already serve the workspace. A session
        # parked at shutdown is closed already (its agent exits at the stop's stdin EOF).
        for session in list(self.sessions.values()):
            if session.agent is agent and not session.parked:
                session.agent_died(exit_code, signal_code)

    async def _new_acp_session(self, agent: AgentChannel, cwd: str) -> str:
        """``session/new`` on ``agent``, bounded like ``initialize`` (the limit clients see as
        ``sessionRestoreTimeoutMs``): a create never waits on an agent for ever."""
        bound = self.config.agent_init_timeout_ms / 1000
        try:
            with trio.fail_after(bound):
                return await agent.new_session(cwd)
        except trio.TooSlowError:
            raise AgentUnavailable(f"session/new failed: no reply within {bound:g} s") from None
        except Exception as exc:
            raise AgentUnavailable(f"session/new failed: {exc}") from exc

    @staticmethod
    def _claim(agent: AgentChannel, acp_session_id: str, session: Session) -> None:
        """Attach ``session`` under the id the agent gave it, before anything can await;
        :class:`AgentSessionConflict` if another live session of the agent holds that id."""
        from .agent import SessionIdInUse

        try:
            # Held until session.run attaches again: the session is not set up yet.
            agent.attach(acp_session_id, session, hold=True)
        except SessionIdInUse as exc:
            log.warning("event=agent_session_id_reused pid=%s acp_session_id=%r session=%s "
                        "action=refuse_create", agent.pid, acp_session_id[:200], session.id)
            raise AgentSessionConflict(
                f"the agent answered session/new with session id {acp_session_id[:200]!r}, "
                f"which another live session of this agent already uses") from exc

    # -- sessions -----------------------------------------------------------------------------

    @property
    def live_count(self) -> int:
        """Sessions holding a ``--max-sessions`` slot: the loaded ones and those being loaded."""
        # Not ``_starting - sessions.keys()``: that walks every session's key.
        return len(self.sessions) + sum(1 for sid in self._starting if sid not in self.sessions)

    @contextmanager
    def _session_slot(self, session_id: str) -> Iterator[None]:
        """Hold a ``--max-sessions`` slot for ``session_id`` while it is created or restored;
        raises :class:`SessionLimit` when none is free."""
        self.refuse_past_cap()
        self._starting.add(session_id)
        try:
            yield
        finally:
            self._starting.discard(session_id)

    def refuse_past_cap(self) -> None:
        """Raise :class:`SessionLimit` (counted and logged as a refusal) when no
        ``--max-sessions`` slot is free: a cluster node asks before it takes a session over."""
        cap = self.config.max_sessions
        if cap and self.live_count >= cap:
            self.sessions_refused += 1
            count = self._limit_log.note(trio.current_time())
            if count is not None:
                log.warning("event=session_limit count=%d total=%d live=%d limit=%d", count,
                            self.sessions_refused, self.live_count, cap)
            raise SessionLimit(cap)

    def _add(self, session: Session) -> None:
        self.sessions[session.id] = session
        cwd = session.workspace_cwd
        self._per_workspace[cwd] = self._per_workspace.get(cwd, 0) + 1
        key = (session.created_ms, session.id)
        self.order.add(key)
        index = self.order_by_workspace.get(cwd)
        if index is None:
            index = self.order_by_workspace[cwd] = ListIndex()
        index.add(key)

    def _remove(self, session: Session) -> None:
        del self.sessions[session.id]
        cwd = session.workspace_cwd
        left = self._per_workspace[cwd] - 1
        if left:
            self._per_workspace[cwd] = left
        else:
            del self._per_workspace[cwd]
        key = (session.created_ms, session.id)
        self.order.discard(key)
        index = self.order_by_workspace[cwd]
        index.discard(key)
        if not len(index):
            del self.order_by_workspace[cwd]
        self._occupied.discard(session.id)

    def _note_admitted(self, session: Session) -> None:
        self._occupied.add(session.id)

    def occupied(self) -> list[Session]:
        """The live sessions with a prompt running or queued (each at most once), found
        without looking at the idle ones: every admission notes its session, and a session
        noted and found idle here is dropped (each note is dropped once)."""
        out: list[Session] = []
        for sid in tuple(self._occupied):
            session = self.sessions.get(sid)
            if session is None or (session.active is None and not session.queue):
                self._occupied.discard(sid)
            elif session.live:
                out.append(session)
        return out

    def get(self, session_id: str) -> Session | None:
        """The live session, if it is loaded; a request naming it counts as its use."""
        session = self.sessions.get(session_id)
        if session is None or not session.live:
            return None
        session.touched_at = trio.current_time()
        return session

    async def live(self, session_id: str) -> Session | None:
        """The live session, restored first if it was unloaded when idle; ``None`` if there
        is none. Raises what :meth:`restore` raises."""
        session = self.get(session_id)
        if session is not None or session_id not in self.unloaded:
            return session
        return await self.restore(session_id)

    def live_for_workspace(self, cwd: str) -> Session | None:
        if cwd not in self._per_workspace:
            return None
        for session in self.sessions.values():
            if session.workspace_cwd == cwd and session.live:
                return session
        return None

    # -- unloading idle sessions ------------------------------------------------------------

    async def _unload_idle_sessions(self) -> None:
        idle_ms = self.config.session_idle_ms
        step = min(max(idle_ms / 1000 / IDLE_SWEEPS_PER_PERIOD, IDLE_SWEEP_MIN_S),
                   IDLE_SWEEP_MAX_S)
        while not self.shutting_down:
            await trio.sleep(step)
            self.unload_idle(trio.current_time(), now_ms())

    def unload_idle(self, now: float, wall_ms: int) -> int:
        """Unload every session idle for ``--session-idle-ms``: no subscriber, no prompt, no
        permission request, nothing published and no request naming it for that long (a busy
        session's idle time starts again now). Returns how many were unloaded."""
        idle_ms = self.config.session_idle_ms
        idle_s = idle_ms / 1000
        unloaded = 0
        for session in tuple(self.sessions.values()):
            if not session.live or session.id in self._starting:
                continue
            if session.busy():
                session.touched_at = now
                continue
            bus = session.bus
            published = bus.last_activity_ms
            if now - session.touched_at < idle_s or (
                    published is not None and wall_ms - published < idle_ms):
                continue
            if bus.transcript_degraded or bus.transcript_damaged:
                continue  # its stored history is not whole: only memory holds all of it
            self.unloaded[session.id] = None
            self.unloaded.move_to_end(session.id)
            if len(self.unloaded) > MAX_UNLOADED_REMEMBERED:
                forgotten, _ = self.unloaded.popitem(last=False)
                self.clients.drop_session(forgotten)
            session.unload()
            unloaded += 1
        return unloaded

    async def create(
        self, cwd: str, session_id: str | None, scope: str, client_hint: str | None,
    ) -> tuple[Session, bool, str]:
        """POST /session: returns (session, attached, client id). ``cwd`` is canonicalised
        first (:class:`InvalidWorkspace` if it is not a directory)."""
        cwd = canonical_workspace(cwd)
        if session_id is not None:
            existing = self.get(session_id) or await self.restore(session_id)
            if existing is not None:
                return existing, True, self.register_client(existing, client_hint)
        elif scope != "thread":
            existing = self.live_for_workspace(cwd)
            if existing is not None:
                return existing, True, self.register_client(existing, client_hint)
        # A client-chosen id may name a session closed earlier, whose ledger still holds its
        # keyed prompts: only a fresh id starts with every keyed admission in memory.
        session = await self._start_session(cwd, session_id or str(uuid.uuid4()),
                                            fresh_id=session_id is None)
        return session, False, self.register_client(session, client_hint)

    async def _start_session(self, cwd: str, session_id: str, *, fresh_id: bool) -> Session:
        with self._session_slot(session_id):
            async with self._using_agent(cwd):
                return await self._start_session_on_agent(cwd, session_id, fresh_id)

    async def _start_session_on_agent(self, cwd: str, session_id: str,
                                      fresh_id: bool) -> Session:
        agent = await self.agent_for(cwd)
        acp_session_id = await self._new_acp_session(agent, cwd)
        bus = self._new_bus(session_id, self.writer)
        created_ms = now_ms()  # one instant: the list's order is the same live and stored
        session = self._session(session_id, cwd, created_ms, agent, acp_session_id, bus,
                                keys_complete=fresh_id)
        self._claim(agent, acp_session_id, session)
        if self.writer is not None:
            bus.last_write_seq = self.writer.submit(UpsertSession(
                session_id, cwd, created_ms, acp_session_id))
        self._add(session)
        await self.nursery.start(session.run)
        # A session id handed out is on disk: after a crash, load and resume find it.
        await session.wait_durable()
        log.info("event=session_created session=%s cwd=%s", session_id, cwd)
        return session

    async def restore(self, session_id: str) -> Session | None:
        """Bring a persisted session back; ``None`` if there is nothing to restore.

        Closes interrupted prompts in one transaction, seeds the replay window from the newest
        stored turns, and restores the agent session with ``session/load`` when the agent
        supports it (else maps a fresh ACP session to the same daemon session id)."""
        live = self.get(session_id)
        if live is not None or self.writer is None:
            return live
        async with self._restore_locks.hold(session_id):
            live = self.get(session_id)
            if live is not None:
                return live
            leaving = self.sessions.get(session_id)
            if leaving is not None and leaving.unloading:
                await leaving.ended.wait()  # its agent session is detached once it has ended
            restored = await self._restore(session_id, self.writer)
            if restored is not None:
                self.unloaded.pop(session_id, None)
            return restored

    async def _restore(self, session_id: str, writer: TranscriptWriter) -> Session | None:
        row = await writer.read(lambda store: store.get_session(session_id),
                                session_id=session_id)
        if row is None or row.closed:
            return None
        try:
            cwd = canonical_workspace(row.workspace_cwd)
        except InvalidWorkspace:
            cwd = row.workspace_cwd  # gone: the agent start below reports it
        with self._session_slot(session_id):
            async with self._using_agent(cwd):
                return await self._restore_row(session_id, writer, row, cwd)

    async def _restore_row(
        self, session_id: str, writer: TranscriptWriter, row: SessionRow, cwd: str,
    ) -> Session:
        raw, in_flight = await writer.read(
            lambda store: (store.raw_events(session_id), store.in_flight_prompts(session_id)),
            session_id=session_id)
        from .core.restore import close_interrupted, seed_segments

        ops = close_interrupted(session_id, raw, in_flight, now_ms=now_ms(),
                                new_record_id=lambda: str(uuid.uuid4()))
        for op in ops:
            writer.submit(op)
        cap = self.config.compacted_replay_max_bytes
        turns, older_records, older_turns = await writer.read(
            lambda store: store.newest_turns(session_id, cap), session_id=session_id)
        terminals = await writer.read(lambda store: store.prompt_terminals(session_id, 64),
                                      session_id=session_id)
        segments, next_id = seed_segments(turns, 1)
        agent = await self.agent_for(cwd)
        acp_session_id, via = None, "session/new"
        if row.agent_session_id and agent.is_attached(row.agent_session_id):
            # Another live session holds that agent session (an agent that reused an id):
            # loading it here would merge the two.
            log.warning("event=session_load_skipped session=%s reason=acp_session_id_in_use",
                        session_id)
        elif agent.supports_load_session and row.agent_session_id:
            try:
                with trio.fail_after(self.config.agent_init_timeout_ms / 1000):
                    await agent.load_session(row.agent_session_id, cwd)
                acp_session_id, via = row.agent_session_id, "session/load"
            except trio.TooSlowError:
                log.warning("event=session_load_failed session=%s reason=no_reply_within_%dms",
                            session_id, self.config.agent_init_timeout_ms)
            except Exception as exc:
                log.warning("event=session_load_failed session=%s reason=%s", session_id, exc)
        if acp_session_id is None:
            acp_session_id = await self._new_acp_session(agent, cwd)
        bus = self._new_bus(session_id, writer, first_id=next_id)
        if segments:
            bus.window.seed(segments, truncated_events=older_records,
                            truncated_turns=older_turns)
            bus.latest_record_id = segments[-1][-1].record_id
            newest = bus.window.newest_handle()
            if newest is not None:
                bus.window.spill(newest)  # read from the transcript: it can be read again
            del segments, turns
        session = self._session(session_id, cwd, row.created_at_ms, agent,
                                acp_session_id, bus,
                                keys_complete=False)  # its keyed prompts are in the ledger
        self._claim(agent, acp_session_id, session)
        session.terminals.extend(terminals)
        session.agent_session_restored = via == "session/load"
        bus.last_write_seq = writer.submit(
            UpsertSession(session_id, cwd, row.created_at_ms, acp_session_id))
        self._add(session)
        await self.nursery.start(session.run)
        log.info("event=session_restored session=%s via=%s agent_session_restored=%s "
                 "interrupted_prompts=%d seeded_events=%d older_records=%d", session_id, via,
                 str(session.agent_session_restored).lower(), len(in_flight), next_id - 1,
                 older_records)
        return session

    def _new_bus(self, session_id: str, writer: TranscriptWriter | None, *,
                 first_id: int = 1) -> SessionBus:
        from .bus import SessionBus

        guard = self.publish_guard(session_id) if self.publish_guard is not None else None
        return SessionBus(session_id, self.limits, writer, first_id=first_id, spawn=self._spawn,
                          reclaimer=self.reclaimer, guard=guard)

    def _session(self, session_id: str, cwd: str, created_ms: int, agent: AgentChannel,
                 acp_session_id: str, bus: SessionBus, *, keys_complete: bool) -> Session:
        from .session import Session

        timeout_ms = self.config.permission_response_timeout_ms
        return Session(
            session_id, cwd, iso_from_ms(created_ms), agent, acp_session_id, bus,
            created_ms=created_ms,
            approval_mode=self.config.approval_mode,
            cancel_grace_s=self.config.cancel_grace_ms / 1000,
            permission_timeout_s=timeout_ms / 1000 if timeout_ms else None,
            on_ended=self._session_ended,
            on_admitted=self._note_admitted,
            keys_complete=keys_complete,
            may_act=self.dispatch_gate(session_id) if self.dispatch_gate is not None else None,
        )

    def _session_ended(self, session: Session) -> None:
        if self.writer is not None and session.closing == "client_close":
            # Gone for good: never restored. Submitted as the session leaves the table, so
            # that whoever sees it gone (a cluster takeover) finds its close queued.
            self.writer.submit(MarkClosed(session.id))
        if self.sessions.get(session.id) is session:
            self._remove(session)
        if self.writer is not None and session.closing == "client_close" \
                and self.on_closed_for_good is not None:
            self.on_closed_for_good()  # retention removes its rows
            if session.unloading and session.id in self.unloaded:
                self.sessions_unloaded += 1  # its clients stay registered for its return
            else:
                self.clients.drop_session(session.id)
        if session.unloading:
            log.info("event=session_unloaded session=%s idle_ms=%d", session.id,
                     self.config.session_idle_ms)
        elif session.closing == "daemon_shutdown":
            self._closed_at_shutdown += 1  # one line for them all: shutdown stays O(1) in logs
        else:
            log.info("event=session_ended session=%s reason=%s", session.id,
                     session.closing or ("agent_exit" if session.agent_exit else "ended"))
        self._maybe_idle(session.workspace_cwd)

    async def retire(self, session_id: str) -> bool:
        """Close a stored session that is not loaded for good (retention removes it next):
        under its restore lock, so no restore loads it meanwhile. ``False`` if it is loaded."""
        writer = self.writer
        if writer is None:
            return False
        async with self._restore_locks.hold(session_id):
            if session_id in self.sessions:
                return False
            return await writer.wait_committed(writer.submit(MarkClosed(session_id)))

    async def close_session(self, session: Session, reason: str) -> None:
        """End ``session``; ``client_close`` (a client deleted it) also marks it closed in the
        transcript when it has ended (see :meth:`_session_ended`)."""
        await session.close(reason)
        self.unloaded.pop(session.id, None)

    async def shutdown(self, *, process_exits: bool = False) -> None:
        """Graceful stop: end every running prompt with ``session_closed``, stop agents.

        ``process_exits``: the process exits once this and the transcript's close are done,
        without unwinding its tasks, so an idle session without a subscriber is closed without
        ending its task (see :meth:`Session.close_idle_now`): the stop then does, per idle
        session, only what the transcript needs, its ``session_closed`` row."""
        self.shutting_down = True
        # Everything alive now stays alive until the process exits: the collector need not
        # walk it again each time the closing sessions have allocated a few thousand objects
        # (with thousands of sessions that walking was a third of the stop).
        gc.freeze()
        for cwd in list(self._idle_timers):
            self._cancel_idle_timer(cwd)
        # Every session is told first, then waited for: no task of its own per session. The
        # idle ones (nearly all, with many sessions) publish their close here and are made
        # durable by one wait for the transcript, not one wait (with its cancel scopes) each.
        closing = list(self.sessions.values())
        batched = 0
        writer = self.writer
        commits = writer.batches_committed if writer is not None else 0
        for session in closing:
            if session.close_idle_now("daemon_shutdown", park=process_exits):
                batched += 1
            else:
                session.begin_close("daemon_shutdown")
        if writer is not None and batched:
            from .session import DURABLE_WAIT_S

            limit = writer.durable_bound_s or DURABLE_WAIT_S
            with trio.move_on_after(limit) as bound:
                await writer.wait_flushed()
            if bound.cancelled_caught:
                log.warning("event=shutdown_commit_slow sessions=%d bound_s=%g", batched, limit)
        parked = 0
        for session in closing:
            # Waiting on an Event already set is still a checkpoint, a whole scheduler pass
            # each: only a session not ended yet is waited for (most end in the same pass).
            if session.parked:
                parked += 1
            elif not session.ended.is_set():
                await session.ended.wait()
        log.info("event=sessions_closed reason=daemon_shutdown count=%d batched=%d parked=%d "
                 "transcript_commits=%d", self._closed_at_shutdown + parked, batched, parked,
                 writer.batches_committed - commits if writer is not None else 0)
        agents = list(self.agents.values())
        async with trio.open_nursery() as nursery:  # every agent at once: one grace in all
            for agent in agents:
                nursery.start_soon(self._close_agent_at_shutdown, agent)

    @staticmethod
    async def _close_agent_at_shutdown(agent: AgentChannel) -> None:
        from .agent import CLOSE_BOUND_S

        with trio.move_on_after(CLOSE_BOUND_S):
            await agent.aclose()
            return
        agent.kill_group()  # the process exits next: nothing of the agent may stay behind

    def status(self, branches: Mapping[str, str | None] | None = None,
               sessions: Iterable[Session] | None = None) -> list[SessionCounts]:
        """One entry per session of ``sessions`` (default: every live session); ``branches``
        maps workspaces to their git branch."""
        out = []
        for session in self.sessions.values() if sessions is None else sessions:
            bus = session.bus
            activity = bus.last_activity_ms
            out.append(SessionCounts(
                session_id=session.id,
                workspace_cwd=session.workspace_cwd,
                has_active_prompt=session.active is not None,
                pending_prompts=len(session.queue),
                journal_entries=bus.journals.full.entry_count,
                journal_bytes=bus.journals.full.total_bytes,
                summary_journal_entries=bus.journals.summary.entry_count,
                replay_window_bytes=bus.window.total_bytes,
                replay_window_held_bytes=bus.window.held_bytes,
                replay_window_spilled_turns=bus.window.spilled_segments,
                ring_events=len(bus.ring),
                ring_bytes=bus.ring.total_bytes,
                subscribers=len(bus.subscribers),
                slow_client_warnings=bus.slow_client_warnings,
                clients_evicted=bus.clients_evicted,
                last_event_id=bus.ring.last_id,
                transcript_degraded=bus.transcript_degraded or bus.transcript_damaged,
                created_at=session.created_at,
                last_activity_at=iso_from_ms(activity) if activity is not None
                else session.created_at,
                git_branch=(branches or {}).get(session.workspace_cwd),
            ))
        return out
