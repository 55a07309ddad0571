"""A WebSocket event stream as a plain ASGI handler, one text message per event: through the
server, or straight to the socket once the server accepted it (:mod:`daemon.bridge`). Trio
shell."""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from functools import partial
from typing import Any, Generic, TypeVar

import trio

from ..bridge import (
    BodyGone,
    DirectWebSocket,
    direct_ws,
    shutdown_connection,
)
from ..bus import SessionBus
from ..clock import now_ms
from ..core.envelope import Event
from ..core.flow_control import GATHER_PASSES
from ..core.frame_codec import ws_chunks
from ..core.ring import ResumePlan, decide_resume
from ..core.subscriber import (
    SubscriberState,
    client_evicted_event,
)
from ..delivery import Delivery, Parked
from ..metrics import totals
from ._request import (
    _EPOCH_BYTES,
    Receive,
    Scope,
    Send,
    StreamRequestError,
    check_capacity,
    deny_ws,
    parse_stream_request,
)
from ._subscription import (
    EVICTED_FRAME_TIMEOUT_S,
    REPLAY_CHUNK_BYTES,
    EventPump,
    Subscription,
    _watch_disconnect,
    final_send,
    replay_events,
    watch_eviction,
)

log = logging.getLogger("daemon.streams")

T = TypeVar("T")


async def _ws_group(write: Callable[[Sequence[Event]], Awaitable[None]],
                    group: Sequence[Event]) -> None:
    await write(group)


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
    writer: _WsWriter[Any] = (_DirectWs(direct, sub) if direct is not None
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


class _WsWriter(Generic[T]):
    """How a WebSocket stream's events reach its connection (one message per event); ``T``:
    what one live write carries."""

    def __init__(self, sub: Subscription) -> None:
        self._sub = sub

    async def events(self, events: Sequence[Event]) -> None:
        """Send ``events`` (a resume plan's or a replay's), in order."""
        raise NotImplementedError

    async def _next(self, pump: EventPump) -> list[T] | None:
        """The live events after the cursor (with a pending warning first) as one write's
        parts; ``None`` once the subscriber is evicted. Advances the cursor."""
        raise NotImplementedError

    async def _send(self, batch: list[T]) -> None:
        """Send what :meth:`_next` took."""
        raise NotImplementedError

    async def live(self, pump: EventPump) -> bool | None:
        """Send the live events after the cursor (with a pending warning first): whether
        anything was sent, ``None`` once the subscriber is evicted."""
        batch = await self._next(pump)
        if batch is None:
            return None
        if not batch:
            return False
        self._sub.begin_write()
        await self._send(batch)
        self._sub.end_write()
        return True

    async def idle(self, pump: EventPump) -> None:
        """Wait for the next events (or for whatever else needs the stream's task)."""
        await pump.wait()


class _AsgiWs(_WsWriter[Event]):
    """Through the server: one ASGI ``websocket.send`` per event."""

    def __init__(self, send: Send, sub: Subscription) -> None:
        super().__init__(sub)
        self._send_asgi = send

    async def events(self, events: Sequence[Event]) -> None:
        for event in events:
            await self._send_asgi({"type": "websocket.send", "text": event.raw.decode()})
        self._sub.writes_done += 1

    async def _next(self, pump: EventPump) -> list[Event] | None:
        return pump.next_batch()

    async def _send(self, batch: list[Event]) -> None:
        await self.events(batch)


class _DirectWs(_WsWriter[bytes]):
    """Straight to the socket: a wake-up's frames, shared with the bus's other WebSocket
    subscribers, in one write; caught up, the stream waits in the delivery loop
    (:mod:`daemon.delivery`), which writes its frames from then on."""

    def __init__(self, direct: DirectWebSocket, sub: Subscription) -> None:
        super().__init__(sub)
        self._direct = direct

    async def events(self, events: Sequence[Event]) -> None:
        for chunk in ws_chunks(events, max_chunk=2 * REPLAY_CHUNK_BYTES):
            await self._direct.write(chunk)
            self._sub.writes_done += 1

    async def _next(self, pump: EventPump) -> list[bytes] | None:
        for _ in range(GATHER_PASSES):  # see daemon.core.flow_control
            if not pump.worth_gathering():
                break
            await trio.lowlevel.checkpoint()
        return pump.next_ws()

    async def _send(self, batch: list[bytes]) -> None:
        # One write per wake-up, however many segments it spans.
        await self._direct.write(batch[0] if len(batch) == 1 else b"".join(batch))
        self._sub.writes_done += 1

    async def idle(self, pump: EventPump) -> None:
        # No heartbeat of the stream's own: the server pings (--ws-ping-ms).
        bus = pump.bus
        await Delivery.current().wait(
            bus, Parked(self._sub, self._direct, bus.ws_frames, trio.current_time()), math.inf)


async def _run_ws(sub: Subscription, pump: EventPump, plan: ResumePlan, writer: _WsWriter[Any],
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
            await writer.idle(pump)
    except BodyGone as exc:
        log.info("event=ws_connection_gone reason=%s", exc)
        gone.append(exc)
    scope.cancel()
