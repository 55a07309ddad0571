"""The load-generating SSE client: one separate process serving every subscriber.

Run as ``python -m benchmarks.loadgen`` (a benchmark starts it through :class:`LoadGen`). It
opens ``--subscribers`` raw HTTP/1.1 connections to ``GET /session/{id}/events``, decodes the
chunked transfer encoding, splits the body at the blank-line separator ``\\n\\n`` and reads
every frame's ``id:`` line; it never decodes JSON, so one process keeps up with many subscribers
and its own CPU stays small beside the daemon's. A subscriber is done when it sees
``event: <until>``, is evicted (``event: client_evicted``; with ``--reconnect`` it resumes from
its last id instead) or its stream ends. What each subscriber received is checked against what
was published with :func:`check_delivery`: contiguous ids, the expected first and last id, and
the finishing frame (the terminal) carrying the last id. A gap is always an error, but one the
daemon announced (a ``state_resync_required`` frame right before it: a subscriber that came
back after the ring had moved on) is reported as such, apart from a gap nothing announced; the
frames are searched for it only when a gap is found, so the check costs nothing per byte.

Protocol on stdout, one JSON object per line:

* ``{"ready": true, "t": <monotonic>}`` once every subscriber has its response headers (only
  with ``--announce-ready``; the benchmark sends its prompt after this line);
* ``{"rounds": [[<subscriber>, ...], ...], "cpu_s": <float>}`` at the end, where a subscriber is
  ``{"status", "bytes", "t_start", "t_headers", "t_done", "done", "evicted", "error",
  "first_id", "last_id", "ids", "id_error", "terminal_id", "reconnects"}``
  and times are ``time.monotonic()`` values (CLOCK_MONOTONIC is system-wide, so the benchmark
  compares them with its own clock).

With ``--transport ws`` the subscribers are WebSockets (``GET /session/{id}/ws``, the cursor
and epoch in the query): :class:`WSCounter` reads each text message's id and type from the
start of its envelope and checks them exactly as an SSE frame's, and answers pings.

Stdlib and the protocol's header names only, no trio: it starts fast and measures only itself.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import selectors
import socket
import subprocess
import sys
import time
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from operator import itemgetter
from typing import IO, Any
from urllib.parse import quote

from sdk.protocol.headers import EVENT_EPOCH, LAST_EVENT_ID, lower

RECV_BYTES = 1 << 20
MAX_RECONNECTS = 100
_EPOCH = lower(EVENT_EPOCH).encode()  # as a response header line names it
EVICTED = b"event: client_evicted\n"
RESYNC = b"\nevent: state_resync_required\n"
#: How an ``id_error`` says the daemon announced the gap.
ANNOUNCED = "(announced by state_resync_required"
RESYNC_REASON = re.compile(rb'"reason":"([^"\\]*)"')
# What of a read is kept for the next one: enough to hold the frames after its last id frame
# (a state_resync_required frame is a few hundred bytes).
LOOKBACK = 4096
# An id line, found by its literal prefix (fast); ``(?=\n)``: only a complete one.
ID_LINE = re.compile(rb"\nid: (\d+)(?=\n)")
MARKER_WINDOW = 16 * 1024
# The start of a WebSocket message's envelope: its id (if it has one), then its type.
WS_ENVELOPE_HEAD = re.compile(rb'\{(?:"id":(\d+),)?"v":\d+,"type":"([^"\\]+)"')
WS_HEAD_BYTES = 256  # how much of a message the envelope's head is looked for in
# A whole text frame's head (FIN, opcode 1, unmasked; its length in one of three forms) and the
# head of the envelope it carries up to its id, in one match: (the length field, the id or
# b""). The type is read only where it is needed (:func:`_kind`): capturing it for every
# message doubled the scan's cost.
WS_TEXT_FRAME = re.compile(
    rb'\x81([\x00-\x7d]|\x7e..|\x7f........)\{(?:"id":(\d+),)?"v":', re.DOTALL)
# A message as the reader keeps it: (its length field, its id or b"").
Message = tuple[bytes, bytes]
_FIELD = itemgetter(0)
_ID = itemgetter(1)


def _kind(buf: bytearray, start: int) -> bytes:
    """The envelope type of the text message whose frame starts at ``start`` (b"" if none)."""
    length = buf[start + 1] & 0x7F
    head = start + (4 if length == 126 else 10 if length == 127 else 2)
    found = WS_ENVELOPE_HEAD.match(buf, head, head + WS_HEAD_BYTES)
    return found.group(2) if found is not None else b""


class _FrameSizes(dict[bytes, int]):
    """A text frame's whole size (head and payload) by its length field, worked out once per
    field (every frame's size is then one lookup, and a run of them is summed in C)."""

    def __missing__(self, field: bytes) -> int:
        size = 1 + len(field) + (field[0] if len(field) == 1
                                 else int.from_bytes(field[1:], "big"))
        self[field] = size
        return size


_FRAME_SIZES = _FrameSizes()


def _cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


# The decimal spellings of the ids 0, 1, 2, ... seen so far, shared by every subscriber of the
# process (they all read the same ids): comparing a read's id lines with a slice of it costs one
# memcmp per id, against an int() per id (a fifth of the generator's CPU at 64 subscribers).
_SPELLED: list[bytes] = []
_SPELL_AHEAD = 1 << 16  # spelled at a time past the highest id asked for
_SPELL_MAX = 1 << 24  # ids above this are judged as numbers: the list stays bounded


def _spellings(first: int, count: int) -> list[bytes] | None:
    """The spellings of the ids ``first`` .. ``first + count - 1`` (``first >= 0``), or
    ``None`` past ``_SPELL_MAX``."""
    end = first + count
    if end > len(_SPELLED):
        if end > _SPELL_MAX:
            return None
        _SPELLED.extend(b"%d" % i for i in range(len(_SPELLED),
                                                  min(end + _SPELL_AHEAD, _SPELL_MAX)))
    return _SPELLED[first:end]


class SSECounter:
    """Counts and checks SSE frames in an HTTP/1.1 response, fed raw socket bytes. Pure.

    Besides the body's bytes it reads every ``id:`` line (the lines of a frame are split by
    raw newlines, and JSON data never holds one, so a line starting with ``id: `` is always an
    id field): it keeps the first and the last id, how many ids arrived, the id of the frame
    that finished the subscriber, and the first place where an id was not the one after the
    previous id (a gap, a duplicate or a reordering). Only whole frames are scanned: the bytes
    after the last blank line of a read wait for the next one. :meth:`restart` begins the next
    response of a subscriber that reconnected, keeping the id checks running across both.
    """

    def __init__(self, until: bytes) -> None:
        self.until = until
        self.first_id: int | None = None
        self.last_id: int | None = None
        self.ids = 0
        self.id_error: str | None = None
        self.terminal_id: int | None = None
        self.reconnects = 0
        self.epoch: str | None = None
        # The frames after the last id frame scanned so far (LOOKBACK bytes at most).
        self._after_last_id = b""
        self.bytes = 0
        self._reset_response()

    def _reset_response(self) -> None:
        self.status: int | None = None
        self.error: str | None = None
        self.done = False
        self.evicted = False
        self.ended = False
        self._head = b""
        self._chunked = False
        self._left = 0  # data bytes left in the current chunk
        self._skip = 0  # CRLF after a chunk's data still to skip
        self._partial = b""  # an incomplete chunk-size line
        # The unscanned rest of the body (an incomplete frame); the body is scanned as if it
        # began with a newline, so an id line at its very start is found like any other.
        self._carry = b"\n"

    def restart(self) -> None:
        """The subscriber reconnected: parse a new response, continue the id checks."""
        self.reconnects += 1
        self._reset_response()

    @property
    def has_headers(self) -> bool:
        return self.status is not None

    @property
    def finished(self) -> bool:
        return self.done or self.evicted or self.ended or self.error is not None

    def feed(self, data: bytes | bytearray, length: int | None = None) -> None:
        """Account for ``data[:length]`` (a reused receive buffer is never copied whole)."""
        n = len(data) if length is None else length
        if self.status is None:
            self._head += bytes(data[:n])
            end = self._head.find(b"\r\n\r\n")
            if end < 0:
                return
            head, data = self._head[:end], self._head[end + 4:]
            n = len(data)
            self._head = b""
            self._parse_head(head)
            if self.status != 200:
                self.error = f"HTTP {self.status}: {data[:300].decode(errors='replace')}"
                return
        if not self._chunked:
            if n:
                self._body(data, 0, n)
            return
        if self._partial:
            data, self._partial = self._partial + bytes(data[:n]), b""
            n = len(data)
        pos = 0
        while pos < n and not self.ended:
            if self._left:
                take = min(self._left, n - pos)
                self._body(data, pos, pos + take)
                pos += take
                self._left -= take
                if not self._left:
                    self._skip = 2
            elif self._skip:
                take = min(self._skip, n - pos)
                pos += take
                self._skip -= take
            else:
                end = data.find(b"\r\n", pos, n)
                if end < 0:
                    self._partial = bytes(data[pos:n])
                    return
                size = int(data[pos:end].split(b";", 1)[0], 16)
                pos = end + 2
                if size == 0:
                    self.ended = True
                else:
                    self._left = size

    def eof(self) -> None:
        self.ended = True
        if self.status is None and self.error is None:
            self.error = "connection closed before the response headers"

    def _parse_head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        parts = lines[0].split(None, 2)
        self.status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            key = name.strip().lower()
            if key == b"transfer-encoding" and b"chunked" in value.lower():
                self._chunked = True
            elif key == _EPOCH and self.epoch is None:
                self.epoch = value.strip().decode(errors="replace")

    def _body(self, data: bytes | bytearray, start: int, end: int) -> None:
        if start >= end:
            return
        self.bytes += end - start
        # Only whole frames are scanned; the newline ending the last separator stays in front
        # of the rest (it is the newline before the next frame's first line). The last
        # separator is looked for in the read itself, so the read's bytes are copied once (into
        # the frames); only a read with no whole separator of its own is joined to the carry
        # first (the separator may straddle the two).
        cut = data.rfind(b"\n\n", start, end)
        if cut >= 0:
            frames = b"".join((self._carry, memoryview(data)[start:cut + 2]))
            self._carry = bytes(data[cut + 1:end])
        else:
            text = self._carry + bytes(data[start:end])
            cut = text.rfind(b"\n\n")
            if cut < 0:
                self._carry = text
                return
            frames = text[:cut + 2]
            self._carry = text[cut + 1:]
        found = ID_LINE.findall(frames)
        if found:
            self._check_ids(found, frames)
            recent = frames[-LOOKBACK:]
            last_id_at = recent.rfind(b"\nid: ")
            self._after_last_id = recent[last_id_at:] if last_id_at >= 0 else b""
        else:
            self._after_last_id = (self._after_last_id + frames[-LOOKBACK:])[-LOOKBACK:]
        # The frames that finish a subscriber (its terminal or replay_complete, client_evicted)
        # are the last the daemon sends it, so only the tail of what arrived is searched.
        tail = max(0, len(frames) - MARKER_WINDOW)
        at = frames.find(self.until, tail)
        if at >= 0:
            self.done = True
            id_at = frames.rfind(b"\nid: ", 0, at)
            if id_at > frames.rfind(b"\n\n", 0, at):  # the id line of the finishing frame
                self.terminal_id = int(frames[id_at + 5:frames.index(b"\n", id_at + 1)])
        if frames.find(EVICTED, tail) >= 0:
            self.evicted = True

    def _check_ids(self, found: list[bytes], frames: bytes) -> None:
        """Check a read's id lines (their digits, in order). The usual read, ids counting up
        from the one after the last, is confirmed by one list comparison against the ids'
        spellings (:func:`_spellings`) instead of an int per id; anything else (a gap, a
        repeat, an id spelled with a leading zero) is judged id by id as numbers."""
        first = int(found[0])
        count = len(found)
        if self.id_error is None:
            if self.last_id is not None and first != self.last_id + 1:
                self.id_error = f"id {first} after id {self.last_id}" + self._announcement(
                    self._after_last_id, frames, None, first)
            elif found != _spellings(first, count):  # None too: judged as numbers
                ids = list(map(int, found))
                if ids != list(range(first, first + count)):
                    previous = next(i for i in range(1, count) if ids[i] != ids[i - 1] + 1)
                    self.id_error = f"id {ids[previous]} after id {ids[previous - 1]}" + (
                        self._announcement(b"", frames, ids[previous - 1], ids[previous]))
        if self.first_id is None:
            self.first_id = first
        self.last_id = int(found[-1])
        self.ids += count

    @staticmethod
    def _announcement(before: bytes, frames: bytes, previous: int | None, gap: int) -> str:
        """`` (announced by state_resync_required <reason>)`` when such a frame lies between
        the frame of id ``previous`` (``None``: the start of ``frames``, with ``before`` the
        frames that came after the last id before them) and the frame of id ``gap``, else
        ``""``. Runs only when a gap is found."""
        end = frames.find(b"\nid: %d\n" % gap)
        start = 0 if previous is None else frames.find(b"\nid: %d\n" % previous)
        stretch = before + frames[max(start, 0):end if end >= 0 else len(frames)]
        at = stretch.rfind(RESYNC)
        if at < 0:
            return ""
        reason = RESYNC_REASON.search(stretch, at)
        return (f" {ANNOUNCED} "
                f"{reason.group(1).decode(errors='replace') if reason else '?'})")


class WSCounter(SSECounter):
    """:class:`SSECounter` for a WebSocket: after the handshake's answer (101), each text
    message becomes the SSE lines of its id and type (``id: N``, ``event: T``), which the SSE
    checks then read as they read a frame's; the envelope itself is never decoded. A close
    frame ends the stream (its code in :attr:`close_code`); a ping's pong is queued in
    :attr:`replies` for the caller to send."""

    def _reset_response(self) -> None:
        super()._reset_response()
        self._frames = bytearray()
        self.replies = bytearray()
        self.close_code: int | None = None

    def feed(self, data: bytes | bytearray, length: int | None = None) -> None:
        n = len(data) if length is None else length
        if self.status is None:
            self._head += bytes(data[:n])
            end = self._head.find(b"\r\n\r\n")
            if end < 0:
                return
            head, rest = self._head[:end], self._head[end + 4:]
            self._head = b""
            self._parse_head(head)
            if self.status != 101:
                self.error = f"HTTP {self.status}: {rest[:300].decode(errors='replace')}"
                return
            self._frames += rest
        else:
            self._frames += memoryview(data)[:n]
        self.bytes += n
        self._read_frames()

    def _read_frames(self) -> None:
        buf = self._frames
        messages: list[Message] = []
        starts: list[int] = []  # where each message's frame starts in buf
        pos = self._bulk(buf, messages, starts)
        if pos is None:  # not a plain run of text messages: frame by frame
            pos = self._one_by_one(buf, messages, starts)
        if messages:
            self._messages(buf, messages, starts)
        del buf[:pos]

    @staticmethod
    def _bulk(buf: bytearray, messages: list[Message], starts: list[int]) -> int | None:
        """The usual read, a run of whole text messages (and maybe the start of the next):
        every frame head found in one scan, the frames' bounds checked to follow each other
        from the start of the buffer. Where the whole ones end, or ``None`` when the read holds
        anything else (a control frame, a head not in view yet: :meth:`_one_by_one`)."""
        heads = WS_TEXT_FRAME.findall(buf)
        if not heads or buf[0] != 0x81:
            return None
        ends = list(accumulate(map(_FRAME_SIZES.__getitem__, map(_FIELD, heads))))
        size = len(buf)
        whole = bisect_right(ends, size)
        if whole == 0:
            return None
        # Each whole frame must start where the one before it ended; a head found inside a
        # payload, or a frame the scan skipped, breaks that.
        after = ends[:whole - 1]
        if whole < len(heads) and ends[whole - 1] < size:
            after.append(ends[whole - 1])  # and the next one, if it is in view
        if after:
            first_bytes = itemgetter(*after)(buf)
            if (first_bytes.count(0x81) != len(after) if len(after) > 1
                    else first_bytes != 0x81):
                return None
        messages += heads[:whole] if whole < len(heads) else heads
        starts.append(0)
        starts += ends[:whole - 1]
        return ends[whole - 1]

    def _one_by_one(self, buf: bytearray, messages: list[Message], starts: list[int]) -> int:
        size = len(buf)
        pos = 0
        match = WS_TEXT_FRAME.match
        while True:
            found = match(buf, pos)  # a text message, the daemon's envelope
            if found is not None:
                field, msg_id = found.groups(b"")
                end = pos + _FRAME_SIZES[field]
                if end > size:
                    break
                messages.append((field, msg_id))
                starts.append(pos)
                pos = end
                continue
            step = self._other_frame(buf, pos, size, messages, starts)
            if step is None:
                break
            pos = step
        return pos

    def _messages(self, buf: bytearray, messages: list[Message], starts: list[int]) -> None:
        """Check the ids of a read's messages and look for the finishing ones, as
        :meth:`SSECounter._body` does for frames."""
        found = list(filter(None, map(_ID, messages)))
        finishing = self.until[len(b"event: "):-1]
        if found:
            first, last = int(found[0]), int(found[-1])
            clean = ((self.last_id is None or first == self.last_id + 1)
                     and last - first == len(found) - 1)
            # The SSE lines of the messages, searched only to explain a gap (_announcement).
            frames = b"" if clean else b"".join(
                b"\nid: %b\nevent: %b\n" % (i, _kind(buf, at)) if i
                else b"\nevent: %b\n" % _kind(buf, at)
                for (_, i), at in zip(messages, starts, strict=True))
            self._check_ids(found, frames)
        # The messages that finish a subscriber come last: the last 64 are looked at, and only
        # when their bytes hold one of those types at all.
        tail = starts[-64:]
        if (buf.find(b'"type":"%b"' % finishing, tail[0]) < 0
                and buf.find(b'"type":"client_evicted"', tail[0]) < 0):
            return
        for (_, msg_id), at in zip(messages[-64:], tail, strict=True):
            kind = _kind(buf, at)
            if kind == finishing:
                self.done = True
                self.terminal_id = int(msg_id) if msg_id else None
            elif kind == b"client_evicted":
                self.evicted = True

    def _other_frame(self, buf: bytearray, pos: int, size: int,
                     messages: list[Message], starts: list[int]) -> int | None:
        """A frame the fast path did not take (a control frame, a message whose head is not
        all in view yet, or anything unexpected): where the next one starts, ``None`` until
        it is whole (or once the stream is in error)."""
        if size - pos < 2:
            return None
        opcode, length = buf[pos] & 0x0F, buf[pos + 1] & 0x7F
        head = 2
        if length == 126:
            if size - pos < 4:
                return None
            length, head = int.from_bytes(buf[pos + 2:pos + 4], "big"), 4
        elif length == 127:
            if size - pos < 10:
                return None
            length, head = int.from_bytes(buf[pos + 2:pos + 10], "big"), 10
        start = pos + head
        if size - start < length:
            return None
        if opcode == 1:
            found = WS_ENVELOPE_HEAD.match(buf, start, start + min(length, WS_HEAD_BYTES))
            if buf[pos] != 0x81 or found is None:
                self.error = (f"not a whole text message with an envelope: "
                              f"{bytes(buf[pos:pos + 80])!r}")
                self.ended = True
                return None
            messages.append((b"", found.group(1) or b""))
            starts.append(pos)
        elif opcode == 8:
            self.close_code = int.from_bytes(buf[start:start + 2], "big") if length >= 2 \
                else None
            self.ended = True
        elif opcode == 9:  # a ping: answer with a masked pong of the same payload
            key = os.urandom(4)
            payload = bytes(b ^ key[i % 4] for i, b in enumerate(buf[start:start + length]))
            self.replies += bytes((0x8A, 0x80 | length)) + key + payload
        else:
            self.error = f"an unexpected frame (opcode {opcode})"
            self.ended = True
            return None
        return start + length


@dataclass
class Subscriber:
    sock: socket.socket
    counter: SSECounter
    t_start: float
    t_headers: float | None = None
    t_done: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def report(self) -> dict[str, Any]:
        c = self.counter
        return {"status": c.status, "bytes": c.bytes,
                "t_start": self.t_start, "t_headers": self.t_headers, "t_done": self.t_done,
                "done": c.done, "evicted": c.evicted or c.reconnects > 0, "error": c.error,
                "first_id": c.first_id, "last_id": c.last_id, "ids": c.ids,
                "id_error": c.id_error, "terminal_id": c.terminal_id,
                "reconnects": c.reconnects}


def _request(host: str, port: int, session: str, max_queued: int, last_event_id: int | None,
             epoch: str | None) -> bytes:
    lines = [
        f"GET /session/{quote(session)}/events?maxQueued={max_queued} HTTP/1.1",
        f"Host: {host}:{port}",
        "Accept: text/event-stream",
        "Cache-Control: no-cache",
    ]
    if last_event_id is not None:
        lines.append(f"{LAST_EVENT_ID}: {last_event_id}")
        if epoch:
            lines.append(f"{EVENT_EPOCH}: {epoch}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("ascii")


def _ws_request(host: str, port: int, session: str, max_queued: int,
                last_event_id: int | None, epoch: str | None) -> bytes:
    query = f"maxQueued={max_queued}"
    if last_event_id is not None:
        query += f"&lastEventId={last_event_id}"
        if epoch:
            query += f"&epoch={quote(epoch)}"
    key = base64.b64encode(os.urandom(16)).decode()
    lines = [
        f"GET /session/{quote(session)}/ws?{query} HTTP/1.1",
        f"Host: {host}:{port}",
        "Upgrade: websocket",
        "Connection: Upgrade",
        f"Sec-WebSocket-Key: {key}",
        "Sec-WebSocket-Version: 13",
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("ascii")


def _connect(args: argparse.Namespace, request: bytes) -> socket.socket:
    sock = socket.create_connection((args.host, args.port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(request)
    sock.setblocking(False)
    return sock


def run_round(args: argparse.Namespace, out: IO[str], announce: bool, deadline: float
              ) -> list[dict[str, Any]]:
    """Open every subscriber, read until each is finished, return their reports.

    With ``--reconnect``, a subscriber that is evicted resumes from its last id with the
    stream's epoch, as a client must, and is finished only by ``--until`` or the
    end of a stream; its report then says ``evicted`` and how many times it reconnected.
    """
    make_request = _ws_request if args.transport == "ws" else _request
    counter_class = WSCounter if args.transport == "ws" else SSECounter
    request = make_request(args.host, args.port, args.session, args.max_queued,
                           args.last_event_id, args.epoch)
    until = f"event: {args.until}\n".encode()
    subs: list[Subscriber] = []
    # One receive buffer for every socket: a fresh 1 MiB bytes object per read would cost more
    # (allocation and page faults) than reading the frames in it.
    buf = bytearray(RECV_BYTES)
    with selectors.DefaultSelector() as sel:
        for _ in range(args.subscribers):
            t_start = time.monotonic()
            sub = Subscriber(_connect(args, request), counter_class(until), t_start)
            subs.append(sub)
            sel.register(sub.sock, selectors.EVENT_READ, sub)
        open_count = len(subs)
        announced = not announce
        try:
            while open_count:
                if not announced and all(s.counter.has_headers for s in subs):
                    print(json.dumps({"ready": True, "t": time.monotonic()}), file=out,
                          flush=True)
                    announced = True
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    for s in subs:
                        if not s.counter.finished:
                            s.counter.error = f"timed out after {args.timeout:.0f} s"
                    break
                for key, _ in sel.select(min(remaining, 1.0)):
                    sub = key.data
                    try:
                        length = sub.sock.recv_into(buf)
                    except BlockingIOError:
                        continue
                    except ConnectionResetError:
                        length = 0  # the daemon cut it (a stalled write): the stream ended
                    now = time.monotonic()
                    counter = sub.counter
                    if length:
                        had_headers = counter.has_headers
                        counter.feed(buf, length)
                        if not had_headers and counter.has_headers:
                            sub.t_headers = now
                        if isinstance(counter, WSCounter) and counter.replies:
                            sub.sock.sendall(counter.replies)
                            counter.replies.clear()
                    else:
                        counter.eof()
                    if not counter.finished:
                        continue
                    sel.unregister(sub.sock)
                    sub.sock.close()
                    if (args.reconnect and counter.evicted and not counter.done
                            and counter.error is None):
                        if counter.reconnects >= MAX_RECONNECTS:
                            counter.error = f"evicted {counter.reconnects + 1} times"
                        else:
                            cursor = counter.last_id if counter.last_id is not None \
                                else args.last_event_id
                            counter.restart()
                            sub.sock = _connect(args, make_request(
                                args.host, args.port, args.session, args.max_queued,
                                cursor if cursor is not None else 0,
                                counter.epoch or args.epoch))
                            sel.register(sub.sock, selectors.EVENT_READ, sub)
                            continue
                    sub.t_done = now
                    open_count -= 1
        finally:
            for s in subs:
                if s.sock.fileno() >= 0:
                    s.sock.close()
    return [s.report() for s in subs]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.loadgen", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--session", required=True)
    parser.add_argument("--subscribers", type=int, default=1)
    parser.add_argument("--max-queued", type=int, default=2048)
    parser.add_argument("--last-event-id", type=int, default=None)
    parser.add_argument("--epoch", default=None)
    parser.add_argument("--until", default="turn_complete",
                        help="event type that finishes a subscriber")
    parser.add_argument("--rounds", type=int, default=1,
                        help="connect this many times in sequence (each round measured alone)")
    parser.add_argument("--announce-ready", action="store_true")
    parser.add_argument("--reconnect", action="store_true",
                        help="resume an evicted subscriber from its last id")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--transport", choices=("sse", "ws"), default="sse",
                        help="SSE subscribers (GET /session/{id}/events) or WebSockets")
    args = parser.parse_args(argv)
    deadline = time.monotonic() + args.timeout
    cpu0 = _cpu_seconds()
    rounds = [run_round(args, sys.stdout, args.announce_ready and index == 0, deadline)
              for index in range(args.rounds)]
    print(json.dumps({"rounds": rounds, "cpu_s": _cpu_seconds() - cpu0}), flush=True)
    return 0


# --- the benchmark's side ------------------------------------------------------------------------


class LoadGenError(RuntimeError):
    """The load generator failed or a subscriber could not be served."""


def delivery_problems(sub: Mapping[str, Any], first: int, last: int, *,
                      terminal: bool = True, complete: bool = True) -> list[str]:
    """What is wrong with what one subscriber received, expecting ids ``first`` to ``last``.

    Always: the ids it received were each the one after the previous (no gap, no duplicate,
    in order, across its reconnects). With ``complete``: they are exactly ``first``..``last``.
    With ``terminal`` (and ``complete``): the frame that finished it is the one with id ``last``.
    """
    problems: list[str] = []
    if sub.get("id_error"):
        problems.append(f"ids not contiguous: {sub['id_error']}")
    if complete:
        expected = max(0, last - first + 1)
        if sub.get("ids") != expected:
            problems.append(f"{sub.get('ids')} ids delivered, {expected} published")
        if expected and (sub.get("first_id"), sub.get("last_id")) != (first, last):
            problems.append(f"ids {sub.get('first_id')}..{sub.get('last_id')} delivered, "
                            f"{first}..{last} published")
        if terminal and not sub.get("done"):
            problems.append("the terminal never arrived")
        elif terminal and sub.get("terminal_id") != last:
            problems.append(f"the terminal has id {sub.get('terminal_id')}, the last published "
                            f"id is {last}")
    return problems


def check_delivery(subs: Sequence[Mapping[str, Any]], first: int, last: int, *,
                   terminal: bool = True, allow_evicted: bool = False) -> None:
    """Raise :class:`LoadGenError` unless every subscriber received exactly ids ``first`` to
    ``last`` (see :func:`delivery_problems`); with ``allow_evicted``, an evicted subscriber is
    only checked for contiguity (the benchmark reports the eviction itself)."""
    problems = [f"subscriber {index}: {problem}"
                for index, sub in enumerate(subs)
                for problem in delivery_problems(
                    sub, first, last, terminal=terminal,
                    complete=not (allow_evicted and sub.get("evicted")))]
    if problems:
        more = f" (+{len(problems) - 5} more)" if len(problems) > 5 else ""
        raise LoadGenError("delivered != published: " + "; ".join(problems[:5]) + more)


class LoadGen:
    """Runs ``python -m benchmarks.loadgen`` and reads its JSON lines."""

    def __init__(self, host: str, port: int, session: str, *, subscribers: int = 1,
                 max_queued: int = 2048, until: str = "turn_complete",
                 last_event_id: int | None = None, epoch: str | None = None,
                 rounds: int = 1, announce_ready: bool = True, timeout: float = 300.0,
                 reconnect: bool = False, transport: str = "sse") -> None:
        argv = [sys.executable, "-m", "benchmarks.loadgen", "--host", host, "--port", str(port),
                "--session", session, "--subscribers", str(subscribers),
                "--max-queued", str(max_queued), "--until", until, "--rounds", str(rounds),
                "--timeout", str(timeout), "--transport", transport]
        if last_event_id is not None:
            argv += ["--last-event-id", str(last_event_id)]
        if epoch is not None:
            argv += ["--epoch", epoch]
        if announce_ready:
            argv.append("--announce-ready")
        if reconnect:
            argv.append("--reconnect")
        self.timeout = timeout + 30.0
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self._buf = b""

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _line(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + self.timeout
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in self._buf:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self.kill()
                    raise LoadGenError("load generator produced no result in time")
                if not sel.select(remaining):
                    continue
                chunk = os.read(fd, 65536)
                if not chunk:
                    self.proc.wait(5)
                    err = self.proc.stderr.read().decode(errors="replace") \
                        if self.proc.stderr else ""
                    raise LoadGenError(f"load generator exited ({self.proc.returncode}):\n{err}")
                self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        value = json.loads(line)
        if not isinstance(value, dict):
            raise LoadGenError(f"unexpected load generator line {line[:200]!r}")
        return value

    def wait_ready(self) -> float:
        """Block until every subscriber has its headers; returns the loadgen's timestamp."""
        line = self._line()
        if not line.get("ready"):
            raise LoadGenError(f"load generator did not get ready: {line}")
        return float(line["t"])

    def result(self) -> dict[str, Any]:
        """The final report (see the module docstring); raises when a subscriber failed."""
        line = self._line()
        self.proc.wait(30)
        for round_ in line["rounds"]:
            for sub in round_:
                if sub["error"]:
                    raise LoadGenError(f"subscriber failed: {sub['error']}")
        return line

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def close(self) -> None:
        self.kill()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


if __name__ == "__main__":
    sys.exit(main())
