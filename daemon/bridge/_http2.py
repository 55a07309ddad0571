"""HTTP/2: served only when asked for (``--http2``), and then with real backpressure.

No client of the daemon needs HTTP/2: the SDK and the CLI speak HTTP/1.1, and browsers use
HTTP/2 only over TLS, which the daemon does not serve. On plain TCP, Hypercorn as shipped
switches a connection to HTTP/2 on an ``Upgrade: h2c`` request or the prior-knowledge preface.
Unless ``--http2`` is given (Hypercorn's ``alpn_protocols`` then lists ``h2``), this module
makes it ignore the upgrade (the request is answered in HTTP/1.1, as RFC 9110 lets a server do)
and answer the preface with one 505 and close.

With ``--http2``, a stream's writes must stall when its reader stops reading, as a socket write
does over HTTP/1.1: that is what the slow-client rules and ``--stalled-write-ms`` see. Hypercorn
copies a stream's body into a per-stream buffer and makes the writer wait above a high-water
mark until the buffer drains below the low-water mark, but it decided "drained" on the size of
what its sender popped, not on what was left: a peer that keeps a zero flow-control window
makes every pop empty, so every write went through and the buffer grew without bound (64 such
streams: 0 evictions, RSS 49 → 970 MiB). :class:`SendBuffer` replaces it: the writer is
released only once the buffer is truly below the mark, and it keeps the chunks the application
wrote rather than a copy of them, so a stalled stream holds its unsent bytes once, under the
mark plus one write. When the connection ends, every stream's buffer is closed so a writer
waiting on one is released rather than left blocked for good. And a DATA frame for a stream whose answer is over (its handler
ended) is dropped, its flow-control window given back: Hypercorn looked the stream up and let
the ``KeyError`` end the whole server, so one such frame stopped the daemon.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Any, Protocol

import msgspec

from sdk.protocol.http import ErrorBody

log = logging.getLogger("daemon.http2")

_REFUSAL_BODY = msgspec.json.encode(ErrorBody(
    error="HTTP/2 is not enabled on this daemon (start it with --http2)", code="http2_disabled"))
#: The answer to an HTTP/2 prior-knowledge preface when HTTP/2 is off.
REFUSED_PREFACE = (b"HTTP/1.1 505 HTTP Version Not Supported\r\n"
                   b"content-type: application/json\r\nconnection: close\r\n"
                   b"content-length: %d\r\n\r\n" % len(_REFUSAL_BODY)) + _REFUSAL_BODY

_installed = False


class _PrefaceRefused(Exception):
    """An HTTP/2 preface on a daemon that serves only HTTP/1.1 (handled by the wrapper)."""


class _Event(Protocol):
    """Hypercorn's event abstraction (``context.event_class``): async set, clear and wait."""

    async def set(self) -> None: ...
    async def clear(self) -> None: ...
    async def wait(self) -> None: ...


class SendBufferComplete(Exception):
    """A write to a stream whose body is complete (Hypercorn's ``BufferCompleteError``)."""


class SendBuffer:
    """One HTTP/2 stream's unsent body: the interface of Hypercorn's ``StreamBuffer``.

    :meth:`push` (the application's write) returns once the unsent bytes are under
    ``high_water``, waiting for the sender to take them down below ``low_water`` otherwise;
    :meth:`pop` (the sender, as far as the peer's flow-control window allows) takes them. The
    chunks are kept as the application wrote them, not copied."""

    def __init__(self, event_class: type[_Event], high_water: int, low_water: int,
                 complete_error: type[Exception] = SendBufferComplete) -> None:
        self._chunks: deque[memoryview] = deque()
        self._size = 0
        self._complete = False
        self._is_empty = event_class()
        self._paused = event_class()
        self._high, self._low = high_water, low_water
        self._complete_error = complete_error

    def __len__(self) -> int:
        return self._size

    @property
    def complete(self) -> bool:
        """The body is complete and all of it was taken."""
        return self._complete and self._size == 0

    def set_complete(self) -> None:
        self._complete = True

    async def drain(self) -> None:
        await self._is_empty.wait()

    async def close(self) -> None:
        """Drop what is unsent and release a writer or drainer waiting (the stream is over)."""
        self._complete = True
        self._chunks.clear()
        self._size = 0
        await self._is_empty.set()
        await self._paused.set()

    async def push(self, data: bytes) -> None:
        if self._complete:
            raise self._complete_error()
        if data:
            self._chunks.append(memoryview(data))
            self._size += len(data)
        await self._is_empty.clear()
        while self._size >= self._high and not self._complete:
            await self._paused.clear()
            await self._paused.wait()

    async def pop(self, max_length: int) -> bytes:
        parts: list[memoryview] = []
        want = max_length
        while want > 0 and self._chunks:
            head = self._chunks[0]
            if len(head) <= want:
                parts.append(self._chunks.popleft())
                want -= len(head)
            else:
                parts.append(head[:want])
                self._chunks[0] = head[want:]
                want = 0
        data = b"".join(parts)
        self._size -= len(data)
        if self._size < self._low:  # what is left, not what was taken
            await self._paused.set()
        if self._size == 0:
            await self._is_empty.set()
        return data


def http2_allowed(config: Any) -> bool:
    """Whether the server config offers HTTP/2 (``daemon.server`` lists ``h2`` only with
    ``--http2``)."""
    return "h2" in getattr(config, "alpn_protocols", ())


def install() -> bool:
    """Patch Hypercorn's protocol choice and HTTP/2 stream buffers (idempotent); returns
    whether they are active. ``daemon.server_patches`` has checked the shape first."""
    global _installed
    if _installed:
        return True
    try:
        from h2.events import DataReceived
        from hypercorn.events import Closed, RawData
        from hypercorn.protocol import ProtocolWrapper, h2, h11
    except ImportError:  # pragma: no cover - a dependency
        return False
    original_check = h11.H11Protocol._check_protocol
    original_handle = ProtocolWrapper.handle
    original_h2_handle = h2.H2Protocol.handle
    original_h2_events = h2.H2Protocol._handle_events
    high_water, low_water = int(h2.BUFFER_HIGH_WATER), int(h2.BUFFER_LOW_WATER)

    async def _check_protocol(self: Any, event: Any) -> None:
        if http2_allowed(self.config):
            await original_check(self, event)
            return
        if event.method == b"PRI" and event.target == b"*" and event.http_version == b"2.0":
            raise _PrefaceRefused
        # Anything else, an ``Upgrade: h2c`` request included, is served as HTTP/1.1.

    async def handle(self: Any, event: Any) -> None:
        try:
            await original_handle(self, event)
        except _PrefaceRefused:
            await self.send(RawData(data=REFUSED_PREFACE))
            await self.send(Closed())

    def send_buffer(event_class: type[_Event]) -> SendBuffer:
        return SendBuffer(event_class, high_water, low_water, h2.BufferCompleteError)

    async def h2_handle(self: Any, event: Any) -> None:
        await original_h2_handle(self, event)
        if isinstance(event, Closed):
            for buffer in list(self.stream_buffers.values()):
                await buffer.close()  # releases a writer waiting for a window that never comes

    async def _handle_events(self: Any, events: list[Any]) -> None:
        kept = []
        for event in events:
            if isinstance(event, DataReceived) and event.stream_id not in self.streams:
                self.connection.acknowledge_received_data(event.flow_controlled_length,
                                                          event.stream_id)
            else:
                kept.append(event)
        await original_h2_events(self, kept)

    setattr(h11.H11Protocol, "_check_protocol", _check_protocol)  # noqa: B010 - patching
    setattr(ProtocolWrapper, "handle", handle)  # noqa: B010
    setattr(h2, "StreamBuffer", send_buffer)  # noqa: B010 - H2Protocol builds them by this name
    setattr(h2.H2Protocol, "handle", h2_handle)  # noqa: B010
    setattr(h2.H2Protocol, "_handle_events", _handle_events)  # noqa: B010
    _installed = True
    return True
