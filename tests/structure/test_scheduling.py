"""The layout of the collection for the xdist workers (tests/scheduling.py): the cost list names
only modules that exist, and the layout is a permutation that puts each worker's share of the
long modules at the start of its first run, whole."""

from __future__ import annotations

from pathlib import Path

from tests import scheduling

ROOT = Path(__file__).resolve().parents[2]


def test_every_listed_module_exists_and_holds_tests() -> None:
    for module in scheduling.COSTS:
        path = ROOT / module
        assert path.is_file(), f"{module} is in tests/scheduling.py COSTS but does not exist"
        assert "def test_" in path.read_text(), f"{module} holds no test"


def _ids(modules: dict[str, int]) -> list[str]:
    return [f"{module}::test_{n}" for module, count in modules.items() for n in range(count)]


def test_first_runs_are_worksteals_first_distribution() -> None:
    assert scheduling.first_runs(10, 3) == [3, 3, 4]
    assert scheduling.first_runs(2869, 3) == [956, 956, 957]
    assert sum(scheduling.first_runs(2869, 4)) == 2869


def test_long_modules_start_the_workers_first_runs_whole_and_spread() -> None:
    # In path order the two long modules sort last: a worker would meet them at its end.
    counts = {f"tests/a/test_short_{n}.py": 10 for n in range(20)}
    counts |= {"tests/z/test_long_one.py": 5, "tests/z/test_long_two.py": 4,
               "tests/z/test_mid.py": 3}
    costs = {"tests/z/test_long_one.py": 90, "tests/z/test_long_two.py": 80,
             "tests/z/test_mid.py": 20}
    ids = _ids(counts)
    laid = scheduling.order(ids, ids, 3, costs)
    assert sorted(laid) == sorted(ids)  # a permutation: nothing lost, nothing twice
    sizes = scheduling.first_runs(len(ids), 3)
    runs = [laid[sum(sizes[:i]):sum(sizes[:i + 1])] for i in range(3)]
    starts = [scheduling.module_of(run[0]) for run in runs]
    assert starts[:2] == ["tests/z/test_long_one.py", "tests/z/test_long_two.py"]
    # The third long module goes to the run with the least cost so far: the empty one.
    assert starts[2] == "tests/z/test_mid.py"
    for module in costs:
        where = [i for i, nodeid in enumerate(laid) if scheduling.module_of(nodeid) == module]
        assert where == list(range(where[0], where[0] + counts[module])), module  # whole
        assert [laid[i] for i in where] == [i for i in ids if i.startswith(module)]  # in order
    # The short modules follow in path order.
    short = [nodeid for nodeid in laid if "/a/" in nodeid]
    assert short == [nodeid for nodeid in ids if "/a/" in nodeid]


def test_one_worker_or_none_keeps_the_collection_order() -> None:
    ids = _ids({"tests/a/test_x.py": 3, "tests/viewer/test_viewer_browser.py": 2})
    assert scheduling.order(ids, ids, 1) == ids
    assert scheduling.order([], [], 3) == []
