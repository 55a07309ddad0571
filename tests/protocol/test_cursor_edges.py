"""The resume cursor's rules pinned down by mutation testing: which values are cursors, which
frames move it, what an epoch reset and the daemon's epoch answer do, and its read-only view."""

from __future__ import annotations

import pytest

from sdk.protocol.constants import MAX_EVENT_ID
from sdk.protocol.cursor import FollowsCursor, ResumeCursor, check_cursor, is_epoch_reset
from sdk.protocol.envelope import DaemonEvent


@pytest.mark.parametrize("good", [None, 0, 1, MAX_EVENT_ID])
def test_usable_cursors_are_returned_as_given(good: int | None) -> None:
    assert check_cursor(good) == good
    assert ResumeCursor(good).last_event_id == good


@pytest.mark.parametrize("bad", [-1, MAX_EVENT_ID + 1, True, False, 1.0, "1"])
def test_other_values_are_refused_by_name(bad: object) -> None:
    with pytest.raises(ValueError) as info:
        check_cursor(bad)  # type: ignore[arg-type]
    assert str(info.value) == f"last_event_id must be an int in 0..2^53-1, got {bad!r}"


def _resync(reason: object) -> DaemonEvent:
    return DaemonEvent(type="state_resync_required", data={"reason": reason})


def test_only_an_epoch_reset_resync_is_an_epoch_reset() -> None:
    assert is_epoch_reset(_resync("epoch_reset"))
    assert not is_epoch_reset(_resync("ring_evicted"))
    assert not is_epoch_reset(_resync(5))  # malformed payload
    assert not is_epoch_reset(DaemonEvent(type="session_update", data={"reason": "epoch_reset"}))


def test_observe_moves_to_the_max_id_and_ignores_idless_frames() -> None:
    cursor = ResumeCursor()
    cursor.observe(DaemonEvent(type="x"))
    assert cursor.last_event_id is None
    cursor.observe(DaemonEvent(type="x", id=5))
    assert cursor.last_event_id == 5
    cursor.observe(DaemonEvent(type="x", id=5))
    cursor.observe(DaemonEvent(type="x", id=3))
    assert cursor.last_event_id == 5
    cursor.observe(DaemonEvent(type="x", id=6))
    assert cursor.last_event_id == 6


def test_an_epoch_reset_restarts_at_zero_then_its_own_id_counts() -> None:
    cursor = ResumeCursor(40, "e1")
    cursor.observe(_resync("epoch_reset"))
    assert cursor.last_event_id == 0
    cursor.observe(DaemonEvent(type="x", id=2))
    assert cursor.last_event_id == 2
    with_id = DaemonEvent(type="state_resync_required", id=1, data={"reason": "epoch_reset"})
    cursor.observe(with_id)
    assert cursor.last_event_id == 1
    other = ResumeCursor(40)
    other.observe(_resync("ring_evicted"))
    assert other.last_event_id == 40


def test_the_epoch_is_the_latest_non_empty_answer() -> None:
    cursor = ResumeCursor(epoch="e1")
    assert (cursor.last_event_id, cursor.epoch) == (None, "e1")
    assert ResumeCursor().epoch is None
    cursor.answered(None)
    cursor.answered("")
    assert cursor.epoch == "e1"
    cursor.answered("e2")
    assert cursor.epoch == "e2"
    assert repr(cursor) == "ResumeCursor(last_event_id=None, epoch='e2')"


def test_a_follower_shows_its_cursor() -> None:
    class Reader(FollowsCursor):
        def __init__(self) -> None:
            self.cursor = ResumeCursor(7, "e")

    reader = Reader()
    assert (reader.last_event_id, reader.epoch) == (7, "e")
    reader.cursor.observe(DaemonEvent(type="x", id=9))
    reader.cursor.answered("f")
    assert (reader.last_event_id, reader.epoch) == (9, "f")
