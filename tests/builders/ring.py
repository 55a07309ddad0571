"""Builders shared by the tests of ring."""

from __future__ import annotations

from daemon.core.envelope import Event, make_event
from daemon.core.ring import (
    DEFAULT_RING_SIZE,
    EventRing,
)

EPOCH = "4b2d7775-0118-4dc1-96b7-f333ca18ab6e"


NOW = 1796204640885


def ev(event_id: int, pad: int = 0) -> Event:
    event = make_event(
        event_id,
        "session_update",
        {"sessionId": "s", "update": {"sessionUpdate": "agent_message_chunk",
                                      "content": {"type": "text", "text": "w" * pad}}},
        now_ms=1,
        prompt_id="p",
    )
    assert event is not None
    return event


def filled(count: int, capacity: int = DEFAULT_RING_SIZE, *, start: int = 1,
           pads: list[int] | None = None) -> EventRing:
    ring = EventRing(capacity, next_id=start)
    for i in range(count):
        ring.append(ev(start + i, pads[i] if pads else 0))
    return ring

