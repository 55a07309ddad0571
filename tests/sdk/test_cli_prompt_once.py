"""``turnkeeper prompt`` submits its prompt exactly once and says what it knows when it cannot
tell: the command as a subprocess against a real daemon, through the fault-injecting proxy
(tests/fault_proxy.py), the mock agent's prompt log as the witness of what ran.

- The first send reaches the daemon and its answer is cut, the resend is answered 500 by the
  proxy (a failing gateway; not resent): the command asks the daemon by the key, says the
  prompt was admitted, prints the command that resends it with ``--key`` and exits 8. Running
  that command follows the admitted prompt to its end (the same prompt id, its answer) and the
  agent ran it once.
- Every send's answer cut and ``--timeout`` expiring with no 202 seen: the command finds the
  admitted prompt by its key and cancels it on the daemon.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from sdk import DaemonClient
from tests.fault_proxy import Chaos, ChaosPlan, FaultProxy, Request
from tests.harness import RunningDaemon, running_daemon

pytestmark = pytest.mark.processes  # starts processes: not in make unit-fast

ROOT = Path(__file__).resolve().parents[2]
DEADLINE_S = 60.0
PROMPT_PATH = r"/session/[^/]+/prompt$"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    with running_daemon(tmp_path_factory.mktemp("cli-once")) as d:
        yield d


def cut_answers(first_only: bool) -> tuple[list[Request], ChaosPlan]:
    """A chaos plan cutting the answer of the first prompt send (``first_only``) or of every
    one, after the request reached the daemon; and the list of prompt sends it saw."""
    seen: list[Request] = []

    def plan(request: Request) -> Chaos | None:
        if request.method != "POST" or not request.path.endswith("/prompt"):
            return None
        seen.append(request)
        if first_only and len(seen) > 1:
            return None
        return Chaos("cut_after_request", reset=len(seen) % 2 == 0)

    return seen, plan


async def run_cli(*args: str) -> tuple[int, str, str]:
    done = await anyio.run_process([sys.executable, "-m", "sdk", *args], cwd=ROOT, check=False)
    return done.returncode, done.stdout.decode(), done.stderr.decode()


def runs_of(daemon: RunningDaemon, text: str) -> int:
    return sum(json.loads(line)["text"] == text for line in daemon.prompts())


async def test_an_unknown_outcome_is_reported_and_the_printed_resend_runs_it_once(
        daemon: RunningDaemon) -> None:
    text = "cli-once-1 mock:chunks=2"
    async with DaemonClient(daemon.url) as direct:
        sid = (await direct.create_session(scope="thread")).session_id
    proxy = FaultProxy(daemon.url)
    seen, plan = cut_answers(first_only=True)
    proxy.chaos = plan
    # The second send: a 500 from the proxy (a failing gateway), which is not sent again.
    proxy.fail("POST", PROMPT_PATH, status=500, body={"error": "bad gateway", "code": "x"},
               skip=1)
    with anyio.fail_after(DEADLINE_S):
        async with anyio.create_task_group() as nursery:
            await nursery.start(proxy.run)
            code, out, err = await run_cli("--url", proxy.url, "--json", "prompt", sid,
                                           *text.split())
            nursery.cancel_scope.cancel()
    assert code == 8, (code, out, err)
    # The first send was admitted (the daemon answered it; the answer was cut on its way).
    [first] = seen
    key = first.headers["idempotency-key"]
    found = re.search(r"the daemon admitted it as prompt (\S+), which is (\w+)", err)
    assert found is not None, err
    prompt_id, state = found.groups()
    assert state in ("queued", "running", "completed"), err
    # --json: the same report as one object on stdout.
    [report] = [json.loads(line) for line in out.splitlines()]
    assert report["code"] == "prompt_outcome_unknown" and report["idempotencyKey"] == key
    assert (report["admitted"], report["promptId"], report["state"]) == (True, prompt_id, state)
    resend = err.rsplit("follow it: ", 1)[1].strip()
    assert shlex.split(resend) == ["turnkeeper", "prompt", sid, *text.split(), "--key", key]

    # The printed command, run again (directly this time): the same prompt, followed to its
    # end, not run a second time.
    with anyio.fail_after(DEADLINE_S):
        code, out, err = await run_cli("--url", daemon.url, *shlex.split(resend)[1:])
    assert code == 0, (code, out, err)
    assert out.endswith(f"[turn_complete stopReason=end_turn prompt={prompt_id}]\n"), out
    assert "chunk-0" in out, out
    assert runs_of(daemon, text) == 1


async def test_a_timeout_before_any_answer_finds_the_admitted_prompt_and_cancels_it(
        daemon: RunningDaemon) -> None:
    text = "cli-once-2 mock:chunks=1 mock:gate=cli-once-never"
    async with DaemonClient(daemon.url) as direct:
        sid = (await direct.create_session(scope="thread")).session_id
        proxy = FaultProxy(daemon.url)
        seen, plan = cut_answers(first_only=False)
        proxy.chaos = plan
        with anyio.fail_after(DEADLINE_S):
            async with anyio.create_task_group() as nursery:
                await nursery.start(proxy.run)
                code, out, err = await run_cli("--url", proxy.url, "prompt", sid, *text.split(),
                                               "--timeout", "2")
                nursery.cancel_scope.cancel()
        assert code == 124, (code, out, err)
        keys = {r.headers["idempotency-key"] for r in seen}
        assert len(seen) >= 1 and len(keys) == 1
        found = await direct.find_prompt(sid, keys.pop())
        assert found is not None
        assert err == (f"turnkeeper: timed out after 2 s; prompt {found.prompt_id} was cancelled "
                       "on the daemon\n")
        with anyio.fail_after(DEADLINE_S):
            while found is not None and found.state in ("queued", "running"):
                await anyio.sleep(0.05)  # polled: the daemon pushes no "ended" to a GET
                found = await direct.find_prompt(sid, found.idempotency_key)
        assert found is not None and found.state == "cancelled"
    assert runs_of(daemon, text) == 1
