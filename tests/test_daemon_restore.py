"""Cold restore (SPEC §6.2): SIGKILL the daemon mid-turn, restart it on the same data
directory, and load the old session: nothing up to the reported durableEventId is lost, the
interrupted prompt is closed with exactly one terminal, and the session keeps working."""

from __future__ import annotations

import signal
from pathlib import Path

import httpx
import pytest
import trio

from sdk.events import DaemonEvent, decode_events
from tests.harness import running_daemon, start_daemon
from tests.sse_client import Subscriber, chunk_kind, is_terminal_for, text_of


async def run_until_killed(base: Path, env: dict[str, str]) -> dict[str, object]:
    """Turn 1 completes; turn 2 streams 50 chunks and is held open by the gate; then SIGKILL."""
    daemon = start_daemon(base, env=env, data_dir=base / "data", tag="first")
    try:
        async with httpx.AsyncClient(base_url=daemon.url) as client, \
                trio.open_nursery() as nursery:
            created = (await client.post("/session", json={})).json()
            sid = created["sessionId"]
            sub = Subscriber(client, f"/session/{sid}/events", {"Last-Event-ID": "0"})
            await nursery.start(sub.run)
            first = (await client.post(f"/session/{sid}/prompt", json={"prompt": [
                {"type": "text", "text": "turn one mock:chunks=3 mock:delay_ms=0"}]})).json()
            await sub.wait_for(is_terminal_for(first["promptId"]))
            second = (await client.post(f"/session/{sid}/prompt", json={"prompt": [
                {"type": "text", "text": "turn two mock:chunks=50 mock:gate=held"}]})).json()
            echo = await sub.wait_for(lambda e: e.prompt_id == second["promptId"])
            await sub.wait_for(lambda e: text_of(e) == "chunk-49")
            # Make sure turn two's admission is durable (so there is an interrupted prompt to
            # close): wait until the group commit has covered its echo. Then read the status
            # once more right before the kill; that durableEventId is the promise checked.
            with trio.fail_after(10):
                while (await client.get(f"/session/{sid}/status")).json()[
                        "durableEventId"] < (echo.id or 0):
                    await trio.sleep(0.005)
            status = (await client.get(f"/session/{sid}/status")).json()
            nursery.cancel_scope.cancel()
    finally:
        daemon.kill()
    assert daemon.proc.returncode == -signal.SIGKILL
    durable = int(status["durableEventId"])
    seen: dict[int, DaemonEvent] = {e.id: e for e in sub.events if e.id is not None}
    print(f"loss window at kill: lastEventId={status['lastEventId']} durableEventId={durable} "
          f"(events possibly lost: {int(status['lastEventId']) - durable})")
    return {"sid": sid, "epoch": status["eventEpoch"], "durable": durable, "seen": seen,
            "first": first["promptId"], "second": second["promptId"]}


@pytest.mark.parametrize("load_session", [False, True], ids=["session-new", "session-load"])
async def test_sigkill_mid_turn_then_restore(tmp_path: Path, load_session: bool) -> None:
    env = {"MOCK_ACP_LOAD_SESSION": "1"} if load_session else {}
    before = await run_until_killed(tmp_path, env)
    sid, durable = before["sid"], before["durable"]
    seen: dict[int, DaemonEvent] = before["seen"]  # type: ignore[assignment]
    assert durable > 0

    with running_daemon(tmp_path, env=env, data_dir=tmp_path / "data", tag="second") as daemon:
        async with httpx.AsyncClient(base_url=daemon.url) as client:
            # Every route but load/resume answers 404 until the session is restored.
            assert (await client.get(f"/session/{sid}/status")).status_code == 404
            resp = await client.post(f"/session/{sid}/load", json={})
            assert resp.status_code == 200, resp.text
            body = resp.json()
            assert body["eventEpoch"] != before["epoch"]
            assert body["liveJournal"] == [] and body["hasActivePrompt"] is False
            events = decode_events(body["compactedReplay"])
            # Seeded events get fresh ids; nothing the agent replayed was republished.
            assert [e.id for e in events] == list(range(1, len(events) + 1))
            assert body["lastEventId"] == len(events)

            turn_two = [e for e in events if e.prompt_id == before["second"]]
            terminals = [e for e in events if e.type in ("turn_complete", "turn_error")]
            assert [t.data["promptId"] for t in terminals] == [before["first"], before["second"]]
            interrupted = terminals[-1]
            assert interrupted.type == "turn_error"
            assert interrupted.data["code"] == "interrupted"
            assert interrupted.data["message"] == "Prompt interrupted by daemon restart"

            # Every event up to durableEventId survived the SIGKILL.
            durable_chunks = "".join(
                text_of(e) for i, e in sorted(seen.items())
                if i <= durable and e.prompt_id == before["second"]
                and chunk_kind(e) == "agent_message_chunk")
            restored_text = "".join(text_of(e) for e in turn_two
                                    if chunk_kind(e) == "agent_message_chunk")
            assert restored_text.startswith(durable_chunks)
            assert restored_text == "".join(f"chunk-{i}" for i in range(
                len(restored_text.split("chunk-")) - 1))
            echo = [e for e in turn_two if chunk_kind(e) == "user_message_chunk"]
            assert [text_of(e) for e in echo] == ["turn two mock:chunks=50 mock:gate=held"]
            ledger = {t["promptId"]: t["terminal"] for t in body["promptTerminals"]}
            assert ledger == {before["first"]: "completed", before["second"]: "interrupted"}

            if load_session:
                assert "via=session/load" in daemon.stderr()
            else:
                assert "via=session/new" in daemon.stderr()

            # Seeded history is not in the new bus's ring: a reader starting from 0 is told so.
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

            # The restored session takes a new prompt.
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
