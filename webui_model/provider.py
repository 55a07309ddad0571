"""The WebUI model's provider: the Trio shell around the pure store (CLIENT-SPEC §4.3, §4.4, §3).

A :class:`WebUIProvider` is mounted with ``async with`` (that opens its nursery) and owns one
session at a time:

    load → replay (one ``store.reset``) → subscribe → dispatch live events into the store

Everything the reducer asks for as a side effect is performed here: notices go to a
:class:`~webui_model.side_channels.NoticeBoard` (dedup by id, newest 50), everything else to
:class:`~webui_model.side_channels.SideChannels`. The provider talks to the daemon only through
the SDK (``DaemonClient``, ``SessionHandle``, ``RepairDriver``).

Lifetimes
=========

- Each session runs inside its own cancel scope with its own nursery (the subscription reader,
  repair attempts and resync reloads live there). Navigation — :meth:`open_session` (switch),
  :meth:`clear`, :meth:`unmount` — aborts the repair episode, cancels that scope and every
  operation still in flight for the session (those raise :class:`SessionAbandonedError`), and
  detaches the session's daemon registration.
- :meth:`reload` is the *configured* reload (``historyPageSize`` = ``history_page_size``); it
  aborts any repair episode. ``state_resync_required`` on the stream triggers one.

Live-journal repair
===================

A snapshot whose live journal starts with a recoverable live marker starts an episode in the
session's :class:`~sdk.repair_driver.RepairDriver`; the provider keeps the episode's
:class:`~webui_model.repair_commit.Checkpoint` (the store just before the marker block) in the
episode's ``ui_state`` and mirrors loaded history pages and provider-local status blocks into
it. The driver arms on the target's terminal; the provider's guards hold the attempt back while
a load, resume, navigation, history-page request or local prompt is in flight, and
``driver.check()`` runs at every idle point (after each live event, when a prompt settles, when
a page request, load, resume or navigation ends). The driver's single memory-replay load hands a
candidate to :meth:`_commit_repair`, which builds the repaired state off-store
(:func:`~webui_model.repair_commit.build_repair`: checkpoint path, or the trimmed-marker
fallback), performs only the side effects of *new* events, and commits with **one**
``store.reset``. A fresh replay that ends with another recoverable live marker becomes the next
episode, with the checkpoint the commit computed for it. Each failed attempt adds exactly one
notice (the driver's).

An attempt ends in one step: ``episode`` (None, or the next episode), ``repair_attempts``,
``repair_outcomes``, the notice and ``connection`` change together, so a task woken by
:meth:`wait_for` sees them consistent. ``await provider.wait_repair()`` waits for the current
episode and returns the attempt's :class:`~sdk.repair_driver.RepairOutcome`, or None when there
is no episode or it ended without an attempt.

Example::

    async with DaemonClient(url) as client, WebUIProvider(client) as provider:
        await provider.open_session(session_id)
        await provider.prompt("hello")
        print([block.kind for block in provider.store.blocks])
"""

from __future__ import annotations

import enum
import logging
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AsyncExitStack, contextmanager
from functools import partial
from types import TracebackType
from typing import Any, Final

import trio

from sdk.client import DaemonClient, LoadResult
from sdk.errors import AuthError, DaemonError, SessionNotFoundError, TurnError
from sdk.events import (
    TERMINAL_TYPES,
    DaemonEvent,
    TurnCompleteData,
    TurnErrorData,
    event_prompt_id,
    typed_data,
)
from sdk.repair import EpisodeRegistry, RepairEpisode, RepairGuards, RepairNotice
from sdk.repair_driver import RepairCandidate, RepairDriver, RepairOutcome, RepairOutcomeKind
from sdk.session import SessionHandle, SubscriptionState
from webui_model.blocks import MessageBlock
from webui_model.pagination import (
    DEFAULT_PAGE_SIZE,
    PAGINATION_CAPABILITY,
    PageError,
    PaginationState,
    after_page_error,
    load_more,
)
from webui_model.reducer import Notice, SideEffect
from webui_model.repair_commit import (
    Checkpoint,
    build_repair,
    make_is_new,
    mirror_page,
    mirror_status,
    take_checkpoint,
)
from webui_model.replay import PageOutcome, apply_history_page, replay_snapshot
from webui_model.side_channels import NoticeBoard, SideChannels, notice_from_repair
from webui_model.store import DEFAULT_MAX_BLOCKS, TranscriptStore

__all__ = [
    "ConnectionState",
    "LoadWarnings",
    "SessionAbandonedError",
    "WebUIProvider",
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


class _Session:
    """One opened session: its scopes, its in-flight counters and its repair driver."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.scope = trio.CancelScope()
        self.nursery: trio.Nursery | None = None
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
        self.op_scopes: set[trio.CancelScope] = set()
        self.next_checkpoint: Checkpoint | None = None
        self.terminals: OrderedDict[str, DaemonEvent] = OrderedDict()
        self.stop_error: DaemonError | None = None
        self._changed = trio.Event()

    @property
    def owner(self) -> SessionHandle | None:
        """The handle owning the subscription now (after a repair: the driver's candidate)."""
        return self.driver.handle if self.driver is not None else self.loaded_handle

    def notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def wait_changed(self) -> None:
        await self._changed.wait()

    def record_terminal(self, event: DaemonEvent) -> None:
        prompt_id = event_prompt_id(event)
        if prompt_id is None:
            return
        self.terminals[prompt_id] = event
        self.terminals.move_to_end(prompt_id)
        while len(self.terminals) > _TERMINALS_KEPT:
            self.terminals.popitem(last=False)


class WebUIProvider:
    """The headless WebUI's session provider (see the module docstring).

    ``max_blocks`` is the configured store cap; ``history_page_size`` the ``historyPageSize``
    of ordinary (configured) loads, ``None`` for memory replay; ``page_size`` the ``limit`` of
    :meth:`load_more`. ``load_warnings`` is called after every (re)load, including a repair
    commit. ``handle_options`` go to every :class:`~sdk.session.SessionHandle` (transport,
    reconnect policy, ...). ``detach_timeout`` bounds the courtesy detach of a dropped handle.
    """

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
        self._session: _Session | None = None
        self._navigating = 0
        self._root: trio.Nursery | None = None
        self._stack: AsyncExitStack | None = None
        self._unmounted = False
        self._changed = trio.Event()
        self.store.subscribe(self._touch)

    # -- mounting --------------------------------------------------------------------------------

    async def __aenter__(self) -> WebUIProvider:
        if self._stack is not None or self._unmounted:
            raise RuntimeError("a WebUIProvider is mounted once")
        stack = AsyncExitStack()
        self._root = await stack.enter_async_context(trio.open_nursery())
        self._stack = stack
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        assert self._stack is not None
        try:
            await self.unmount()
        finally:
            suppressed = await self._stack.__aexit__(exc_type, exc, tb)
        return bool(suppressed)

    # -- reading -----------------------------------------------------------------------------------

    @property
    def session_id(self) -> str | None:
        return None if self._session is None else self._session.session_id

    @property
    def handle(self) -> SessionHandle | None:
        """The session handle that owns the subscription now."""
        return None if self._session is None else self._session.owner

    @property
    def episode(self) -> RepairEpisode | None:
        """The live repair episode of the current session, if any."""
        session = self._session
        if session is None or session.driver is None:
            return None
        return session.driver.episode

    @property
    def checkpoint(self) -> Checkpoint | None:
        """The current episode's checkpoint (what a repair would start from)."""
        session = self._session
        return None if session is None else self._episode_checkpoint(session)

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

    def guards(self) -> RepairGuards:
        """The repair guards as they stand for the current session."""
        session = self._session
        if session is None:
            return RepairGuards(current_session_id=None, navigation_in_flight=self._navigating > 0)
        return self._guards_for(session)

    async def wait_repair(self) -> RepairOutcome | None:
        """Wait until the current session's repair episode ends; return how its attempt ended.

        The outcome says what happened (``REPAIRED``, ``FAILED``, ``AUTH_FAILED``,
        ``MISSING_SESSION``, or ``ABORTED`` when navigation or a reload cancelled a running
        attempt). Returns None at once when no episode is live, and None when the episode ends
        without an attempt: a configured reload, a resync or navigation removed it, or the
        event stream stopped before the target's terminal arrived. An attempt that already
        ended is not waited for again: read :attr:`repair_outcomes` for the history.
        """
        session = self._session
        driver = None if session is None else session.driver
        if driver is None:
            return None
        # The driver answers None at once when nothing could end with an outcome.
        return await driver.wait_outcome(len(driver.outcomes) + 1)

    async def wait_for(self, predicate: Callable[[], bool]) -> None:
        """Wait until ``predicate()`` holds; re-checked after every store or provider change."""
        while not predicate():
            await self._changed.wait()

    def add_notice(self, notice: Notice) -> None:
        """Show a notice (deduplicated by id, newest 50 kept)."""
        self._board.add(notice)
        self._touch()

    def dismiss_notice(self, notice_id: str) -> bool:
        removed = self._board.dismiss(notice_id)
        self._touch()
        return removed

    # -- navigation --------------------------------------------------------------------------------

    async def open_session(self, session_id: str) -> LoadResult:
        """Switch to ``session_id``: drop the current session, then load, replay, subscribe."""
        root = self._require_mounted()
        if not session_id:
            raise ValueError("session_id must be a non-empty string")
        self._navigating += 1
        try:
            await self._teardown(clear_store=True)
            session = _Session(session_id)
            self._session = session
            await root.start(self._host, session)
        finally:
            self._navigating -= 1
        log.info("event=provider_open session=%s", session_id)
        return await self._load(session, self.history_page_size, initial=True)

    async def reload(self) -> LoadResult:
        """The configured reload of the current session; aborts any repair episode."""
        session = self._require_session()
        if session.driver is not None:
            session.driver.abort()
        return await self._load(session, self.history_page_size, initial=False)

    async def clear(self) -> None:
        """Close the current session and empty the transcript."""
        self._require_mounted()
        self._navigating += 1
        try:
            await self._teardown(clear_store=True)
        finally:
            self._navigating -= 1

    async def unmount(self) -> None:
        """Drop the session (the transcript stays readable) and stop every provider task."""
        if self._unmounted:
            return
        self._navigating += 1
        try:
            await self._teardown(clear_store=False)
        finally:
            self._navigating -= 1
            self._unmounted = True
            if self._root is not None:
                self._root.cancel_scope.cancel()
            self._touch()

    # -- work on the current session -------------------------------------------------------------

    async def load_more(self, *, force: bool = False) -> PageOutcome | None:
        """Fetch and prepend the next older history page.

        Returns the applied (or capacity-rejected) page, or None when no request was made (no
        more history, a latched error without ``force``, a request already in flight) or it
        failed: transient failures add a ``daemon.transcript_history.failed`` notice and keep
        ``has_more``; other failures latch ``pagination_error``.
        """
        session = self._require_session()
        if session.page_requests:
            return None
        pagination, request = load_more(self.store.pagination, force=force)
        if pagination != self.store.pagination:
            self._set_pagination(session, pagination)
        owner = session.owner
        if request is None or owner is None:
            return None
        generation = session.generation
        session.page_requests += 1
        try:
            with self._operation(session):
                try:
                    page = await owner.client.transcript_page(
                        session.session_id,
                        limit=request.limit,
                        cursor=request.cursor,
                        before_record_id=request.before_record_id,
                    )
                except DaemonError as exc:
                    self._page_failed(session, exc)
                    return None
            self._require_current(session)
            if session.generation != generation:
                log.info("event=history_page_dropped session=%s", session.session_id)
                return None
            outcome = apply_history_page(
                self.store.snapshot_state(),
                page,
                configured_max_blocks=self.store.configured_max_blocks,
            )
            self.store.reset(outcome.state)
            blocks, after = outcome.page_blocks, outcome.state.pagination
            self._mirror(session, lambda cp: mirror_page(cp, blocks, pagination=after))
            return outcome
        finally:
            session.page_requests -= 1
            self._idle_point(session)

    async def prompt(
        self, prompt: str | Sequence[Mapping[str, Any]], *, deadline_ms: int | None = None
    ) -> TurnCompleteData:
        """Send a prompt from this UI and wait for its terminal (a repair waits meanwhile).

        Raises :class:`~sdk.errors.TurnError` on ``turn_error``, the subscription's final error
        if it stops first, :class:`SessionAbandonedError` on navigation.
        """
        session = self._require_session()
        session.local_prompts += 1
        terminal: DaemonEvent | None = None
        prompt_id = ""
        try:
            with self._operation(session):
                await self._wait_no_attempt(session)
                owner = self._require_owner(session)
                accepted = await owner.client.send_prompt(session.session_id, prompt, deadline_ms)
                prompt_id = accepted.prompt_id
                terminal = await self._wait_terminal(session, prompt_id)
        finally:
            session.local_prompts -= 1
            self._idle_point(session)
        assert terminal is not None
        return _terminal_result(terminal, prompt_id)

    async def resume(self) -> None:
        """Re-register with the daemon and restart a paused or stopped subscription."""
        session = self._require_session()
        session.resumes += 1
        try:
            with self._operation(session):
                await self._wait_no_attempt(session)
                owner = self._require_owner(session)
                try:
                    await owner.client.resume_session(session.session_id)
                except DaemonError as exc:
                    self._connection_failed(exc, initial=False)
                    raise
            self._require_current(session)
            if owner.state is SubscriptionState.PAUSED:
                owner.resume()
            elif owner.state is SubscriptionState.STOPPED:
                self._resubscribe(session, owner)
            session.stop_error = None
            self._set_connection(ConnectionState.CONNECTED)
        finally:
            session.resumes -= 1
            self._idle_point(session)

    # -- loads -----------------------------------------------------------------------------------

    async def _load(
        self, session: _Session, history_page_size: int | None, *, initial: bool
    ) -> LoadResult:
        previous = session.owner
        paused = previous is not None and previous.state is SubscriptionState.RUNNING
        if previous is not None and paused:
            # Events the old stream would deliver now are in the new snapshot anyway.
            previous.pause()
        session.loads += 1
        made: SessionHandle | None = None
        try:
            with self._operation(session):
                supported = await self._pagination_enabled()
                made, result = await SessionHandle.load(
                    self.client,
                    session.session_id,
                    history_page_size=history_page_size,
                    **self._handle_options,
                )
            self._commit_load(session, made, result, supported)
            made = None
        except BaseException as exc:
            if made is not None:
                await self._close_quietly(made)
            if not session.closed:
                if isinstance(exc, DaemonError):
                    self._connection_failed(exc, initial=initial)
                if paused and previous is not None and previous.state is SubscriptionState.PAUSED:
                    previous.resume()
            raise
        finally:
            session.loads -= 1
            self._idle_point(session)
        if previous is not None and previous is not session.owner:
            await self._close_quietly(previous)
        return result

    def _commit_load(
        self, session: _Session, handle: SessionHandle, result: LoadResult, supported: bool
    ) -> None:
        self._require_current(session)
        assert session.nursery is not None
        replay = replay_snapshot(
            result.compacted_replay,
            result.live_journal,
            configured_max_blocks=self.store.configured_max_blocks,
            pagination_enabled=supported,
            history_has_more=result.history_has_more,
            history_anchor_record_id=result.history_anchor_record_id,
            page_size=self.page_size,
        )
        driver = session.driver
        if driver is None:
            driver = RepairDriver(
                handle,
                session.nursery,
                commit=partial(self._commit_repair, session),
                notify=partial(self._repair_notice, session),
                guards=partial(self._guards_for, session),
                on_outcome=partial(self._repair_outcome, session),
                registry=self._registry,
            )
            session.driver = driver
        else:
            driver.handle = handle
        session.loaded_handle = handle
        session.next_checkpoint = None
        session.stop_error = None
        session.generation += 1
        episode = driver.begin(result)
        self.store.reset(replay.state)
        self._perform(replay.side_effects)
        if episode is not None:
            episode.ui_state = take_checkpoint(replay)
        for event in result.events:
            if event.type in TERMINAL_TYPES:
                session.record_terminal(event)
        handle.subscribe(
            session.nursery,
            partial(self._on_event, session),
            on_stop=partial(self._on_stop, session),
        )
        self._set_connection(ConnectionState.CONNECTED)
        self._apply_load_warnings(session)
        session.notify()
        log.info(
            "event=provider_loaded session=%s blocks=%d last_event_id=%s episode=%s",
            session.session_id,
            len(self.store.blocks),
            result.last_event_id,
            None if episode is None else episode.signature,
        )

    async def _pagination_enabled(self) -> bool:
        if self._pagination_supported is None:
            capabilities = await self.client.capabilities()
            self._pagination_supported = capabilities.supports(PAGINATION_CAPABILITY)
        return self._pagination_supported

    def _apply_load_warnings(self, session: _Session) -> None:
        if self._load_warnings is None:
            return
        shown = {
            block.text
            for block in self.store.blocks
            if isinstance(block, MessageBlock) and block.kind == "status"
        }
        for text in self._load_warnings():
            if not text or text in shown:
                continue
            block = self.store.add_status(text, source=PROVIDER_SOURCE)
            shown.add(text)
            self._mirror(session, partial(mirror_status, block=block))

    async def _resync(self, session: _Session) -> None:
        try:
            await self._load(session, self.history_page_size, initial=False)
        except SessionAbandonedError:
            pass
        except DaemonError as exc:
            # The old subscription resumed; the transcript stays as it was.
            log.warning("event=resync_reload_failed session=%s error=%r", session.session_id, exc)
            self.add_notice(
                Notice(
                    id=RELOAD_FAILED_CODE,
                    code=RELOAD_FAILED_CODE,
                    message="Could not reload the session after the event stream lost continuity.",
                    operation="load_session",
                    debug_message=str(exc),
                )
            )
        finally:
            session.resync_scheduled = False

    # -- live events -----------------------------------------------------------------------------

    async def _on_event(self, session: _Session, event: DaemonEvent) -> None:
        if session.closed:
            return
        self._perform(self.store.dispatch(event))
        if event.type in TERMINAL_TYPES:
            # Prompt state settles before the repair check: a waiting prompt() sees its terminal.
            session.record_terminal(event)
            session.notify()
        driver = session.driver
        if event.type == "state_resync_required":
            if driver is not None:
                driver.abort()
            if not session.resync_scheduled and session.nursery is not None:
                session.resync_scheduled = True
                session.nursery.start_soon(self._resync, session)
        elif driver is not None:
            driver.observe(event)
        self._touch()

    def _on_stop(self, session: _Session, error: DaemonError) -> None:
        if session.closed:
            return
        log.info("event=provider_stream_stopped session=%s error=%r", session.session_id, error)
        session.stop_error = error
        self._connection_failed(error, initial=True)
        session.notify()

    def _resubscribe(self, session: _Session, stopped: SessionHandle) -> None:
        assert session.nursery is not None
        fresh = SessionHandle(
            stopped.client,
            session.session_id,
            last_event_id=stopped.last_event_id,
            epoch=stopped.epoch,
            **stopped.options(),
        )
        if session.driver is not None:
            session.driver.handle = fresh
        session.loaded_handle = fresh
        fresh.subscribe(
            session.nursery,
            partial(self._on_event, session),
            on_stop=partial(self._on_stop, session),
        )

    # -- repair ------------------------------------------------------------------------------------

    def _guards_for(self, session: _Session) -> RepairGuards:
        current = self._session is session and not session.closed
        return RepairGuards(
            current_session_id=session.session_id if current else None,
            load_in_flight=session.loads > 0,
            resume_in_flight=session.resumes > 0,
            navigation_in_flight=self._navigating > 0,
            page_request_in_flight=session.page_requests > 0,
            local_prompt_in_flight=session.local_prompts > 0,
        )

    def _idle_point(self, session: _Session) -> None:
        if not session.closed and session.driver is not None:
            session.driver.check()
        self._touch()

    def _episode_checkpoint(self, session: _Session) -> Checkpoint | None:
        episode = None if session.driver is None else session.driver.episode
        return None if episode is None else self._adopt(session, episode)

    def _adopt(self, session: _Session, episode: RepairEpisode) -> Checkpoint | None:
        """The episode's checkpoint, taking over the one a repair commit computed for it."""
        pending = session.next_checkpoint
        if episode.ui_state is None and pending is not None and (
            pending.prompt_id is None or pending.prompt_id == episode.prompt_id
        ):
            episode.ui_state = pending
            session.next_checkpoint = None
        state = episode.ui_state
        return state if isinstance(state, Checkpoint) else None

    def _mirror(self, session: _Session, update: Callable[[Checkpoint], Checkpoint]) -> None:
        episode = None if session.driver is None else session.driver.episode
        if episode is not None:
            checkpoint = self._adopt(session, episode)
            if checkpoint is not None:
                episode.ui_state = update(checkpoint)
        if session.next_checkpoint is not None:
            session.next_checkpoint = update(session.next_checkpoint)

    def _commit_repair(self, session: _Session, candidate: RepairCandidate) -> None:
        """The driver's ``commit``: raising rejects the candidate (one failure notice)."""
        self._require_current(session)
        checkpoint = self._adopt(session, candidate.episode)
        if checkpoint is None:
            raise RuntimeError(
                f"repair episode {candidate.episode.signature!r} has no checkpoint: the replayed "
                "marker was not the one the driver targets"
            )
        build = build_repair(
            self.store.snapshot_state(),
            checkpoint,
            candidate.events,
            candidate.suffix_start,
            make_is_new(candidate.observed_ids, candidate.watermark, candidate.highest_live_id),
            self.store.configured_max_blocks,
        )
        self.store.reset(build.state)
        self._perform(build.side_effects)
        if not build.from_checkpoint:
            session.generation += 1
        session.next_checkpoint = build.checkpoint
        for event in candidate.events:
            if event.type in TERMINAL_TYPES:
                session.record_terminal(event)
        self._apply_load_warnings(session)
        log.info(
            "event=live_journal_repaired session=%s signature=%s from_checkpoint=%s blocks=%d",
            session.session_id,
            candidate.episode.signature,
            build.from_checkpoint,
            len(self.store.blocks),
        )

    def _repair_notice(self, session: _Session, notice: RepairNotice) -> None:
        if not session.closed:
            self.add_notice(notice_from_repair(notice))

    def _repair_outcome(self, session: _Session, outcome: RepairOutcome) -> None:
        self.repair_attempts += 1
        self.repair_outcomes.append(outcome)
        if not session.closed:
            if outcome.kind is RepairOutcomeKind.REPAIRED:
                self._episode_checkpoint(session)
                self._set_connection(ConnectionState.CONNECTED)
            elif outcome.kind is RepairOutcomeKind.AUTH_FAILED:
                self._set_connection(ConnectionState.AUTH_FAILED)
            elif outcome.kind is RepairOutcomeKind.MISSING_SESSION:
                self._set_connection(ConnectionState.DISCONNECTED, missing_session=True)
            session.notify()
        self._idle_point(session)

    async def _wait_no_attempt(self, session: _Session) -> None:
        # A prompt sent mid-attempt would wait on a handle the attempt is about to replace.
        while session.driver is not None and session.driver.attempting:
            await session.wait_changed()

    async def _wait_terminal(self, session: _Session, prompt_id: str) -> DaemonEvent:
        while True:
            terminal = session.terminals.get(prompt_id)
            if terminal is not None:
                return terminal
            if session.stop_error is not None:
                raise session.stop_error
            await session.wait_changed()

    # -- effects and state ---------------------------------------------------------------------------

    def _perform(self, effects: Iterable[SideEffect]) -> None:
        for effect in effects:
            if isinstance(effect, Notice):
                self._board.add(effect)
            else:
                self.side_channels.record(effect)

    def _set_pagination(self, session: _Session, pagination: PaginationState) -> None:
        self.store.set_pagination(pagination)
        self._mirror(session, lambda cp: mirror_page(cp, (), pagination=pagination))

    def _page_failed(self, session: _Session, exc: DaemonError) -> None:
        status = getattr(exc, "status", None)
        code = getattr(exc, "code", None)
        error = PageError(
            message=str(exc) or type(exc).__name__,
            status=status if isinstance(status, int) else None,
            code=code if isinstance(code, str) else None,
        )
        log.info(
            "event=history_page_failed session=%s status=%s error=%r",
            session.session_id,
            error.status,
            error.message,
        )
        if session.closed:
            return
        pagination, notice = after_page_error(self.store.pagination, error)
        if pagination != self.store.pagination:
            self._set_pagination(session, pagination)
        if notice is not None:
            self.add_notice(notice)

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
        self._changed.set()
        self._changed = trio.Event()

    # -- lifetimes ---------------------------------------------------------------------------------

    async def _host(
        self, session: _Session, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        with session.scope:
            async with trio.open_nursery() as nursery:
                session.nursery = nursery
                task_status.started()
                await trio.sleep_forever()

    async def _teardown(self, *, clear_store: bool) -> None:
        session, self._session = self._session, None
        if session is not None:
            session.closed = True
            if session.driver is not None:
                session.driver.abort()
            for scope in tuple(session.op_scopes):
                scope.cancel()
            session.scope.cancel()
            session.notify()
            owner = session.owner
            if owner is not None:
                await self._close_quietly(owner)
            log.info("event=provider_session_closed session=%s", session.session_id)
        if clear_store:
            self.store.clear()
        self._set_connection(ConnectionState.IDLE)

    async def _close_quietly(self, handle: SessionHandle) -> None:
        with trio.CancelScope(shield=True), trio.move_on_after(self._detach_timeout):
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
    def _operation(self, session: _Session) -> Iterator[None]:
        """Run the body under a scope that navigation cancels; then raise SessionAbandoned."""
        if session.closed:
            raise SessionAbandonedError(f"session {session.session_id} is no longer open")
        scope = trio.CancelScope()
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

    def _require_mounted(self) -> trio.Nursery:
        if self._unmounted:
            raise RuntimeError("the WebUIProvider is unmounted")
        if self._root is None:
            raise RuntimeError("mount the WebUIProvider first: async with WebUIProvider(...)")
        return self._root

    def _require_session(self) -> _Session:
        self._require_mounted()
        if self._session is None:
            raise RuntimeError("no session is open: call open_session() first")
        return self._session

    def _require_current(self, session: _Session) -> None:
        if session.closed or self._session is not session:
            raise SessionAbandonedError(f"session {session.session_id} is no longer open")

    def _require_owner(self, session: _Session) -> SessionHandle:
        owner = session.owner
        if owner is None:
            raise RuntimeError(f"session {session.session_id} has no loaded handle yet")
        return owner


def _terminal_result(event: DaemonEvent, prompt_id: str) -> TurnCompleteData:
    typed = typed_data(event)
    if event.type == "turn_error":
        if isinstance(typed, TurnErrorData):
            raise TurnError(typed.code, typed.message, typed.prompt_id)
        raise TurnError(None, "turn failed", prompt_id)
    if isinstance(typed, TurnCompleteData):
        return typed
    return TurnCompleteData(prompt_id=prompt_id)
