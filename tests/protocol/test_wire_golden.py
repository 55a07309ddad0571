"""Golden bytes of every frame type the daemon emits.

The frames are produced by the daemon's own code paths — a real :class:`Session` and
:class:`SessionBus` driven through queued, cancelled, failed, closed, timed-out and
agent-died prompts and a permission round trip, the resume planner, the slow-client rules,
both ``history_truncated`` markers and the cold-restore terminal — with a fixed clock and
counter-based ids, and compared byte for byte (key order included) with
``tests/fixtures/wire_golden.txt``. That file was written by the daemon before its payloads
became typed Structs; a change of field order, an omitted default that appears, or a
``null`` that disappears fails here. Where the reference daemon's captures hold a frame of the
same shape, the payload's key order is compared with the capture too.

``python -m tests.test_wire_golden`` rewrites the golden file (only for a deliberate change of
the wire).
"""

from __future__ import annotations

import json
import uuid as _uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
import trio.testing

import daemon.bus
import daemon.session
from daemon.agent import AgentRpcError, ChannelClosed
from daemon.bus import BusLimits, SessionBus
from daemon.core.envelope import Event
from daemon.core.frame_codec import sse_chunks, sse_frames
from daemon.core.live_journal import LiveJournal
from daemon.core.replay_window import Record, ReplayWindow
from daemon.core.restore import close_interrupted
from daemon.core.ring import EventRing, decide_resume
from daemon.core.subscriber import (
    Eviction,
    SubscriberState,
    Warning,
    client_evicted_event,
    slow_client_warning_event,
)
from daemon.session import Session, VoteResult
from daemon.streams import SSE_HEARTBEAT, SSE_RETRY
from sdk.protocol.envelope import decode_event, encode_envelope
from sdk.protocol.http import PermissionOutcome

GOLDEN = Path(__file__).parents[1] / "fixtures" / "wire_golden.txt"
SAMPLES = Path(__file__).parents[1] / "fixtures" / "wire_samples.json"
NOW = 1796204622451
CLIENT = "client_0000aaaa-1111-4222-8333-444455556666"

Script = Callable[["ScriptedAgent"], Awaitable[dict[str, Any]]]


class _Ids:
    """``uuid.uuid4`` stand-in: 00000000-0000-4000-8000-<counter>."""

    def __init__(self) -> None:
        self.n = 0

    def uuid4(self) -> _uuid.UUID:
        self.n += 1
        return _uuid.UUID(f"00000000-0000-4000-8000-{self.n:012d}")


class ScriptedAgent:
    """The agent side of one ACP session: each prompt runs the next script."""

    supports_load_session = False

    def __init__(self, scripts: list[Script]) -> None:
        self.scripts = scripts
        self.sink: Any = None
        self.closed = False
        self.exit_code: int | None = None
        self.signal_name: str | None = None
        self.cancelled = trio.Event()
        self.started = 0

    def attach(self, acp_session_id: str, sink: Any) -> None:
        self.sink = sink

    def detach(self, acp_session_id: str, sink: Any = None) -> None:
        self.sink = None

    def group_lines_changed(self) -> None:
        """The session says its subscribers changed; one sink, nothing to recompute."""

    async def prompt(self, acp_session_id: str, blocks: list[Any]) -> dict[str, Any]:
        self.started += 1
        return await self.scripts.pop(0)(self)

    async def cancel(self, acp_session_id: str) -> None:
        self.cancelled.set()

    def update(self, update: dict[str, Any]) -> None:
        self.sink.on_update(msgspec.json.encode(update))


async def _permission_then_stream(agent: ScriptedAgent) -> dict[str, Any]:
    await agent.sink.permission_asked({
        "sessionId": "acp-1",
        "toolCall": {"toolCallId": "call-1", "title": "Write file", "kind": "edit"},
        "options": [{"optionId": "allow", "name": "Allow", "kind": "allow_once"},
                    {"optionId": "reject", "name": "Reject", "kind": "reject_once"}],
    })
    agent.update({"sessionUpdate": "tool_call", "toolCallId": "call-1", "title": "Write file",
                  "status": "pending", "kind": "edit"})
    agent.update({"sessionUpdate": "agent_message_chunk",
                  "content": {"type": "text", "text": "Hello"}})
    agent.update({"sessionUpdate": "agent_message_chunk",
                  "content": {"type": "text", "text": " there"}})
    agent.update({"sessionUpdate": "agent_message_chunk",
                  "content": {"type": "text", "text": ""}, "_meta": {"usage": {"n": 1}}})
    agent.update({"sessionUpdate": "tool_call_update", "toolCallId": "call-1",
                  "status": "completed"})
    agent.sink.flush()
    return {"stopReason": "end_turn"}


async def _fail(agent: ScriptedAgent) -> dict[str, Any]:
    raise AgentRpcError(-32603, "Internal error")


async def _until_cancelled(agent: ScriptedAgent) -> dict[str, Any]:
    await agent.cancelled.wait()
    agent.cancelled = trio.Event()
    return {"stopReason": "cancelled"}


async def _no_answer(agent: ScriptedAgent) -> dict[str, Any]:
    await trio.sleep_forever()
    raise AssertionError("unreachable")


async def _stopped_agent(agent: ScriptedAgent) -> dict[str, Any]:
    return {}


async def _dies(agent: ScriptedAgent) -> dict[str, Any]:
    agent.closed = True
    agent.exit_code = 1
    agent.sink.agent_died(1, None)
    raise ChannelClosed()


def _limits() -> BusLimits:
    return BusLimits(max_journal_events=10_000, max_journal_bytes=8 << 20,
                     compacted_replay_max_bytes=4 << 20, event_ring_size=8000)


def _published(bus: SessionBus) -> list[bytes]:
    return [event.raw for event in bus.ring.since(0)]


def _compacted(bus: SessionBus) -> list[bytes]:
    return [item for item in bus.load_snapshot("full").compacted if isinstance(item, bytes)]


def _patch(monkeypatch: pytest.MonkeyPatch) -> _Ids:
    fake = _Ids()
    monkeypatch.setattr(daemon.session, "uuid", fake)
    monkeypatch.setattr(daemon.bus, "uuid", fake)
    monkeypatch.setattr(daemon.session, "now_ms", lambda: NOW)
    return fake


@pytest.fixture
def ids(monkeypatch: pytest.MonkeyPatch) -> _Ids:
    return _patch(monkeypatch)


async def _session_frames() -> dict[str, list[bytes]]:
    """One session through a permission round trip, queued prompts, an agent error, a
    cancel, a close with a prompt running and one queued."""
    agent = ScriptedAgent([_permission_then_stream, _fail, _until_cancelled, _stopped_agent,
                           _no_answer])
    bus = SessionBus("sess-1", _limits(), None, clock_ms=lambda: NOW)
    session = Session("sess-1", "/ws", "now", agent, "acp-1", bus)  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        await nursery.start(session.run)
        session.admit([{"type": "text", "text": "hello"},
                       {"type": "image", "mimeType": "image/png", "data": "AAAA"}],
                      CLIENT, None)
        await trio.testing.wait_all_tasks_blocked()
        session.admit([{"type": "text", "text": "second"}], CLIENT, None)  # queued: fails
        session.admit([{"type": "text", "text": "third"}], None, None)  # queued: cancelled
        (request_id,) = session.permissions
        voted = session.vote(request_id, PermissionOutcome(outcome="selected", option_id="allow"))
        assert voted is VoteResult.ACCEPTED
        await trio.testing.wait_all_tasks_blocked()
        assert agent.started == 3
        await session.cancel(CLIENT)
        await trio.testing.wait_all_tasks_blocked()
        session.admit([{"type": "text", "text": "fourth"}], CLIENT, None)  # no stop reason
        await trio.testing.wait_all_tasks_blocked()
        session.admit([{"type": "text", "text": "fifth"}], CLIENT, None)  # running at close
        await trio.testing.wait_all_tasks_blocked()
        session.admit([{"type": "text", "text": "sixth"}], CLIENT, None)  # queued at close
        await trio.testing.wait_all_tasks_blocked()
        assert agent.started == 5
        await session.close("client_closed")
    return {"session": _published(bus), "session.compacted": _compacted(bus)}


async def _died_frames() -> dict[str, list[bytes]]:
    """The agent dies mid-prompt with a prompt queued."""
    agent = ScriptedAgent([_dies])
    bus = SessionBus("sess-2", _limits(), None, clock_ms=lambda: NOW)
    session = Session("sess-2", "/ws", "now", agent, "acp-2", bus)  # type: ignore[arg-type]
    gate = trio.Event()

    async def held(agent: ScriptedAgent) -> dict[str, Any]:
        await gate.wait()
        return await _dies(agent)

    agent.scripts = [held]
    async with trio.open_nursery() as nursery:
        await nursery.start(session.run)
        session.admit([{"type": "text", "text": "hi"}], None, None)
        await trio.testing.wait_all_tasks_blocked()
        session.admit([{"type": "text", "text": "queued"}], None, None)
        gate.set()
        await session.ended.wait()
    return {"died": _published(bus)}


async def _deadline_frames() -> dict[str, list[bytes]]:
    agent = ScriptedAgent([_no_answer])
    bus = SessionBus("sess-3", _limits(), None, clock_ms=lambda: NOW)
    session = Session("sess-3", "/ws", "now", agent, "acp-3", bus)  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        await nursery.start(session.run)
        session.admit([{"type": "text", "text": "slow"}], None, 5)
        while not bus.ring.since(0) or bus.ring.since(0)[-1].type != "turn_error":
            await bus.wait_for_events(bus.ring.last_id)
        await session.close("shutdown")
    return {"deadline": _published(bus)}


def _event(event_id: int, size: int = 10) -> Event:
    return Event.from_env({"id": event_id, "v": 1, "type": "session_update",
                           "data": {"sessionId": "s", "update": {"x": "y" * size}}})


def _resume_frames() -> dict[str, list[bytes]]:
    ring = EventRing(4)
    for i in range(1, 8):
        ring.append(_event(i))
    out: list[bytes] = []
    plans = [
        decide_resume(ring, 6, "old-epoch", "epoch", now_ms=NOW),  # epoch_reset + detail
        decide_resume(ring, 50, None, "epoch", now_ms=NOW),  # epoch_reset, no detail
        decide_resume(ring, 1, None, "epoch", now_ms=NOW),  # ring_evicted
        decide_resume(ring, 7, None, "epoch", now_ms=NOW),  # nothing to replay
        decide_resume(ring, 4, None, "epoch", now_ms=NOW, budget_bytes=1),  # budget
        decide_resume(EventRing(4, next_id=5), 2, None, "epoch", now_ms=NOW),  # seeded
    ]
    for plan in plans:
        out.extend(frame.raw for frame in [*plan.before, *plan.after])
    return {"resume": out}


class _Ring:
    def __init__(self, last_id: int, first_id: int | None, queued: int) -> None:
        self.last_id = last_id
        self.first_id = first_id
        self.queued = queued

    def bytes_since(self, after_id: int) -> int:
        return self.queued


def _slow_client_frames() -> dict[str, list[bytes]]:
    state = SubscriberState(0, max_queued=16, max_queued_bytes=1000)
    warning = state.check(_Ring(12, 1, 100))
    assert isinstance(warning, Warning)
    eviction = state.check(_Ring(17, 1, 200))
    assert isinstance(eviction, Eviction)
    bytes_state = SubscriberState(3, max_queued=16, max_queued_bytes=1000)
    eviction2 = bytes_state.check(_Ring(5, 1, 5000))
    assert isinstance(eviction2, Eviction)
    return {"slow_client": [
        slow_client_warning_event(warning, NOW).raw,
        client_evicted_event(eviction, NOW).raw,
        client_evicted_event(eviction2, NOW).raw,
    ]}


def _marker_frames() -> dict[str, list[bytes]]:
    journal = LiveJournal(max_events=2, max_bytes=1 << 20)
    for i in range(1, 6):
        journal.append(Event.from_env({"id": i, "v": 1, "type": "session_update",
                                       "promptId": "p-1",
                                       "data": {"sessionId": "s", "update": {
                                           "sessionUpdate": "tool_call",
                                           "toolCallId": f"t{i}"}}}))
    out = journal.snapshot(active_prompt_id="p-1", full_transcript_available=True)[:1]
    out += journal.snapshot(active_prompt_id=None, full_transcript_available=False,
                            record_id="rec-9")[:1]
    window = ReplayWindow(max_bytes=300)
    for turn in range(4):
        window.add_segment([Record(_event(10 * turn + 1, 100), f"rec-{turn}a"),
                            Record(_event(10 * turn + 2, 20), f"rec-{turn}b")])
    out += window.snapshot(full_transcript_available=True)[:1]  # type: ignore[list-item]
    single = ReplayWindow(max_bytes=150)
    single.add_segment([Record(_event(1, 100), None), Record(_event(2, 100), None)])
    single.add_segment([Record(_event(3, 10), None)])
    out += single.snapshot(full_transcript_available=False)[:1]  # type: ignore[list-item]
    return {"markers": out}


def _restore_frames() -> dict[str, list[bytes]]:
    counter = iter(range(1, 100))
    raw = [Event.from_env({"id": 1, "v": 1, "type": "session_update", "promptId": "p-run",
                           "data": {"sessionId": "s", "update": {
                               "sessionUpdate": "agent_message_chunk",
                               "content": {"type": "text", "text": "partial"}}},
                           "_meta": {"serverTimestamp": NOW}}).raw]
    ops = close_interrupted("s", raw, ["p-run", "p-queued"], now_ms=NOW,
                            new_record_id=lambda: f"rec-{next(counter)}")
    return {"restore": [record for op in ops for _, record in op.records]}


def _sse_frames(published: list[bytes]) -> dict[str, list[bytes]]:
    """SSE framing of ring events (one, and a wake-up's shared segment) and of an id-less
    frame, and the stream's opening and idle frames."""
    events = [Event.from_env(json.loads(raw)) for raw in published[:3]]
    resync = decide_resume(EventRing(4), 9, None, "epoch", now_ms=NOW).before[0]
    return {"sse": [events[0].sse_frame, sse_frames(events), b"".join(sse_chunks(events)),
                    resync.sse_frame, SSE_RETRY, SSE_HEARTBEAT]}


async def produce(ids: _Ids) -> dict[str, list[bytes]]:
    frames: dict[str, list[bytes]] = {}
    frames.update(await _session_frames())
    frames.update(await _died_frames())
    frames.update(await _deadline_frames())
    frames.update(_resume_frames())
    frames.update(_slow_client_frames())
    frames.update(_marker_frames())
    frames.update(_restore_frames())
    frames.update(_sse_frames(frames["session"]))
    return frames


def _dump(frames: dict[str, list[bytes]]) -> str:
    # One frame a line; SSE bytes (several lines each) as a JSON string.
    return "".join(
        f"{name}\t{json.dumps(raw.decode()) if name == 'sse' else raw.decode()}\n"
        for name, items in frames.items() for raw in items)


def _load() -> dict[str, list[bytes]]:
    out: dict[str, list[bytes]] = {}
    for line in GOLDEN.read_text().splitlines():
        name, text = line.split("\t", 1)
        raw = json.loads(text) if name == "sse" else text
        out.setdefault(name, []).append(raw.encode())
    return out


EXPECTED_TYPES = {
    "session_update", "pending_prompt_added", "pending_prompt_started",
    "pending_prompt_completed", "permission_request", "permission_resolved",
    "prompt_cancelled", "turn_complete", "turn_error", "session_closed", "session_died",
    "state_resync_required", "replay_complete", "slow_client_warning", "client_evicted",
    "history_truncated",
}


async def test_every_frame_is_byte_identical_to_the_golden_capture(ids: _Ids) -> None:
    got = await produce(ids)
    want = _load()
    assert list(got) == list(want)
    for name in want:
        assert len(got[name]) == len(want[name]), name
        for i, (g, w) in enumerate(zip(got[name], want[name], strict=True)):
            assert g == w, f"{name}[{i}]:\n got {g.decode()}\nwant {w.decode()}"
    types = {json.loads(raw)["type"] for name, items in got.items() if name != "sse"
             for raw in items}
    assert EXPECTED_TYPES <= types


async def test_the_sdk_decodes_each_frame_into_the_struct_the_daemon_encoded(ids: _Ids) -> None:
    """One definition per wire shape, both ways: every frame decodes (sdk.protocol) into its
    typed payload, and that Struct encodes to the payload bytes that were sent (so the Struct
    names every field the daemon sends, in its order); for frames the daemon laid out, the
    envelope re-encoded from the decoded event is the frame itself."""
    got = await produce(ids)
    typed = 0
    for name, items in got.items():
        if name == "sse":
            continue
        for raw in items:
            event = decode_event(raw)
            assert event is not None, raw
            payload = event.payload
            assert payload is not None, raw
            assert msgspec.json.encode(payload) == msgspec.json.encode(event.data), raw
            typed += 1
            if name in ("session", "died", "deadline", "resume", "slow_client"):
                assert encode_envelope(
                    event.type, payload, event_id=event.id, prompt_id=event.prompt_id,
                    originator_client_id=event.originator_client_id, meta=event.meta) == raw
    assert typed == sum(len(items) for name, items in got.items() if name != "sse")


def _sample_payloads() -> dict[str, list[Any]]:
    samples = json.loads(SAMPLES.read_text())
    out: dict[str, list[Any]] = {}
    for marker in samples["markers"]:
        out.setdefault("history_truncated", []).append(marker["frame"]["data"])
    for frame in samples["sse_frames"]:
        out.setdefault(frame["type"], []).append(frame["data"])
    return out


async def test_payload_key_order_matches_the_reference_captures(ids: _Ids) -> None:
    """Each frame type the reference captures hold: our payload's keys are in the
    reference's order (the reference may add keys we do not send, never reorder ours)."""
    got = await produce(ids)
    ours: dict[str, list[list[str]]] = {}
    for name, items in got.items():
        if name == "sse":
            continue
        for raw in items:
            frame = json.loads(raw)
            if isinstance(frame["data"], dict):
                ours.setdefault(frame["type"], []).append(list(frame["data"]))
    compared = 0
    for event_type, payloads in _sample_payloads().items():
        if event_type == "session_update" or event_type not in ours:
            continue
        for sample in payloads:
            sample_keys = list(sample)
            for keys in ours[event_type]:
                common = [k for k in sample_keys if k in keys]
                if len(common) >= 2:
                    assert [k for k in keys if k in common] == common, (event_type, keys)
                    compared += 1
    assert compared >= 10


if __name__ == "__main__":
    with pytest.MonkeyPatch.context() as patch:
        GOLDEN.write_text(_dump(trio.run(produce, _patch(patch))))
