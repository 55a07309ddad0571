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

# Derandomized: the same examples on every run (`make mutation` runs them once per mutant).
for name, count in (("deep", DEEP_EXAMPLES), ("ci", 50), ("mutation", 30)):
    settings.register_profile(name, deadline=None, derandomize=True, max_examples=count,
                              suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", deadline=None, max_examples=100)
# `make unit-fast`: a few examples per property, for a quick pass while editing.
settings.register_profile("fast", deadline=None, max_examples=10)


def examples(deep: int) -> int:
    """``deep`` examples under the ``deep`` profile, the same share of it under the loaded one
    (at least 5). Call it at import, after the profile is loaded (tests/conftest.py does)."""
    return max(5, round(deep * settings().max_examples / DEEP_EXAMPLES))
