"""Client ids: which ones this daemon minted and which sessions each is registered on.

A create, load or resume registers its caller on a session: an id the daemon minted earlier is
kept, anything else is replaced by a fresh one. Prompt and cancel are accepted only from an id
registered on that session. Both sets are bounded: a session remembers its newest
``per_session_cap`` registrations (a use by prompt or cancel counts as new), and an id is known
only while some live session holds it, so a client that loads a session a million times without
sending its id costs a bounded amount of memory, and a removed session takes its ids with it.
An id forgotten that way is simply unknown again: its next load gets a fresh id.

Pure: the caller mints ids (``mint``) and tells the registry when a session goes away.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Final

__all__ = ["DEFAULT_PER_SESSION_CAP", "ClientRegistry"]

DEFAULT_PER_SESSION_CAP: Final = 4096


class ClientRegistry:
    """Registrations of client ids on sessions, bounded per session."""

    def __init__(self, per_session_cap: int = DEFAULT_PER_SESSION_CAP) -> None:
        if per_session_cap < 1:
            raise ValueError("per_session_cap must be at least 1")
        self.per_session_cap = per_session_cap
        self._sessions: dict[str, OrderedDict[str, None]] = {}
        # id -> number of sessions it is registered on (an id is known while this is > 0)
        self._holders: dict[str, int] = {}

    def __len__(self) -> int:
        """How many distinct ids are known now."""
        return len(self._holders)

    def is_known(self, client_id: str) -> bool:
        return client_id in self._holders

    def register(self, session_id: str, hint: str | None, mint: Callable[[], str]) -> str:
        """Register the caller on ``session_id``: a known ``hint`` is kept, else ``mint()``."""
        client_id = hint if hint is not None and hint in self._holders else mint()
        ids = self._sessions.setdefault(session_id, OrderedDict())
        if client_id in ids:
            ids.move_to_end(client_id)
            return client_id
        ids[client_id] = None
        self._holders[client_id] = self._holders.get(client_id, 0) + 1
        if len(ids) > self.per_session_cap:
            oldest, _ = ids.popitem(last=False)
            self._release(oldest)
        return client_id

    def is_registered(self, session_id: str, client_id: str) -> bool:
        """Whether ``client_id`` may act on ``session_id``; a yes counts as a fresh use."""
        ids = self._sessions.get(session_id)
        if ids is None or client_id not in ids:
            return False
        ids.move_to_end(client_id)
        return True

    def detach(self, session_id: str, client_id: str) -> None:
        """The client leaves the session (no-op when it was not registered there)."""
        ids = self._sessions.get(session_id)
        if ids is not None and client_id in ids:
            del ids[client_id]
            self._release(client_id)
            if not ids:
                del self._sessions[session_id]

    def drop_session(self, session_id: str) -> None:
        """The session is gone: its registrations go with it."""
        for client_id in self._sessions.pop(session_id, ()):
            self._release(client_id)

    def session_clients(self, session_id: str) -> int:
        """How many ids are registered on ``session_id``."""
        return len(self._sessions.get(session_id, ()))

    def _release(self, client_id: str) -> None:
        left = self._holders[client_id] - 1
        if left:
            self._holders[client_id] = left
        else:
            del self._holders[client_id]
