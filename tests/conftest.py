"""Shared test configuration."""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    deadline=None,
    derandomize=True,
    max_examples=200,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", deadline=None, max_examples=100)
# `make mutation` runs the property tests once per mutant: fewer, still derandomized examples.
settings.register_profile(
    "mutation",
    deadline=None,
    derandomize=True,
    max_examples=30,
    suppress_health_check=[HealthCheck.too_slow],
)
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
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("anyio") is not None:
            item.own_markers[:] = [m for m in item.own_markers if m.name != "trio"]
