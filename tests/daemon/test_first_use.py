"""A session's machinery (agent channel, bus, session, event streams, restore) is imported by the
first request that needs it, not by the daemon's start (tests/daemon/test_idle_footprint.py pins
that it is absent at idle). Here each kind of request is the very first one a fresh daemon
serves, and gets its full answer: creating and prompting a session, an event stream or a
WebSocket refused before any session exists, the list, a vote, the OpenAPI document, and after a
restart a load that restores a stored session or a look-up of a stored prompt by its
Idempotency-Key. The event types and their codecs (sdk.protocol's
envelope, events and SSE modules, the daemon's envelope and frame codec) load with the first of
these that builds or reads back an event, the envelope's schema with the first document."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import msgspec
import pytest
import trio
from trio_websocket import ConnectionRejected, open_websocket_url

from tests.harness import running_daemon

# starts processes: not in make unit-fast; exec_daemon: real `python -m daemon` (start path test)
pytestmark = [pytest.mark.processes, pytest.mark.exec_daemon]

WAIT_S = 20.0


def _events(client: httpx.Client, sid: str, until: str) -> list[dict[str, object]]:
    """The SSE frames of ``sid`` from the start up to the first of type ``until``."""
    frames: list[dict[str, object]] = []
    with client.stream("GET", f"/session/{sid}/events?lastEventId=0") as stream:
        assert stream.status_code == 200
        assert stream.headers["content-type"].startswith("text/event-stream")
        for line in stream.iter_lines():
            if line.startswith("data:"):
                frame = msgspec.json.decode(line[5:].strip())
                frames.append(frame)
                if frame.get("type") == until:
                    return frames
    raise AssertionError(f"the stream ended before {until}: {frames[-3:]}")


def _prompt(client: httpx.Client, sid: str, text: str, key: str | None = None) -> str:
    answer = client.post(f"/session/{sid}/prompt",
                         json={"prompt": [{"type": "text", "text": text}]},
                         headers={} if key is None else {"Idempotency-Key": key})
    assert answer.status_code == 202, answer.text
    return str(answer.json()["promptId"])


def test_first_request_creates_a_session_that_streams_a_turn_and_answers_a_vote(
        tmp_path: Path) -> None:
    with running_daemon(tmp_path) as daemon, httpx.Client(base_url=daemon.url,
                                                          timeout=WAIT_S) as client:
        created = client.post("/session", json={"sessionScope": "thread"})
        assert created.status_code == 200, created.text
        sid = created.json()["sessionId"]
        prompt_id = _prompt(client, sid, "mock:chunks=50 mock:delay_ms=0")
        frames = _events(client, sid, "turn_complete")
        chunks = [f for f in frames if f.get("type") == "session_update"]
        assert len(chunks) >= 50
        assert frames[-1]["data"]["promptId"] == prompt_id  # type: ignore[index]
        vote = client.post(f"/session/{sid}/permission/no-such-request",
                           json={"outcome": "cancelled"})
        assert vote.status_code == 404 and vote.json()["code"] == "permission_not_found"


def test_first_request_is_an_event_stream_of_an_unknown_session(tmp_path: Path) -> None:
    with running_daemon(tmp_path) as daemon:
        answer = httpx.get(f"{daemon.url}/session/no-such-session/events", timeout=WAIT_S)
        assert answer.status_code == 404
        assert answer.json()["code"] == "session_not_found"


def test_first_request_lists_the_sessions(tmp_path: Path) -> None:
    with running_daemon(tmp_path) as daemon:
        answer = httpx.get(f"{daemon.url}/sessions", timeout=WAIT_S)
        assert answer.status_code == 200
        assert answer.json()["sessions"] == [] and answer.json()["hasMore"] is False


@pytest.mark.parametrize(("path", "headers", "status", "code"), [
    ("/session/no-such-session/ws", [], 404, "session_not_found"),
    ("/no-such-route", [], 404, "route_not_found"),
    ("/session/no-such-session/ws", [(b"origin", b"http://evil.test")], 403, None),
])
async def test_first_request_is_a_websocket_the_daemon_refuses(
        tmp_path: Path, path: str, headers: list[tuple[bytes, bytes]], status: int,
        code: str | None) -> None:
    with running_daemon(tmp_path) as daemon:
        url = daemon.url.replace("http://", "ws://") + path
        with trio.fail_after(WAIT_S), pytest.raises(ConnectionRejected) as refused:
            async with open_websocket_url(url, extra_headers=headers):
                pass
        assert refused.value.status_code == status
        if code is not None:
            assert refused.value.body is not None
            assert msgspec.json.decode(refused.value.body)["code"] == code


KEY = "first-use-key"


@pytest.fixture
def stored_session(tmp_path: Path) -> Iterator[tuple[Path, str, str]]:
    """A session with one completed turn (its prompt sent with an Idempotency-Key), stored by a
    daemon that then stopped."""
    data = tmp_path / "data"
    with running_daemon(tmp_path / "first", data_dir=data) as daemon, \
            httpx.Client(base_url=daemon.url, timeout=WAIT_S) as client:
        sid = client.post("/session", json={"sessionScope": "thread"}).json()["sessionId"]
        prompt_id = _prompt(client, sid, "mock:chunks=20 mock:delay_ms=0", key=KEY)
        _events(client, sid, "turn_complete")
    yield data, sid, prompt_id


def test_first_request_after_a_restart_loads_a_stored_session(
        tmp_path: Path, stored_session: tuple[Path, str, str]) -> None:
    data, sid, prompt_id = stored_session
    with running_daemon(tmp_path / "second", data_dir=data) as daemon:
        answer = httpx.post(f"{daemon.url}/session/{sid}/load", json={}, timeout=WAIT_S)
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["sessionId"] == sid and body["hasActivePrompt"] is False
        terminals = [frame for frame in body["compactedReplay"]
                     if frame["type"] == "turn_complete"]
        assert [t["data"]["promptId"] for t in terminals] == [prompt_id]


def test_first_request_is_the_openapi_document(tmp_path: Path) -> None:
    with running_daemon(tmp_path) as daemon:
        answer = httpx.get(f"{daemon.url}/openapi.json", timeout=WAIT_S)
        assert answer.status_code == 200, answer.text
        schemas = answer.json()["components"]["schemas"]
        for body, member in (("LoadSessionResponse", "liveJournal"),
                             ("TranscriptPage", "events")):
            items = schemas[body]["properties"][member]["items"]
            assert items == {"$ref": "#/components/schemas/DaemonEvent"}, (body, items)
        assert "promptId" in schemas["DaemonEvent"]["properties"]


def test_first_request_after_a_restart_asks_for_a_stored_prompt_by_its_key(
        tmp_path: Path, stored_session: tuple[Path, str, str]) -> None:
    data, sid, prompt_id = stored_session
    with running_daemon(tmp_path / "second", data_dir=data) as daemon:
        answer = httpx.get(f"{daemon.url}/session/{sid}/prompts/{KEY}", timeout=WAIT_S)
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert (body["promptId"], body["idempotencyKey"], body["state"]) == (
            prompt_id, KEY, "completed")
