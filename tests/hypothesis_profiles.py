"""The suite's Hypothesis profiles, chosen by ``HYPOTHESIS_PROFILE`` (tests/conftest.py loads it).

- ``ci`` (the default, ``make test``): 50 derandomized examples per property;
- ``deep`` (``make test-deep``): the whole suite with 200 per property, four times ``ci``;
- ``dev``, ``fast`` (``make unit-fast``), ``mutation`` (``make mutation``): fewer.

A property that asks for a count of its own says it with :func:`examples`, written at the
``deep`` scale: every profile runs the same share of it as of the others.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

DEEP_EXAMPLES = 200

settings.register_profile(
    "deep",
    deadline=None,
    derandomize=True,
    max_examples=DEEP_EXAMPLES,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "ci",
    deadline=None,
    derandomize=True,
    max_examples=50,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", deadline=None, max_examples=100)
# `make unit-fast`: a few examples per property, for a quick pass while editing.
settings.register_profile("fast", deadline=None, max_examples=10)
# `make mutation` runs the property tests once per mutant: fewer, still derandomized examples.
settings.register_profile(
    "mutation",
    deadline=None,
    derandomize=True,
    max_examples=30,
    suppress_health_check=[HealthCheck.too_slow],
)


def examples(deep: int) -> int:
    """``deep`` examples under the ``deep`` profile, the same share of it under the loaded one
    (at least 5). Call it at import, after the profile is loaded (tests/conftest.py does)."""
    return max(5, round(deep * settings().max_examples / DEEP_EXAMPLES))
