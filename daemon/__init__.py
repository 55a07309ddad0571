"""turnkeeper daemon: serves ACP agent sessions over HTTP, SSE and WebSocket.

``python -m daemon`` (or ``turnkeeper-daemon``) runs it. This top-level name is shared with the
unrelated PyPI package ``python-daemon``; ``daemon.clash`` detects when both are installed.
"""

from daemon._version import __version__

TURNKEEPER = True
"""Marks this ``daemon`` package as turnkeeper's (``python-daemon`` has no such attribute)."""

__all__ = ["TURNKEEPER", "__version__"]
