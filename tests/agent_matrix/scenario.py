"""The agent matrix: each pinned ACP agent behind the real daemon, against the fake model server.

Run by ``make test-agents`` (not part of ``make test``): ``pytest tests/agent_matrix/scenario.py``
after ``python -m tests.agent_matrix.install``. For each agent, in order, each step asserting
what a user would see:

1. create      ``POST /session`` starts the agent and its ACP session
2. turn 1      a prompt streams the fake's reply as agent text and ends ``turn_complete``
               (``end_turn``), the prompt echoed once
3. turn 2      the same, on the same agent session
4. restart     ``SIGTERM``: the daemon exits 0 and takes its agent with it; a new daemon starts on
               the same data directory
5. load        ``POST /session/{id}/load`` restores the session through the agent's own
               ``session/load`` and replays turns 1-2 (prompts once, texts, both terminals)
6. turn 3      a prompt on the restored session streams the fake's reply; when the agent
               restored its own session, the request the fake got holds turns 1-2 (its context)
7. replay      a last load replays all three turns

Each step's outcome is written to ``.agents-cache/results/<agent>.json``;
``python -m tests.agent_matrix.scenario`` prints them as a table.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from benchmarks.launcher import alive, descendants
from sdk.protocol.envelope import DaemonEvent, decode_events
from tests.agent_matrix.agents import AGENTS, CACHE, AgentSpec, agent_env
from tests.agent_matrix.fake_models import FakeModels, reply_for, serving
from tests.agent_matrix.install import skipped_reason
from tests.harness import RunningDaemon, start_daemon
from tests.sse_client import Subscriber, chunk_kind, is_terminal_for, text_of

pytestmark = pytest.mark.processes  # starts the daemon and real agents

STEPS = ("create", "turn 1", "turn 2", "restart", "load", "turn 3", "replay")
PROBES = ("tkprobe-one", "tkprobe-two", "tkprobe-three")
# Agents start node or Python programs of their own: seconds each, more on a busy machine.
AGENT_START_S = 120.0
TURN_S = 120.0
# How long an agent's own helper processes may outlive the daemon's stop.
ORPHAN_GRACE_S = 10.0
RESULTS = CACHE / "results"


def prompt_text(probe: str) -> str:
    return f"Answer in one short sentence. {probe}"


@dataclass
class Run:
    """One agent's way through the steps, recorded as it goes."""

    spec: AgentSpec
    outcome: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # Failures that do not stop the scenario (the next steps can still run).
    soft: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    clock: float = field(default_factory=time.monotonic)

    def timed(self, step: str) -> None:
        now = time.monotonic()
        self.seconds[step] = round(now - self.clock, 1)
        self.clock = now

    def fail_soft(self, step: str, condition: bool, message: str) -> None:
        if not condition:
            self.soft.append(f"{step}: {message}")
            self.outcome[step] = f"FAIL: {message}"

    def passed(self, step: str) -> None:
        self.outcome.setdefault(step, "ok")
        self.timed(step)

    def save(self) -> None:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / f"{self.spec.name}.json").write_text(json.dumps({
            "agent": self.spec.name, "package": self.spec.package,
            "version": self.spec.version, "steps": self.outcome, "notes": self.notes,
            "seconds": self.seconds, "offline": os.environ.get("AGENT_MATRIX_OFFLINE") == "1",
            "at": time.strftime("%Y-%m-%d %H:%M:%S"),
        }, indent=1))


class StepFailed(AssertionError):
    pass


def check(condition: bool, message: str) -> None:
    if not condition:
        raise StepFailed(message)


def turn_events(events: list[DaemonEvent], prompt_id: str) -> list[DaemonEvent]:
    return [e for e in events if e.prompt_id == prompt_id]


def check_turn(events: list[DaemonEvent], prompt_id: str, probe: str) -> int:
    """The turn's events as a user sees them: the prompt once, the fake's text, one terminal
    ``turn_complete`` with ``end_turn``. Returns how many agent text chunks carried it."""
    mine = turn_events(events, prompt_id)
    users = [text_of(e) for e in mine if chunk_kind(e) == "user_message_chunk"]
    check(users == [prompt_text(probe)], f"the prompt should be echoed once, got {users!r}")
    chunks = [text_of(e) for e in mine if chunk_kind(e) == "agent_message_chunk"]
    check("".join(chunks) == reply_for(probe),
          f"agent text {''.join(chunks)!r} != the fake's {reply_for(probe)!r}")
    terminals = [e for e in mine if e.type in ("turn_complete", "turn_error")]
    check(len(terminals) == 1, f"one terminal expected, got {[t.type for t in terminals]}")
    data = terminals[0].data if isinstance(terminals[0].data, dict) else {}
    check(terminals[0].type == "turn_complete" and data.get("stopReason") == "end_turn",
          f"terminal {terminals[0].type} {data!r}")
    return len(chunks)


def check_replay(body: dict[str, Any], prompt_ids: list[str]) -> None:
    """A load's replay holds each turn whole: prompt once, text, terminal."""
    events = decode_events(body["compactedReplay"]) + decode_events(body.get("liveJournal", []))
    for prompt_id, probe in zip(prompt_ids, PROBES, strict=False):
        check_turn(events, prompt_id, probe)
    ledger = {t["promptId"]: t.get("terminal") for t in body.get("promptTerminals", [])}
    for prompt_id in prompt_ids:
        check(ledger.get(prompt_id) == "completed",
              f"promptTerminals should have {prompt_id} completed, has {ledger!r}")


async def run_turn(client: httpx.AsyncClient, sub: Subscriber, sid: str, probe: str) -> str:
    resp = await client.post(f"/session/{sid}/prompt", json={"prompt": [
        {"type": "text", "text": prompt_text(probe)}]})
    check(resp.status_code == 202, f"prompt: {resp.status_code} {resp.text}")
    prompt_id: str = resp.json()["promptId"]
    await sub.wait_for(is_terminal_for(prompt_id), timeout=TURN_S)
    return prompt_id


def restored_via(daemon: RunningDaemon, sid: str) -> str | None:
    found = re.findall(rf"event=session_restored session={sid} via=(\S+)", daemon.stderr())
    return found[-1] if found else None


def agent_pids(daemon: RunningDaemon) -> list[int]:
    return descendants(daemon.proc.pid)


async def scenario(run: Run, base: Path, fakes: FakeModels) -> None:
    spec = run.spec
    home = base / "home"
    home.mkdir()
    spec.setup(fakes.url, home)
    env = agent_env(spec, fakes.url, home)
    data = base / "data"
    args = ["--agent", shlex.join(spec.argv()), "--agent-init-timeout-ms", "90000"]
    timeout = httpx.Timeout(AGENT_START_S)
    prompt_ids: list[str] = []

    step = "create"
    daemon = start_daemon(base, args, env, data_dir=data, tag="first")
    try:
        async with httpx.AsyncClient(base_url=daemon.url, timeout=timeout) as client, \
                trio.open_nursery() as nursery:
            resp = await client.post("/session", json={})
            check(resp.status_code == 200, f"create: {resp.status_code} {resp.text}")
            sid = resp.json()["sessionId"]
            sub = Subscriber(client, f"/session/{sid}/events", {"Last-Event-ID": "0"})
            await nursery.start(sub.run)
            if spec.update_after_new is not None:
                kind = spec.update_after_new
                await sub.wait_for(lambda e: chunk_kind(e) == kind, timeout=TURN_S)
                run.notes.append(f"create: {kind} after session/new kept")
            run.passed(step)
            for n, step in ((0, "turn 1"), (1, "turn 2")):
                prompt_ids.append(await run_turn(client, sub, sid, PROBES[n]))
                chunks = check_turn(sub.events, prompt_ids[-1], PROBES[n])
                run.passed(step)
                run.notes.append(f"{step}: {chunks} text chunks")
            nursery.cancel_scope.cancel()
        step = "restart"
        pids = agent_pids(daemon)
        check(bool(pids), "no agent process under the daemon")
        code = daemon.stop(timeout=30)
        check(code == 0, f"daemon exit status {code} after SIGTERM")
        # The agent exits (or is killed) before the daemon does; a helper process the agent
        # started may take a moment longer to notice its parent is gone.
        deadline = time.monotonic() + ORPHAN_GRACE_S
        while (left := [pid for pid in pids if alive(pid)]) and time.monotonic() < deadline:
            await trio.sleep(0.1)
        check(not left, f"agent processes left {ORPHAN_GRACE_S:g} s after the daemon "
                        f"stopped: {left}")
    finally:
        daemon.stop()
        (base / "first-daemon.log").write_text(daemon.stderr())
    daemon = start_daemon(base, args, env, data_dir=data, tag="second")
    run.passed(step)
    try:
        async with httpx.AsyncClient(base_url=daemon.url, timeout=timeout) as client, \
                trio.open_nursery() as nursery:
            step = "load"
            resp = await client.post(f"/session/{sid}/load", json={})
            check(resp.status_code == 200, f"load: {resp.status_code} {resp.text}")
            body = resp.json()
            check_replay(body, prompt_ids)
            via = restored_via(daemon, sid)
            restored = body.get("agentSessionRestored")
            run.notes.append(f"load: restored via {via}, agentSessionRestored={restored}")
            lost = via != "session/load"
            if lost and spec.load_may_fail:
                # The agent's own defect; the daemon's part is to say so.
                run.fail_soft(step, restored is False,
                              f"the agent session was recreated (via {via}) but the load "
                              f"answer has agentSessionRestored={restored}")
                run.outcome.setdefault(step, "ok: the agent's session/load failed, "
                                             "reported (agentSessionRestored false)")
            else:
                run.fail_soft(step, not lost, f"the agent's session was not restored by "
                                              f"session/load (via {via})")
                run.fail_soft(step, restored is True,
                              f"the load answer has agentSessionRestored={restored}")
            run.passed(step)
        step = "turn 3"
        async with httpx.AsyncClient(base_url=daemon.url, timeout=timeout) as client, \
                trio.open_nursery() as nursery:
            sub = Subscriber(client, f"/session/{sid}/events",
                             {"Last-Event-ID": str(body["lastEventId"]),
                              "X-Qwen-Event-Epoch": body["eventEpoch"]})
            await nursery.start(sub.run)
            before = len(fakes.seen())
            prompt_ids.append(await run_turn(client, sub, sid, PROBES[2]))
            check_turn(sub.events, prompt_ids[-1], PROBES[2])
            asked = [r for r in fakes.seen()[before:] if r.probe == PROBES[2]]
            check(bool(asked), "the fake got no request for turn 3")
            # Agents make side requests too (a title, a suggestion): one of the turn's
            # requests is the conversation, the one with the most of it.
            longest = max(asked, key=lambda r: len(r.probes))
            remembered = set(PROBES[:2]) <= set(longest.probes)
            run.notes.append(f"turn 3: the agent sent turns 1-2 along: {remembered}")
            run.fail_soft(step, remembered or lost,
                          "the agent lost its context (turns 1-2 not in its turn-3 request)")
            run.passed(step)
            nursery.cancel_scope.cancel()
        step = "replay"
        async with httpx.AsyncClient(base_url=daemon.url, timeout=timeout) as client:
            resp = await client.post(f"/session/{sid}/load", json={})
            check(resp.status_code == 200, f"load: {resp.status_code} {resp.text}")
            check_replay(resp.json(), prompt_ids)
            run.passed(step)
    finally:
        daemon.stop()
        (base / "second-daemon.log").write_text(daemon.stderr())


def leaf(exc: BaseException) -> BaseException:
    """The first exception inside (nested) exception groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _tail(path: Path, lines: int = 60) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


@pytest.fixture()
def fakes() -> Iterator[FakeModels]:
    with serving() as running:
        yield running


@pytest.mark.parametrize("spec", AGENTS, ids=[spec.name for spec in AGENTS])
async def test_agent(spec: AgentSpec, fakes: FakeModels, tmp_path: Path) -> None:
    run = Run(spec)
    reason = skipped_reason(spec)
    if reason is not None or not spec.installed():
        run.outcome = {step: "not run" for step in STEPS}
        run.notes.append(reason or "not installed (run python -m tests.agent_matrix.install)")
        run.save()
        pytest.skip(f"{spec.name}: {run.notes[-1]}")
    failed_at = ""
    try:
        await scenario(run, tmp_path, fakes)
    except BaseException as exc:
        failed_at = next((s for s in STEPS if s not in run.outcome), "?")
        run.outcome[failed_at] = f"FAIL: {leaf(exc)}"[:300]
        for later in STEPS:
            run.outcome.setdefault(later, "not reached")
        raise
    finally:
        run.save()
        (RESULTS / f"{spec.name}-requests.json").write_text(json.dumps(
            [dataclasses.asdict(r) for r in fakes.seen()], indent=0))
        failed_at = failed_at or (run.soft[0].split(":")[0] if run.soft else "")
        if failed_at:
            apis = sorted({f"{r.method} {r.path.split('?')[0]} {r.status}"
                           for r in fakes.seen()})
            print(f"\n--- {spec.name} failed at {failed_at}; fake model server saw: {apis}")
            for log in sorted(tmp_path.glob("*-daemon.log")):
                print(f"--- {log.name} (tail)\n{_tail(log)}")
    assert not run.soft, "; ".join(run.soft)


def table() -> str:
    """The results of the last run, one row per agent (a markdown table)."""
    rows = ["| agent | version | " + " | ".join(STEPS) + " | notes |",
            "|---|---|" + "---|" * len(STEPS) + "---|"]
    for spec in AGENTS:
        path = RESULTS / f"{spec.name}.json"
        if not path.exists():
            rows.append(f"| {spec.name} | {spec.version} | " + " | ".join(
                "not run" for _ in STEPS) + " | |")
            continue
        result = json.loads(path.read_text())
        seconds = result.get("seconds", {})
        cells = [result["steps"].get(step, "?").replace("|", "/")[:80]
                 + (f" ({seconds[step]:g} s)" if step in seconds else "") for step in STEPS]
        notes = "; ".join(result["notes"]).replace("|", "/")
        rows.append(f"| {spec.name} | {result['version']} | " + " | ".join(cells)
                    + f" | {notes} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(table())
    sys.exit(0)
