"""Idempotent prompt admission: what a request with an ``Idempotency-Key`` is checked against.

Pure. A prompt admitted with a key is remembered with the fingerprint of its request body and
the 202 body it was answered with; a later request with the same key on the same session is
answered from that memory (:class:`Replay`) when its body has the same fingerprint, refused
(:class:`Conflict`, 409 ``idempotency_key_reused``) when not, and admitted as new only when no
prompt of the session was ever admitted with the key. The transcript stores the same three
things with the admission, so the answer survives a restart and a takeover; this module is the
session's bounded memory of the newest of them, which spares a store read for every keyed
prompt of a session that has not lived anywhere else.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Final

import msgspec

from sdk.protocol.http import PromptAccepted

__all__ = ["MAX_REMEMBERED_KEYS", "AdmissionKeys", "Conflict", "KeyedAdmission", "Replay",
           "decide", "request_digest"]

#: Keyed admissions a live session keeps in memory; older ones are read from the transcript.
MAX_REMEMBERED_KEYS: Final = 1024

_canonical: Final = msgspec.json.Encoder(order="sorted").encode


def request_digest(body: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of the request body in a canonical form (keys sorted at every level,
    compact): the same request sent again, however its JSON was laid out, has the same
    digest; a changed field, block or ``deadlineMs`` has another."""
    return hashlib.sha256(_canonical(body)).hexdigest()


class KeyedAdmission(msgspec.Struct, frozen=True):
    """A prompt admitted with ``key``: the digest of its request, the 202 body it got and
    when (ms since the epoch)."""

    key: str
    digest: str
    accepted: PromptAccepted
    admitted_at: int | None = None


class Replay(msgspec.Struct, frozen=True):
    """Answer the earlier admission's 202 body again; admit nothing."""

    accepted: PromptAccepted


class Conflict(msgspec.Struct, frozen=True):
    """The key was used for a different request (409 ``idempotency_key_reused``)."""

    prompt_id: str


def decide(found: KeyedAdmission | None, digest: str) -> Replay | Conflict | None:
    """What a keyed request whose body has ``digest`` gets, given the admission already made
    with its key (``None``: none, so the request is admitted as new)."""
    if found is None:
        return None
    if found.digest != digest:
        return Conflict(found.accepted.prompt_id)
    return Replay(found.accepted)


class AdmissionKeys:
    """One live session's newest keyed admissions, at most ``capacity`` of them.

    ``complete`` says that every keyed admission the session ever had is here: true for a
    session created on this bus until the first one is forgotten, false for a restored or
    taken-over session (its history is in the transcript). A miss in a complete memory means
    "never admitted"; any other miss must be looked up in the transcript.
    """

    __slots__ = ("_by_key", "_withdrawn", "capacity", "complete")

    def __init__(self, *, complete: bool, capacity: int = MAX_REMEMBERED_KEYS) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.complete = complete
        self._by_key: OrderedDict[str, KeyedAdmission] = OrderedDict()
        # Keys whose admission was withdrawn (answered 503, never run): a request with one
        # of them is admitted as new, whatever the transcript holds of the withdrawn one.
        self._withdrawn: set[str] = set()

    def __len__(self) -> int:
        return len(self._by_key)

    def get(self, key: str) -> KeyedAdmission | None:
        return self._by_key.get(key)

    def remember(self, admission: KeyedAdmission) -> None:
        """Keep ``admission`` (a newer one for the same key is made only once the older was
        withdrawn: see :func:`decide` and :meth:`withdraw`);
        the oldest is forgotten past ``capacity``, and the memory is then no longer complete."""
        by_key = self._by_key
        self._withdrawn.discard(admission.key)
        by_key[admission.key] = admission
        by_key.move_to_end(admission.key)
        if len(by_key) > self.capacity:
            by_key.popitem(last=False)
            self.complete = False

    def withdraw(self, key: str) -> None:
        """The admission made with ``key`` was refused after all (cluster mode: answered 503,
        it never runs): the key is free again, and a miss for it means "admit as new"."""
        self._by_key.pop(key, None)
        self._withdrawn.add(key)
        if len(self._withdrawn) > self.capacity:
            self._withdrawn.pop()

    def withdrawn(self, key: str) -> bool:
        """Was the newest admission with ``key`` withdrawn (see :meth:`withdraw`)?"""
        return key in self._withdrawn
