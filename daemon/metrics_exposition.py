"""The daemon's metrics in Prometheus' text format (``GET /metrics``), as its client library
writes them. Shell, loaded by the first scrape: the library (and what it imports) stays out of
a daemon nobody scrapes.

:class:`DaemonCollector` reads the counters of :mod:`daemon.metrics` and the daemon's live state
at scrape time; :class:`CommitHistogram` exposes the commit times counted there as the
histogram the library's own ``Histogram`` would (same samples, ``_created`` included).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from itertools import accumulate
from pathlib import Path
from typing import TYPE_CHECKING, Final

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from .metrics import COMMIT_BUCKETS, CommitTimes, commit_times, totals

if TYPE_CHECKING:
    from .manager import SessionManager

__all__ = ["CONTENT_TYPE", "CommitHistogram", "DaemonCollector", "build_registry",
           "exposition"]

CONTENT_TYPE: Final = CONTENT_TYPE_LATEST
COMMIT_HISTOGRAM: Final = "turnkeeper_transcript_commit_seconds"
COMMIT_HELP: Final = "Time one group commit of the transcript took (worker thread included)"
# The buckets' ``le`` labels, spelled by the library as its Histogram spells them.
_COMMIT_LE: Final = tuple(str(floatToGoString(bound))  # type: ignore[no-untyped-call]
                          for bound in COMMIT_BUCKETS)


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


class CommitHistogram(Collector):
    """The transcript's commit times (:data:`daemon.metrics.commit_times`) as a histogram."""

    def __init__(self, times: CommitTimes = commit_times) -> None:
        self.times = times

    def collect(self) -> Iterator[Metric]:
        times = self.times
        metric = Metric(COMMIT_HISTOGRAM, COMMIT_HELP, "histogram")
        for le, count in zip(_COMMIT_LE, accumulate(times.buckets), strict=True):
            metric.add_sample(COMMIT_HISTOGRAM + "_bucket", {"le": le}, float(count))
        metric.add_sample(COMMIT_HISTOGRAM + "_bucket", {"le": "+Inf"}, float(times.count))
        metric.add_sample(COMMIT_HISTOGRAM + "_count", {}, float(times.count))
        metric.add_sample(COMMIT_HISTOGRAM + "_sum", {}, times.sum)
        metric.add_sample(COMMIT_HISTOGRAM + "_created", {}, times.created)
        yield metric

    def describe(self) -> Iterable[Metric]:
        return ()


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
    registry.register(CommitHistogram())
    return registry


def exposition(registry: CollectorRegistry) -> bytes:
    """The registry's metrics in Prometheus' text format."""
    return generate_latest(registry)
