"""The repair driver with the real daemon and mock agent.

Daemon limits ``--max-journal-events 3 --max-journal-bytes 300`` and a 20-chunk turn held open
by a gate file: a mid-turn load shows the recoverable live marker; after the terminal the
driver makes exactly one more load. Failures are injected by the fault proxy in front of the
daemon (never by mocking the driver): it answers that load with a chosen status, a crafted
body, or drops the connection.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import pytest
from anyio.abc import TaskGroup

from sdk._client import DaemonClient, LoadResult
from sdk._errors import DaemonHTTPError
from sdk._repair import DEGRADED_TEXT, INCOMPLETE_TEXT, NOTICE_CODE, NOTICE_MESSAGE, RepairNotice
from sdk._repair_driver import RepairCandidate, RepairDriver, RepairOutcome, RepairOutcomeKind
from sdk._session import SessionHandle, SubscriptionState
from sdk.protocol.envelope import DaemonEvent
from tests.builders import wire_bodies
from tests.builders.sdk_session import EventLog, gate_name
from tests.fault_proxy import FaultProxy
from tests.harness import RunningDaemon, running_daemon
from tests.sse_client import chunk_kind, is_terminal_for, text_of

WAIT_S = 30
TWENTY = [f"chunk-{i}" for i in range(20)]

pytestmark = [pytest.mark.anyio, pytest.mark.processes]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    base = tmp_path_factory.mktemp("sdk-repair")
    args = ["--max-journal-events", "3", "--max-journal-bytes", "300"]
    with running_daemon(base, args) as d:
        yield d


@pytest.fixture
async def proxy(daemon: RunningDaemon) -> AsyncIterator[FaultProxy]:
    fault_proxy = FaultProxy(daemon.url)
    async with anyio.create_task_group() as nursery:
        await nursery.start(fault_proxy.run)
        yield fault_proxy
        nursery.cancel_scope.cancel()


@dataclass
class Scenario:
    """A UI that loaded mid-turn (marker shown) and follows the session through a driver."""

    daemon: RunningDaemon
    proxy: FaultProxy
    token: str
    session_id: str
    prompt_id: str
    ui: SessionHandle
    snapshot: LoadResult
    driver: RepairDriver
    log: EventLog
    notices: list[RepairNotice] = field(default_factory=list)
    candidates: list[RepairCandidate] = field(default_factory=list)

    def agent_prompts_for_token(self) -> int:
        return sum(1 for line in self.daemon.prompts() if self.token in json.loads(line)["text"])

    async def finish_turn(self) -> RepairOutcome:
        self.daemon.open_gate(self.token)
        with anyio.fail_after(WAIT_S):
            return await self.driver.wait_outcome()


async def wait_for_chunk_19(direct: DaemonClient, session_id: str) -> None:
    with anyio.fail_after(WAIT_S):
        async with direct.events(session_id, 0) as stream:
            async for event in stream:
                if text_of(event) == "chunk-19":
                    return


async def start_scenario(
    daemon: RunningDaemon,
    proxy: FaultProxy,
    nursery: TaskGroup,
    direct: DaemonClient,
    ui_client: DaemonClient,
    tag: str,
    commit: Callable[[RepairCandidate], object] | None = None,
) -> Scenario:
    token = gate_name(f"repair-{tag}")
    created = await direct.create_session(scope="thread")
    accepted = await direct.send_prompt(
        created.session_id, f"{token} mock:chunks=20 mock:gate={token}"
    )
    await wait_for_chunk_19(direct, created.session_id)

    ui, snapshot = await SessionHandle.load(ui_client, created.session_id)
    candidates: list[RepairCandidate] = []
    notices: list[RepairNotice] = []
    driver = RepairDriver(ui, nursery, commit=commit or candidates.append, notify=notices.append)
    episode = driver.begin(snapshot)
    assert episode is not None, "the mid-turn load showed no recoverable live marker"
    assert episode.prompt_id == accepted.prompt_id
    marker = snapshot.live_journal[0]
    assert marker.type == "history_truncated" and marker.data["truncatedEvents"] > 0
    assert "chunk-0" not in [text_of(e) for e in snapshot.live_journal]

    log = EventLog(driver.observe)
    ui.subscribe(nursery, log)
    return Scenario(
        daemon,
        proxy,
        token,
        created.session_id,
        accepted.prompt_id,
        ui,
        snapshot,
        driver,
        log,
        notices,
        candidates,
    )


def agent_texts(events: list[DaemonEvent]) -> list[str]:
    return [text_of(e) for e in events if chunk_kind(e) == "agent_message_chunk"]


async def test_repair_reloads_once_and_hands_the_subscription_to_the_candidate(
    daemon: RunningDaemon, proxy: FaultProxy
) -> None:
    async with (
        DaemonClient(daemon.url) as direct,
        DaemonClient(proxy.url) as ui_client,
        anyio.create_task_group() as nursery,
    ):
        sc = await start_scenario(daemon, proxy, nursery, direct, ui_client, "ok")
        prompts_before = len(daemon.prompts())
        assert proxy.loads == 1

        outcome = await sc.finish_turn()

        assert outcome.kind is RepairOutcomeKind.REPAIRED and sc.notices == []
        assert proxy.loads == 2, "the repair must make exactly one more load"
        assert len(daemon.prompts()) == prompts_before and sc.agent_prompts_for_token() == 1
        (candidate,) = sc.candidates
        suffix = candidate.suffix
        assert chunk_kind(suffix[0]) == "user_message_chunk"
        assert suffix[0].prompt_id == sc.prompt_id
        assert "".join(agent_texts(suffix)) == "".join(TWENTY)
        assert [e for e in suffix if is_terminal_for(sc.prompt_id)(e)]
        assert not [e for e in candidate.events if e.type == "history_truncated"]
        assert candidate.watermark == sc.snapshot.last_event_id
        assert candidate.observed_ids == {e.id for e in sc.snapshot.live_journal if e.id}
        assert candidate.highest_live_id is not None
        assert candidate.highest_live_id >= (sc.snapshot.last_event_id or 0)

        # The candidate owns the subscription now; the old registration is gone.
        new = candidate.handle
        assert sc.driver.handle is new and new.client_id != sc.ui.client_id
        assert sc.ui.state is SubscriptionState.CLOSED
        assert new.state is SubscriptionState.RUNNING
        with anyio.fail_after(WAIT_S):
            after = await new.prompt(f"after {sc.token} mock:chunks=1")
        await sc.log.wait_for(is_terminal_for(after.prompt_id))
        ids = sc.log.ids()
        assert ids == sorted(set(ids)), "an event was delivered twice across the hand-over"
        with pytest.raises(DaemonHTTPError) as refused:
            await sc.ui.client.send_prompt(sc.session_id, "old registration")
        assert refused.value.status == 400 and refused.value.code == "invalid_client_id"
        assert sc.driver.check() is False and sc.driver.episode is None
        await new.close()
        nursery.cancel_scope.cancel()


def fake_load_body(session_id: str, *, degraded: bool) -> dict[str, Any]:
    return wire_bodies.resume(
        session_id, last_event_id=1, epoch="not-the-real-epoch",
        clientId="client_fake-candidate", compactedReplay=[], liveJournal=[],
        replayDegraded=degraded)


@dataclass(frozen=True)
class Failure:
    kind: RepairOutcomeKind
    resumed: bool
    debug: str  # a substring of the notice's debug message


FAILURES: dict[str, Failure] = {
    "commit_raises": Failure(RepairOutcomeKind.FAILED, True, "the store refused the commit"),
    "degraded": Failure(RepairOutcomeKind.FAILED, True, DEGRADED_TEXT),
    "incomplete": Failure(RepairOutcomeKind.FAILED, True, INCOMPLETE_TEXT),
    "network": Failure(RepairOutcomeKind.FAILED, True, "/load"),
    "server_error": Failure(RepairOutcomeKind.FAILED, True, "HTTP 500"),
    "auth": Failure(RepairOutcomeKind.AUTH_FAILED, False, "HTTP 401"),
    "missing_session": Failure(RepairOutcomeKind.MISSING_SESSION, False, "HTTP 404"),
}


def refuse_commit(candidate: RepairCandidate) -> None:
    raise RuntimeError("the store refused the commit")


def inject(proxy: FaultProxy, case: str, session_id: str) -> None:
    if case == "degraded":
        proxy.fail_next_load(status=200, body=fake_load_body(session_id, degraded=True))
    elif case == "incomplete":
        proxy.fail_next_load(status=200, body=fake_load_body(session_id, degraded=False))
    elif case == "network":
        proxy.fail_next_load(drop=True)
    elif case == "server_error":
        proxy.fail_next_load(status=500, body={"error": "boom", "code": "internal_error"})
    elif case == "auth":
        proxy.fail_next_load(status=401, body={"error": "Unauthorized", "code": "unauthorized"})
    elif case == "missing_session":
        body = {
            "error": f'No session with id "{session_id}"',
            "code": "session_not_found",
            "sessionId": session_id,
        }
        proxy.fail_next_load(status=404, body=body)


@pytest.mark.parametrize("case", list(FAILURES))
async def test_each_failure_emits_one_notice_and_resumes_only_when_it_should(
    daemon: RunningDaemon, proxy: FaultProxy, case: str
) -> None:
    expected = FAILURES[case]
    commit = refuse_commit if case == "commit_raises" else None
    async with (
        DaemonClient(daemon.url) as direct,
        DaemonClient(proxy.url) as ui_client,
        anyio.create_task_group() as nursery,
    ):
        sc = await start_scenario(daemon, proxy, nursery, direct, ui_client, case, commit)
        inject(proxy, case, sc.session_id)
        signature = sc.driver.episode.signature if sc.driver.episode else ""

        outcome = await sc.finish_turn()

        assert outcome.kind is expected.kind
        assert outcome.missing_session is (case == "missing_session")
        assert proxy.loads == 2 and sc.agent_prompts_for_token() == 1
        (notice,) = sc.notices
        assert notice.id == f"{NOTICE_CODE}:{signature}"
        assert (notice.severity, notice.category, notice.operation) == (
            "warning",
            "connection",
            "load_session",
        )
        assert notice.code == NOTICE_CODE and notice.recoverable is True
        assert notice.message == NOTICE_MESSAGE
        assert expected.debug in notice.debug_message
        assert outcome.notice == notice and sc.driver.handle is sc.ui
        # At most one attempt per episode: nothing re-arms it.
        assert sc.driver.episode is None and sc.driver.check() is False
        if case in ("degraded", "incomplete"):
            # The candidate made from the crafted answer was detached again.
            assert proxy.count("POST", r"/detach$") == 1

        if expected.resumed:
            assert sc.ui.state is SubscriptionState.RUNNING
            # The resumed subscription delivers: prompt() waits on it for its terminal.
            with anyio.fail_after(WAIT_S):
                after = await sc.ui.prompt(f"after {sc.token} mock:chunks=1")
            await sc.log.wait_for(is_terminal_for(after.prompt_id))
            ids = sc.log.ids()
            assert ids == list(range(ids[0], ids[0] + len(ids))), "gap or duplicate after resume"
        else:
            assert sc.ui.state is SubscriptionState.PAUSED
        assert len(sc.notices) == 1
        await sc.ui.close()
        nursery.cancel_scope.cancel()


async def test_abort_cancels_the_attempt_without_a_notice(
    daemon: RunningDaemon, proxy: FaultProxy
) -> None:
    entered = anyio.Event()

    async def never_commits(candidate: RepairCandidate) -> None:
        entered.set()
        await anyio.sleep_forever()

    async with (
        DaemonClient(daemon.url) as direct,
        DaemonClient(proxy.url) as ui_client,
        anyio.create_task_group() as nursery,
    ):
        sc = await start_scenario(daemon, proxy, nursery, direct, ui_client, "abort")
        sc.driver._commit = never_commits
        sc.daemon.open_gate(sc.token)
        with anyio.fail_after(WAIT_S):
            await entered.wait()
        assert sc.driver.attempting
        sc.driver.abort()
        with anyio.fail_after(WAIT_S):
            outcome = await sc.driver.wait_outcome()
        assert outcome.kind is RepairOutcomeKind.ABORTED and outcome.notice is None
        assert sc.notices == [] and sc.driver.episode is None
        assert sc.ui.state is SubscriptionState.PAUSED
        assert proxy.count("POST", r"/detach$") == 1  # the abandoned candidate
        await sc.ui.close()
        nursery.cancel_scope.cancel()


async def test_a_local_prompt_in_flight_delays_the_repair_until_it_settles(
    daemon: RunningDaemon, proxy: FaultProxy
) -> None:
    token = gate_name("repair-guard")
    async with (
        DaemonClient(daemon.url) as direct,
        DaemonClient(proxy.url) as ui_client,
        anyio.create_task_group() as nursery,
    ):
        created = await direct.create_session(scope="thread")
        sid = created.session_id
        ui, first = await SessionHandle.load(ui_client, sid)
        candidates: list[RepairCandidate] = []
        notices: list[RepairNotice] = []
        driver = RepairDriver(ui, nursery, commit=candidates.append, notify=notices.append)
        assert driver.begin(first) is None  # nothing truncated yet
        started_at_terminal: list[bool] = []

        def observe(event: DaemonEvent) -> None:
            started = driver.observe(event)
            if event.type == "turn_complete":
                started_at_terminal.append(started)

        log = EventLog(observe)
        ui.subscribe(nursery, log)
        settled = anyio.Event()

        async def local_prompt() -> None:
            await ui.prompt(f"{token} mock:chunks=20 mock:gate={token}")
            settled.set()

        nursery.start_soon(local_prompt)
        await log.wait_for(lambda e: text_of(e) == "chunk-19")
        mid = await ui.client.load_session(sid)
        episode = driver.begin(mid)
        assert episode is not None
        loads_before = proxy.loads

        daemon.open_gate(token)
        with anyio.fail_after(WAIT_S):
            await settled.wait()
        # The terminal armed the episode but the prompt in flight held the attempt back.
        assert started_at_terminal == [False] and proxy.loads == loads_before
        assert driver.check() is True  # the prompt settled: re-check
        with anyio.fail_after(WAIT_S):
            outcome = await driver.wait_outcome()
        assert outcome.kind is RepairOutcomeKind.REPAIRED and notices == []
        assert proxy.loads == loads_before + 1
        assert "".join(agent_texts(candidates[0].suffix)) == "".join(TWENTY)
        await driver.handle.close()
        nursery.cancel_scope.cancel()


async def test_wait_outcome_returns_none_when_no_attempt_can_come(
    daemon: RunningDaemon, proxy: FaultProxy
) -> None:
    async with (
        DaemonClient(daemon.url) as direct,
        DaemonClient(proxy.url) as ui_client,
        anyio.create_task_group() as nursery,
    ):
        sc = await start_scenario(daemon, proxy, nursery, direct, ui_client, "never-arms")
        results: list[RepairOutcome | None] = []
        woke = anyio.Event()

        async def waiter() -> None:
            results.append(await sc.driver.wait_outcome())
            woke.set()

        nursery.start_soon(waiter)
        await anyio.wait_all_tasks_blocked()
        assert results == [], "the episode is pending: the waiter must wait"
        sc.driver.abort()  # e.g. a configured reload: the episode is gone without an attempt
        with anyio.fail_after(WAIT_S):
            await woke.wait()
        assert results == [None]
        assert await sc.driver.wait_outcome() is None  # no episode at all: at once

        # An episode whose subscription ends before the terminal can never arm.
        mid = await sc.ui.client.load_session(sc.session_id)
        assert sc.driver.begin(mid) is not None
        woke = anyio.Event()
        nursery.start_soon(waiter)
        await anyio.wait_all_tasks_blocked()
        assert len(results) == 1
        await sc.ui.close()
        with anyio.fail_after(WAIT_S):
            await woke.wait()
        assert results == [None, None] and sc.driver.outcomes == []
        assert proxy.loads == 2, "no repair load was made"
        sc.daemon.open_gate(sc.token)
        nursery.cancel_scope.cancel()
