"""The daemon's command line: defaults, validation, and refusing to start with a one-line
reason (checked both on the parser and on the real ``python -m daemon``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from daemon.config import ConfigError, parse_config

pytestmark = pytest.mark.processes  # starts processes: not in make unit-fast


def test_defaults() -> None:
    config = parse_config([], environ={})
    assert (config.hostname, config.port) == ("127.0.0.1", 4170)
    assert config.max_journal_events == 10_000
    assert config.max_journal_bytes == 8 * 1024 * 1024
    assert config.compacted_replay_max_bytes == 4 * 1024 * 1024
    assert config.event_ring_size == 8000
    assert config.agent_init_timeout_ms == 30_000
    assert config.token is None and config.approval_mode == "default"
    assert config.effective_agent_argv()[-2:] == ("-m", "daemon.mock_agent")


def test_token_from_environment_and_agent_split() -> None:
    config = parse_config(["--agent", "my-agent --flag 'two words'"],
                          environ={"QWEN_SERVER_TOKEN": "t0k"})
    assert config.token == "t0k"
    assert config.agent_argv == ("my-agent", "--flag", "two words")


@pytest.mark.parametrize(("argv", "reason"), [
    (["--max-journal-events", "0"], "--max-journal-events must be a positive integer"),
    (["--max-journal-bytes", "-5"], "--max-journal-bytes must be a positive integer"),
    (["--compacted-replay-max-bytes", "1.5"], "--compacted-replay-max-bytes must be"),
    (["--event-ring-size", "many"], "--event-ring-size must be a positive integer"),
    (["--agent-init-timeout-ms", "0"], "--agent-init-timeout-ms must be a positive integer"),
    (["--port", "70000"], "--port must be an integer 0..65535"),
    (["--approval-mode", "sometimes"], "--approval-mode must be one of"),
    (["--hostname", "0.0.0.0"], "refusing to bind non-loopback address"),
    (["--require-auth"], "--require-auth needs a token"),
    (["--agent", ""], "--agent must not be empty"),
    (["--agent", "unbalanced 'quote"], "--agent is not a valid command line"),
    (["--workspace", "relative/dir"], "--workspace must be an absolute path"),
    (["--bogus"], "unrecognized arguments"),
])
def test_invalid_values_are_refused(argv: list[str], reason: str) -> None:
    with pytest.raises(ConfigError, match=reason.replace(".", r"\.")):
        parse_config(argv, environ={})


@pytest.mark.parametrize("token", ["s\u00e9cret", "\u2603", "two words", "tab\tin", "del\x7f"])
@pytest.mark.parametrize("via", ["flag", "env"])
def test_token_that_cannot_be_an_http_header_is_refused(token: str, via: str) -> None:
    argv, env = (["--token", token], {}) if via == "flag" else ([], {"QWEN_SERVER_TOKEN": token})
    with pytest.raises(ConfigError, match="must be visible ASCII") as info:
        parse_config(argv, environ=env)
    assert token not in str(info.value)
    assert ("--token" if via == "flag" else "$QWEN_SERVER_TOKEN") in str(info.value)


def test_visible_ascii_token_is_accepted() -> None:
    token = "".join(chr(c) for c in range(0x21, 0x7F))
    assert parse_config(["--token", token], environ={}).token == token


def test_non_loopback_bind_allowed_with_token() -> None:
    config = parse_config(["--hostname", "0.0.0.0", "--token", "x"], environ={})
    assert not config.is_loopback


def test_cli_refuses_to_start_with_one_line_reason(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "daemon", "--max-journal-events", "abc",
         "--data-dir", str(tmp_path)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert lines == [
        "python -m daemon: --max-journal-events must be a positive integer, got 'abc'"]
    assert not (tmp_path / "transcript.sqlite3").exists()
    # The console script names itself the way the user typed it.
    script = Path(sys.executable).with_name("turnkeeper-daemon")
    if script.exists():
        result = subprocess.run([str(script), "--max-journal-events", "abc", "--data-dir",
                                 str(tmp_path)], capture_output=True, text=True, timeout=30)
        assert result.stderr.strip().splitlines() == [
            "turnkeeper-daemon: --max-journal-events must be a positive integer, got 'abc'"]
