"""Mirrors: the event stream of a session owned by another node, served here. Trio shell.

A mirror is an event source for an ordinary writer-less :class:`~daemon.bus.SessionBus`: it
reads the owner's Redis stream (``XREAD``) and feeds the events to the bus under their own
ids, so the single-node SSE/WebSocket code serves them unchanged, with the single-node
slow-client rules and flow control. At a takeover the bus moves to the new owner's epoch in
place (:meth:`SessionBus.move_to_epoch`): every reader keeps its stream, is sent the resync a
client with the old epoch would get on reconnecting, and reads on from the new epoch's first
event. Each mirror reports its reader count to Redis for the owner's status.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import trio

from ..bus import BusLimits, SessionBus
from ..core.cluster import READERS_REFRESH_MS, session_keys, split_run
from ..core.envelope import Event, decode_json
from ._redis import Client, Redis, text

log = logging.getLogger("daemon.cluster")

MIRROR_BLOCK_MS = 500
TERMINAL_SESSION_EVENTS = frozenset({"session_closed", "session_died"})


@dataclass
class Mirror:
    """The local view of a remote owner's event stream."""

    bus: SessionBus
    stream_pos: str
    done: trio.Event = field(default_factory=trio.Event)
    readers_changed: trio.Event = field(default_factory=trio.Event)  # a reader came or went


class Mirrors:
    """The mirrors of this node, by session id."""

    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        self.by_session: dict[str, Mirror] = {}

    def live(self, session_id: str) -> Mirror | None:
        mirror = self.by_session.get(session_id)
        return mirror if mirror is not None and not mirror.bus.closed else None

    async def open(self, session_id: str, limits: BusLimits, nursery: trio.Nursery
                   ) -> Mirror | None:
        """A mirror of ``session_id``'s stream, its tasks in ``nursery``; ``None`` when the
        session has no directory entry."""
        entry, _, fields = await self.redis.lookup(session_id)
        if entry is None:
            return None
        base = int(fields.get("base", "1") or 1)
        entries = await self.redis.events(session_id)
        current = [e for e in entries if text(e.field_values.get(b"e", b"")) == entry.epoch]
        first = int(current[0].field_values[b"f"]) if current else base
        bus = SessionBus(session_id, limits, None, first_id=first, epoch=entry.epoch)
        mirror = Mirror(bus, text(entries[-1].identifier) if entries else "0-0")
        bus.on_subscribers_changed.append(lambda: mirror.readers_changed.set())
        for item in current:
            self._feed(mirror, item.field_values)
        bus.flush()
        self.by_session[session_id] = mirror
        nursery.start_soon(self._follow, session_id, mirror)
        nursery.start_soon(self._report_readers, session_id, mirror)
        return mirror

    async def _report_readers(self, session_id: str, mirror: Mirror) -> None:
        """Keep this mirror's reader count in Redis for the owner's status: at once when it
        changes, refreshed every READERS_REFRESH_MS; withdrawn when the mirror ends."""
        bus = mirror.bus
        try:
            while not mirror.done.is_set():
                mirror.readers_changed = trio.Event()
                try:
                    await self.redis.report_readers(session_id, len(bus.subscribers))
                except Exception as exc:  # Redis away for a moment: the next round reports
                    log.warning("event=mirror_readers_failed session=%s error=%r",
                                session_id, exc)
                with trio.move_on_after(READERS_REFRESH_MS / 1000):
                    async with trio.open_nursery() as wait:
                        async def on(event: trio.Event) -> None:
                            await event.wait()
                            wait.cancel_scope.cancel()
                        wait.start_soon(on, mirror.readers_changed)
                        wait.start_soon(on, mirror.done)
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(2):
                try:
                    await self.redis.report_readers(session_id, 0)
                except Exception as exc:
                    log.warning("event=mirror_readers_failed session=%s error=%r",
                                session_id, exc)

    @staticmethod
    def _feed(mirror: Mirror, values: Any) -> bool:
        """Feed one stream entry's events to the mirror's bus; False when the session ended
        with them."""
        ended = False
        bus = mirror.bus
        for event_id, raw in split_run(int(values[b"f"]), int(values[b"l"]), values[b"b"]):
            if event_id < bus.ring.next_id:
                continue  # already held
            event = Event.with_env(decode_json(raw), raw)
            event.release()
            bus.append_numbered(event)
            if event.type in TERMINAL_SESSION_EVENTS:
                ended = True
        return not ended

    @staticmethod
    def _new_epoch(session_id: str, mirror: Mirror, epoch: str, first_id: int) -> None:
        log.info("event=mirror_epoch_changed session=%s readers=%d", session_id,
                 len(mirror.bus.subscribers))
        mirror.bus.move_to_epoch(epoch, first_id)

    async def _follow(self, session_id: str, mirror: Mirror) -> None:
        """Feed the mirror from the stream until the session ends or nobody reads it; a new
        epoch (a takeover) moves the mirror to it, its readers keep their streams."""
        key = session_keys(session_id).events
        # A client of its own: a blocking XREAD holds its connection for up to
        # MIRROR_BLOCK_MS, which the node's lookups, appends and renewals must not wait for.
        client = self.redis.new_client()
        try:
            async with client:
                await self._read_stream(client, key, session_id, mirror)
        except Exception as exc:
            log.warning("event=mirror_failed session=%s error=%r", session_id, exc)
        finally:
            mirror.bus.close()
            if self.by_session.get(session_id) is mirror:
                del self.by_session[session_id]
            mirror.done.set()

    async def _read_stream(self, client: Client, key: str, session_id: str,
                           mirror: Mirror) -> None:
        idle_rounds = 0
        while True:
            got = await client.xread({key: mirror.stream_pos}, count=512,
                                     block=MIRROR_BLOCK_MS)
            entries = next(iter(got.values()), ()) if got else ()
            for item in entries:
                mirror.stream_pos = text(item.identifier)
                values = item.field_values
                epoch = text(values.get(b"e", b""))
                if epoch != mirror.bus.epoch:
                    self._new_epoch(session_id, mirror, epoch, int(values[b"f"]))
                if not self._feed(mirror, values):
                    mirror.bus.flush()
                    return
                # One entry is one of the owner's publish batches: published here as one,
                # with the owner's flow control (wait, rationed, for the readers that are
                # behind). Redis holds what is not read yet, so the owner never waits.
                mirror.bus.flush()
                await trio.lowlevel.checkpoint()  # the woken readers take their batch
                await mirror.bus.wait_for_subscribers()
            if not entries:
                entry, _, fields = await self.redis.lookup(session_id)
                if entry is None or entry.closed:
                    return
                if entry.epoch and entry.epoch != mirror.bus.epoch:
                    self._new_epoch(session_id, mirror, entry.epoch,
                                    int(fields.get("base") or 1))
                idle_rounds = idle_rounds + 1 if not mirror.bus.subscribers else 0
                if idle_rounds >= 4:
                    return
