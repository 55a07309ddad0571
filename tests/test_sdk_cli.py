"""``python -m sdk`` as a subprocess against the real daemon: create → prompt → load (with the
live marker's status text mid-turn), ``--json`` output, ``watch``, errors and exit codes."""

from __future__ import annotations

import json
import os
import re
import selectors
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import httpx
import pytest

from tests.harness import RunningDaemon, running_daemon

ROOT = Path(__file__).resolve().parents[1]
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


def cli_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "QWEN_SERVER_TOKEN"}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def argv(url: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "sdk", "--url", url, *args]


def cli(
    url: str, *args: str, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv(url, *args),
        cwd=ROOT,
        env=cli_env(env),
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        check=False,
    )


def read_until(proc: subprocess.Popen[bytes], needle: bytes) -> bytes:
    """Read the child's stdout as it streams until ``needle`` shows up (or fail)."""
    assert proc.stdout is not None
    seen = b""
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + WAIT_S
        while needle not in seen:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no {needle!r} in the output so far: {seen[-500:]!r}"
            if sel.select(remaining):
                chunk = os.read(proc.stdout.fileno(), 65536)
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
    assert unreachable.stderr.startswith(f"turnkeeper: cannot reach daemon at {url}: ")
    assert unreachable.stderr.count("\n") == 1

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
