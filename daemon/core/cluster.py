"""Cluster mode's rules as data: the Redis keys of a session, its directory entry, the lease and
fencing scripts, and where a request for a session goes. Pure: no Redis client, no clock (times
are passed in), no randomness; :mod:`daemon.cluster` is the shell that runs these against Redis.

Every key of one session carries the hash tag ``{sessionId}``, so on a Redis Cluster they live in
one slot and each script below touches one slot only (a requirement of Redis Cluster scripts).

Ownership: a session's owner holds its lease key (value ``"<nodeId> <generation>"``, with a TTL of
``--lease-ms``) and its directory entry names the owner and the generation. A claim succeeds
when the lease is free (never taken, expired, or already the caller's) and raises the
generation by one. Every append to the session's op log and event stream carries the
generation; the script refuses it unless it is still the directory's generation, so a node
that lost the session (paused past its lease while another node took over) cannot write into
it any more, however late it wakes up.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Final, TypeAlias

import msgspec

from .transcript_ops import (
    AdmitPrompt,
    AppendEvent,
    DeleteSession,
    FinishTurn,
    MarkClosed,
    Op,
    UpsertSession,
)

KEY_PREFIX: Final = "tk"
DEFAULT_LEASE_MS: Final = 10_000
# The owner renews its leases this many times per lease period: two renewals can fail in a
# row (a slow Redis round trip, a long garbage collection) before the lease runs out.
RENEWALS_PER_LEASE: Final = 3
# Node registrations live this many lease periods without a heartbeat.
NODE_TTL_LEASES: Final = 3


@dataclass(frozen=True, slots=True)
class SessionKeys:
    """The Redis keys of one session (one hash slot: they share the ``{sessionId}`` tag)."""

    directory: str  # hash: the DirectoryEntry
    lease: str  # string "<nodeId> <generation>" with the lease TTL
    ops: str  # list: the transcript op log (encoded ops, in commit order)
    events: str  # stream: the published events, capped at the ring size

    def all(self) -> list[str]:
        return [self.directory, self.lease, self.ops, self.events]


def session_keys(session_id: str) -> SessionKeys:
    tag = f"{KEY_PREFIX}:{{{session_id}}}"
    return SessionKeys(f"{tag}:dir", f"{tag}:lease", f"{tag}:ops", f"{tag}:events")


def node_key(node_id: str) -> str:
    """A node's registration (hash ``url``, ``startedAt``; TTL ``NODE_TTL_LEASES`` leases)."""
    return f"{KEY_PREFIX}:node:{node_id}"


def lease_value(node_id: str, generation: int) -> str:
    return f"{node_id} {generation}"


@dataclass(frozen=True, slots=True)
class DirectoryEntry:
    """Where a session lives: its owner (node id and URL), workspace, event epoch and the
    generation of the owner's lease (the fencing token)."""

    owner_node_id: str
    node_url: str
    workspace: str
    epoch: str
    generation: int
    closed: bool = False

    @classmethod
    def from_hash(cls, fields: dict[str, str]) -> DirectoryEntry | None:
        """The entry of a ``HGETALL`` answer (``None`` for an empty or incomplete one)."""
        try:
            return cls(
                owner_node_id=fields["owner"], node_url=fields["url"],
                workspace=fields.get("workspace", ""), epoch=fields.get("epoch", ""),
                generation=int(fields["gen"]), closed=fields.get("closed") == "1",
            )
        except (KeyError, ValueError):
            return None


def renew_interval_ms(lease_ms: int) -> int:
    return max(1, lease_ms // RENEWALS_PER_LEASE)


def node_ttl_ms(lease_ms: int) -> int:
    return lease_ms * NODE_TTL_LEASES


def retry_after_s(lease_pttl_ms: int) -> int:
    """The ``Retry-After`` of a 503 while a dead owner's lease still runs: whole seconds until
    it expires, at least 1."""
    return max(1, math.ceil(lease_pttl_ms / 1000))


# --- where a request goes ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Local:
    """Serve it here: this node runs the session."""


@dataclass(frozen=True, slots=True)
class Forward:
    """Send it to the owner, which holds a valid lease."""

    node_url: str
    owner_node_id: str


@dataclass(frozen=True, slots=True)
class TakeOver:
    """Nobody holds the lease (the owner died or let it go): restore the session here."""


@dataclass(frozen=True, slots=True)
class Unavailable:
    """The owner's lease is valid but the owner does not answer: ``503`` with
    ``Retry-After`` until the lease runs out (then the first request takes over)."""

    retry_after_s: int


@dataclass(frozen=True, slots=True)
class Unknown:
    """No such session in the cluster (or it was closed): the single-node answer (404)."""


Route: TypeAlias = Local | Forward | TakeOver | Unavailable | Unknown


def route(
    entry: DirectoryEntry | None,
    lease_pttl_ms: int,
    node_id: str,
    *,
    live_here: bool,
    owner_unreachable: bool = False,
) -> Route:
    """Where a request for a session goes.

    ``lease_pttl_ms`` is Redis' ``PTTL`` of the lease key (negative: no lease). A session live on
    this node is served here. A session whose lease is held by another node is forwarded to it
    (``Unavailable`` once forwarding found the owner gone, until the lease runs out). Without a
    lease the session is taken over here; a lease that still names this node (this node was
    restarted before it expired) is taken over at once, since this node knows it is not
    running the session."""
    if live_here:
        return Local()
    if entry is None or entry.closed:
        return Unknown()
    if lease_pttl_ms <= 0 or entry.owner_node_id == node_id:
        return TakeOver()
    if owner_unreachable:
        return Unavailable(retry_after_s(lease_pttl_ms))
    return Forward(entry.node_url, entry.owner_node_id)


# --- the scripts (run atomically by Redis; every key in one slot) -----------------------------

# KEYS: directory, lease, ops. ARGV: node id, node url, workspace, epoch, lease ms.
# Claim the session when its lease is free or already ours; raise the generation.
# Returns {1, generation, op-log length} on success, {0, remaining lease ms} when another
# node holds it.
CLAIM_SCRIPT: Final = """
local held = redis.call('GET', KEYS[2])
if held then
  local owner = string.match(held, '^(%S+)')
  if owner ~= ARGV[1] then
    return {0, redis.call('PTTL', KEYS[2])}
  end
end
local gen = redis.call('HINCRBY', KEYS[1], 'gen', 1)
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'url', ARGV[2], 'workspace', ARGV[3],
           'epoch', ARGV[4], 'closed', '0')
redis.call('SET', KEYS[2], ARGV[1] .. ' ' .. gen, 'PX', ARGV[5])
return {1, gen, redis.call('LLEN', KEYS[3])}
"""

# KEYS: directory, lease. ARGV: node id, generation, lease ms.
# Extend our lease while the generation is still ours (also after it expired, if nobody took
# over meanwhile). Returns 1, or 0 when the session is someone else's now.
RENEW_SCRIPT: Final = """
if redis.call('HGET', KEYS[1], 'gen') ~= ARGV[2] or redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[2], ARGV[1] .. ' ' .. ARGV[2], 'PX', ARGV[3])
return 1
"""

# KEYS: directory, ops, events. ARGV: generation, epoch, events cap, the op log's length
# before this batch, n ops, then n encoded ops, then triples (first id, last id, joined
# envelopes) for the event stream.
# Append only while the generation is the directory's: a stale owner's writes are refused
# whole. The expected length makes a resend idempotent: a batch that already landed (its
# answer was lost) is not appended twice. Returns 1 (appended, or already there), 0 when
# fenced, -1 when the op log is not where the owner thinks (it must not write on).
APPEND_SCRIPT: Final = """
if redis.call('HGET', KEYS[1], 'gen') ~= ARGV[1] then
  return 0
end
local n = tonumber(ARGV[5])
local have = redis.call('LLEN', KEYS[2])
local expected = tonumber(ARGV[4])
if n > 0 and have == expected + n then
  return 1
end
if have ~= expected then
  return -1
end
for i = 6, 5 + n do
  redis.call('RPUSH', KEYS[2], ARGV[i])
end
local i = 6 + n
while i + 2 <= #ARGV do
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[3], '*',
             'e', ARGV[2], 'f', ARGV[i], 'l', ARGV[i + 1], 'b', ARGV[i + 2])
  i = i + 3
end
return 1
"""

# KEYS: directory, lease. ARGV: node id, generation, epoch, first event id.
# The owner's new bus (a new session, or a restore): its event epoch and the id its events
# start at, fenced like an append.
SET_EPOCH_SCRIPT: Final = """
if redis.call('HGET', KEYS[1], 'gen') ~= ARGV[2] then
  return 0
end
redis.call('HSET', KEYS[1], 'epoch', ARGV[3], 'base', ARGV[4])
return 1
"""

# KEYS: directory, lease. ARGV: node id, generation, closed ("1" when deleted for good).
# Give the session up (graceful stop, or closed by a client): the lease goes at once so the
# next request anywhere restores it without waiting for the TTL.
RELEASE_SCRIPT: Final = """
if redis.call('HGET', KEYS[1], 'gen') ~= ARGV[2] then
  return 0
end
if ARGV[3] == '1' then
  redis.call('HSET', KEYS[1], 'closed', '1')
end
redis.call('DEL', KEYS[2])
return 1
"""


def append_args(generation: int, epoch: str, events_cap: int, log_len: int, ops: list[bytes],
                runs: list[tuple[int, int, bytes]]) -> list[str | bytes | int]:
    """``ARGV`` of :data:`APPEND_SCRIPT` (``log_len``: the op log's length before ``ops``)."""
    out: list[str | bytes | int] = [str(generation), epoch, events_cap, log_len, len(ops),
                                    *ops]
    for first, last, raw in runs:
        out += [first, last, raw]
    return out


# --- the op log -------------------------------------------------------------------------------

_OP_TYPES: Final[dict[str, type[Any]]] = {
    cls.__name__: cls
    for cls in (UpsertSession, AppendEvent, AdmitPrompt, FinishTurn, DeleteSession, MarkClosed)
}
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(tuple[str, Any])


def encode_op(op: Op) -> bytes:
    """One transcript op as the bytes of the op log (``[type name, fields]`` in MessagePack)."""
    return _encoder.encode((type(op).__name__, op))


def decode_op(raw: bytes) -> Op:
    """The op of :func:`encode_op`; raises ``ValueError`` for anything else."""
    try:
        name, fields = _decoder.decode(raw)
        cls = _OP_TYPES[name]
        op: Op = msgspec.convert(fields, cls)
    except (msgspec.DecodeError, msgspec.ValidationError, KeyError) as exc:
        raise ValueError(f"not an op of the op log: {exc}") from None
    return op


def event_run(op: AppendEvent) -> tuple[int, int, bytes]:
    """``(first id, last id, joined envelopes)`` of an ``AppendEvent``: the bus stores a run of
    spliced chunks as one op whose ``raw`` is their envelopes joined by newlines (an envelope is
    compact JSON and never holds a raw newline), ending at ``event_id``."""
    count = op.raw.count(b"\n") + 1
    return op.event_id - count + 1, op.event_id, op.raw


def split_run(first: int, last: int, raw: bytes) -> list[tuple[int, bytes]]:
    """The ``(id, envelope)`` pairs of a stream entry; ``ValueError`` if they do not match."""
    parts = raw.split(b"\n")
    if len(parts) != last - first + 1:
        raise ValueError(f"stream entry {first}..{last} holds {len(parts)} envelopes")
    return [(first + i, part) for i, part in enumerate(parts)]
