"""Prompt terminals pinned down by mutation testing: the builders' payloads and refusals, the
outcome read from a typed or a malformed terminal, and matching a terminal to its prompt."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from sdk._errors import TurnError
from sdk.protocol.envelope import DaemonEvent, decode_event, encode_envelope
from sdk.protocol.events import TurnCompleteData, TurnErrorData
from sdk.protocol.terminals import (
    TerminalFields,
    TerminalOutcome,
    is_terminal,
    terminal_fields,
    terminal_for,
    terminal_of,
    turn_complete,
    turn_error,
)


def test_builders_fill_every_field() -> None:
    assert turn_complete("s", "p") == TurnCompleteData(
        session_id="s", prompt_id="p", stop_reason="end_turn")
    assert turn_complete("s", "p", "cancelled").stop_reason == "cancelled"
    assert turn_error("s", "p", "channel_closed", "gone") == TurnErrorData(
        session_id="s", prompt_id="p", code="channel_closed", message="gone")
    assert msgspec.json.encode(turn_complete("s", "p")) == (
        b'{"sessionId":"s","stopReason":"end_turn","promptId":"p"}')


@pytest.mark.parametrize("build", [lambda: turn_complete("s", ""),
                                   lambda: turn_error("s", "", "c", "m")])
def test_builders_refuse_a_missing_prompt_id(build: Any) -> None:
    with pytest.raises(ValueError, match=r"^a terminal needs its prompt id$"):
        build()


def _event(kind: str, data: Any) -> DaemonEvent:
    event = decode_event(encode_envelope(kind, data))
    assert event is not None
    return event


def test_is_terminal() -> None:
    assert is_terminal(DaemonEvent(type="turn_complete"))
    assert is_terminal(DaemonEvent(type="turn_error"))
    assert not is_terminal(DaemonEvent(type="prompt_cancelled"))


def test_fields_of_typed_terminals() -> None:
    error = _event("turn_error", {"sessionId": "s", "promptId": "p", "code": "c", "message": "m"})
    assert terminal_fields(error) == TerminalFields(code="c", message="m", session_id="s")
    done = _event("turn_complete", {"sessionId": "s", "promptId": "p", "stopReason": "max"})
    assert terminal_fields(done) == TerminalFields(stop_reason="max", session_id="s")


def test_fields_of_malformed_terminals_keep_what_is_certain() -> None:
    error = _event("turn_error", {"sessionId": "s", "promptId": "p", "code": -32603,
                                  "message": "internal", "stopReason": "x"})
    assert error.payload is None
    assert terminal_fields(error) == TerminalFields(
        stop_reason="x", code="-32603", message="internal")
    odd = _event("turn_error", {"promptId": "p", "code": None, "message": 5, "stopReason": 1,
                                "sessionId": 3})
    assert terminal_fields(odd) == TerminalFields()
    assert terminal_fields(_event("turn_complete", ["p"])) == TerminalFields()


def test_outcome_of_a_turn_error() -> None:
    outcome = terminal_of(_event("turn_error", {"sessionId": "s", "promptId": "p",
                                                "code": "c", "message": "m"}))
    assert outcome == TerminalOutcome(prompt_id="p", type="turn_error", code="c", message="m",
                                      session_id="s")
    assert outcome.failed
    with pytest.raises(TurnError) as info:
        outcome.result()
    assert (info.value.code, info.value.message, info.value.prompt_id) == ("c", "m", "p")


def test_a_turn_error_without_a_readable_message_fails_with_the_fallback() -> None:
    outcome = terminal_of(_event("turn_error", {"promptId": "p", "code": 7, "message": None}))
    assert outcome is not None and outcome.message is None and outcome.code == "7"
    with pytest.raises(TurnError) as info:
        outcome.result()
    assert (info.value.code, info.value.message, info.value.prompt_id) == ("7", "turn failed", "p")
    empty = TerminalOutcome(prompt_id="p", type="turn_error", message="")
    with pytest.raises(TurnError) as info:
        empty.result()
    assert info.value.message == ""


def test_outcome_of_a_turn_complete() -> None:
    outcome = terminal_of(_event("turn_complete", {"sessionId": "s", "promptId": "p",
                                                   "stopReason": "max_tokens"}))
    assert outcome == TerminalOutcome(prompt_id="p", type="turn_complete",
                                      stop_reason="max_tokens", session_id="s")
    assert not outcome.failed
    assert outcome.result() == TurnCompleteData(prompt_id="p", stop_reason="max_tokens",
                                                session_id="s")
    bare = TerminalOutcome(prompt_id="p", type="turn_complete")
    assert bare.result() == TurnCompleteData(prompt_id="p", stop_reason="end_turn")
    malformed = terminal_of(_event("turn_complete", {"promptId": "p", "stopReason": 3}))
    assert malformed == TerminalOutcome(prompt_id="p", type="turn_complete")


@pytest.mark.parametrize(
    ("kind", "data"),
    [("session_update", {"promptId": "p"}), ("turn_complete", {}), ("turn_complete", None),
     ("turn_error", {"promptId": ""}), ("turn_error", {"promptId": 3})],
)
def test_no_outcome_without_a_terminal_naming_a_prompt(kind: str, data: Any) -> None:
    assert terminal_of(_event(kind, data)) is None
    assert terminal_for(_event(kind, data), "p") is None


def test_terminal_for_matches_its_prompt_only() -> None:
    event = _event("turn_complete", {"promptId": "p"})
    assert terminal_for(event, "p") == TerminalOutcome(prompt_id="p", type="turn_complete",
                                                       stop_reason="end_turn")
    assert terminal_for(event, "q") is None
    assert terminal_for(DaemonEvent(type="turn_complete", prompt_id="p", data={}), "p") is None
