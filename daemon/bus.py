"""The session bus: the publish pipeline. Trio shell.

Publishing takes a typed payload (:mod:`sdk.protocol.events`) or one read's agent updates (a
:class:`~daemon.core.updates.UpdateBatch`), assigns the ids, encodes once (the frame codec,
:mod:`daemon.core.frame_codec`, splices plain text chunks), appends to the ring, feeds both live
journals and the compactor, hands the bytes to the transcript writer and, once per batch
(``flush``), wakes the readers. The readers' side (who subscribes, the wake-ups, the
slow-client rules, the publisher's wait) is :class:`daemon.fanout.Fanout`, which the bus
extends. A bus may also be fed events numbered elsewhere (a cluster mirror:
:meth:`SessionBus.append_numbered`).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Protocol

import msgspec

from sdk.protocol.constants import RESYNC_EPOCH_MISMATCH, RESYNC_EPOCH_RESET
from sdk.protocol.events import (
    EventPayload,
    SessionUpdateData,
    StateResyncRequiredData,
    TurnCompleteData,
    TurnErrorData,
)

from .clock import now_ms
from .core.compactor import TurnCompactor, stamp_record
from .core.envelope import Event, JsonObject, decode_json, typed_event, typed_synthetic
from .core.frame_codec import Splicer
from .core.live_journal import LiveJournals
from .core.replay_window import Record, ReplayWindow, SegmentHandle, SpilledTurn
from .core.ring import DEFAULT_RING_BYTES, EventRing
from .core.updates import UpdateBatch, plain_chunk
from .fanout import Fanout
from .load_snapshot import LoadSnapshot
from .metrics import totals
from .transcript_store import (
    AppendEvent,
    FinishTurn,
    TerminalState,
)
from .transcript_writer import TranscriptWriter

log = logging.getLogger("daemon.bus")


class BusLimits(msgspec.Struct, frozen=True):
    max_journal_events: int
    max_journal_bytes: int
    compacted_replay_max_bytes: int
    event_ring_size: int
    event_ring_bytes: int = DEFAULT_RING_BYTES


class HeapReclaimer(Protocol):
    """Where freed heap goes back to the OS (``daemon.reclaimer.Reclaimer``)."""

    def note(self, nbytes: int) -> None:
        """``nbytes`` were published (they will leave the ring and the journals one day)."""

    def trim_now(self, reason: str) -> bool:
        """Many pieces of heap were just freed: trim at once; True if memory went back."""
        ...


Spawn = Callable[[Callable[[], Awaitable[None]]], None]


class SessionBus(Fanout):
    """One session's events: published here, read through :class:`~daemon.fanout.Fanout`."""

    def __init__(
        self,
        session_id: str,
        limits: BusLimits,
        writer: TranscriptWriter | None,
        *,
        first_id: int = 1,
        clock_ms: Callable[[], int] = now_ms,
        spawn: Spawn | None = None,
        reclaimer: HeapReclaimer | None = None,
        guard: Callable[[], bool] | None = None,
        epoch: str | None = None,
    ) -> None:
        super().__init__(session_id)
        self.limits = limits
        self.epoch = epoch if epoch is not None else str(uuid.uuid4())
        self.ring = EventRing(limits.event_ring_size, next_id=first_id,
                              max_bytes=limits.event_ring_bytes)
        # Runs background work of this bus (spilling an over-cap turn once it is committed);
        # without it over-cap turns stay in memory.
        self._spawn = spawn
        # Told, at each flush, the bytes published since the last one (events pushed out of
        # the ring and the journals leave heap holes), and asked to trim after a spill.
        self._reclaimer = reclaimer
        self._published_noted = self.ring.appended_bytes
        self.journals = LiveJournals(limits.max_journal_events, limits.max_journal_bytes)
        self.compactor = TurnCompactor()
        self.window = ReplayWindow(limits.compacted_replay_max_bytes)
        self.writer = writer
        self.clock_ms = clock_ms
        self.terminal_ms: int | None = None  # when the last terminal was published
        self.degraded = False  # compaction failed once: load reports replayDegraded
        self.closed = False
        self.active_prompt_id: str | None = None
        self.latest_record_id: str | None = None
        self.last_write_seq = 0
        # A terminal written to the transcript but not shown yet (publish_terminal's hold):
        # the event, the turn's records and the seq of their FinishTurn.
        self._held: tuple[Event, list[Record], int | None] | None = None
        # When the last event was published (ms; None before the first): GET /daemon/status's
        # lastActivityAt. Read off the clock once per flush, not per event.
        self.last_activity_ms: int | None = None
        self._dirty = False
        # The envelopes of spliced runs (the frame codec keeps the template of the moment).
        self._splicer = Splicer(session_id)
        # Cluster mode: True while this node certainly owns the session (the lease clock); a
        # publish that finds it False first cuts every subscriber. None: no check.
        self.guard = guard
        if writer is not None:
            writer.reset_durable(session_id)

    # -- persistence state ------------------------------------------------------------------

    @property
    def transcript_degraded(self) -> bool:
        return self.writer is not None and self.writer.is_degraded(self.session_id)

    @property
    def transcript_damaged(self) -> bool:
        """Damage was found in this session's stored history (or in the file)."""
        return self.writer is not None and self.writer.is_damaged(self.session_id)

    @property
    def full_transcript_available(self) -> bool:
        return self.writer is not None and self.session_id not in self.writer.failed_sessions \
            and not self.writer.is_damaged(self.session_id)

    def durable_event_id(self) -> int:
        return self.writer.durable_event_id(self.session_id) if self.writer is not None else 0

    # -- publishing ---------------------------------------------------------------------------

    def publish(
        self,
        payload: EventPayload,
        *,
        prompt_id: str | None = None,
        originator_client_id: str | None = None,
        meta: JsonObject | None = None,
        flush: bool = True,
    ) -> Event | None:
        """Publish one event, typed by its payload Struct; ``None`` if it could not be encoded
        (no id consumed)."""
        event = self._append(payload, prompt_id, originator_client_id, meta)
        if event is not None:
            try:
                self.compactor.add(event)
            except Exception:
                self._mark_degraded("compactor.add")
            self._persist(event)
            # Everyone has taken what they need from the dict; the ring and the journals keep
            # the bytes (a merged journal entry decodes its ends again when rendered).
            event.release()
        if flush:
            self.flush()
        return event

    def publish_updates(
        self,
        batch: UpdateBatch,
        *,
        prompt_id: str | None,
        originator_client_id: str | None,
    ) -> None:
        """Publish one read's agent ``session/update`` updates, in order, as
        ``session_update`` events (``data = {sessionId, update}``), then :meth:`flush`.

        Plain text chunks are spliced (:mod:`daemon.core.frame_codec`), not re-encoded, and
        handled a run at a time: one envelope template, one transcript op per run, the
        journals and the compactor fed without classifying each event again. The batch says
        whether it is one such run (the usual read, found as the agent channel read it); in a
        mixed batch each stretch of text chunks of one kind between the other updates is one
        run. Every other update is decoded and published like :meth:`publish`; one that is not
        a JSON object is dropped.
        """
        if self.closed:
            return
        now = self.clock_ms()
        run = batch.run
        if run is not None:
            self._publish_spliced_run(run[0], batch.updates, run[1], prompt_id,
                                      originator_client_id, now)
            self.flush(now)
            return
        run_kind: str | None = None
        run_updates: list[bytes] = []
        run_texts: list[str] = []
        for update in batch.updates:
            chunk = plain_chunk(update)
            if chunk is None or chunk[0] != run_kind:
                if run_updates:
                    self._publish_spliced_run(run_kind or "", run_updates, run_texts, prompt_id,
                                              originator_client_id, now)
                    run_updates, run_texts = [], []
                if chunk is None:
                    run_kind = None
                    self._publish_decoded_update(update, prompt_id, originator_client_id)
                    continue
                run_kind = chunk[0]
            run_updates.append(update)
            run_texts.append(chunk[1])
        if run_updates:
            self._publish_spliced_run(run_kind or "", run_updates, run_texts, prompt_id,
                                      originator_client_id, now)
        self.flush(now)

    def _publish_spliced_run(self, kind: str, updates: list[bytes], texts: list[str],
                             prompt_id: str | None, originator_client_id: str | None,
                             now: int) -> None:
        """A run of plain text chunks of one ``kind`` (``texts``: theirs): the envelopes
        formatted in one pass around the agent's bytes, the ring filled a slice at a time, and
        the journals, the compactor and the transcript fed once for the run."""
        self._show_held()
        self._check_guard()
        first = self.ring.next_id
        events, template = self._splicer.run(prompt_id, originator_client_id, now, first,
                                             updates)
        offsets = self.ring.extend(events)
        totals.events_published += len(events)
        self.journals.append_run(events, texts, kind, prompt_id, originator_client_id,
                                 self.session_id, offsets)
        try:
            self.compactor.add_plain_chunks(kind, events, texts, prompt_id, originator_client_id)
        except Exception:
            self._mark_degraded("compactor.add")
        if self.writer is not None:
            # One op for the run, holding the envelopes' shared template and the agent's
            # updates rather than the envelopes: a quarter of the bytes.
            self.last_write_seq = self.writer.submit(
                AppendEvent(self.session_id, events[-1].id or 0, prompt_id,
                            b"\n".join(updates), template))
        self._dirty = True

    def _publish_decoded_update(self, update: bytes, prompt_id: str | None,
                                originator_client_id: str | None) -> None:
        try:
            decoded = decode_json(update)
        except (msgspec.DecodeError, RecursionError):
            decoded = None
        if type(decoded) is not dict:
            log.warning("event=agent_bad_update session=%s excerpt=%r", self.session_id,
                        update[:200])
            return
        self.publish(SessionUpdateData(session_id=self.session_id, update=decoded),
                     prompt_id=prompt_id, originator_client_id=originator_client_id,
                     flush=False)

    def _append(
        self, payload: EventPayload, prompt_id: str | None,
        originator_client_id: str | None, meta: JsonObject | None,
    ) -> Event | None:
        self._show_held()
        if self.closed:
            return None
        event = typed_event(
            self.ring.next_id, payload, now_ms=self.clock_ms(), prompt_id=prompt_id,
            originator_client_id=originator_client_id, meta=meta,
        )
        if event is None:
            log.warning("event=dropped reason=unencodable session=%s payload=%s",
                        self.session_id, type(payload).__name__)
            return None
        self._check_guard()
        self.ring.append(event)
        totals.events_published += 1
        self.journals.append(event)
        self._dirty = True
        return event

    def _persist(self, event: Event) -> None:
        if self.writer is not None:
            self.last_write_seq = self.writer.submit(
                AppendEvent(self.session_id, event.id or 0, event.prompt_id, event.raw)
            )

    def publish_terminal(
        self,
        payload: TurnCompleteData | TurnErrorData,
        *,
        prompt_id: str | None,
        originator_client_id: str | None,
        ledger_terminal: TerminalState,
        stop_reason: str | None,
        hold: bool = False,
    ) -> Event | None:
        """Publish a turn terminal and close the turn: compact it into one replay-window segment
        stamped with transcript record ids, reset both live journals, and store the records.

        ``hold``: the terminal and the turn's records go to the transcript now, but the
        terminal enters the ring (and reaches subscribers) only at :meth:`show_terminal`
        (cluster mode: once Redis holds it); anything published meanwhile shows it first, so
        ids stay in order."""
        self._show_held()
        if self.closed:
            return None
        # One instant for the terminal: its event, the ledger's row and the session's list of
        # terminals (a load answers the same ``at`` before and after a restore).
        self.terminal_ms = ended = self.clock_ms()
        event = typed_event(self.ring.next_id, payload, now_ms=ended,
                            prompt_id=prompt_id, originator_client_id=originator_client_id)
        if event is None:
            log.warning("event=dropped reason=unencodable session=%s payload=%s",
                        self.session_id, type(payload).__name__)
            return None
        totals.prompts[ledger_terminal] += 1
        self._persist(event)
        records: list[Record] = []
        try:
            for env in self.compactor.finish(event):
                record_id = str(uuid.uuid4())
                compacted = Event.from_env(stamp_record(env, record_id))
                compacted.release()  # the window and the transcript need only the bytes
                records.append(Record(compacted, record_id))
        except Exception:
            self._mark_degraded("compactor.finish")
            self.compactor.reset()
            records = []
        seq = None
        if self.writer is not None and records:
            self.last_write_seq = seq = self.writer.submit(FinishTurn(
                self.session_id, prompt_id, ledger_terminal, stop_reason, ended,
                [(r.record_id or "", r.event.raw) for r in records],
            ))
        self._held = (event, records, seq)
        if not hold:
            self._show_held()
        return event

    def show_terminal(self, *, visible: bool = True) -> None:
        """The terminal :meth:`publish_terminal` held enters the ring and reaches
        subscribers; ``visible`` False (Redis never took it): every subscriber is cut first,
        so none reads it."""
        if self._held is not None and not visible:
            self.cut_subscribers("terminal_not_in_cluster")
        self._show_held()

    def _show_held(self) -> None:
        held = self._held
        if held is None:
            return
        self._held = None
        event, records, seq = held
        if self.closed:
            return
        self._check_guard()
        self.ring.append(event)
        totals.events_published += 1
        self._dirty = True
        handle: SegmentHandle | None = None
        try:
            handle = self.window.add_segment(records)
            if records:
                self.latest_record_id = records[-1].record_id
        except Exception:
            self._mark_degraded("window.add_segment")
        self.journals.reset()
        if seq is not None and handle is not None and self._spawn is not None \
                and self.window.spillable(handle):
            self._spawn(partial(self._spill_when_committed, handle, seq))
        self.flush()

    async def _spill_when_committed(self, handle: SegmentHandle, seq: int) -> None:
        """A turn bigger than the whole replay window leaves memory once the transcript holds
        it: loads then read it back from there (the writer's queue held the same bytes until
        the commit, so nothing was held twice meanwhile). A failed commit keeps it here."""
        writer = self.writer
        if writer is None or not await writer.wait_committed(seq):
            return
        size = self.window.total_bytes
        if self.window.spill(handle):
            # The turn's text was freed in many pieces: give the pages back to the OS.
            released = (self._reclaimer.trim_now("replay_turn_spilled")
                        if self._reclaimer is not None else False)
            log.info("event=replay_turn_spilled session=%s bytes=%d trimmed=%s",
                     self.session_id, size, released)

    def _mark_degraded(self, where: str) -> None:
        if not self.degraded:
            log.exception("event=replay_degraded session=%s where=%s", self.session_id, where)
        self.degraded = True

    def flush(self, now: int | None = None) -> None:
        """Wake the readers once for everything published since the last flush (``now``: the
        clock's milliseconds, if the caller just read it)."""
        if not self._dirty:
            return
        self._dirty = False
        self.last_activity_ms = now if now is not None else self.clock_ms()
        ring = self.ring
        if self._reclaimer is not None:
            published = ring.appended_bytes
            self._reclaimer.note(published - self._published_noted)
            self._published_noted = published
        self.wake()

    def _check_guard(self) -> None:
        """Before an event enters the ring: if this node may no longer be the session's owner
        (cluster mode, see ``guard``), no subscriber may read it: each one is cut first."""
        if self.subscribers and self.guard is not None and not self.guard():
            self.cut_subscribers("lease_in_doubt")

    def close(self) -> None:
        """No more events: subscribers drain what is left and end their streams."""
        self.flush()
        self.closed = True
        self.wake_closed()

    # -- events numbered elsewhere (a cluster mirror of another node's bus) --------------------

    def append_numbered(self, event: Event) -> bool:
        """An event published elsewhere, under its own id (``event.id``), into the ring: one
        the ring holds already is skipped (False); a gap before it (the source dropped events
        this bus never had) restarts the ring at its id. Subscribers are woken at the next
        :meth:`flush`."""
        event_id = event.id or 0
        ring = self.ring
        if event_id < ring.next_id:
            return False
        if event_id > ring.next_id:
            self.ring = ring = EventRing(ring.capacity, next_id=event_id,
                                         max_bytes=ring.max_bytes)
        ring.append(event)
        self._dirty = True
        return True

    def move_to_epoch(self, epoch: str, first_id: int) -> None:
        """The source moved to a new epoch (a cluster takeover): the ring starts again at
        ``first_id``, and every subscriber keeps its stream: it is sent the
        ``state_resync_required`` a client resuming with the old epoch would get, then reads
        on from the new epoch's first event."""
        old = self.ring
        self.ring = EventRing(old.capacity, next_id=max(1, first_id), max_bytes=old.max_bytes)
        self.epoch = epoch
        self.frames.clear()  # built for the old epoch's ids
        self.ws_frames.clear()
        stamp = self.clock_ms()
        for sub in self.subscribers:
            state = sub.state
            self.resyncs[sub] = typed_synthetic(StateResyncRequiredData(
                reason=RESYNC_EPOCH_RESET, detail=RESYNC_EPOCH_MISMATCH,
                last_delivered_id=state.cursor, earliest_available_id=self.ring.next_id,
            ), now_ms=stamp)
            state.cursor = self.ring.next_id - 1
        self._dirty = True
        self.flush()

    # -- load ---    # -- load ---------------------------------------------------------------------------------

    def load_snapshot(self, mode: str) -> LoadSnapshot:
        """Replay window + live journal + cursor, taken with no checkpoint in between."""
        full = self.full_transcript_available
        compacted = self.window.snapshot(full_transcript_available=full)
        live = self.journals.snapshot(
            mode,
            active_prompt_id=self.active_prompt_id,
            full_transcript_available=full,
            record_id=self.latest_record_id,
        )
        if_lost: list[bytes] | None = None
        spilled = [item for item in compacted if isinstance(item, SpilledTurn)]
        if spilled:
            if_lost = [item for item in self.window.snapshot(
                full_transcript_available=False, lost=spilled) if isinstance(item, bytes)]
        return LoadSnapshot(compacted, live, self.ring.last_id, self.epoch, if_lost)
