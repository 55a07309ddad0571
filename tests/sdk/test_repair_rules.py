"""The pure repair rules: target, signature, suffix validation, "is new", the episode."""

from __future__ import annotations

from typing import Any

import pytest

from sdk._repair import (
    EpisodeRegistry,
    RepairGuards,
    RepairNotice,
    RepairState,
    RepairTarget,
    RepairValidationError,
    SuffixResult,
    find_repair_target,
    find_suffix_start,
    is_new_event,
    repair_failure_notice,
    repair_signature,
    validate_fresh_snapshot,
)
from sdk.protocol.envelope import DaemonEvent
from tests.builders.repair import SID, P, chunk, done, make_episode, marker, user

Q = "prompt-B"


def failed(ident: int | None, prompt_id: str) -> DaemonEvent:
    return DaemonEvent(
        type="turn_error",
        id=ident,
        prompt_id=prompt_id,
        data={"sessionId": SID, "message": "boom", "code": "channel_closed", "promptId": prompt_id},
    )


def cancelled_notice(ident: int | None, prompt_id: str) -> DaemonEvent:
    return DaemonEvent(
        type="prompt_cancelled", id=ident, prompt_id=prompt_id, data={"sessionId": SID}
    )


# --- target detection ---------------------------------------------------------------------------


def test_marker_prompt_id_is_preferred() -> None:
    journal = [marker(P), chunk(25, Q), chunk(26, Q)]
    target = find_repair_target(SID, journal, 26, False)
    assert target is not None
    assert target.prompt_id == P
    assert target.marker is journal[0]
    assert target.marker_data.truncated_events == 24
    assert target.signature == f"{SID}:{P}:26:24"


def test_reference_sample_shape() -> None:
    # samples/load-mid-turn-live-journal-truncated.json, reduced to what matters.
    pid = "4b4d6d19-07db-4710-98d1-89d044580c3a"
    journal = [marker(pid, truncatedEvents=24), chunk(26, pid)]
    target = find_repair_target("d4c9", journal, 26, False)
    assert isinstance(target, RepairTarget)
    assert target.marker is journal[0]
    assert target.prompt_id == pid
    assert target.signature == f"d4c9:{pid}:26:24"
    assert target.marker_data.max_events == 4 and target.marker_data.is_recoverable_live


@pytest.mark.parametrize("stamp", [None, ""])
def test_unique_retained_prompt_id_fallback(stamp: str | None) -> None:
    journal = [marker(stamp), chunk(25, P), chunk(26, P, in_data=True), chunk(27, None)]
    target = find_repair_target(SID, journal, 27, False)
    assert target is not None and target.prompt_id == P


def test_two_retained_prompt_ids_decline() -> None:
    journal = [marker(None), chunk(25, P), chunk(26, Q)]
    assert find_repair_target(SID, journal, 26, False) is None


def test_envelope_and_data_prompt_ids_both_count_toward_ambiguity() -> None:
    journal = [marker(None), chunk(25, P), chunk(26, Q, in_data=True)]
    assert find_repair_target(SID, journal, 26, False) is None


def test_zero_retained_prompt_ids_decline() -> None:
    journal = [marker(None), chunk(25, None)]
    assert find_repair_target(SID, journal, 25, False) is None


def test_degraded_snapshot_declines() -> None:
    assert find_repair_target(SID, [marker(P), chunk(25, P)], 25, True) is None


def test_no_marker_no_target() -> None:
    assert find_repair_target(SID, [chunk(1, P), chunk(2, P)], 2, False) is None
    assert find_repair_target(SID, [], None, False) is None


@pytest.mark.parametrize(
    "overrides",
    [
        {"fullTranscriptAvailable": False},
        {"maxEvents": -1},
        {"maxEvents": 1.5},
        {"maxEvents": "3"},
        {"truncatedEvents": "24"},
        {"retainedEvents": "2"},
        {"maxBytes": "4096"},
        {"truncatedEvents": True},
        {"reason": "other"},
        {"scope": ""},
        {"scope": "archive"},
        {"fullTranscriptAvailable": "yes"},
    ],
)
def test_non_recoverable_or_invalid_marker_declines(overrides: dict[str, Any]) -> None:
    assert find_repair_target(SID, [marker(P, **overrides), chunk(25, P)], 25, False) is None


def test_replay_history_marker_is_not_a_live_target() -> None:
    m = marker(None)
    assert isinstance(m.data, dict)
    del m.data["scope"]
    assert find_repair_target(SID, [m, chunk(25, P)], 25, False) is None


def test_first_recoverable_marker_is_used() -> None:
    journal = [marker(Q, fullTranscriptAvailable=False), marker(P, truncatedEvents=9), chunk(3, P)]
    target = find_repair_target(SID, journal, 3, False)
    assert target is not None and target.prompt_id == P and target.marker is journal[1]


# --- signature ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("last_event_id", "truncated", "expected"),
    [
        (26, 24, "s:p:26:24"),
        (None, 24, "s:p:unknown:24"),
        (26, None, "s:p:26:unknown"),
        (26, "24", "s:p:26:unknown"),
        (26, True, "s:p:26:unknown"),
        (0, 0, "s:p:0:0"),
        (5, 3.0, "s:p:5:3"),
        (None, None, "s:p:unknown:unknown"),
    ],
)
def test_signature_format(last_event_id: int | None, truncated: Any, expected: str) -> None:
    assert repair_signature("s", "p", last_event_id, truncated) == expected


def test_target_signature_with_unknown_cursor_and_zero_truncation() -> None:
    target = find_repair_target(SID, [marker(P, truncatedEvents=0), chunk(1, P)], None, False)
    assert target is not None and target.signature == f"{SID}:{P}:unknown:0"


# --- suffix and fresh-snapshot validation --------------------------------------------------------


def test_suffix_starts_at_first_target_input_and_runs_to_the_end() -> None:
    events = [user(1, Q), done(2, Q), user(3, P), user(4, P), chunk(5, P), done(6, P), user(7, Q)]
    assert find_suffix_start(events, P) == 2
    result = validate_fresh_snapshot(events[:4], events[4:], False, P)
    assert isinstance(result, SuffixResult)
    assert result.start == 2
    assert result.events == events
    assert result.suffix == events[2:]


def test_post_terminal_compaction_is_found_in_compacted_replay() -> None:
    compacted = [user(2, P), chunk(22, P), done(23, P)]
    result = validate_fresh_snapshot(compacted, [], False, P)
    assert isinstance(result, SuffixResult) and result.start == 0 and result.suffix == compacted


@pytest.mark.parametrize("terminal", ["turn_complete", "cancelled", "turn_error", "data_only"])
def test_each_formal_terminal_completes_the_turn(terminal: str) -> None:
    end = {
        "turn_complete": done(9, P),
        "cancelled": done(9, P, "cancelled"),
        "turn_error": failed(9, P),
        "data_only": done(9, P, envelope=False),
    }[terminal]
    assert find_suffix_start([user(1, P), chunk(2, P), end], P) == 0


@pytest.mark.parametrize(
    "events",
    [
        pytest.param([chunk(2, P), done(3, P)], id="missing-input"),
        pytest.param([user(1, P), chunk(2, P)], id="missing-terminal"),
        pytest.param([user(1, P), chunk(2, P), done(3, Q)], id="other-prompt-terminal"),
        pytest.param([user(1, Q), chunk(2, P), done(3, P)], id="other-prompt-input"),
        pytest.param([done(1, P), user(2, P)], id="terminal-before-input"),
        pytest.param([user(1, P), cancelled_notice(2, P)], id="prompt-cancelled-is-not-terminal"),
        pytest.param([], id="empty"),
    ],
)
def test_incomplete_turn_is_rejected(events: list[DaemonEvent]) -> None:
    assert find_suffix_start(events, P) is None
    result = validate_fresh_snapshot(events, [], False, P)
    assert isinstance(result, RepairValidationError)
    assert result.reason == "incomplete_turn"
    assert str(result) == "Fresh replay does not contain the complete target turn"


def test_degraded_fresh_replay_is_rejected() -> None:
    result = validate_fresh_snapshot([user(1, P), done(2, P)], [], True, P)
    assert isinstance(result, RepairValidationError)
    assert result.reason == "degraded"
    assert result.message == "Fresh replay is degraded"


def test_input_in_compacted_and_terminal_in_live_journal() -> None:
    result = validate_fresh_snapshot([chunk(1, Q), user(2, P)], [chunk(3, P), done(4, P)], False, P)
    assert isinstance(result, SuffixResult) and result.start == 1


# --- "is new" -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("event_id", "expected", "why"),
    [
        (None, False, "id-less events never repeat side effects"),
        (8, False, "observed in the snapshot's live journal"),
        (12, False, "observed, and also inside the live interval"),
        (11, False, "delivered live after the snapshot (watermark, highest]"),
        (13, False, "upper bound of the live interval is inclusive"),
        (3, True, "evicted before the client ever saw it"),
        (10, True, "at the watermark but never observed: evicted"),
        (14, True, "newer than anything observed"),
    ],
)
def test_is_new_event(event_id: int | None, expected: bool, why: str) -> None:
    assert is_new_event(event_id, {8, 9, 12}, 10, 13) is expected, why


def test_is_new_without_live_events_after_snapshot() -> None:
    assert is_new_event(11, set(), 10, None) is True
    assert is_new_event(11, set(), None, None) is True
    assert is_new_event(11, {11}, None, None) is False


# --- the episode ---------------------------------------------------------------------------------


IDLE = RepairGuards(current_session_id=SID)


def test_episode_fields() -> None:
    episode = make_episode()
    assert episode.state is RepairState.PENDING
    assert episode.session_id == SID and episode.prompt_id == P
    assert episode.signature == f"{SID}:{P}:26:24"
    assert episode.observed_ids == frozenset({25, 26})
    assert episode.watermark == 26 and episode.highest_live_id is None
    assert not episode.terminal_seen and not episode.attempted
    assert episode.ui_state is None
    episode.ui_state = {"checkpoint": object()}
    assert "checkpoint" in episode.ui_state


@pytest.mark.parametrize(
    "terminal",
    [
        pytest.param(done(30, P), id="end_turn"),
        pytest.param(done(30, P, "cancelled"), id="cancelled"),
        pytest.param(failed(30, P), id="turn_error"),
        pytest.param(done(30, P, envelope=False), id="data-promptId-only"),
    ],
)
def test_matching_terminal_arms(terminal: DaemonEvent) -> None:
    episode = make_episode()
    assert not episode.should_attempt(IDLE)
    assert episode.observe_live(chunk(27, P)) is False
    assert episode.observe_live(terminal) is True
    assert episode.state is RepairState.ARMED and episode.terminal_seen
    assert episode.highest_live_id == 30
    assert episode.should_attempt(IDLE)


@pytest.mark.parametrize(
    "event",
    [
        pytest.param(done(30, Q), id="other-prompt-turn_complete"),
        pytest.param(failed(30, Q), id="other-prompt-turn_error"),
        pytest.param(cancelled_notice(30, P), id="prompt_cancelled"),
        pytest.param(chunk(30, P), id="chunk"),
        pytest.param(user(30, P), id="user-input"),
    ],
)
def test_non_arming_events(event: DaemonEvent) -> None:
    episode = make_episode()
    assert episode.observe_live(event) is False
    assert episode.state is RepairState.PENDING and not episode.terminal_seen
    assert not episode.should_attempt(IDLE)
    assert episode.highest_live_id == 30


def test_highest_live_id_only_grows_and_ignores_idless() -> None:
    episode = make_episode()
    episode.observe_live(chunk(40, P))
    episode.observe_live(chunk(35, P))
    episode.observe_live(DaemonEvent(type="slow_client_warning", data={}))
    assert episode.highest_live_id == 40
    assert episode.is_new(38) is False  # delivered live after the snapshot
    assert episode.is_new(25) is False  # observed in the snapshot
    assert episode.is_new(20) is True  # evicted before it was seen
    assert episode.is_new(41) is True


@pytest.mark.parametrize(
    "guards",
    [
        RepairGuards(current_session_id=SID, load_in_flight=True),
        RepairGuards(current_session_id=SID, resume_in_flight=True),
        RepairGuards(current_session_id=SID, navigation_in_flight=True),
        RepairGuards(current_session_id=SID, page_request_in_flight=True),
        RepairGuards(current_session_id=SID, local_prompt_in_flight=True),
        RepairGuards(current_session_id="other-session"),
        RepairGuards(current_session_id=None),
    ],
)
def test_each_guard_delays_the_attempt(guards: RepairGuards) -> None:
    episode = make_episode()
    episode.observe_live(done(30, P))
    assert not episode.should_attempt(guards)
    assert episode.should_attempt(IDLE)  # the re-check at the next idle point succeeds


def test_attempted_at_most_once() -> None:
    episode = make_episode()
    episode.observe_live(done(30, P))
    episode.mark_attempted()
    assert episode.attempted and episode.state is RepairState.RELOADING
    assert not episode.should_attempt(IDLE)
    with pytest.raises(RuntimeError, match="cannot start an attempt"):
        episode.mark_attempted()
    episode.finish()
    assert episode.state.name == "NONE"
    assert episode.observe_live(done(31, P)) is False
    assert not episode.should_attempt(IDLE)


def test_mark_attempted_requires_armed() -> None:
    with pytest.raises(RuntimeError, match="PENDING"):
        make_episode().mark_attempted()


def test_new_episode_with_attempted_signature_is_not_rearmed() -> None:
    registry = EpisodeRegistry()
    first = make_episode(registry)
    first.observe_live(done(30, P))
    first.mark_attempted()
    first.finish()
    assert registry.was_attempted(first.signature)

    again = make_episode(registry)
    assert again.signature == first.signature
    assert again.attempted
    assert again.observe_live(done(30, P)) is False
    assert again.state is RepairState.PENDING
    assert not again.should_attempt(IDLE)


def test_registry_does_not_block_other_signatures() -> None:
    registry = EpisodeRegistry()
    first = make_episode(registry)
    first.observe_live(done(30, P))
    first.mark_attempted()
    target = find_repair_target(SID, [marker(Q), chunk(40, Q)], 40, False)
    assert target is not None
    other = registry.new_episode(SID, target, [40], 40)
    assert other.observe_live(done(41, Q)) is True
    assert other.should_attempt(IDLE)


def test_unattempted_episode_leaves_registry_empty() -> None:
    registry = EpisodeRegistry()
    episode = make_episode(registry)
    episode.observe_live(done(30, P))
    episode.finish()  # aborted before an attempt (navigation): may be re-armed later
    assert not registry.was_attempted(episode.signature)


# --- failure notice --------------------------------------------------------------------------------


def test_failure_notice() -> None:
    notice = repair_failure_notice("s:p:26:24", "Fresh replay is degraded")
    assert notice == RepairNotice(
        id="daemon.live_journal_repair.failed:s:p:26:24",
        severity="warning",
        category="connection",
        operation="load_session",
        code="daemon.live_journal_repair.failed",
        recoverable=True,
        message="Could not restore the complete turn. The retained replay remains visible.",
        debug_message="Fresh replay is degraded",
    )
