"""The provider reads a prompt's end with the same outcome type as the SDK's session handle:
a ``turn_error`` whose payload does not fit its Struct (a numeric agent code) still raises
:class:`TurnError` with its code and message (the provider's own copy used to drop both)."""

from __future__ import annotations

import pytest

from sdk._client import DaemonClient
from sdk._errors import TurnError
from sdk.protocol.envelope import DaemonEvent
from sdk.protocol.events import TurnCompleteData
from sdk.protocol.terminals import TerminalOutcome
from webui_model.provider import WebUIProvider
from webui_model.provider_core import OpenSession

pytestmark = pytest.mark.anyio


async def test_a_recorded_malformed_turn_error_keeps_code_and_message() -> None:
    session = OpenSession("s")
    session.record_terminal(DaemonEvent(
        type="turn_error", prompt_id="p",
        data={"sessionId": "s", "promptId": "p", "code": -32603, "message": "internal"},
    ))
    async with DaemonClient("http://127.0.0.1:9") as client:
        provider = WebUIProvider(client)
        outcome = await provider._wait_terminal(session, "p")
    assert isinstance(outcome, TerminalOutcome)
    with pytest.raises(TurnError) as info:
        outcome.result()
    assert (info.value.code, info.value.message, info.value.prompt_id) == (
        "-32603", "internal", "p")


def test_terminals_are_recorded_by_data_prompt_id_only() -> None:
    session = OpenSession("s")
    session.record_terminal(DaemonEvent(type="session_update", data={"promptId": "p"}))
    session.record_terminal(DaemonEvent(type="turn_complete", prompt_id="p", data={}))
    assert session.terminals == {}
    session.record_terminal(DaemonEvent(
        type="turn_complete", data={"promptId": "p", "stopReason": "cancelled"}))
    assert session.terminals["p"].result() == TurnCompleteData(
        prompt_id="p", stop_reason="cancelled")
