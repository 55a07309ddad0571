"""A small live SSE write lets the publisher run a few more scheduler passes first (so one send
carries more events), bounded by bytes, frames and passes: never a wait for events that do not
come.

``serve_sse`` runs in-process here on a bare bus, with ASGI callables that record what is
sent; the publisher is this test's task, yielding between groups as the agent reader does."""

from __future__ import annotations

from collections.abc import AsyncIterator, MutableMapping
from contextlib import asynccontextmanager
from typing import Any

import trio
import trio.testing

from daemon.bus import SessionBus
from daemon.core.flow_control import GATHER_BYTES, GATHER_PASSES
from daemon.core.subscriber import SubscriberState
from daemon.streams import EventPump, Subscription, serve_sse
from tests.builders.sse_gather import ID_LINE, new_bus, publish


class Recorder:
    """The ASGI side of one SSE stream: every body written, as the ids it carries."""

    def __init__(self) -> None:
        self.writes: list[list[int]] = []

    async def send(self, message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.body":
            ids = [int(found) for found in ID_LINE.findall(message.get("body", b""))]
            if ids:
                self.writes.append(ids)

    async def receive(self) -> MutableMapping[str, Any]:
        await trio.sleep_forever()
        raise AssertionError("unreachable")


@asynccontextmanager
async def streaming(bus: SessionBus) -> AsyncIterator[Recorder]:
    """One SSE subscriber of ``bus``, parked waiting for its first live event."""
    recorder = Recorder()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve_sse, {"query_string": b""}, recorder.receive, recorder.send,
                           bus, {}, 3600.0)
        await trio.testing.wait_all_tasks_blocked()
        assert len(bus.subscribers) == 1
        yield recorder
        nursery.cancel_scope.cancel()


def test_worth_gathering_only_for_a_small_pending_write_of_an_open_bus() -> None:
    bus = new_bus()
    sub = Subscription(SubscriberState(0, max_queued=16))
    bus.add_subscriber(sub)
    pump = EventPump(bus, sub, 3600.0)
    assert not pump.worth_gathering()  # nothing pending: the stream waits for events instead
    publish(bus, 1)
    assert pump.worth_gathering()
    # Past the byte bound the write goes out at once.
    publish(bus, 1, text_bytes=GATHER_BYTES)
    assert bus.ring.bytes_since(sub.state.cursor) >= GATHER_BYTES
    assert not pump.worth_gathering()
    sub.state.cursor = bus.ring.last_id
    publish(bus, 4)
    assert pump.worth_gathering()
    # Past a quarter of maxQueued frames neither: one more group would take the subscriber
    # to half its cap, where flow control starts.
    publish(bus, 1)
    assert not pump.worth_gathering()
    sub.state.cursor = bus.ring.last_id
    publish(bus, 1)
    assert pump.worth_gathering()
    bus.close()  # no more events can come: nothing to gather
    assert not pump.worth_gathering()


async def test_a_wake_up_carries_what_the_publisher_added_meanwhile() -> None:
    # The stream is woken by the first group; whichever of it and the publisher the scheduler
    # runs first, the write carries the group published in the next pass too. (Without the
    # passes, the stream that runs first writes the first group alone: the scheduler's order is
    # random, so the rounds catch that.) Counted passes, not "until all tasks are blocked":
    # a stream that kept gathering would never block.
    for _ in range(20):
        bus = new_bus()
        async with streaming(bus) as recorder:
            publish(bus, 3)
            await trio.lowlevel.checkpoint()  # the stream wakes (before or after this task)
            publish(bus, 2)
            for _ in range(GATHER_PASSES + 1):  # it gathers, then writes
                await trio.lowlevel.checkpoint()
            assert recorder.writes == [[1, 2, 3, 4, 5]]


async def test_a_small_write_waits_gather_passes_at_most_when_nothing_more_comes() -> None:
    # The publisher goes quiet after one event: the stream gathers GATHER_PASSES passes, then
    # writes (never a wait for more events).
    bus = new_bus()
    async with streaming(bus) as recorder:
        publish(bus, 1)
        for _ in range(GATHER_PASSES):  # the stream wakes in the first, then gathers
            await trio.lowlevel.checkpoint()
        assert recorder.writes == []
        await trio.lowlevel.checkpoint()  # the stream writes
        await trio.lowlevel.checkpoint()
        assert recorder.writes == [[1]]
        publish(bus, 4)
        for _ in range(GATHER_PASSES + 2):
            await trio.lowlevel.checkpoint()
        assert recorder.writes == [[1], [2, 3, 4, 5]]
