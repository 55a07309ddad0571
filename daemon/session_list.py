"""The sessions, listed: ``GET /sessions`` (paged, loaded and unloaded) and the bounded session
part of ``GET /daemon/status``.

A page is merged from the live sessions (in memory) and the stored ones (the transcript's
``sessions`` table, read in the writer's worker thread) by the pure
:mod:`daemon.core.session_list`: each source gives its ``limit + 1`` newest below the cursor.
The status lists at most :data:`~sdk.protocol.http.STATUS_SESSIONS_MAX` live sessions, the
newest loaded first, found without looking at the others; its totals are counters kept as
things change.

In cluster mode a node lists the sessions it runs (its live ones): its local store also holds
sessions another node has since taken over, so it is not a list of anything this node could
answer for.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Final

import msgspec
from msgspec import UNSET

from sdk.protocol import http as wire

from .core.session_list import ListKey, decode_cursor, encode_cursor, merge_page, newest
from .core.transcript_ops import SessionRow
from .manager import SessionManager, canonical_workspace, iso_from_ms
from .metrics import totals as metric_totals
from .workspace_git import branches

if TYPE_CHECKING:
    from .session import Session

__all__ = ["InvalidListQuery", "list_page", "state_of", "status_sessions", "totals"]


class InvalidListQuery(ValueError):
    """A ``GET /sessions`` parameter the daemon refuses: ``code`` is the 400's machine code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def state_of(session: Session) -> wire.SessionState:
    return wire.session_state(session.active is not None, len(session.queue))


def status_sessions(manager: SessionManager) -> list[Session]:
    """The live sessions ``GET /daemon/status`` lists: the newest loaded first, at most
    ``STATUS_SESSIONS_MAX`` (the table keeps load order, so this looks at no other session)."""
    out: list[Session] = []
    for session in reversed(manager.sessions.values()):
        if session.live:
            out.append(session)
            if len(out) >= wire.STATUS_SESSIONS_MAX:
                break
    return out


def totals(manager: SessionManager) -> wire.SessionTotals:
    """Counts kept as things change (no pass over the sessions)."""
    return wire.SessionTotals(sessions=manager.live_count,
                              unloaded_sessions=len(manager.unloaded),
                              subscribers=sum(metric_totals.subscribers.values()))


_BAD_CURSOR: Final = ("invalid_sessions_cursor", "cursor is not a nextCursor of GET /sessions")
_QUERY_ERRORS: Final = {
    "limit": ("invalid_sessions_limit",
              f"limit must be an integer between 1 and {wire.MAX_PAGE_SIZE}"),
    "cursor": _BAD_CURSOR,
    "workspace": ("invalid_sessions_workspace", "workspace must be an absolute path"),
    "state": ("invalid_sessions_state",
              f"state must be one of {', '.join(wire.SESSION_STATES)}"),
}
_FIELD: Final = re.compile(r"\$\.(\w+)")


def parse_query(args: Mapping[str, str]) -> tuple[wire.SessionsQuery, ListKey | None,
                                                   str | None]:
    """The query (read through its Struct), the cursor's key and the canonical workspace;
    :class:`InvalidListQuery` names the first parameter refused."""
    try:
        query = msgspec.convert(dict(args), wire.SessionsQuery, strict=False)
    except msgspec.ValidationError as exc:
        found = _FIELD.search(str(exc))
        code, message = _QUERY_ERRORS.get(found.group(1) if found else "",
                                          ("invalid_sessions_limit", str(exc)))
        raise InvalidListQuery(code, message) from None
    key = None
    if isinstance(query.cursor, str):
        try:
            key = decode_cursor(query.cursor)
        except ValueError:
            raise InvalidListQuery(*_BAD_CURSOR) from None
    canonical = None
    if isinstance(query.workspace, str):
        try:
            canonical = canonical_workspace(query.workspace)
        except ValueError:
            canonical = query.workspace  # gone or never there: its stored sessions still match
    return query, key, canonical


def _live(manager: SessionManager, workspace: str | None, state: str | None,
          before: ListKey | None, want: int) -> list[tuple[ListKey, Session]]:
    """The ``want`` newest live sessions below ``before`` that pass the filters, newest first,
    found from the manager's indexes: a page looks at the sessions of its page, the ones not
    live any more and, for ``state=idle``, the busy ones it passes, never at every session."""
    if state in ("running", "queued"):
        return newest((((session.created_ms, session.id), session)
                       for session in manager.occupied()
                       if state_of(session) == state
                       and (workspace is None or session.workspace_cwd == workspace)),
                      want, before)
    index = manager.order if workspace is None else manager.order_by_workspace.get(workspace)
    out: list[tuple[ListKey, Session]] = []
    if index is None:
        return out
    sessions = manager.sessions
    for key in index.below(before):
        session = sessions[key[1]]
        if not session.live or (state is not None and state_of(session) != state):
            continue
        out.append((key, session))
        if len(out) >= want:
            break
    return out


def _listing(session: Session, git: dict[str, str | None]) -> wire.SessionListing:
    activity = session.bus.last_activity_ms
    return wire.SessionListing(
        session_id=session.id, workspace_cwd=session.workspace_cwd, state=state_of(session),
        has_active_prompt=session.active is not None, pending_prompts=len(session.queue),
        subscribers=len(session.bus.subscribers), last_event_id=session.bus.ring.last_id,
        created_at=session.created_at,
        last_activity_at=iso_from_ms(activity) if activity is not None else session.created_at,
        git_branch=git.get(session.workspace_cwd))


def _unloaded(row: SessionRow) -> wire.SessionListing:
    return wire.SessionListing(
        session_id=row.session_id, workspace_cwd=row.workspace_cwd, state="unloaded",
        has_active_prompt=False, pending_prompts=0, subscribers=0, last_event_id=None,
        created_at=iso_from_ms(row.created_at_ms), last_activity_at=None, git_branch=None)


async def list_page(manager: SessionManager, args: Mapping[str, str]) -> wire.SessionList:
    """One page of ``GET /sessions``; raises :class:`InvalidListQuery`."""
    query, before, workspace = parse_query(args)
    state = query.state if isinstance(query.state, str) else None
    want = query.limit + 1
    stored: list[tuple[ListKey, Session | SessionRow]] = []
    writer = manager.writer
    if writer is not None and manager.config.cluster_redis is None and state in (None,
                                                                                 "unloaded"):
        # Read first: a session loaded meanwhile is then found live below (and listed once).
        # The live table itself, not a copy of its keys per request (a lookup is atomic).
        skip: Collection[str] = manager.sessions.keys() if state == "unloaded" else ()
        rows = await writer.read(lambda store: store.sessions_before(
            before, want, workspace, skip=skip))
        stored = [((row.created_at_ms, row.session_id), row) for row in rows]
    live: list[tuple[ListKey, Session | SessionRow]] = []
    if state != "unloaded":
        live = list(_live(manager, workspace, state, before, want))
    page, next_key = merge_page(live, stored, query.limit)
    git = await branches(item.workspace_cwd for item in page
                         if not isinstance(item, SessionRow))
    return wire.SessionList(
        sessions=[_unloaded(item) if isinstance(item, SessionRow) else _listing(item, git)
                  for item in page],
        has_more=next_key is not None,
        next_cursor=encode_cursor(next_key) if next_key is not None else UNSET)
