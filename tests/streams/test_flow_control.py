"""Flow control: the publisher waits for a subscriber that fell half-way to its caps to finish
its write, never for one that is keeping up, and a stalled write holds it back only once."""

from __future__ import annotations

import trio
import trio.testing

from daemon.bus import BusLimits, SessionBus
from daemon.core.flow_control import (
    DISPATCH_GROUP_MAX,
    FLOW_BUDGET_MAX,
    FLOW_BUDGET_RATE,
    FLOW_STALL_S,
)
from daemon.core.subscriber import SubscriberState
from daemon.streams import Subscription
from sdk.protocol.events import SessionUpdateData


def chunk(bus: SessionBus, n: int) -> None:
    for i in range(n):
        bus.publish(SessionUpdateData(session_id="s", update={
            "sessionUpdate": "agent_message_chunk",
            "content": {"type": "text", "text": f"c{i}"}}), flush=False)
    bus.flush()


def new_bus() -> tuple[SessionBus, Subscription]:
    bus = SessionBus("s", BusLimits(10_000, 8 << 20, 4 << 20, 8000), None)
    sub = Subscription(SubscriberState(0, max_queued=100))
    bus.add_subscriber(sub)
    return bus, sub


async def test_publisher_waits_for_a_subscriber_half_way_to_its_cap(
        autojump_clock: trio.testing.MockClock) -> None:
    bus, sub = new_bus()
    sub.begin_write()
    chunk(bus, 49)  # under half of maxQueued=100: not behind
    with trio.fail_after(0):  # returns without yielding to the clock
        await bus.wait_for_subscribers()
    chunk(bus, 1)  # 50 queued: behind while its write is in flight
    finished_at: list[float] = []

    async def finish_write() -> None:
        await trio.sleep(0.05)
        sub.writes_done += 1
        sub.end_write()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(finish_write)
        start = trio.current_time()
        await bus.wait_for_subscribers()
        finished_at.append(trio.current_time() - start)
    # It waited exactly until the write completed (not the stall bound, not zero).
    assert finished_at == [0.05]
    assert sub.flow_stalled_at is None
    assert sub.state.evicted is None


async def test_a_stalled_write_holds_the_publisher_back_once(
        autojump_clock: trio.testing.MockClock) -> None:
    bus, sub = new_bus()
    sub.begin_write()
    chunk(bus, 60)
    start = trio.current_time()
    await bus.wait_for_subscribers()
    assert trio.current_time() - start == FLOW_STALL_S
    assert sub.flow_stalled_at == sub.writes_done
    # Still the same write: not waited for again, however far behind it gets.
    chunk(bus, 20)
    start = trio.current_time()
    await bus.wait_for_subscribers()
    assert trio.current_time() - start == 0
    # It passed its cap meanwhile: evicted by the slow-client rules, as without flow control.
    chunk(bus, 30)
    assert sub.state.evicted is not None
    assert sub not in bus.subscribers


async def test_an_idle_subscriber_is_never_waited_for(
        autojump_clock: trio.testing.MockClock) -> None:
    bus, _ = new_bus()
    chunk(bus, 90)  # not writing: it takes all of them when it next runs
    start = trio.current_time()
    await bus.wait_for_subscribers()
    assert trio.current_time() - start == 0


async def test_slow_but_steady_readers_cannot_pace_the_agent(
        autojump_clock: trio.testing.MockClock) -> None:
    """A reader that keeps reading, but takes 0.4 s per write (never 'stalled'), would hold the
    publisher back on every group: the waiting is rationed, so over T seconds the session waits
    at most FLOW_BUDGET_MAX + FLOW_BUDGET_RATE * T, and the rest is the caps' business."""
    bus, sub = new_bus()
    start = trio.current_time()
    rounds = 40
    async with trio.open_nursery() as nursery:
        for _ in range(rounds):
            if sub not in bus.subscribers:
                break
            sub.state.cursor = bus.ring.last_id or 0  # it took everything so far ...
            sub.begin_write()  # ... and is writing it out, slowly

            async def finish(s: Subscription = sub) -> None:
                await trio.sleep(0.4)
                s.writes_done += 1
                s.end_write()

            nursery.start_soon(finish)
            chunk(bus, 60)  # past half its cap while that write is in flight: behind
            await bus.wait_for_subscribers()
            await trio.sleep(0.1)  # the agent reader's own work between groups
            await sub.wait_idle()
    elapsed = trio.current_time() - start
    assert bus.flow_wait_s > 0  # it did wait for the reader at first
    assert bus.flow_wait_s <= FLOW_BUDGET_MAX + FLOW_BUDGET_RATE * elapsed + 1e-9


def test_the_dispatch_group_is_a_quarter_of_the_smallest_cap() -> None:
    bus = SessionBus("s", BusLimits(10_000, 8 << 20, 4 << 20, 8000), None)
    assert bus.group_lines == DISPATCH_GROUP_MAX  # nobody to fall behind
    wide = Subscription(SubscriberState(0, max_queued=2048))
    bus.add_subscriber(wide)
    assert bus.group_lines == DISPATCH_GROUP_MAX == 64  # a quarter would be 512
    narrow = Subscription(SubscriberState(0, max_queued=128))
    bus.add_subscriber(narrow)
    assert bus.group_lines == 32  # the smallest cap decides
    bus.add_subscriber(Subscription(SubscriberState(0, max_queued=16)))
    assert bus.group_lines == 4
    bus.remove_subscriber(narrow)
    bus.add_subscriber(Subscription(SubscriberState(0, max_queued=1)))
    assert bus.group_lines == 1  # never zero


def test_a_group_never_takes_a_checked_subscriber_past_its_cap() -> None:
    # What the quarter buys: a subscriber with a write in flight that flow control let
    # through (under half its cap) is still under its cap, and not evicted, after the next
    # group, however large its maxQueued.
    for max_queued in (16, 100, 256, 2048):
        bus = SessionBus("s", BusLimits(10_000, 8 << 20, 4 << 20, 8000), None)
        sub = Subscription(SubscriberState(0, max_queued=max_queued))
        bus.add_subscriber(sub)
        sub.begin_write()
        chunk(bus, max_queued // 2 - 1)  # just under half: not behind
        assert not bus._behind
        chunk(bus, bus.group_lines)
        assert sub.state.evicted is None and sub in bus.subscribers


def test_the_bus_says_when_its_group_may_have_changed() -> None:
    # The agent channel keeps the smallest group of its sessions and asks again only when a
    # bus says its subscribers changed: every way one comes or goes must say so.
    bus = SessionBus("s", BusLimits(10_000, 8 << 20, 4 << 20, 8000), None)
    told: list[int] = []
    bus.on_subscribers_changed.append(lambda: told.append(bus.group_lines))
    narrow = Subscription(SubscriberState(0, max_queued=16))
    bus.add_subscriber(narrow)
    bus.remove_subscriber(narrow)
    slow = Subscription(SubscriberState(0, max_queued=16))
    bus.add_subscriber(slow)
    bus.evict(slow)
    bus.add_subscriber(Subscription(SubscriberState(0, max_queued=16)))
    bus.cut_subscribers("test")
    assert told == [4, 64, 4, 64, 4, 64]
