"""A full disk, injected for real, never makes ``durableEventId`` lie.

The daemon subprocess gets a file-size limit (``RLIMIT_FSIZE``, set on the running process with
``prlimit``; CPython ignores ``SIGXFSZ``, so SQLite's writes past the limit fail with ``EFBIG``)
just above its WAL's current size: the first turn has committed, the second one streams past
the limit. Small turns follow on the full disk (a small batch can still fit where a large one
failed, which is how a lying ``durableEventId`` used to climb past the hole). Then SIGKILL,
restart without the limit, and read the whole transcript back:

- every event at or below the last ``durableEventId`` read survived;
- once the status said ``transcriptDegraded``, ``durableEventId`` never moved again;
- every restored turn is a true prefix of what the subscriber saw (no hole, nothing doubled),
  and each prompt has at most one terminal;
- a turn whose terminal was at or below ``durableEventId`` came back with its own terminal,
  not relabelled ``interrupted``.
"""

from __future__ import annotations

import resource
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from daemon.server import TRANSCRIPT_FILE
from sdk.protocol.envelope import DaemonEvent
from tests.harness import running_daemon, start_daemon
from tests.sse_client import Subscriber, chunk_kind, is_terminal_for, text_of

pytestmark = pytest.mark.processes  # starts processes: not in make unit-fast

TIMEOUT_S = 30.0
ROOM_BYTES = 400 * 1024  # what the WAL may still grow by once the disk is "full"
TERMINALS = ("turn_complete", "turn_error")


async def prompt(client: httpx.AsyncClient, sid: str, text: str) -> str:
    resp = await client.post(f"/session/{sid}/prompt",
                             json={"prompt": [{"type": "text", "text": text}]})
    assert resp.status_code == 202, resp.text
    return str(resp.json()["promptId"])


async def whole_transcript(client: httpx.AsyncClient, sid: str) -> list[dict[str, Any]]:
    """Every stored record of the session, oldest first (paging back with the cursor)."""
    pages: list[list[dict[str, Any]]] = []
    params: dict[str, Any] = {"limit": 500}
    while True:
        body = (await client.get(f"/session/{sid}/transcript", params=params)).json()
        pages.append(body["events"])
        if not body["hasMore"]:
            break
        params = {"limit": 500, "cursor": body["nextCursor"]}
    return [event for page in reversed(pages) for event in page]


def agent_text(events: list[dict[str, Any]], prompt_id: str) -> str:
    out = []
    for e in events:
        update = (e.get("data") or {}).get("update") or {}
        if e.get("promptId") == prompt_id and update.get("sessionUpdate") == \
                "agent_message_chunk":
            out.append(update["content"]["text"])
    return "".join(out)


def received_text(events: list[DaemonEvent], prompt_id: str, up_to: float) -> str:
    return "".join(text_of(e) for e in events
                   if e.prompt_id == prompt_id and chunk_kind(e) == "agent_message_chunk"
                   and e.id is not None and e.id <= up_to)


async def test_disk_full_never_makes_durable_event_id_lie(tmp_path: Path) -> None:
    data = tmp_path / "data"
    daemon = start_daemon(tmp_path, data_dir=data, tag="first")
    samples: list[tuple[int, bool]] = []  # (durableEventId, transcriptDegraded), in order
    prompts: list[str] = []
    try:
        async with httpx.AsyncClient(base_url=daemon.url, timeout=TIMEOUT_S) as client, \
                trio.open_nursery() as nursery:
            sid = (await client.post("/session", json={})).json()["sessionId"]
            sub = Subscriber(client, f"/session/{sid}/events", {"Last-Event-ID": "0"})
            await nursery.start(sub.run)

            async def status() -> dict[str, Any]:
                body: dict[str, Any] = (await client.get(f"/session/{sid}/status")).json()
                samples.append((int(body["durableEventId"]), bool(body["transcriptDegraded"])))
                return body

            async def sample_forever() -> None:
                while True:
                    await status()
                    await trio.sleep(0.005)  # sampling rate only; nothing waits on it

            prompts.append(await prompt(client, sid, "one mock:chunks=50 mock:bytes=2000"))
            await sub.wait_for(is_terminal_for(prompts[0]), timeout=TIMEOUT_S)
            # A transcript read waits for every earlier write: turn one is committed.
            assert (await client.get(f"/session/{sid}/transcript")).status_code == 200
            assert not (await status())["transcriptDegraded"]
            # Turn two is admitted and its echo committed before the disk fills (the mock holds
            # its chunks at a start gate meanwhile), so a restore has a turn to close. Without
            # the gate the admission could share the first failing batch, and then nothing of
            # the turn is stored at all: also no lie, but no interrupted turn to check.
            prompts.append(await prompt(
                client, sid,
                "two mock:start_gate=two mock:chunks=200 mock:bytes=20000 mock:delay_ms=0"))
            echo = await sub.wait_for(
                lambda e: e.prompt_id == prompts[1] and chunk_kind(e) == "user_message_chunk",
                timeout=TIMEOUT_S)
            assert (await client.get(f"/session/{sid}/transcript")).status_code == 200
            assert echo.id is not None and (await status())["durableEventId"] >= echo.id
            wal = data / (TRANSCRIPT_FILE + "-wal")
            assert daemon.stderr_path.stat().st_size < ROOM_BYTES  # the log is not what fails
            limit = wal.stat().st_size + ROOM_BYTES
            _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
            resource.prlimit(daemon.proc.pid, resource.RLIMIT_FSIZE, (limit, hard))

            nursery.start_soon(sample_forever)
            daemon.open_gate("two")
            terminal = await sub.wait_for(is_terminal_for(prompts[1]), timeout=TIMEOUT_S)
            assert terminal.type == "turn_complete"  # the failing disk never stalls a turn
            with trio.fail_after(TIMEOUT_S):
                while not (await status())["transcriptDegraded"]:
                    await trio.sleep(0.01)
            for i in range(4):
                prompts.append(await prompt(client, sid, f"small {i} mock:chunks=3"))
                done = await sub.wait_for(is_terminal_for(prompts[-1]), timeout=TIMEOUT_S)
                assert done.type == "turn_complete"
            last = await status()
            assert last["fullTranscriptAvailable"] is False
            assert last["durableEventId"] < last["lastEventId"]
            nursery.cancel_scope.cancel()
    finally:
        daemon.kill()
    assert daemon.proc.returncode == -signal.SIGKILL
    assert "event=transcript_write_failed" in daemon.stderr()

    durable = samples[-1][0]
    # durableEventId never goes back, and stops for good once the session is degraded.
    assert [d for d, _ in samples] == sorted(d for d, _ in samples)
    first_degraded = next(i for i, (_, degraded) in enumerate(samples) if degraded)
    assert {d for d, _ in samples[first_degraded:]} == {durable}, samples[first_degraded:]
    seen = {e.id: e for e in sub.events if e.id is not None}
    live_terminals = {e.prompt_id: e for e in seen.values() if e.type in TERMINALS}
    assert live_terminals[prompts[0]].id is not None
    assert live_terminals[prompts[0]].id <= durable  # turn one committed before the limit

    with running_daemon(tmp_path, data_dir=data, tag="second") as again:
        async with httpx.AsyncClient(base_url=again.url, timeout=TIMEOUT_S) as client:
            assert (await client.post(f"/session/{sid}/load", json={})).status_code == 200
            stored = await whole_transcript(client, sid)
    stored_terminals: dict[str, list[dict[str, Any]]] = {}
    for e in stored:
        if e["type"] in TERMINALS:
            stored_terminals.setdefault(e["data"]["promptId"], []).append(e)
    assert all(len(ts) == 1 for ts in stored_terminals.values()), stored_terminals

    for pid in prompts:
        live = live_terminals[pid]
        restored = agent_text(stored, pid)
        everything = received_text(sub.events, pid, float("inf"))
        # (a) every event at or below the last durableEventId read survived ...
        assert restored.startswith(received_text(sub.events, pid, durable)), pid
        # ... and what survived is a true prefix of what was streamed: no hole, no double.
        assert everything.startswith(restored), pid
        assert live.id is not None
        if live.id <= durable:
            # Its terminal was committed: it is never relabelled interrupted.
            [kept] = stored_terminals[pid]
            assert (kept["type"], kept["data"].get("stopReason")) == ("turn_complete",
                                                                      "end_turn")
            assert restored == everything
        elif pid in stored_terminals:
            [closed] = stored_terminals[pid]
            assert closed["type"] == "turn_error" and closed["data"]["code"] == "interrupted"
    # The turn that was streaming when the disk filled is back as a prefix, closed once.
    assert prompts[1] in stored_terminals
