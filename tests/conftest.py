"""Shared test configuration."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import subprocess
from typing import Any

import pytest
from hypothesis import settings

import tests.hypothesis_profiles  # noqa: F401  (registers the profiles)
from tests import harness, scheduling
from tests.harness_zygote import ForkedPopen, close_all

settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


# --- the SDK's tests run on every loop --------------------------------------------------------------
# The daemon is Trio, and pytest-trio's trio_mode runs every other async test under trio.run. A
# test module of the SDK or the WebUI model says ``pytestmark = pytest.mark.anyio`` instead: anyio's
# pytest plugin then runs each of its async tests once per backend below, and the hook at the end
# takes such tests back from pytest-trio (its trio_mode marks every coroutine test).


def _anyio_backends() -> list[Any]:
    backends = [pytest.param("trio", id="trio"), pytest.param("asyncio", id="asyncio")]
    if importlib.util.find_spec("uvloop") is not None:
        backends.append(pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop"))
    return backends


@pytest.fixture(scope="module", params=_anyio_backends())
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    return request.param


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("anyio") is not None:
            item.own_markers[:] = [m for m in item.own_markers if m.name != "trio"]
    # Under xdist, the long modules first in each worker's share (tests/scheduling.py). Every
    # worker collects, and lays out, the same list.
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and workerinput.get("dist") == "worksteal":
        items[:] = scheduling.order(items, [item.nodeid for item in items],
                                    int(workerinput["workercount"]))


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """pytest-xdist, in the controller: tell each worker the distribution mode (a worker's own
    ``--dist`` option reads ``no``)."""
    node.workerinput["dist"] = node.config.getoption("dist")


# --- tests that start processes -----------------------------------------------------------------
# A test module that starts a process (a daemon, an agent, redis-server, a browser, node, git, a
# build) says ``pytestmark = pytest.mark.processes``; `make unit-fast` runs the others. So that
# the marker cannot go stale, an unmarked test that starts one fails here, in every run: its
# setup, call and teardown run with process creation refused.

_UNMARKED_STARTS = "this test starts a process; mark its module with pytest.mark.processes"


class _NoProcesses:
    def __init__(self) -> None:
        self.saved: list[tuple[Any, str, Any]] = []

    def __enter__(self) -> None:
        def refuse(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError(_UNMARKED_STARTS)

        for owner, name in ((subprocess.Popen, "_execute_child"),
                            (ForkedPopen, "_execute_child"), (os, "fork"),
                            (os, "posix_spawn"), (os, "posix_spawnp"), (os, "execv"),
                            (os, "execve")):
            if hasattr(owner, name):
                self.saved.append((owner, name, getattr(owner, name)))
                setattr(owner, name, refuse)

    def __exit__(self, *exc: object) -> None:
        for owner, name, original in reversed(self.saved):
            setattr(owner, name, original)
        self.saved.clear()


def _guarded(item: pytest.Item) -> contextlib.AbstractContextManager[None]:
    if item.get_closest_marker("processes") is not None:
        return contextlib.nullcontext()
    return _NoProcesses()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Any:
    # A test marked exec_daemon gets daemons exec'd as `python -m daemon`, not forked from the
    # worker's zygote (tests/harness.py): the tests of the start path and of memory figures.
    harness.exec_daemons = item.get_closest_marker("exec_daemon") is not None
    with _guarded(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    with _guarded(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    with _guarded(item):
        return (yield)


def pytest_sessionfinish(session: pytest.Session) -> None:
    close_all()  # the workers' zygotes (tests/harness_zygote.py)
