"""Repair glue: the provider's side of the live-journal repair.

The :class:`~sdk._repair_driver.RepairDriver` decides *when*; this job answers its guards, keeps
the episode's :class:`~webui_model.repair_commit.Checkpoint` (adopting the one a commit computed
for the next episode, mirroring loaded pages and provider status blocks into it), and commits a
candidate with one ``store.reset``.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from sdk._repair import RepairEpisode, RepairGuards, RepairNotice
from sdk._repair_driver import RepairCandidate, RepairOutcome, RepairOutcomeKind
from sdk.protocol.constants import TERMINAL_TYPES
from webui_model.blocks import MessageBlock
from webui_model.provider_core import (
    PROVIDER_SOURCE,
    ConnectionState,
    OpenSession,
    ProviderCore,
    log,
)
from webui_model.repair_commit import (
    Checkpoint,
    build_repair,
    make_is_new,
    mirror_status,
)
from webui_model.side_channels import notice_from_repair

__all__ = ["RepairGlue"]


class RepairGlue(ProviderCore):
    """Checkpoints, guards and the repair commit."""

    @property
    def episode(self) -> RepairEpisode | None:
        """The live repair episode of the current session, if any."""
        session = self._session
        if session is None or session.driver is None:
            return None
        return session.driver.episode

    @property
    def checkpoint(self) -> Checkpoint | None:
        """The current episode's checkpoint (what a repair would start from)."""
        session = self._session
        return None if session is None else self._episode_checkpoint(session)

    def guards(self) -> RepairGuards:
        """The repair guards as they stand for the current session."""
        session = self._session
        if session is None:
            return RepairGuards(current_session_id=None, navigation_in_flight=self._navigating > 0)
        return self._guards_for(session)

    async def wait_repair(self) -> RepairOutcome | None:
        """Wait until the current session's repair episode ends; return how its attempt ended.

        The outcome says what happened (``REPAIRED``, ``FAILED``, ``AUTH_FAILED``,
        ``MISSING_SESSION``, or ``ABORTED`` when navigation or a reload cancelled a running
        attempt). Returns None at once when no episode is live, and None when the episode ends
        without an attempt: a configured reload, a resync or navigation removed it, or the
        event stream stopped before the target's terminal arrived. An attempt that already
        ended is not waited for again: read :attr:`repair_outcomes` for the history.
        """
        session = self._session
        driver = None if session is None else session.driver
        if driver is None:
            return None
        # The driver answers None at once when nothing could end with an outcome.
        return await driver.wait_outcome(len(driver.outcomes) + 1)

    def _apply_load_warnings(self, session: OpenSession) -> None:
        if self._load_warnings is None:
            return
        shown = {
            block.text
            for block in self.store.blocks
            if isinstance(block, MessageBlock) and block.kind == "status"
        }
        for text in self._load_warnings():
            if not text or text in shown:
                continue
            block = self.store.add_status(text, source=PROVIDER_SOURCE)
            shown.add(text)
            self._mirror(session, partial(mirror_status, block=block))

    # -- repair ------------------------------------------------------------------------------------

    def _guards_for(self, session: OpenSession) -> RepairGuards:
        current = self._session is session and not session.closed
        return RepairGuards(
            current_session_id=session.session_id if current else None,
            load_in_flight=session.loads > 0,
            resume_in_flight=session.resumes > 0,
            navigation_in_flight=self._navigating > 0,
            page_request_in_flight=session.page_requests > 0,
            local_prompt_in_flight=session.local_prompts > 0,
        )

    def _idle_point(self, session: OpenSession) -> None:
        if not session.closed and session.driver is not None:
            session.driver.check()
        self._touch()

    def _episode_checkpoint(self, session: OpenSession) -> Checkpoint | None:
        episode = None if session.driver is None else session.driver.episode
        return None if episode is None else self._adopt(session, episode)

    def _adopt(self, session: OpenSession, episode: RepairEpisode) -> Checkpoint | None:
        """The episode's checkpoint, taking over the one a repair commit computed for it."""
        pending = session.next_checkpoint
        if episode.ui_state is None and pending is not None and (
            pending.prompt_id is None or pending.prompt_id == episode.prompt_id
        ):
            episode.ui_state = pending
            session.next_checkpoint = None
        state = episode.ui_state
        return state if isinstance(state, Checkpoint) else None

    def _mirror(self, session: OpenSession, update: Callable[[Checkpoint], Checkpoint]) -> None:
        episode = None if session.driver is None else session.driver.episode
        if episode is not None:
            checkpoint = self._adopt(session, episode)
            if checkpoint is not None:
                episode.ui_state = update(checkpoint)
        if session.next_checkpoint is not None:
            session.next_checkpoint = update(session.next_checkpoint)

    def _commit_repair(self, session: OpenSession, candidate: RepairCandidate) -> None:
        """The driver's ``commit``: raising rejects the candidate (one failure notice)."""
        self._require_current(session)
        checkpoint = self._adopt(session, candidate.episode)
        if checkpoint is None:
            raise RuntimeError(
                f"repair episode {candidate.episode.signature!r} has no checkpoint: the replayed "
                "marker was not the one the driver targets"
            )
        build = build_repair(
            self.store.snapshot_state(),
            checkpoint,
            candidate.events,
            candidate.suffix_start,
            make_is_new(candidate.observed_ids, candidate.watermark, candidate.highest_live_id),
            self.store.configured_max_blocks,
        )
        self.store.reset(build.state)
        self._perform(build.side_effects)
        if not build.from_checkpoint:
            session.generation += 1
        session.next_checkpoint = build.checkpoint
        for event in candidate.events:
            if event.type in TERMINAL_TYPES:
                session.record_terminal(event)
        self._apply_load_warnings(session)
        log.info(
            "event=live_journal_repaired session=%s signature=%s from_checkpoint=%s blocks=%d",
            session.session_id,
            candidate.episode.signature,
            build.from_checkpoint,
            len(self.store.blocks),
        )

    def _repair_notice(self, session: OpenSession, notice: RepairNotice) -> None:
        if not session.closed:
            self.add_notice(notice_from_repair(notice))

    def _repair_outcome(self, session: OpenSession, outcome: RepairOutcome) -> None:
        self.repair_attempts += 1
        self.repair_outcomes.append(outcome)
        if not session.closed:
            if outcome.kind is RepairOutcomeKind.REPAIRED:
                self._episode_checkpoint(session)
                self._set_connection(ConnectionState.CONNECTED)
            elif outcome.kind is RepairOutcomeKind.AUTH_FAILED:
                self._set_connection(ConnectionState.AUTH_FAILED)
            elif outcome.kind is RepairOutcomeKind.MISSING_SESSION:
                self._set_connection(ConnectionState.DISCONNECTED, missing_session=True)
            session.notify()
        self._idle_point(session)

    async def _wait_no_attempt(self, session: OpenSession) -> None:
        # A prompt sent mid-attempt would wait on a handle the attempt is about to replace.
        while session.driver is not None and session.driver.attempting:
            await session.wait_changed()
