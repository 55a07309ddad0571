"""The WebUI model mounted on the real daemon repairs a truncated live turn.

The daemon runs with ``--max-journal-events 3 --max-journal-bytes 300`` and the bundled mock
agent; a 20-chunk turn is held open with the mock's gate file (never a sleep). Loads are counted
at the model's HTTP client (a transport that records every request it relays), model prompts in
the mock's prompt log. Each test has its own daemon, so "exactly one line in the prompt log"
means the whole daemon saw one prompt.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import pytest

from sdk._client import DaemonClient
from sdk._repair import RepairState
from sdk._repair_driver import RepairOutcomeKind
from tests.builders.webui_e2e import (
    TWENTY,
    CountingTransport,
    chunk_counts,
    is_live_marker,
)
from tests.harness import RunningDaemon, running_daemon
from tests.sse_client import text_of
from webui_model import MessageBlock, TextBlock, WebUIProvider

WAIT_S = 30

pytestmark = [pytest.mark.anyio, pytest.mark.processes]


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[RunningDaemon]:
    with running_daemon(tmp_path, ["--max-journal-events", "3", "--max-journal-bytes", "300"]) as d:
        yield d


def prompt_lines(daemon: RunningDaemon) -> list[str]:
    return [json.loads(line)["text"] for line in daemon.prompts()]


class Watch:
    """Records, at every store notification, whether a live marker and a notice were shown."""

    def __init__(self, provider: WebUIProvider) -> None:
        self.provider = provider
        self.marker_seen = False
        self.max_notices = 0
        provider.store.subscribe(self)

    def __call__(self) -> None:
        if any(is_live_marker(b) for b in self.provider.store.blocks):
            self.marker_seen = True
        self.max_notices = max(self.max_notices, self.provider.notices_emitted)


async def wait(provider: WebUIProvider, predicate: Callable[[], bool]) -> None:
    with anyio.fail_after(WAIT_S):
        await provider.wait_for(predicate)


async def test_spec7_item4_the_model_repairs_the_live_turn_with_one_more_load(
    daemon: RunningDaemon,
) -> None:
    token = "webui-e2e"
    counted = CountingTransport()
    async with (
        DaemonClient(daemon.url) as direct,
        DaemonClient(daemon.url, transport=counted) as ui_client,
        WebUIProvider(ui_client) as provider,
    ):
        created = await direct.create_session(scope="thread")
        sid = created.session_id
        accepted = await direct.send_prompt(sid, f"{token} mock:chunks=20 mock:gate={token}")
        with anyio.fail_after(WAIT_S):
            async with direct.events(sid, 0) as stream:
                async for event in stream:
                    if text_of(event) == "chunk-19":
                        break

        watch = Watch(provider)
        await provider.open_session(sid)
        # Mid-turn: the marker is shown, the retained tail lacks the evicted chunks.
        markers = [b for b in provider.store.blocks if is_live_marker(b)]
        assert len(markers) == 1 and markers[0].prompt_id == accepted.prompt_id
        assert isinstance(markers[0], MessageBlock) and markers[0].data["truncatedEvents"] > 0
        assert markers[0].data["maxEvents"] == 3 and markers[0].data["fullTranscriptAvailable"]
        counts = chunk_counts(provider)
        assert 0 not in counts and counts[19] == 1
        episode = provider.episode
        assert episode is not None and episode.prompt_id == accepted.prompt_id
        assert counted.loads == 1

        daemon.open_gate(token)
        await wait(provider, lambda: provider.repair_attempts == 1)

        (outcome,) = provider.repair_outcomes
        assert outcome.kind is RepairOutcomeKind.REPAIRED
        assert counted.loads == 2, "exactly one more load after the terminal"
        assert prompt_lines(daemon) == [f"{token} mock:chunks=20 mock:gate={token}"]
        assert chunk_counts(provider) == TWENTY
        assert not any(is_live_marker(b) for b in provider.store.blocks)
        user = [b.text for b in provider.store.blocks if isinstance(b, TextBlock) and b.kind == "user"]
        assert user == [f"{token} mock:chunks=20 mock:gate={token}"]
        assert watch.marker_seen and watch.max_notices == 0
        assert provider.notices == () and provider.notices_emitted == 0
        # No further load follows: the episode is over and nothing re-arms it.
        assert provider.episode is None and counted.loads == 2


async def test_a_local_prompt_through_the_model_holds_the_repair_until_it_settles(
    daemon: RunningDaemon,
) -> None:
    token = "webui-local"
    text = f"{token} mock:chunks=20 mock:gate={token}"
    counted = CountingTransport()
    async with (
        DaemonClient(daemon.url) as direct,
        DaemonClient(daemon.url, transport=counted) as ui_client,
        WebUIProvider(ui_client, load_warnings=lambda: ["Commands are temporarily unavailable."]) as provider,
        anyio.create_task_group() as nursery,
    ):
        created = await direct.create_session(scope="thread")
        sid = created.session_id
        await provider.open_session(sid)
        states_at_return: list[tuple[RepairState | None, int]] = []

        async def local_prompt() -> None:
            result = await provider.prompt(text)
            episode = provider.episode
            states_at_return.append((None if episode is None else episode.state, counted.loads))
            assert result.stop_reason == "end_turn"

        nursery.start_soon(local_prompt)
        await wait(provider, lambda: chunk_counts(provider)[19] == 1)
        # A configured reload mid-turn falls back to memory replay: the marker replaces chunk-0.
        await provider.reload()
        assert any(is_live_marker(b) for b in provider.store.blocks)
        assert 0 not in chunk_counts(provider) and provider.episode is not None
        assert counted.loads == 2

        daemon.open_gate(token)
        await wait(provider, lambda: provider.repair_attempts == 1)
        # The repair's load had not been sent when prompt() returned: it follows the settled
        # prompt (tests/webui/test_webui_provider.py pins the guard itself deterministically).
        assert states_at_return == [(RepairState.RELOADING, 2)]
        assert provider.repair_outcomes[-1].kind is RepairOutcomeKind.REPAIRED
        assert counted.loads == 3 and prompt_lines(daemon) == [text]
        assert chunk_counts(provider) == TWENTY
        assert not any(is_live_marker(b) for b in provider.store.blocks)
        shown = [
            b for b in provider.store.blocks
            if isinstance(b, MessageBlock) and b.text == "Commands are temporarily unavailable."
        ]
        assert len(shown) == 1 and provider.notices == ()


async def test_wait_repair_and_the_state_an_observer_sees_when_the_episode_ends(
    daemon: RunningDaemon,
) -> None:
    token = "webui-wait"
    async with (
        DaemonClient(daemon.url) as direct,
        DaemonClient(daemon.url) as ui_client,
        WebUIProvider(ui_client) as provider,
        anyio.create_task_group() as nursery,
    ):
        assert await provider.wait_repair() is None  # nothing open: nothing to wait for
        sid = (await direct.create_session(scope="thread")).session_id
        await direct.send_prompt(sid, f"{token} mock:chunks=20 mock:gate={token}")
        await wait_for_chunk_19(direct, sid)
        await provider.open_session(sid)
        assert provider.episode is not None
        seen: list[tuple[int, list[RepairOutcomeKind], int]] = []
        observed = anyio.Event()

        async def observer() -> None:
            await provider.wait_for(lambda: provider.episode is None)
            seen.append(
                (
                    provider.repair_attempts,
                    [o.kind for o in provider.repair_outcomes],
                    ui_client.statistics().loads,
                )
            )
            observed.set()

        nursery.start_soon(observer)
        await anyio.wait_all_tasks_blocked()
        daemon.open_gate(token)
        with anyio.fail_after(WAIT_S):
            outcome = await provider.wait_repair()
        assert outcome is not None and outcome.kind is RepairOutcomeKind.REPAIRED
        assert chunk_counts(provider) == TWENTY
        with anyio.fail_after(WAIT_S):
            await observed.wait()
        # Woken by the episode's end, the observer saw the outcome and the counters with it.
        assert seen == [(1, [RepairOutcomeKind.REPAIRED], 2)]
        assert await provider.wait_repair() is None  # that episode is over

        # A waiter on an episode that navigation removes gets None, not a hang.
        other = "webui-wait-2"
        sid2 = (await direct.create_session(scope="thread")).session_id
        await direct.send_prompt(sid2, f"{other} mock:chunks=20 mock:gate={other}")
        await wait_for_chunk_19(direct, sid2)
        await provider.open_session(sid2)
        assert provider.episode is not None
        results: list[object] = []
        done = anyio.Event()

        async def waiter() -> None:
            results.append(await provider.wait_repair())
            done.set()

        nursery.start_soon(waiter)
        await anyio.wait_all_tasks_blocked()
        assert results == []
        await provider.clear()
        with anyio.fail_after(WAIT_S):
            await done.wait()
        assert results == [None] and provider.repair_attempts == 1
        daemon.open_gate(other)


async def wait_for_chunk_19(direct: DaemonClient, sid: str) -> None:
    with anyio.fail_after(WAIT_S):
        async with direct.events(sid, 0) as stream:
            async for event in stream:
                if text_of(event) == "chunk-19":
                    return
