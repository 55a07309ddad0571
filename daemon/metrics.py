"""The daemon's Prometheus metrics (``GET /metrics``), in Prometheus' text format as its own
client library writes it.

Nothing is counted twice and nothing is counted on a lock: the hot paths (the bus publishing
and evicting, the streams handing events to their transports, prompts ending, agents starting)
bump plain integers of :data:`totals` on the event loop's thread, and
:class:`DaemonCollector` turns them, with the gauges read off the daemon's live state (sessions,
agents, connections, the transcript file's size), into metric families only when a scrape asks.
The one histogram, the transcript's commit time, is observed once per group commit (tens a
second at most, never per event).

One set of counters per process, like Prometheus' process metrics: the daemon runs one
:class:`~daemon.manager.SessionManager` per process.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Final

from prometheus_client import CollectorRegistry, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from .manager import SessionManager

__all__ = ["CONTENT_TYPE", "DaemonCollector", "Totals", "build_registry", "exposition",
           "observe_commit", "totals"]

CONTENT_TYPE: Final = CONTENT_TYPE_LATEST
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

# Observed from the daemon's start, whenever the registry that exposes it is made.
_commit_histogram = Histogram(
    "turnkeeper_transcript_commit_seconds",
    "Time one group commit of the transcript took (worker thread included)",
    buckets=COMMIT_BUCKETS, registry=None)


def observe_commit(seconds: float) -> None:
    """Record one group commit's duration."""
    _commit_histogram.observe(seconds)


class DaemonCollector(Collector):
    """Reads the daemon's state at scrape time into metric families."""

    def __init__(self, manager: SessionManager, transcript: Callable[[], Path | None],
                 connections: Callable[[], int],
                 cluster: Callable[[], tuple[int, int] | None] | None = None) -> None:
        self.manager = manager
        self.transcript = transcript
        self.connections = connections
        # Cluster mode: (leases held, takeovers so far) of this node; None in single-node mode.
        self.cluster = cluster

    def collect(self) -> Iterator[Metric]:
        manager = self.manager
        sessions = GaugeMetricFamily("turnkeeper_sessions", "Sessions loaded in this daemon",
                                     labels=["state"])
        running = sum(1 for session in manager.sessions.values() if session.active is not None)
        sessions.add_metric(["running"], running)
        sessions.add_metric(["idle"], len(manager.sessions) - running)
        yield sessions
        subscribers = GaugeMetricFamily("turnkeeper_subscribers",
                                        "Open event streams", labels=["transport"])
        for transport, count in sorted(totals.subscribers.items()):
            subscribers.add_metric([transport], count)
        yield subscribers
        yield CounterMetricFamily("turnkeeper_events_published",
                                  "Events published by the daemon's sessions",
                                  value=totals.events_published)
        yield CounterMetricFamily("turnkeeper_events_delivered",
                                  "Events handed to subscribers' transports (once per "
                                  "subscriber)", value=totals.events_delivered)
        evicted = CounterMetricFamily("turnkeeper_clients_evicted",
                                      "Subscribers evicted by the slow-client rules",
                                      labels=["reason"])
        for reason, count in sorted(totals.evicted.items()):
            evicted.add_metric([reason], count)
        yield evicted
        prompts = CounterMetricFamily("turnkeeper_prompts", "Prompts ended, by outcome",
                                      labels=["outcome"])
        for outcome, count in sorted(totals.prompts.items()):
            prompts.add_metric([outcome], count)
        yield prompts
        yield CounterMetricFamily("turnkeeper_agent_restarts",
                                  "Agent processes started again for a workspace that had one "
                                  "(after a crash, a kill or an idle stop)",
                                  value=totals.agent_restarts)
        yield GaugeMetricFamily("turnkeeper_agents", "Agent processes running",
                                value=len(manager.agents))
        yield GaugeMetricFamily("turnkeeper_connections", "Open HTTP connections",
                                value=self.connections())
        transcript = self.transcript()
        if transcript is not None:
            yield GaugeMetricFamily("turnkeeper_transcript_bytes",
                                    "Size of the transcript on disk (database and its WAL)",
                                    value=_file_bytes(transcript))
        retention = getattr(manager, "retention_stats", None)
        if retention is not None:
            yield CounterMetricFamily("turnkeeper_retention_sessions_removed",
                                      "Stored sessions removed (closed, or let go by "
                                      "--retain-days / --retain-bytes)",
                                      value=retention.sessions_removed)
            yield CounterMetricFamily("turnkeeper_retention_passes",
                                      "Retention passes run", value=retention.passes)
            yield CounterMetricFamily("turnkeeper_retention_passes",
                                      "Retention passes run", value=retention.passes)
            yield CounterMetricFamily("turnkeeper_retention_steps_cut",
                                      "Retention steps cut short by a commit (taken again)",
                                      value=retention.steps_cut)
        stats = self.cluster() if self.cluster is not None else None
        if stats is not None:
            leases, takeovers = stats
            yield GaugeMetricFamily("turnkeeper_cluster_leases",
                                    "Session leases this node holds", value=leases)
            yield CounterMetricFamily("turnkeeper_cluster_takeovers",
                                      "Sessions this node took over from another node",
                                      value=takeovers)

    def describe(self) -> Iterable[Metric]:
        return ()  # the families are only known at scrape time (no name clash to check)


def _file_bytes(database: Path) -> int:
    total = 0
    for path in (database, database.with_name(database.name + "-wal")):
        try:
            total += os.stat(path).st_size
        except OSError:
            pass
    return total


def build_registry(collector: DaemonCollector) -> CollectorRegistry:
    """A registry of the daemon's metrics and the process's (memory, CPU, descriptors)."""
    registry = CollectorRegistry(auto_describe=True)
    registry.register(collector)
    ProcessCollector(registry=registry)
    registry.register(_commit_histogram)
    return registry


def exposition(registry: CollectorRegistry) -> bytes:
    """The registry's metrics in Prometheus' text format."""
    return generate_latest(registry)
