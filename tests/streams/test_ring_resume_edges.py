"""Ring and resume details pinned down by mutation testing: a gap of one
event, the oldest held id, a single replay event over the budget, ``next_id`` validation and
the server timestamp on every synthetic frame."""

from __future__ import annotations

import json

import pytest

from daemon.core.ring import EventRing, decide_resume
from tests.builders.ring import EPOCH, NOW, filled


def test_a_cursor_just_two_below_the_oldest_held_id_is_a_gap() -> None:
    ring = filled(6, capacity=3)  # holds 4..6
    assert ring.first_id == 4
    plan = decide_resume(ring, 2, EPOCH, EPOCH, now_ms=NOW)  # event 3 is gone
    assert [e.type for e in plan.before] == ["state_resync_required"]
    assert json.loads(plan.before[0].raw)["data"]["reason"] == "ring_evicted"
    assert [e.id for e in plan.replay] == [4, 5, 6]
    plan = decide_resume(ring, 3, EPOCH, EPOCH, now_ms=NOW)  # nothing missing
    assert plan.before == [] and [e.id for e in plan.replay] == [4, 5, 6]


def test_the_oldest_held_event_can_be_looked_up() -> None:
    ring = filled(6, capacity=3)
    assert [ring.get(i) is not None for i in range(2, 8)] == [
        False, False, True, True, True, False]
    oldest = ring.get(4)
    assert oldest is not None and oldest.id == 4


def test_a_single_event_over_the_budget_is_replayed_without_a_resync() -> None:
    ring = filled(3, pads=[0, 0, 500])
    plan = decide_resume(ring, 2, EPOCH, EPOCH, now_ms=NOW, budget_bytes=100)
    assert [e.id for e in plan.replay] == [3]
    assert [e.type for e in plan.after] == ["replay_complete"]


@pytest.mark.parametrize("next_id", [0, 1.5, True, "2"])
def test_next_id_must_be_an_int_of_at_least_one(next_id: object) -> None:
    with pytest.raises(ValueError, match=r"^event ring next_id must be an int >= 1, got "):
        EventRing(10, next_id=next_id)  # type: ignore[arg-type]


def _stamp(raw: bytes) -> object:
    return json.loads(raw).get("_meta", {}).get("serverTimestamp")


def test_every_synthetic_resume_frame_carries_the_server_timestamp() -> None:
    seeded = EventRing(10, next_id=8)  # a restored bus: ids up to 7 exist, none held
    evicted = filled(6, capacity=3)
    over = filled(3, pads=[300, 300, 300])
    plans = [
        decide_resume(seeded, 2, EPOCH, EPOCH, now_ms=NOW),  # seeded_replay_not_in_ring
        decide_resume(evicted, 1, EPOCH, EPOCH, now_ms=NOW),  # ring_evicted
        decide_resume(evicted, 1, "other", EPOCH, now_ms=NOW),  # epoch_reset
        decide_resume(over, 0, EPOCH, EPOCH, now_ms=NOW, budget_bytes=400),  # budget
    ]
    reasons = [[json.loads(f.raw)["data"].get("reason") for f in p.frames() if f.id is None]
               for p in plans]
    assert reasons == [
        ["seeded_replay_not_in_ring", None], ["ring_evicted", None], ["epoch_reset", None],
        ["replay_budget_exceeded", None]]
    for plan in plans:
        for frame in plan.frames():
            if frame.id is None:
                assert _stamp(frame.raw) == NOW, json.loads(frame.raw)
