"""Builders shared by the tests of sse gather."""

from __future__ import annotations

import re

from daemon.bus import BusLimits, SessionBus
from sdk.protocol.events import SessionUpdateData

ID_LINE = re.compile(rb"^id: (\d+)$", re.M)


def new_bus() -> SessionBus:
    return SessionBus("s", BusLimits(10_000, 8 << 20, 4 << 20, 8000), None)


def publish(bus: SessionBus, count: int, text_bytes: int = 8) -> None:
    for _ in range(count):
        bus.publish(SessionUpdateData(session_id="s", update={
            "sessionUpdate": "agent_message_chunk",
            "content": {"type": "text", "text": "x" * text_bytes}}), flush=False)
    bus.flush()

