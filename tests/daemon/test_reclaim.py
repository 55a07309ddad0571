"""Freed heap memory goes back to the OS: the policy that says when (pure), the task that trims
(on trio's mock clock), the buses that report what they publish, and a real daemon whose RSS
at full caps drops once publishing pauses."""

from __future__ import annotations

import itertools
import re
import time
from pathlib import Path

import httpx
import pytest
import trio
import trio.testing

from daemon.bus import BusLimits, SessionBus
from daemon.core.reclaim import MAX_DELAY_S, MIN_CHURN_BYTES, QUIET_S, ReclaimPolicy
from daemon.reclaimer import Reclaimer
from sdk.protocol.events import SessionUpdateData
from tests.harness import running_daemon

pytestmark = pytest.mark.processes  # starts processes: not in make unit-fast

MIB = 1024 * 1024


# --- the policy ------------------------------------------------------------------------------


def test_no_trim_is_due_below_the_minimum_churn() -> None:
    policy = ReclaimPolicy(min_churn_bytes=10, quiet_s=0.05, max_delay_s=1.0)
    assert policy.due_at() is None
    assert policy.note(9, 1.0) is False
    assert policy.due_at() is None
    assert policy.note(0, 2.0) is False and policy.note(-5, 2.0) is False
    assert policy.due_at() is None and policy.churn == 9


def test_a_burst_is_trimmed_once_it_pauses() -> None:
    policy = ReclaimPolicy(min_churn_bytes=10, quiet_s=0.05, max_delay_s=1.0)
    assert policy.note(6, 1.0) is False
    assert policy.note(6, 1.01) is True  # this one passed the minimum: wake the trimmer
    assert policy.note(6, 1.02) is False  # already due: no second wake-up
    assert policy.due_at() == pytest.approx(1.07)  # 50 ms after the last note
    policy.trimmed()
    assert policy.churn == 0 and policy.due_at() is None
    assert policy.note(10, 5.0) is True and policy.due_at() == pytest.approx(5.05)


def test_a_stream_that_never_pauses_is_trimmed_after_the_longest_delay() -> None:
    policy = ReclaimPolicy(min_churn_bytes=10, quiet_s=0.05, max_delay_s=1.0)
    policy.note(10, 3.0)
    for i in range(1, 200):
        policy.note(1, 3.0 + i * 0.01)
    assert policy.due_at() == pytest.approx(4.0)


def test_the_tail_of_a_stream_trimmed_while_it_flowed_is_trimmed_once_it_pauses() -> None:
    policy = ReclaimPolicy(min_churn_bytes=10, quiet_s=0.05, max_delay_s=1.0)
    policy.note(10, 3.0)
    policy.note(1, 3.99)
    assert policy.due_at() == pytest.approx(4.0)
    policy.trimmed(4.0)  # the longest delay: the stream still flowed
    # Its tail stays below the minimum; the first note of it wakes the trimmer, and the pause
    # after the last one is due.
    assert policy.note(2, 4.01) is True
    assert policy.note(2, 4.02) is False
    assert policy.churn == 4 and policy.due_at() == pytest.approx(4.07)
    policy.trimmed(4.07)  # that trim ran in a pause: the next few bytes wait for the minimum
    assert policy.note(2, 9.0) is False and policy.due_at() is None


def test_a_burst_that_resumes_after_its_pause_trim_is_trimmed_at_its_next_pause() -> None:
    """A stall mid-burst (a slow agent, a busy machine) is a pause: the trim runs there. What
    the burst publishes after it resuming stays below the minimum, but its small events push
    big ones out of the ring: the next pause trims once more, and only once."""
    policy = ReclaimPolicy(min_churn_bytes=10, quiet_s=0.05, max_delay_s=1.0)
    policy.note(10, 1.0)
    policy.trimmed(1.05)  # the burst had paused
    assert policy.note(3, 1.5) is True  # it resumes: the first note of the tail wakes the task
    assert policy.note(3, 1.6) is False
    assert policy.due_at() == pytest.approx(1.65)
    policy.trimmed(1.65)  # the tail's trim leaves none
    assert policy.note(3, 2.0) is False and policy.due_at() is None


def test_a_trim_asked_for_leaves_no_tail_to_trim() -> None:
    policy = ReclaimPolicy(min_churn_bytes=10, quiet_s=0.05, max_delay_s=1.0)
    policy.note(10, 2.0)
    policy.trimmed()  # asked for (trim_now), not made due by the policy
    assert policy.note(1, 2.01) is False and policy.due_at() is None


@pytest.mark.parametrize("kwargs", [{"min_churn_bytes": 0}, {"quiet_s": 0},
                                    {"quiet_s": 2.0, "max_delay_s": 1.0}])
def test_bad_policy_settings_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        ReclaimPolicy(**kwargs)  # type: ignore[arg-type]


# --- the task --------------------------------------------------------------------------------


async def test_the_task_trims_after_a_burst_and_under_a_steady_stream(
        autojump_clock: trio.testing.MockClock) -> None:
    trims: list[float] = []

    def trim() -> bool:
        trims.append(trio.current_time())
        return True

    reclaimer = Reclaimer(trim=trim)
    async with trio.open_nursery() as nursery:
        await nursery.start(reclaimer.run)
        start = trio.current_time()
        # Below the minimum: nothing, however long it waits.
        reclaimer.note(MIN_CHURN_BYTES - 1)
        await trio.sleep(10)
        assert trims == []
        # One more byte: the burst is over at once, so the trim comes QUIET_S later.
        reclaimer.note(1)
        await trio.sleep(1)
        assert [t - start for t in trims] == [pytest.approx(10 + QUIET_S)]
        # A stream that never pauses for QUIET_S: a trim every MAX_DELAY_S or so.
        trims.clear()
        stream_start = trio.current_time()
        for _ in range(350):
            reclaimer.note(MIN_CHURN_BYTES // 8)
            await trio.sleep(QUIET_S / 5)
        elapsed = trio.current_time() - stream_start
        assert len(trims) == pytest.approx(elapsed / MAX_DELAY_S, abs=1)
        assert all(b - a >= MAX_DELAY_S * 0.9 for a, b in itertools.pairwise(trims))
        assert reclaimer.trims == 1 + len(trims) and reclaimer.released == reclaimer.trims
        # A stream trimmed at the longest delay whose tail stays below the minimum: the tail
        # is trimmed once the stream pauses.
        await trio.sleep(1)
        trims.clear()
        tail_start = trio.current_time()
        reclaimer.note(MIN_CHURN_BYTES)
        for _ in range(150):  # 1.5 s of a byte every QUIET_S / 5
            reclaimer.note(1)
            last_note = trio.current_time()
            await trio.sleep(QUIET_S / 5)
        await trio.sleep(1)
        assert trims == [pytest.approx(tail_start + MAX_DELAY_S, abs=QUIET_S / 5),
                         pytest.approx(last_note + QUIET_S)]
        nursery.cancel_scope.cancel()


# --- the buses -------------------------------------------------------------------------------


def test_a_bus_reports_every_byte_it_publishes_once_per_flush() -> None:
    noted: list[int] = []

    class Noting:
        def note(self, nbytes: int) -> None:
            noted.append(nbytes)

        def trim_now(self, reason: str, *, quiet: bool = False) -> bool:
            raise AssertionError("no spill here")

    bus = SessionBus("s", BusLimits(10_000, 8 * MIB, 4 * MIB, 100), None, reclaimer=Noting())
    sizes = 0
    for batch in range(3):
        for i in range(50):
            event = bus.publish(SessionUpdateData(session_id="s", update={
                "sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": f"chunk-{batch}-{i}"}}), flush=False)
            assert event is not None
            sizes += len(event.raw)
        bus.flush()
        assert len(noted) == batch + 1
    bus.flush()  # nothing new: no report
    assert len(noted) == 3
    # The ring kept only the newest 100 events; the reports count all 150.
    assert sum(noted) == sizes == bus.ring.appended_bytes
    assert len(bus.ring) == 100


# --- a real daemon ---------------------------------------------------------------------------


def rss_anon_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1000
    raise AssertionError("no RssAnon line")


def test_a_daemon_gives_back_the_heap_its_evicted_events_held(tmp_path: Path) -> None:
    """Five turns of 1 KB chunks fill the ring with heap-allocated envelopes; a turn of short
    chunks (held open at a gate) pushes them out. Without the trim their pages stay resident
    (measured: anon RSS 39 MB idle, 63 MB then; trimmed: 52-53 MB)."""
    with running_daemon(tmp_path) as daemon, \
            httpx.Client(base_url=daemon.url, timeout=60) as client:
        pid = daemon.proc.pid
        idle = rss_anon_mb(pid)
        sid = client.post("/session", json={}).json()["sessionId"]

        def prompt(text: str) -> int:
            reply = client.post(f"/session/{sid}/prompt",
                                json={"prompt": [{"type": "text", "text": text}]})
            assert reply.status_code == 202, reply.text
            return int(reply.json()["lastEventId"])

        def status() -> dict[str, int | bool]:
            return client.get(f"/session/{sid}/status").json()  # type: ignore[no-any-return]

        for _ in range(5):
            prompt("mock:chunks=1000 mock:bytes=1000 mock:delay_ms=0")
            deadline = time.monotonic() + 60
            while status()["hasActivePrompt"]:
                assert time.monotonic() < deadline, "a turn did not end"
                time.sleep(0.02)  # polling the daemon's own state
        trims = re.compile(r"event=heap_trimmed .*released=True")
        before_fill = len(trims.findall(daemon.stderr()))
        last = prompt("mock:chunks=30000 mock:gate=held") + 1 + 30_000
        deadline = time.monotonic() + 60
        while int(status()["durableEventId"]) < last:
            assert time.monotonic() < deadline, "the fill turn was not committed"
            time.sleep(0.02)
        # The trim follows a pause in publishing: wait for the daemon to say one ran since
        # the fill began. On a busy machine a stall mid-fill is a pause too, and the trim
        # of the fill's tail follows the next one: wait for the heap to come back, which
        # without a trim it never does (~24 MB above idle, see above).
        deadline = time.monotonic() + 10
        while len(trims.findall(daemon.stderr())) == before_fill:
            assert time.monotonic() < deadline, daemon.stderr()[-2000:]
            time.sleep(0.02)
        while (held := rss_anon_mb(pid) - idle) >= 19 and time.monotonic() < deadline:
            time.sleep(0.05)  # polling the daemon's RSS, which only a trim brings down
        daemon.open_gate("held")
        assert held < 19, (f"anon RSS {held:.1f} MB above idle at full caps; "
                           + daemon.stderr()[-2000:])
