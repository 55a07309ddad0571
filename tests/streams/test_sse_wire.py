"""SSE wire details: response headers, the retry preamble, frame format, and the
heartbeat comment on idle streams (daemon started with a short --heartbeat-ms)."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

import httpx
import pytest
import trio

from tests.harness import RunningDaemon, running_daemon
from tests.sse_client import Subscriber, is_terminal_for

pytestmark = pytest.mark.processes  # starts processes: not in make unit-fast


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    with running_daemon(tmp_path_factory.mktemp("sse"), ["--heartbeat-ms", "150"]) as d:
        yield d


async def test_headers_preamble_frames_and_heartbeat(daemon: RunningDaemon) -> None:
    async with httpx.AsyncClient(base_url=daemon.url) as client, trio.open_nursery() as nursery:
        created = (await client.post("/session", json={})).json()
        sid = created["sessionId"]
        sub = Subscriber(client, f"/session/{sid}/events", {"Last-Event-ID": "0"})
        await nursery.start(sub.run)
        pid = (await client.post(f"/session/{sid}/prompt", json={"prompt": [
            {"type": "text", "text": "mock:chunks=2 mock:delay_ms=0"}]})).json()["promptId"]
        await sub.wait_for(is_terminal_for(pid))
        # The stream is idle after the terminal: a heartbeat comment follows.
        await sub.wait_raw(b": heartbeat\n\n")
        nursery.cancel_scope.cancel()
    headers = sub.response_headers
    assert headers is not None
    assert headers["content-type"] == "text/event-stream"
    assert headers["cache-control"] == "no-cache, no-transform"
    assert headers["connection"] == "keep-alive"
    assert headers["x-accel-buffering"] == "no"
    assert headers["x-qwen-event-epoch"] == created["eventEpoch"]
    assert uuid.UUID(headers["x-qwen-sse-stream-id"]).version == 4
    raw = bytes(sub.raw)
    assert raw.startswith(b"retry: 3000\n\n")
    frames = [f for f in raw.split(b"\n\n") if f.startswith(b"id: ")]
    for frame in frames:
        assert re.fullmatch(rb'id: (\d+)\nevent: (\w+)\ndata: \{"id":\1,"v":1,"type":"\2".*\}',
                            frame, re.S), frame[:120]
    assert b"event: replay_complete\ndata: {" in raw

