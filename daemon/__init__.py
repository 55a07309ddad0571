"""turnkeeper daemon: serves ACP agent sessions over HTTP, SSE and WebSocket.

``python -m daemon`` (or ``turnkeeper-daemon``) runs it. This top-level name is shared with the
unrelated PyPI package ``python-daemon``; ``daemon.clash`` detects when both are installed.
"""

from __future__ import annotations

TURNKEEPER = True
"""Marks this ``daemon`` package as turnkeeper's (``python-daemon`` has no such attribute)."""

__all__ = ["TURNKEEPER", "__version__"]


def __getattr__(name: str) -> object:
    # The version is the protocol's (sdk.protocol.__version__), read when asked for: importing
    # the daemon package itself (``from daemon import malloc``, the clash check) loads nothing.
    if name == "__version__":
        from sdk.protocol import __version__

        return __version__
    raise AttributeError(f"module 'daemon' has no attribute {name!r}")
