"""A fault-injecting TCP reverse proxy for integration tests, run inside the test's event loop
(anyio: a Trio or an asyncio test alike).

It relays bytes between the SDK and the real daemon, reading just enough HTTP/1.1 on the way
up (request line, headers, ``Content-Length`` body) to count requests and, on demand:

- answer the next matching request itself with a chosen status and JSON body (then close the
  connection, as a failing server would), or drop the connection without an answer;
- sever every connection that carries an event stream (SSE response or WebSocket upgrade), so a
  test can cut a subscription mid-turn at a point it chooses.

Nothing in the SDK knows the proxy is there: it only sees a daemon URL.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any
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
                upstream = await anyio.connect_tcp(self.upstream_host, self.upstream_port)
                async with upstream, anyio.create_task_group() as nursery:
                    nursery.start_soon(self._down, upstream, client, nursery.cancel_scope)
                    await self._up(client, upstream, conn)
                    nursery.cancel_scope.cancel()
            except* _GONE:
                pass  # either side went away (possibly inside the task group, hence except*)
            finally:
                self._conns.discard(conn)
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

    def _take_fault(self, method: str, path: str) -> Fault | None:
        for fault in self._faults:
            if fault.method == method and fault.path.search(path):
                if fault.skip > 0:
                    fault.skip -= 1
                    return None
                self._faults.remove(fault)
                return fault
        return None


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
