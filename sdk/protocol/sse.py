"""The SSE frame codec of the daemon's event stream: the frame encoder and the parser.

Encoding (the daemon's side): one frame per event, ``id:`` only when the event has an id::

    id: 3
    event: session_update
    data: {"id":3,"v":1,"type":"session_update",...}

:data:`SSE_FRAME` is that frame as a ``%``-format (id, type, envelope), the one definition
of its layout; everything that writes frames is made of it: :func:`sse_head` (everything
before the envelope's bytes, so a writer can send ``head + raw + SSE_FRAME_END`` without
copying the envelope), :func:`encode_sse_frame` (the whole frame) and :func:`frame_format`
(the frame of one event type, for a writer that formats many at once). The stream opens with
:func:`sse_retry` and idles with :data:`SSE_HEARTBEAT`.

Parsing (the client's side): :class:`SSEParser` is incremental and sans-IO. Handed bytes, it
returns the complete, valid envelopes they finish:

- frames end at a blank line; lines end with ``\\n`` or ``\\r\\n`` (mixed is fine);
- only ``data:`` lines make events (one leading space stripped, several joined with ``\\n``);
  ``id:``, ``event:`` and ``:`` comments are ignored because the JSON carries the id;
- ``retry:`` with only ASCII digits sets :attr:`SSEParser.retry_ms`, the stream's reconnection
  time (any other value is ignored, as the WHATWG rules say);
- a frame that is not a valid envelope (see :func:`sdk.protocol.envelope.decode_event`) is
  skipped;
- bytes of an unfinished frame beyond the cap (16 MiB) raise :class:`SSEBufferOverflow`;
- a trailing partial frame at EOF is discarded (WHATWG rule).

Scanning uses ``bytearray.find`` and resumes where the previous search stopped, so the cost is
linear in the input however it is chunked.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from sdk.protocol.envelope import DaemonEvent, decode_event
from sdk.protocol.errors import SSEBufferOverflow

__all__ = [
    "DEFAULT_RETRY_MS",
    "MAX_BUFFER_BYTES",
    "SSE_FRAME",
    "SSE_FRAME_END",
    "SSE_HEARTBEAT",
    "SSEBufferOverflow",
    "SSEParser",
    "encode_sse_frame",
    "frame_format",
    "parse_sse",
    "sse_head",
    "sse_retry",
]

MAX_BUFFER_BYTES: Final = 16 * 1024 * 1024

#: The reconnection time the daemon announces at the start of every stream.
DEFAULT_RETRY_MS: Final = 3000
#: The comment frame the daemon sends after a quiet interval (parsers ignore it).
SSE_HEARTBEAT: Final = b": heartbeat\n\n"

#: One event's frame: its ``id:`` line, its ``event:`` line, one ``data:`` line holding the
#: envelope, and the blank line that ends the frame. The id's line is there only when the
#: event has an id.
SSE_FRAME: Final = b"id: %d\nevent: %b\ndata: %b\n\n"
_ID_LINE: Final = SSE_FRAME[: SSE_FRAME.index(b"\n") + 1]  # id: %d\n
# The lines after the id up to the envelope (event: %b\ndata: ), and what follows it.
_HEAD, SSE_FRAME_END = SSE_FRAME[len(_ID_LINE):].rsplit(b"%b", 1)


def sse_head(event_type: str, event_id: int | None) -> bytes:
    """The frame's lines before the envelope: ``id:`` (when there is one), ``event:`` and the
    ``data: `` prefix. The frame is ``sse_head(...) + envelope + SSE_FRAME_END``."""
    head = _HEAD % event_type.encode()
    return head if event_id is None else _ID_LINE % event_id + head


def encode_sse_frame(envelope: bytes, event_type: str, event_id: int | None) -> bytes:
    """One whole SSE frame for an encoded envelope (compact JSON: it is always one line)."""
    return sse_head(event_type, event_id) + envelope + SSE_FRAME_END


def frame_format(event_type: str) -> bytes:
    """:data:`SSE_FRAME` with ``event_type`` filled in: a ``%``-format of the frames of that
    type's events with an id, the id (``%d``) and the envelope (``%b``) to go in."""
    return SSE_FRAME.replace(b"%b", event_type.encode().replace(b"%", b"%%"), 1)


def sse_retry(retry_ms: int = DEFAULT_RETRY_MS) -> bytes:
    """The ``retry:`` frame that opens a stream."""
    if retry_ms < 0:
        raise ValueError(f"retry_ms must be >= 0, got {retry_ms}")
    return b"retry: %d\n\n" % retry_ms

_BOM: Final = b"\xef\xbb\xbf"


class SSEParser:
    """Feed it chunks with :meth:`feed`; call :meth:`close` at EOF."""

    __slots__ = (
        "_at_start",
        "_buf",
        "_closed",
        "_data",
        "_data_bytes",
        "_max_buffer",
        "retry_ms",
    )

    def __init__(self, max_buffer: int = MAX_BUFFER_BYTES) -> None:
        if max_buffer < 1:
            raise ValueError(f"max_buffer must be positive, got {max_buffer}")
        self._max_buffer = max_buffer
        # Invariant between calls: ``_buf`` holds only an unterminated line (no b"\n").
        self._buf = bytearray()
        self._data: list[bytes] = []
        self._data_bytes = 0
        self._at_start = True
        self._closed = False
        self.retry_ms: int | None = None
        """The last valid ``retry:`` value seen (milliseconds), None until one arrives."""

    @property
    def pending_bytes(self) -> int:
        """Bytes held for the unfinished frame (partial line plus collected data lines)."""
        return len(self._buf) + self._data_bytes

    def feed(self, chunk: bytes | bytearray | memoryview) -> list[DaemonEvent]:
        """Consume ``chunk``; return the valid events of every frame it completes, in order."""
        if self._closed:
            raise RuntimeError("SSEParser.feed() after close()")
        buf = self._buf
        # Everything already buffered is one unterminated line, so the search resumes at its end.
        pos = len(buf)
        buf += chunk
        out: list[DaemonEvent] = []
        start = 0
        find = buf.find
        startswith = buf.startswith
        data = self._data
        # The common lines are handled here without a call or a copy: a blank line ends the
        # frame, a ``data:`` line is copied once (out of the view), and ``id:``/``event:``
        # lines and comments are skipped where they lie. A BOM at the stream's start and
        # ``retry:`` lines take the general path (:meth:`_line`).
        with memoryview(buf) as view:
            while (nl := find(b"\n", pos)) != -1:
                end = nl - 1 if nl > start and buf[nl - 1] == 0x0D else nl
                if self._at_start or startswith(b"retry:", start, end):
                    self._line(bytes(view[start:end]), out)
                elif end == start:
                    if data:
                        # _dispatch inlined for the common frame of one data line.
                        if len(data) == 1:
                            payload = data[0]
                            data.clear()
                            self._data_bytes = 0
                            event = decode_event(payload)
                            if event is not None:
                                out.append(event)
                        else:
                            self._dispatch(out)
                elif startswith(b"data:", start, end):
                    value_at = start + 6 if end > start + 5 and buf[start + 5] == 0x20 else start + 5
                    data.append(bytes(view[value_at:end]))
                    self._data_bytes += end - value_at + 1
                elif end - start == 4 and startswith(b"data", start, end):
                    # A field name without a colon has the empty string as its value.
                    data.append(b"")
                    self._data_bytes += 1
                start = pos = nl + 1
        if start:
            del buf[:start]
        if len(buf) + self._data_bytes > self._max_buffer:
            size = len(buf) + self._data_bytes
            self._reset()
            self._closed = True
            raise SSEBufferOverflow(
                f"SSE frame exceeds the {self._max_buffer}-byte buffer without ending "
                f"({size} bytes pending)"
            )
        return out

    def close(self) -> list[DaemonEvent]:
        """End of stream: an unfinished frame is discarded, so this never yields events."""
        self._reset()
        self._closed = True
        return []

    def _reset(self) -> None:
        self._buf.clear()
        self._data.clear()
        self._data_bytes = 0

    def _line(self, line: bytes, out: list[DaemonEvent]) -> None:
        if self._at_start:
            self._at_start = False
            if line.startswith(_BOM):
                line = line[len(_BOM) :]
        if not line:
            self._dispatch(out)
            return
        if line.startswith(b"data:"):
            value = line[6:] if line[5:6] == b" " else line[5:]
        elif line == b"data":
            # A field name without a colon has the empty string as its value.
            value = b""
        else:
            if line.startswith(b"retry:"):
                raw = line[7:] if line[6:7] == b" " else line[6:]
                if raw and raw.isdigit() and raw.isascii():
                    self.retry_ms = int(raw)
            return
        self._data.append(value)
        self._data_bytes += len(value) + 1

    def _dispatch(self, out: list[DaemonEvent]) -> None:
        data = self._data
        if not data:
            return
        payload = data[0] if len(data) == 1 else b"\n".join(data)
        data.clear()
        self._data_bytes = 0
        event = decode_event(payload)
        if event is not None:
            out.append(event)


def parse_sse(chunks: Iterable[bytes]) -> list[DaemonEvent]:
    """Parse a whole stream given as chunks (a convenience for tests and tools)."""
    parser = SSEParser()
    events: list[DaemonEvent] = []
    for chunk in chunks:
        events.extend(parser.feed(chunk))
    events.extend(parser.close())
    return events
