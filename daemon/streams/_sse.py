"""An SSE event stream as a plain ASGI handler. Trio shell.

Written against ASGI directly rather than as a Quart streaming response so that the stream owns
its cancel scope in an ordinary coroutine (never across an async-generator ``yield``), writes
one chunk per wake-up, and can be cut off when the slow-client rules evict it. Once caught up,
a stream written straight to its socket waits in the delivery loop (:mod:`daemon.delivery`).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from functools import partial
from typing import Any

import trio

from sdk.protocol.sse import SSE_HEARTBEAT, sse_retry

from ..bridge import (
    BodyGone,
    DirectBody,
    direct_body,
    shutdown_connection,
)
from ..bus import SessionBus
from ..clock import now_ms
from ..core.envelope import Event
from ..core.flow_control import GATHER_PASSES
from ..core.frame_codec import sse_chunks
from ..core.ring import ResumePlan, decide_resume
from ..core.subscriber import (
    SubscriberState,
    client_evicted_event,
)
from ..delivery import Delivery, Parked
from ..metrics import totals
from ._request import (
    _EPOCH_BYTES,
    _STREAM_ID_BYTES,
    Receive,
    Scope,
    Send,
    StreamRequestError,
    check_capacity,
    parse_stream_request,
    send_json_error,
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
    watch_stalled_writes,
)

#: The frame that opens every stream (``retry: 3000``).
SSE_RETRY = sse_retry()

log = logging.getLogger("daemon.streams")


async def _sse_group(body: Callable[[bytes], Awaitable[None]], group: Sequence[Event]) -> None:
    for chunk in sse_chunks(group, max_chunk=2 * REPLAY_CHUNK_BYTES):
        await body(chunk)


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
            nursery.start_soon(_run_sse, sub, pump, plan, body, direct, nursery.cancel_scope,
                               gone)
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
                   body: Callable[[bytes], Awaitable[None]], direct: DirectBody | None,
                   scope: trio.CancelScope, gone: list[BodyGone]) -> None:
    """:func:`_stream_sse` in a task of its own (so that each wake-up resumes the stream's
    frames only, not the server's and the application's above it); when it ends, everything
    else of the stream (``scope``: its watchers) stops too."""
    try:
        await _stream_sse(sub, pump, plan, body, direct)
    except BodyGone as exc:
        log.info("event=sse_connection_gone reason=%s", exc)
        gone.append(exc)
    scope.cancel()


async def _direct_write(direct: DirectBody, sub: Subscription, data: bytes) -> None:
    await direct.write(data)
    sub.writes_done += 1


async def _stream_sse(sub: Subscription, pump: EventPump, plan: ResumePlan,
                      body: Callable[[bytes], Awaitable[None]],
                      direct: DirectBody | None = None) -> None:
    """The stream after its first frame: the resume plan's frames and replay, then live
    batches and heartbeats until the subscriber is evicted or the bus closes. Written straight
    to the socket (``direct``), a caught-up stream waits in the delivery loop
    (:mod:`daemon.delivery`), which writes its live frames; it comes back here for anything
    else."""
    bus = pump.bus
    delivery = Delivery.current() if direct is not None else None
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
        if delivery is not None and direct is not None:
            parked = Parked(sub, direct, bus.frames, trio.current_time())
            if not await delivery.wait(bus, parked, pump.heartbeat_s):
                continue
        elif await pump.wait():
            continue
        sub.begin_write()  # a stalled heartbeat is a stalled write like any other
        await body(SSE_HEARTBEAT)
        sub.end_write()
