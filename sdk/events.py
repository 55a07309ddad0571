"""Typed daemon events (CLIENT-SPEC §1).

CORE CONTRACT (the WebUI model depends on these names; the SDK work extends this module):

    class DaemonEvent(msgspec.Struct):      # the envelope, wire names via renames
        id: int | None = None
        v: int = 1
        type: str = ""
        data: Any = None                    # the raw JSON payload (dict for every known type)
        prompt_id: str | None = None        # wire "promptId"
        originator_client_id: str | None = None   # wire "originatorClientId"
        meta: dict[str, Any] | None = None  # wire "_meta"

    def event_prompt_id(event) -> str | None   # envelope promptId, else data.promptId
"""

from __future__ import annotations

from typing import Any

import msgspec


class DaemonEvent(msgspec.Struct, omit_defaults=True):
    """One frame from the daemon: SSE, load snapshot or transcript page."""

    type: str
    v: int = 1
    id: int | None = None
    data: Any = None
    prompt_id: str | None = msgspec.field(default=None, name="promptId")
    originator_client_id: str | None = msgspec.field(default=None, name="originatorClientId")
    meta: dict[str, Any] | None = msgspec.field(default=None, name="_meta")


def event_prompt_id(event: DaemonEvent) -> str | None:
    """The prompt an event belongs to: the envelope ``promptId``, else ``data.promptId``."""
    if isinstance(event.prompt_id, str) and event.prompt_id:
        return event.prompt_id
    data = event.data
    if isinstance(data, dict):
        pid = data.get("promptId")
        if isinstance(pid, str) and pid:
            return pid
    return None
