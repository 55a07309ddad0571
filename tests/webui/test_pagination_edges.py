"""History-pagination details pinned down by mutation testing: the
transient-error notice, a good page clearing a latched error, the defaults and bounds of the
initial state, and re-anchoring after a rebuild."""

from __future__ import annotations

import pytest

from tests.builders.webui_replay import agent, user
from webui_model.effects import Notice
from webui_model.pagination import (
    HistoryPage,
    PageError,
    PaginationState,
    after_page,
    after_page_error,
    initial_pagination,
    reanchored,
)


def test_a_transient_page_error_keeps_the_state_and_raises_one_notice() -> None:
    state = PaginationState(enabled=True, has_more=True, anchor_record_id="r")
    after, notice = after_page_error(state, PageError(message="timed out", status=503))
    assert after is state
    assert notice == Notice(
        id="daemon.transcript_history.failed", code="daemon.transcript_history.failed",
        severity="warning", category="connection", operation="load_transcript_page",
        recoverable=True, message="Could not load older messages. Try again.",
        debug_message="timed out")


def test_a_good_page_clears_a_latched_error() -> None:
    state = PaginationState(enabled=True, has_more=True, anchor_record_id="r9",
                            pagination_error="boom")
    page = HistoryPage(events=[user("q", "r5")], has_more=True)
    after = after_page(state, page, block_count=1, configured_max_blocks=10)
    assert after.pagination_error is None
    assert (after.anchor_record_id, after.has_more, after.loaded_pages) == ("r5", True, 1)


def test_initial_pagination_defaults_and_bounds() -> None:
    events = [user("q", "r1"), agent("a", "r2")]
    state = initial_pagination(events, enabled=True, page_size=1)
    assert state == PaginationState(enabled=True, anchor_record_id="r1", has_more=False,
                                    page_size=1)
    assert initial_pagination(events, enabled=True, history_has_more=True).has_more is True
    assert initial_pagination(events, enabled=False, history_has_more=True) == PaginationState(
        anchor_record_id="r1")
    with pytest.raises(ValueError, match=r"^page_size must be >= 1, got 0$"):
        initial_pagination(events, enabled=True, page_size=0)


def test_reanchoring_starts_at_the_first_record_id_of_the_rebuild() -> None:
    paged = PaginationState(enabled=True, has_more=False, anchor_record_id="old", cursor="c",
                            loaded_pages=3, page_size=7, pagination_error="x")
    events = [agent("no record"), user("q", "r4"), agent("a", "r5")]
    state = reanchored(paged, events, block_count=3, configured_max_blocks=10)
    assert state == PaginationState(enabled=True, anchor_record_id="r4", has_more=True,
                                    page_size=7)
    assert reanchored(paged, events, block_count=10, configured_max_blocks=10).has_more is False
    assert reanchored(paged, [agent("none")], block_count=1, configured_max_blocks=10) == (
        PaginationState(enabled=True, page_size=7))
    off = PaginationState(enabled=False, page_size=7)
    assert reanchored(off, events, block_count=1, configured_max_blocks=10) == PaginationState(
        anchor_record_id="r4", page_size=7)
