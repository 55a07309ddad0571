"""An event stream's request: its query and headers parsed (cursor, epoch, ``maxQueued``), the
subscriber cap, and the errors answered before a stream starts (HTTP, or a WebSocket upgrade's
denial). Trio shell (the answers are ASGI sends)."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qs

import msgspec

from sdk.protocol import headers as wire_headers
from sdk.protocol import http as wire
from sdk.protocol.constants import MAX_EVENT_ID

from ..bus import SessionBus
from ..core.envelope import encode_json
from ..core.subscriber import (
    MAX_QUEUED_DEFAULT,
    MAX_QUEUED_MAX,
    MAX_QUEUED_MIN,
)

# The protocol's header names as ASGI hands them over and as the answers carry them.
_LAST_EVENT_ID = wire_headers.lower(wire_headers.LAST_EVENT_ID)
_EPOCH = wire_headers.lower(wire_headers.EVENT_EPOCH)
_EPOCH_BYTES = _EPOCH.encode()
_STREAM_ID_BYTES = wire_headers.lower(wire_headers.SSE_STREAM_ID).encode()

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


MAX_SUBSCRIBERS = 64
EPOCH_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")


class StreamRequestError(Exception):
    def __init__(self, status: int, body: wire.ErrorBody,
                 headers: dict[str, str] | None = None):
        super().__init__(body.error)
        self.status = status
        self.body = body
        self.headers = headers or {}


class StreamRequest(msgspec.Struct, frozen=True):
    cursor: int | None
    epoch: str | None
    max_queued: int


def _is_decimal(raw: str, max_digits: int) -> bool:
    # isascii: str.isdigit() also accepts digits int() refuses ("²"); the length bound keeps
    # int() clear of its 4300-digit limit.
    return 0 < len(raw) <= max_digits and raw.isascii() and raw.isdigit()


def parse_cursor(raw: str | None) -> int | None:
    if raw is None or not _is_decimal(raw, 64):
        return None
    value = int(raw)
    return value if value <= MAX_EVENT_ID else None


def parse_epoch(raw: str | None) -> str | None:
    return raw if raw is not None and EPOCH_RE.fullmatch(raw) else None


def parse_stream_request(headers: dict[str, str], query_string: bytes) -> StreamRequest:
    query = {k: v[-1] for k, v in parse_qs(query_string.decode("latin-1")).items()}
    max_queued = MAX_QUEUED_DEFAULT
    if "maxQueued" in query:
        raw = query["maxQueued"]
        if not _is_decimal(raw, 64) or not MAX_QUEUED_MIN <= int(raw) <= MAX_QUEUED_MAX:
            raise StreamRequestError(400, wire.ErrorBody(
                error=f"maxQueued must be an integer between {MAX_QUEUED_MIN} and "
                      f"{MAX_QUEUED_MAX}", code="invalid_max_queued"))
        max_queued = int(raw)
    if _LAST_EVENT_ID in headers or _EPOCH in headers:
        cursor = parse_cursor(headers.get(_LAST_EVENT_ID))
        epoch = parse_epoch(headers.get(_EPOCH))
    else:  # extension: EventSource cannot set headers
        cursor = parse_cursor(query.get("lastEventId"))
        epoch = parse_epoch(query.get("epoch"))
    return StreamRequest(cursor, epoch, max_queued)


def check_capacity(bus: SessionBus) -> None:
    if len(bus.subscribers) >= MAX_SUBSCRIBERS:
        raise StreamRequestError(
            429, wire.ErrorBody(error="Too many subscribers for this session",
                                code="subscriber_limit_exceeded", limit=MAX_SUBSCRIBERS),
            {"Retry-After": "5"})


async def send_json_error(send: Send, err: StreamRequestError) -> None:
    body = encode_json(err.body)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in err.headers.items()]
    await send({"type": "http.response.start", "status": err.status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def deny_ws(send: Send, status: int, body: wire.ErrorBody,
                  headers: dict[str, str] | None = None) -> None:
    """Answer a WebSocket upgrade with a plain HTTP error (ASGI websocket denial response)."""
    raw = encode_json(body)
    hdrs = [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]
    hdrs += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "websocket.http.response.start", "status": status, "headers": hdrs})
    await send({"type": "websocket.http.response.body", "body": raw, "more_body": False})
