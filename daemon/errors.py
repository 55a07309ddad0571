"""The daemon's process-level error: why it refuses to start (or must stop).

Raised anywhere start-up can fail (the data directory, the transcript, the listening socket,
cluster mode's checks) and turned into one line on stderr and exit status 1 by
``python -m daemon``.
"""

from __future__ import annotations

__all__ = ["DaemonStartError"]


class DaemonStartError(Exception):
    """The daemon refuses to start (the message is the one-line reason)."""
