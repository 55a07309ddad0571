"""ACP framing: newline-delimited JSON-RPC 2.0 over a byte stream (the agent's stdin and stdout).

Sans-IO: :class:`LineSplitter` is handed bytes and returns complete lines, :func:`parse_message`
turns one line into a typed message, the ``encode_*`` functions make the bytes to write, and
:class:`PendingRequests` matches replies to the requests that are waiting for them. No trio, no
clock, no I/O; what the messages mean is :mod:`daemon.core.acp_client`, and the agent channel
(``daemon.agent``) is the shell that moves the bytes.

This is the hot path: an agent may stream 100,000 ``session/update`` lines per turn, so splitting
is done with ``bytes.split`` on whole read chunks; a read of one session's updates written the
usual way (:func:`update_prefix`) is checked in one msgspec call for all its lines
(:func:`splice_updates`), and any other line costs one msgspec decode into a single flat Struct
plus a few attribute checks.
"""

from __future__ import annotations

from itertools import repeat
from operator import itemgetter
from typing import Any, Final, Generic, TypeVar

import msgspec
from msgspec import UNSET, UnsetType

__all__ = [
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "MAX_LINE_BYTES",
    "METHOD_NOT_FOUND",
    "PARSE_ERROR",
    "LineSplitter",
    "Malformed",
    "Message",
    "Notification",
    "Pending",
    "PendingRequests",
    "Read",
    "Request",
    "RequestId",
    "Response",
    "RpcError",
    "encode_error",
    "encode_notification",
    "encode_request",
    "encode_result",
    "parse_message",
    "parse_update",
    "prefix_of",
    "splice_updates",
    "update_prefix",
]

MAX_LINE_BYTES: Final = 16 * 1024 * 1024

# JSON-RPC 2.0 error codes.
PARSE_ERROR: Final = -32700
INVALID_REQUEST: Final = -32600
METHOD_NOT_FOUND: Final = -32601
INVALID_PARAMS: Final = -32602
INTERNAL_ERROR: Final = -32603

RequestId = int | str

# How much of an offending line a Malformed keeps: enough to log, never the whole 16 MiB.
_EXCERPT_BYTES: Final = 200


# --------------------------------------------------------------------------------------------
# Line splitting


class Read(msgspec.Struct, frozen=True, gc=False):
    """What one read of a stream gives: its complete lines and what the reading learnt.

    ``spaced`` is False only when no line holds a space, tab or CR (then no ``update`` in them
    needs making compact: agents that write compact JSON put whitespace only inside strings,
    and a read without any spares each of its lines the check); ``discarded`` counts the lines
    over the cap this read dropped (see :class:`LineSplitter`).
    """

    lines: list[bytes]
    spaced: bool = True
    discarded: int = 0


class LineSplitter:
    """Cuts a byte stream into lines, tolerating CRLF and bounding memory per line.

    ``feed`` returns the complete lines in ``data`` (without the ``\\n`` or a trailing ``\\r``;
    blank lines are dropped because they carry no message). A line longer than
    ``max_line_bytes`` is discarded: once the buffered partial line exceeds the cap the
    splitter stops buffering and skips bytes until the next newline, so an endless line never
    costs more than the cap in memory. Each discarded line increments ``discarded_lines``; the
    caller reports it by comparing the counter before and after a feed.
    """

    __slots__ = ("_buffer", "_discarding", "_spaced_tail", "discarded_lines", "max_line_bytes")

    def __init__(self, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        if max_line_bytes < 1:
            raise ValueError(f"max_line_bytes must be positive, got {max_line_bytes}")
        self.max_line_bytes = max_line_bytes
        self.discarded_lines = 0
        self._buffer = bytearray()
        self._discarding = False
        self._spaced_tail = False  # the last read held whitespace (its unfinished line may)

    def read(self, data: bytes) -> Read:
        """:meth:`feed` of ``data``, as a :class:`Read`: the lines, whether any of them may hold
        a space, tab or CR (the first line may have started in the previous read), and how
        many lines this read discarded."""
        discarded = self.discarded_lines
        lines = self.feed(data)
        spaced = b" " in data or b"\t" in data or b"\r" in data
        may_be_spaced, self._spaced_tail = spaced or self._spaced_tail, spaced
        return Read(lines, may_be_spaced, self.discarded_lines - discarded)

    @property
    def buffered_bytes(self) -> int:
        """Bytes of the unfinished line currently held."""
        return len(self._buffer)

    def feed(self, data: bytes) -> list[bytes]:
        if self._discarding:
            newline = data.find(b"\n")
            if newline < 0:
                return []
            self._discarding = False
            data = data[newline + 1 :]
        if not data:
            return []
        lines = data.split(b"\n")
        tail = lines.pop()
        cap = self.max_line_bytes
        # Bytes the complete lines can hold at most: the data plus the old buffer.
        reach = len(data) + len(self._buffer)
        if self._buffer:
            if not lines:
                # Still inside one long line: only the buffer grows.
                self._buffer += tail
                if len(self._buffer) > cap:
                    self._start_discarding()
                return []
            self._buffer += lines[0]
            lines[0] = bytes(self._buffer)
            self._buffer.clear()
        if tail:
            if len(tail) > cap:
                self._start_discarding()
            else:
                self._buffer += tail
        # A complete line can only exceed the cap if the data (plus the old buffer) did: a
        # read is far below the cap, so the lines are not measured one by one.
        if reach > cap and lines and max(map(len, lines)) > cap:
            kept = [line for line in lines if len(line) <= cap]
            self.discarded_lines += len(lines) - len(kept)
            lines = kept
        if b"\r" in data or (lines and lines[0].endswith(b"\r")):
            lines = [line[:-1] if line.endswith(b"\r") else line for line in lines]
        if b"" in lines:
            lines = [line for line in lines if line]
        return lines

    def _start_discarding(self) -> None:
        self._buffer.clear()
        self._discarding = True
        self.discarded_lines += 1


# --------------------------------------------------------------------------------------------
# Messages


class RpcError(msgspec.Struct, frozen=True):
    """The ``error`` object of a JSON-RPC error reply."""

    code: int
    message: str
    data: Any = None


class Request(msgspec.Struct, frozen=True):
    id: RequestId
    method: str
    params: Any = None


class Notification(msgspec.Struct, frozen=True):
    method: str
    params: Any = None


class Response(msgspec.Struct, frozen=True):
    """A reply: exactly one of ``result`` / ``error`` is meaningful (``error is None`` = success).

    ``id`` is None only for error replies to requests whose id could not be read.
    """

    id: RequestId | None
    result: Any = None
    error: RpcError | None = None


class Malformed(msgspec.Struct, frozen=True):
    """A line that is not a JSON-RPC 2.0 message; ``excerpt`` is its start, for logs."""

    reason: str
    excerpt: bytes


Message = Request | Notification | Response | Malformed


class _Wire(msgspec.Struct):
    """Every JSON-RPC member at once; which ones are set decides the message kind."""

    jsonrpc: str | UnsetType = UNSET
    id: int | str | UnsetType | None = UNSET
    method: str | UnsetType = UNSET
    params: Any = UNSET
    result: Any = UNSET
    error: RpcError | UnsetType = UNSET


_decode_wire = msgspec.json.Decoder(_Wire).decode


def _malformed(reason: str, line: bytes) -> Malformed:
    return Malformed(reason=reason, excerpt=bytes(line[:_EXCERPT_BYTES]))


def parse_message(line: bytes) -> Message:
    """Classify one line. Never raises: anything that is not a message becomes ``Malformed``.

    A missing ``jsonrpc`` member is tolerated (some agents omit it); a wrong value is not.
    """
    try:
        wire = _decode_wire(line)
    except msgspec.ValidationError as exc:
        return _malformed(f"not a JSON-RPC message: {exc}", line)
    except msgspec.DecodeError as exc:
        return _malformed(f"invalid JSON: {exc}", line)
    except RecursionError:
        return _malformed("JSON nested too deeply", line)
    if wire.jsonrpc is not UNSET and wire.jsonrpc != "2.0":
        return _malformed(f"unsupported jsonrpc version {wire.jsonrpc!r}", line)
    method = wire.method
    if method is not UNSET:
        if wire.result is not UNSET or wire.error is not UNSET:
            return _malformed("message has both a method and a result/error", line)
        params = wire.params
        if params is UNSET:
            params = None
        elif type(params) is not dict and type(params) is not list:
            return _malformed("params must be an object or an array", line)
        msg_id = wire.id
        if isinstance(msg_id, UnsetType):
            return Notification(method=method, params=params)
        if msg_id is None:
            return _malformed("request id must not be null", line)
        return Request(id=msg_id, method=method, params=params)
    if wire.id is UNSET:
        return _malformed("message has neither a method nor an id", line)
    if wire.error is not UNSET:
        if wire.result is not UNSET:
            return _malformed("reply has both a result and an error", line)
        return Response(id=wire.id, error=wire.error)
    if wire.result is UNSET:
        return _malformed("reply has neither a result nor an error", line)
    if wire.id is None:
        return _malformed("success reply must have a non-null id", line)
    return Response(id=wire.id, result=wire.result)


class _UpdateParams(msgspec.Struct):
    sessionId: str
    # Kept as the agent's bytes: the daemon splices them into the envelope (daemon.core.frame_codec).
    update: msgspec.Raw


class _UpdateWire(msgspec.Struct):
    """A ``session/update`` notification, its ``update`` left undecoded."""

    method: str
    params: _UpdateParams
    jsonrpc: str | UnsetType = UNSET
    id: Any = UNSET
    result: Any = UNSET
    error: Any = UNSET


_decode_update_wire = msgspec.json.Decoder(_UpdateWire).decode


def parse_update(line: bytes) -> tuple[str, bytes] | None:
    """The hot path's first try: ``(sessionId, update bytes)`` of a well-formed
    ``session/update`` notification whose ``update`` is a JSON object, else ``None`` (the
    caller then classifies the line with :func:`parse_message`, which also reports what is
    wrong with it). The update's bytes are the agent's own, not re-encoded; the whole line is
    still parsed, so a line with invalid JSON anywhere is never accepted here.
    """
    try:
        wire = _decode_update_wire(line)
    except (msgspec.DecodeError, RecursionError):  # ValidationError is a DecodeError
        return None
    if (
        wire.method != "session/update"
        or wire.id is not UNSET
        or wire.result is not UNSET
        or wire.error is not UNSET
        or (wire.jsonrpc is not UNSET and wire.jsonrpc != "2.0")
    ):
        return None
    update = bytes(wire.params.update)
    # A Raw starts at the value's first byte: "{" is an object (else: parse_message path).
    if update[0] != 123:
        return None
    return wire.params.sessionId, update


_decode_values = msgspec.json.Decoder(list[msgspec.Raw]).decode
_first_byte = itemgetter(0)
_UPDATE_SUFFIX: Final = b"}}"


_PREFIX_HEAD: Final = b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":'
_PREFIX_TAIL: Final = b',"update":'


def update_prefix(session_id: str) -> bytes:
    """What a ``session/update`` line for ``session_id`` starts with when the agent writes it
    compact, members in the order ACP lists them (as most agents do): the line is then this
    prefix, the ``update`` object and ``}}``."""
    return _PREFIX_HEAD + _encode(session_id) + _PREFIX_TAIL


def prefix_of(line: bytes) -> bytes | None:
    """The :func:`update_prefix` ``line`` starts with, whichever session's it is, or ``None``
    when it does not start like one: read off the line, so finding a line's session costs one
    lookup of this, however many sessions there are. The session id ends at the first
    ``,"update":`` (inside a JSON string every quote is escaped, so none occurs there)."""
    if not line.startswith(_PREFIX_HEAD):
        return None
    end = line.find(_PREFIX_TAIL, len(_PREFIX_HEAD))
    return None if end < 0 else line[:end + len(_PREFIX_TAIL)]


def splice_updates(lines: list[bytes], prefix: bytes) -> list[bytes] | None:
    """The ``update`` bytes of ``lines`` when every line is ``prefix`` (see
    :func:`update_prefix`), one JSON object and ``}}``: the same bytes :func:`parse_update`
    finds, read without decoding any line on its own; else ``None`` (the caller reads the
    lines one at a time, so one bad line never costs the others their meaning).

    Such a line is valid JSON exactly when its middle is one JSON value, so the middles are
    checked together, in one decode of ``[middle,middle,...]``. That the array has one element
    per line is not enough (``{"a":[{}`` and ``{}]}`` are two elements joined, and neither is
    JSON): every element must also be exactly as long as its middle, which, with the lengths
    summing to the whole array less its brackets and commas, pins each element to its line.
    """
    count = len(lines)
    if not count:
        return []
    if (sum(map(bytes.startswith, lines, repeat(prefix))) != count
            or sum(map(bytes.endswith, lines, repeat(_UPDATE_SUFFIX))) != count):
        return None
    start = len(prefix)
    updates = [line[start:-2] for line in lines]
    try:
        values = _decode_values(b"[" + b",".join(updates) + b"]")
    except (msgspec.DecodeError, RecursionError):
        return None
    if len(values) != count or list(map(len, values)) != list(map(len, updates)):
        return None
    # Each middle is one value; "{" first makes it an object (else: the per-line path).
    if min(map(_first_byte, updates)) != 123 or max(map(_first_byte, updates)) != 123:
        return None
    return updates


# --------------------------------------------------------------------------------------------
# Encoders (each returns one complete line)

_encode = msgspec.json.Encoder().encode


def encode_request(id: RequestId, method: str, params: Any) -> bytes:
    return _encode({"jsonrpc": "2.0", "id": id, "method": method, "params": params}) + b"\n"


def encode_notification(method: str, params: Any) -> bytes:
    return _encode({"jsonrpc": "2.0", "method": method, "params": params}) + b"\n"


def encode_result(id: RequestId, result: Any) -> bytes:
    return _encode({"jsonrpc": "2.0", "id": id, "result": result}) + b"\n"


def encode_error(id: RequestId | None, code: int, message: str) -> bytes:
    return (
        _encode({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}}) + b"\n"
    )


# --------------------------------------------------------------------------------------------
# Request/response matching

W = TypeVar("W")


class Pending(msgspec.Struct, Generic[W], frozen=True):
    """One outstanding request: its id, its method (for logs) and the caller's waiter."""

    id: int
    method: str
    waiter: W


class PendingRequests(Generic[W]):
    """Our outstanding requests by id. Ids are allocated here (1, 2, 3, ...) and never reused.

    ``W`` is whatever the shell wakes when the reply comes (the core does not know about trio).
    """

    __slots__ = ("_next_id", "_table", "unknown_replies")

    def __init__(self) -> None:
        self._next_id = 1
        self._table: dict[int, Pending[W]] = {}
        self.unknown_replies = 0

    def __len__(self) -> int:
        return len(self._table)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._table

    def allocate(self, method: str, waiter: W) -> int:
        request_id = self._next_id
        self._next_id += 1
        self._table[request_id] = Pending(request_id, method, waiter)
        return request_id

    def resolve(self, response: Response) -> Pending[W] | None:
        """Take the request this reply answers; None (and counted) if no request has that id."""
        request_id = response.id
        # bool is an int subclass but never one of our ids; str ids are never ours either.
        pending = self._table.pop(request_id, None) if type(request_id) is int else None
        if pending is None:
            self.unknown_replies += 1
        return pending

    def discard(self, request_id: int) -> Pending[W] | None:
        """Forget a request whose caller stopped waiting; a late reply then counts as unknown."""
        return self._table.pop(request_id, None)

    def drain(self) -> list[Pending[W]]:
        """Remove and return every outstanding request (the channel closed)."""
        pending = list(self._table.values())
        self._table.clear()
        return pending
