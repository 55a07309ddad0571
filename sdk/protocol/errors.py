"""The protocol's own exceptions: what reading the wire can raise.

    DaemonError                                  base of every error raised on purpose
    ├── SSEBufferOverflow                        an SSE frame over the parser's buffer cap
    └── TurnError(code, message, prompt_id)      a prompt ended with a ``turn_error`` terminal

The SDK builds its HTTP and transport errors on :class:`DaemonError` (``sdk._errors``), so one
``except DaemonError`` catches everything the protocol and the SDK raise on purpose.

Pure: no I/O.
"""

from __future__ import annotations

__all__ = ["DaemonError", "SSEBufferOverflow", "TurnError"]


class DaemonError(Exception):
    """Base of every error the protocol and the SDK raise on purpose."""


class SSEBufferOverflow(DaemonError):
    """An SSE frame grew past the parser's buffer cap without a terminating blank line."""


class TurnError(DaemonError):
    """A prompt ended with a ``turn_error`` terminal."""

    def __init__(self, code: str | None, message: str, prompt_id: str | None) -> None:
        self.code = code
        self.message = message
        self.prompt_id = prompt_id
        tag = f" ({code})" if code else ""
        super().__init__(f"turn {prompt_id or '?'} failed{tag}: {message}")
