"""The order the xdist workers get the tests in: the long modules first, spread over the workers.

``--dist worksteal`` hands worker ``i`` of ``n`` a contiguous run of the collection (its first
distribution: ``len(pending) // (n - i)`` items each, in turn) and afterwards lets an idle
worker take the back half of the longest queue. In path order the long modules fall wherever
their directory sorts, so a worker could meet a minute-long module near the end of the run
while the others had run dry: the run waited for it. :func:`order` lays the collection out so
that each worker's first run of tests starts with its share of the long modules (the longest
first, each given to the run with the least cost so far) and goes on with the short ones in
path order: what is left at the end, and what the others take from it, are short tests.

A module is moved whole (its module-scoped daemons start once). :data:`COSTS` is the list of
long modules with their share of the suite's test time, in per mille of the summed durations of
every test, from timed runs of the whole suite with 3 workers on a 2-core machine; it only
decides the order, never what runs. ``tests/structure/test_scheduling.py`` fails when a listed
module no longer exists.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

# Module path (as in the test ids) -> share of the suite's test time, per mille.
COSTS: dict[str, int] = {
    "tests/viewer/test_viewer_browser.py": 81,
    "tests/sdk/test_cli.py": 70,
    "tests/cluster/test_cluster_nodes.py": 54,
    "tests/benchmarks/test_benchmarks_quick.py": 53,
    "tests/cluster/test_cluster_faults.py": 45,
    "tests/durability/test_transcript_damage.py": 32,
    "tests/durability/test_retention.py": 28,
    "tests/structure/test_packaging.py": 27,
    "tests/docs/test_docs_blocks.py": 22,
    "tests/daemon/test_daemon_cli.py": 21,
    "tests/cluster/test_cluster_residuals.py": 20,
    "tests/durability/test_backup.py": 19,
    "tests/sdk/test_prompt_exactly_once.py": 19,
    "tests/daemon/test_resource_bounds.py": 18,
    "tests/streams/test_stalled_replay.py": 18,
    "tests/daemon/test_load.py": 17,
    "tests/acp/test_agent_interop.py": 17,
    "tests/daemon/test_schemathesis.py": 16,
    "tests/webui/test_webui_e2e.py": 16,
    "tests/daemon/test_died_reasons_and_small_limits.py": 15,
    "tests/daemon/test_shutdown.py": 14,
    "tests/acp/test_agent_hardening.py": 13,
    "tests/daemon/test_prompt_idempotency.py": 12,
    "tests/daemon/test_first_use.py": 12,
    "tests/durability/test_cold_restore.py": 11,
    "tests/docs/test_sdk_docs.py": 11,
    "tests/daemon/test_session_list.py": 10,
    "tests/sdk/test_repair_driver.py": 9,
    "tests/daemon/test_metrics.py": 9,
    "tests/structure/test_structure.py": 9,
    "tests/structure/test_harness_zygote.py": 8,
    "tests/webui/test_demo.py": 8,
    "tests/benchmarks/test_realload.py": 8,
}

T = TypeVar("T")


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def first_runs(total: int, workers: int) -> list[int]:
    """How many items worksteal's first distribution gives each worker, in turn."""
    sizes = []
    left = total
    for i in range(workers):
        size = left // (workers - i)
        sizes.append(size)
        left -= size
    return sizes


def order(items: Sequence[T], nodeids: Sequence[str], workers: int,
          costs: dict[str, int] = COSTS) -> list[T]:
    """``items`` (with their test ids) laid out for ``workers`` worksteal workers: a
    permutation of them, each module's items kept together and in their order, except that a
    short module may be cut where one worker's first run ends."""
    if workers < 2 or not items:
        return list(items)
    modules: dict[str, list[T]] = {}
    for item, nodeid in zip(items, nodeids, strict=True):
        modules.setdefault(module_of(nodeid), []).append(item)
    sizes = first_runs(len(items), workers)
    runs: list[list[T]] = [[] for _ in range(workers)]
    load = [0] * workers
    long = sorted((m for m in modules if m in costs), key=lambda m: (-costs[m], m))
    for module in long:
        fits = [i for i in range(workers) if sizes[i] - len(runs[i]) >= len(modules[module])]
        if not fits:  # never with this suite's sizes; keep the module whole anyway
            fits = [max(range(workers), key=lambda i: sizes[i] - len(runs[i]))]
        target = min(fits, key=lambda i: (load[i], i))
        runs[target].extend(modules[module])
        load[target] += costs[module]
    rest = [item for module, its in modules.items() if module not in costs for item in its]
    laid: list[T] = []
    for i, run in enumerate(runs):
        room = max(0, sizes[i] - len(run))
        run.extend(rest[:room])
        del rest[:room]
        laid.extend(run)
    laid.extend(rest)
    return laid
