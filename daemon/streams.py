"""SSE and WebSocket event streams, as plain ASGI handlers. Trio shell.

Written against ASGI directly rather than as Quart streaming responses so that each stream owns
its cancel scope in an ordinary coroutine (never across an async-generator ``yield``), writes
one chunk per wake-up, and can be cut off when the slow-client rules evict it.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any
from urllib.parse import parse_qs

import trio

from sdk.protocol import headers as wire_headers
from sdk.protocol import http as wire
from sdk.protocol.constants import MAX_EVENT_ID
from sdk.protocol.sse import SSE_HEARTBEAT, sse_retry

from .bridge import (
    BodyGone,
    DirectBody,
    DirectWebSocket,
    direct_body,
    direct_ws,
    shutdown_connection,
)
from .bus import SessionBus
from .clock import now_ms
from .core.envelope import Event, encode_json
from .core.flow_control import GATHER_PASSES, worth_gathering
from .core.frame_codec import sse_chunks, ws_chunks, ws_frames
from .core.ring import ResumePlan, decide_resume
from .core.shared_frames import SharedFrames
from .core.subscriber import (
    MAX_QUEUED_DEFAULT,
    MAX_QUEUED_MAX,
    MAX_QUEUED_MIN,
    SubscriberState,
    Warning,
    client_evicted_event,
    slow_client_warning_event,
)
from .metrics import totals

# The protocol's header names as ASGI hands them over and as the answers carry them.
_LAST_EVENT_ID = wire_headers.lower(wire_headers.LAST_EVENT_ID)
_EPOCH = wire_headers.lower(wire_headers.EVENT_EPOCH)
_EPOCH_BYTES = _EPOCH.encode()
_STREAM_ID_BYTES = wire_headers.lower(wire_headers.SSE_STREAM_ID).encode()

#: The frame that opens every stream (``retry: 3000``).
SSE_RETRY = sse_retry()

log = logging.getLogger("daemon.streams")

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

MAX_SUBSCRIBERS = 64
EPOCH_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
EVICTED_FRAME_TIMEOUT_S = 0.5


class Subscription:
    """One SSE/WS reader of a bus: its ring cursor, warning latch and the scope that stops it
    (what the bus needs of it: :class:`daemon.bus.BusReader`)."""

    __slots__ = ("_idle", "abort", "evicted", "flow_stalled_at", "pending_warning", "scope",
                 "sending", "state", "writes_done")

    def __init__(self, state: SubscriberState) -> None:
        self.state = state
        self.scope: trio.CancelScope | None = None
        # Cuts the transport when a write is stalled (the server does not let it be cancelled).
        self.abort: Callable[[], object] | None = None
        self.pending_warning: Warning | None = None
        # True while a write is in flight. Only then can lag build up: an idle subscriber
        # takes every new event the moment it runs (they are handed over in one write).
        self.sending = False
        # Writes completed so far: one that stays in flight with this count unchanged is
        # stalled (see watch_stalled_writes).
        self.writes_done = 0
        # writes_done when flow control last found a write of this subscriber stalled.
        self.flow_stalled_at: int | None = None
        self._idle = trio.Event()
        self.evicted = trio.Event()

    def begin_write(self) -> None:
        self.sending = True
        self._idle = trio.Event()

    def end_write(self) -> None:
        self.sending = False
        self._idle.set()

    async def wait_idle(self) -> None:
        """Return once no write is in flight."""
        if self.sending:
            await self._idle.wait()


class StreamRequestError(Exception):
    def __init__(self, status: int, body: wire.ErrorBody,
                 headers: dict[str, str] | None = None):
        super().__init__(body.error)
        self.status = status
        self.body = body
        self.headers = headers or {}


@dataclass(frozen=True)
class StreamRequest:
    cursor: int | None
    epoch: str | None
    max_queued: int


def _is_decimal(raw: str, max_digits: int) -> bool:
    # isascii: str.isdigit() also accepts digits int() refuses ("²"); the length bound keeps
    # int() clear of its 4300-digit limit.
    return 0 < len(raw) <= max_digits and raw.isascii() and raw.isdigit()


def parse_cursor(raw: str | None) -> int | None:
    if raw is None or not _is_decimal(raw, 64):
        return None
    value = int(raw)
    return value if value <= MAX_EVENT_ID else None


def parse_epoch(raw: str | None) -> str | None:
    return raw if raw is not None and EPOCH_RE.fullmatch(raw) else None


def parse_stream_request(headers: dict[str, str], query_string: bytes) -> StreamRequest:
    query = {k: v[-1] for k, v in parse_qs(query_string.decode("latin-1")).items()}
    max_queued = MAX_QUEUED_DEFAULT
    if "maxQueued" in query:
        raw = query["maxQueued"]
        if not _is_decimal(raw, 64) or not MAX_QUEUED_MIN <= int(raw) <= MAX_QUEUED_MAX:
            raise StreamRequestError(400, wire.ErrorBody(
                error=f"maxQueued must be an integer between {MAX_QUEUED_MIN} and "
                      f"{MAX_QUEUED_MAX}", code="invalid_max_queued"))
        max_queued = int(raw)
    if _LAST_EVENT_ID in headers or _EPOCH in headers:
        cursor = parse_cursor(headers.get(_LAST_EVENT_ID))
        epoch = parse_epoch(headers.get(_EPOCH))
    else:  # extension: EventSource cannot set headers
        cursor = parse_cursor(query.get("lastEventId"))
        epoch = parse_epoch(query.get("epoch"))
    return StreamRequest(cursor, epoch, max_queued)


def check_capacity(bus: SessionBus) -> None:
    if len(bus.subscribers) >= MAX_SUBSCRIBERS:
        raise StreamRequestError(
            429, wire.ErrorBody(error="Too many subscribers for this session",
                                code="subscriber_limit_exceeded", limit=MAX_SUBSCRIBERS),
            {"Retry-After": "5"})


EVICTED_WRITE_GRACE_S = 1.0


async def watch_eviction(sub: Subscription) -> None:
    """Once evicted, give the write in flight a moment to finish (the stream then says
    ``client_evicted`` and closes); a write still stalled after that is cut off."""
    await sub.evicted.wait()
    with trio.move_on_after(EVICTED_WRITE_GRACE_S):
        await sub.wait_idle()
        return
    if sub.scope is not None:
        sub.scope.cancel()
    if sub.abort is not None:
        sub.abort()


async def watch_stalled_writes(sub: Subscription, limit_s: float) -> None:
    """Cut a connection whose write has made no progress for ``limit_s``: its peer stopped
    reading. The slow-client rules evict a stalled subscriber once the session publishes past
    its caps; this also frees its slot while nothing is published (a stalled replay of a
    quiet session would otherwise hold it for as long as the peer keeps the socket open)."""
    period = limit_s / 4
    mark: tuple[int, float] | None = None  # (writes_done, first seen stuck at)
    while True:
        await trio.sleep(period)
        if not sub.sending:
            mark = None
            continue
        now = trio.current_time()
        if mark is None or mark[0] != sub.writes_done:
            mark = (sub.writes_done, now)
            continue
        if now - mark[1] >= limit_s:
            log.info("event=stalled_write_cut stalled_ms=%d", round((now - mark[1]) * 1000))
            if sub.scope is not None:
                sub.scope.cancel()
            if sub.abort is not None:
                sub.abort()
            return


async def final_send(sub: Subscription, send: Send, messages: list[MutableMapping[str, Any]],
                     timeout: float) -> None:
    """Best-effort closing messages. The server's writes cannot be cancelled, so a peer that
    stopped reading would hold them forever: past ``timeout`` the connection is cut."""

    async def cut_after_timeout() -> None:
        await trio.sleep(timeout)
        if sub.abort is not None:
            sub.abort()

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(cut_after_timeout)
            for message in messages:
                await send(message)
            nursery.cancel_scope.cancel()
    except Exception:
        log.debug("event=stream_close_failed", exc_info=True)


async def _watch_disconnect(receive: Receive, scope: trio.CancelScope, kind: str) -> None:
    while True:
        message = await receive()
        if message["type"] == kind:
            scope.cancel()
            return


class EventPump:
    """Moves ring events to one transport: replay first, then live batches."""

    def __init__(self, bus: SessionBus, sub: Subscription, heartbeat_s: float) -> None:
        self.bus = bus
        self.sub = sub
        self.heartbeat_s = heartbeat_s

    def _evicted(self) -> bool:
        """Evict the subscriber if its next event already left the ring; True once evicted."""
        sub, ring = self.sub, self.bus.ring
        state = sub.state
        if state.evicted is None:
            first = ring.first_id
            if first is not None and first > state.cursor + 1:
                state.evict_now("queue_overflow", ring)  # the next event left the ring
        if state.evicted is not None:
            self.bus.evict(sub)
            return True
        return False

    def _take_warning(self) -> Event | None:
        bus = self.bus
        if bus.resyncs:  # the bus moved to a new epoch (a cluster mirror)
            resync = bus.take_resync(self.sub)
            if resync is not None:
                return resync
        warning = self.sub.pending_warning
        self.sub.pending_warning = None
        if warning is None:
            return None
        return slow_client_warning_event(warning, now_ms())

    def worth_gathering(self) -> bool:
        """True when the subscriber's next live write would be small and more may come
        (:func:`daemon.core.flow_control.worth_gathering`): the caller then yields once, so
        the publisher, if it has more read, publishes another group first and the write
        carries both. The caller asks at most GATHER_PASSES times per write: never a wait for
        events that do not come (an idle publisher has nothing to run)."""
        bus = self.bus
        if bus.closed:
            return False
        ring, state = bus.ring, self.sub.state
        pending = ring.last_id - state.cursor
        return pending > 0 and worth_gathering(ring.bytes_since(state.cursor), pending,
                                               state.max_queued)

    def next_batch(self) -> list[Event] | None:
        """Live events after the cursor (with a pending warning first); ``None`` when evicted.
        Advances the cursor: these events count as handed to the transport."""
        if self._evicted():
            return None
        sub, ring = self.sub, self.bus.ring
        out: list[Event] = []
        warning = self._take_warning()
        if warning is not None:
            out.append(warning)
        events = ring.since(sub.state.cursor)
        if events:
            last_id = events[-1].id
            assert last_id is not None
            sub.state.cursor = last_id
            totals.events_delivered += len(events)
            out.extend(events)
        return out

    def next_sse(self) -> list[bytes] | None:
        """:meth:`next_batch` as SSE bytes to write: the frames shared by the bus's SSE
        subscribers (``bus.frames``), so a wake-up's events are framed once for all of them."""
        return self._next_frames(self.bus.frames, _sse_frame)

    def next_ws(self) -> list[bytes] | None:
        """:meth:`next_batch` as WebSocket frames to write, one text message per event: the
        frames shared by the bus's WebSocket subscribers (``bus.ws_frames``)."""
        return self._next_frames(self.bus.ws_frames, _ws_frame)

    def _next_frames(self, shared: SharedFrames, frame: Callable[[Event], bytes]
                     ) -> list[bytes] | None:
        if self._evicted():
            return None
        ring, state = self.bus.ring, self.sub.state
        out: list[bytes] = []
        warning = self._take_warning()
        if warning is not None:
            out.append(frame(warning))
        cursor = state.cursor
        if ring.last_id > cursor:
            frames, state.cursor = shared.since(ring, cursor)
            totals.events_delivered += state.cursor - cursor
            out += frames
        return out

    async def wait(self) -> bool:
        """Wait for new events; False when the heartbeat interval passed with none."""
        with trio.move_on_after(self.heartbeat_s):
            await self.bus.wait_for_events(self.sub.state.cursor)
            return True
        return False


def _sse_frame(event: Event) -> bytes:
    return event.sse_frame


def _ws_frame(event: Event) -> bytes:
    return ws_frames([event])


REPLAY_CHUNK_BYTES = 1024 * 1024


def replay_groups(events: Sequence[Event], max_bytes: int = REPLAY_CHUNK_BYTES
                  ) -> list[Sequence[Event]]:
    """``events`` cut into consecutive groups of about ``max_bytes`` (one event at least),
    each written in one go."""
    groups: list[Sequence[Event]] = []
    start, size = 0, 0
    for i, event in enumerate(events):
        size += event.size
        if size >= max_bytes:
            groups.append(events[start:i + 1])
            start, size = i + 1, 0
    if start < len(events):
        groups.append(events[start:])
    return groups


async def replay_events(sub: Subscription, events: Sequence[Event],
                        write: Callable[[Sequence[Event]], Awaitable[None]]) -> bool:
    """Replay ``events`` group by group, keeping the subscriber's replay position current so
    the slow-client rules see a stalled replay. False if it was evicted meanwhile
    (the rest of the replay is not sent)."""
    state = sub.state
    if not events:
        return state.evicted is None
    first = events[0].id
    assert first is not None
    state.replay_pos = first - 1
    try:
        for group in replay_groups(events):
            if state.evicted is not None:
                return False
            await write(group)
            totals.events_delivered += len(group)
            last = group[-1].id
            assert last is not None
            state.replay_pos = last
    finally:
        state.replay_pos = None
    return state.evicted is None


async def _sse_group(body: Callable[[bytes], Awaitable[None]], group: Sequence[Event]) -> None:
    for chunk in sse_chunks(group, max_chunk=2 * REPLAY_CHUNK_BYTES):
        await body(chunk)


async def _ws_group(write: Callable[[Sequence[Event]], Awaitable[None]],
                    group: Sequence[Event]) -> None:
    await write(group)


async def send_json_error(send: Send, err: StreamRequestError) -> None:
    body = encode_json(err.body)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in err.headers.items()]
    await send({"type": "http.response.start", "status": err.status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def serve_sse(scope: Scope, receive: Receive, send: Send, bus: SessionBus,
                    headers: dict[str, str], heartbeat_s: float,
                    stalled_write_s: float | None = None) -> None:
    try:
        req = parse_stream_request(headers, scope.get("query_string", b""))
        check_capacity(bus)
    except StreamRequestError as err:
        await send_json_error(send, err)
        return
    plan = decide_resume(bus.ring, req.cursor, req.epoch, bus.epoch, now_ms=now_ms())
    sub = Subscription(SubscriberState(plan.cursor, req.max_queued))
    sub.abort = partial(shutdown_connection, scope.get("server"), scope.get("client"))
    bus.add_subscriber(sub)
    totals.subscribers["sse"] += 1
    pump = EventPump(bus, sub, heartbeat_s)
    stream_id = str(uuid.uuid4())
    await send({"type": "http.response.start", "status": 200, "headers": [
        (b"content-type", b"text/event-stream"),
        (b"cache-control", b"no-cache, no-transform"),
        (b"connection", b"keep-alive"),
        (b"x-accel-buffering", b"no"),
        (_EPOCH_BYTES, bus.epoch.encode()),
        (_STREAM_ID_BYTES, stream_id.encode()),
    ]})

    async def through_server(data: bytes) -> None:
        await send({"type": "http.response.body", "body": data, "more_body": True})
        sub.writes_done += 1

    body: Callable[[bytes], Awaitable[None]] = through_server
    gone: list[BodyGone] = []  # the connection went away under a direct write
    try:
        async with trio.open_nursery() as nursery:
            sub.scope = nursery.cancel_scope
            nursery.start_soon(_watch_disconnect, receive, nursery.cancel_scope, "http.disconnect")
            nursery.start_soon(watch_eviction, sub)
            if stalled_write_s is not None:
                nursery.start_soon(watch_stalled_writes, sub, stalled_write_s)
            sub.begin_write()
            await body(SSE_RETRY)  # the server has now written the response head
            direct = direct_body(scope)
            if direct is not None:
                body = partial(_direct_write, direct, sub)
            nursery.start_soon(_run_sse, sub, pump, plan, body, nursery.cancel_scope, gone)
    finally:
        bus.remove_subscriber(sub)
        totals.subscribers["sse"] -= 1
    if gone:
        if sub.abort is not None:
            sub.abort()  # the server learns the connection is over; nothing more is written
        return
    eviction = sub.state.evicted
    closing: list[MutableMapping[str, Any]] = []
    if eviction is not None:
        closing.append({"type": "http.response.body", "more_body": True, "body": client_evicted_event(
            eviction, now_ms()).sse_frame})
    closing.append({"type": "http.response.body", "body": b"", "more_body": False})
    await final_send(sub, send, closing, EVICTED_FRAME_TIMEOUT_S)


async def _run_sse(sub: Subscription, pump: EventPump, plan: ResumePlan,
                   body: Callable[[bytes], Awaitable[None]], scope: trio.CancelScope,
                   gone: list[BodyGone]) -> None:
    """:func:`_stream_sse` in a task of its own (so that each wake-up resumes the stream's
    frames only, not the server's and the application's above it); when it ends, everything
    else of the stream (``scope``: its watchers) stops too."""
    try:
        await _stream_sse(sub, pump, plan, body)
    except BodyGone as exc:
        log.info("event=sse_connection_gone reason=%s", exc)
        gone.append(exc)
    scope.cancel()


async def _direct_write(direct: DirectBody, sub: Subscription, data: bytes) -> None:
    await direct.write(data)
    sub.writes_done += 1


async def _stream_sse(sub: Subscription, pump: EventPump, plan: ResumePlan,
                      body: Callable[[bytes], Awaitable[None]]) -> None:
    """The stream after its first frame: the resume plan's frames and replay, then live
    batches and heartbeats until the subscriber is evicted or the bus closes."""
    bus = pump.bus
    for chunk in sse_chunks(plan.before):
        await body(chunk)
    if await replay_events(sub, plan.replay, partial(_sse_group, body)):
        for chunk in sse_chunks(plan.after):
            await body(chunk)
    sub.end_write()
    while True:
        for _ in range(GATHER_PASSES):  # see daemon.core.flow_control
            if not pump.worth_gathering():
                break
            await trio.lowlevel.checkpoint()
        frames = pump.next_sse()
        if frames is None:
            break
        if frames:
            sub.begin_write()
            # One send per wake-up, however many segments it spans.
            await body(frames[0] if len(frames) == 1 else b"".join(frames))
            sub.end_write()
            continue
        if bus.closed:
            break
        if not await pump.wait():
            sub.begin_write()  # a stalled heartbeat is a stalled write like any other
            await body(SSE_HEARTBEAT)
            sub.end_write()


async def serve_ws(scope: Scope, receive: Receive, send: Send, bus: SessionBus,
                   headers: dict[str, str], heartbeat_s: float) -> None:
    message = await receive()
    if message["type"] != "websocket.connect":
        return
    try:
        req = parse_stream_request({}, scope.get("query_string", b""))
        check_capacity(bus)
    except StreamRequestError as err:
        await deny_ws(send, err.status, err.body, err.headers)
        return
    plan = decide_resume(bus.ring, req.cursor, req.epoch, bus.epoch, now_ms=now_ms())
    sub = Subscription(SubscriberState(plan.cursor, req.max_queued))
    sub.abort = partial(shutdown_connection, scope.get("server"), scope.get("client"))
    bus.add_subscriber(sub)
    totals.subscribers["ws"] += 1
    pump = EventPump(bus, sub, heartbeat_s)
    await send({"type": "websocket.accept",
                "headers": [(_EPOCH_BYTES, bus.epoch.encode())]})
    # The server has written the handshake's answer: the messages may go straight to the
    # socket from here on (daemon.bridge's direct WebSocket writer), framed once per wake-up
    # for every WebSocket subscriber of the bus; else one ASGI message per event.
    direct = direct_ws(scope)
    writer: _WsWriter = (_DirectWs(direct, sub) if direct is not None
                         else _AsgiWs(send, sub))
    close_code = 1000
    disconnected = False
    gone: list[BodyGone] = []  # the connection went away under a direct write
    try:
        async with trio.open_nursery() as nursery:
            sub.scope = nursery.cancel_scope
            nursery.start_soon(_watch_disconnect, receive, nursery.cancel_scope,
                               "websocket.disconnect")
            nursery.start_soon(watch_eviction, sub)
            nursery.start_soon(_run_ws, sub, pump, plan, writer, nursery.cancel_scope, gone)
        disconnected = not bus.closed and sub.state.evicted is None
    finally:
        bus.remove_subscriber(sub)
        totals.subscribers["ws"] -= 1
    if gone:
        if sub.abort is not None:
            sub.abort()  # the server learns the connection is over; nothing more is written
        return
    eviction = sub.state.evicted
    if eviction is not None:
        close_code = 1008
    if disconnected and eviction is None:
        return
    closing: list[MutableMapping[str, Any]] = []
    if eviction is not None:
        closing.append({"type": "websocket.send", "text": client_evicted_event(
            eviction, now_ms()).raw.decode()})
    closing.append({"type": "websocket.close", "code": close_code})
    await final_send(sub, send, closing, EVICTED_FRAME_TIMEOUT_S)


class _WsWriter:
    """How a WebSocket stream's events reach its connection (one message per event)."""

    async def events(self, events: Sequence[Event]) -> None:
        """Send ``events`` (a resume plan's or a replay's), in order."""
        raise NotImplementedError

    async def live(self, pump: EventPump) -> bool | None:
        """Send the live events after the cursor (with a pending warning first): whether
        anything was sent, ``None`` once the subscriber is evicted."""
        raise NotImplementedError


class _AsgiWs(_WsWriter):
    """Through the server: one ASGI ``websocket.send`` per event."""

    def __init__(self, send: Send, sub: Subscription) -> None:
        self._send = send
        self._sub = sub

    async def events(self, events: Sequence[Event]) -> None:
        for event in events:
            await self._send({"type": "websocket.send", "text": event.raw.decode()})
        self._sub.writes_done += 1

    async def live(self, pump: EventPump) -> bool | None:
        batch = pump.next_batch()
        if batch is None:
            return None
        if not batch:
            return False
        self._sub.begin_write()
        await self.events(batch)
        self._sub.end_write()
        return True


class _DirectWs(_WsWriter):
    """Straight to the socket: a wake-up's frames, shared with the bus's other WebSocket
    subscribers, in one write."""

    def __init__(self, direct: DirectWebSocket, sub: Subscription) -> None:
        self._direct = direct
        self._sub = sub

    async def events(self, events: Sequence[Event]) -> None:
        for chunk in ws_chunks(events, max_chunk=2 * REPLAY_CHUNK_BYTES):
            await self._direct.write(chunk)
            self._sub.writes_done += 1

    async def live(self, pump: EventPump) -> bool | None:
        for _ in range(GATHER_PASSES):  # see daemon.core.flow_control
            if not pump.worth_gathering():
                break
            await trio.lowlevel.checkpoint()
        frames = pump.next_ws()
        if frames is None:
            return None
        if not frames:
            return False
        self._sub.begin_write()
        # One write per wake-up, however many segments it spans.
        await self._direct.write(frames[0] if len(frames) == 1 else b"".join(frames))
        self._sub.writes_done += 1
        self._sub.end_write()
        return True


async def _run_ws(sub: Subscription, pump: EventPump, plan: ResumePlan, writer: _WsWriter,
                  scope: trio.CancelScope, gone: list[BodyGone]) -> None:
    """A WebSocket stream's events in a task of its own (see :func:`_run_sse`): the resume
    plan's events and replay, then live batches until the subscriber is evicted or the bus
    closes; when it ends, everything else of the stream (``scope``: its watchers) stops."""
    bus = pump.bus
    try:
        sub.begin_write()
        await writer.events(plan.before)
        if await replay_events(sub, plan.replay, partial(_ws_group, writer.events)):
            await writer.events(plan.after)
        sub.end_write()
        while True:
            sent = await writer.live(pump)
            if sent is None:
                break
            if sent:
                continue
            if bus.closed:
                break
            await pump.wait()
    except BodyGone as exc:
        log.info("event=ws_connection_gone reason=%s", exc)
        gone.append(exc)
    scope.cancel()


async def deny_ws(send: Send, status: int, body: wire.ErrorBody,
                  headers: dict[str, str] | None = None) -> None:
    """Answer a WebSocket upgrade with a plain HTTP error (ASGI websocket denial response)."""
    raw = encode_json(body)
    hdrs = [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]
    hdrs += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "websocket.http.response.start", "status": status, "headers": hdrs})
    await send({"type": "websocket.http.response.body", "body": raw, "more_body": False})
