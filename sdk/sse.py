"""The SSE frame codec, re-exported from its home :mod:`sdk.protocol.sse` (kept importable)."""

from __future__ import annotations

from sdk.protocol.sse import (
    DEFAULT_RETRY_MS,
    MAX_BUFFER_BYTES,
    SSE_HEARTBEAT,
    SSEBufferOverflow,
    SSEParser,
    encode_sse_frame,
    parse_sse,
    sse_head,
    sse_retry,
)

__all__ = [
    "DEFAULT_RETRY_MS",
    "MAX_BUFFER_BYTES",
    "SSE_HEARTBEAT",
    "SSEBufferOverflow",
    "SSEParser",
    "encode_sse_frame",
    "parse_sse",
    "sse_head",
    "sse_retry",
]
