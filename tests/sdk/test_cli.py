"""``python -m sdk`` as a subprocess against the real daemon: create → prompt → load (with the
live marker's status text mid-turn), ``--json`` output, ``watch``, errors and exit codes."""

from __future__ import annotations

import argparse
import json
import os
import pty
import re
import selectors
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.builders.cli import ROOT, argv, cli, cli_env
from tests.harness import RunningDaemon, running_daemon, start_daemon

pytestmark = pytest.mark.processes  # starts processes: not in make unit-fast

WAIT_S = 30.0
UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
LIVE_TEXT_RE = re.compile(
    r"^liveJournal: History truncated for live turn replay: kept the latest \d+ source events "
    r"and dropped [1-9]\d* older source events \(limits: 3 replay entries / 300 bytes\)\. "
    r"Complete content remains available after the turn finishes\.$",
    re.MULTILINE,
)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    base = tmp_path_factory.mktemp("sdk-cli")
    with running_daemon(base, ["--max-journal-events", "3", "--max-journal-bytes", "300"]) as d:
        yield d


def read_until(
    proc: subprocess.Popen[bytes], needle: bytes, stream: str = "stdout"
) -> bytes:
    """Read the child's stdout (or stderr) as it streams until ``needle`` shows up (or fail)."""
    pipe = proc.stdout if stream == "stdout" else proc.stderr
    assert pipe is not None
    seen = b""
    with selectors.DefaultSelector() as sel:
        sel.register(pipe, selectors.EVENT_READ)
        deadline = time.monotonic() + WAIT_S
        while needle not in seen:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no {needle!r} in the output so far: {seen[-500:]!r}"
            if sel.select(remaining):
                chunk = os.read(pipe.fileno(), 65536)
                assert chunk, f"the command exited before printing {needle!r}: {seen[-500:]!r}"
                seen += chunk
    return seen


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_create_prompt_and_load_show_the_answer_and_the_marker(daemon: RunningDaemon) -> None:
    created = cli(daemon.url, "create")
    assert created.returncode == 0, created.stderr
    session_id = created.stdout.strip()
    assert UUID_RE.match(session_id)

    answered = cli(daemon.url, "prompt", session_id, "hello", "mock:chunks=3")
    assert answered.returncode == 0, answered.stderr
    lines = answered.stdout.splitlines()
    assert lines[0] == "chunk-0chunk-1chunk-2"
    assert lines[1].startswith("[turn_complete stopReason=end_turn prompt=")

    held = subprocess.Popen(
        argv(daemon.url, "prompt", session_id, "twenty mock:chunks=20 mock:gate=cli-held"),
        cwd=ROOT,
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        streamed = read_until(held, b"chunk-19")
        assert streamed.startswith(b"chunk-0chunk-1")
        mid = cli(daemon.url, "load", session_id)
        assert mid.returncode == 0, mid.stderr
        assert f"session {session_id} (a prompt is running)" in mid.stdout
        assert LIVE_TEXT_RE.search(mid.stdout), mid.stdout
    finally:
        daemon.open_gate("cli-held")
        out, err = held.communicate(timeout=WAIT_S)
    assert held.returncode == 0, err
    assert b"[turn_complete stopReason=end_turn" in out

    after = cli(daemon.url, "load", session_id)
    assert after.returncode == 0, after.stderr
    assert "liveJournal: 0 entries, 0 bytes" in after.stdout
    assert "no history was truncated" in after.stdout
    assert re.search(r"^compactedReplay: [1-9]\d* entries, [1-9]\d* bytes$", after.stdout, re.M)


def test_json_output_is_one_object_per_line(daemon: RunningDaemon) -> None:
    created = cli(daemon.url, "--json", "create")
    assert created.returncode == 0, created.stderr
    body = json.loads(created.stdout)
    session_id = body["sessionId"]
    assert body["clientId"].startswith("client_") and body["eventEpoch"]

    answered = cli(daemon.url, "--json", "prompt", session_id, "json mock:chunks=2")
    assert answered.returncode == 0, answered.stderr
    frames = [json.loads(line) for line in answered.stdout.splitlines()]
    assert frames[-1]["type"] == "turn_complete"
    prompt_id = frames[-1]["data"]["promptId"]
    assert all(f["promptId"] == prompt_id for f in frames)
    texts = [
        f["data"]["update"]["content"]["text"]
        for f in frames
        if f["type"] == "session_update"
        and f["data"]["update"]["sessionUpdate"] == "agent_message_chunk"
    ]
    assert texts == ["chunk-0", "chunk-1"]

    loaded = cli(daemon.url, "--json", "load", session_id)
    assert loaded.returncode == 0, loaded.stderr
    (line,) = loaded.stdout.splitlines()
    summary = json.loads(line)
    assert summary["sessionId"] == session_id and summary["hasActivePrompt"] is False
    assert summary["liveJournal"] == {"entries": 0, "bytes": 0}
    assert summary["compactedReplay"]["entries"] > 0 and summary["markers"] == []


def test_turn_error_exits_non_zero(daemon: RunningDaemon) -> None:
    session_id = cli(daemon.url, "create").stdout.strip()
    failed = cli(daemon.url, "prompt", session_id, "no", "mock:mode=reject")
    assert failed.returncode == 1
    assert failed.stderr == "turnkeeper: turn failed: injected error (-32603)\n"


def test_watch_follows_events_until_the_session_is_gone(daemon: RunningDaemon) -> None:
    session_id = cli(daemon.url, "create").stdout.strip()
    assert cli(daemon.url, "prompt", session_id, "watched mock:chunks=2").returncode == 0
    watcher = subprocess.Popen(
        argv(daemon.url, "watch", session_id, "--from", "0"),
        cwd=ROOT,
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        head = read_until(watcher, b"turn_complete")
        httpx.delete(f"{daemon.url}/session/{session_id}", timeout=WAIT_S).raise_for_status()
        rest, err = watcher.communicate(timeout=WAIT_S)
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.wait()
    lines = (head + rest).decode().splitlines()
    assert re.match(
        r'^#\d+ session_update agent_message_chunk prompt=[0-9a-f]{8} "chunk-0"$',
        next(line for line in lines if "chunk-0" in line),
    )
    assert any(
        re.match(r"^#\d+ turn_complete prompt=[0-9a-f]{8} stopReason=end_turn$", line)
        for line in lines
    )
    assert any(line.startswith("#") and " session_closed" in line for line in lines)
    # The stream ended, the reader reconnected from its cursor and found the session gone.
    assert watcher.returncode == 5
    assert err.decode().startswith(f"turnkeeper: no session '{session_id}' at ")


def test_unreachable_daemon_and_bad_url_give_one_line_errors() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    unreachable = cli(url, "create")
    assert unreachable.returncode == 3 and unreachable.stdout == ""
    # One line: the URL tried, why, and what to do; no exception reprs.
    assert unreachable.stderr == (
        f"turnkeeper: cannot reach the daemon at {url} (connection refused): is "
        "turnkeeper-daemon running? start it with make serve (or turnkeeper-daemon)\n")

    bad = cli("not-a-url", "load", "x")
    assert bad.returncode == 2
    assert bad.stderr.startswith("turnkeeper: invalid --url: ")
    assert bad.stderr.count("\n") == 1


def test_missing_session_and_token_handling(tmp_path: Path) -> None:
    with running_daemon(tmp_path, ["--token", "cli-secret"]) as daemon:
        refused = cli(daemon.url, "create")
        assert refused.returncode == 4
        assert refused.stderr.startswith(f"turnkeeper: unauthorized at {daemon.url}: ")
        by_env = cli(daemon.url, "create", env={"QWEN_SERVER_TOKEN": "cli-secret"})
        assert by_env.returncode == 0 and UUID_RE.match(by_env.stdout.strip())
        missing = cli(daemon.url, "--token", "cli-secret", "load", "no-such-session")
        assert missing.returncode == 5
        assert missing.stderr.startswith("turnkeeper: no session 'no-such-session' at ")


# --- issue 14: help, version, environment ---------------------------------------------------------


def test_every_option_has_help_with_its_default() -> None:
    from sdk.cli import build_parser

    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    checked = []
    for name, sub in [("turnkeeper", parser), *subparsers.choices.items()]:
        for action in sub._actions:
            if not action.option_strings or action.dest in ("help", "version"):
                continue
            assert action.help, f"{name} {action.option_strings} has no help"
            assert "default" in action.help, f"{name} {action.option_strings} shows no default"
            checked.append(action.option_strings[-1])
    assert {"--url", "--token", "--json", "--approve", "--timeout", "--from", "--live"} <= set(
        checked
    )


def test_version_and_url_from_the_environment(daemon: RunningDaemon) -> None:
    from sdk.cli import version

    shown = subprocess.run(
        [sys.executable, "-m", "sdk", "--version"], cwd=ROOT, env=cli_env(),
        capture_output=True, text=True, timeout=WAIT_S, check=False,
    )
    assert shown.returncode == 0 and shown.stdout == f"turnkeeper {version()}\n"
    from sdk.protocol import __version__
    assert version() == __version__

    def run(*args: str, url_env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "sdk", *args], cwd=ROOT, env=cli_env({"TURNKEEPER_URL": url_env}),
            capture_output=True, text=True, timeout=WAIT_S, check=False,
        )

    by_env = run("create", url_env=daemon.url)
    assert by_env.returncode == 0 and UUID_RE.match(by_env.stdout.strip()), by_env.stderr
    dead = f"http://127.0.0.1:{free_port()}"
    assert run("create", url_env=dead).returncode == 3
    # --url wins over the environment.
    assert run("--url", daemon.url, "create", url_env=dead).returncode == 0


def test_help_names_the_url_the_environment_gives(monkeypatch: pytest.MonkeyPatch) -> None:
    from sdk.cli import build_parser

    monkeypatch.setenv("TURNKEEPER_URL", "http://127.0.0.1:9999")
    helped = " ".join(build_parser().format_help().split())
    assert "now http://127.0.0.1:9999" in helped and "TURNKEEPER_URL" in helped


# --- issue 14: watch shows the replay by default ----------------------------------------------


def test_watch_starts_with_the_replay_then_follows_live(daemon: RunningDaemon) -> None:
    session_id = cli(daemon.url, "create").stdout.strip()
    assert cli(daemon.url, "prompt", session_id, "earlier mock:chunks=2").returncode == 0
    watcher = subprocess.Popen(
        argv(daemon.url, "watch", session_id), cwd=ROOT, env=cli_env(),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        head = read_until(watcher, b" --\n")
        later = cli(daemon.url, "prompt", session_id, "later mock:chunks=1")
        assert later.returncode == 0
        head += read_until(watcher, b"stopReason=end_turn\n")
    finally:
        watcher.kill()
        watcher.wait()
    replay, _, live = head.decode().partition(" replayed; live after #")
    # The earlier turn, compacted: the echo, the merged answer, the terminal.
    assert '"earlier mock:chunks=2"' in replay and '"chunk-0chunk-1"' in replay
    assert re.search(r"turn_complete prompt=[0-9a-f]{8} stopReason=end_turn", replay)
    assert '"later mock:chunks=1"' in live and '"chunk-0"' in live
    assert "earlier" not in live


# --- issue 14: the CLI restores a session after a daemon restart -------------------------------


def test_prompt_and_watch_restore_the_session_after_a_daemon_restart(tmp_path: Path) -> None:
    data = tmp_path / "data"
    # The first daemon picks its own port (a port chosen beforehand can be taken by another
    # test's process before the daemon binds it); the second binds the same one.
    first = start_daemon(tmp_path, ["--port", "0"], data_dir=data, tag="first")
    port = int(first.url.rsplit(":", 1)[1].split("/")[0])
    try:
        session_id = cli(first.url, "create").stdout.strip()
        assert cli(first.url, "prompt", session_id, "before mock:chunks=1").returncode == 0
        watcher = subprocess.Popen(
            argv(first.url, "watch", session_id, "--live"), cwd=ROOT, env=cli_env(),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        # The watcher is connected once the daemon counts a subscriber for the session.
        wait_until(lambda: subscribers(first.url, session_id) >= 1)
    finally:
        first.stop()
    try:
        with running_daemon(tmp_path, ["--port", str(port)], data_dir=data, tag="second") as again:
            assert again.url == first.url
            # No `turnkeeper load` first: the prompt restores the session by itself.
            answered = cli(again.url, "prompt", session_id, "after restart mock:chunks=2")
            assert answered.returncode == 0, answered.stderr
            assert answered.stdout.splitlines()[0] == "chunk-0chunk-1"
            # The watcher reconnected across the restart and shows the new turn.
            seen = read_until(watcher, b"stopReason=end_turn")
            assert b"session_closed" in seen  # the first daemon's shutdown
            assert b'"after restart mock:chunks=2"' in seen
            assert watcher.poll() is None
            # A session that never existed is still "no session", after one restore attempt.
            missing = cli(again.url, "prompt", "no-such-session", "hi")
            assert missing.returncode == 5
            assert missing.stderr.startswith("turnkeeper: no session 'no-such-session' at ")
    finally:
        if watcher.poll() is None:
            watcher.kill()
        watcher.wait()
def subscribers(url: str, session_id: str) -> int:
    body = httpx.get(f"{url}/session/{session_id}/status", timeout=WAIT_S).json()
    return int(body["subscribers"])


def wait_until(predicate: Callable[[], bool]) -> None:
    """Poll the daemon's own state with a bounded deadline (never a fixed sleep)."""
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.02)


# --- issue 14: permission requests --------------------------------------------------------------

LIB_AGENT = ROOT / "tests" / "agents" / "acp_lib_agent.py"


@pytest.fixture(scope="module")
def lib_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    agent = shlex.join([sys.executable, str(LIB_AGENT)])
    with running_daemon(tmp_path_factory.mktemp("cli-perm"), ["--agent", agent],
                        env={"ACP_LIB_AGENT_CHUNKS": "1"}) as d:
        yield d


ASKED = "turnkeeper: permission requested: write a file (tool call call-1)\n"


def test_approve_flag_answers_the_permission_request(lib_daemon: RunningDaemon) -> None:
    session_id = cli(lib_daemon.url, "create").stdout.strip()
    done = cli(lib_daemon.url, "prompt", session_id, "please ask-permission",
               "--approve", "allow-once")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "permission:allow-oncelib-chunk-0"
    assert done.stderr == ASKED + "turnkeeper: answered: Allow [allow_once] (--approve allow-once)\n"
    rejected = cli(lib_daemon.url, "prompt", session_id, "please ask-permission",
                   "--approve", "reject-once")
    assert rejected.returncode == 0, rejected.stderr
    assert rejected.stdout.splitlines()[0] == "permission:reject-oncelib-chunk-0"
    # The agent offers no allow_always option: the request is cancelled, never widened.
    widest = cli(lib_daemon.url, "prompt", session_id, "please ask-permission",
                 "--approve", "allow-always")
    assert widest.returncode == 0, widest.stderr
    assert widest.stdout.splitlines()[0] == "permission:cancelledlib-chunk-0"
    assert "no option of that kind, cancelled" in widest.stderr


def test_without_a_terminal_or_a_flag_the_prompt_is_cancelled_and_exits_7(
    lib_daemon: RunningDaemon,
) -> None:
    session_id = cli(lib_daemon.url, "create").stdout.strip()
    refused = subprocess.run(
        argv(lib_daemon.url, "prompt", session_id, "please ask-permission"), cwd=ROOT,
        env=cli_env(), stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=WAIT_S, check=False,
    )
    assert refused.returncode == 7, refused.stderr
    assert refused.stderr.startswith(ASKED)
    assert "stdin is not a terminal" in refused.stderr and "--approve" in refused.stderr
    # The agent was told "cancelled", and nothing is left running on the daemon.
    assert "permission:cancelled" in refused.stdout
    status = httpx.get(f"{lib_daemon.url}/session/{session_id}/status", timeout=WAIT_S).json()
    assert status["hasActivePrompt"] is False


def test_on_a_terminal_the_user_picks_the_option(lib_daemon: RunningDaemon) -> None:
    session_id = cli(lib_daemon.url, "create").stdout.strip()
    leader, follower = pty.openpty()
    try:
        proc = subprocess.Popen(
            argv(lib_daemon.url, "prompt", session_id, "please ask-permission"), cwd=ROOT,
            env=cli_env(), stdin=follower, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        os.close(follower)
        question = read_until(proc, b"answer (1-2, c): ", stream="stderr")
        os.write(leader, b"7\n")  # out of range: asked again
        question += read_until(proc, b"please answer 1-2, c\nanswer (1-2, c): ", stream="stderr")
        os.write(leader, b"2\n")
        out, err = proc.communicate(timeout=WAIT_S)
    finally:
        os.close(leader)
    assert proc.returncode == 0, err
    assert question.decode().startswith(
        ASKED + "  1) Allow [allow_once]\n  2) Reject [reject_once]\n  c) cancel the request\n"
    )
    assert out.decode().splitlines()[0] == "permission:reject-oncelib-chunk-0"
    assert err.decode() == "turnkeeper: answered: Reject [reject_once] (your answer)\n"


# --- issue 14: prompt --timeout -------------------------------------------------------------------


def test_timeout_cancels_the_running_prompt_on_the_daemon(daemon: RunningDaemon) -> None:
    session_id = cli(daemon.url, "create").stdout.strip()
    started = time.monotonic()
    expired = cli(daemon.url, "prompt", session_id, "slow mock:chunks=1 mock:gate=cli-never",
                  "--timeout", "1.5")
    elapsed = time.monotonic() - started
    assert expired.returncode == 124, expired.stderr
    match = re.fullmatch(
        r"turnkeeper: timed out after 1\.5 s; prompt (\S+) was cancelled on the daemon\n",
        expired.stderr,
    )
    assert match, expired.stderr
    assert expired.stdout == "chunk-0\n"
    assert elapsed < WAIT_S
    # The daemon ended exactly that prompt, as cancelled.
    wait_until(lambda: not status_of(daemon.url, session_id)["hasActivePrompt"])
    body = httpx.post(f"{daemon.url}/session/{session_id}/load", json={}, timeout=WAIT_S).json()
    (terminal,) = [t for t in body["promptTerminals"] if t["promptId"] == match.group(1)]
    assert terminal["terminal"] == "cancelled" and terminal["stopReason"] == "cancelled"


def test_timeout_leaves_another_clients_running_prompt_alone(daemon: RunningDaemon) -> None:
    session_id = cli(daemon.url, "create").stdout.strip()
    held = httpx.post(f"{daemon.url}/session/{session_id}/prompt", timeout=WAIT_S, json={
        "prompt": [{"type": "text", "text": "held mock:chunks=1 mock:gate=cli-other"}]}).json()
    try:
        expired = cli(daemon.url, "prompt", session_id, "queued mock:chunks=1", "--timeout", "1")
        assert expired.returncode == 124
        assert "is still queued behind another prompt" in expired.stderr, expired.stderr
        status = status_of(daemon.url, session_id)
        assert status["hasActivePrompt"] and status["activePromptId"] == held["promptId"]
    finally:
        daemon.open_gate("cli-other")
    wait_until(lambda: not status_of(daemon.url, session_id)["hasActivePrompt"])
    body = httpx.post(f"{daemon.url}/session/{session_id}/load", json={}, timeout=WAIT_S).json()
    stops = {t["promptId"]: t.get("stopReason") for t in body["promptTerminals"]}
    assert stops[held["promptId"]] == "end_turn"


def status_of(url: str, session_id: str) -> dict[str, object]:
    body: dict[str, object] = httpx.get(f"{url}/session/{session_id}/status",
                                        timeout=WAIT_S).json()
    return body


# --- issue 35: a complete command line ---------------------------------------------------------------


def test_a_usage_error_shows_the_commands_own_usage() -> None:
    done = subprocess.run(argv("http://127.0.0.1:9", "create", "--bogus"), cwd=ROOT,
                          env=cli_env(), capture_output=True, text=True, timeout=WAIT_S)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("usage: turnkeeper create ")
    assert done.stderr.rstrip().endswith("turnkeeper create: error: unrecognized arguments: --bogus")
    missing = subprocess.run(argv("http://127.0.0.1:9", "status"), cwd=ROOT, env=cli_env(),
                             capture_output=True, text=True, timeout=WAIT_S)
    assert missing.returncode == 2 and missing.stderr.startswith("usage: turnkeeper status ")


def test_a_relative_cwd_is_the_directory_the_command_runs_in(
        daemon: RunningDaemon, tmp_path: Path) -> None:
    (tmp_path / "project").mkdir()
    done = subprocess.run([*argv(daemon.url, "--json", "create", "--cwd", "project")],
                          cwd=tmp_path, env={**cli_env(), "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=WAIT_S)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["workspaceCwd"] == os.path.realpath(tmp_path / "project")


def test_list_status_cancel_and_close(daemon: RunningDaemon) -> None:
    sid = cli(daemon.url, "create").stdout.strip()
    idle = cli(daemon.url, "create").stdout.strip()
    held = subprocess.Popen(argv(daemon.url, "prompt", sid, "held mock:chunks=1 mock:gate=cli-list"),
                            cwd=ROOT, env=cli_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        read_until(held, b"chunk-0")
        listed = cli(daemon.url, "list")
        assert listed.returncode == 0, listed.stderr
        header, *rows = listed.stdout.splitlines()
        assert header.split() == ["SESSION", "STATE", "LAST", "ACTIVITY", "WORKSPACE"]
        mine = {row.split()[0]: row for row in rows}
        assert re.match(rf"^{sid}  running\s+\d+ s ago\s+/", mine[sid]), mine[sid]
        assert re.match(rf"^{idle}  idle\s+\d+ s ago\s+/", mine[idle]), mine[idle]
        # --json before or after the command: one object per session.
        for args in (("--json", "list"), ("list", "--json")):
            objects = [json.loads(line) for line in cli(daemon.url, *args).stdout.splitlines()]
            by_id = {o["sessionId"]: o for o in objects}
            assert by_id[sid]["state"] == "running" and by_id[idle]["state"] == "idle"
            assert by_id[sid]["lastActivityAt"] >= by_id[sid]["createdAt"]
        status = cli(daemon.url, "status", sid)
        assert status.returncode == 0
        lines = status.stdout.splitlines()
        assert lines[0] == f"session {sid}"
        assert re.fullmatch(r"state: running prompt [0-9a-f-]{36}", lines[2]), lines
        raw = httpx.get(f"{daemon.url}/session/{sid}/status", timeout=WAIT_S).json()
        as_json = json.loads(cli(daemon.url, "status", sid, "--json").stdout)
        assert as_json["activePromptId"] == raw["activePromptId"]
        assert set(as_json) - {"serverTime"} == set(raw) - {"serverTime"}
        cancelled = cli(daemon.url, "cancel", sid)
        assert cancelled.returncode == 0
        assert cancelled.stdout.startswith(f"asked the agent to cancel prompt {raw['activePromptId']}")
        out, _ = held.communicate(timeout=WAIT_S)
        assert b"[turn_complete stopReason=cancelled" in out
    finally:
        if held.poll() is None:
            held.kill()
            held.wait()
    nothing = cli(daemon.url, "--json", "cancel", idle)
    assert json.loads(nothing.stdout) == {"sessionId": idle, "promptId": None,
                                          "cancelRequested": False}
    closed = cli(daemon.url, "close", idle)
    assert closed.returncode == 0 and closed.stdout == f"closed session {idle}\n"
    gone = cli(daemon.url, "status", idle)
    assert gone.returncode == 5 and gone.stderr.startswith(f"turnkeeper: no session '{idle}'")
    assert idle not in cli(daemon.url, "list").stdout


def test_release_opens_a_mock_gate(daemon: RunningDaemon) -> None:
    sid = cli(daemon.url, "create").stdout.strip()
    held = subprocess.Popen(argv(daemon.url, "prompt", sid, "gated mock:chunks=1 mock:gate=by-cli"),
                            cwd=ROOT, env=cli_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        read_until(held, b"chunk-0")
        # The daemon's gate directory comes from the same variable the daemon read.
        released = cli(daemon.url, "--json", "release", "by-cli",
                       env={"MOCK_ACP_GATE_DIR": str(daemon.gate_dir)})
        assert released.returncode == 0, released.stderr
        assert json.loads(released.stdout) == {"gate": "by-cli", "released": True,
                                               "path": str(daemon.gate_dir / "by-cli"),
                                               "wasOpen": False}
        out, _ = held.communicate(timeout=WAIT_S)
        assert held.returncode == 0 and b"[turn_complete stopReason=end_turn" in out
    finally:
        if held.poll() is None:
            held.kill()
            held.wait()
    text = cli(daemon.url, "release", "by-cli", "--gate-dir", str(daemon.gate_dir))
    assert text.stdout == f"released gate by-cli (it was already open): {daemon.gate_dir}/by-cli\n"
    bad = cli(daemon.url, "release", "../escape", "--gate-dir", str(daemon.gate_dir))
    assert bad.returncode == 2 and "plain file name" in bad.stderr
    nowhere = cli(daemon.url, "release", "x", "--gate-dir", str(daemon.gate_dir / "nope"))
    assert nowhere.returncode == 2 and "no gate directory at" in nowhere.stderr


def test_release_finds_the_gates_where_the_daemon_puts_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from daemon.config import parse_config
    from sdk.cli.gates import gate_dir

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.delenv("MOCK_ACP_GATE_DIR", raising=False)
    monkeypatch.delenv("TURNKEEPER_DATA_DIR", raising=False)
    for extra in ({}, {"TURNKEEPER_DATA_DIR": str(tmp_path / "data")},
                  {"MOCK_ACP_GATE_DIR": str(tmp_path / "gates")}):
        env = {**os.environ, **extra}
        assert gate_dir(None, env) == parse_config([], environ=env).mock_gate_dir(env), extra


def test_watch_shows_no_protocol_internals_and_json_is_the_wire(daemon: RunningDaemon) -> None:
    sid = cli(daemon.url, "create").stdout.strip()
    assert cli(daemon.url, "prompt", sid, "wire mock:chunks=2").returncode == 0
    text = cli(daemon.url, "watch", sid, "--from", "0", "--until-idle")
    assert text.returncode == 0, text.stderr
    assert "replay_complete" not in text.stdout and "#-" not in text.stdout
    assert text.stdout.splitlines()[-1].startswith("#") and "turn_complete" in text.stdout
    as_json = cli(daemon.url, "--json", "watch", sid, "--from", "0", "--until-idle")
    assert as_json.returncode == 0, as_json.stderr
    printed = as_json.stdout.splitlines()
    # The same frames, byte for byte, as a raw SSE stream of the ring carries them.
    wire: list[str] = []
    with httpx.stream("GET", f"{daemon.url}/session/{sid}/events",
                      headers={"Last-Event-ID": "0"}, timeout=WAIT_S) as stream:
        for line in stream.iter_lines():
            if line.startswith("data: "):
                wire.append(line[len("data: "):])
                if '"turn_complete"' in line:
                    break
    assert printed[:len(wire)] == wire
    assert all(json.loads(line)["v"] == 1 for line in printed)


def test_watch_until_idle_returns_when_the_last_turn_ends(daemon: RunningDaemon) -> None:
    sid = cli(daemon.url, "create").stdout.strip()
    assert cli(daemon.url, "watch", sid, "--until-idle").returncode == 0  # idle: at once
    held = subprocess.Popen(argv(daemon.url, "prompt", sid, "wait mock:chunks=1 mock:gate=idle1"),
                            cwd=ROOT, env=cli_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    read_until(held, b"chunk-0")  # the turn runs
    watcher = subprocess.Popen(argv(daemon.url, "watch", sid, "--until-idle"), cwd=ROOT,
                               env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        read_until(watcher, b" --\n")
        assert watcher.poll() is None  # still watching: a turn runs
        daemon.open_gate("idle1")
        out, err = watcher.communicate(timeout=WAIT_S)
        assert watcher.returncode == 0, err
        assert b"turn_complete" in out
    finally:
        for proc in (held, watcher):
            if proc.poll() is None:
                proc.kill()
            proc.wait()
