"""The WebSocket variant against the real daemon: same envelopes as JSON text
messages, the same resume algorithm, plain HTTP answers to bad upgrades, close 1000 at the
session's end."""

from __future__ import annotations

import base64
import os
import socket
from collections.abc import Iterator

import httpx
import msgspec
import pytest
import trio
from trio_websocket import ConnectionClosed, ConnectionRejected, open_websocket_url

from tests.harness import RunningDaemon, running_daemon

pytestmark = pytest.mark.processes  # starts processes: not in make unit-fast

TOKEN = "ws-token"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    with running_daemon(tmp_path_factory.mktemp("ws"), ["--token", TOKEN]) as d:
        yield d


def ws_url(daemon: RunningDaemon, sid: str, query: str = "") -> str:
    return daemon.url.replace("http://", "ws://") + f"/session/{sid}/ws{query}"


AUTH = [(b"authorization", f"Bearer {TOKEN}".encode())]


async def read_until(ws: object, pred: object, limit: int = 100_000) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    with trio.fail_after(20):
        while len(out) < limit:
            msg = await ws.get_message()  # type: ignore[attr-defined]
            frame = msgspec.json.decode(msg)
            out.append(frame)
            if pred(frame):  # type: ignore[operator]
                return out
    return out


async def test_stream_resume_and_close_1000(daemon: RunningDaemon) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(base_url=daemon.url, headers=headers) as client:
        sid = (await client.post("/session", json={})).json()["sessionId"]
        async with open_websocket_url(ws_url(daemon, sid, "?lastEventId=0"),
                                      extra_headers=AUTH) as ws:
            pid = (await client.post(f"/session/{sid}/prompt", json={"prompt": [
                {"type": "text", "text": "mock:chunks=200 mock:delay_ms=0"}]})).json()["promptId"]
            frames = await read_until(ws, lambda f: f.get("type") == "turn_complete")
        ids = [f["id"] for f in frames if "id" in f]
        assert frames[0]["type"] == "replay_complete"
        assert ids == list(range(1, len(ids) + 1))
        assert frames[-1]["data"]["promptId"] == pid  # type: ignore[index]
        epoch = (await client.get(f"/session/{sid}/status")).json()["eventEpoch"]

        # Resume from a cursor inside the ring: exactly the missed frames, then replay_complete.
        async with open_websocket_url(ws_url(daemon, sid, f"?lastEventId=100&epoch={epoch}"),
                                      extra_headers=AUTH) as ws:
            replay = await read_until(ws, lambda f: f.get("type") == "replay_complete")
        assert [f["id"] for f in replay[:-1]] == list(range(101, ids[-1] + 1))
        assert replay[-1]["data"] == {"lastReplayedEventId": ids[-1], "lastEventId": ids[-1],
                                      "replayedCount": ids[-1] - 100}

        # A wrong epoch resets: state_resync_required first, then the whole ring.
        async with open_websocket_url(ws_url(daemon, sid, "?lastEventId=5&epoch=old"),
                                      extra_headers=AUTH) as ws:
            reset = await read_until(ws, lambda f: f.get("type") == "replay_complete")
        assert reset[0]["data"]["reason"] == "epoch_reset"  # type: ignore[index]
        assert reset[0]["data"]["detail"] == "epoch_mismatch"  # type: ignore[index]

        # The session ends: the socket closes with 1000 after session_closed.
        async with open_websocket_url(ws_url(daemon, sid), extra_headers=AUTH) as ws:
            assert (await client.delete(f"/session/{sid}")).status_code == 204
            seen = []
            with pytest.raises(ConnectionClosed) as closed:
                with trio.fail_after(10):
                    while True:
                        seen.append(msgspec.json.decode(await ws.get_message())["type"])
            assert seen[-1] == "session_closed"
            assert closed.value.reason.code == 1000


async def test_bad_upgrades_get_plain_http_answers(daemon: RunningDaemon) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(base_url=daemon.url, headers=headers) as client:
        sid = (await client.post("/session", json={"sessionScope": "thread"})).json()["sessionId"]
    with pytest.raises(ConnectionRejected) as unauthorized:
        async with open_websocket_url(ws_url(daemon, sid)):
            pass
    assert unauthorized.value.status_code == 401
    assert msgspec.json.decode(unauthorized.value.body)["code"] == "unauthorized"
    with pytest.raises(ConnectionRejected) as missing:
        async with open_websocket_url(ws_url(daemon, "no-such-session"), extra_headers=AUTH):
            pass
    assert missing.value.status_code == 404
    assert msgspec.json.decode(missing.value.body)["code"] == "session_not_found"
    with pytest.raises(ConnectionRejected) as origin:
        async with open_websocket_url(ws_url(daemon, sid),
                                      extra_headers=[*AUTH, (b"origin", b"http://evil.test")]):
            pass
    assert origin.value.status_code == 403


@pytest.fixture(scope="module")
def pinging(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    # Short enough for fast tests, long enough that a peer answering every ping is never two
    # intervals (1 s) late on a busy machine.
    with running_daemon(tmp_path_factory.mktemp("wsping"), ["--ws-ping-ms", str(PING_MS)]) as d:
        yield d


PING_MS = 500


def read_frame(sock: socket.socket) -> tuple[int, bytes]:
    """One server frame (servers never mask): (opcode, payload)."""
    def exactly(n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            if not chunk:
                raise EOFError
            data += chunk
        return data
    first, second = exactly(2)
    length = second & 0x7F
    if length == 126:
        length = int.from_bytes(exactly(2), "big")
    elif length == 127:
        length = int.from_bytes(exactly(8), "big")
    return first & 0x0F, exactly(length)


def test_two_missed_pongs_close_with_1011(pinging: RunningDaemon) -> None:
    with httpx.Client(base_url=pinging.url, timeout=30) as client:
        sid = client.post("/session", json={}).json()["sessionId"]
    host, port = pinging.url.removeprefix("http://").rsplit(":", 1)
    key = base64.b64encode(os.urandom(16)).decode()
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall((f"GET /session/{sid}/ws HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                      "Upgrade: websocket\r\nConnection: Upgrade\r\n"
                      f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            head += sock.recv(1)
        assert head.startswith(b"HTTP/1.1 101")
        # This peer reads but never answers a ping.
        pings = 0
        while True:
            opcode, payload = read_frame(sock)
            if opcode == 0x9:
                pings += 1
            elif opcode == 0x8:
                break
    assert pings >= 2
    assert int.from_bytes(payload[:2], "big") == 1011
    assert "event=ws_keepalive_failed" in pinging.stderr()


def write_frame(sock: socket.socket, opcode: int, payload: bytes) -> None:
    """One client frame (clients always mask), FIN set; payloads under 126 bytes."""
    mask = os.urandom(4)
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    sock.sendall(bytes([0x80 | opcode, 0x80 | len(payload)]) + mask + masked)


def test_a_peer_that_answers_pings_stays_connected(pinging: RunningDaemon) -> None:
    with httpx.Client(base_url=pinging.url, timeout=30) as client:
        sid = client.post("/session", json={"sessionScope": "thread"}).json()["sessionId"]
        failures_before = pinging.stderr().count("event=ws_keepalive_failed")
        host, port = pinging.url.removeprefix("http://").rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=20) as sock:
            key = base64.b64encode(os.urandom(16)).decode()
            sock.sendall((f"GET /session/{sid}/ws?lastEventId=0 HTTP/1.1\r\n"
                          "Host: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                          f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
                          ).encode())
            head = b""
            while b"\r\n\r\n" not in head:
                head += sock.recv(1)
            assert head.startswith(b"HTTP/1.1 101")

            def next_message() -> tuple[int, bytes]:
                """The next non-ping frame; every ping is answered at once with its pong."""
                nonlocal pings
                while True:
                    opcode, payload = read_frame(sock)
                    if opcode != 0x9:
                        return opcode, payload
                    pings += 1
                    write_frame(sock, 0xA, payload)

            # The socket sits idle (nothing to stream) until this peer has answered four pings:
            # counted, not slept for, so the daemon's keepalive really ran four times.
            pings = 0
            opcode, payload = next_message()
            assert opcode == 0x1 and msgspec.json.decode(payload)["type"] == "replay_complete"
            while pings < 4:
                opcode, payload = read_frame(sock)
                assert opcode == 0x9, (opcode, payload)  # a ping, never a close
                pings += 1
                write_frame(sock, 0xA, payload)
            # Still connected: a turn streams to it, down to its terminal.
            pid = client.post(f"/session/{sid}/prompt", json={"prompt": [
                {"type": "text", "text": "mock:chunks=1 mock:delay_ms=0"}]}).json()["promptId"]
            types: list[str] = []
            while "turn_complete" not in types:
                opcode, payload = next_message()
                assert opcode == 0x1, (opcode, payload)
                frame = msgspec.json.decode(payload)
                types.append(frame["type"])
            assert frame["data"]["promptId"] == pid
            assert types.count("session_update") == 2  # the prompt's echo and its one chunk
    assert pinging.stderr().count("event=ws_keepalive_failed") == failures_before
