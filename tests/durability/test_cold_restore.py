"""Cold restore: SIGKILL the daemon while a full-speed turn streams, restart it on
the same data directory, and load the old session: nothing up to the last durableEventId read
is lost, what survived is exactly what the subscriber received (in order, no duplicates), the
interrupted prompt is closed with exactly one terminal, and the session keeps working. The
size of the loss window is measured by ``python -m benchmarks crash_loss``."""

from __future__ import annotations

import random
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import trio

from daemon.core.envelope import decode_json
from daemon.server import TRANSCRIPT_FILE
from daemon.transcript_store import TranscriptDatabase
from sdk.protocol.envelope import DaemonEvent, decode_events
from sdk.protocol.http import LoadSessionResponse
from tests.harness import running_daemon, start_daemon
from tests.sse_client import Subscriber, chunk_kind, is_terminal_for

pytestmark = pytest.mark.processes  # starts processes: not in make unit-fast

ROUNDS = 3
SEED = 20611
FAST_TURN = "fast mock:chunks=1000000 mock:delay_ms=0"  # outlasts every kill moment
TERMINALS = ("turn_complete", "turn_error")


@dataclass
class Killed:
    """What one round saw before its SIGKILL."""

    prompt_id: str
    received: list[DaemonEvent]  # everything the subscriber got, the kernel's leftovers too
    samples: list[dict[str, Any]]  # /status read while the turn streamed, the last one last
    survived: list[dict[str, Any]]  # the dead daemon's raw events, read from its SQLite file


async def load_restored(client: httpx.AsyncClient, sid: str) -> dict[str, Any]:
    """Load a session the daemon has never seen live: it is restored from the transcript."""
    assert (await client.get(f"/session/{sid}/status")).status_code == 404
    resp = await client.post(f"/session/{sid}/load", json={})
    assert resp.status_code == 200, resp.text
    # The answer is the protocol's load body, an interrupted prompt's ledger terminal included.
    msgspec.json.decode(resp.content, type=LoadSessionResponse[msgspec.Raw])
    body: dict[str, Any] = resp.json()
    assert body["liveJournal"] == [] and body["hasActivePrompt"] is False
    seeded = decode_events(body["compactedReplay"])
    # Seeded events get fresh ids; nothing the agent replayed was republished.
    assert [e.id for e in seeded if e.id is not None] == list(range(1, body["lastEventId"] + 1))
    return body


async def read_until_cut(sub: Subscriber, *,
                         task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Run a subscriber whose daemon is about to be SIGKILLed: the cut ends it, quietly."""
    try:
        await sub.run(task_status=task_status)
    except (httpx.RemoteProtocolError, httpx.ReadError):
        pass


async def stream_and_kill(base: Path, round_no: int, sid: str | None,
                          rng: random.Random) -> tuple[str, Killed]:
    """Start a daemon, (restore and) stream a full-speed turn, SIGKILL it at a random moment
    while the turn streams, then read what survived straight from its database."""
    env = {"MOCK_ACP_LOAD_SESSION": "1"} if round_no % 2 else {}
    daemon = start_daemon(base, env=env, data_dir=base / "data", tag=f"round{round_no}")
    samples: list[dict[str, Any]] = []
    try:
        async with httpx.AsyncClient(base_url=daemon.url) as client, \
                trio.open_nursery() as nursery:
            if sid is None:
                sid = (await client.post("/session", json={})).json()["sessionId"]
            else:
                await load_restored(client, sid)
                via = "session/load" if round_no % 2 else "session/new"
                assert f"via={via}" in daemon.stderr()
            status = (await client.get(f"/session/{sid}/status")).json()
            sub = Subscriber(client, f"/session/{sid}/events?maxQueued=2048", {
                "Last-Event-ID": str(status["lastEventId"]),
                "X-Qwen-Event-Epoch": status["eventEpoch"]})
            await nursery.start(read_until_cut, sub)
            pid = (await client.post(f"/session/{sid}/prompt", json={"prompt": [
                {"type": "text", "text": FAST_TURN}]})).json()["promptId"]
            await sub.wait_for(lambda e: e.prompt_id == pid
                               and chunk_kind(e) == "agent_message_chunk")
            # The random kill moment: after a random number of status reads taken back to
            # back (the daemon answers them between agent batches), and a random pause.
            for _ in range(rng.randint(4, 7)):
                samples.append((await client.get(f"/session/{sid}/status")).json())
            await trio.sleep(rng.uniform(0, 0.05))  # where in the stream the kill lands
            daemon.proc.send_signal(signal.SIGKILL)
            await trio.to_thread.run_sync(daemon.proc.wait)
            # What the kernel still held for the subscriber arrives; then the stream ends.
            await sub.wait_ended(timeout=20)
            nursery.cancel_scope.cancel()
    finally:
        daemon.kill()
    assert daemon.proc.returncode == -signal.SIGKILL
    store = TranscriptDatabase(base / "data" / TRANSCRIPT_FILE)
    try:
        survived = [decode_json(raw) for raw in store.raw_events(sid)]
    finally:
        store.close()
    return sid, Killed(pid, list(sub.events), samples, survived)


def check_survivors(killed: Killed) -> None:
    """(a) and (b), by event id, on the dead daemon's own file."""
    durable = int(killed.samples[-1]["durableEventId"])
    # (a) durableEventId kept moving while the turn streamed: the group commit runs during the
    # turn, not only at its end (a commit delay longer than the sampling cannot pass this) ...
    turn_start = next(e.id for e in killed.received if e.prompt_id == killed.prompt_id)
    moving = sorted({int(s["durableEventId"]) for s in killed.samples
                     if int(s["durableEventId"]) >= (turn_start or 0)})
    assert len(moving) >= 2, f"durableEventId did not advance during the turn: {moving}"
    # ... and every event up to the last durableEventId read before the kill survived, in
    # order, no duplicates, no holes.
    ids = [int(e["id"]) for e in killed.survived]
    assert ids and ids[-1] >= durable, f"survived up to {ids[-1:]}, durableEventId {durable}"
    assert ids == list(range(ids[0], ids[0] + len(ids))), "survived ids are not contiguous"
    # (b) what survived is what the subscriber received, in order, no duplicates: on the ids
    # both hold, the same events; the subscriber's ids are contiguous too.
    got = [e for e in killed.received if e.id is not None]
    got_ids = [e.id for e in got]
    assert got_ids == list(range(got_ids[0], got_ids[0] + len(got_ids)))
    by_id = {int(e["id"]): e for e in killed.survived}
    common = [e for e in got if e.id in by_id]
    assert common, "nothing the subscriber received survived"
    assert [e.id for e in common] == [i for i in got_ids if ids[0] <= i <= ids[-1]]
    for event in common:
        stored = by_id[event.id]  # type: ignore[index]
        assert (stored["type"], stored["data"]) == (event.type, event.data)
    assert not [e for e in got if e.type in TERMINALS and e.prompt_id == killed.prompt_id]


def check_closed(body: dict[str, Any], records: list[dict[str, Any]], killed: Killed) -> None:
    """(c) the interrupted prompt has exactly one terminal, after exactly what survived."""
    mine = [e for e in records if e.get("promptId") == killed.prompt_id]
    terminals = [e for e in mine if e["type"] in TERMINALS]
    assert len(terminals) == 1
    assert terminals[0]["type"] == "turn_error"
    assert terminals[0]["data"]["code"] == "interrupted"
    assert terminals[0]["data"]["message"] == "Prompt interrupted by daemon restart"
    assert mine[-1] is terminals[0]
    survived_text = "".join(
        e["data"]["update"]["content"]["text"] for e in killed.survived
        if e["type"] == "session_update"
        and e["data"]["update"].get("sessionUpdate") == "agent_message_chunk")
    restored_text = "".join(
        e["data"]["update"]["content"]["text"] for e in mine
        if e["type"] == "session_update"
        and e["data"]["update"].get("sessionUpdate") == "agent_message_chunk")
    assert restored_text == survived_text
    ledger = {t["promptId"]: t["terminal"] for t in body["promptTerminals"]}
    assert ledger[killed.prompt_id] == "interrupted"


async def all_records(client: httpx.AsyncClient, sid: str) -> list[dict[str, Any]]:
    pages: list[list[dict[str, Any]]] = []
    params: dict[str, Any] = {"limit": 500}
    while True:
        page = (await client.get(f"/session/{sid}/transcript", params=params)).json()
        pages.append(page["events"])
        if not page["hasMore"]:
            return [e for chunk in reversed(pages) for e in chunk]
        params = {"limit": 500, "cursor": page["nextCursor"]}


async def test_sigkill_while_a_fast_turn_streams_loses_only_the_undurable_tail(
        tmp_path: Path) -> None:
    """Several rounds, each killed at a seeded random moment of a full-speed turn; every
    round but the first restores the session the previous one left (session/new and
    session/load alternate), and a last daemon restores the final round."""
    rng = random.Random(SEED)
    sid: str | None = None
    rounds: list[Killed] = []
    for round_no in range(ROUNDS):
        sid, killed = await stream_and_kill(tmp_path, round_no, sid, rng)
        check_survivors(killed)
        rounds.append(killed)
    assert sid is not None
    with running_daemon(tmp_path, data_dir=tmp_path / "data", tag="last") as daemon:
        async with httpx.AsyncClient(base_url=daemon.url) as client:
            body = await load_restored(client, sid)
            records = await all_records(client, sid)
            for killed in rounds:
                check_closed(body, records, killed)
            # Seeded history is not in the new bus's ring: a reader starting from 0 is told.
            async with trio.open_nursery() as nursery:
                seeded = Subscriber(client, f"/session/{sid}/events", {
                    "Last-Event-ID": "0", "X-Qwen-Event-Epoch": body["eventEpoch"]})
                await nursery.start(seeded.run)
                await seeded.wait_for(lambda e: e.type == "replay_complete")
                nursery.cancel_scope.cancel()
            assert seeded.events[0].type == "state_resync_required"
            assert seeded.events[0].data == {
                "reason": "seeded_replay_not_in_ring", "lastDeliveredId": 0,
                "earliestAvailableId": body["lastEventId"] + 1}
            # The restored session takes a new prompt that runs to its end.
            async with trio.open_nursery() as nursery:
                sub = Subscriber(client, f"/session/{sid}/events", {
                    "Last-Event-ID": str(body["lastEventId"]),
                    "X-Qwen-Event-Epoch": body["eventEpoch"]})
                await nursery.start(sub.run)
                pid = (await client.post(f"/session/{sid}/prompt", json={"prompt": [
                    {"type": "text", "text": "after restore mock:chunks=2 mock:delay_ms=0"}]}
                )).json()["promptId"]
                done = await sub.wait_for(is_terminal_for(pid))
                nursery.cancel_scope.cancel()
            assert done.type == "turn_complete"
            assert sub.ids()[0] == body["lastEventId"] + 1


async def test_deleted_session_is_never_restored(tmp_path: Path) -> None:
    with running_daemon(tmp_path, data_dir=tmp_path / "data", tag="a") as daemon:
        async with httpx.AsyncClient(base_url=daemon.url) as client:
            sid = (await client.post("/session", json={})).json()["sessionId"]
            assert (await client.delete(f"/session/{sid}")).status_code == 204
    with running_daemon(tmp_path, data_dir=tmp_path / "data", tag="b") as daemon:
        async with httpx.AsyncClient(base_url=daemon.url) as client:
            assert (await client.post(f"/session/{sid}/load", json={})).status_code == 404


async def test_second_daemon_on_same_data_dir_refuses(tmp_path: Path) -> None:
    with running_daemon(tmp_path, data_dir=tmp_path / "data", tag="a"):
        with pytest.raises(RuntimeError, match="another daemon is already using"):
            start_daemon(tmp_path, data_dir=tmp_path / "data", tag="b")
