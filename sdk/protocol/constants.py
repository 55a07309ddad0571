"""Numbers and names the daemon and its clients must agree on (one definition each)."""

from __future__ import annotations

from typing import Final

#: Largest event id / cursor a JSON number carries exactly (JavaScript's Number.MAX_SAFE_INTEGER).
MAX_EVENT_ID: Final = 2**53 - 1

#: The envelope schema version every frame carries as ``v``.
ENVELOPE_VERSION: Final = 1

#: The two event types that end a prompt; every admitted prompt gets exactly one.
TERMINAL_TYPES: Final = frozenset({"turn_complete", "turn_error"})

__all__ = ["ENVELOPE_VERSION", "MAX_EVENT_ID", "TERMINAL_TYPES"]
