"""WebSocket subscribers of a fast turn keep up as SSE subscribers do.

Each WebSocket message used to go through Hypercorn one ASGI send at a time (wsproto encoding
it again), ten times the daemon's CPU of an SSE write: a fast turn outran every WebSocket
subscriber and the slow-client rules evicted them all (8 of 8 after ~1,300 events). A
WebSocket's messages now go the way SSE frames go: framed once per wake-up for every subscriber
and written straight to the socket. Real daemon, real mock agent, real sockets; the subscribers
are held by the benchmarks' load generator (one process, frames parsed without decoding JSON,
so the reader is not what falls behind); ``benchmarks ws_cost`` has the 100,000-chunk figure.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from benchmarks.loadgen import LoadGen, check_delivery
from daemon.core.subscriber import MAX_QUEUED_DEFAULT
from tests.harness import RunningDaemon, running_daemon

pytestmark = pytest.mark.processes  # starts processes: not in make unit-fast

SUBSCRIBERS = 8
# Far past where the old path evicted all 8 (~1,300 events), small enough for make test.
CHUNKS = 20_000


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    with running_daemon(tmp_path_factory.mktemp("wsfanout")) as d:
        yield d


def test_eight_websockets_receive_a_fast_turn_whole_at_the_default_queue(
        daemon: RunningDaemon) -> None:
    host, port = daemon.url.removeprefix("http://").rsplit(":", 1)
    with httpx.Client(base_url=daemon.url, timeout=30) as client:
        sid = client.post("/session", json={}).raise_for_status().json()["sessionId"]
        before = int(client.get(f"/session/{sid}/status").json()["lastEventId"])
        loadgen = LoadGen(host, int(port), sid, subscribers=SUBSCRIBERS,
                          max_queued=MAX_QUEUED_DEFAULT, transport="ws", reconnect=False,
                          timeout=120)
        try:
            loadgen.wait_ready()
            client.post(f"/session/{sid}/prompt", json={"prompt": [
                {"type": "text", "text": f"mock:chunks={CHUNKS} mock:delay_ms=0"}]}
                        ).raise_for_status()
            subs = loadgen.result()["rounds"][0]
        finally:
            loadgen.close()
        published = int(client.get(f"/session/{sid}/status").json()["lastEventId"])
    assert [sub["evicted"] for sub in subs] == [False] * SUBSCRIBERS
    assert published - before == CHUNKS + 2  # the prompt's echo, the chunks, the terminal
    check_delivery(subs, before + 1, published)  # every id, in order, the terminal last
    # The fast path is what delivered them (the start-up probe found its bytes identical).
    assert "event=direct_ws_enabled" in daemon.stderr()
