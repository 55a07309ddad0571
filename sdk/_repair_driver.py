"""The driver of a live-journal repair episode (anyio: Trio and asyncio alike).

The rules are pure and live in :mod:`sdk._repair`; this module owns the lifetimes. A
:class:`RepairDriver` follows one session for a UI (the WebUI model's provider, a CLI, a test):

1. :meth:`RepairDriver.begin` with a load snapshot: a recoverable live marker starts an episode;
2. :meth:`RepairDriver.observe` with every live event of the owner handle's subscription: the
   target's terminal arms the episode, and the guards are re-checked after each event;
3. :meth:`RepairDriver.check` whenever a guard may have cleared (a local prompt settled, a page
   request, load, resume or navigation ended): when all guards hold, the attempt starts as a
   task in the driver's task group (or Trio nursery), never inside the subscription it pauses.

The attempt pauses the owner's subscription, makes one same-session memory-replay load with a
fresh registration, validates it and hands a :class:`RepairCandidate` to the UI's ``commit``.
On success the old handle is detached and the candidate takes over the subscription; on
failure exactly one notice goes to the ``notify`` sink and the old handle resumes (validation,
network, 5xx) or stays paused (auth → ``AUTH_FAILED``, 404/410 → ``MISSING_SESSION``).
:meth:`RepairDriver.abort` (or cancelling the driver's nursery) ends an attempt silently.

An attempt's end is one step without a checkpoint: the subscription hand-over (or the resume),
the end of the episode (``driver.episode`` becomes None, or the next episode of a fresh live
journal), the notice, ``driver.outcomes`` and ``on_outcome`` all happen together, so a task
woken by any of them sees all of them. Detaching the replaced handle's registration comes after.

:meth:`RepairDriver.wait_outcome` never waits on something that cannot happen: it returns None
when there is no episode, when the episode is removed without an attempt (``abort()``, a new
``begin()``), or when the owner's subscription has ended (stopped or closed) before the episode
armed.
"""

from __future__ import annotations

import enum
import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final, TypeAlias

import anyio

from sdk._client import LoadResult
from sdk._errors import AuthError, DaemonError, SessionNotFoundError
from sdk._repair import (
    EpisodeRegistry,
    RepairEpisode,
    RepairGuards,
    RepairNotice,
    RepairState,
    RepairTarget,
    RepairValidationError,
    find_repair_target,
    repair_failure_notice,
    validate_fresh_snapshot,
)
from sdk._session import SessionHandle, SubscriptionState, TaskSpawner, spawn
from sdk.protocol.envelope import DaemonEvent

__all__ = [
    "CommitFn",
    "GuardsFn",
    "NoticeSink",
    "RepairCandidate",
    "RepairDriver",
    "RepairOutcome",
    "RepairOutcomeKind",
]

log = logging.getLogger("sdk.repair_driver")

# Detaching an abandoned candidate is courtesy: never let it hold up an abort for long.
_CLEANUP_TIMEOUT_S: Final = 5.0


@dataclass(frozen=True)
class RepairCandidate:
    """What the UI's ``commit`` gets: a validated fresh snapshot and a handle positioned after it.

    ``handle`` is not subscribed yet: the driver subscribes it only after ``commit`` returns.
    ``events`` is ``compactedReplay + liveJournal``; the suffix (the target's first user input
    through the end) starts at ``suffix_start``. ``observed_ids``, ``watermark`` and
    ``highest_live_id`` are what decides which replayed events are new and fire their side effects
    again (``episode.is_new`` applies them).
    """

    handle: SessionHandle
    load: LoadResult
    events: list[DaemonEvent]
    suffix_start: int
    target: RepairTarget
    observed_ids: frozenset[int]
    watermark: int | None
    highest_live_id: int | None
    episode: RepairEpisode

    @property
    def suffix(self) -> list[DaemonEvent]:
        return self.events[self.suffix_start :]


class RepairOutcomeKind(enum.Enum):
    REPAIRED = "repaired"  # committed; the candidate owns the subscription
    FAILED = "failed"  # validation, commit, network or 5xx: previous handle resumed
    AUTH_FAILED = "auth_failed"  # 401/403: previous handle left paused
    MISSING_SESSION = "missing_session"  # 404/410: disconnected, previous handle left paused
    ABORTED = "aborted"  # cancelled: no notice, previous handle left paused


@dataclass(frozen=True)
class RepairOutcome:
    kind: RepairOutcomeKind
    signature: str
    handle: SessionHandle
    """The subscription owner after the attempt (the candidate on success)."""
    notice: RepairNotice | None = None
    error: BaseException | None = None
    load: LoadResult | None = None
    """The fresh snapshot, on success."""

    @property
    def missing_session(self) -> bool:
        return self.kind is RepairOutcomeKind.MISSING_SESSION


CommitFn: TypeAlias = Callable[[RepairCandidate], object]
"""Sync or async; returning means committed, raising counts as a validation failure."""
NoticeSink: TypeAlias = Callable[[RepairNotice], None]
GuardsFn: TypeAlias = Callable[[], RepairGuards]
OutcomeFn: TypeAlias = Callable[[RepairOutcome], None]


class RepairDriver:
    """Drives the repair episodes of one session (see the module docstring).

    ``handle`` is the current subscription owner; it must have subscribed (the candidate takes
    over its task group and callbacks). ``nursery`` (a task group, Trio nursery or ``asyncio.TaskGroup``) runs attempts. ``guards`` reports the UI's
    in-flight work (default: only this handle's own prompts); ``on_outcome`` is told how each
    attempt ended; ``registry`` remembers attempted signatures (share one per UI).
    """

    def __init__(
        self,
        handle: SessionHandle,
        nursery: TaskSpawner,
        *,
        commit: CommitFn,
        notify: NoticeSink,
        guards: GuardsFn | None = None,
        on_outcome: OutcomeFn | None = None,
        registry: EpisodeRegistry | None = None,
    ) -> None:
        self.handle = handle
        self.session_id = handle.session_id
        self.episode: RepairEpisode | None = None
        self.outcomes: list[RepairOutcome] = []
        self.registry = registry if registry is not None else EpisodeRegistry()
        self._nursery = nursery
        self._commit = commit
        self._notify = notify
        self._guards = guards
        self._on_outcome = on_outcome
        self._changed: anyio.Event | None = None
        self._running = 0
        """Attempt tasks started and not yet ended (an aborted one still ends with an outcome)."""

    # -- the episode -------------------------------------------------------------------------

    def begin(self, load: LoadResult) -> RepairEpisode | None:
        """Start an episode when ``load``'s live journal shows a recoverable live marker.

        Replaces (aborts) any current episode: a new snapshot is the new truth.
        """
        if load.session_id != self.session_id:
            raise ValueError(
                f"snapshot of session {load.session_id} given to the driver of {self.session_id}"
            )
        self.abort()
        target = find_repair_target(
            self.session_id, load.live_journal, load.last_event_id, load.replay_degraded is True
        )
        if target is None:
            return None
        observed = [event.id for event in load.live_journal if event.id is not None]
        episode = self.registry.new_episode(self.session_id, target, observed, load.last_event_id)
        self.episode = episode
        self._signal()
        return episode

    def observe(self, event: DaemonEvent) -> bool:
        """Account for one live event of the owner's subscription; True if an attempt started."""
        episode = self.episode
        if episode is None:
            return False
        episode.observe_live(event)
        return self.check()

    def current_guards(self) -> RepairGuards:
        if self._guards is not None:
            return self._guards()
        return RepairGuards(
            current_session_id=self.session_id,
            local_prompt_in_flight=self.handle.prompts_in_flight > 0,
        )

    def check(self) -> bool:
        """Start the attempt if the episode is armed and every guard holds (no timers)."""
        episode = self.episode
        if episode is None or not episode.should_attempt(self.current_guards()):
            return False
        # Marked before the load is even scheduled: whatever happens, no second attempt.
        episode.mark_attempted()
        scope = anyio.CancelScope()
        episode.attempt_scope = scope
        self._running += 1
        spawn(self._nursery, self._attempt, episode, scope)
        self._signal()
        return True

    def abort(self) -> None:
        """Cancel a running attempt and drop the episode, without a notice."""
        episode, self.episode = self.episode, None
        if episode is None:
            return
        scope = episode.attempt_scope
        if isinstance(scope, anyio.CancelScope):
            scope.cancel()
        episode.finish()
        self._signal()

    @property
    def attempting(self) -> bool:
        return self.episode is not None and self.episode.state is RepairState.RELOADING

    def _signal(self) -> None:
        changed, self._changed = self._changed, None
        if changed is not None:
            changed.set()

    def _next_change(self) -> anyio.Event:
        """The event the next :meth:`_signal` sets (made on demand: cheap when nobody waits)."""
        if self._changed is None:
            self._changed = anyio.Event()
        return self._changed

    def _outcome_possible(self) -> bool:
        """Could another attempt end without a new ``begin()``?"""
        if self._running:
            return True  # an attempt task runs: it ends with an outcome, ABORTED at worst
        episode = self.episode
        if episode is None or episode.attempted:
            return False
        # A pending episode arms only on a live terminal: the owner's reader must still run
        # (or be paused, to be resumed).
        return self.handle.state not in (SubscriptionState.STOPPED, SubscriptionState.CLOSED)

    async def wait_outcome(self, count: int = 1) -> RepairOutcome | None:
        """Wait until ``count`` attempts have ended in all and return the latest outcome.

        Returns None instead as soon as that can no longer happen without a new
        :meth:`begin`: no attempt is running and there is no episode, or its episode was
        removed without an attempt (:meth:`abort`, a replacing :meth:`begin`), or the owner
        handle's subscription stopped or closed before the episode armed. An attempt that is
        already running (even one :meth:`abort` cancelled) is waited for: it always ends with
        an outcome. Outcomes that already happened count (``count=1`` after a finished repair
        returns it at once).
        """
        while len(self.outcomes) < count:
            if not self._outcome_possible():
                return None
            # Taken before the waiting tasks start, so a change in between is not missed.
            await _first_of(self._next_change().wait, lambda: self.handle.wait_state(
                SubscriptionState.STOPPED, SubscriptionState.CLOSED
            ))
        return self.outcomes[-1]

    # -- the attempt --------------------------------------------------------------------------

    async def _attempt(self, episode: RepairEpisode, scope: anyio.CancelScope) -> None:
        previous = self.handle
        # The candidate may exist when a cancel lands mid-attempt; the cleanup must see it.
        made: list[SessionHandle] = []
        outcome: RepairOutcome | None = None
        ended = False
        try:
            with scope:
                previous.pause()
                outcome = await self._load_validate_commit(episode, previous, made)
            if outcome is None:  # only our own cancel scope leaves it unset
                outcome = RepairOutcome(RepairOutcomeKind.ABORTED, episode.signature, previous)
            if outcome.kind is not RepairOutcomeKind.REPAIRED:
                for candidate in made:
                    await _detach_quietly(candidate)
            # From here to the end of _end_attempt: no checkpoint.
            ended = True
            self._end_attempt(episode, previous, outcome)
        finally:
            if not ended:  # cancelled from outside (the driver's nursery): no outcome
                for candidate in made:
                    await _detach_quietly(candidate)
                episode.finish()
                if self.episode is episode:
                    self.episode = None
                self._running -= 1
                self._signal()
        if outcome.kind is RepairOutcomeKind.REPAIRED:
            await self._detach_replaced(previous)

    def _end_attempt(
        self, episode: RepairEpisode, previous: SessionHandle, outcome: RepairOutcome
    ) -> None:
        """Everything an attempt's end changes, in one step (see the module docstring)."""
        self._running -= 1
        episode.finish()
        if self.episode is episode:
            self.episode = None
        if outcome.kind is RepairOutcomeKind.REPAIRED:
            assert outcome.load is not None
            self.handle = outcome.handle
            # A fresh live journal ending with another prompt's recoverable marker is a separate
            # episode; it exists before the candidate's first live event is observed.
            self.begin(outcome.load)
            if previous.state is not SubscriptionState.IDLE:
                outcome.handle.take_over(previous)
            previous.stop()
        elif (
            outcome.kind is RepairOutcomeKind.FAILED and previous.state is SubscriptionState.PAUSED
        ):
            previous.resume()
        if outcome.notice is not None:
            self._notify(outcome.notice)
        self.outcomes.append(outcome)
        self._signal()
        if self._on_outcome is not None:
            self._on_outcome(outcome)

    async def _load_validate_commit(
        self, episode: RepairEpisode, previous: SessionHandle, made: list[SessionHandle]
    ) -> RepairOutcome:
        signature = episode.signature
        try:
            # A fresh registration: detaching either handle later must not unregister the other.
            view = previous.client.with_client_id(None)
            fresh = await view.load_session(self.session_id)  # memory replay: no page size
            candidate = SessionHandle.from_load(view, fresh, **previous.options())
            made.append(candidate)
            checked = validate_fresh_snapshot(
                fresh.compacted_replay, fresh.live_journal, fresh.replay_degraded is True,
                episode.prompt_id
            )
            if isinstance(checked, RepairValidationError):
                return self._failed(RepairOutcomeKind.FAILED, signature, previous, checked)
            found = RepairCandidate(
                handle=candidate,
                load=fresh,
                events=checked.events,
                suffix_start=checked.start,
                target=episode.target,
                observed_ids=episode.observed_ids,
                watermark=episode.watermark,
                highest_live_id=episode.highest_live_id,
                episode=episode,
            )
            try:
                result = self._commit(found)
                if inspect.isawaitable(result):
                    await result
            except Exception as exc:  # the UI refused the candidate: a validation failure
                return self._failed(RepairOutcomeKind.FAILED, signature, previous, exc)
        except AuthError as exc:
            return self._failed(RepairOutcomeKind.AUTH_FAILED, signature, previous, exc)
        except SessionNotFoundError as exc:
            return self._failed(RepairOutcomeKind.MISSING_SESSION, signature, previous, exc)
        except DaemonError as exc:  # network, timeout, 5xx, any other refusal
            return self._failed(RepairOutcomeKind.FAILED, signature, previous, exc)
        return RepairOutcome(RepairOutcomeKind.REPAIRED, signature, candidate, load=fresh)

    def _failed(
        self,
        kind: RepairOutcomeKind,
        signature: str,
        previous: SessionHandle,
        error: BaseException,
    ) -> RepairOutcome:
        text = error.message if isinstance(error, RepairValidationError) else str(error)
        log.info(
            "event=live_journal_repair_failed session=%s signature=%s kind=%s error=%r",
            self.session_id,
            signature,
            kind.value,
            text,
        )
        notice = repair_failure_notice(signature, text or type(error).__name__)
        return RepairOutcome(kind, signature, previous, notice, error)

    async def _detach_replaced(self, previous: SessionHandle) -> None:
        try:
            await previous.close()
        except DaemonError as exc:
            # The old registration merely lingers until the daemon forgets it.
            log.warning(
                "event=repair_detach_failed session=%s client=%s error=%r",
                self.session_id,
                previous.client_id,
                exc,
            )


async def _first_of(*waits: Callable[[], Awaitable[object]]) -> None:
    """Return as soon as one of ``waits`` returns."""
    async with anyio.create_task_group() as nursery:
        for wait in waits:

            async def run(wait: Callable[[], Awaitable[object]] = wait) -> None:
                await wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(run)


async def _detach_quietly(handle: SessionHandle) -> None:
    with anyio.move_on_after(_CLEANUP_TIMEOUT_S, shield=True):
        try:
            await handle.close()
        except DaemonError as exc:
            log.info(
                "event=repair_candidate_detach_failed session=%s error=%r", handle.session_id, exc
            )
