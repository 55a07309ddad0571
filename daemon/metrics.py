"""The daemon's counters for its Prometheus metrics (``GET /metrics``). Shell (no I/O of its
own, but it is what the shells count into).

Nothing is counted twice and nothing is counted on a lock: the hot paths (the bus publishing
and evicting, the streams handing events to their transports, prompts ending, agents starting)
bump plain integers of :data:`totals` on the event loop's thread, and
:class:`daemon.metrics_exposition.DaemonCollector` turns them, with the gauges read off the
daemon's live state (sessions, agents, connections, the transcript file's size), into metric
families only when a scrape asks. The one histogram, the transcript's commit time, is observed
once per group commit (tens a second at most, never per event) into plain bucket counts
(:data:`commit_times`). Nothing here loads the Prometheus client library: that is loaded by the
first scrape (``daemon.metrics_exposition``), so a daemon nobody scrapes never holds it.

One set of counters per process, like Prometheus' process metrics: the daemon runs one
:class:`~daemon.manager.SessionManager` per process.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections import Counter
from typing import Final

__all__ = ["COMMIT_BUCKETS", "CommitTimes", "Totals", "commit_times", "observe_commit",
           "totals"]

# Commit times of a group commit on a local disk: sub-millisecond to a stalled fsync.
COMMIT_BUCKETS: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                         2.5, 5.0)


class Totals:
    """Counters the daemon's components bump as things happen (plain ints: one add each)."""

    __slots__ = (
        "agent_restarts",
        "events_delivered",
        "events_published",
        "evicted",
        "prompts",
        "subscribers",
    )

    def __init__(self) -> None:
        self.events_published = 0
        self.events_delivered = 0
        self.agent_restarts = 0
        self.evicted: Counter[str] = Counter()  # by reason
        self.prompts: Counter[str] = Counter()  # by outcome (the ledger's terminal state)
        self.subscribers: Counter[str] = Counter({"sse": 0, "ws": 0})  # open, by transport


totals = Totals()


class CommitTimes:
    """Group-commit durations as a histogram's counts: one count per bucket of
    :data:`COMMIT_BUCKETS` (a duration counts in the first bucket whose bound it does not
    exceed; past the last bound, only in the total), their number and sum, and when counting
    began (a Prometheus histogram's ``_created``)."""

    __slots__ = ("buckets", "count", "created", "sum")

    def __init__(self) -> None:
        self.buckets = [0] * len(COMMIT_BUCKETS)
        self.count = 0
        self.sum = 0.0
        self.created = time.time()

    def observe(self, seconds: float) -> None:
        self.count += 1
        self.sum += seconds
        index = bisect_left(COMMIT_BUCKETS, seconds)
        if index < len(self.buckets):
            self.buckets[index] += 1


# Observed from the daemon's start, whenever a scrape first exposes it.
commit_times = CommitTimes()


def observe_commit(seconds: float) -> None:
    """Record one group commit's duration."""
    commit_times.observe(seconds)
