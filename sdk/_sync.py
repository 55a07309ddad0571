"""The blocking SDK for scripts and notebooks: :class:`SyncDaemonClient` and
:class:`SyncSessionHandle`, the async API driven through an anyio blocking portal.

A :class:`SyncDaemonClient` starts one event loop in a thread of its own (asyncio by default,
``backend="trio"`` works too) and runs the very same :class:`~sdk._client.DaemonClient` there:
every method has the async one's arguments, returns the same typed results and raises the same
:mod:`sdk._errors`, with the same timeouts. Events come through a plain ``for`` loop::

    with SyncDaemonClient("http://127.0.0.1:4170") as client:
        created = client.create_session(scope="thread")
        accepted = client.send_prompt(created.session_id, "hello")
        with client.events(created.session_id, accepted.last_event_id,
                           accepted.event_epoch) as stream:
            for event in stream:
                ...

Callbacks (``on_update``, ``on_accepted``) run in the calling thread, never in the loop's.

Ctrl-C: a ``KeyboardInterrupt`` that lands while a call waits cancels that call in the loop
(its stream is closed, its request abandoned: the same cleanup as a cancelled async call),
waits for that cleanup, and is raised to the caller; closing the client (``with``) then stops
the loop and joins its thread. The loop's thread is a daemon thread, so a script that never
closes its client still exits.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import deque
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from functools import partial
from queue import SimpleQueue
from types import TracebackType
from typing import Any, Final, Generic, Literal, ParamSpec, TypeAlias, TypeVar

import anyio
import anyio.abc
import httpx
from anyio.from_thread import BlockingPortal
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from msgspec import UnsetType

from sdk._client import (
    DEFAULT_MAX_QUEUED,
    SESSIONS_PAGE_SIZE,
    Capabilities,
    ClientStatistics,
    DaemonClient,
    DaemonStatus,
    EventStream,
    Health,
    LoadResult,
    PermissionVote,
    PromptAccepted,
    PromptByKeyResponse,
    PromptRetryPolicy,
    ResumeResult,
    SessionCreated,
    SessionPage,
    SessionStatus,
    SessionSummary,
    TranscriptPage,
)
from sdk._session import SessionHandle, SubscriptionState, Transport
from sdk._ws import WebSocketEventStream
from sdk.protocol.cursor import FollowsCursor, ResumeCursor
from sdk.protocol.envelope import DaemonEvent
from sdk.protocol.events import TurnCompleteData

__all__ = ["SyncDaemonClient", "SyncEventStream", "SyncSessionHandle"]

_P = ParamSpec("_P")
_T = TypeVar("_T")

# How long an interrupted call may take to clean up (close its stream) before Ctrl-C is raised.
_INTERRUPT_GRACE_S: Final = 5.0
_STOP_TIMEOUT_S: Final = 10.0

SyncUpdate: TypeAlias = Callable[[DaemonEvent], object]
SyncAccepted: TypeAlias = Callable[[PromptAccepted], object]


class _Loop:
    """One event loop in a daemon thread, reached through a blocking portal."""

    def __init__(self, backend: str, backend_options: Mapping[str, Any] | None) -> None:
        ready: SimpleQueue[BlockingPortal | BaseException] = SimpleQueue()

        async def host() -> None:
            async with BlockingPortal() as portal:
                ready.put(portal)
                await portal.sleep_until_stopped()

        def run() -> None:
            try:
                anyio.run(host, backend=backend, backend_options=dict(backend_options or {}))
            except BaseException as exc:  # reported to the constructor, or lost at exit
                ready.put(exc)

        self.thread = threading.Thread(target=run, name="turnkeeper-sdk-loop", daemon=True)
        self.thread.start()
        started = ready.get()
        if isinstance(started, BaseException):
            raise started
        self.portal = started

    def start(self, fn: Callable[[], Awaitable[_T]]) -> _Task[_T]:
        """Start ``fn`` in the loop; the caller waits on the returned task."""
        ended = threading.Event()

        async def run() -> _T:
            try:
                return await fn()
            finally:
                ended.set()

        return _Task(self.portal.start_task_soon(run), ended)

    def call(self, fn: Callable[_P, Awaitable[_T]], *args: _P.args, **kwargs: _P.kwargs) -> _T:
        """Run ``fn`` in the loop and wait for it; Ctrl-C cancels it there (see the module
        docstring)."""
        return self.start(partial(fn, *args, **kwargs)).result()

    def stop(self) -> None:
        if threading.current_thread() is self.thread or not self.thread.is_alive():
            return
        try:
            self.portal.call(self.portal.stop, True)
        except RuntimeError:
            pass  # the loop already ended
        self.thread.join(_STOP_TIMEOUT_S)


class _Task(Generic[_T]):
    """A call running in the loop, waited on from the caller's thread."""

    def __init__(self, future: Future[_T], ended: threading.Event) -> None:
        self._future = future
        self._ended = ended

    def result(self) -> _T:
        """Wait for the outcome; interrupted (Ctrl-C), cancel the call, let it clean up, and
        raise the interrupt."""
        try:
            return self._future.result()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Cancel the call if it still runs, and wait (bounded) until it has cleaned up."""
        if not self._future.done():
            self._future.cancel()
            self._ended.wait(_INTERRUPT_GRACE_S)


class SyncDaemonClient:
    """The blocking twin of :class:`~sdk._client.DaemonClient` (see the module docstring).

    The constructor takes the async client's arguments, plus ``backend`` (``"asyncio"`` or
    ``"trio"``) and ``backend_options`` (``anyio.run``'s) for the loop it runs in. Use it as a
    context manager or call :meth:`close`.
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
        backend: Literal["asyncio", "trio"] = "asyncio",
        backend_options: Mapping[str, Any] | None = None,
        ca_file: str | os.PathLike[str] | None = None,
    ) -> None:
        # Checked here first: bad arguments fail before a thread is started.
        probe = DaemonClient(base_url, token, client_id, timeout=timeout, transport=transport,
                             owner_wait_s=owner_wait_s, prompt_retry=prompt_retry,
                             ca_file=ca_file)
        self._loop = _Loop(backend, backend_options)
        self._owner = True
        self._closed = False
        self.client = probe
        """The async client this one drives (it lives in the loop's thread)."""
        self._finalizer = weakref.finalize(self, _close_loop, self._loop, probe)

    @classmethod
    def _view(cls, loop: _Loop, client: DaemonClient) -> SyncDaemonClient:
        view = object.__new__(cls)
        view._loop = loop
        view._owner = False
        view._closed = False
        view.client = client
        return view

    def with_client_id(self, client_id: str | None) -> SyncDaemonClient:
        """A view on the same loop and connection pool with its own client id (see
        :meth:`DaemonClient.with_client_id`). Closing a view leaves the pool open."""
        return SyncDaemonClient._view(self._loop, self.client.with_client_id(client_id))

    @property
    def base_url(self) -> str:
        return self.client.base_url

    @property
    def token(self) -> str | None:
        return self.client.token

    @property
    def client_id(self) -> str | None:
        return self.client.client_id

    @property
    def timeout(self) -> float:
        return self.client.timeout

    def statistics(self) -> ClientStatistics:
        return self.client.statistics()

    def headers(self, *, accept: str = "application/json") -> dict[str, str]:
        return self.client.headers(accept=accept)

    def _call(self, fn: Callable[_P, Awaitable[_T]], *args: _P.args, **kwargs: _P.kwargs) -> _T:
        if self._closed:
            raise RuntimeError("the SyncDaemonClient is closed")
        return self._loop.call(fn, *args, **kwargs)

    # -- lifetime --------------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection pool, stop the loop and join its thread (a view: nothing)."""
        if self._closed:
            return
        self._closed = True
        if self._owner:
            self._finalizer()

    def __enter__(self) -> SyncDaemonClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- daemon routes ---------------------------------------------------------------------

    def health(self) -> Health:
        return self._call(self.client.health)

    def capabilities(self) -> Capabilities:
        return self._call(self.client.capabilities)

    def daemon_status(self) -> DaemonStatus:
        return self._call(self.client.daemon_status)

    def list_sessions_page(
        self,
        limit: int | None = None,
        cursor: str | UnsetType | None = None,
        *,
        workspace: str | None = None,
        state: Literal["running", "queued", "idle", "unloaded"] | None = None,
    ) -> SessionPage:
        return self._call(partial(self.client.list_sessions_page, limit, cursor,
                                  workspace=workspace, state=state))

    def list_sessions(
        self,
        *,
        workspace: str | None = None,
        state: Literal["running", "queued", "idle", "unloaded"] | None = None,
        page_size: int = SESSIONS_PAGE_SIZE,
    ) -> list[SessionSummary]:
        return self._call(partial(self.client.list_sessions, workspace=workspace, state=state,
                                  page_size=page_size))

    # -- session routes --------------------------------------------------------------------

    def create_session(
        self,
        cwd: str | None = None,
        session_id: str | None = None,
        scope: Literal["single", "thread"] | None = None,
    ) -> SessionCreated:
        return self._call(self.client.create_session, cwd, session_id, scope)

    def load_session(
        self,
        session_id: str,
        cwd: str | None = None,
        history_page_size: int | None = None,
        live_replay_mode: Literal["full", "summary"] | None = None,
    ) -> LoadResult:
        return self._call(self.client.load_session, session_id, cwd, history_page_size,
                          live_replay_mode)

    def resume_session(self, session_id: str, cwd: str | None = None) -> ResumeResult:
        return self._call(self.client.resume_session, session_id, cwd)

    def send_prompt(
        self,
        session_id: str,
        prompt: Sequence[Mapping[str, Any]] | str,
        deadline_ms: int | None = None,
        *,
        idempotency_key: str | None = None,
        timeout: float | None = None,
    ) -> PromptAccepted:
        """Submit a prompt exactly once (see :meth:`DaemonClient.send_prompt`)."""
        return self._call(self.client.send_prompt, session_id, prompt, deadline_ms,
                          idempotency_key=idempotency_key, timeout=timeout)

    def find_prompt(self, session_id: str, idempotency_key: str) -> PromptByKeyResponse | None:
        """The prompt admitted with ``idempotency_key`` (see :meth:`DaemonClient.find_prompt`).
        """
        return self._call(self.client.find_prompt, session_id, idempotency_key)

    def cancel(self, session_id: str) -> None:
        self._call(self.client.cancel, session_id)

    def vote_permission(
        self,
        session_id: str,
        request_id: str,
        option_id: str | None = None,
        cancelled: bool = False,
    ) -> PermissionVote:
        return self._call(self.client.vote_permission, session_id, request_id, option_id,
                          cancelled)

    @contextmanager
    def export_session(
        self, session_id: str, format: Literal["jsonl", "markdown"] = "jsonl"
    ) -> Iterator[Iterator[bytes]]:
        """The session's whole transcript as the daemon streams it; ``with
        client.export_session(sid) as chunks: for chunk in chunks`` (see
        :meth:`DaemonClient.export_session`). Each chunk is read when the loop asks for it."""
        opened = self.client.export_session(session_id, format)
        chunks = self._call(opened.__aenter__)

        def read() -> Iterator[bytes]:
            while True:
                try:
                    yield self._call(chunks.__anext__)
                except StopAsyncIteration:
                    return

        try:
            yield read()
        except BaseException as exc:
            if not self._call(opened.__aexit__, type(exc), exc, exc.__traceback__):
                raise
        else:
            self._call(opened.__aexit__, None, None, None)

    def transcript_page(
        self,
        session_id: str,
        limit: int | None = None,
        cursor: str | None = None,
        before_record_id: str | None = None,
    ) -> TranscriptPage:
        return self._call(self.client.transcript_page, session_id, limit, cursor,
                          before_record_id)

    def session_status(self, session_id: str) -> SessionStatus:
        return self._call(self.client.session_status, session_id)

    def close_session(self, session_id: str) -> None:
        self._call(self.client.close_session, session_id)

    def detach(self, session_id: str) -> None:
        self._call(self.client.detach, session_id)

    def heartbeat(self, session_id: str) -> None:
        self._call(self.client.heartbeat, session_id)

    def events(
        self,
        session_id: str,
        last_event_id: int | None = None,
        epoch: str | None = None,
        *,
        max_queued: int | None = DEFAULT_MAX_QUEUED,
        transport: Transport = "sse",
    ) -> SyncEventStream:
        """One event stream (SSE, or ``transport="ws"``); ``with client.events(...) as s:
        for event in s``. The same arguments and rules as :meth:`DaemonClient.events`."""
        stream: EventStream | WebSocketEventStream
        if transport == "ws":
            stream = WebSocketEventStream(self.client, session_id, last_event_id, epoch,
                                          max_queued=max_queued)
        elif transport == "sse":
            stream = EventStream(self.client, session_id, last_event_id, epoch,
                                 max_queued=max_queued)
        else:
            raise ValueError(f"transport must be 'sse' or 'ws', got {transport!r}")
        return SyncEventStream(self, stream)


def _close_loop(loop: _Loop, client: DaemonClient) -> None:
    if threading.current_thread() is loop.thread or not loop.thread.is_alive():
        return
    try:
        loop.call(client.aclose)
    finally:
        loop.stop()


class SyncEventStream(FollowsCursor):
    """One event stream read with a plain ``for`` loop (the async stream runs in the loop).

    ``last_event_id`` and ``epoch`` follow the events handed to the caller (the same cursor
    rules as the async stream); ``stream`` is the async stream itself (``ended``,
    ``close_code``, ``stream_id``, ``retry_ms``). Errors are the async stream's: raised by
    ``__enter__`` before the first event, by the iteration after.
    """

    def __init__(self, client: SyncDaemonClient, stream: EventStream | WebSocketEventStream):
        self.stream = stream
        self.session_id = stream.session_id
        self.cursor = ResumeCursor(stream.last_event_id, stream.epoch)
        self._client = client
        self._ready: deque[DaemonEvent] = deque()
        self._open = False

    def __enter__(self) -> SyncEventStream:
        self._client._call(self.stream.__aenter__)
        self._open = True
        self.cursor.answered(self.stream.epoch)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        if self._open:
            self._open = False
            self._client._call(self.stream.aclose)

    def __iter__(self) -> Iterator[DaemonEvent]:
        return self

    def __next__(self) -> DaemonEvent:
        if not self._open and not self._ready:
            raise StopIteration
        if not self._ready:
            # One trip to the loop brings every event the last read already holds.
            batch = self._client._call(_next_batch, self.stream)
            if not batch:
                self._open = False
                raise StopIteration
            self._ready.extend(batch)
        event = self._ready.popleft()
        self.cursor.observe(event)
        return event


async def _next_batch(stream: EventStream | WebSocketEventStream) -> list[DaemonEvent]:
    """The next event and those already parsed behind it; empty at the end of the stream."""
    try:
        batch = [await stream.__anext__()]
    except StopAsyncIteration:
        return []
    while stream.buffered:
        batch.append(await stream.__anext__())
    return batch


class SyncSessionHandle(FollowsCursor):
    """The blocking twin of :class:`~sdk._session.SessionHandle` for one session: ``prompt()``
    waits for the prompt's terminal, :meth:`follow` is the reconnecting subscription as a
    ``for`` loop. Make one with :meth:`create` or :meth:`load`; ``options`` are the session
    handle's (``transport``, ``max_queued``, ``policy``, ``restore``)."""

    def __init__(self, client: SyncDaemonClient, handle: SessionHandle) -> None:
        self.client = client
        self.handle = handle
        """The async handle this one drives (it lives in the loop's thread)."""

    @property
    def cursor(self) -> ResumeCursor:  # type: ignore[override]
        return self.handle.cursor

    @property
    def session_id(self) -> str:
        return self.handle.session_id

    @property
    def client_id(self) -> str | None:
        return self.handle.client_id

    @classmethod
    def create(
        cls,
        client: SyncDaemonClient,
        cwd: str | None = None,
        *,
        session_id: str | None = None,
        scope: Literal["single", "thread"] | None = "thread",
        client_id: str | None = None,
        **options: Any,
    ) -> SyncSessionHandle:
        """Create a session (see :meth:`SessionHandle.create`)."""
        handle = client._call(SessionHandle.create, client.client, cwd, session_id=session_id,
                              scope=scope, client_id=client_id, **options)
        return cls(client._view(client._loop, handle.client), handle)

    @classmethod
    def load(
        cls,
        client: SyncDaemonClient,
        session_id: str,
        cwd: str | None = None,
        *,
        history_page_size: int | None = None,
        live_replay_mode: Literal["full", "summary"] | None = None,
        client_id: str | None = None,
        **options: Any,
    ) -> tuple[SyncSessionHandle, LoadResult]:
        """Load a snapshot and a handle positioned right after it (see
        :meth:`SessionHandle.load`)."""
        handle, result = client._call(
            SessionHandle.load, client.client, session_id, cwd,
            history_page_size=history_page_size, live_replay_mode=live_replay_mode,
            client_id=client_id, **options)
        return cls(client._view(client._loop, handle.client), handle), result

    def prompt(
        self,
        prompt: str | Sequence[Mapping[str, Any]],
        *,
        deadline_ms: int | None = None,
        on_update: SyncUpdate | None = None,
        on_accepted: SyncAccepted | None = None,
        idempotency_key: str | None = None,
    ) -> TurnCompleteData:
        """Send a prompt and wait for its terminal (see :meth:`SessionHandle.prompt`, which
        also says what an error means for the prompt); ``on_update`` and ``on_accepted`` are
        plain functions called in this thread."""
        if on_update is None and on_accepted is None:
            return self.client._call(self.handle.prompt, prompt, deadline_ms=deadline_ms,
                                     idempotency_key=idempotency_key)
        send, receive = self.client._call(_channel)

        async def run() -> TurnCompleteData:
            async with send:
                async def update(event: DaemonEvent) -> None:
                    if on_update is not None:
                        await send.send(event)

                async def accepted(answer: PromptAccepted) -> None:
                    if on_accepted is not None:
                        await send.send(answer)

                return await self.handle.prompt(prompt, deadline_ms=deadline_ms,
                                                on_update=update, on_accepted=accepted,
                                                idempotency_key=idempotency_key)

        task = self.client._loop.start(run)
        for item in self._relay(task, receive):
            if isinstance(item, PromptAccepted):
                if on_accepted is not None:
                    on_accepted(item)
            elif on_update is not None:
                on_update(item)
        return task.result()

    def follow(self) -> Iterator[DaemonEvent]:
        """The subscription as a ``for`` loop: every event from the handle's cursor on, with
        the session handle's reconnects; it ends by raising the final error (auth, missing
        session, ``retryable: false``). Leaving the loop stops the subscription."""
        send, receive = self.client._call(_channel)

        async def run() -> None:
            async with send:
                await self.handle.follow(send.send)

        task = self.client._loop.start(run)
        yield from self._relay(task, receive)
        task.result()  # the subscription's final error

    def _relay(self, task: _Task[Any], receive: MemoryObjectReceiveStream[Any]) -> Iterator[Any]:
        """What ``task`` sends, taken one item at a time in this thread; leaving early (a
        break, an error in a callback, Ctrl-C) cancels the task and waits for its cleanup."""
        loop = self.client._loop
        done = False
        try:
            while (item := loop.call(_receive, receive)) is not None:
                yield item
            done = True
        finally:
            if not done:
                task.stop()
            loop.call(_close_receive, receive)

    def cancel(self) -> None:
        """Ask the daemon to cancel the running prompt (its terminal still arrives)."""
        self.client._call(self.handle.cancel)

    def close(self, *, detach: bool = True) -> None:
        """Stop and detach the handle's registration (see :meth:`SessionHandle.close`)."""
        self.client._call(self.handle.close, detach=detach)

    def __enter__(self) -> SyncSessionHandle:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def state(self) -> SubscriptionState:
        return self.handle.state

    def __repr__(self) -> str:
        return f"Sync{self.handle!r}"


async def _channel() -> tuple[MemoryObjectSendStream[Any], MemoryObjectReceiveStream[Any]]:
    # No buffer: the loop's side waits until this thread took the item (back-pressure).
    return anyio.create_memory_object_stream[Any](0)


async def _receive(receive: MemoryObjectReceiveStream[Any]) -> Any:
    try:
        return await receive.receive()
    except anyio.EndOfStream:
        return None


async def _close_receive(receive: MemoryObjectReceiveStream[Any]) -> None:
    receive.close()

