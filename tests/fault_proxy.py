"""A fault-injecting TCP reverse proxy for integration tests, run inside the test's event loop
(anyio: a Trio or an asyncio test alike).

It relays bytes between the SDK and the real daemon, reading just enough HTTP/1.1 on the way
up (request line, headers, ``Content-Length`` body) to count requests and, on demand:

- answer the next matching request itself with a chosen status and JSON body (then close the
  connection, as a failing server would), or drop the connection without an answer;
- sever every connection that carries an event stream (SSE response or WebSocket upgrade), so a
  test can cut a subscription mid-turn at a point it chooses;
- with a ``chaos`` plan (:class:`Chaos`), break chosen request/answer exchanges the way networks
  do: cut the connection before the request is forwarded, in the middle of its body, right after
  it reached the daemon, or in the middle of the answer, with a FIN or a TCP reset, or stall the
  request or the answer for a while (a stalled request is still delivered after its client gave
  up, as a late segment would be). In that mode the proxy reads each answer whole before relaying
  it (lockstep: request, answer, next request; event streams are relayed as they come), and a
  request that reached the daemon is always answered there, whatever happened to its client:
  once :meth:`FaultProxy.wait_quiet` returns, every request the daemon will ever see from this
  proxy has been answered.

Nothing in the SDK knows the proxy is there: it only sees a daemon URL.
"""

from __future__ import annotations

import re
import socket
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Literal
from urllib.parse import urlsplit

import anyio
import msgspec
from anyio.abc import SocketStream, TaskStatus

LOAD_PATH = r"^/session/[^/]+/load$"

_READ = 65536
_GONE = (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError)


async def _receive(stream: SocketStream) -> bytes:
    """The next bytes, or b"" once the peer has closed (trio's ``receive_some`` contract)."""
    try:
        return await stream.receive(_READ)
    except anyio.EndOfStream:
        return b""


ChaosKind = Literal["cut_before", "cut_mid_request", "cut_after_request", "cut_mid_answer",
                    "stall_request", "stall_answer"]
CHAOS_KINDS: tuple[ChaosKind, ...] = ("cut_before", "cut_mid_request", "cut_after_request",
                                      "cut_mid_answer", "stall_request", "stall_answer")


@dataclass(frozen=True)
class Chaos:
    """What to do to one exchange: a cut (``reset``: the client's side gets a TCP RST, else a
    FIN) or a stall of ``stall_s`` seconds before the request goes on or the answer comes back."""

    kind: ChaosKind
    reset: bool = False
    stall_s: float = 0.0


@dataclass(frozen=True)
class Request:
    """One request as the proxy read it (head parsed, body whole)."""

    method: str
    path: str
    headers: Mapping[str, str]
    body: bytes


ChaosPlan = Callable[[Request], Chaos | None]


@dataclass
class Fault:
    method: str
    path: re.Pattern[str]
    status: int | None
    body: Mapping[str, Any] | None
    drop: bool
    skip: int


class _Conn:
    def __init__(self, scope: anyio.CancelScope) -> None:
        self.scope = scope
        self.stream = False


class FaultProxy:
    """Listen on 127.0.0.1 (an ephemeral port) and forward to ``upstream_url``."""

    def __init__(self, upstream_url: str) -> None:
        parts = urlsplit(upstream_url)
        if parts.hostname is None or parts.port is None:
            raise ValueError(f"upstream URL needs a host and port: {upstream_url!r}")
        self.upstream_host = parts.hostname
        self.upstream_port = parts.port
        self.url = ""
        self.requests: list[tuple[str, str]] = []
        self.injected: list[tuple[str, str, str]] = []
        self._faults: list[Fault] = []
        self._conns: set[_Conn] = set()
        self._changed = anyio.Event()
        self.chaos: ChaosPlan | None = None
        """Set to break exchanges (see the module docstring); ``None`` relays them."""
        self.chaos_done: list[tuple[Request, Chaos]] = []
        self.answers: list[tuple[Request, bytes]] = []
        """With a chaos plan: each answered request and the head of its answer."""

    # -- control -------------------------------------------------------------------------

    def fail(
        self,
        method: str,
        path_regex: str,
        *,
        status: int | None = None,
        body: Mapping[str, Any] | None = None,
        drop: bool = False,
        skip: int = 0,
    ) -> None:
        """Fail the (skip+1)-th next request matching ``method`` and ``path_regex``: answer
        ``status`` with ``body``, or (``drop=True``) close the connection without an answer."""
        if (status is None) == (not drop):
            raise ValueError("give exactly one of status=... or drop=True")
        self._faults.append(Fault(method, re.compile(path_regex), status, body, drop, skip))

    def fail_next_load(self, **kw: Any) -> None:
        self.fail("POST", LOAD_PATH, **kw)

    def count(self, method: str, path_regex: str) -> int:
        pattern = re.compile(path_regex)
        return sum(1 for m, p in self.requests if m == method and pattern.search(p))

    @property
    def loads(self) -> int:
        return self.count("POST", LOAD_PATH)

    def sever_streams(self) -> int:
        """Cut every event-stream connection now; returns how many were cut."""
        cut = 0
        for conn in list(self._conns):
            if conn.stream:
                conn.scope.cancel()
                cut += 1
        return cut

    async def wait_requests(self, method: str, path_regex: str, n: int) -> None:
        while self.count(method, path_regex) < n:
            await self._changed.wait()

    async def wait_for(self, condition: Callable[[], bool]) -> None:
        """Until ``condition()`` holds, checked whenever a request is read or answered, or a
        connection ends."""
        while not condition():
            await self._changed.wait()

    @property
    def open_connections(self) -> int:
        return len(self._conns)

    async def wait_quiet(self) -> None:
        """Until no client connection is open: every request read has been dealt with, and
        (with a chaos plan) every request forwarded has been answered by the daemon."""
        while self._conns:
            await self._changed.wait()

    # -- serving -------------------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        self.url = f"http://127.0.0.1:{port}"
        task_status.started()
        async with listener:
            await listener.serve(self._handle)

    def _note(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    async def _handle(self, client: SocketStream) -> None:
        with anyio.CancelScope() as scope:
            conn = _Conn(scope)
            self._conns.add(conn)
            try:
                if self.chaos is not None:
                    await self._lockstep(client, conn)
                    return
                upstream = await anyio.connect_tcp(self.upstream_host, self.upstream_port)
                async with upstream, anyio.create_task_group() as nursery:
                    nursery.start_soon(self._down, upstream, client, nursery.cancel_scope)
                    await self._up(client, upstream, conn)
                    nursery.cancel_scope.cancel()
            except* _GONE:
                pass  # either side went away (possibly inside the task group, hence except*)
            finally:
                self._conns.discard(conn)
                self._note()
                with anyio.CancelScope(shield=True):
                    await client.aclose()

    async def _down(
        self, upstream: SocketStream, client: SocketStream, scope: anyio.CancelScope
    ) -> None:
        try:
            while data := await _receive(upstream):
                await client.send(data)
        except _GONE:
            pass
        scope.cancel()

    async def _up(self, client: SocketStream, upstream: SocketStream, conn: _Conn) -> None:
        buf = bytearray()
        while True:
            while (end := buf.find(b"\r\n\r\n")) == -1:
                data = await _receive(client)
                if not data:
                    return
                buf += data
            head = bytes(buf[: end + 4])
            del buf[: end + 4]
            method, path, headers = _parse_head(head)
            self.requests.append((method, path))
            self._note()
            fault = self._take_fault(method, path)
            if fault is not None:
                self.injected.append((method, path, "drop" if fault.drop else str(fault.status)))
                if not fault.drop:
                    await client.send(_response(fault.status or 500, fault.body))
                return
            await upstream.send(head)
            if "upgrade" in headers.get("connection", "").lower():
                conn.stream = True
                if buf:
                    await upstream.send(bytes(buf))
                while data := await _receive(client):
                    await upstream.send(data)
                return
            if method == "GET" and path.endswith("/events"):
                conn.stream = True
            if "chunked" in headers.get("transfer-encoding", "").lower():
                raise AssertionError("fault proxy does not relay chunked request bodies")
            remaining = int(headers.get("content-length", "0") or "0")
            while remaining > 0:
                if not buf:
                    data = await _receive(client)
                    if not data:
                        return
                    buf += data
                piece = bytes(buf[:remaining])
                del buf[: len(piece)]
                remaining -= len(piece)
                await upstream.send(piece)

    # -- lockstep (chaos) mode -----------------------------------------------------------

    async def _lockstep(self, client: SocketStream, conn: _Conn) -> None:
        """Request, answer, next request, each exchange possibly broken by the chaos plan."""
        upstream: SocketStream | None = None
        buf = bytearray()
        try:
            while True:
                head = await _read_head(client, buf)
                if head is None:
                    return
                method, path, headers = _parse_head(head)
                self.requests.append((method, path))
                self._note()
                fault = self._take_fault(method, path)
                if fault is not None:
                    self.injected.append((method, path, "drop" if fault.drop else str(fault.status)))
                    if not fault.drop:
                        await client.send(_response(fault.status or 500, fault.body))
                    return
                if upstream is None:
                    upstream = await anyio.connect_tcp(self.upstream_host, self.upstream_port)
                if "upgrade" in headers.get("connection", "").lower() or (
                        method == "GET" and path.endswith("/events")):
                    conn.stream = True  # an event stream: relayed as it comes, to its end
                    await upstream.send(head + bytes(buf))
                    async with anyio.create_task_group() as nursery:
                        nursery.start_soon(self._down, upstream, client, nursery.cancel_scope)
                        while data := await _receive(client):
                            await upstream.send(data)
                        nursery.cancel_scope.cancel()
                    return
                if "chunked" in headers.get("transfer-encoding", "").lower():
                    raise AssertionError("fault proxy does not relay chunked request bodies")
                body = await _read_exactly(client, buf, int(headers.get("content-length") or 0))
                if body is None:
                    return
                request = Request(method, path, headers, body)
                chaos = self.chaos(request) if self.chaos is not None else None
                if chaos is not None:
                    self.chaos_done.append((request, chaos))
                answer = await self._exchange(client, upstream, head, request, chaos)
                if answer is None:
                    return  # the exchange was broken: this connection is done
                if b"connection: close" in answer.split(b"\r\n\r\n", 1)[0].lower():
                    await upstream.aclose()
                    upstream = None
        finally:
            if upstream is not None:
                with anyio.CancelScope(shield=True):
                    await upstream.aclose()

    async def _exchange(self, client: SocketStream, upstream: SocketStream, head: bytes,
                        request: Request, chaos: Chaos | None) -> bytes | None:
        """Forward one request and relay its answer as ``chaos`` says; the answer relayed
        whole, or None when the client's connection was cut (the caller ends it)."""
        kind = chaos.kind if chaos is not None else None
        if kind == "cut_before":
            await _cut(client, chaos)
            return None
        if kind == "cut_mid_request":
            await upstream.send(head + request.body[: len(request.body) // 2])
            await _cut(client, chaos)
            return None  # the daemon sees its request end early: nothing to answer
        stall_s = chaos.stall_s if chaos is not None else 0.0
        if kind == "stall_request":
            await anyio.sleep(stall_s)  # delivered all the same, client or not
        await upstream.send(head + request.body)
        if kind == "cut_after_request":
            await _cut(client, chaos)
        answer = await _read_answer(upstream)  # always read whole: the daemon has decided
        self.answers.append((request, answer.split(b"\r\n\r\n", 1)[0]))
        self._note()
        if kind == "cut_after_request":
            return None
        if kind == "cut_mid_answer":
            await client.send(answer[: max(1, len(answer) // 2)])
            await _cut(client, chaos)
            return None
        if kind == "stall_answer":
            await anyio.sleep(stall_s)
        try:
            await client.send(answer)
        except _GONE:
            return None
        return answer

    def _take_fault(self, method: str, path: str) -> Fault | None:
        for fault in self._faults:
            if fault.method == method and fault.path.search(path):
                if fault.skip > 0:
                    fault.skip -= 1
                    return None
                self._faults.remove(fault)
                return fault
        return None


async def _cut(client: SocketStream, chaos: Chaos | None) -> None:
    """Close the client's connection: with a TCP reset when the chaos says so, else a FIN."""
    if chaos is not None and chaos.reset:
        raw = client.extra(anyio.abc.SocketAttribute.raw_socket)
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with anyio.CancelScope(shield=True):
        await client.aclose()


async def _read_head(stream: SocketStream, buf: bytearray) -> bytes | None:
    """The next message head (through the blank line), taken from ``buf`` first; None at EOF."""
    while (end := buf.find(b"\r\n\r\n")) == -1:
        data = await _receive(stream)
        if not data:
            return None
        buf += data
    head = bytes(buf[: end + 4])
    del buf[: end + 4]
    return head


async def _read_line(stream: SocketStream, buf: bytearray) -> bytes | None:
    while (end := buf.find(b"\r\n")) == -1:
        data = await _receive(stream)
        if not data:
            return None
        buf += data
    line = bytes(buf[:end])
    del buf[: end + 2]
    return line


async def _read_exactly(stream: SocketStream, buf: bytearray, size: int) -> bytes | None:
    while len(buf) < size:
        data = await _receive(stream)
        if not data:
            return None
        buf += data
    body = bytes(buf[:size])
    del buf[:size]
    return body


async def _read_answer(upstream: SocketStream) -> bytes:
    """One whole answer (head and a ``Content-Length`` or chunked body), or what came before
    the daemon closed the connection."""
    buf = bytearray()
    head = await _read_head(upstream, buf)
    if head is None:
        return bytes(buf)
    status_line, _, rest = head.partition(b"\r\n")
    headers = {name.strip().lower(): value.strip() for name, _, value in
               (line.partition(b":") for line in rest.split(b"\r\n") if b":" in line)}
    status = int(status_line.split()[1])
    if status in (204, 304) or 100 <= status < 200:
        return head
    if b"chunked" in headers.get(b"transfer-encoding", b"").lower():
        chunks = bytearray()
        while (size_line := await _read_line(upstream, buf)) is not None:
            size = int(size_line.split(b";")[0], 16)
            chunk = await _read_exactly(upstream, buf, size + 2)  # the data and its CRLF
            chunks += size_line + b"\r\n" + (chunk or b"")
            if chunk is None or size == 0:
                break
        return head + bytes(chunks)
    length = int(headers.get(b"content-length", b"0") or 0)
    body = await _read_exactly(upstream, buf, length)
    return head + (body if body is not None else bytes(buf))


def _parse_head(head: bytes) -> tuple[str, str, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    method, target, _version = lines[0].split(" ", 2)
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if ":" in line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
    return method, target.split("?", 1)[0], headers


def _response(status: int, body: Mapping[str, Any] | None) -> bytes:
    raw = msgspec.json.encode(body if body is not None else {})
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "Error"
    head = (
        f"HTTP/1.1 {status} {phrase}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(raw)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode("latin-1") + raw
