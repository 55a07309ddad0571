"""Builders shared by the tests of replay window."""

from __future__ import annotations

import itertools
from typing import Any

from daemon.core.envelope import Event, make_event
from daemon.core.replay_window import Record

_ids = itertools.count(1)


def ev(text: str = "x", event_type: str = "session_update") -> Event:
    data: Any
    if event_type == "session_update":
        data = {"sessionId": "s", "update": {"sessionUpdate": "agent_message_chunk",
                                             "content": {"type": "text", "text": text}}}
    else:
        data = {"sessionId": "s", "stopReason": "end_turn", "promptId": "p"}
    event = make_event(next(_ids), event_type, data, now_ms=1, prompt_id="p")
    assert event is not None
    return event


def turn(n_events: int, tag: str, *, record_ids: bool = True, pad: int = 0) -> list[Record]:
    records = [
        Record(ev(f"{tag}-{i}" + "." * pad), f"{tag}-rec-{i}" if record_ids else None)
        for i in range(n_events - 1)
    ]
    records.append(Record(ev(event_type="turn_complete"), f"{tag}-rec-end" if record_ids else None))
    return records


def size(records: list[Record]) -> int:
    return sum(r.event.size for r in records)

