"""Builders shared by the tests of sdk docs."""

from __future__ import annotations

# The named examples this module runs and checks (tests/docs/test_docs_blocks.py type-checks them and
# runs every other block of docs/).
CHECKED = ("trio", "asyncio", "sync", "agent", "sync_events", "load_marker", "repair",
           "exactly_once")

