"""Validation and the user-facing status text of ``history_truncated`` markers."""

from __future__ import annotations

from typing import Any

import pytest

from sdk._truncation import (
    DaemonHistoryTruncatedData,
    TruncationDebugItem,
    TruncationStatusItem,
    normalize_status_item,
    parse_truncation,
    status_text,
    truncation_marker,
)
from sdk.protocol.envelope import DaemonEvent
from tests.builders.truncation import _DROP, payload

# --- rejected ---------------------------------------------------------------------------------

REJECTED: list[tuple[str, dict[str, Any]]] = [
    ("reason other", payload(reason="window_exceeded")),
    ("reason missing", payload(reason=_DROP)),
    ("reason non-string", payload(reason=1)),
    ("scope empty", payload(scope="")),
    ("scope int", payload(scope=1)),
    ("scope null", payload(scope=None)),
    ("scope list", payload(scope=["live_journal"])),
    ("truncatedEvents missing", payload(truncatedEvents=_DROP)),
    ("truncatedEvents negative", payload(truncatedEvents=-1)),
    ("truncatedEvents fraction", payload(truncatedEvents=1.5)),
    ("truncatedEvents string", payload(truncatedEvents="3")),
    ("truncatedEvents bool", payload(truncatedEvents=True)),
    ("truncatedEvents null", payload(truncatedEvents=None)),
    ("truncatedEvents inf", payload(truncatedEvents=float("inf"))),
    ("truncatedEvents nan", payload(truncatedEvents=float("nan"))),
    ("retainedEvents missing", payload(retainedEvents=_DROP)),
    ("retainedEvents negative", payload(retainedEvents=-1)),
    ("retainedEvents fraction", payload(retainedEvents=1.5)),
    ("retainedEvents string", payload(retainedEvents="3")),
    ("retainedEvents bool", payload(retainedEvents=False)),
    ("maxBytes missing", payload(maxBytes=_DROP)),
    ("maxBytes negative", payload(maxBytes=-1)),
    ("maxBytes fraction", payload(maxBytes=1.5)),
    ("maxBytes string", payload(maxBytes="3")),
    ("maxBytes bool", payload(maxBytes=True)),
    ("maxEvents negative", payload(maxEvents=-1)),
    ("maxEvents fraction", payload(maxEvents=1.5)),
    ("maxEvents string", payload(maxEvents="3")),
    ("maxEvents bool", payload(maxEvents=True)),
    ("maxEvents null", payload(maxEvents=None)),
    ("truncatedTurns negative", payload(truncatedTurns=-1)),
    ("truncatedTurns fraction", payload(truncatedTurns=1.5)),
    ("truncatedTurns string", payload(truncatedTurns="3")),
    ("truncatedTurns bool", payload(truncatedTurns=True)),
    ("full missing", payload(fullTranscriptAvailable=_DROP)),
    ("full yes", payload(fullTranscriptAvailable="yes")),
    ("full one", payload(fullTranscriptAvailable=1)),
    ("full zero", payload(fullTranscriptAvailable=0)),
    ("full null", payload(fullTranscriptAvailable=None)),
]


@pytest.mark.parametrize(("label", "data"), REJECTED, ids=[r[0] for r in REJECTED])
def test_rejected_payloads_are_malformed(label: str, data: dict[str, Any]) -> None:
    assert parse_truncation(data) is None


@pytest.mark.parametrize("data", [None, [], "history_truncated", 3, True])
def test_non_object_payload_is_malformed(data: Any) -> None:
    assert parse_truncation(data) is None


# --- accepted ---------------------------------------------------------------------------------


def test_full_live_marker_is_parsed() -> None:
    marker = parse_truncation(payload(recordId="rec-1", truncatedTurns=2))
    assert marker == DaemonHistoryTruncatedData(
        reason="replay_window_exceeded",
        scope="live_journal",
        truncated_events=4,
        retained_events=2,
        max_bytes=512,
        max_events=10000,
        truncated_turns=2,
        record_id="rec-1",
        full_transcript_available=True,
    )
    assert marker.is_live and marker.is_recoverable_live


def test_scope_absent_is_replay_history_marker() -> None:
    marker = parse_truncation(payload(scope=_DROP))
    assert marker is not None
    assert marker.scope is None and not marker.is_live


def test_other_nonempty_scope_is_allowed() -> None:
    marker = parse_truncation(payload(scope="future_scope"))
    assert marker is not None and marker.scope == "future_scope" and not marker.is_live


@pytest.mark.parametrize(
    "key", ["truncatedEvents", "retainedEvents", "maxBytes", "maxEvents", "truncatedTurns"]
)
def test_integral_float_counts_are_accepted_as_int(key: str) -> None:
    marker = parse_truncation(payload(**{key: 3.0}))
    assert marker is not None
    attr = {
        "truncatedEvents": "truncated_events",
        "retainedEvents": "retained_events",
        "maxBytes": "max_bytes",
        "maxEvents": "max_events",
        "truncatedTurns": "truncated_turns",
    }[key]
    value = getattr(marker, attr)
    assert value == 3 and type(value) is int


@pytest.mark.parametrize("key", ["truncatedEvents", "retainedEvents", "maxBytes"])
def test_zero_counts_are_accepted(key: str) -> None:
    assert parse_truncation(payload(**{key: 0})) is not None


def test_optional_fields_absent() -> None:
    marker = parse_truncation(payload(maxEvents=_DROP))
    assert marker is not None
    assert marker.max_events is None and marker.truncated_turns is None
    assert marker.record_id is None


@pytest.mark.parametrize("record_id", [5, None, True, ["r"], {"id": "r"}])
def test_non_string_record_id_is_treated_as_absent(record_id: Any) -> None:
    marker = parse_truncation(payload(recordId=record_id))
    assert marker is not None and marker.record_id is None


@pytest.mark.parametrize("full", [True, False])
def test_full_transcript_available_strict_bool(full: bool) -> None:
    marker = parse_truncation(payload(fullTranscriptAvailable=full))
    assert marker is not None and marker.full_transcript_available is full


def test_unknown_keys_are_kept_not_rejected() -> None:
    marker = parse_truncation(payload(futureField={"a": [1, 2]}, note="x"))
    assert marker is not None
    assert marker.extra == {"futureField": {"a": [1, 2]}, "note": "x"}


def test_direct_construction_enforces_invariants() -> None:
    with pytest.raises(ValueError, match="truncated_events"):
        DaemonHistoryTruncatedData(
            reason="replay_window_exceeded",
            truncated_events=True,
            retained_events=1,
            max_bytes=1,
            full_transcript_available=True,
        )
    with pytest.raises(ValueError, match="scope"):
        DaemonHistoryTruncatedData(
            reason="replay_window_exceeded",
            scope="",
            truncated_events=1,
            retained_events=1,
            max_bytes=1,
            full_transcript_available=True,
        )


# --- status text -------------------------------------------------------------------------------


def text_for(**overrides: Any) -> str:
    marker = parse_truncation(payload(**overrides))
    assert marker is not None
    return status_text(marker)


def test_spec_example_exact() -> None:
    assert text_for() == (
        "History truncated for live turn replay: kept the latest 2 source events and dropped 4 "
        "older source events (limits: 10000 replay entries / 512 bytes). Complete content "
        "remains available after the turn finishes."
    )


STATUS_CASES: list[tuple[str, dict[str, Any], str]] = [
    (
        "live full maxEvents",
        {},
        "History truncated for live turn replay: kept the latest 2 source events and dropped 4 older source events (limits: 10000 replay entries / 512 bytes). Complete content remains available after the turn finishes.",
    ),
    (
        "live notfull maxEvents",
        {"fullTranscriptAvailable": False},
        "History truncated for live turn replay: kept the latest 2 source events and dropped 4 older source events (limits: 10000 replay entries / 512 bytes). Complete content is not available for automatic recovery.",
    ),
    (
        "live full nomax",
        {"maxEvents": _DROP},
        "History truncated for live turn replay: kept the latest 2 source events and dropped 4 older source events (limits: 512 bytes). Complete content remains available after the turn finishes.",
    ),
    (
        "live notfull nomax",
        {"maxEvents": _DROP, "fullTranscriptAvailable": False},
        "History truncated for live turn replay: kept the latest 2 source events and dropped 4 older source events (limits: 512 bytes). Complete content is not available for automatic recovery.",
    ),
    (
        "replay full maxEvents",
        {"scope": _DROP},
        "History truncated in replay history: kept the latest 2 events and dropped 4 older replay events (limits: 10000 events / 512 bytes). Older content remains available from the full transcript.",
    ),
    (
        "replay notfull maxEvents",
        {"scope": _DROP, "fullTranscriptAvailable": False},
        "History truncated in replay history: kept the latest 2 events and dropped 4 older replay events (limits: 10000 events / 512 bytes). Older content is not available from a full transcript.",
    ),
    (
        "replay full nomax",
        {"scope": _DROP, "maxEvents": _DROP},
        "History truncated in replay history: kept the latest 2 events and dropped 4 older replay events (limits: 512 bytes). Older content remains available from the full transcript.",
    ),
    (
        "replay notfull nomax",
        {"scope": _DROP, "maxEvents": _DROP, "fullTranscriptAvailable": False},
        "History truncated in replay history: kept the latest 2 events and dropped 4 older replay events (limits: 512 bytes). Older content is not available from a full transcript.",
    ),
    (
        "other full maxEvents",
        {"scope": "archive"},
        "History truncated: kept the latest 2 events and dropped 4 older replay events (limits: 10000 events / 512 bytes). Full transcript content remains available.",
    ),
    (
        "other notfull maxEvents",
        {"scope": "archive", "fullTranscriptAvailable": False},
        "History truncated: kept the latest 2 events and dropped 4 older replay events (limits: 10000 events / 512 bytes). Full transcript content is not available.",
    ),
    (
        "other full nomax",
        {"scope": "archive", "maxEvents": _DROP},
        "History truncated: kept the latest 2 events and dropped 4 older replay events (limits: 512 bytes). Full transcript content remains available.",
    ),
    (
        "other notfull nomax",
        {"scope": "archive", "maxEvents": _DROP, "fullTranscriptAvailable": False},
        "History truncated: kept the latest 2 events and dropped 4 older replay events (limits: 512 bytes). Full transcript content is not available.",
    ),
]


@pytest.mark.parametrize(
    ("label", "overrides", "expected"), STATUS_CASES, ids=[c[0] for c in STATUS_CASES]
)
def test_status_text_every_branch(label: str, overrides: dict[str, Any], expected: str) -> None:
    assert text_for(**overrides) == expected


def test_numbers_print_as_plain_integers() -> None:
    text = text_for(truncatedEvents=4.0, retainedEvents=2.0, maxBytes=8388608.0, maxEvents=10000.0)
    assert "(limits: 10000 replay entries / 8388608 bytes)" in text
    assert "kept the latest 2 source events and dropped 4 older" in text
    assert ".0" not in text and "," not in text.split("(limits:")[1].split(")")[0]


# --- normalized status item ---------------------------------------------------------------------


def test_normalized_item_keeps_complete_payload_unmodified() -> None:
    data = payload(recordId="rec-9", futureField={"nested": True}, maxBytes=512.0)
    original = dict(data)
    event = DaemonEvent(type="history_truncated", data=data, prompt_id="p-1")
    item = normalize_status_item(event)
    assert isinstance(item, TruncationStatusItem)
    assert item.source == "history_truncated"
    assert item.kind == "status"
    assert item.data == original
    assert item.data is data
    assert item.data["futureField"] == {"nested": True}
    assert item.data["maxBytes"] == 512.0
    assert item.prompt_id == "p-1"
    assert item.event_id is None
    assert item.text == status_text(item.marker)
    assert item.text.startswith("History truncated for live turn replay: kept the latest 2 ")


def test_normalized_item_carries_event_id() -> None:
    event = DaemonEvent(type="history_truncated", id=17, data=payload(scope=_DROP))
    item = normalize_status_item(event)
    assert isinstance(item, TruncationStatusItem)
    assert item.event_id == 17 and item.prompt_id is None
    assert item.text.startswith("History truncated in replay history:")


@pytest.mark.parametrize("data", [payload(maxEvents=-1), payload(truncatedEvents="3"), None, ["x"]])
def test_malformed_payload_becomes_debug_item(data: Any) -> None:
    event = DaemonEvent(type="history_truncated", id=3, data=data, prompt_id="p-2")
    item = normalize_status_item(event)
    assert isinstance(item, TruncationDebugItem)
    assert item.kind == "debug"
    assert item.reason == "malformed_payload"
    assert item.text == "history_truncated: malformed history_truncated payload"
    assert item.data == data
    assert item.prompt_id == "p-2" and item.event_id == 3


# --- truncation_marker(event): the typed path the docs show --------------------------------------------


def test_truncation_of_an_event_is_its_typed_marker_or_none() -> None:
    marker = truncation_marker(DaemonEvent(type="history_truncated", id=3, data=payload()))
    assert isinstance(marker, DaemonHistoryTruncatedData)
    assert status_text(marker).startswith("History truncated for live turn replay: kept the "
                                          "latest 2 source events and dropped 4")
    assert truncation_marker(DaemonEvent(type="history_truncated", data=payload(maxBytes=-1))) is None
    assert truncation_marker(DaemonEvent(type="turn_complete", data={"stopReason": "end_turn"})) is None
    # A payload that looks like a marker on another event type is not one.
    assert truncation_marker(DaemonEvent(type="session_closed", data=payload())) is None
