"""Helpers for tests of stalled peers against a real daemon: raw sockets that stop reading (a
small receive buffer, never a sleep), the daemon's descriptor table, and polling the daemon's
own state with a bounded deadline."""

from __future__ import annotations

import base64
import os
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx
import trio

T = TypeVar("T")

# A turn small enough that a reader which took nothing until its terminal would still be
# under the default caps' hardest limits (2,048 frames, 2 MiB), so a healthy reader can never
# be evicted by it however slow the machine; a few of them fill a stalled socket's buffers.
TURN_CHUNKS = 1500
TURN_BYTES = 900
TURN_TEXT = f"mock:chunks={TURN_CHUNKS} mock:bytes={TURN_BYTES} mock:delay_ms=0"


def host_port(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


def _connect(url: str, rcvbuf: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(10)
    sock.connect(host_port(url))
    return sock


def _read_until(sock: socket.socket, needle: bytes) -> bytes:
    head = b""
    while needle not in head:
        chunk = sock.recv(1024)
        if not chunk:
            raise AssertionError(f"connection closed before {needle!r}; got {head[:300]!r}")
        head += chunk
    return head


# The widest caps: a subscriber is then evicted only once its write is truly stalled (a write
# that merely waits for its next turn of the scheduler never falls 2 MiB behind).
STALLED_QUERY = "maxQueued=2048"


def open_stalled_sse(url: str, sid: str, *, query: str = STALLED_QUERY,
                     headers: dict[str, str] | None = None, rcvbuf: int = 4096) -> socket.socket:
    """An SSE subscriber that reads its response head and then never reads again."""
    sock = _connect(url, rcvbuf)
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    sock.sendall(f"GET /session/{sid}/events?{query} HTTP/1.1\r\nHost: 127.0.0.1\r\n{extra}\r\n"
                 .encode())
    head = _read_until(sock, b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head[:200]
    return sock


def open_stalled_ws(url: str, sid: str, *, query: str = STALLED_QUERY,
                    rcvbuf: int = 4096) -> socket.socket:
    """A WebSocket subscriber that completes the upgrade and then never reads again (so it
    never answers a ping either)."""
    sock = _connect(url, rcvbuf)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(f"GET /session/{sid}/ws?{query} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                 "Upgrade: websocket\r\nConnection: Upgrade\r\n"
                 f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode())
    head = _read_until(sock, b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 101"), head[:200]
    return sock


def fd_count(pid: int) -> int:
    """Open descriptors of process ``pid``."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def _socket_inodes(pid: int) -> set[str]:
    out: set[str] = set()
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue
        if target.startswith("socket:["):
            out.add(target[len("socket:["):-1])
    return out


def holds_connection(pid: int, local_port: int, peer_port: int) -> bool:
    """Whether process ``pid`` still has a descriptor on the TCP connection between its
    ``local_port`` and ``peer_port`` (a connection the daemon cut and closed has none)."""
    inodes = _socket_inodes(pid)
    for table in ("tcp", "tcp6"):
        path = Path(f"/proc/{pid}/net/{table}")
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            local, remote, inode = fields[1], fields[2], fields[9]
            if (int(local.rsplit(":", 1)[1], 16) == local_port
                    and int(remote.rsplit(":", 1)[1], 16) == peer_port and inode in inodes):
                return True
    return False


async def poll(check: Callable[[], Awaitable[T | None]] | Callable[[], T | None],
               timeout: float, what: str, interval: float = 0.02) -> T:
    """Call ``check`` until it returns a truthy value; fail after ``timeout`` seconds."""
    deadline = trio.current_time() + timeout
    last: Any = None
    while True:
        result = check()
        if isinstance(result, Awaitable):
            result = await result
        if result:
            return result  # type: ignore[return-value]
        last = result
        if trio.current_time() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what} (last {last!r})")
        await trio.sleep(interval)


async def status(client: httpx.AsyncClient, sid: str) -> dict[str, Any]:
    resp = await client.get(f"/session/{sid}/status")
    assert resp.status_code == 200, resp.text
    body: dict[str, Any] = resp.json()
    return body


async def run_turn(client: httpx.AsyncClient, sid: str, text: str = TURN_TEXT,
                   timeout: float = 30) -> str:
    """Prompt and wait (on the daemon's status) until the turn's terminal was published."""
    resp = await client.post(f"/session/{sid}/prompt",
                             json={"prompt": [{"type": "text", "text": text}]})
    assert resp.status_code == 202, resp.text
    prompt_id: str = resp.json()["promptId"]

    async def idle() -> bool:
        s = await status(client, sid)
        return not s["hasActivePrompt"] and s["pendingPrompts"] == 0

    await poll(idle, timeout, "the turn to end")
    return prompt_id
