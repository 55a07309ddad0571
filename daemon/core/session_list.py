"""``GET /sessions``: the order of the list, its opaque cursor, and one page merged from the
sessions in memory and the sessions stored.

The list is ordered by :data:`ListKey` (created at, then session id), newest first. A session's
key never changes and a new session's key is larger than every existing one (barring a clock
step back), so a client paging with cursors sees each session that existed when it started
exactly once, whatever is created, loaded or unloaded meanwhile. The cursor is the last listed
session's key, encoded; the daemon keeps no state per listing.

Pure: no I/O.
"""

from __future__ import annotations

import base64
import binascii
import heapq
import re
from bisect import bisect_left, insort
from collections.abc import Iterable, Iterator, Sequence
from typing import Final, TypeVar

__all__ = ["ListIndex", "ListKey", "decode_cursor", "encode_cursor", "merge_page", "newest"]

#: (created at in ms since the epoch, session id): the order of ``GET /sessions``, descending.
ListKey = tuple[int, str]
_CURSOR_VERSION: Final = "s1"
_CURSOR_BODY: Final = re.compile(r"s1:(0|[1-9][0-9]{0,17}):([0-9A-Za-z._:-]{1,128})")

T = TypeVar("T")


def encode_cursor(key: ListKey) -> str:
    """The cursor after ``key`` (opaque to clients: base64url, no padding)."""
    text = f"{_CURSOR_VERSION}:{key[0]}:{key[1]}".encode()
    return base64.urlsafe_b64encode(text).rstrip(b"=").decode("ascii")


def decode_cursor(cursor: str) -> ListKey:
    """The key a cursor of :func:`encode_cursor` holds; ``ValueError`` for anything else."""
    if not cursor.isascii() or len(cursor) > 256:
        raise ValueError("not a sessions cursor")
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode("ascii")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise ValueError("not a sessions cursor") from None
    found = _CURSOR_BODY.fullmatch(text)
    if found is None:
        raise ValueError("not a sessions cursor")
    return int(found.group(1)), found.group(2)


class ListIndex:
    """Keys kept in the list's order, so that a page is found without looking at the sessions
    before it: :meth:`below` starts at the cursor by bisection and yields newest first.

    A new session's key is the largest, so adding it appends; a restored (older) one is
    inserted in place, and a removal deletes in place (both a bisection and one move of the
    pointers after it, a ``memmove``, not a pass in Python)."""

    __slots__ = ("_keys",)

    def __init__(self) -> None:
        self._keys: list[ListKey] = []

    def __len__(self) -> int:
        return len(self._keys)

    def add(self, key: ListKey) -> None:
        keys = self._keys
        if not keys or key > keys[-1]:
            keys.append(key)
        else:
            at = bisect_left(keys, key)
            if at == len(keys) or keys[at] != key:
                insort(keys, key)

    def discard(self, key: ListKey) -> None:
        keys = self._keys
        at = bisect_left(keys, key)
        if at < len(keys) and keys[at] == key:
            del keys[at]

    def below(self, before: ListKey | None = None) -> Iterator[ListKey]:
        """The keys below ``before`` (all when ``None``), largest first. The index must not
        change while this is iterated."""
        keys = self._keys
        at = len(keys) if before is None else bisect_left(keys, before)
        for i in range(at - 1, -1, -1):
            yield keys[i]


def newest(items: Iterable[tuple[ListKey, T]], count: int,
           before: ListKey | None = None) -> list[tuple[ListKey, T]]:
    """The ``count`` items with the largest keys below ``before`` (all when ``None``), largest
    first: O(n log count)."""
    if before is not None:
        items = (item for item in items if item[0] < before)
    return heapq.nlargest(count, items, key=lambda item: item[0])


def merge_page(live: Sequence[tuple[ListKey, T]], stored: Sequence[tuple[ListKey, T]],
               limit: int) -> tuple[list[T], ListKey | None]:
    """One page from two lists sorted largest key first, each holding at least ``limit + 1``
    items after the cursor when it has that many (a session in both lists, the same key, is
    taken from ``live``). Returns the page's items and the cursor key of the next page (``None``:
    this is the last page)."""
    seen: set[str] = set()
    merged: list[tuple[ListKey, T]] = []
    for key, item in heapq.merge(live, stored, key=lambda pair: pair[0], reverse=True):
        if key[1] in seen:
            continue
        seen.add(key[1])
        merged.append((key, item))
        if len(merged) > limit:
            break
    if len(merged) > limit:
        return [item for _, item in merged[:limit]], merged[limit - 1][0]
    return [item for _, item in merged], None
