"""Prompts sent from this UI: send, then wait for the prompt's terminal on the live stream
(the outcome is read with :func:`sdk.protocol.terminals.terminal_of`, the same as the SDK's
session handle)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sdk.protocol.events import TurnCompleteData
from sdk.protocol.terminals import TerminalOutcome
from webui_model.provider_core import OpenSession
from webui_model.repair_glue import RepairGlue

__all__ = ["Prompts"]


class Prompts(RepairGlue):
    """``prompt()`` and the waits it needs."""

    async def prompt(
        self,
        prompt: str | Sequence[Mapping[str, Any]],
        *,
        deadline_ms: int | None = None,
        idempotency_key: str | None = None,
    ) -> TurnCompleteData:
        """Send a prompt from this UI and wait for its terminal (a repair waits meanwhile).

        The prompt is submitted exactly once (:meth:`sdk._client.DaemonClient.send_prompt`: one
        ``Idempotency-Key``, fresh unless ``idempotency_key`` names it, for all its sends);
        :class:`~sdk._errors.PromptOutcomeUnknownError` says it may have been admitted. Raises :class:`~sdk._errors.TurnError` on ``turn_error``, the subscription's final error
        if it stops first, :class:`SessionAbandonedError` on navigation.
        """
        session = self._require_session()
        session.local_prompts += 1
        terminal: TerminalOutcome | None = None
        try:
            with self._operation(session):
                await self._wait_no_attempt(session)
                owner = self._require_owner(session)
                accepted = await owner.client.send_prompt(
                    session.session_id, prompt, deadline_ms, idempotency_key=idempotency_key)
                terminal = await self._wait_terminal(session, accepted.prompt_id)
        finally:
            session.local_prompts -= 1
            self._idle_point(session)
        assert terminal is not None
        return terminal.result()

    async def _wait_terminal(self, session: OpenSession, prompt_id: str) -> TerminalOutcome:
        while True:
            terminal = session.terminals.get(prompt_id)
            if terminal is not None:
                return terminal
            if session.stop_error is not None:
                raise session.stop_error
            await session.wait_changed()
