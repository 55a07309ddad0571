"""A node's identity in the cluster: one live process per node id. Pure: the scripts as data and
the rules as functions; :mod:`daemon.cluster` runs them.

A node's registration (``tk:node:{nodeId}``, see :func:`daemon.core.cluster.node_key`) holds its
``url``, the ``inst`` (a random id of the process, new at every start) and a ``beat`` counter the
process raises at every refresh (every third of a lease), with a TTL of a few leases.

Two processes with one node id would each take the other's sessions at every request (a lease
that names "this node" is taken back at once), so a starting node refuses an id that a live
process holds: :data:`JOIN_SCRIPT` registers the id only if it is free or already this
process's; if another process's registration is there, the starting node watches its ``beat``
for :data:`WATCH_REFRESHES` refresh periods, then runs :data:`JOIN_SCRIPT` again with the
instance and beat it saw: a beat that stood still is a dead process's registration (a crash a
moment ago) and is taken over (compare-and-set, so a racing third process cannot slip in
between); a beat that moved, or another instance by then, is a live process: the node refuses
to start.

A process that was paused while another one took its id over (it looked dead) learns it at its
next refresh (:data:`REFRESH_SCRIPT` answers 0) and must stop at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

# How many of the holder's refresh periods a starting node watches its beat for.
WATCH_REFRESHES: Final = 2

# KEYS: node key. ARGV: instance, url, ttl ms, then the instance and beat seen of another
# process's registration ("" "" for none). Register when the key is free, already ours, or
# still exactly the registration seen (same instance, same beat: a dead process's). Returns {1}
# when registered, else {0, url, instance, beat} of the registration that holds the id.
JOIN_SCRIPT: Final = """
local inst = redis.call('HGET', KEYS[1], 'inst')
if inst and inst ~= ARGV[1] then
  local beat = redis.call('HGET', KEYS[1], 'beat') or '0'
  if inst ~= ARGV[4] or beat ~= ARGV[5] then
    return {0, redis.call('HGET', KEYS[1], 'url') or '', inst, beat}
  end
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'inst', ARGV[1], 'url', ARGV[2], 'beat', '0')
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {1}
"""

# KEYS: node key. ARGV: instance, url, ttl ms. Refresh this process's registration (recreated
# if it expired meanwhile, e.g. during a long Redis outage). Returns 1, or 0 when another
# process holds the id now.
REFRESH_SCRIPT: Final = """
local inst = redis.call('HGET', KEYS[1], 'inst')
if inst and inst ~= ARGV[1] then
  return 0
end
redis.call('HSET', KEYS[1], 'inst', ARGV[1], 'url', ARGV[2])
redis.call('HINCRBY', KEYS[1], 'beat', 1)
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
"""


@dataclass(frozen=True, slots=True)
class Holder:
    """Another process's registration of a node id, as :data:`JOIN_SCRIPT` reported it."""

    url: str
    instance: str
    beat: str


def join_result(raw: list[Any]) -> Holder | None:
    """``None`` when :data:`JOIN_SCRIPT` registered this process; else who holds the id."""
    if int(raw[0]) == 1:
        return None
    text = [item.decode() if isinstance(item, bytes) else str(item) for item in raw[1:4]]
    return Holder(*text)


def refusal(node_id: str, holder: Holder) -> str:
    """The one line a node refusing its id prints."""
    return (f"node id {node_id!r} is in use by a live node at {holder.url or 'an unknown URL'} "
            "(its registration in Redis is refreshed by another process): give each node its "
            "own --node-id")
