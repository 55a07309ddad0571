"""``history_truncated`` validation details pinned down by mutation testing:
zero as a float, an empty prompt id, and every invariant of direct construction, by name."""

from __future__ import annotations

from typing import Any

import pytest

from sdk._truncation import (
    DaemonHistoryTruncatedData,
    TruncationStatusItem,
    normalize_status_item,
    parse_truncation,
)
from sdk.protocol.envelope import DaemonEvent
from tests.builders.truncation import payload


@pytest.mark.parametrize("key", ["truncatedEvents", "maxEvents", "truncatedTurns"])
def test_a_zero_float_count_is_zero(key: str) -> None:
    marker = parse_truncation(payload(**{key: 0.0}))
    assert marker is not None


def test_an_empty_prompt_id_is_no_prompt_id() -> None:
    item = normalize_status_item(DaemonEvent(type="history_truncated", data=payload(),
                                             prompt_id=""))
    assert isinstance(item, TruncationStatusItem)
    assert item.prompt_id is None


def _make(**overrides: Any) -> DaemonHistoryTruncatedData:
    fields: dict[str, Any] = {
        "reason": "replay_window_exceeded", "truncated_events": 1, "retained_events": 1,
        "max_bytes": 1, "full_transcript_available": True}
    fields.update(overrides)
    return DaemonHistoryTruncatedData(**fields)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"reason": "other"}, "history_truncated reason must be 'replay_window_exceeded'"),
        ({"scope": ""}, "history_truncated scope must be a non-empty string"),
        ({"truncated_events": -1}, "history_truncated truncated_events must be an integer >= 0"),
        ({"retained_events": "1"}, "history_truncated retained_events must be an integer >= 0"),
        ({"max_bytes": True}, "history_truncated max_bytes must be an integer >= 0"),
        ({"max_events": -1},
         "history_truncated max_events must be an integer >= 0"),
        ({"truncated_turns": True},
         "history_truncated truncated_turns must be an integer >= 0"),
        ({"max_events": 1.5},
         "history_truncated max_events must be an integer >= 0"),
        ({"full_transcript_available": 1},
         "history_truncated fullTranscriptAvailable must be a boolean"),
    ],
)
def test_direct_construction_refuses_each_violation_by_name(
    overrides: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError) as info:
        _make(**overrides)
    # The message names the broken field (a wording suffix may follow).
    assert str(info.value).startswith(message)


def test_direct_construction_accepts_zero_counts() -> None:
    marker = _make(truncated_events=0, retained_events=0, max_bytes=0, max_events=0,
                   truncated_turns=0)
    assert (marker.max_events, marker.truncated_turns) == (0, 0)
