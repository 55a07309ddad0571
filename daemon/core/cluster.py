"""Cluster mode's rules as data: the Redis keys of a session, its directory entry, the lease and
fencing scripts, and where a request for a session goes. Pure: no Redis client, no clock (times
are passed in), no randomness; :mod:`daemon.cluster` is the shell that runs these against Redis.

Every key of one session carries the hash tag ``{sessionId}``, so on a Redis Cluster they live in
one slot and each script below touches one slot only (a requirement of Redis Cluster scripts).

Ownership: a session's owner holds its lease key (value ``"<nodeId> <generation>"``, with a TTL of
``--lease-ms``) and its directory entry names the owner and the generation. A claim succeeds
when the lease is free (never taken, expired, or already the caller's) and raises the
generation by one. Every append to the session's op log and event stream carries the fencing
token ``"<nodeId> <generation>"`` (the lease's value); the script refuses it unless it is still
the directory's owner and generation, so a node that lost the session (paused past its lease
while another node took over) cannot write into it any more, however late it wakes up. (The
owner is part of the token because Redis can lose a claim, in a crash within its AOF's last
second or a failover to a replica behind, and issue the same generation again, to another
node.) A release raises the generation as well: it retires the
owner's, so nothing the owner sent before its release (a renewal, an append) lands after it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Final, TypeAlias

import msgspec

from .frame_codec import run_envelopes
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
# RETENTION. A session's keys (directory, op log, event stream) expire this long after its
# owner last wrote or renewed them: a session nobody runs any more (its owner died and no
# request ever came back for it) is dropped from Redis a week later, while any request before
# then restores it. Every claim, renewal and append pushes the expiry out again.
IDLE_RETENTION_MS: Final = 7 * 24 * 3600 * 1000
# A session deleted by a client keeps its keys this long (its ``closed`` entry answers 404 on
# every node, and mirrors behind on its stream still read its end), then Redis drops them.
CLOSED_RETENTION_MS: Final = 3600 * 1000


@dataclass(frozen=True, slots=True)
class SessionKeys:
    """The Redis keys of one session (one hash slot: they share the ``{sessionId}`` tag)."""

    directory: str  # hash: the DirectoryEntry
    lease: str  # string "<nodeId> <generation>" with the lease TTL
    ops: str  # list: the transcript op log (encoded ops, in commit order)
    events: str  # stream: the published events, at most the ring's (see STREAM IDS)
    readers: str  # hash: node id -> "<readers of its mirror> <Redis time ms>"

    def all(self) -> list[str]:
        """The keys the lease scripts take (``readers`` is written by mirrors only)."""
        return [self.directory, self.lease, self.ops, self.events]


def session_keys(session_id: str) -> SessionKeys:
    tag = f"{KEY_PREFIX}:{{{session_id}}}"
    return SessionKeys(f"{tag}:dir", f"{tag}:lease", f"{tag}:ops", f"{tag}:events",
                       f"{tag}:readers")


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
    grace_left_ms: int = 0,
) -> Route:
    """Where a request for a session goes.

    ``lease_pttl_ms`` is Redis' ``PTTL`` of the lease key (negative: no lease). A session live on
    this node is served here. A session whose lease is held by another node is forwarded to it
    (``Unavailable`` once forwarding found the owner gone, until the lease runs out). Without a
    lease the session is taken over here; a lease that still names this very node (this node
    was restarted before it expired) is taken over at once, since this node knows it is not
    running the session. ``grace_left_ms`` > 0: this node saw Redis come back a moment ago
    (see :mod:`daemon.core.cluster_lease`), so an expired lease is still left to the owner the
    directory names: the request is forwarded to it (``Unavailable`` for the rest of the grace
    if it does not answer)."""
    if live_here:
        return Local()
    if entry is None or entry.closed:
        return Unknown()
    if entry.owner_node_id == node_id:
        return TakeOver()
    if lease_pttl_ms <= 0 and grace_left_ms <= 0:
        return TakeOver()
    if owner_unreachable:
        return Unavailable(retry_after_s(max(lease_pttl_ms, grace_left_ms)))
    return Forward(entry.node_url, entry.owner_node_id)


# --- the scripts (run atomically by Redis; every key in one slot) -----------------------------

# KEYS: directory, lease, ops, events. ARGV: node id, node url, workspace, epoch, lease ms,
# idle retention ms.
# Claim the session when its lease is free or already ours; raise the generation; the
# session's keys live the idle retention from now (see RETENTION below). A closed session is
# never claimed: a claim decided on a lookup made before the close must not reopen it (nor
# give its keys the idle retention back).
# Returns {1, generation, op-log length} on success, {0, remaining lease ms} when another
# node holds it, {0, -1} when the session is closed.
CLAIM_SCRIPT: Final = """
if redis.call('HGET', KEYS[1], 'closed') == '1' then
  return {0, -1}
end
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
for k = 1, 4 do
  if k ~= 2 then redis.call('PEXPIRE', KEYS[k], ARGV[6]) end
end
return {1, gen, redis.call('LLEN', KEYS[3])}
"""

# KEYS: directory, lease, ops, events. ARGV: node id, generation, lease ms, idle retention ms.
# Extend our lease while the generation is still ours (also after it expired, if nobody took
# over meanwhile), and the session keys' idle retention with it. Returns 1, or 0 when the
# session is someone else's now, was released (the release retired the generation: a
# renewal the owner sent before its own release and that lands after it must not bring the
# lease back) or was closed (nor give its keys the idle retention).
RENEW_SCRIPT: Final = """
if redis.call('HGET', KEYS[1], 'gen') ~= ARGV[2] or redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1]
   or redis.call('HGET', KEYS[1], 'closed') == '1' then
  return 0
end
redis.call('SET', KEYS[2], ARGV[1] .. ' ' .. ARGV[2], 'PX', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
redis.call('PEXPIRE', KEYS[3], ARGV[4])
redis.call('PEXPIRE', KEYS[4], ARGV[4])
return 1
"""

# KEYS: directory, ops, events. ARGV: fencing token ("<node id> <generation>"), epoch, the
# oldest event id to keep in the stream (0: trim nothing), the op log's length before this
# batch, idle retention ms, n ops, then n encoded ops, then triples (first id, last id, joined
# envelopes) for the event stream.
# Append only while the token is the directory's owner and generation: a stale owner's writes
# are refused whole. The expected length makes a resend idempotent: a batch that already landed (its
# answer was lost) is not appended twice. The keys written live the idle retention from now.
# The stream is trimmed by event id (see STREAM IDS below): it keeps no event of the current
# epoch older than the one named, and nothing of earlier epochs then.
# Returns 1 (appended, or already there), 0 when fenced, -1 when the op log is not where the
# owner thinks (it must not write on).
APPEND_SCRIPT: Final = """
local held = redis.call('HMGET', KEYS[1], 'owner', 'gen')
if (held[1] or '') .. ' ' .. (held[2] or '') ~= ARGV[1] then
  return 0
end
local n = tonumber(ARGV[6])
local have = redis.call('LLEN', KEYS[2])
local expected = tonumber(ARGV[4])
if n > 0 and have == expected + n then
  return 1
end
if have ~= expected then
  return -1
end
for i = 7, 6 + n do
  redis.call('RPUSH', KEYS[2], ARGV[i])
end
local i = 7 + n
if i + 2 <= #ARGV then
  local xn = tonumber(redis.call('HGET', KEYS[1], 'xn') or '-1')
  if xn < 0 then
    local top = redis.call('XREVRANGE', KEYS[3], '+', '-', 'COUNT', 1)
    xn = top[1] and tonumber(string.match(top[1][1], '^(%d+)')) or 0
  end
  local xoff
  if redis.call('HGET', KEYS[1], 'xe') ~= ARGV[2] then
    xoff = xn + 1 - tonumber(ARGV[i])
    redis.call('HSET', KEYS[1], 'xe', ARGV[2], 'xoff', xoff)
  else
    xoff = tonumber(redis.call('HGET', KEYS[1], 'xoff'))
  end
  while i + 2 <= #ARGV do
    local g = xoff + tonumber(ARGV[i])
    redis.call('XADD', KEYS[3], string.format('%d-0', g),
               'e', ARGV[2], 'f', ARGV[i], 'l', ARGV[i + 1], 'b', ARGV[i + 2])
    xn = xoff + tonumber(ARGV[i + 1])
    i = i + 3
  end
  redis.call('HSET', KEYS[1], 'xn', xn)
  if tonumber(ARGV[3]) > 0 then
    redis.call('XTRIM', KEYS[3], 'MINID', string.format('%d-0', xoff + tonumber(ARGV[3])))
  end
end
redis.call('PEXPIRE', KEYS[2], ARGV[5])
redis.call('PEXPIRE', KEYS[3], ARGV[5])
return 1
"""

# STREAM IDS. The event stream's entry ids are not Redis' clock but a count of events: an
# entry holding events f..l of the current epoch gets the id ``<xoff + f>-0``, where ``xoff``
# (directory field, with ``xe`` the epoch it belongs to) is chosen when an epoch's first entry
# is added so that ids keep growing across epochs (``xn``: the count of the last event added).
# So "no event older than id k of the current epoch" is ``XTRIM MINID <xoff + k>-0``: the
# stream holds at most the events of the owner's ring (which is bounded by events and bytes),
# whatever the sizes of the publish batches (``MAXLEN`` counted entries, i.e. batches).


# KEYS: directory, ops. ARGV: fencing token (as for an append), the op log's length now, the
# index its compacted stretch starts at, then the positions (relative to that index) of the stretch's ops that
# stay, ascending.
# Compaction: replace the stretch from the start index to the end of the log by the ops
# that stay (a finished turn's raw events go: its FinishTurn holds the compacted records and
# deletes them on replay), atomically and fenced like an append. A resend after a lost answer
# finds the log already at its compacted length (always shorter: a compaction drops at least
# one op) and does nothing. Returns 1 (compacted, or already), 0 when fenced, -1 when the op
# log is not where the owner thinks.
COMPACT_SCRIPT: Final = """
local held = redis.call('HMGET', KEYS[1], 'owner', 'gen')
if (held[1] or '') .. ' ' .. (held[2] or '') ~= ARGV[1] then
  return 0
end
local have = redis.call('LLEN', KEYS[2])
local expected = tonumber(ARGV[2])
local start = tonumber(ARGV[3])
if have == start + #ARGV - 3 and have < expected then
  return 1
end
if have ~= expected then
  return -1
end
local stretch = redis.call('LRANGE', KEYS[2], start, -1)
if start == 0 then
  redis.call('DEL', KEYS[2])
else
  redis.call('LTRIM', KEYS[2], 0, start - 1)
end
for i = 4, #ARGV do
  redis.call('RPUSH', KEYS[2], stretch[tonumber(ARGV[i]) + 1])
end
return 1
"""

# KEYS: directory, lease. The directory entry (HGETALL's flat list) and the lease's PTTL in
# one round trip: a request's routing decision costs one Redis call.
LOOKUP_SCRIPT: Final = """
return {redis.call('HGETALL', KEYS[1]), redis.call('PTTL', KEYS[2])}
"""

# KEYS: directory, lease. ARGV: node id, generation, epoch, first event id.
# The owner's new bus (a new session, or a restore): its event epoch and the id its events
# start at, fenced like an append (owner and generation).
SET_EPOCH_SCRIPT: Final = """
if redis.call('HGET', KEYS[1], 'gen') ~= ARGV[2] or redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then
  return 0
end
redis.call('HSET', KEYS[1], 'epoch', ARGV[3], 'base', ARGV[4])
return 1
"""

# KEYS: directory, lease, ops, events. ARGV: node id, generation, closed ("1" when deleted
# for good), closed retention ms.
# Give the session up (graceful stop, or closed by a client): the lease goes at once so the
# next request anywhere restores it without waiting for the TTL. The release retires the
# generation (it raises ``gen`` with no owner holding the new value): whatever the former
# owner sent before its release and Redis runs after it (a renewal, an append, a new epoch)
# carries the old generation and is refused, so nothing brings the lease back or writes
# into the session until the next claim (which raises ``gen`` again). A closed session's
# keys live the closed retention from now (its directory entry answers 404 everywhere
# meanwhile, and readers behind on its stream still get its end), then Redis drops them.
RELEASE_SCRIPT: Final = """
if redis.call('HGET', KEYS[1], 'gen') ~= ARGV[2] or redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then
  return 0
end
redis.call('HINCRBY', KEYS[1], 'gen', 1)
if ARGV[3] == '1' then
  redis.call('HSET', KEYS[1], 'closed', '1')
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
  redis.call('PEXPIRE', KEYS[3], ARGV[4])
  redis.call('PEXPIRE', KEYS[4], ARGV[4])
end
redis.call('DEL', KEYS[2])
return 1
"""


# --- readers of mirrors on other nodes -----------------------------------------------------
#
# A node that serves a session's stream from a mirror reports how many readers the mirror has,
# stamped with Redis' own clock (so the nodes' clocks never matter); the owner's status adds
# the fresh reports to its own subscribers. A report is fresh for READERS_FRESH_MS: a mirror
# refreshes it every READERS_REFRESH_MS and whenever its count changes, and removes it when it
# ends; a dead node's report goes stale and is dropped by the next reader of the hash.
READERS_REFRESH_MS: Final = 1_000
READERS_FRESH_MS: Final = 3_000

# KEYS: readers. ARGV: node id, count, fresh ms. Report (count > 0) or withdraw (0) a mirror.
READERS_SET_SCRIPT: Final = """
if tonumber(ARGV[2]) > 0 then
  local now = redis.call('TIME')
  local ms = now[1] * 1000 + math.floor(now[2] / 1000)
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. ' ' .. ms)
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
else
  redis.call('HDEL', KEYS[1], ARGV[1])
end
return 1
"""

# KEYS: readers. ARGV: fresh ms. The fresh reports as a flat {node id, count, ...} list; the
# stale ones are deleted.
READERS_GET_SCRIPT: Final = """
local now = redis.call('TIME')
local ms = now[1] * 1000 + math.floor(now[2] / 1000)
local all = redis.call('HGETALL', KEYS[1])
local out = {}
for i = 1, #all, 2 do
  local count, at = string.match(all[i + 1], '^(%d+) (%d+)$')
  if count and ms - tonumber(at) <= tonumber(ARGV[1]) then
    out[#out + 1] = all[i]
    out[#out + 1] = count
  else
    redis.call('HDEL', KEYS[1], all[i])
  end
end
return out
"""


def readers_by_node(flat: list[Any], own_node_id: str, own_count: int) -> dict[str, int]:
    """The subscribers of a session per node: the owner's own and the fresh mirror reports
    (a flat ``READERS_GET_SCRIPT`` answer; a report naming the owner itself is ignored)."""
    out = {own_node_id: own_count}
    for i in range(0, len(flat) - 1, 2):
        node = flat[i].decode() if isinstance(flat[i], bytes) else str(flat[i])
        if node != own_node_id:
            out[node] = int(flat[i + 1])
    return out


def append_args(owner: str, generation: int, epoch: str, keep_from: int, log_len: int,
                ops: list[bytes], runs: list[tuple[int, int, bytes]],
                retention_ms: int = IDLE_RETENTION_MS) -> list[str | bytes | int]:
    """``ARGV`` of :data:`APPEND_SCRIPT` for the lease ``owner`` holds at ``generation``
    (``log_len``: the op log's length before ``ops``; ``keep_from``: the oldest event id the
    stream keeps, 0 for all)."""
    out: list[str | bytes | int] = [lease_value(owner, generation), epoch, keep_from, log_len,
                                    retention_ms, len(ops), *ops]
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


def stream_keep_from(ring_first_id: int | None, last_event: int, ring_size: int) -> int:
    """The oldest event id the session's stream keeps after an append whose newest event is
    ``last_event``: the oldest one the owner's ring still holds (it is bounded by events and
    by bytes), and never more than ``ring_size`` events back."""
    by_count = max(1, last_event - ring_size + 1)
    return by_count if ring_first_id is None else max(ring_first_id, by_count)


def event_run(op: AppendEvent) -> tuple[int, int, bytes]:
    """``(first id, last id, joined envelopes)`` of an ``AppendEvent``: the bus stores a run of
    events as one op ending at ``event_id``, whose ``raw`` is their envelopes joined by newlines
    (an envelope is compact JSON and never holds a raw newline), or, for a run of spliced
    chunks, their updates joined so, the envelopes made from ``op.run``."""
    if op.run is None:
        return op.event_id - op.raw.count(b"\n"), op.event_id, op.raw
    return (op.run.first_id, op.event_id,
            b"\n".join(run_envelopes(op.run, op.raw.split(b"\n"))))


def split_run(first: int, last: int, raw: bytes) -> list[tuple[int, bytes]]:
    """The ``(id, envelope)`` pairs of a stream entry; ``ValueError`` if they do not match."""
    parts = raw.split(b"\n")
    if len(parts) != last - first + 1:
        raise ValueError(f"stream entry {first}..{last} holds {len(parts)} envelopes")
    return [(first + i, part) for i, part in enumerate(parts)]


# --- compacting the op log ----------------------------------------------------------------------
#
# A FinishTurn deletes every raw event the session holds when it is applied (they are the
# turn's, now stored as its compacted records), so an AppendEvent followed anywhere later in the
# log by a FinishTurn writes nothing that survives a replay: dropping it leaves the replayed
# transcript exactly as it was. Likewise everything before a DeleteSession is gone once it is
# applied. That is the whole rule: the compacted log keeps every other op, in order.


def compact_ops(ops: list[Op]) -> list[int]:
    """The positions of ``ops`` (one session's op log) that a compacted log keeps: all but
    the AppendEvents that a later FinishTurn supersedes and everything up to the last
    DeleteSession. Replaying the kept ops into an empty store gives the same transcript as
    replaying all of them."""
    keep: list[int] = []
    finish_seen = False
    for index in range(len(ops) - 1, -1, -1):
        op = ops[index]
        if isinstance(op, DeleteSession):
            break
        if isinstance(op, AppendEvent) and finish_seen:
            continue
        if isinstance(op, FinishTurn):
            finish_seen = True
        keep.append(index)
    keep.reverse()
    return keep


@dataclass(frozen=True, slots=True)
class Compaction:
    """Replace the op log from ``start`` to its end (``end``, its length now) by the ops at
    the positions ``keep`` (relative to ``start``): the ARGV of :data:`COMPACT_SCRIPT`."""

    start: int
    end: int
    keep: tuple[int, ...]

    def args(self, owner: str, generation: int) -> list[int | str]:
        return [lease_value(owner, generation), self.end, self.start, *self.keep]

    @property
    def new_length(self) -> int:
        return self.start + len(self.keep)


@dataclass(slots=True)
class LogTail:
    """The stretch of an owned session's op log since its last turn boundary, as its owner
    appends to it: where it starts and which of its ops a compaction keeps (positions only:
    the ops themselves are in Redis). :meth:`add` is told each op Redis acknowledged; after
    a FinishTurn it gives the :class:`Compaction` that drops the turn's raw events."""

    start: int
    length: int = 0
    keep: list[int] = field(default_factory=list)

    @classmethod
    def of(cls, ops: list[Op]) -> LogTail:
        """The tail of a whole (compacted) op log: what follows its last FinishTurn."""
        last = max((i for i, op in enumerate(ops) if isinstance(op, FinishTurn)), default=-1)
        tail = cls(last + 1)
        for op in ops[last + 1:]:
            tail.add(op)
        return tail

    def add(self, op: Op) -> Compaction | None:
        position = self.length
        self.length += 1
        if not isinstance(op, AppendEvent):
            self.keep.append(position)
        if not isinstance(op, FinishTurn):
            return None
        compaction = (Compaction(self.start, self.start + self.length, tuple(self.keep))
                      if len(self.keep) < self.length else None)
        self.start += len(self.keep)
        self.length = 0
        self.keep = []
        return compaction
