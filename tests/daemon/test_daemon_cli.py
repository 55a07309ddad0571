"""The daemon's command line as users meet it: ``--help`` (a default and an environment variable
for every flag, the program's own name), ``--version``, ``TURNKEEPER_*`` variables, the token
warning and startup hint, log formats and the access log, relative agent paths, and the
``python-daemon`` clash line.

Real daemons come from ``tests/harness.py``; stderr is read from the harness's log file, polled
with a bounded deadline.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import logging
import os
import re
import subprocess
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import daemon
from daemon import __version__
from daemon.clash import clash_message
from daemon.config import (
    MOCK_GATE_ENV,
    ConfigError,
    DaemonConfig,
    _apply_env,
    build_parser,
    env_var,
    parse_config,
    program_name,
    resolve_agent_argv,
)
from daemon.logs import JsonFormatter, LogfmtFormatter, logfmt_value
from daemon.server import startup_hint
from tests.harness import RunningDaemon, running_daemon

# starts processes: not in make unit-fast; exec_daemon: real `python -m daemon` (start path test)
pytestmark = [pytest.mark.processes, pytest.mark.exec_daemon]

WAIT_S = 20.0


def run_module(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "daemon", *args], capture_output=True,
                          text=True, timeout=60, env=env, check=False)


def wait_for_stderr(d: RunningDaemon, pattern: str) -> str:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        text = d.stderr()
        if re.search(pattern, text, re.M):
            return text
        time.sleep(0.02)  # polling the daemon's log file with a bounded deadline
    raise AssertionError(f"no {pattern!r} in the daemon's stderr:\n{d.stderr()}")


def documented_flags(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.option_strings and a.help != argparse.SUPPRESS
            and a.dest not in ("help", "version")]


# -- help and version ---------------------------------------------------------------------------


def test_every_flag_has_help_a_default_and_an_environment_variable() -> None:
    parser = build_parser("turnkeeper-daemon")
    actions = documented_flags(parser)
    assert len(actions) >= 15
    for action in actions:
        flag = action.option_strings[0]
        assert action.help and re.search(r"\(default: [^;]+; env: [A-Z0-9_]+\)$", action.help), flag
        assert env_var(flag) in action.help
        assert not action.help.startswith("(default"), f"{flag} has no help text of its own"
    text = parser.format_help()
    assert "--approval-mode {default,plan,auto-edit,auto,yolo}" in text
    assert "--log-format {logfmt,json}" in text
    assert "~/.local/state/turnkeeper" in text and "delete that directory" in text
    assert "env: QWEN_SERVER_TOKEN" in text


def test_help_names_the_program_as_it_was_invoked() -> None:
    assert program_name("/usr/local/bin/turnkeeper-daemon") == "turnkeeper-daemon"
    assert program_name("/src/daemon/__main__.py") == "python -m daemon"
    done = run_module("--help")
    assert done.returncode == 0 and done.stdout.startswith("usage: python -m daemon ")
    script = Path(sys.executable).with_name("turnkeeper-daemon")
    if script.exists():  # the console script of the editable install
        shown = subprocess.run([str(script), "--help"], capture_output=True, text=True,
                               timeout=60, check=False)
        assert shown.returncode == 0 and shown.stdout.startswith("usage: turnkeeper-daemon ")


def test_version_is_the_one_package_version() -> None:
    done = run_module("--version")
    assert done.returncode == 0
    assert done.stdout.strip() == f"python -m daemon {__version__}"
    assert importlib.metadata.version("turnkeeper") == __version__


# -- environment variables ----------------------------------------------------------------------


def test_every_flag_reads_its_environment_variable() -> None:
    for action in documented_flags(build_parser()):
        flag = action.option_strings[0]
        if flag == "--token":
            continue  # QWEN_SERVER_TOKEN, checked below
        parser = build_parser()
        if isinstance(action, argparse._StoreTrueAction):
            raw, expected = "yes", True
        elif isinstance(action, argparse._AppendAction):
            raw, expected = "http://a.test, http://b.test", ["http://a.test", "http://b.test"]
        else:
            raw = expected = "from-env-7"
        assert _apply_env(parser, {env_var(flag): raw}) == {flag: env_var(flag)}
        assert getattr(parser.parse_args([]), action.dest) == expected, flag


def test_environment_values_are_validated_and_the_command_line_wins() -> None:
    env = {"TURNKEEPER_PORT": "0", "TURNKEEPER_MAX_JOURNAL_EVENTS": "3",
           "TURNKEEPER_NO_PERSISTENCE": "true", "TURNKEEPER_ALLOW_ORIGIN": "http://a.test",
           "TURNKEEPER_LOG_FORMAT": "json", "TURNKEEPER_ACCESS_LOG": "1",
           "QWEN_SERVER_TOKEN": "t0k"}
    config = parse_config([], environ=env)
    assert (config.port, config.max_journal_events, config.persistence) == (0, 3, False)
    assert config.allow_origins == ("http://a.test",) and config.log_format == "json"
    assert config.access_log and config.token == "t0k"
    assert config.token_source == "$QWEN_SERVER_TOKEN"
    assert parse_config(["--max-journal-events", "9"], environ=env).max_journal_events == 9
    with pytest.raises(ConfigError, match=r"--max-journal-events must be a positive integer.*"
                                          r"\(from \$TURNKEEPER_MAX_JOURNAL_EVENTS\)"):
        parse_config([], environ={"TURNKEEPER_MAX_JOURNAL_EVENTS": "lots"})
    with pytest.raises(ConfigError, match=r"\$TURNKEEPER_REQUIRE_AUTH must be one of"):
        parse_config([], environ={"TURNKEEPER_REQUIRE_AUTH": "maybe"})
    with pytest.raises(ConfigError, match=r"--log-level must be one of debug, info"):
        parse_config([], environ={"TURNKEEPER_LOG_LEVEL": "loud"})


def test_an_environment_variable_reaches_the_running_daemon(tmp_path: Path) -> None:
    with running_daemon(tmp_path, env={"TURNKEEPER_MAX_JOURNAL_EVENTS": "7"}) as d:
        limits = httpx.get(f"{d.url}/capabilities", timeout=WAIT_S).json()["limits"]
    assert limits["maxJournalEvents"] == 7


# -- token ----------------------------------------------------------------------------------------


def test_token_source_and_startup_hint_never_show_the_token() -> None:
    flag = parse_config(["--token", "s3cret"], environ={})
    assert flag.token_source == "--token"
    assert "from --token" in startup_hint(flag) and "s3cret" not in startup_hint(flag)
    env = parse_config([], environ={"QWEN_SERVER_TOKEN": "s3cret"})
    assert startup_hint(env).startswith("token: from $QWEN_SERVER_TOKEN")
    none = parse_config([], environ={})
    assert none.token_source is None and startup_hint(none).startswith("token: none")
    assert f"data: {none.data_dir}" in startup_hint(none)


def test_a_token_on_the_command_line_is_warned_about(tmp_path: Path) -> None:
    with running_daemon(tmp_path, ["--token", "s3cret-on-argv"]) as d:
        text = wait_for_stderr(d, r"level=warning .*event=token_on_command_line")
    assert "s3cret-on-argv" not in text


# -- logs -----------------------------------------------------------------------------------------


def parse_logfmt(line: str) -> dict[str, str]:
    """A small logfmt reader: bare values, or double-quoted JSON strings."""
    out: dict[str, str] = {}
    pos = 0
    decoder = json.JSONDecoder()
    while pos < len(line):
        key, _, rest = line[pos:].partition("=")
        pos += len(key) + 1
        if rest.startswith('"'):
            value, end = decoder.raw_decode(line, pos)
            pos = end
        else:
            value = rest.split(" ", 1)[0]
            pos += len(value)
        out[key.strip()] = value
        while pos < len(line) and line[pos] == " ":
            pos += 1
    return out


def record(msg: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord("daemon.test", logging.INFO, __file__, 1, msg, args, None)


def test_logfmt_quotes_values_that_a_parser_would_split() -> None:
    tricky = 'a b "c" d=e\\f\n'
    line = LogfmtFormatter().format(record("event=x path=%s n=%d argv=%r empty=%s", tricky, 3,
                                           ("python", "-m x"), ""))
    fields = parse_logfmt(line)
    assert fields["event"] == "x" and fields["path"] == tricky and fields["n"] == "3"
    assert fields["argv"] == "('python', '-m x')" and fields["empty"] == ""
    assert fields["level"] == "info" and fields["logger"] == "daemon.test"
    assert logfmt_value("plain") == "plain"
    # A message that is not key=value pairs stays whole, as one value.
    assert parse_logfmt(LogfmtFormatter().format(record("Running on %s", "http://x y")))["msg"] \
        == "Running on http://x y"


def test_json_log_lines_keep_numbers_and_strings() -> None:
    obj = json.loads(JsonFormatter().format(record("event=x pid=%s path=%s", 12, "/a b")))
    assert obj["event"] == "x" and obj["pid"] == 12 and obj["path"] == "/a b"
    assert obj["level"] == "info" and "time" in obj


def test_log_lines_leave_out_fields_that_have_no_value() -> None:
    line = LogfmtFormatter().format(record(
        "event=agent_exited pid=%s exit_code=%s signal=%s", 12, 0, None))
    assert line.endswith(" event=agent_exited pid=12 exit_code=0") and "None" not in line
    obj = json.loads(JsonFormatter().format(record("event=x signal=%s n=%s", None, 0)))
    assert "signal" not in obj and obj["n"] == 0


def test_an_agent_that_exits_by_itself_is_logged_without_empty_fields(tmp_path: Path) -> None:
    with running_daemon(tmp_path) as d, httpx.Client(base_url=d.url, timeout=WAIT_S) as client:
        sid = client.post("/session", json={"sessionScope": "thread"}).json()["sessionId"]
        crash = {"prompt": [{"type": "text", "text": "mock:mode=crash-on-prompt"}]}
        assert client.post(f"/session/{sid}/prompt", json=crash).status_code == 202
        text = wait_for_stderr(d, r"event=agent_exited .*exit_code=3")
    exited = [line for line in text.splitlines() if "event=agent_exited" in line]
    assert exited and not any("=None" in line for line in exited), exited


def test_json_format_and_access_log_on_a_running_daemon(tmp_path: Path) -> None:
    with running_daemon(tmp_path, ["--log-format", "json", "--access-log"]) as d:
        assert httpx.get(f"{d.url}/health", timeout=WAIT_S).status_code == 200
        wait_for_stderr(d, r'"event": "access".*"path": "/health"')
    lines = [line for line in d.stderr().splitlines() if line.strip()]
    objects = [json.loads(line) for line in lines]  # every line is one JSON object
    access = [o for o in objects if o.get("event") == "access" and o["path"] == "/health"]
    # Hypercorn may log a request a second time, with status "-", when the client closes the
    # connection while the answer's last bytes are being sent; the answered line is always there.
    assert [(o["method"], o["status"]) for o in access if o["status"] != "-"] == [("GET", "200")]
    assert any(o.get("event") == "listening" for o in objects)


def test_no_access_log_by_default(tmp_path: Path) -> None:
    with running_daemon(tmp_path) as d:
        assert httpx.get(f"{d.url}/health", timeout=WAIT_S).status_code == 200
        status = httpx.get(f"{d.url}/daemon/status", timeout=WAIT_S)
        assert status.status_code == 200
    assert "event=access" not in d.stderr() and "event=listening" in d.stderr()


# -- relative agent paths -------------------------------------------------------------------------


def test_relative_agent_paths_resolve_against_the_daemon_directory() -> None:
    assert resolve_agent_argv(["./agent.py", "--x", "../y", "z", "/abs"], "/srv/d") == (
        "/srv/d/agent.py", "--x", "/srv/y", "z", "/abs")
    assert resolve_agent_argv(["bin/agent"], "/srv/d") == ("/srv/d/bin/agent",)
    assert resolve_agent_argv(["qwen", "--acp"], "/srv/d") == ("qwen", "--acp")
    config = parse_config(["--agent", "python ./my_agent.py --flag 'two words'"], environ={})
    assert config.agent_argv == ("python", os.path.join(os.getcwd(), "my_agent.py"), "--flag",
                                 "two words")


async def test_a_relative_agent_serves_every_workspace(tmp_path: Path) -> None:
    script = tmp_path / "agent.sh"
    script.write_text(f"#!/bin/sh\nexec {sys.executable} -m daemon.mock_agent\n")
    script.chmod(0o755)
    other = tmp_path / "elsewhere"
    other.mkdir()
    # The harness starts the daemon in tmp_path, so ./agent.sh exists there and nowhere else.
    with running_daemon(tmp_path, ["--agent", "./agent.sh"]) as d:
        async with httpx.AsyncClient(base_url=d.url, timeout=WAIT_S) as http:
            for cwd in (str(tmp_path), str(other)):
                created = await http.post("/session", json={"cwd": cwd, "sessionScope": "thread"})
                assert created.status_code == 200, created.text
                assert created.json()["workspaceCwd"] == cwd


# -- the python-daemon clash ----------------------------------------------------------------------


def test_clash_message_names_a_foreign_daemon_package_or_python_daemon() -> None:
    assert clash_message(daemon, lambda name: None) is None
    foreign = types.ModuleType("daemon")
    foreign.__file__ = "/site-packages/daemon/__init__.py"
    message = clash_message(foreign, lambda name: "3.0.1")
    assert message is not None and "not turnkeeper's" in message and "python-daemon 3.0.1" in message
    both = clash_message(daemon, lambda name: "3.0.1" if name == "python-daemon" else None)
    assert both is not None and "python-daemon 3.0.1 is installed" in both
    assert "\n" not in both


def test_startup_prints_one_line_when_python_daemon_is_installed(tmp_path: Path) -> None:
    dist = tmp_path / "python_daemon-3.0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: python-daemon\nVersion: 3.0.1\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")]))
    done = run_module("--version", env=env)
    assert done.returncode == 0
    lines = [line for line in done.stderr.splitlines() if "python-daemon" in line]
    assert len(lines) == 1 and "python-daemon 3.0.1 is installed" in lines[0]
    clean = run_module("--version")
    assert "python-daemon" not in clean.stderr


def test_config_defaults_record_logging_choices() -> None:
    config = DaemonConfig()
    assert (config.log_level, config.log_format, config.access_log) == ("info", "logfmt", False)


@contextlib.contextmanager
def bare_daemon(tmp_path: Path) -> Iterator[tuple[str, list[str]]]:
    """``python -m daemon`` as a user starts it (no token, no MOCK_ACP_GATE_DIR): its URL and
    its start-up lines."""
    argv = [sys.executable, "-m", "daemon", "--port", "0", "--data-dir", str(tmp_path / "data")]
    env = {k: v for k, v in os.environ.items() if k not in ("QWEN_SERVER_TOKEN", MOCK_GATE_ENV)}
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            cwd=str(tmp_path), env=env)
    try:
        assert proc.stdout is not None
        lines: list[str] = []
        while not any(line.startswith("mock agent:") for line in lines):
            line = proc.stdout.readline()
            assert line, f"daemon stopped before its startup hint: {lines}"
            lines.append(line.rstrip("\n"))
        url = re.search(r"listening on (\S+)", lines[0])
        assert url is not None
        yield url.group(1), lines
    finally:
        proc.terminate()
        proc.wait(10)


def test_startup_prints_the_viewer_url_and_it_serves_the_page(tmp_path: Path) -> None:
    with bare_daemon(tmp_path) as (base, lines):
        assert f"viewer: {base}/ui/" in lines
        page = httpx.get(f"{base}/ui/", timeout=WAIT_S)
        assert page.status_code == 200 and "text/html" in page.headers["content-type"]
        # A browser pointed at the daemon lands on the viewer; the icon is never a 404.
        root = httpx.get(f"{base}/", timeout=WAIT_S, follow_redirects=True)
        assert root.status_code == 200 and str(root.url) == f"{base}/ui/"
        assert root.history[0].status_code == 302
        icon = httpx.get(f"{base}/favicon.ico", timeout=WAIT_S, follow_redirects=True)
        assert icon.status_code == 200 and icon.headers["content-type"] == "image/svg+xml"
        assert icon.content.startswith(b"<svg") and '<link rel="icon"' in page.text
        # The banner's curl makes a new session each time, as `turnkeeper create` does.
        (curl,) = [line for line in lines if line.startswith("try: curl")]
        found = re.search(r"-d '(.*)'$", curl)
        assert found is not None
        first, second = (httpx.post(f"{base}/session", json=json.loads(found.group(1)),
                                    timeout=WAIT_S).json() for _ in range(2))
        assert first["sessionId"] != second["sessionId"] and not second["attached"]
        # The bundled mock's gates live in the data directory, named in the banner.
        gates = tmp_path / "data" / "gates"
        assert gates.is_dir() and lines[-1].endswith(f"(gates in {gates})")


def test_a_gated_turn_on_a_plain_daemon_waits_for_its_gate_file(tmp_path: Path) -> None:
    """Without MOCK_ACP_GATE_DIR the daemon still gives the bundled mock its gate directory
    (<data dir>/gates), so `mock:gate=NAME` holds the turn until the file NAME exists."""
    with bare_daemon(tmp_path) as (base, _lines), \
            httpx.Client(base_url=base, timeout=WAIT_S) as client:
        sid = client.post("/session", json={"sessionScope": "thread"}).json()["sessionId"]
        held = {"prompt": [{"type": "text", "text": "held mock:chunks=1 mock:gate=by-hand"}]}
        assert client.post(f"/session/{sid}/prompt", json=held).status_code == 202
        deadline = time.monotonic() + WAIT_S
        while client.get(f"/session/{sid}/status").json()["lastEventId"] < 2:
            assert time.monotonic() < deadline, "the chunk never arrived"
            time.sleep(0.02)  # a bounded status poll
        assert client.get(f"/session/{sid}/status").json()["hasActivePrompt"]
        (tmp_path / "data" / "gates" / "by-hand").touch()
        while client.get(f"/session/{sid}/status").json()["hasActivePrompt"]:
            assert time.monotonic() < deadline, "the gate did not release the turn"
            time.sleep(0.02)  # a bounded status poll
