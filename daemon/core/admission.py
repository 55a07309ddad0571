"""Who gets a connection: the ``--max-connections`` rules. Pure: the shell (``daemon.sockets``)
counts nothing itself, it asks :class:`ConnectionGate` and tells it what became of each
connection.

Below the cap every accepted connection is served. At the cap a new one is refused as it is
accepted, with one exception kept so that a loopback health probe always gets through: a
connection from a loopback address whose first bytes are ``GET /health`` is served in a reserve
slot (a few at once; the server closes it after that one answer). To know those first bytes the
shell peeks at them (without consuming them) for a moment. Connections being refused are
counted against a bound of their own, past which a refused connection is closed at once.
"""

from __future__ import annotations

import ipaddress
from enum import Enum
from typing import Final

#: Loopback connections served over the cap at once (``GET /health`` only, one answer each):
#: a probe may come while the last one's connection is still being closed.
RESERVE_SLOTS: Final = 4
#: Connections being refused (answered 503, then read off until the peer closes) at once; past
#: it a connection over the cap is closed at once.
MAX_PENDING: Final = 64

_HEALTH = b"GET /health"


class Admission(Enum):
    SERVE = "serve"  # under the cap (or no cap): served
    PEEK = "peek"  # over the cap, from loopback: look at its first bytes, then ``after_peek``
    RESERVE = "reserve"  # a loopback GET /health over the cap: served in the reserve slot
    REFUSE = "refuse"  # over the cap: answer 503, read it off until it closes, then close
    DROP = "drop"  # over the cap with too many refusals under way: close at once


def is_loopback_peer(host: str) -> bool:
    """Whether a peer address (``getpeername()[0]``) is a loopback one, an IPv4 loopback address
    mapped into IPv6 included."""
    try:
        addr = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped.is_loopback
    return addr.is_loopback


def asks_for_health(head: bytes) -> bool | None:
    """Whether a connection's first bytes are a ``GET /health`` request line: True, False, or
    ``None`` while they are a strict prefix of one (wait for more)."""
    wanted = _HEALTH + b" "
    if len(head) <= len(_HEALTH):
        return None if _HEALTH.startswith(head) else False
    return head.startswith(wanted) or head.startswith(_HEALTH + b"?")


class ConnectionGate:
    """The counts the admission of a new connection depends on."""

    __slots__ = ("cap", "pending", "refused", "reserved", "served")

    def __init__(self, cap: int = 0) -> None:
        self.cap = cap  # 0: no cap
        self.served = 0  # connections being served under the cap
        self.reserved = 0  # loopback health probes being served over it
        self.pending = 0  # connections being refused (answered, read off, then closed)
        self.refused = 0  # connections refused (or closed at once) since the start

    def admit(self, loopback: bool) -> Admission:
        """What to do with a connection just accepted: ``SERVE`` (call :meth:`enter`), ``PEEK``
        (then :meth:`after_peek`), ``REFUSE`` (:meth:`hold` it until closed, then
        :meth:`release`) or ``DROP`` (counted as refused already)."""
        if self.cap == 0 or self.served < self.cap:
            return Admission.SERVE
        if loopback:
            return Admission.PEEK
        return self._refusal()

    def after_peek(self, health: bool) -> Admission:
        """A loopback connection's first bytes were looked at (``health``: a GET /health):
        ``SERVE`` if a slot freed meanwhile, ``RESERVE`` (call :meth:`enter` with
        ``reserve=True``) for a health probe while the reserve slot is free, else a refusal."""
        if self.served < self.cap:
            return Admission.SERVE
        if health and self.reserved < RESERVE_SLOTS:
            return Admission.RESERVE
        return self._refusal()

    def _refusal(self) -> Admission:
        if self.pending < MAX_PENDING:
            return Admission.REFUSE
        self.refused += 1
        return Admission.DROP

    def enter(self, reserve: bool = False) -> None:
        if reserve:
            self.reserved += 1
        else:
            self.served += 1

    def leave(self, reserve: bool = False) -> None:
        if reserve:
            self.reserved -= 1
        else:
            self.served -= 1

    def hold(self) -> None:
        """A connection is being refused (bounded by ``MAX_PENDING``)."""
        self.pending += 1

    def release(self) -> None:
        """Done refusing a connection: it counts as refused."""
        self.pending -= 1
        self.refused += 1
