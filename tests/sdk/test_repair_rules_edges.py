"""SDK repair-rule details pinned down by mutation testing: the
signature of a fractional count, what counts as the target's user input, and an episode's
initial and final slots."""

from __future__ import annotations

from sdk._repair import EpisodeRegistry, RepairState, find_suffix_start, repair_signature
from sdk.protocol.envelope import DaemonEvent
from tests.builders.repair import SID, P, done, make_episode, user


def test_a_fractional_count_is_written_as_is_in_the_signature() -> None:
    assert repair_signature(SID, P, 9, 2.5) == f"{SID}:{P}:9:2.5"
    assert repair_signature(SID, P, 9, 3.0) == f"{SID}:{P}:9:3"


def test_only_a_session_update_user_chunk_starts_the_suffix() -> None:
    lookalike = DaemonEvent(type="pending_prompt_added", id=1, prompt_id=P, data={
        "sessionId": SID, "update": {"sessionUpdate": "user_message_chunk"}})
    events = [lookalike, user(2, P), done(3, P)]
    assert find_suffix_start(events, P) == 1
    odd = DaemonEvent(type="session_update", id=1, prompt_id=P, data=["not", "an", "object"])
    assert find_suffix_start([odd, user(2, P), done(3, P)], P) == 1


def test_an_episode_starts_with_empty_slots_and_finishing_clears_the_attempt_scope() -> None:
    episode = make_episode(EpisodeRegistry())
    assert episode.watermark == 26
    assert episode.terminal_seen is False
    assert episode.attempt_scope is None
    episode.attempt_scope = object()
    episode.finish()
    assert episode.attempt_scope is None
    assert episode.state is RepairState.NONE
