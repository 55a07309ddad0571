"""The WebSocket frames the daemon writes itself are the bytes wsproto writes, and its direct
writer never cuts into a frame of the server's.

- :func:`daemon.core.frame_codec.ws_frames` against wsproto's own server connection (no
  extension, as the daemon's WebSocket limits make every connection) for payloads around the
  three length forms and for text that is not ASCII;
- :class:`daemon.bridge.DirectWebSocket` on a real socket pair writes only while it holds the
  server's send lock (Hypercorn writes its pings, pongs and close frames under it);
- the load generator's WebSocket reader (what the fan-out test and ``benchmarks ws_cost``
  check delivery with) reads the frames however the stream is cut, answers pings, and sees a
  dropped message.
"""

from __future__ import annotations

import socket
from typing import Any

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from msgspec.structs import replace
from wsproto import ConnectionType
from wsproto.connection import Connection
from wsproto.events import TextMessage

from benchmarks.loadgen import LoadGenError, WSCounter, check_delivery
from daemon.bridge import DirectWebSocket
from daemon.core.envelope import Event
from daemon.core.frame_codec import ws_chunks, ws_frame_head, ws_frames

SIZES = [0, 1, 125, 126, 127, 65535, 65536, 70_000]


def _event(raw: bytes, event_id: int = 1) -> Event:
    return Event(raw, len(raw), event_id, "session_update", None)


def _wsproto(text: str) -> bytes:
    return bytes(Connection(ConnectionType.SERVER).send(TextMessage(data=text)))


@pytest.mark.parametrize("size", SIZES)
def test_a_message_is_framed_as_wsproto_frames_it(size: int) -> None:
    text = "x" * size
    assert ws_frames([_event(text.encode())]) == _wsproto(text)


def test_a_run_of_messages_and_its_chunks_are_wsprotos_frames_joined() -> None:
    texts = ["a" * n for n in SIZES] + ["\u00e9\u4e2d\U0001f600" * 40, '{"id":7}']
    events = [_event(t.encode(), i) for i, t in enumerate(texts, 1)]
    expected = b"".join(_wsproto(t) for t in texts)
    assert ws_frames(events) == expected
    assert b"".join(ws_chunks(events, max_chunk=1000)) == expected
    assert len(ws_chunks(events, max_chunk=1000)) > 1
    with pytest.raises(ValueError):
        ws_frame_head(-1)


async def test_the_direct_writer_waits_for_the_servers_send_lock() -> None:
    ours, peer = socket.socketpair()
    ours.setblocking(False)
    peer.setblocking(False)
    lock = trio.Semaphore(1, max_value=1)  # the connection registry's lock (no owner)
    writer = DirectWebSocket(ours, lock)
    frames = ws_frames([_event(b"hello")])
    try:
        async with trio.open_nursery() as nursery:
            await lock.acquire()  # the server is writing a frame of its own
            nursery.start_soon(writer.write, frames)
            await trio.testing.wait_all_tasks_blocked()
            with pytest.raises(BlockingIOError):
                peer.recv(100)  # nothing written while the server holds the lock
            lock.release()
        assert peer.recv(100) == frames
    finally:
        ours.close()
        peer.close()


def _stream(count: int, ping_after: int | None = None) -> bytes:
    head = b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\n\r\n"
    events = [_event(b'{"v":1,"type":"replay_complete","data":{}}', 0)]
    events[0] = Event(events[0].raw, events[0].size, None, "replay_complete", None)
    body = [ws_frames(events)]
    for i in range(1, count + 1):
        kind = "turn_complete" if i == count else "session_update"
        raw = b'{"id":%d,"v":1,"type":"%b","data":{"text":"%b"}}' % (
            i, kind.encode(), b"y" * (i * 37 % 300))
        body.append(ws_frames([Event(raw, len(raw), i, kind, None)]))
        if i == ping_after:
            body.append(b"\x89\x00")  # a ping of the server's own
    return head + b"".join(body)


@settings(max_examples=30, deadline=None)
@given(cuts=st.lists(st.integers(min_value=1, max_value=4000), max_size=30))
def test_the_reader_takes_the_frames_however_the_stream_is_cut(cuts: list[int]) -> None:
    data = _stream(200, ping_after=57)
    counter = WSCounter(b"event: turn_complete\n")
    pos = 0
    for cut in sorted(set(cuts)):
        counter.feed(data[pos:cut])
        pos = max(pos, cut)
    counter.feed(data[pos:])
    assert counter.error is None
    assert (counter.first_id, counter.last_id, counter.ids) == (1, 200, 200)
    assert counter.done and counter.terminal_id == 200 and counter.id_error is None
    assert bytes(counter.replies[:2]) == b"\x8a\x80"  # the ping answered, masked


def test_the_reader_sees_a_dropped_message() -> None:
    data = _stream(50)
    frame = ws_frames([_event(b'{"id":20,"v":1,"type":"session_update","data":{"text":"%b"}}'
                              % (b"y" * (20 * 37 % 300)), 20)])
    assert frame in data
    counter = WSCounter(b"event: turn_complete\n")
    counter.feed(data.replace(frame, b""))
    sub = {**{"status": 101, "error": None, "evicted": False, "done": counter.done,
              "first_id": counter.first_id, "last_id": counter.last_id, "ids": counter.ids,
              "id_error": counter.id_error, "terminal_id": counter.terminal_id}}
    assert counter.id_error == "id 21 after id 19"
    with pytest.raises(LoadGenError):
        check_delivery([sub], 1, 50)


# --- the start-up probe ---------------------------------------------------------------------

def _probe_config() -> Any:
    from hypercorn.config import Config as HyperConfig

    hconf = HyperConfig()
    hconf.accesslog = None
    return hconf


def _patches_installed() -> None:
    # Through the one installer, as the daemon does: installing a part on its own would leave
    # the installer's status saying "nothing installed", and a daemon started later in this
    # process would then check Hypercorn's shape against the patched code and refuse it.
    from daemon.bridge import _patches

    status = _patches.install()
    assert status.connection_registry and status.ws_limits


async def test_the_websocket_probe_finds_this_hypercorn_writes_what_the_direct_writer_does(
        ) -> None:
    from daemon.bridge import _probe

    _patches_installed()
    result = await _probe.probe_ws(_probe_config())
    assert result.identical, result.reason


async def test_a_wsproto_that_frames_otherwise_fails_the_probe_and_keeps_asgi(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """wsproto writing a 16-bit length where the protocol allows 7 bits (valid framing, other
    bytes): the probe sees the difference, and no WebSocket gets a direct writer."""
    from wsproto import frame_protocol

    from daemon.bridge import _direct_body, _direct_ws, _patches, _probe

    _patches_installed()
    monkeypatch.setattr(_direct_body, "_enabled", _direct_body.enabled())  # restored after
    original = frame_protocol.FrameProtocol._serialize_frame

    def long_lengths(self: Any, opcode: Any, payload: Any = b"", fin: bool = True) -> bytearray:
        data = original(self, opcode, payload, fin)
        if opcode == frame_protocol.Opcode.TEXT and len(payload) < 126:
            return bytearray([data[0], 126]) + len(payload).to_bytes(2, "big") + data[2:]
        return data

    monkeypatch.setattr(frame_protocol.FrameProtocol, "_serialize_frame", long_lengths)
    result = await _probe.probe_ws(_probe_config())
    assert not result.identical and "bytes differ" in result.reason, result.reason
    monkeypatch.setattr(_patches, "_status", replace(
        _patches.status(), connection_registry=True, ws_limits=True))
    monkeypatch.setattr(_direct_ws, "_enabled", True)
    await _patches.probe_direct_body(_probe_config())
    assert not _direct_ws.enabled() and not _patches.status().direct_ws
