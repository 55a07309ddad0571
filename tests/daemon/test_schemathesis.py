"""Schemathesis against the real daemon: the served ``/openapi.json`` and the daemon agree.

The document is generated from the same ``sdk.protocol.http`` types the daemon validates
request bodies with; this test is the outside check that the two really agree. Schemathesis
(its CLI, in a subprocess) runs every check (``--checks all``: server errors, status codes,
content types, response headers and bodies against their schemas, schema-valid requests
accepted, schema-invalid ones refused, missing headers, unsupported methods and their ``Allow``,
use after delete, resource availability, auth actually enforced) over the stateless phases
(examples, coverage, fuzzing) and the stateful one (links between operations, inferred from the
responses). The event stream never ends by itself and the WebSocket route is an upgrade, so both
are left out; ``tests/daemon/test_fuzz_http.py`` and the stream tests cover them.

Deterministic (``--generation-deterministic``) and bounded (few examples per operation). The
one finding dropped is a schema-valid request refused for a state-dependent reason
(``tests/schemathesis_hooks.py`` lists them, exactly).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.harness import RunningDaemon, running_daemon
from tests.schemathesis_hooks import state_dependent_refusal

pytestmark = pytest.mark.processes  # starts processes: not in make unit-fast

TOKEN = "schemathesis-token"
ROOT = Path(__file__).resolve().parents[2]
MAX_EXAMPLES = 8
RUN_TIMEOUT_S = 240


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    env = {"MOCK_ACP_PROMPT_DELAY_MS": "0"}
    with running_daemon(tmp_path_factory.mktemp("schemathesis"), ["--token", TOKEN],
                        env=env) as d:
        yield d


def run_schemathesis(daemon: RunningDaemon, workdir: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["SCHEMATHESIS_HOOKS"] = "tests.schemathesis_hooks"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    argv = [sys.executable, "-c", "import sys; from schemathesis.cli import schemathesis; "
            "sys.argv[0] = 'schemathesis'; sys.exit(schemathesis())",
            "run", f"{daemon.url}/openapi.json",
            "--header", f"Authorization: Bearer {TOKEN}",
            "--checks", "all",
            "--phases", "examples,coverage,fuzzing,stateful",
            "--exclude-path-regex", r"^/session/\{sessionId\}/(events|ws)$",
            "--max-examples", str(MAX_EXAMPLES),
            "--generation-deterministic",
            "--workers", "1",
            "--request-timeout", "20",
            "--no-color"]
    return subprocess.run(argv, cwd=workdir, env=env, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S, check=False)


def test_schemathesis_finds_nothing(daemon: RunningDaemon, tmp_path: Path) -> None:
    result = run_schemathesis(daemon, tmp_path)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-6000:]
    # It really ran, every phase, over the operations it was given.
    assert "19 selected / 21 total" in out, out[-3000:]
    for phase in ("Coverage", "Fuzzing", "Stateful"):
        assert f"✅  {phase}" in out, (phase, out[-3000:])
    assert "no issues found" in out.lower() or " passed" in out, out[-3000:]
    log = daemon.stderr()
    assert "event=internal_error" not in log and "Traceback" not in log, log[-4000:]


def test_only_state_dependent_refusals_are_dropped(daemon: RunningDaemon) -> None:
    """The hook's exemption is as narrow as it says: the schema-describable 400s of the same
    codes (relative cwd, both cursors, a malformed client id) are not exempt."""
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=daemon.url, headers=auth, timeout=10) as client:
        created = client.post("/session", json={"sessionScope": "thread"}).json()
        sid = created["sessionId"]
        cases = {
            "missing dir": client.post("/session", json={"cwd": "/nonexistent-tk-dir/x"}),
            "unregistered client": client.post(f"/session/{sid}/cancel",
                                               headers={"X-Qwen-Client-Id": "stranger"}),
            "unknown record": client.get(f"/session/{sid}/transcript",
                                         params={"beforeRecordId": "no-such-record"}),
        }
        schema_errors = {
            "relative cwd": client.post("/session", json={"cwd": "relative"}),
            "empty cwd": client.post("/session", json={"cwd": ""}),
            "both cursors": client.get(f"/session/{sid}/transcript",
                                       params={"cursor": "a", "beforeRecordId": "b"}),
            "bad client id": client.post(f"/session/{sid}/cancel",
                                         headers={"X-Qwen-Client-Id": "a b"}),
        }
    for name, resp in cases.items():
        assert state_dependent_refusal(resp.status_code, resp.content), (name, resp.text)
    for name, resp in schema_errors.items():
        assert resp.status_code == 400, (name, resp.text)
        assert state_dependent_refusal(resp.status_code, resp.content) is None, (name, resp.text)
