"""The delivery loop: one task per daemon writes every caught-up SSE and WebSocket subscriber.
Trio shell.

A subscriber whose stream is caught up (its replay sent, nothing in flight, its frames written
straight to the socket: :class:`daemon.bridge.DirectBody` for SSE,
:class:`daemon.bridge.DirectWebSocket` for WebSocket) *parks* here instead of waiting on its
bus. When a bus publishes (its ``flush``) it marks itself dirty; the loop wakes once for every
bus marked since it last ran, lets the publisher run a few more scheduler passes while marks
keep coming (:data:`GATHER_PASSES`: the agent reader publishing the next group of the same
read), then, for each dirty bus, takes the frames after each parked subscriber's cursor (shared
by the bus's subscribers of one transport, :class:`daemon.core.shared_frames.SharedFrames`)
and writes them in one write without waiting (``write_nowait``). A stream costs no task
wake-up, no timer and no scheduler pass per write: one loop pass serves every session that
published. A publisher that is about to publish and will not yield before it is done (the
agent reader, for a read it had to wait for) *holds* the loop instead (:meth:`Delivery.hold`):
its marks do not wake the loop, and :meth:`Delivery.deliver_held` runs the same pass in its own
task before it yields. Under LLM-paced load, where every read carries a few updates of a few
sessions, that is the loop's wake-up and its gathering pass saved on every read.

A WebSocket's write holds its connection's send lock, the one Hypercorn holds for each of its
own writes (pongs, pings, the close frame): taken without waiting, and a connection whose
server is writing goes back to its task. A write the socket did not take whole keeps the lock
held for the stream's task, which writes the rest and only then lets it go, so no frame of the
server's ever lands inside one of the stream's.

Anything else goes back to the stream's own task (the loop sets :attr:`Parked.woken`), which runs
the ordinary path: a write the socket did not take whole (the rest is written first, with
``sending`` set, so the slow-client and stalled-write rules see it exactly as before, and
whatever ended the stream's wait: :meth:`Delivery.wait`), an evicted subscriber or one whose
next event left the ring, a resync or warning to send, a closed bus. An SSE stream's task also
wakes by itself when the heartbeat interval passes with nothing written. Wire bytes are the
same as the task's own writes: one write of the frames after the cursor.
"""

from __future__ import annotations

import logging
from typing import Protocol

import trio

from .core.flow_control import GATHER_PASSES
from .core.frame_codec import Buffer
from .core.shared_frames import SharedFrames
from .fanout import BusReader, Fanout
from .metrics import totals

log = logging.getLogger("daemon.delivery")

__all__ = ["Delivery", "Parked", "Reader", "Writer"]


class Reader(BusReader, Protocol):
    """What the loop reads and updates of a subscriber (``daemon.streams.Subscription``)."""

    def begin_write(self) -> None:
        """A write is in flight from now on (its task ends it)."""

    def end_write(self) -> None:
        """The write in flight is done."""


class Writer(Protocol):
    """A stream's connection written straight to its socket (``daemon.bridge``'s
    :class:`~daemon.bridge.DirectBody`, :class:`~daemon.bridge.DirectWebSocket`)."""

    def write_nowait(self, data: bytes) -> list[Buffer]:
        """Write ``data`` as far as the socket takes it now: what is left (``[]``: all)."""

    async def write_rest(self, buffers: list[Buffer]) -> None:
        """Write what :meth:`write_nowait` left, before anything else."""


class Parked:
    """One caught-up subscriber waiting in the delivery loop (its task waits in
    :meth:`Delivery.wait`); ``frames``: its bus's shared frames of its transport."""

    __slots__ = ("body", "frames", "pending", "sub", "woken", "written_at")

    def __init__(self, sub: Reader, body: Writer, frames: SharedFrames,
                 written_at: float) -> None:
        self.sub = sub
        self.body = body
        self.frames = frames
        # What the socket did not take of the last write: the task writes it first.
        self.pending: list[Buffer] = []
        self.woken = trio.Event()
        # trio.current_time() of the loop pass that last wrote it (heartbeats count from it).
        self.written_at = written_at


class Delivery:
    """The delivery loop of one Trio run: see the module docstring. :meth:`current` finds (and
    on first use starts) the loop of the running daemon."""

    def __init__(self) -> None:
        self._parked: dict[Fanout, dict[Reader, Parked]] = {}
        self._dirty: dict[Fanout, None] = {}
        self._lot = trio.lowlevel.ParkingLot()
        self._marks = 0  # buses marked so far (the gathering watches it move)
        self._held = 0  # publishers between hold() and deliver_held()
        self.passes = 0  # loop passes so far
        self.task: trio.lowlevel.Task | None = None  # the loop's task, once started

    @staticmethod
    def current() -> Delivery:
        found = _CURRENT.get()
        if found is None:
            found = Delivery()
            _CURRENT.set(found)
            found.task = trio.lowlevel.spawn_system_task(found.deliver_forever,
                                                         name="daemon.delivery")
        return found

    @staticmethod
    def running() -> Delivery | None:
        """The loop of the running daemon if a stream started it, else ``None``."""
        return _CURRENT.get()

    @property
    def parked(self) -> int:
        """Streams waiting in the loop now."""
        return sum(map(len, self._parked.values()))

    # -- parking ------------------------------------------------------------------------------

    def park(self, bus: Fanout, parked: Parked) -> None:
        streams = self._parked.get(bus)
        if streams is None:
            streams = self._parked[bus] = {}
            bus.deliver_to = self._mark
        streams[parked.sub] = parked
        if bus.ring.last_id > parked.sub.state.cursor or bus.closed:
            self._mark(bus)

    def unpark(self, bus: Fanout, parked: Parked) -> None:
        streams = self._parked.get(bus)
        if streams is None or streams.get(parked.sub) is not parked:
            return
        del streams[parked.sub]
        if not streams:
            del self._parked[bus]
            bus.deliver_to = None

    async def wait(self, bus: Fanout, parked: Parked, heartbeat_s: float) -> bool:
        """Park a caught-up stream (its task calls this) until the loop hands it back (False)
        or ``heartbeat_s`` passes with nothing written (True). A write the loop left
        unfinished (:attr:`Parked.pending`) is finished here first, whatever ended the wait,
        a cancellation too (the write is shielded): its connection's frames are never left
        cut, and a WebSocket's send lock, held for it, is let go."""
        self.park(bus, parked)
        due = False
        try:
            while True:
                with trio.move_on_at(parked.written_at + heartbeat_s):
                    await parked.woken.wait()
                    break
                if trio.current_time() - parked.written_at >= heartbeat_s:
                    due = True
                    break
        finally:
            self.unpark(bus, parked)
            if parked.pending:  # the rest goes first
                rest, parked.pending = parked.pending, []
                await parked.body.write_rest(rest)
                parked.sub.writes_done += 1
                parked.sub.end_write()
                due = False  # something was written
        return due

    def _mark(self, bus: Fanout) -> None:
        self._dirty[bus] = None
        self._marks += 1
        if not self._held and self._lot:
            self._lot.unpark_all()

    def hold(self) -> None:
        """A publisher is about to publish and will call :meth:`deliver_held` before it next
        yields: marks meanwhile do not wake the loop (the publisher's own pass writes them)."""
        self._held += 1

    def deliver_held(self) -> None:
        """End a :meth:`hold`: write every parked subscriber of every bus marked since, now,
        in the caller's task (what the loop's next pass would have written, without waking
        it). Cannot raise: a failure is handled per bus as in the loop."""
        self._held -= 1
        if self._held or not self._dirty:
            return
        self._pass(trio.current_time())

    # -- the loop -----------------------------------------------------------------------------

    async def deliver_forever(self) -> None:
        while True:
            if not self._dirty:
                await self._lot.park()
            for _ in range(GATHER_PASSES):
                marks = self._marks
                await trio.lowlevel.checkpoint()
                if self._marks == marks:
                    break  # nothing published in that pass: write now
            self._pass(trio.current_time())

    def _pass(self, now: float) -> None:
        """Write the parked subscribers of every bus marked since the last pass."""
        dirty, self._dirty = self._dirty, {}
        for bus in dirty:
            streams = self._parked.get(bus)
            if streams:
                try:
                    self._deliver(bus, streams, now)
                except Exception:
                    log.exception("event=delivery_failed session=%s", bus.session_id)
                    for parked in tuple(streams.values()):
                        self._hand_back(bus, parked)
        self.passes += 1

    def _deliver(self, bus: Fanout, streams: dict[Reader, Parked], now: float) -> None:
        ring = bus.ring
        last = ring.last_id
        first = ring.first_id
        for parked in tuple(streams.values()):
            sub = parked.sub
            state = sub.state
            cursor = state.cursor
            if (bus.closed or state.evicted is not None or (bus.resyncs and sub in bus.resyncs)
                    or (first is not None and first > cursor + 1)):
                self._hand_back(bus, parked)  # the task's path sends or ends it
                continue
            if last <= cursor:
                continue
            frames, state.cursor = parked.frames.since(ring, cursor)
            totals.events_delivered += state.cursor - cursor
            rest = parked.body.write_nowait(frames[0] if len(frames) == 1 else b"".join(frames))
            if rest:
                parked.pending = rest
                sub.begin_write()
                self._hand_back(bus, parked)
                continue
            sub.writes_done += 1
            parked.written_at = now

    def _hand_back(self, bus: Fanout, parked: Parked) -> None:
        self.unpark(bus, parked)
        parked.woken.set()


_CURRENT: trio.lowlevel.RunVar[Delivery | None] = trio.lowlevel.RunVar("daemon.delivery",
                                                                     default=None)
