"""Loads and the live subscription: load → replay (one ``store.reset``) → subscribe →
dispatch live events; resync reloads after ``state_resync_required``; :meth:`resume`."""

from __future__ import annotations

from functools import partial

from sdk._client import LoadResult
from sdk._errors import DaemonError
from sdk._repair_driver import RepairDriver
from sdk._session import SessionHandle, SubscriptionState
from sdk.protocol.constants import TERMINAL_TYPES
from sdk.protocol.envelope import DaemonEvent
from webui_model.effects import Notice
from webui_model.pagination import PAGINATION_CAPABILITY
from webui_model.provider_core import (
    RELOAD_FAILED_CODE,
    ConnectionState,
    OpenSession,
    SessionAbandonedError,
    log,
)
from webui_model.repair_commit import take_checkpoint
from webui_model.repair_glue import RepairGlue
from webui_model.replay import replay_snapshot

__all__ = ["Loading"]


class Loading(RepairGlue):
    """Snapshot loads, the subscription they start, and the live events it delivers."""

    async def resume(self) -> None:
        """Re-register with the daemon and restart a paused or stopped subscription."""
        session = self._require_session()
        session.resumes += 1
        try:
            with self._operation(session):
                await self._wait_no_attempt(session)
                owner = self._require_owner(session)
                try:
                    await owner.client.resume_session(session.session_id)
                except DaemonError as exc:
                    self._connection_failed(exc, initial=False)
                    raise
            self._require_current(session)
            if owner.state is SubscriptionState.PAUSED:
                owner.resume()
            elif owner.state is SubscriptionState.STOPPED:
                self._resubscribe(session, owner)
            session.stop_error = None
            self._set_connection(ConnectionState.CONNECTED)
        finally:
            session.resumes -= 1
            self._idle_point(session)

    # -- loads -----------------------------------------------------------------------------------

    async def _load(
        self, session: OpenSession, history_page_size: int | None, *, initial: bool
    ) -> LoadResult:
        previous = session.owner
        paused = previous is not None and previous.state is SubscriptionState.RUNNING
        if previous is not None and paused:
            # Events the old stream would deliver now are in the new snapshot anyway.
            previous.pause()
        session.loads += 1
        made: SessionHandle | None = None
        try:
            with self._operation(session):
                supported = await self._pagination_enabled()
                made, result = await SessionHandle.load(
                    self.client,
                    session.session_id,
                    history_page_size=history_page_size,
                    **self._handle_options,
                )
            self._commit_load(session, made, result, supported)
            made = None
        except BaseException as exc:
            if made is not None:
                await self._close_quietly(made)
            if not session.closed:
                if isinstance(exc, DaemonError):
                    self._connection_failed(exc, initial=initial)
                if paused and previous is not None and previous.state is SubscriptionState.PAUSED:
                    previous.resume()
            raise
        finally:
            session.loads -= 1
            self._idle_point(session)
        if previous is not None and previous is not session.owner:
            await self._close_quietly(previous)
        return result

    def _commit_load(
        self, session: OpenSession, handle: SessionHandle, result: LoadResult, supported: bool
    ) -> None:
        self._require_current(session)
        assert session.nursery is not None
        replay = replay_snapshot(
            result.compacted_replay,
            result.live_journal,
            configured_max_blocks=self.store.configured_max_blocks,
            pagination_enabled=supported,
            history_has_more=result.history_has_more is True,
            history_anchor_record_id=(anchor if isinstance(
                anchor := result.history_anchor_record_id, str) else None),
            page_size=self.page_size,
        )
        driver = session.driver
        if driver is None:
            driver = RepairDriver(
                handle,
                session.nursery,
                commit=partial(self._commit_repair, session),
                notify=partial(self._repair_notice, session),
                guards=partial(self._guards_for, session),
                on_outcome=partial(self._repair_outcome, session),
                registry=self._registry,
            )
            session.driver = driver
        else:
            driver.handle = handle
        session.loaded_handle = handle
        session.next_checkpoint = None
        session.stop_error = None
        session.generation += 1
        episode = driver.begin(result)
        self.store.reset(replay.state)
        self._perform(replay.side_effects)
        if episode is not None:
            episode.ui_state = take_checkpoint(replay)
        for event in result.events:
            if event.type in TERMINAL_TYPES:
                session.record_terminal(event)
        handle.subscribe(
            session.nursery,
            partial(self._on_event, session),
            on_stop=partial(self._on_stop, session),
        )
        self._set_connection(ConnectionState.CONNECTED)
        self._apply_load_warnings(session)
        session.notify()
        log.info(
            "event=provider_loaded session=%s blocks=%d last_event_id=%s episode=%s",
            session.session_id,
            len(self.store.blocks),
            result.last_event_id,
            None if episode is None else episode.signature,
        )

    async def _pagination_enabled(self) -> bool:
        if self._pagination_supported is None:
            capabilities = await self.client.capabilities()
            self._pagination_supported = capabilities.supports(PAGINATION_CAPABILITY)
        return self._pagination_supported

    async def _resync(self, session: OpenSession) -> None:
        try:
            await self._load(session, self.history_page_size, initial=False)
        except SessionAbandonedError:
            pass
        except DaemonError as exc:
            # The old subscription resumed; the transcript stays as it was.
            log.warning("event=resync_reload_failed session=%s error=%r", session.session_id, exc)
            self.add_notice(
                Notice(
                    id=RELOAD_FAILED_CODE,
                    code=RELOAD_FAILED_CODE,
                    message="Could not reload the session after the event stream lost continuity.",
                    operation="load_session",
                    debug_message=str(exc),
                )
            )
        finally:
            session.resync_scheduled = False

    # -- live events -----------------------------------------------------------------------------

    async def _on_event(self, session: OpenSession, event: DaemonEvent) -> None:
        if session.closed:
            return
        self._perform(self.store.dispatch(event))
        if event.type in TERMINAL_TYPES:
            # Prompt state settles before the repair check: a waiting prompt() sees its terminal.
            session.record_terminal(event)
            session.notify()
        driver = session.driver
        if event.type == "state_resync_required":
            if driver is not None:
                driver.abort()
            if not session.resync_scheduled and session.nursery is not None:
                session.resync_scheduled = True
                session.nursery.start_soon(self._resync, session)
        elif driver is not None:
            driver.observe(event)
        self._touch()

    def _on_stop(self, session: OpenSession, error: DaemonError) -> None:
        if session.closed:
            return
        log.info("event=provider_stream_stopped session=%s error=%r", session.session_id, error)
        session.stop_error = error
        self._connection_failed(error, initial=True)
        session.notify()

    def _resubscribe(self, session: OpenSession, stopped: SessionHandle) -> None:
        assert session.nursery is not None
        fresh = SessionHandle(
            stopped.client,
            session.session_id,
            last_event_id=stopped.last_event_id,
            epoch=stopped.epoch,
            **stopped.options(),
        )
        if session.driver is not None:
            session.driver.handle = fresh
        session.loaded_handle = fresh
        fresh.subscribe(
            session.nursery,
            partial(self._on_event, session),
            on_stop=partial(self._on_stop, session),
        )
