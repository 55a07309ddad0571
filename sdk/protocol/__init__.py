"""The turnkeeper wire protocol: one sans-IO definition shared by the daemon, the SDK and the
WebUI model.

Pure: no trio, no sockets, no clock. Modules:

- ``constants``: shared numbers and names (max event id, terminal types).
"""

from sdk.protocol.constants import ENVELOPE_VERSION, MAX_EVENT_ID, TERMINAL_TYPES

__all__ = ["ENVELOPE_VERSION", "MAX_EVENT_ID", "TERMINAL_TYPES"]
