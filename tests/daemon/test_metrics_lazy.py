"""The Prometheus client library is loaded by the first scrape, not by the daemon's start, and
the commit-time histogram the daemon counts without it is exposed exactly as the library's own
``Histogram`` would expose it."""

from __future__ import annotations

import subprocess
import sys

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from daemon.metrics import COMMIT_BUCKETS, CommitTimes
from daemon.metrics_exposition import COMMIT_HELP, COMMIT_HISTOGRAM, CommitHistogram

pytestmark = pytest.mark.processes  # starts a Python process: not in make unit-fast

# On a bound, between bounds, below the first and past the last.
DURATIONS = [0.0, 0.0005, 0.0007, 0.001, 0.003, 0.01, 0.2, 1.0, 4.9, 5.0, 7.5, 120.0]


def _lines(registry: CollectorRegistry) -> list[str]:
    # _created is the moment counting began: the two histograms began apart.
    return [line for line in generate_latest(registry).decode().splitlines()
            if "_created" not in line]


@pytest.mark.parametrize("count", [0, 1, len(DURATIONS)])
def test_the_commit_histogram_is_exposed_as_the_librarys_histogram(count: int) -> None:
    times = CommitTimes()
    ours = CollectorRegistry()
    ours.register(CommitHistogram(times))
    theirs = CollectorRegistry()
    library = Histogram(COMMIT_HISTOGRAM, COMMIT_HELP, buckets=COMMIT_BUCKETS,
                        registry=theirs)
    for seconds in DURATIONS[:count]:
        times.observe(seconds)
        library.observe(seconds)
    assert _lines(ours) == _lines(theirs)
    created = [line for line in generate_latest(ours).decode().splitlines()
               if line.startswith(COMMIT_HISTOGRAM + "_created ")]
    assert len(created) == 1 and float(created[0].split()[1]) == times.created


def test_the_daemon_does_not_load_the_prometheus_library_until_scraped() -> None:
    code = ("import sys, daemon.server, daemon.http_api, daemon.manager, daemon.streams, "
            "daemon.asgi, daemon.transcript_writer; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'prometheus_client'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"
