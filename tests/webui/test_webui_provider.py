"""The WebUI provider and the live-journal repair, end to end at the model level.

The daemon is an in-process fake behind ``httpx.MockTransport`` (a route table with scripted load
and page answers, an SSE stream fed from a per-session ring); everything above the transport is
the real code: ``DaemonClient``, ``SessionHandle``, ``RepairDriver``, the provider, the store and
the reducer. Scripted answers can be held on an ``anyio.Event`` gate, which is how a test puts a
request "in flight" at a point it chooses. Synchronisation is by waiting on provider or fake
state changes, never by sleeping.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import anyio
import httpx
import msgspec
import pytest

from sdk._client import DaemonClient
from sdk._errors import TurnError
from sdk._repair import NOTICE_CODE, NOTICE_MESSAGE, RepairState
from sdk._repair_driver import RepairOutcomeKind
from sdk._session import SubscriptionState
from sdk.protocol.envelope import DaemonEvent
from tests.builders import wire_bodies
from webui_model import (
    HISTORY_FAILED_CODE,
    Block,
    ConnectionState,
    MessageBlock,
    Notice,
    SessionAbandonedError,
    TextBlock,
    ToolBlock,
    WebUIProvider,
)

BASE = "http://daemon.test"
EPOCH = "epoch-1"
SID, SID2 = "session-1", "session-2"
P0, P1, P2, P3 = "prompt-0", "prompt-1", "prompt-2", "prompt-3"
FULL_ANSWER = "chunk-0 chunk-1 chunk-2 chunk-3 chunk-4 chunk-5"
WARNING = "Commands are temporarily unavailable."
WAIT_S = 10

pytestmark = pytest.mark.anyio

# --- events -----------------------------------------------------------------------------------


def su(
    update: dict[str, Any],
    *,
    id: int | None = None,
    prompt: str | None = None,
    record: str | None = None,
    sid: str = SID,
) -> DaemonEvent:
    if record is not None:
        meta = {**update.get("_meta", {}), "qwen.session.recordId": record}
        meta["qwenTranscript"] = {"sourceRecordIds": [record]}
        update = {**update, "_meta": meta}
    return DaemonEvent(
        type="session_update", id=id, prompt_id=prompt, data={"sessionId": sid, "update": update}
    )


def text(kind: str, body: str, **kw: Any) -> DaemonEvent:
    return su({"sessionUpdate": kind, "content": {"type": "text", "text": body}}, **kw)


def agent(body: str, **kw: Any) -> DaemonEvent:
    return text("agent_message_chunk", body, **kw)


def echo(body: str, prompt: str, **kw: Any) -> DaemonEvent:
    update = {
        "sessionUpdate": "user_message_chunk",
        "content": {"type": "text", "text": body},
        "_meta": {"source": "bridge-echo"},
    }
    return su(update, prompt=prompt, **kw)


def tool(call_id: str, status: str, **kw: Any) -> DaemonEvent:
    update = {"sessionUpdate": "tool_call", "toolCallId": call_id, "title": call_id, "status": status}
    return su(update, **kw)


def commands(id: int) -> DaemonEvent:
    update = {"sessionUpdate": "available_commands_update", "availableCommands": [{"name": f"c{id}"}]}
    return su(update, id=id)


def mode(id: int) -> DaemonEvent:
    return su({"sessionUpdate": "current_mode_update", "currentModeId": "auto"}, id=id)


def terminal(kind: str, prompt: str, id: int) -> DaemonEvent:
    if kind == "turn_error":
        data = {"sessionId": SID, "message": "agent failed", "code": "-32603", "promptId": prompt}
        return DaemonEvent(type="turn_error", id=id, prompt_id=prompt, data=data)
    data = {"sessionId": SID, "stopReason": kind, "promptId": prompt}
    return DaemonEvent(type="turn_complete", id=id, prompt_id=prompt, data=data)


def live_marker(prompt: str | None, truncated: int = 30) -> DaemonEvent:
    return DaemonEvent(
        type="history_truncated",
        prompt_id=prompt,
        data={
            "reason": "replay_window_exceeded",
            "scope": "live_journal",
            "truncatedEvents": truncated,
            "retainedEvents": 3,
            "maxBytes": 300,
            "maxEvents": 3,
            "fullTranscriptAvailable": True,
        },
    )


def wire(event: DaemonEvent) -> dict[str, Any]:
    raw: dict[str, Any] = msgspec.to_builtins(event)
    raw["v"] = 1
    return raw


def load_body(
    compacted: Iterable[DaemonEvent],
    live: Iterable[DaemonEvent],
    last_event_id: int,
    *,
    sid: str = SID,
    **extra: Any,
) -> dict[str, Any]:
    return wire_bodies.resume(
        sid, last_event_id=last_event_id, epoch=EPOCH,
        compactedReplay=[wire(e) for e in compacted], liveJournal=[wire(e) for e in live],
        **extra)


# --- the fake daemon ---------------------------------------------------------------------------


@dataclass
class Answer:
    status: int = 200
    body: Any = None
    gate: anyio.Event | None = None
    drop: bool = False


@dataclass
class Request:
    method: str
    path: str
    body: Any
    params: dict[str, str]
    key: str | None = None  # the Idempotency-Key sent


class FakeStream(httpx.AsyncByteStream):
    """One SSE response: replays ring frames after the cursor, then follows new ones."""

    def __init__(self, daemon: FakeDaemon, sid: str, cursor: int | None) -> None:
        self.daemon = daemon
        self.sid = sid
        ring = daemon.ring(sid)
        self.opened_at = len(ring)
        self.index = 0
        if cursor is not None:
            for position, frame in enumerate(ring):
                if frame.get("id") is not None and frame["id"] <= cursor:
                    self.index = position + 1
        else:
            self.index = len(ring)
        self.closed = False

    def __aiter__(self) -> FakeStream:
        return self

    async def __anext__(self) -> bytes:
        while not self.closed:
            ring = self.daemon.ring(self.sid)
            if self.index < len(ring):
                frame = ring[self.index]
                self.index += 1
                # Synthetic frames go to the streams open when they were sent, never replayed.
                if frame.get("id") is None and self.index <= self.opened_at:
                    continue
                head = f"id: {frame['id']}\n" if frame.get("id") is not None else ""
                return (head + "data: ").encode() + msgspec.json.encode(frame) + b"\n\n"
            await self.daemon.wait_changed()
        raise StopAsyncIteration

    async def aclose(self) -> None:
        self.closed = True


class FakeDaemon:
    """An httpx MockTransport handler speaking just enough of the daemon's HTTP API for the provider."""

    def __init__(self) -> None:
        self.requests: list[Request] = []
        self.load_answers: dict[str, list[Answer]] = {}
        self.page_answers: list[Answer] = []
        self.prompt_ids: list[str] = []
        self._rings: dict[str, list[dict[str, Any]]] = {}
        self._changed = anyio.Event()

    # -- scripting -----------------------------------------------------------------------------

    def ring(self, sid: str) -> list[dict[str, Any]]:
        return self._rings.setdefault(sid, [])

    def queue_load(self, body: dict[str, Any] | None = None, *, sid: str = SID, **kw: Any) -> None:
        self.load_answers.setdefault(sid, []).append(Answer(body=body, **kw))

    def queue_page(self, body: dict[str, Any] | None = None, **kw: Any) -> None:
        self.page_answers.append(Answer(body=body, **kw))

    def publish(self, *events: DaemonEvent, sid: str = SID) -> None:
        self.ring(sid).extend(wire(e) for e in events)
        self._note()

    def requests_to(self, method: str, pattern: str) -> list[Request]:
        return [r for r in self.requests if r.method == method and re.search(pattern, r.path)]

    @property
    def loads(self) -> list[Request]:
        return self.requests_to("POST", r"/load$")

    @property
    def pages(self) -> list[Request]:
        return self.requests_to("GET", r"/transcript$")

    @property
    def streams(self) -> list[Request]:
        return self.requests_to("GET", r"/events$")

    @property
    def prompts(self) -> list[Request]:
        return self.requests_to("POST", r"/prompt$")

    async def wait_for(self, predicate: Callable[[], bool]) -> None:
        with anyio.fail_after(WAIT_S):
            while not predicate():
                await self.wait_changed()

    async def wait_changed(self) -> None:
        await self._changed.wait()

    def _note(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    # -- serving -------------------------------------------------------------------------------

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        body = msgspec.json.decode(request.content) if request.content else None
        self.requests.append(Request(request.method, path, body, dict(request.url.params),
                                     request.headers.get("idempotency-key")))
        self._note()
        parts = path.strip("/").split("/")
        if path == "/capabilities":
            return httpx.Response(
                200, json=wire_bodies.capabilities("session_transcript_pagination"))
        if len(parts) < 3 or parts[0] != "session":
            return httpx.Response(404, json={"error": "no route", "code": "route_not_found"})
        sid, route = parts[1], parts[2]
        if route == "load":
            queue = self.load_answers.get(sid)
            if not queue:
                raise AssertionError(f"unexpected load #{len(self.loads)} of {sid}")
            return await self._answer(request, queue.pop(0))
        if route == "transcript":
            if not self.page_answers:
                raise AssertionError(f"unexpected page request {request.url}")
            return await self._answer(request, self.page_answers.pop(0))
        if route == "events":
            cursor = request.headers.get("last-event-id")
            stream = FakeStream(self, sid, None if cursor is None else int(cursor))
            headers = {"content-type": "text/event-stream", "x-qwen-event-epoch": EPOCH}
            return httpx.Response(200, headers=headers, stream=stream)
        if route == "prompt":
            ring_ids = [f["id"] for f in self.ring(sid) if f.get("id") is not None]
            answer = {
                "promptId": self.prompt_ids.pop(0),
                "lastEventId": ring_ids[-1] if ring_ids else 0,
                "eventEpoch": EPOCH,
            }
            return httpx.Response(202, json=answer)
        if route == "resume":
            return httpx.Response(200, json=wire_bodies.resume(sid, epoch=EPOCH))
        if route == "detach":
            return httpx.Response(204)
        return httpx.Response(404, json={"error": "no route", "code": "route_not_found"})

    async def _answer(self, request: httpx.Request, answer: Answer) -> httpx.Response:
        if answer.gate is not None:
            await answer.gate.wait()
        if answer.drop:
            raise httpx.ConnectError("connection dropped by the fake daemon", request=request)
        return httpx.Response(answer.status, json=answer.body)


@asynccontextmanager
async def mounted(fake: FakeDaemon, **kw: Any) -> AsyncIterator[WebUIProvider]:
    async with (
        DaemonClient(BASE, transport=httpx.MockTransport(fake)) as client,
        WebUIProvider(client, **{"history_page_size": 50, **kw}) as provider,
    ):
        yield provider


async def wait(provider: WebUIProvider, predicate: Callable[[], bool]) -> None:
    with anyio.fail_after(WAIT_S):
        await provider.wait_for(predicate)


# --- the scenario: mounted mid-turn behind a live marker ----------------------------------------


def p1_turn() -> list[DaemonEvent]:
    return [echo("q1", P1, id=1, record="r1"), agent("a1", id=2, prompt=P1, record="r2"), terminal("end_turn", P1, 3)]


def mid_turn_body(**extra: Any) -> dict[str, Any]:
    live = [
        live_marker(P2),
        commands(38),
        agent("chunk-4", id=39, prompt=P2),
        tool("t9", "in_progress", id=40, prompt=P2),
    ]
    return load_body(p1_turn(), live, 40, historyHasMore=True, hasActivePrompt=True, **extra)


def rest_of_turn(kind: str = "end_turn") -> list[DaemonEvent]:
    return [agent(" chunk-5", id=41, prompt=P2), mode(42), terminal(kind, P2, 43)]


def p2_compacted(kind: str = "end_turn") -> list[DaemonEvent]:
    return [
        echo("q2", P2, id=20, record="r20"),
        commands(25),  # evicted from the live journal before the client saw it
        commands(38),  # shown by the snapshot the client replayed
        agent(FULL_ANSWER, id=41, prompt=P2, record="r21"),
        tool("t9", "completed", id=40, prompt=P2, record="r22"),
        mode(42),  # delivered live
        terminal(kind, P2, 43),
    ]


def fresh_body(kind: str = "end_turn", live: Iterable[DaemonEvent] | None = None, last: int = 44) -> dict[str, Any]:
    """The repair load after the terminal: the target turn compacted and complete."""
    tail = [commands(44)] if live is None else list(live)  # 44: newer than anything observed
    return load_body([*p1_turn(), *p2_compacted(kind)], tail, last)


def history_page() -> dict[str, Any]:
    events = [echo("q0", P0, record="r0a"), agent("a0", prompt=P0, record="r0b")]
    return {"v": 1, "sessionId": SID, "events": [wire(e) for e in events], "hasMore": True}


def is_live_marker(block: Block) -> bool:
    return (
        isinstance(block, MessageBlock)
        and block.source == "history_truncated"
        and isinstance(block.data, dict)
        and block.data.get("scope") == "live_journal"
    )


def texts(provider: WebUIProvider) -> list[str]:
    return [b.text for b in provider.store.blocks if isinstance(b, TextBlock)]


def warnings_shown(provider: WebUIProvider) -> int:
    return sum(1 for b in provider.store.blocks if isinstance(b, MessageBlock) and b.text == WARNING)


def signal_ids(provider: WebUIProvider) -> list[int | None]:
    return [s.event_id for s in provider.side_channels.workspace_signals]


@dataclass
class Mounted:
    provider: WebUIProvider
    fake: FakeDaemon
    history: list[Block] = field(default_factory=list)
    prefix: list[Block] = field(default_factory=list)


async def mount_mid_turn(provider: WebUIProvider, fake: FakeDaemon, *, page: bool = True) -> Mounted:
    """Open the session mid-turn (marker shown), load one older page, show the load warning."""
    fake.queue_load(mid_turn_body())
    await provider.open_session(SID)
    episode = provider.episode
    assert episode is not None and episode.prompt_id == P2 and episode.state is RepairState.PENDING
    assert any(is_live_marker(b) for b in provider.store.blocks)
    assert "chunk-4" in texts(provider) and provider.store.pagination.has_more
    mounted_ = Mounted(provider, fake)
    if page:
        fake.queue_page(history_page())
        outcome = await provider.load_more()
        assert outcome is not None and outcome.accepted
        mounted_.history = list(outcome.page_blocks)
    checkpoint = provider.checkpoint
    assert checkpoint is not None
    # The prefix: everything before the marker block, history included.
    mounted_.prefix = list(checkpoint.state.blocks)
    return mounted_


# --- basics ------------------------------------------------------------------------------------


async def test_mount_replays_subscribes_and_performs_live_side_effects() -> None:
    fake = FakeDaemon()
    async with mounted(fake) as provider:
        fake.queue_load(load_body(p1_turn(), [], 3))
        result = await provider.open_session(SID)
        assert result.last_event_id == 3 and provider.connection is ConnectionState.CONNECTED
        assert texts(provider) == ["q1", "a1"]
        assert fake.loads[0].body == {"historyPageSize": 50}
        assert provider.episode is None  # no marker: nothing to repair

        follow_up = su({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "x"}, "_meta": {"followupSuggestion": "more?"}}, id=5, prompt=P2)
        injected = su({"sessionUpdate": "user_message_chunk", "content": {"type": "text", "text": "also"}}, id=6, prompt=P2)
        pending = DaemonEvent(type="pending_prompt_added", id=7, data={"sessionId": SID, "promptId": P3, "text": "queued", "queuedAt": 1})
        stream_error = DaemonEvent(type="stream_error", data={"error": "boom"})
        # Synthetic frames reach only the streams open when they are sent.
        await fake.wait_for(lambda: len(fake.streams) == 1)
        fake.publish(echo("q2", P2, id=4), follow_up, injected, pending, stream_error, stream_error, commands(8))
        await wait(provider, lambda: 8 in signal_ids(provider))

        channels = provider.side_channels
        assert [f.suggestion for f in channels.follow_ups] == ["more?"]
        assert [m.text for m in channels.injected_messages] == ["also"]
        assert [p.prompt_id for p in channels.pending_prompts] == [P3]
        assert channels.workspace_signals_by_kind == {"available_commands_update": 1}
        # Two stream errors: one notice shown (dedup by id), both emissions counted.
        assert [n.id for n in provider.notices] == ["daemon.stream_error"]
        assert provider.notices_emitted == 2
        assert texts(provider) == ["q1", "a1", "q2", "x", "also"]


async def test_an_oversized_initial_replay_is_kept_whole_with_the_effective_cap() -> None:
    fake = FakeDaemon()
    async with mounted(fake, max_blocks=3) as provider:
        fake.queue_load(load_body([tool(f"t{i}", "completed", id=i + 1) for i in range(6)], [], 6))
        await provider.open_session(SID)
        assert len(provider.store.blocks) == 6 and provider.store.max_blocks == 6
        assert provider.store.configured_max_blocks == 3


async def test_notices_are_deduplicated_by_id_and_capped_at_50() -> None:
    fake = FakeDaemon()
    async with mounted(fake) as provider:
        for i in range(60):
            provider.add_notice(Notice(id=f"n{i}", code="test", message=f"notice {i}"))
        assert len(provider.notices) == 50 and provider.notices[0].id == "n10"
        provider.add_notice(Notice(id="n20", code="test", message="again"))
        ids = [n.id for n in provider.notices]
        assert len(ids) == 50 and ids[-1] == "n20" and ids.count("n20") == 1
        assert provider.notices_emitted == 61


async def test_load_warnings_add_one_status_per_text_after_each_load() -> None:
    fake = FakeDaemon()
    closed = DaemonEvent(type="session_closed", id=4, data={"sessionId": SID, "reason": "idle"})
    calls: list[int] = []

    def warnings() -> list[str]:
        calls.append(1)
        return [WARNING, WARNING, "Session closed (idle)."]

    async with mounted(fake, load_warnings=warnings) as provider:
        fake.queue_load(load_body([*p1_turn(), closed], [], 4))
        await provider.open_session(SID)
        assert warnings_shown(provider) == 1
        # The daemon's own status block already shows the second text: not added again.
        assert sum(1 for b in provider.store.blocks if isinstance(b, MessageBlock) and b.text == "Session closed (idle).") == 1
        (status,) = [b for b in provider.store.blocks if isinstance(b, MessageBlock) and b.text == WARNING]
        assert status.kind == "status" and status.source == "provider"

        fake.queue_load(load_body([*p1_turn(), closed], [], 4))
        await provider.reload()
        assert warnings_shown(provider) == 1 and len(calls) == 2


async def test_prompt_returns_on_its_terminal_and_raises_turn_errors() -> None:
    fake = FakeDaemon()
    async with mounted(fake) as provider, anyio.create_task_group() as nursery:
        fake.queue_load(load_body(p1_turn(), [], 3))
        await provider.open_session(SID)
        fake.prompt_ids += [P2, P3]
        results: list[Any] = []

        async def send(body: str) -> None:
            try:
                results.append(await provider.prompt(body))
            except TurnError as exc:
                results.append(exc)

        nursery.start_soon(send, "first")
        await fake.wait_for(lambda: len(fake.prompts) == 1)
        assert provider.guards().local_prompt_in_flight
        fake.publish(echo("first", P2, id=4), agent("ok", id=5, prompt=P2), terminal("end_turn", P2, 6))
        await wait(provider, lambda: len(results) == 1)
        assert results[0].prompt_id == P2 and results[0].stop_reason == "end_turn"
        assert not provider.guards().local_prompt_in_flight

        nursery.start_soon(send, "second")
        await fake.wait_for(lambda: len(fake.prompts) == 2)
        fake.publish(echo("second", P3, id=7), terminal("turn_error", P3, 8))
        await wait(provider, lambda: len(results) == 2)
        assert isinstance(results[1], TurnError) and results[1].prompt_id == P3
        assert fake.prompts[0].body == {"prompt": [{"type": "text", "text": "first"}]}
        # Each prompt went out with a key of its own (resent, it would keep it).
        first_key, second_key = (r.key for r in fake.prompts)
        assert first_key and second_key and first_key != second_key

        fake.prompt_ids.append("p-4")
        nursery.start_soon(partial(provider.prompt, "third", idempotency_key="ui-key-3"))
        await fake.wait_for(lambda: len(fake.prompts) == 3)
        assert fake.prompts[2].key == "ui-key-3"
        fake.publish(terminal("end_turn", "p-4", 9))


# --- the repair ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["end_turn", "cancelled", "turn_error"])
async def test_repair_after_the_matching_terminal(kind: str) -> None:
    fake = FakeDaemon()
    async with mounted(fake, load_warnings=lambda: [WARNING]) as provider:
        m = await mount_mid_turn(provider, fake)
        assert warnings_shown(provider) == 1
        pagination = provider.store.pagination
        assert [b.id for b in m.prefix] == ["user-2", "assistant-3", "user-1", "assistant-1", "status-2"]
        signature = provider.episode.signature if provider.episode else ""

        gate = anyio.Event()
        fake.queue_load(fresh_body(kind), gate=gate)
        fake.publish(*rest_of_turn(kind))
        await fake.wait_for(lambda: len(fake.loads) == 2)  # the attempt's load is in flight
        # The old transcript stays visible until the fresh snapshot validates.
        assert any(is_live_marker(b) for b in provider.store.blocks)
        version = provider.store.version
        gate.set()
        await wait(provider, lambda: provider.repair_attempts == 1)

        (outcome,) = provider.repair_outcomes
        assert outcome.kind is RepairOutcomeKind.REPAIRED and outcome.signature == signature
        assert provider.store.version == version + 1, "the commit must be exactly one store reset"
        # Exactly two loads; only the repair asks for memory replay.
        assert [r.body for r in fake.loads] == [{"historyPageSize": 50}, {}]
        assert fake.prompts == [], "the repair must not send a model prompt"

        blocks = list(provider.store.blocks)
        # Prefix, loaded history and the provider status: same objects, same ids, same order.
        assert all(a is b for a, b in zip(blocks, m.prefix, strict=False))
        assert blocks[: len(m.history)] == m.history
        assert provider.store.pagination == pagination and provider.store.pagination.has_more
        tail = blocks[len(m.prefix):]
        assert [b.text for b in tail if isinstance(b, TextBlock)] == ["q2", FULL_ANSWER]
        assert [b.status for b in tail if isinstance(b, ToolBlock)] == ["completed"]
        assert sum(1 for t in texts(provider) if FULL_ANSWER in t) == 1
        assert not any(t in ("chunk-4", "chunk-4 chunk-5") for t in texts(provider))
        assert not any(is_live_marker(b) for b in blocks)
        assert [b.kind for b in tail].count("error") == (1 if kind == "turn_error" else 0)
        assert warnings_shown(provider) == 1
        # Is-new rule: 38 was in the snapshot (fired at load), 42 live (fired live); the rebuild
        # fires only 25 (evicted unseen) and 44 (newer than anything observed).
        assert signal_ids(provider) == [38, 42, 25, 44]
        assert provider.notices == () and provider.episode is None

        # The candidate owns the subscription now: live events keep flowing from its cursor.
        handle = provider.handle
        assert handle is outcome.handle and handle.state is SubscriptionState.RUNNING
        fake.publish(agent("after", id=45, prompt=P3))
        await wait(provider, lambda: "after" in texts(provider))
        assert len(fake.requests_to("POST", r"/detach$")) == 1  # the old registration


async def test_a_history_page_request_in_flight_delays_the_repair() -> None:
    fake = FakeDaemon()
    async with mounted(fake) as provider, anyio.create_task_group() as nursery:
        await mount_mid_turn(provider, fake, page=False)
        gate = anyio.Event()
        fake.queue_page(history_page(), gate=gate)
        nursery.start_soon(provider.load_more)
        await fake.wait_for(lambda: len(fake.pages) == 1)
        assert provider.guards().page_request_in_flight

        fake.queue_load(fresh_body())
        fake.publish(*rest_of_turn())
        await wait(provider, lambda: provider.episode is not None and provider.episode.state is RepairState.ARMED)
        assert len(fake.loads) == 1, "armed, but the page request holds the attempt back"

        gate.set()  # the page request ends: an idle point
        await wait(provider, lambda: provider.repair_attempts == 1)
        assert provider.repair_outcomes[-1].kind is RepairOutcomeKind.REPAIRED
        assert len(fake.loads) == 2
        # The page that landed mid-episode was mirrored into the checkpoint: still there, once.
        assert texts(provider) == ["q0", "a0", "q1", "a1", "q2", FULL_ANSWER]


async def test_a_local_prompt_in_flight_delays_the_repair() -> None:
    fake = FakeDaemon()
    async with mounted(fake) as provider, anyio.create_task_group() as nursery:
        await mount_mid_turn(provider, fake, page=False)
        fake.prompt_ids.append(P3)
        settled = anyio.Event()

        async def local_prompt() -> None:
            await provider.prompt("next question")
            settled.set()

        nursery.start_soon(local_prompt)
        await fake.wait_for(lambda: len(fake.prompts) == 1)
        fake.publish(*rest_of_turn())
        await wait(provider, lambda: provider.episode is not None and provider.episode.state is RepairState.ARMED)
        assert len(fake.loads) == 1, "armed, but the local prompt holds the attempt back"

        p3_turn = [echo("next question", P3, id=44), agent("p3 answer", id=45, prompt=P3), terminal("end_turn", P3, 46)]
        fake.queue_load(load_body([*p1_turn(), *p2_compacted(), *p3_turn], [], 46))
        fake.publish(*p3_turn)
        with anyio.fail_after(WAIT_S):
            await settled.wait()
        await wait(provider, lambda: provider.repair_attempts == 1)
        assert provider.repair_outcomes[-1].kind is RepairOutcomeKind.REPAIRED
        assert len(fake.loads) == 2 and len(fake.prompts) == 1
        assert texts(provider) == ["q1", "a1", "q2", FULL_ANSWER, "next question", "p3 answer"]


async def test_a_terminal_for_another_prompt_does_not_repair() -> None:
    fake = FakeDaemon()
    async with mounted(fake) as provider:
        await mount_mid_turn(provider, fake, page=False)
        queued_done = terminal("end_turn", P3, 41)
        fake.publish(queued_done)
        await wait(provider, lambda: provider.episode is not None and provider.episode.highest_live_id == 41)
        assert provider.episode is not None and provider.episode.state is RepairState.PENDING
        assert len(fake.loads) == 1 and provider.repair_attempts == 0

        # The target's own terminal still repairs afterwards.
        fake.queue_load(fresh_body(live=[]))
        fake.publish(mode(42), terminal("end_turn", P2, 43))
        await wait(provider, lambda: provider.repair_attempts == 1)
        assert provider.repair_outcomes[-1].kind is RepairOutcomeKind.REPAIRED


async def test_the_trimmed_marker_fallback_stays_bounded_and_reanchors_paging() -> None:
    fake = FakeDaemon()
    configured = 6
    async with mounted(fake, max_blocks=configured, load_warnings=lambda: [WARNING]) as provider:
        live = [live_marker(P2), agent("chunk-4", id=39, prompt=P2)]
        fake.queue_load(load_body(p1_turn(), live, 40, historyHasMore=True))
        await provider.open_session(SID)
        fake.queue_page({"v": 1, "sessionId": SID, "events": [], "hasMore": True, "nextCursor": "opaque"})
        await provider.load_more()
        assert provider.store.pagination.cursor == "opaque"
        checkpoint = provider.checkpoint
        assert checkpoint is not None and checkpoint.pagination.cursor == "opaque"

        # The live turn pushes the marker out of the store.
        fake.publish(*[tool(f"live{i}", "completed", id=41 + i, prompt=P2) for i in range(10)])
        await wait(provider, lambda: provider.store.block(checkpoint.marker_block_id) is None)

        compacted = [
            commands(2),  # before the suffix start: never new in the fallback
            *p1_turn(),
            echo("q2", P2, id=20, record="r20"),
            *[tool(f"live{i}", "completed", id=41 + i, prompt=P2, record=f"rt{i}") for i in range(10)],
            agent(FULL_ANSWER, id=52, prompt=P2, record="r30"),
            terminal("end_turn", P2, 53),
        ]
        fake.queue_load(load_body(compacted, [commands(54)], 54))
        fake.publish(agent(FULL_ANSWER, id=52, prompt=P2), terminal("end_turn", P2, 53))
        await wait(provider, lambda: provider.repair_attempts == 1)

        assert provider.repair_outcomes[-1].kind is RepairOutcomeKind.REPAIRED
        assert len(provider.store.blocks) <= configured and provider.store.max_blocks == configured
        pagination = provider.store.pagination
        assert pagination.anchor_record_id == "r1" and pagination.cursor is None
        assert sum(1 for t in texts(provider) if t == FULL_ANSWER) == 1
        assert not any(is_live_marker(b) for b in provider.store.blocks)
        assert signal_ids(provider) == [54]
        assert warnings_shown(provider) == 1  # lost with the old state, shown again once
        assert len(fake.loads) == 2 and provider.notices == ()


async def test_a_fallback_commit_mirrors_its_status_into_the_next_episode() -> None:
    fake = FakeDaemon()
    configured = 6
    async with mounted(fake, max_blocks=configured, load_warnings=lambda: [WARNING]) as provider:
        fake.queue_load(load_body(p1_turn(), [live_marker(P2), agent("chunk-4", id=39, prompt=P2)], 40))
        await provider.open_session(SID)
        first = provider.checkpoint
        assert first is not None
        live_tools = [tool(f"live{i}", "completed", id=41 + i, prompt=P2) for i in range(10)]
        fake.publish(*live_tools)
        await wait(provider, lambda: provider.store.block(first.marker_block_id) is None)

        compacted = [
            *p1_turn(),
            echo("q2", P2, id=20, record="r20"),
            *[tool(f"live{i}", "completed", id=41 + i, prompt=P2, record=f"rt{i}") for i in range(10)],
            agent(FULL_ANSWER, id=52, prompt=P2, record="r30"),
            terminal("end_turn", P2, 53),
        ]
        p3_tail = [live_marker(P3, truncated=5), agent("p3 tail", id=55, prompt=P3)]
        fake.queue_load(load_body(compacted, p3_tail, 55))
        fake.publish(terminal("end_turn", P2, 53))
        await wait(provider, lambda: provider.repair_attempts == 1)
        (status,) = [b for b in provider.store.blocks if isinstance(b, MessageBlock) and b.text == WARNING]
        checkpoint = provider.checkpoint
        assert checkpoint is not None and checkpoint.prompt_id == P3
        assert checkpoint.state.block(status.id) is status  # mirrored into the next checkpoint

        p3_full = [echo("q3", P3, id=54, record="r54"), agent("p3 full", id=55, prompt=P3, record="r55"), terminal("end_turn", P3, 56)]
        fake.queue_load(load_body([*compacted, *p3_full], [], 56))
        fake.publish(terminal("end_turn", P3, 56))
        await wait(provider, lambda: provider.repair_attempts == 2)
        assert [o.kind for o in provider.repair_outcomes] == [RepairOutcomeKind.REPAIRED] * 2
        shown = [b for b in provider.store.blocks if isinstance(b, MessageBlock) and b.text == WARNING]
        assert shown == [status] and shown[0] is status  # the same block, not a re-added copy
        assert texts(provider)[-2:] == ["q3", "p3 full"] and len(provider.store.blocks) <= configured


FAILURES = ["missing_input", "missing_terminal", "degraded", "network", "auth", "missing_session", "server_error"]


def failing_answer(case: str, gate: anyio.Event | None = None) -> Answer:
    compacted = [*p1_turn(), *p2_compacted()]
    if case == "missing_input":
        return Answer(body=load_body([e for e in compacted if e.id != 20], [], 43), gate=gate)
    if case == "missing_terminal":
        return Answer(body=load_body([e for e in compacted if e.id != 43], [], 43), gate=gate)
    if case == "degraded":
        return Answer(body=load_body(compacted, [], 43, replayDegraded=True), gate=gate)
    if case == "network":
        return Answer(drop=True, gate=gate)
    if case == "auth":
        return Answer(status=401, body={"error": "Unauthorized", "code": "unauthorized"}, gate=gate)
    if case == "missing_session":
        body = {"error": f'No session with id "{SID}"', "code": "session_not_found", "sessionId": SID}
        return Answer(status=404, body=body, gate=gate)
    return Answer(status=500, body={"error": "boom", "code": "internal_error"}, gate=gate)


@pytest.mark.parametrize("case", FAILURES)
async def test_every_failure_keeps_the_transcript_and_emits_one_notice(case: str) -> None:
    fake = FakeDaemon()
    async with mounted(fake) as provider:
        await mount_mid_turn(provider, fake)
        episode = provider.episode
        assert episode is not None
        old_handle = provider.handle
        gate = anyio.Event()
        fake.load_answers.setdefault(SID, []).append(failing_answer(case, gate))
        fake.publish(*rest_of_turn())
        await fake.wait_for(lambda: len(fake.loads) == 2)
        before = tuple(provider.store.blocks)
        assert any(is_live_marker(b) for b in before)
        gate.set()
        await wait(provider, lambda: provider.repair_attempts == 1)

        assert tuple(provider.store.blocks) == before
        assert all(a is b for a, b in zip(provider.store.blocks, before, strict=True))
        (notice,) = provider.notices
        assert provider.notices_emitted == 1
        assert notice.id == f"{NOTICE_CODE}:{episode.signature}" and notice.code == NOTICE_CODE
        assert notice.message == NOTICE_MESSAGE and notice.severity == "warning"
        assert notice.category == "connection" and notice.operation == "load_session"
        assert notice.recoverable and notice.debug_message
        assert provider.episode is None and fake.prompts == []
        assert provider.handle is old_handle
        if case == "auth":
            assert provider.connection is ConnectionState.AUTH_FAILED
            assert old_handle is not None and old_handle.state is SubscriptionState.PAUSED
        elif case == "missing_session":
            assert provider.connection is ConnectionState.DISCONNECTED and provider.missing_session
            assert old_handle is not None and old_handle.state is SubscriptionState.PAUSED
        else:
            assert provider.connection is ConnectionState.CONNECTED
            # The previous handle resumed from its cursor: the next live event arrives.
            fake.publish(agent("still here", id=44, prompt=P3))
            await wait(provider, lambda: "still here" in texts(provider))
        assert len(fake.loads) == 2 and len(provider.notices) == 1


async def test_resume_after_an_auth_failure_reconnects_the_paused_handle() -> None:
    fake = FakeDaemon()
    async with mounted(fake) as provider:
        await mount_mid_turn(provider, fake, page=False)
        handle = provider.handle
        fake.load_answers.setdefault(SID, []).append(failing_answer("auth"))
        fake.publish(*rest_of_turn())
        await wait(provider, lambda: provider.connection is ConnectionState.AUTH_FAILED)
        assert handle is not None and handle.state is SubscriptionState.PAUSED

        await provider.resume()
        assert len(fake.requests_to("POST", r"/resume$")) == 1
        current = provider.handle
        assert provider.connection is ConnectionState.CONNECTED and current is handle
        assert current.state is SubscriptionState.RUNNING and not provider.guards().resume_in_flight
        fake.publish(agent("back", id=44, prompt=P3))
        await wait(provider, lambda: "back" in texts(provider))
        # The failed episode is over for good: resuming does not retry it.
        assert provider.episode is None and len(fake.loads) == 2 and provider.notices_emitted == 1


NAVIGATIONS = ["reload", "switch", "clear", "unmount"]


@pytest.mark.parametrize("action", NAVIGATIONS)
async def test_navigation_aborts_the_repair_in_flight(action: str) -> None:
    fake = FakeDaemon()
    after: list[Block] = []
    async with mounted(fake) as provider, anyio.create_task_group() as nursery:
        await mount_mid_turn(provider, fake)
        repair_gate = anyio.Event()
        fake.queue_load(fresh_body(), gate=repair_gate)
        fake.publish(*rest_of_turn())
        await fake.wait_for(lambda: len(fake.loads) == 2)
        assert provider.episode is not None and provider.episode.state is RepairState.RELOADING

        if action == "reload":
            reload_gate = anyio.Event()
            fake.queue_load(load_body([*p1_turn(), *p2_compacted()], [], 43), gate=reload_gate)
            nursery.start_soon(provider.reload)
            await fake.wait_for(lambda: len(fake.loads) == 3)
            # The repair's answer is ready while the reload is still loading: too late, the
            # reload already aborted the attempt.
            repair_gate.set()
            reload_gate.set()
            await wait(provider, lambda: not provider.loading)
            assert fake.loads[-1].body == {"historyPageSize": 50}
            assert texts(provider) == ["q1", "a1", "q2", FULL_ANSWER]
        elif action == "switch":
            fake.queue_load(load_body([echo("other", P3, id=1, sid=SID2)], [], 1, sid=SID2), sid=SID2)
            await provider.open_session(SID2)
            assert provider.session_id == SID2 and texts(provider) == ["other"]
        elif action == "clear":
            await provider.clear()
            assert provider.session_id is None and list(provider.store.blocks) == []
        if action != "unmount":
            assert provider.episode is None
        after = list(provider.store.blocks)
    # Unmounting (leaving the block) also cancels the attempt; nothing was committed anywhere.
    assert provider.episode is None and provider.notices == ()
    assert not any(o.kind is RepairOutcomeKind.REPAIRED for o in provider.repair_outcomes)
    assert list(provider.store.blocks) == after or action == "unmount"
    if action == "unmount":
        assert any(is_live_marker(b) for b in provider.store.blocks)
    assert len(fake.loads) == (2 if action in ("clear", "unmount") else 3)


async def test_a_configured_reload_aborts_an_armed_episode_and_drops_a_stale_page() -> None:
    fake = FakeDaemon()
    async with mounted(fake) as provider, anyio.create_task_group() as nursery:
        await mount_mid_turn(provider, fake, page=False)
        gate = anyio.Event()
        fake.queue_page(history_page(), gate=gate)
        nursery.start_soon(provider.load_more)
        await fake.wait_for(lambda: len(fake.pages) == 1)
        fake.publish(*rest_of_turn())
        await wait(provider, lambda: provider.episode is not None and provider.episode.state is RepairState.ARMED)

        fake.queue_load(load_body([*p1_turn(), *p2_compacted()], [], 43))
        await provider.reload()
        assert provider.episode is None
        gate.set()
        await wait(provider, lambda: not provider.guards().page_request_in_flight)
        # No repair load ever happened, and the page fetched for the old transcript was dropped.
        assert [r.body for r in fake.loads] == [{"historyPageSize": 50}, {"historyPageSize": 50}]
        assert provider.repair_attempts == 0 and provider.notices == ()
        assert texts(provider) == ["q1", "a1", "q2", FULL_ANSWER]


async def test_state_resync_required_shows_an_error_then_reloads_and_aborts_the_episode() -> None:
    fake = FakeDaemon()
    seen_error: list[bool] = []
    async with mounted(fake) as provider:
        await mount_mid_turn(provider, fake, page=False)
        assert provider.episode is not None

        def watch() -> None:
            if any(b.kind == "error" and getattr(b, "source", None) == "state_resync_required" for b in provider.store.blocks):
                seen_error.append(True)

        provider.store.subscribe(watch)
        fake.queue_load(mid_turn_body())
        resync = DaemonEvent(type="state_resync_required", data={"reason": "ring_evicted", "lastDeliveredId": 40, "earliestAvailableId": 45})
        await fake.wait_for(lambda: len(fake.streams) == 1)
        fake.publish(resync)
        await wait(provider, lambda: len(fake.loads) == 2 and not provider.loading)

        assert seen_error, "the error block is shown before the reload replaces the transcript"
        assert fake.loads[1].body == {"historyPageSize": 50}
        assert [c.type for c in provider.side_channels.connection_metadata] == ["state_resync_required"]
        # The old episode is gone; the reloaded snapshot (still mid-turn) starts a new one,
        # which the registry refuses to arm twice only if it was attempted: it was not.
        episode = provider.episode
        assert episode is not None and episode.state is RepairState.PENDING and not episode.attempted
        assert provider.repair_attempts == 0 and provider.notices == ()


async def test_a_fresh_tail_with_another_live_marker_starts_the_next_episode() -> None:
    fake = FakeDaemon()
    async with mounted(fake, load_warnings=lambda: [WARNING]) as provider:
        await mount_mid_turn(provider, fake)
        p3_tail = [live_marker(P3, truncated=5), agent("p3 tail", id=45, prompt=P3)]
        fake.queue_load(fresh_body(live=p3_tail, last=45))
        fake.publish(*rest_of_turn())
        await wait(provider, lambda: provider.repair_attempts == 1)

        episode = provider.episode
        assert episode is not None and episode.prompt_id == P3 and episode.state is RepairState.PENDING
        checkpoint = provider.checkpoint
        assert checkpoint is not None and checkpoint.prompt_id == P3
        marker = provider.store.block(checkpoint.marker_block_id)
        assert marker is not None and is_live_marker(marker)
        assert texts(provider)[-1] == "p3 tail"

        p3_full = [echo("q3", P3, id=30, record="r30"), agent("p3 full answer", id=46, prompt=P3, record="r31"), terminal("end_turn", P3, 47)]
        fake.queue_load(load_body([*p1_turn(), *p2_compacted(), *p3_full], [], 47))
        fake.publish(agent(" more", id=46, prompt=P3), terminal("end_turn", P3, 47))
        await wait(provider, lambda: provider.repair_attempts == 2)

        assert [o.kind for o in provider.repair_outcomes] == [RepairOutcomeKind.REPAIRED] * 2
        assert texts(provider) == ["q0", "a0", "q1", "a1", "q2", FULL_ANSWER, "q3", "p3 full answer"]
        assert not any(is_live_marker(b) for b in provider.store.blocks)
        assert warnings_shown(provider) == 1 and len(fake.loads) == 3 and provider.notices == ()


# --- history pages --------------------------------------------------------------------------------


async def test_load_more_transient_errors_notify_and_other_errors_latch_until_forced() -> None:
    fake = FakeDaemon()
    async with mounted(fake) as provider:
        await mount_mid_turn(provider, fake, page=False)

        def mirrored() -> bool:
            checkpoint = provider.checkpoint
            return checkpoint is not None and checkpoint.pagination == provider.store.pagination

        fake.queue_page({"error": "busy", "code": "unavailable"}, status=503)
        assert await provider.load_more() is None
        assert [n.id for n in provider.notices] == [HISTORY_FAILED_CODE]
        assert provider.store.pagination.has_more and provider.store.pagination.pagination_error is None

        fake.queue_page({"error": "bad cursor", "code": "invalid_transcript_cursor"}, status=400)
        assert await provider.load_more() is None
        assert provider.store.pagination.pagination_error is not None and mirrored()
        assert await provider.load_more() is None and len(fake.pages) == 2  # latched: no request

        fake.queue_page(history_page())
        outcome = await provider.load_more(force=True)
        assert outcome is not None and outcome.accepted and len(fake.pages) == 3
        assert fake.pages[-1].params == {"limit": "100", "beforeRecordId": "r1"}
        assert provider.store.pagination.pagination_error is None and mirrored()
        assert texts(provider)[:2] == ["q0", "a0"] and provider.notices_emitted == 1


async def test_operations_in_flight_are_abandoned_by_navigation() -> None:
    fake = FakeDaemon()
    async with mounted(fake) as provider, anyio.create_task_group() as nursery:
        await mount_mid_turn(provider, fake, page=False)
        fake.queue_page(history_page(), gate=anyio.Event())
        errors: list[BaseException] = []

        async def page() -> None:
            try:
                await provider.load_more()
            except SessionAbandonedError as exc:
                errors.append(exc)

        nursery.start_soon(page)
        await fake.wait_for(lambda: len(fake.pages) == 1)
        await provider.clear()
        await wait(provider, lambda: len(errors) == 1)
        assert list(provider.store.blocks) == [] and provider.connection is ConnectionState.IDLE
