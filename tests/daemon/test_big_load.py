"""A load whose body is megabytes (an open turn's live journal past a megabyte): written part by
part from the envelopes' own bytes, it must still be one exact JSON body of the declared length
holding every chunk's text in order."""

from __future__ import annotations

from pathlib import Path

import httpx
import msgspec
import pytest
import trio

from daemon.http_api import SPLICED_WRITE_MIN_BYTES
from sdk.protocol.envelope import decode_events
from tests.harness import running_daemon
from tests.sse_client import Subscriber, is_terminal_for, text_of

pytestmark = pytest.mark.processes  # starts processes: not in make unit-fast

CHUNKS = 3000
PAD = 600  # 3,000 chunks of 600 bytes: a 1.8 MB journal, past the part-by-part threshold


async def test_a_megabyte_load_is_one_exact_body_with_every_chunk(tmp_path: Path) -> None:
    expected = "".join(f"chunk-{i}".ljust(PAD, ".") for i in range(CHUNKS))
    assert len(expected) > SPLICED_WRITE_MIN_BYTES
    with running_daemon(tmp_path) as daemon:
        async with httpx.AsyncClient(base_url=daemon.url, timeout=30) as client, \
                trio.open_nursery() as nursery:
            sid = (await client.post("/session", json={})).json()["sessionId"]
            sub = Subscriber(client, f"/session/{sid}/events", {"Last-Event-ID": "0"})
            await nursery.start(sub.run)
            pid = (await client.post(f"/session/{sid}/prompt", json={"prompt": [
                {"type": "text", "text": f"mock:chunks={CHUNKS} mock:bytes={PAD} "
                                         "mock:delay_ms=0 mock:gate=big"}]})).json()["promptId"]
            last = f"chunk-{CHUNKS - 1}".ljust(PAD, ".")
            await sub.wait_for(lambda e: text_of(e) == last)
            response = await client.post(f"/session/{sid}/load", json={})
            assert response.status_code == 200
            assert response.headers["content-type"] == "application/json"
            assert int(response.headers["content-length"]) == len(response.content)
            body = msgspec.json.decode(response.content)
            live = decode_events(body["liveJournal"])
            chunks = [e for e in live if e.prompt_id == pid and e.type == "session_update"
                      and e.data["update"]["sessionUpdate"] == "agent_message_chunk"]
            assert "".join(map(text_of, chunks)) == expected
            assert body["lastEventId"] == sub.events[-1].id == live[-1].id
            # The connection carries on: the next request on it is answered.
            assert (await client.get("/health")).json() == {"status": "ok"}
            daemon.open_gate("big")
            await sub.wait_for(is_terminal_for(pid))
            nursery.cancel_scope.cancel()
