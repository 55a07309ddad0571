"""Builders shared by the tests of truncation."""

from __future__ import annotations

from typing import Any

_DROP = object()


def payload(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "reason": "replay_window_exceeded",
        "scope": "live_journal",
        "truncatedEvents": 4,
        "retainedEvents": 2,
        "maxBytes": 512,
        "maxEvents": 10000,
        "fullTranscriptAvailable": True,
    }
    for key, value in overrides.items():
        if value is _DROP:
            base.pop(key, None)
        else:
            base[key] = value
    return base

