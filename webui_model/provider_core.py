"""The provider's shared state: the open session, connection state, notices, effects, and
the lifetime helpers every job of the provider uses (see :mod:`webui_model.provider`)."""

from __future__ import annotations

import enum
import logging
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AsyncExitStack, contextmanager
from typing import Any, Final

import anyio
from anyio.abc import TaskGroup

from sdk._client import DaemonClient
from sdk._errors import AuthError, DaemonError, SessionNotFoundError
from sdk._repair import EpisodeRegistry
from sdk._repair_driver import RepairDriver, RepairOutcome
from sdk._session import SessionHandle
from sdk.protocol.envelope import DaemonEvent
from sdk.protocol.terminals import TerminalOutcome, terminal_of
from webui_model.effects import Notice, SideEffect
from webui_model.pagination import DEFAULT_PAGE_SIZE
from webui_model.repair_commit import Checkpoint
from webui_model.side_channels import NoticeBoard, SideChannels
from webui_model.store import DEFAULT_MAX_BLOCKS, TranscriptStore

__all__ = [
    "PROVIDER_SOURCE",
    "RELOAD_FAILED_CODE",
    "ConnectionState",
    "LoadWarnings",
    "OpenSession",
    "ProviderCore",
    "SessionAbandonedError",
]

log = logging.getLogger("webui_model.provider")

LoadWarnings = Callable[[], Iterable[str]]
"""Returns the texts a (re)load should show as provider status blocks."""

RELOAD_FAILED_CODE: Final = "daemon.session_reload.failed"
PROVIDER_SOURCE: Final = "provider"
_TERMINALS_KEPT: Final = 256
_OUTCOMES_KEPT: Final = 64


class ConnectionState(enum.Enum):
    IDLE = "idle"  # no session open
    CONNECTED = "connected"  # a snapshot is shown and its subscription runs
    AUTH_FAILED = "auth_failed"  # 401/403: needs new credentials, nothing resumes by itself
    DISCONNECTED = "disconnected"  # the session is unreachable (``missing_session`` for 404/410)


class SessionAbandonedError(Exception):
    """The provider navigated away (switch, clear, unmount) while this operation was in flight."""


class OpenSession:
    """One opened session: its scopes, its in-flight counters and its repair driver."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.scope: anyio.CancelScope | None = None
        """The session's scope, made by the task that hosts it (see :meth:`cancel`)."""
        self.cancelled = False
        self.nursery: TaskGroup | None = None
        self.driver: RepairDriver | None = None
        self.loaded_handle: SessionHandle | None = None
        self.closed = False
        self.loads = 0
        self.resumes = 0
        self.page_requests = 0
        self.local_prompts = 0
        self.generation = 0
        """Bumped whenever the store is rebuilt from a new anchor; a page answer fetched for an
        older generation no longer fits the transcript and is dropped."""
        self.resync_scheduled = False
        self.op_scopes: set[anyio.CancelScope] = set()
        self.next_checkpoint: Checkpoint | None = None
        self.terminals: OrderedDict[str, TerminalOutcome] = OrderedDict()
        self.stop_error: DaemonError | None = None
        self._changed: anyio.Event | None = None

    @property
    def owner(self) -> SessionHandle | None:
        """The handle owning the subscription now (after a repair: the driver's candidate)."""
        return self.driver.handle if self.driver is not None else self.loaded_handle

    def cancel(self) -> None:
        """Cancel the session's scope, now or as soon as its host task makes it."""
        self.cancelled = True
        if self.scope is not None:
            self.scope.cancel()

    def notify(self) -> None:
        changed, self._changed = self._changed, None
        if changed is not None:
            changed.set()

    async def wait_changed(self) -> None:
        if self._changed is None:
            self._changed = anyio.Event()
        await self._changed.wait()

    def record_terminal(self, event: DaemonEvent) -> None:
        outcome = terminal_of(event)
        if outcome is None:
            return
        prompt_id = outcome.prompt_id
        self.terminals[prompt_id] = outcome
        self.terminals.move_to_end(prompt_id)
        while len(self.terminals) > _TERMINALS_KEPT:
            self.terminals.popitem(last=False)


class ProviderCore:
    """State and helpers shared by the provider's jobs (the public class is
    :class:`~webui_model.provider.WebUIProvider`; its docstring documents the arguments)."""

    def __init__(
        self,
        client: DaemonClient,
        *,
        max_blocks: int = DEFAULT_MAX_BLOCKS,
        history_page_size: int | None = DEFAULT_PAGE_SIZE,
        page_size: int = DEFAULT_PAGE_SIZE,
        load_warnings: LoadWarnings | None = None,
        handle_options: Mapping[str, Any] | None = None,
        detach_timeout: float = 5.0,
    ) -> None:
        if history_page_size is not None and not 1 <= history_page_size <= 500:
            raise ValueError(f"history_page_size must be in 1..500, got {history_page_size}")
        if not 1 <= page_size <= 500:
            raise ValueError(f"page_size must be in 1..500, got {page_size}")
        if detach_timeout <= 0:
            raise ValueError(f"detach_timeout must be positive, got {detach_timeout}")
        self.client = client
        self.store = TranscriptStore(max_blocks=max_blocks)
        self.history_page_size = history_page_size
        self.page_size = page_size
        self.side_channels = SideChannels()
        self.connection = ConnectionState.IDLE
        self.missing_session = False
        """True after a 404/410 left the session unreachable (with ``DISCONNECTED``)."""
        self.repair_outcomes: deque[RepairOutcome] = deque(maxlen=_OUTCOMES_KEPT)
        self.repair_attempts = 0
        """How many repair attempts have ended (``repair_outcomes`` keeps the newest)."""
        self._board = NoticeBoard()
        self._load_warnings = load_warnings
        self._handle_options: dict[str, Any] = dict(handle_options or {})
        self._detach_timeout = detach_timeout
        self._registry = EpisodeRegistry()
        self._pagination_supported: bool | None = None
        self._session: OpenSession | None = None
        self._navigating = 0
        self._root: TaskGroup | None = None
        self._stack: AsyncExitStack | None = None
        self._unmounted = False
        self._changed: anyio.Event | None = None
        self.store.subscribe(self._touch)

    # -- reading -----------------------------------------------------------------------------------

    @property
    def session_id(self) -> str | None:
        return None if self._session is None else self._session.session_id

    @property
    def handle(self) -> SessionHandle | None:
        """The session handle that owns the subscription now."""
        return None if self._session is None else self._session.owner

    @property
    def notices(self) -> tuple[Notice, ...]:
        """The notices shown, oldest first: one per id, at most 50."""
        return self._board.notices

    @property
    def notices_emitted(self) -> int:
        """Every notice ever added, duplicates included (a duplicate emission stays visible)."""
        return self._board.emitted

    @property
    def loading(self) -> bool:
        return self._session is not None and self._session.loads > 0

    async def wait_for(self, predicate: Callable[[], bool]) -> None:
        """Wait until ``predicate()`` holds; re-checked after every store or provider change."""
        while not predicate():
            if self._changed is None:
                self._changed = anyio.Event()
            await self._changed.wait()

    def add_notice(self, notice: Notice) -> None:
        """Show a notice (deduplicated by id, newest 50 kept)."""
        self._board.add(notice)
        self._touch()

    def dismiss_notice(self, notice_id: str) -> bool:
        removed = self._board.dismiss(notice_id)
        self._touch()
        return removed

    # -- effects and state ---------------------------------------------------------------------------

    def _perform(self, effects: Iterable[SideEffect]) -> None:
        for effect in effects:
            if isinstance(effect, Notice):
                self._board.add(effect)
            else:
                self.side_channels.record(effect)

    def _set_connection(self, state: ConnectionState, *, missing_session: bool = False) -> None:
        self.connection = state
        self.missing_session = missing_session
        self._touch()

    def _connection_failed(self, exc: DaemonError, *, initial: bool) -> None:
        if isinstance(exc, AuthError):
            self._set_connection(ConnectionState.AUTH_FAILED)
        elif isinstance(exc, SessionNotFoundError):
            self._set_connection(ConnectionState.DISCONNECTED, missing_session=True)
        elif initial:
            self._set_connection(ConnectionState.DISCONNECTED)

    def _touch(self) -> None:
        # The event is made by the first waiter: a change nobody waits for costs nothing.
        changed, self._changed = self._changed, None
        if changed is not None:
            changed.set()

    # -- lifetimes ---------------------------------------------------------------------------------
    async def _close_quietly(self, handle: SessionHandle) -> None:
        with anyio.move_on_after(self._detach_timeout, shield=True):
            try:
                await handle.close()
            except DaemonError as exc:
                log.info(
                    "event=provider_detach_failed session=%s client=%s error=%r",
                    handle.session_id,
                    handle.client_id,
                    exc,
                )

    @contextmanager
    def _operation(self, session: OpenSession) -> Iterator[None]:
        """Run the body under a scope that navigation cancels; then raise SessionAbandoned."""
        if session.closed:
            raise SessionAbandonedError(f"session {session.session_id} is no longer open")
        scope = anyio.CancelScope()
        session.op_scopes.add(scope)
        try:
            with scope:
                yield
        finally:
            session.op_scopes.discard(scope)
        if scope.cancelled_caught:
            raise SessionAbandonedError(
                f"the provider left session {session.session_id} while the operation ran"
            )

    def _require_mounted(self) -> TaskGroup:
        if self._unmounted:
            raise RuntimeError("the WebUIProvider is unmounted")
        if self._root is None:
            raise RuntimeError("mount the WebUIProvider first: async with WebUIProvider(...)")
        return self._root

    def _require_session(self) -> OpenSession:
        self._require_mounted()
        if self._session is None:
            raise RuntimeError("no session is open: call open_session() first")
        return self._session

    def _require_current(self, session: OpenSession) -> None:
        if session.closed or self._session is not session:
            raise SessionAbandonedError(f"session {session.session_id} is no longer open")

    def _require_owner(self, session: OpenSession) -> SessionHandle:
        owner = session.owner
        if owner is None:
            raise RuntimeError(f"session {session.session_id} has no loaded handle yet")
        return owner
