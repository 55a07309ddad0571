"""A bus's readers: who subscribes, how they are woken, the slow-client rules applied at each
wake-up and the publisher's wait for readers that fell behind. Trio shell.

:class:`Fanout` is the subscriber side of a :class:`daemon.bus.SessionBus` (the bus is one; the
publish pipeline lives there). Readers read the bus's ring through their own cursor; nothing is
copied per reader. A wake-up (:meth:`Fanout.wake`, after every publish batch) applies the rules
of :mod:`daemon.core.subscriber` to the readers whose write is in flight (warn, evict), notes
the ones the publisher must wait for (:mod:`daemon.core.flow_control`), tells the delivery loop
(:mod:`daemon.delivery`) when readers wait there, and wakes the readers that wait on the bus.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

import trio

from .core.envelope import Event
from .core.flow_control import (
    FLOW_STALL_S,
    WaitBudget,
    behind,
    dispatch_group_lines,
)
from .core.frame_codec import ws_frames
from .core.ring import EventRing
from .core.shared_frames import SharedFrames
from .core.subscriber import Eviction, SubscriberState, Warning
from .metrics import totals

log = logging.getLogger("daemon.bus")

__all__ = ["BusReader", "Fanout"]


class BusReader(Protocol):
    """What the bus needs of one of its SSE/WS readers (``daemon.streams.Subscription``)."""

    state: SubscriberState
    # True while a write is in flight (only then can lag build up); writes completed so far;
    # writes_done when flow control last found a write stalled.
    sending: bool
    writes_done: int
    flow_stalled_at: int | None
    pending_warning: Warning | None
    # Stops its stream; cuts its transport (a stalled write cannot be cancelled).
    scope: trio.CancelScope | None
    abort: Callable[[], object] | None
    evicted: trio.Event

    async def wait_idle(self) -> None:
        """Return once no write is in flight."""


class Fanout:
    """The readers of one session's events (see the module docstring). The owner sets
    :attr:`ring` and :attr:`closed`."""

    ring: EventRing
    closed: bool

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.subscribers: set[BusReader] = set()
        # How many agent lines the reader may publish between two yields (flow control),
        # kept up to date as subscribers come and go.
        self.group_lines = dispatch_group_lines(())
        # Called whenever the subscribers change (so group_lines may have): the agent
        # channel keeps the smallest over its sessions instead of asking each on every read;
        # a cluster mirror reports its reader count.
        self.on_subscribers_changed: list[Callable[[], None]] = []
        # SSE frames of the newest events, built once for all SSE subscribers; the same
        # events as WebSocket messages, built once for all WebSocket subscribers.
        self.frames = SharedFrames()
        self.ws_frames = SharedFrames(build=ws_frames)
        self.slow_client_warnings = 0
        self.clients_evicted = 0
        self._lot = trio.lowlevel.ParkingLot()
        # Told at every wake-up while subscribers wait in the delivery loop (daemon.delivery)
        # rather than on this bus.
        self.deliver_to: Callable[[Fanout], None] | None = None
        # Subscribers the last wake-up found behind (daemon.core.flow_control).
        self._behind: list[BusReader] = []
        self._flow_budget = WaitBudget()
        self.flow_wait_s = 0.0  # total time the publisher spent waiting for subscribers
        # Frames to send a subscriber before its next events (see SessionBus.move_to_epoch);
        # read it, take from it with take_resync.
        self.resyncs: dict[BusReader, Event] = {}

    def wake(self) -> None:
        """Everything published since the last wake-up is in the ring: apply the slow-client
        rules to the readers whose write is in flight and wake every reader."""
        ring = self.ring
        self._behind = lagging = []
        for sub in tuple(self.subscribers):
            if not sub.sending:
                continue
            state = sub.state
            verdict = state.check(ring)
            if isinstance(verdict, Eviction):
                self.evict(sub)
                continue
            if isinstance(verdict, Warning):
                self.slow_client_warnings += 1
                warned = verdict.data
                log.info("event=slow_client_warning session=%s threshold=%s queue_size=%s "
                         "queued_bytes=%s", self.session_id, warned.threshold,
                         warned.queue_size, warned.queued_bytes)
                sub.pending_warning = verdict
            if behind(ring.next_id - 1 - state.cursor, ring.bytes_since(state.cursor),
                      state.max_queued, state.max_queued_bytes):
                lagging.append(sub)
        if self.deliver_to is not None:
            self.deliver_to(self)
        if self._lot:  # usually nobody: a caught-up stream waits in the delivery loop
            self._lot.unpark_all()

    def wake_closed(self) -> None:
        """The bus closed: readers drain what is left and end their streams."""
        if self.deliver_to is not None:
            self.deliver_to(self)
        if self._lot:
            self._lot.unpark_all()

    async def wait_for_subscribers(self, stall_s: float = FLOW_STALL_S) -> None:
        """Flow control for the publisher (the agent reader): wait for the writes in flight
        of the subscribers the last flush found behind, skipping stalled ones, within the
        bus's ration of waiting (:mod:`daemon.core.flow_control`). Returns at once when none
        is behind."""
        lagging = self._behind
        if not lagging:
            return
        self._behind = []
        budget = self._flow_budget
        budget.refill(trio.current_time())
        for sub in lagging:
            if sub not in self.subscribers or sub.flow_stalled_at == sub.writes_done:
                continue
            limit = budget.allowance(stall_s)
            if limit <= 0:
                return  # rationed out: the slow-client caps decide from here
            started = trio.current_time()
            with trio.move_on_after(limit) as scope:
                await sub.wait_idle()
            waited = trio.current_time() - started
            budget.spend(waited)
            self.flow_wait_s += waited
            if scope.cancelled_caught and limit >= stall_s:
                sub.flow_stalled_at = sub.writes_done
        budget.at = trio.current_time()  # time spent waiting earns nothing

    def cut_subscribers(self, reason: str) -> None:
        """End every subscriber's stream at once, without another frame: its connection is
        shut down now, so nothing published from here on reaches it (the client resumes with
        ``Last-Event-ID`` wherever the session lives then)."""
        if not self.subscribers:
            return
        log.warning("event=subscribers_cut session=%s reason=%s count=%d", self.session_id,
                    reason, len(self.subscribers))
        for sub in tuple(self.subscribers):
            self.subscribers.discard(sub)
            if sub.scope is not None:
                sub.scope.cancel()
            if sub.abort is not None:
                sub.abort()
        self.frames.clear()
        self.ws_frames.clear()
        self._subscribers_changed()

    def evict(self, sub: BusReader) -> None:
        """Drop a subscriber that fell behind; its stream ends with ``client_evicted``."""
        if sub in self.subscribers:
            self.subscribers.discard(sub)
            self._subscribers_changed()
            self.clients_evicted += 1
            evicted = sub.state.evicted
            data = evicted.data if evicted is not None else None
            totals.evicted[data.reason if data is not None else "unknown"] += 1
            log.info("event=client_evicted session=%s reason=%s dropped_after=%s queue_size=%s "
                     "queued_bytes=%s", self.session_id, data and data.reason,
                     data and data.dropped_after, data and data.queue_size,
                     data and data.queued_bytes)
        # Its stream sends client_evicted and closes once its current write completes, or cuts
        # the connection if that write stays stalled (see streams.watch_eviction).
        sub.evicted.set()

    # -- subscribers ----------------------------------------------------------------------------

    def take_resync(self, sub: BusReader) -> Event | None:
        """A frame to send ``sub`` before its next events: the resync of
        :meth:`move_to_epoch`, once."""
        return self.resyncs.pop(sub, None)

    def add_subscriber(self, sub: BusReader) -> None:
        self.subscribers.add(sub)
        self._subscribers_changed()

    def remove_subscriber(self, sub: BusReader) -> None:
        self.resyncs.pop(sub, None)
        self.subscribers.discard(sub)
        self._subscribers_changed()
        if not self.subscribers:
            self.frames.clear()  # nobody left to share them with
            self.ws_frames.clear()

    def _subscribers_changed(self) -> None:
        self.group_lines = dispatch_group_lines(sub.state.max_queued for sub in self.subscribers)
        for told in self.on_subscribers_changed:
            told()

    async def wait_for_events(self, cursor: int) -> None:
        """Return once the ring holds an event after ``cursor`` or the bus closed."""
        if self.ring.last_id > cursor or self.closed:
            return
        await self._lot.park()
