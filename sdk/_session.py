"""Session handles: a cursor and epoch, a resumable subscription, and ``prompt()``.

A :class:`SessionHandle` is one client's view of one daemon session: its
session id, its own daemon-side client registration (``client_id``), and the resume cursor
(``last_event_id``, ``epoch``). Its subscription is a task in a task group the *caller* owns
(an anyio task group, a Trio nursery or an ``asyncio.TaskGroup``), so the handle runs under
``trio.run`` and ``asyncio.run`` alike:

- :meth:`SessionHandle.subscribe` starts the reader; :meth:`pause` cancels its cancel scope
  but keeps cursor, epoch and registration; :meth:`resume` starts it again from them;
  :meth:`close` stops it and detaches the registration;
- the reader reconnects on its own: network errors, timeouts, 5xx, a wrong content type, the
  stream ending (``client_evicted``, WebSocket close) resume from the cursor after
  ``min(base · 2^(n−1), cap) × uniform[0.8, 1.2]`` (n = failed attempts since the last frame);
  ``base`` is the stream's own ``retry:`` field once one arrived (bounded, see
  :class:`ReconnectPolicy`), and a 429/503 with ``Retry-After`` waits at least that long;
  401/403, 404/410 and a body saying ``retryable: false`` stop it with that error — except that
  a handle made with ``restore=True`` answers a 404/410 by restoring the session once (the
  daemon brings a persisted session back on ``POST /session/{id}/resume``) and retrying.

The reader hands events to an async ``on_event`` callback in stream order; the cursor advances
(to ``max(previous, id)``, only from frames with an id) as an event is handed over, so pausing
inside the callback neither loses nor repeats it. Running the callback in the reader gives
natural back-pressure: a consumer that falls far behind is evicted by the daemon and the
reader resumes from the cursor (``max_queued`` defaults to 1024 so ordinary bursts do not
evict).
"""

from __future__ import annotations

import enum
import inspect
import logging
import math
import random
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeAlias

import anyio
import anyio.lowlevel
import msgspec
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from sdk._client import (
    DEFAULT_MAX_QUEUED,
    DaemonClient,
    EventStream,
    LoadResult,
    PromptAccepted,
    PromptByKeyResponse,
    ResumeResult,
    SessionCreated,
)
from sdk._errors import (
    AuthError,
    DaemonError,
    PromptOutcomeUnknownError,
    SessionNotFoundError,
    TurnError,
    is_retriable,
)
from sdk.protocol.cursor import FollowsCursor, ResumeCursor
from sdk.protocol.envelope import DaemonEvent, names_prompt
from sdk.protocol.events import TurnCompleteData
from sdk.protocol.terminals import terminal_for

if TYPE_CHECKING:
    from sdk._ws import WebSocketEventStream

__all__ = [
    "DEFAULT_MAX_QUEUED",
    "AcceptedCallback",
    "EventCallback",
    "HandleClosedError",
    "ReconnectPolicy",
    "SessionHandle",
    "StopCallback",
    "SubscriptionState",
    "TaskSpawner",
    "Transport",
]

log = logging.getLogger("sdk.session")

Transport: TypeAlias = Literal["sse", "ws"]
EventCallback: TypeAlias = Callable[[DaemonEvent], Awaitable[None]]
AcceptedCallback: TypeAlias = Callable[[PromptAccepted], object]
"""Called with the 202 of a prompt before its first event is awaited; sync or async."""
StopCallback: TypeAlias = Callable[[DaemonError], None]
SleepFn: TypeAlias = Callable[[float], Awaitable[None]]
UniformFn: TypeAlias = Callable[[float, float], float]


class _StartsSoon(Protocol):
    """An anyio task group or a Trio nursery."""

    def start_soon(
        self, func: Callable[..., Coroutine[Any, Any, Any]], *args: Any, name: Any = None
    ) -> object: ...


class _CreatesTasks(Protocol):
    """An ``asyncio.TaskGroup``."""

    def create_task(self, coro: Coroutine[Any, Any, Any], *, name: str | None = None) -> object:
        ...


TaskSpawner: TypeAlias = _StartsSoon | _CreatesTasks
"""Where a subscription's reader (or a repair attempt) runs, owned by the caller: an anyio task
group, a Trio nursery or an ``asyncio.TaskGroup``."""


def spawn(
    group: TaskSpawner, func: Callable[..., Coroutine[Any, Any, Any]], *args: Any
) -> None:
    """Start ``func(*args)`` as a task of ``group`` (any :data:`TaskSpawner`)."""
    if hasattr(group, "start_soon"):
        group.start_soon(func, *args)
    else:
        group.create_task(func(*args))


class HandleClosedError(DaemonError):
    """The session handle was closed while a caller was still waiting on it."""


class ReconnectPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """Reconnect delays: ``min(base · 2^(attempt−1), cap_s) × uniform[jitter_low, high]``.

    ``base`` is ``base_s`` until the server says otherwise: with ``honor_server`` (default) the
    stream's last ``retry:`` field becomes the base, clamped to ``[min_retry_s, cap_s]`` so a
    server can neither make a client spin (``retry: 0``) nor park it for hours. After a 429 or
    503 answer carrying ``Retry-After`` the wait is at least that many seconds (× a jitter in
    ``[1, jitter_high]``, so clients told the same value do not return together), capped at
    ``max_retry_after_s``.
    """

    base_s: float = 1.0
    cap_s: float = 10.0
    jitter_low: float = 0.8
    jitter_high: float = 1.2
    honor_server: bool = True
    min_retry_s: float = 0.1
    max_retry_after_s: float = 60.0

    def __post_init__(self) -> None:
        if not (
            self.base_s >= 0
            and self.cap_s >= 0
            and self.min_retry_s >= 0
            and self.max_retry_after_s >= 0
        ):
            raise ValueError("ReconnectPolicy delays must be >= 0")
        if not 0 <= self.jitter_low <= self.jitter_high:
            raise ValueError("ReconnectPolicy needs 0 <= jitter_low <= jitter_high")

    def base(self, server_retry_s: float | None) -> float:
        """The base delay: the server's ``retry:`` (bounded) when honoured, else ``base_s``."""
        if server_retry_s is None or not self.honor_server:
            return self.base_s
        return min(max(server_retry_s, self.min_retry_s), self.cap_s)

    def delay(
        self,
        attempt: int,
        uniform: UniformFn,
        *,
        server_retry_s: float | None = None,
        retry_after_s: float | None = None,
    ) -> float:
        """The wait before reconnect ``attempt`` (1-based); ``uniform(a, b)`` draws the jitter.

        ``server_retry_s`` is the stream's ``retry:`` in seconds, ``retry_after_s`` the
        ``Retry-After`` of the failure being retried (both None when absent).
        """
        if attempt < 1:
            raise ValueError(f"attempt is 1-based, got {attempt}")
        # 2.0 ** large would overflow: past the cap the exponent no longer matters.
        exponent = min(attempt - 1, 64)
        base = min(self.base(server_retry_s) * 2.0**exponent, self.cap_s)
        wait = base * uniform(self.jitter_low, self.jitter_high)
        if retry_after_s is not None and retry_after_s > 0 and self.honor_server:
            floor = min(retry_after_s, self.max_retry_after_s)
            wait = max(wait, floor * uniform(1.0, max(1.0, self.jitter_high)))
        return wait


class SubscriptionState(enum.Enum):
    IDLE = "idle"  # never subscribed
    RUNNING = "running"  # reader task alive (connected, or waiting to reconnect)
    PAUSED = "paused"  # reader cancelled; cursor, epoch and registration kept
    STOPPED = "stopped"  # a final error ended it (see ``SessionHandle.error``)
    CLOSED = "closed"  # close() ran


class _Stopped:
    """Put in a prompt's tap when the subscription feeding it ends for good."""

    __slots__ = ("error",)

    def __init__(self, error: DaemonError) -> None:
        self.error = error


_TapItem: TypeAlias = DaemonEvent | _Stopped


class SessionHandle(FollowsCursor):
    """One client's handle on one daemon session (see the module docstring).

    Make one with :meth:`create`, :meth:`load` or :meth:`from_load`, or directly from a cursor
    you kept. ``client`` should be this handle's own view
    (:meth:`DaemonClient.with_client_id`); the helpers make one. ``restore=True`` brings a
    session the daemon no longer holds in memory (it restarted) back on the first 404/410 of
    the stream or of :meth:`prompt`, once per failure (see the module docstring). ``sleep``
    and ``uniform`` replace ``anyio.sleep`` and the jitter source (tests).
    """

    def __init__(
        self,
        client: DaemonClient,
        session_id: str,
        *,
        last_event_id: int | None = None,
        epoch: str | None = None,
        transport: Transport = "sse",
        max_queued: int | None = DEFAULT_MAX_QUEUED,
        policy: ReconnectPolicy | None = None,
        restore: bool = False,
        sleep: SleepFn | None = None,
        uniform: UniformFn | None = None,
    ) -> None:
        if not session_id:
            raise ValueError("session_id must be a non-empty string")
        if transport not in ("sse", "ws"):
            raise ValueError(f"transport must be 'sse' or 'ws', got {transport!r}")
        self.cursor = ResumeCursor(last_event_id, epoch)
        """The resume cursor and epoch, kept across pauses and reconnects."""
        self.client = client
        self.session_id = session_id
        self.transport: Transport = transport
        self.max_queued = max_queued
        self.policy = policy if policy is not None else ReconnectPolicy()
        self.restore = restore
        self._sleep: SleepFn = sleep if sleep is not None else anyio.sleep
        self._uniform: UniformFn = uniform if uniform is not None else random.uniform
        self.state = SubscriptionState.IDLE
        self.error: DaemonError | None = None
        """The final error that stopped the subscription (state ``STOPPED``)."""
        self.last_transport_error: DaemonError | None = None
        """The most recent retriable failure the reader recovered from."""
        self.connects = 0
        """Streams opened successfully (the first connection and every reconnect)."""
        self.reconnect_attempts = 0
        """Reconnect waits taken, over the handle's life."""
        self.restores = 0
        """Sessions brought back after a 404/410 (``restore=True`` only)."""
        self.server_retry_s: float | None = None
        """The reconnection time the stream's last ``retry:`` field asked for (seconds)."""
        self.prompts_in_flight = 0
        self._nursery: TaskSpawner | None = None
        self._on_event: EventCallback | None = None
        self._on_stop: StopCallback | None = None
        self._scope: anyio.CancelScope | None = None
        self._taps: set[MemoryObjectSendStream[_TapItem]] = set()
        self._state_changed: anyio.Event | None = None
        self._detached = False

    # -- construction ----------------------------------------------------------------------

    @classmethod
    async def create(
        cls,
        client: DaemonClient,
        cwd: str | None = None,
        *,
        session_id: str | None = None,
        scope: Literal["single", "thread"] | None = "thread",
        client_id: str | None = None,
        **options: Any,
    ) -> SessionHandle:
        """Create a session (``scope="thread"``: always a new one; ``"single"`` or ``None``
        attach to the workspace's live session, the daemon's default).

        The cursor starts at 0, so a subscription replays the whole ring: that is how a client
        follows a new session from its first event. The handle gets its own registration
        (``client_id`` asks for a known one back).
        """
        view = client.with_client_id(client_id)
        created: SessionCreated = await view.create_session(cwd, session_id, scope)
        return cls(view, created.session_id, last_event_id=0, epoch=created.event_epoch, **options)

    @classmethod
    async def load(
        cls,
        client: DaemonClient,
        session_id: str,
        cwd: str | None = None,
        *,
        history_page_size: int | None = None,
        live_replay_mode: Literal["full", "summary"] | None = None,
        client_id: str | None = None,
        **options: Any,
    ) -> tuple[SessionHandle, LoadResult]:
        """Load a snapshot and a handle positioned right after it, with its own registration
        (``client_id`` asks for a known one back)."""
        view = client.with_client_id(client_id)
        result = await view.load_session(session_id, cwd, history_page_size, live_replay_mode)
        return cls.from_load(view, result, **options), result

    @classmethod
    def from_load(cls, view: DaemonClient, result: LoadResult, **options: Any) -> SessionHandle:
        """A handle for a load ``view`` already made: cursor and epoch from the snapshot."""
        return cls(
            view,
            result.session_id,
            last_event_id=result.last_event_id,
            epoch=result.event_epoch,
            **options,
        )

    def options(self) -> dict[str, Any]:
        """The transport and reconnect options, to make a sibling handle that behaves alike."""
        return {
            "transport": self.transport,
            "max_queued": self.max_queued,
            "policy": self.policy,
            "restore": self.restore,
            "sleep": self._sleep,
            "uniform": self._uniform,
        }

    @property
    def client_id(self) -> str | None:
        """This handle's daemon-side registration (adopted from create/load answers)."""
        return self.client.client_id

    @property
    def active(self) -> bool:
        """A subscription exists that will deliver events (running, or paused to be resumed)."""
        return self.state in (SubscriptionState.RUNNING, SubscriptionState.PAUSED)

    # -- subscription ----------------------------------------------------------------------

    def subscribe(
        self,
        nursery: TaskSpawner,
        on_event: EventCallback,
        *,
        on_stop: StopCallback | None = None,
    ) -> None:
        """Start the reader as a task in ``nursery``: the caller's anyio task group, Trio
        nursery or ``asyncio.TaskGroup``.

        ``on_stop`` receives the final error (auth, missing session, non-retryable); without
        it the error is raised from the reader task, i.e. into ``nursery``.
        """
        if self.state is not SubscriptionState.IDLE:
            raise RuntimeError(
                f"session handle {self.session_id} already subscribed "
                f"(state {self.state.name}); use resume() after pause()"
            )
        self._nursery = nursery
        self._on_event = on_event
        self._on_stop = on_stop
        self._start()

    def take_over(self, previous: SessionHandle) -> None:
        """Subscribe with ``previous``'s nursery and callbacks (the repair hand-over)."""
        if previous._nursery is None or previous._on_event is None:
            raise RuntimeError("the previous handle never subscribed: nothing to take over")
        self.subscribe(previous._nursery, previous._on_event, on_stop=previous._on_stop)

    def pause(self) -> None:
        """Cancel the reader; cursor, epoch and the daemon-side registration are kept."""
        if self.state is not SubscriptionState.RUNNING:
            return
        self._set_state(SubscriptionState.PAUSED)
        if self._scope is not None:
            self._scope.cancel()
            self._scope = None

    def resume(self, nursery: TaskSpawner | None = None) -> None:
        """Start the reader again from the kept cursor and epoch."""
        if self.state is not SubscriptionState.PAUSED:
            raise RuntimeError(f"session handle {self.session_id} is {self.state.name}, not PAUSED")
        if nursery is not None:
            self._nursery = nursery
        self._start()

    async def follow(self, on_event: EventCallback) -> None:
        """Run the reconnecting reader in the calling task until a final error, raised here."""
        if self.active:
            raise RuntimeError(f"session handle {self.session_id} already has a subscription")
        error = await self._read(on_event)
        raise error

    async def wait_state(self, *states: SubscriptionState) -> SubscriptionState:
        """Wait until the subscription is in one of ``states``."""
        while self.state not in states:
            if self._state_changed is None:
                self._state_changed = anyio.Event()
            await self._state_changed.wait()
        return self.state

    def _set_state(self, state: SubscriptionState) -> None:
        self.state = state
        # Made by the first waiter: a handle nobody waits on never builds one.
        changed, self._state_changed = self._state_changed, None
        if changed is not None:
            changed.set()

    def _start(self) -> None:
        assert self._nursery is not None and self._on_event is not None
        scope = anyio.CancelScope()
        self._scope = scope
        self._set_state(SubscriptionState.RUNNING)
        spawn(self._nursery, self._run_subscription, scope, self._on_event)

    async def _run_subscription(self, scope: anyio.CancelScope, on_event: EventCallback) -> None:
        with scope:
            error = await self._read(on_event, scope)
            if self._scope is scope:
                self._scope = None
            self.error = error
            log.info(
                "event=subscription_stopped session=%s cursor=%s error=%r",
                self.session_id,
                self.last_event_id,
                error,
            )
            self._set_state(SubscriptionState.STOPPED)
            self._fail_taps(error)
            if self._on_stop is None:
                raise error
            self._on_stop(error)

    def _open(self) -> EventSource:
        if self.transport == "ws":
            # Imported here: wsproto is loaded only by a handle that subscribes over WebSocket.
            from sdk._ws import WebSocketEventStream

            return WebSocketEventStream(
                self.client,
                self.session_id,
                self.last_event_id,
                self.epoch,
                max_queued=self.max_queued,
            )
        return EventStream(
            self.client, self.session_id, self.last_event_id, self.epoch, max_queued=self.max_queued
        )

    async def _restore_session(self) -> ResumeResult:
        """Ask the daemon to bring the session back (``resume`` restores a persisted session
        without sending the replay); raises what the daemon answered, a 404 included."""
        resumed = await self.client.resume_session(self.session_id)
        self.restores += 1
        log.info(
            "event=session_restored session=%s client=%s cursor=%s",
            self.session_id,
            self.client_id,
            self.last_event_id,
        )
        return resumed

    async def _read(
        self, on_event: EventCallback, scope: anyio.CancelScope | None = None
    ) -> DaemonError:
        """Reconnect loop; returns the final error (it never ends otherwise). ``scope`` is the
        subscription's own (the one :meth:`pause` and :meth:`stop` cancel), when it has one."""
        attempt = 0
        restored = False  # a restore ran since the last frame: the next 404 is final
        while True:
            stream = self._open()
            retry_after: float | None = None
            try:
                try:
                    await stream.__aenter__()
                except DaemonError as exc:
                    failure: DaemonError = exc
                    if self.restore and not restored and isinstance(exc, SessionNotFoundError):
                        restored = True
                        try:
                            await self._restore_session()
                        except DaemonError as again:
                            failure = again  # judged like any failure: a 404 here is final
                        else:
                            continue  # reopen at once from the kept cursor
                    if _is_final(failure):
                        return failure
                    self.last_transport_error = failure
                    retry_after = getattr(failure, "retry_after", None)
                else:
                    self.connects += 1
                    self.cursor.answered(stream.epoch)
                    while True:
                        try:
                            event = await stream.__anext__()
                        except StopAsyncIteration:
                            break
                        except DaemonError as exc:
                            if _is_final(exc):
                                return exc
                            self.last_transport_error = exc
                            break
                        # A paused reader must not hand over events the parser already holds
                        # (those come back without a checkpoint): the resumed one will. Its own
                        # scope is asked directly (an attribute, not a trip through anyio's
                        # backend lookup on every event); a bare follow() asks the loop.
                        if scope is None:
                            await anyio.lowlevel.checkpoint_if_cancelled()
                        elif scope.cancel_called:
                            await anyio.sleep_forever()  # the cancellation is on its way
                        attempt = 0
                        restored = False
                        self.cursor.observe(event)
                        self._feed_taps(event)
                        await on_event(event)
            finally:
                if stream.retry_ms is not None:
                    self.server_retry_s = stream.retry_ms / 1000
                await stream.aclose()
            attempt += 1
            self.reconnect_attempts += 1
            delay = self.policy.delay(
                attempt,
                self._uniform,
                server_retry_s=self.server_retry_s,
                retry_after_s=retry_after,
            )
            log.info(
                "event=subscription_reconnect session=%s transport=%s cursor=%s attempt=%d "
                "delay_s=%.3f error=%r",
                self.session_id,
                self.transport,
                self.last_event_id,
                attempt,
                delay,
                self.last_transport_error,
            )
            await self._sleep(delay)

    # -- prompts ---------------------------------------------------------------------------

    def _feed_taps(self, event: DaemonEvent) -> None:
        for tap in self._taps:
            tap.send_nowait(event)

    def _fail_taps(self, error: DaemonError) -> None:
        for tap in self._taps:
            tap.send_nowait(_Stopped(error))

    async def prompt(
        self,
        prompt: str | Sequence[Mapping[str, Any]],
        *,
        deadline_ms: int | None = None,
        on_update: EventCallback | None = None,
        on_accepted: AcceptedCallback | None = None,
        idempotency_key: str | None = None,
    ) -> TurnCompleteData:
        """Send a prompt and wait for its terminal (matched on ``data.promptId``).

        The prompt is submitted exactly once (:meth:`DaemonClient.send_prompt`): one
        ``Idempotency-Key`` for all its sends, a fresh one unless ``idempotency_key`` names it,
        kept across a restore. Before ``on_accepted`` is called an error means nothing was
        admitted, except :class:`~sdk._errors.PromptOutcomeUnknownError` (ask
        :meth:`DaemonClient.find_prompt` with its key); an error after it leaves an admitted
        prompt behind.

        With an active subscription the terminal is taken from it (other prompts' events may
        interleave); otherwise a temporary stream is opened from the 202's cursor and epoch,
        with the same reconnect rules. ``on_accepted`` gets the daemon's 202
        (:class:`~sdk._client.PromptAccepted`: ``prompt_id``, cursor, epoch) as soon as it
        arrives, before any event is awaited: the way to learn the prompt id early (to cancel,
        to vote on its permissions, to log it). ``on_update`` sees every event of this prompt,
        the terminal included, in order. Raises :class:`TurnError` on ``turn_error``.
        """
        send, receive = anyio.create_memory_object_stream[_TapItem](math.inf)
        self.prompts_in_flight += 1
        try:
            with send, receive:
                use_subscription = self.active
                if use_subscription:
                    self._taps.add(send)
                try:
                    key = str(uuid.uuid4()) if idempotency_key is None else idempotency_key
                    accepted, settled = await self._send_prompt(prompt, deadline_ms, key)
                    if on_accepted is not None:
                        told = on_accepted(accepted)
                        if inspect.isawaitable(told):
                            await told
                    if settled is not None:
                        return _settled(settled)
                    if use_subscription:
                        return await _await_terminal(receive, accepted.prompt_id, on_update)
                    follower = SessionHandle(
                        self.client.with_client_id(None),
                        self.session_id,
                        last_event_id=accepted.last_event_id,
                        epoch=accepted.event_epoch,
                        **self.options(),
                    )
                    follower._taps.add(send)
                    result: TurnCompleteData | None = None
                    error: Exception | None = None
                    async with anyio.create_task_group() as nursery:
                        nursery.start_soon(follower._follow_for_tap)
                        # Raised outside the nursery so callers get a TurnError (or their own
                        # on_update error) as is, not wrapped in an exception group.
                        try:
                            result = await _await_terminal(receive, accepted.prompt_id, on_update)
                        except Exception as exc:
                            error = exc
                        nursery.cancel_scope.cancel()
                    if error is not None:
                        raise error
                    assert result is not None
                    return result
                finally:
                    self._taps.discard(send)
        finally:
            self.prompts_in_flight -= 1

    async def _send_prompt(
        self, prompt: str | Sequence[Mapping[str, Any]], deadline_ms: int | None, key: str
    ) -> tuple[PromptAccepted, PromptByKeyResponse | None]:
        """The 202, and how the prompt ended when it ended before a restore in between (its
        terminal is in the transcript then, never on a stream of the restored session)."""
        try:
            accepted = await self.client.send_prompt(self.session_id, prompt, deadline_ms,
                                                     idempotency_key=key)
            return accepted, None
        except SessionNotFoundError:
            if not self.restore:
                raise
        except PromptOutcomeUnknownError as exc:
            # The daemon restarted between the sends: one before may have been admitted, and
            # the restored session knows the key from its transcript.
            if not (self.restore and isinstance(exc.last_error, SessionNotFoundError)):
                raise
        # The same key again: whatever was admitted before the restore is answered, not rerun.
        resumed = await self._restore_session()
        accepted = await self.client.send_prompt(self.session_id, prompt, deadline_ms,
                                                 idempotency_key=key)
        if accepted.event_epoch == resumed.event_epoch:
            return accepted, None  # admitted now, by the restored session
        found = await self.client.find_prompt(self.session_id, key)
        if found is None or found.state in ("queued", "running"):
            return accepted, None
        return accepted, found

    async def _follow_for_tap(self) -> None:
        error = await self._read(_ignore_event)
        self._fail_taps(error)

    async def cancel(self) -> None:
        """Ask the daemon to cancel the running prompt (its terminal still arrives)."""
        await self.client.cancel(self.session_id)

    # -- closing ---------------------------------------------------------------------------

    def stop(self) -> None:
        """Close the handle now, without a checkpoint: stop the reader, fail waiting
        ``prompt()`` calls with :class:`HandleClosedError`. The daemon-side registration stays
        until :meth:`close` detaches it."""
        if self._scope is not None:
            self._scope.cancel()
            self._scope = None
        if self.state is SubscriptionState.CLOSED:
            return
        self._set_state(SubscriptionState.CLOSED)
        self._fail_taps(HandleClosedError(f"session handle {self.session_id} was closed"))

    async def close(self, *, detach: bool = True) -> None:
        """Stop the subscription (:meth:`stop`) and detach this handle's registration (once).

        A session that is already gone needs no detach, so a 404 there is not an error.
        """
        self.stop()
        if detach and not self._detached and self.client_id is not None:
            self._detached = True
            try:
                await self.client.detach(self.session_id)
            except SessionNotFoundError:
                pass

    async def __aenter__(self) -> SessionHandle:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        with anyio.move_on_after(self.client.timeout, shield=True):
            await self.close()

    def __repr__(self) -> str:
        return (
            f"SessionHandle(session_id={self.session_id!r}, client_id={self.client_id!r}, "
            f"last_event_id={self.last_event_id!r}, epoch={self.epoch!r}, "
            f"transport={self.transport!r}, state={self.state.name})"
        )


EventSource: TypeAlias = "EventStream | WebSocketEventStream"


def _is_final(exc: DaemonError) -> bool:
    return isinstance(exc, AuthError | SessionNotFoundError) or not is_retriable(exc)


async def _ignore_event(event: DaemonEvent) -> None:
    return None


# The daemon's text for a prompt a restart ended (its turn_error in the transcript says it too).
_INTERRUPTED = "Prompt interrupted by daemon restart"


def _settled(found: PromptByKeyResponse) -> TurnCompleteData:
    """What waiting for a prompt answers when it ended before a restore: its stop reason, or
    :class:`TurnError` (``interrupted``, or the error its transcript holds)."""
    if found.state in ("completed", "cancelled"):
        stop = found.stop_reason if isinstance(found.stop_reason, str) else None
        return TurnCompleteData(
            prompt_id=found.prompt_id, session_id=found.session_id,
            stop_reason=stop or ("cancelled" if found.state == "cancelled" else "end_turn"))
    if found.state == "interrupted":
        raise TurnError("interrupted", _INTERRUPTED, found.prompt_id)
    raise TurnError(None, "the prompt ended with an error before the session was restored "
                    "(its turn_error is in the transcript)", found.prompt_id)


async def _await_terminal(
    receive: MemoryObjectReceiveStream[_TapItem],
    prompt_id: str,
    on_update: EventCallback | None,
) -> TurnCompleteData:
    async for item in receive:
        if isinstance(item, _Stopped):
            raise item.error
        if on_update is not None and names_prompt(item, prompt_id):
            result = on_update(item)
            if inspect.isawaitable(result):
                await result
        outcome = terminal_for(item, prompt_id)
        if outcome is not None:
            return outcome.result()
    raise HandleClosedError(f"the stream for prompt {prompt_id} closed before its terminal")



