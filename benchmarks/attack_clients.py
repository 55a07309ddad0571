"""Clients that attack the daemon's transports, for the tests and the benchmarks: a raw
WebSocket client that writes frames byte by byte as an attacker would (compressed frames the
server never agreed to, fragments that never finish), which no well-behaved client library lets
one do; an HTTP/2 client (on the ``h2`` library Hypercorn itself uses) whose streams never get a
flow-control window; and reads of a process's memory from ``/proc`` (Linux)."""

from __future__ import annotations

import base64
import os
import socket
import struct
import sys
import threading
import time
import zlib

import h2.config
import h2.connection
import h2.events
import h2.settings


def health_latency_ms(url: str) -> float:
    """One ``GET /health`` on a fresh connection (``Connection: close``): milliseconds."""
    start = time.perf_counter()
    with socket.create_connection(host_port(url), timeout=30) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    if not data.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"/health answered {data[:80]!r}")
    return (time.perf_counter() - start) * 1000


def probe_health_until_stdin_closes(url: str) -> None:
    """Probe ``/health`` one after another until stdin closes, printing the latencies (ms), one
    per line: the first at once (the caller waits for it: the prober is up), the rest at the
    end. Run as its own process (``python -m benchmarks.attack_clients probe URL``)
    so that an attack's client threads do not delay the probe in this process instead of in
    the daemon."""
    seen: list[float] = []
    closed = threading.Event()

    def watch_stdin() -> None:
        sys.stdin.read()
        closed.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    print(f"{health_latency_ms(url):.3f}", flush=True)
    while not closed.is_set():
        seen.append(health_latency_ms(url))
        closed.wait(0.01)
    print("\n".join(f"{ms:.3f}" for ms in seen), flush=True)


def host_port(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)

OP_CONTINUATION = 0x0
OP_TEXT = 0x1
OP_BINARY = 0x2
OP_CLOSE = 0x8
CLOSE_PROTOCOL_ERROR = 1002
CLOSE_MESSAGE_TOO_BIG = 1009


def handshake(url: str, path: str, *, extensions: str | None = None,
              rcvbuf: int | None = None) -> tuple[socket.socket, bytes]:
    """Open a WebSocket on ``path``; returns the socket and the server's response head (the
    upgrade may have been refused: the caller checks the status line)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(30)
    sock.connect(host_port(url))
    key = base64.b64encode(os.urandom(16)).decode()
    offer = f"Sec-WebSocket-Extensions: {extensions}\r\n" if extensions else ""
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
                 f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                 f"Sec-WebSocket-Version: 13\r\n{offer}\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(1)  # byte by byte: nothing after the head is consumed here
        if not chunk:
            raise AssertionError(f"connection closed during the handshake: {head!r}")
        head += chunk
    return sock, head


def frame_header(opcode: int, length: int, *, fin: bool = True, rsv1: bool = False) -> bytes:
    """A client frame's header with an all-zero masking key (legal, and the payload then goes
    on the wire as it is, so large payloads need no masking pass)."""
    first = (0x80 if fin else 0) | (0x40 if rsv1 else 0) | opcode
    if length < 126:
        head = struct.pack("!BB", first, 0x80 | length)
    elif length < 1 << 16:
        head = struct.pack("!BBH", first, 0x80 | 126, length)
    else:
        head = struct.pack("!BBQ", first, 0x80 | 127, length)
    return head + b"\x00\x00\x00\x00"


def frame(opcode: int, payload: bytes, *, fin: bool = True, rsv1: bool = False) -> bytes:
    return frame_header(opcode, len(payload), fin=fin, rsv1=rsv1) + payload


def deflate_bomb(inflated: int) -> bytes:
    """A permessage-deflate payload (raw deflate, the final empty block's 4 bytes dropped as
    RFC 7692 says) that inflates to ``inflated`` zero bytes: about 1/1000 of that on the wire."""
    comp = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = bytes(1 << 20)
    out = []
    for _ in range(inflated // len(block)):
        out.append(comp.compress(block))
    out.append(comp.flush(zlib.Z_SYNC_FLUSH))
    data = b"".join(out)
    assert data.endswith(b"\x00\x00\xff\xff")
    return data[:-4]


def read_close(sock: socket.socket) -> int | None:
    """Read until the server's close frame or EOF; the close code, or None for EOF/reset
    without one. Data frames before it are skipped."""
    buf = b""
    try:
        while True:
            while len(buf) >= 2:
                length = buf[1] & 0x7F
                offset = 2
                if length == 126:
                    if len(buf) < 4:
                        break
                    length, offset = struct.unpack("!H", buf[2:4])[0], 4
                elif length == 127:
                    if len(buf) < 10:
                        break
                    length, offset = struct.unpack("!Q", buf[2:10])[0], 10
                if len(buf) < offset + length:
                    break
                if buf[0] & 0x0F == OP_CLOSE:
                    payload = buf[offset:offset + length]
                    return int(struct.unpack("!H", payload[:2])[0]) if len(payload) >= 2 else 1005
                buf = buf[offset + length:]
            chunk = sock.recv(1 << 16)
            if not chunk:
                return None
            buf += chunk
    except (ConnectionResetError, BrokenPipeError):
        return None


def rss_kib(pid: int, field: str = "VmRSS") -> int:
    """``VmRSS`` (or ``VmHWM``, the peak) of process ``pid`` in KiB."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {field} for pid {pid}")


def reset_peak_rss(pid: int) -> None:
    """Start ``VmHWM`` of ``pid`` again from its current RSS (Linux ``clear_refs`` 5)."""
    with open(f"/proc/{pid}/clear_refs", "w") as refs:
        refs.write("5")

class ZeroWindowClient:
    """One HTTP/2 connection whose streams all have a zero window (``INITIAL_WINDOW_SIZE`` 0):
    the server may send their headers, never a byte of their bodies. A thread reads the
    connection (settings and pings are answered by ``h2``) until it ends."""

    def __init__(self, url: str) -> None:
        self.sock = socket.create_connection(host_port(url), timeout=30)
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.conn.initiate_connection()
        self.conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0})
        self.lock = threading.Lock()
        self.statuses: dict[int, int] = {}
        self.body_bytes = 0
        self.ended = threading.Event()
        self.end_reason = ""
        self._flush()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self.sock.sendall(data)

    def get(self, path: str) -> int:
        """Open a GET stream on ``path``; returns its id."""
        with self.lock:
            stream_id: int = self.conn.get_next_available_stream_id()
            self.conn.send_headers(stream_id, [
                (":method", "GET"), (":path", path), (":scheme", "http"),
                (":authority", "127.0.0.1")], end_stream=True)
            self._flush()
        return stream_id

    def _read(self) -> None:
        try:
            while True:
                data = self.sock.recv(65536)
                if not data:
                    self.end_reason = "eof"
                    return
                with self.lock:
                    for event in self.conn.receive_data(data):
                        if isinstance(event, h2.events.ResponseReceived):
                            headers = dict(event.headers or [])
                            self.statuses[event.stream_id or 0] = int(headers[b":status"])
                        elif isinstance(event, h2.events.DataReceived):
                            self.body_bytes += len(event.data)  # never acknowledged
                        elif isinstance(event, h2.events.ConnectionTerminated):
                            self.end_reason = "goaway"
                    self._flush()
        except OSError as exc:
            self.end_reason = type(exc).__name__
        finally:
            self.ended.set()

    def close(self) -> None:
        self.sock.close()
        self._reader.join(10)


if __name__ == "__main__" and sys.argv[1:2] == ["probe"]:
    probe_health_until_stdin_closes(sys.argv[2])
