"""The pure rules of GET /sessions: the cursor round-trips and refuses anything else; a page
merged from the live and the stored sessions is exactly the brute-force page, and paging with
the cursors lists every session once, in order."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from daemon.core.session_list import (
    ListIndex,
    ListKey,
    decode_cursor,
    encode_cursor,
    merge_page,
    newest,
)

keys = st.tuples(st.integers(0, 50), st.sampled_from("abcdefgh"))


@given(st.integers(0, 10**17), st.from_regex(r"[0-9A-Za-z._:-]{1,128}", fullmatch=True))
def test_a_cursor_round_trips(ms: int, sid: str) -> None:
    assert decode_cursor(encode_cursor((ms, sid))) == (ms, sid)


@pytest.mark.parametrize("bad", ["", "x", "!!!!", "s1:1:a", encode_cursor((1, "a"))[:-1] + "$",
                                 "czE6LTE6YQ",  # s1:-1:a
                                 "czI6MTph",  # s2:1:a
                                 "czE6MTo",  # s1:1: (no id)
                                 "é" * 4, "A" * 300])
def test_anything_else_is_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        decode_cursor(bad)


def _page_all(live: list[ListKey], stored: list[ListKey], limit: int) -> list[list[str]]:
    """Every page, as a client pages (each source gives its limit + 1 below the cursor)."""
    pages: list[list[str]] = []
    before: ListKey | None = None
    while True:
        page, before = merge_page(newest(((k, k[1]) for k in live), limit + 1, before),
                                  newest(((k, k[1]) for k in stored), limit + 1, before),
                                  limit)
        pages.append(page)
        if before is None:
            return pages


@given(st.lists(keys, unique_by=lambda k: k[1]), st.data(), st.integers(1, 4))
def test_paging_the_merge_lists_every_session_once_in_order(
        sessions: list[ListKey], data: st.DataObject, limit: int) -> None:
    # Each session is live, stored, or both (live and stored with the same key).
    where = [data.draw(st.sampled_from(["live", "stored", "both"])) for _ in sessions]
    live = [k for k, w in zip(sessions, where, strict=True) if w in ("live", "both")]
    stored = [k for k, w in zip(sessions, where, strict=True) if w in ("stored", "both")]
    pages = _page_all(live, stored, limit)
    assert all(len(page) <= limit for page in pages)
    assert all(pages[:-1]), "only the last page may be empty"
    listed = [sid for page in pages for sid in page]
    assert listed == [k[1] for k in sorted(sessions, reverse=True)]


@given(st.lists(st.tuples(st.booleans(), keys)), st.lists(st.one_of(st.none(), keys)))
def test_the_index_pages_as_sorting_every_key_would(ops: list[tuple[bool, ListKey]],
                                                     cursors: list[ListKey | None]) -> None:
    index = ListIndex()
    present: set[ListKey] = set()
    for adding, key in ops:  # adds in any order (restored sessions are older), removes
        if adding:
            index.add(key)
            present.add(key)
        else:
            index.discard(key)
            present.discard(key)
    assert len(index) == len(present)
    for before in [None, *cursors]:
        assert list(index.below(before)) == sorted(
            (k for k in present if before is None or k < before), reverse=True)
