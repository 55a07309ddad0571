"""What an idle daemon holds: a real ``python -m daemon`` started, asked a few ``GET /health``,
then made to list the modules it has loaded (a SIGUSR1 handler planted by a ``sitecustomize``
on its path, so the daemon runs unchanged). Whatever only a later request needs (the modules of some routes and
modes, the viewer's files, the transcript's page cache) is left out or given back until then;
the first request of each kind still gets its answer. What only the start needs (argparse, for
the command line) is forgotten once used, and nothing keeps its module alive."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import time
from pathlib import Path
from typing import cast

import httpx
import pytest
import trio
from werkzeug.routing import Map, Rule

from daemon.config import DaemonConfig
from daemon.core.reclaim import MIN_CHURN_BYTES, QUIET_S
from daemon.core.transcript_ops import UpsertSession
from daemon.http_api import create_app
from daemon.manager import SessionManager
from daemon.reclaimer import Reclaimer
from daemon.transcript_store import CACHE_BUSY_KIB, CACHE_KIB, StoreHooks, TranscriptDatabase
from daemon.transcript_writer import TranscriptWriter
from daemon.ui_files import UI_DIR, UiFiles
from tests.harness import running_daemon

# starts processes: not in make unit-fast; exec_daemon: real `python -m daemon` (memory test)
pytestmark = [pytest.mark.processes, pytest.mark.exec_daemon]

WAIT_S = 20.0

# Loaded by the first request that needs them (their routes, cluster mode, the other
# commands), never by a start: each one an eager import would bring back into every daemon.
NOT_AT_IDLE = ("argparse",  # read the command line, then forgotten (daemon.__main__)
               "daemon.core.idempotency",  # keyed prompts: the first prompt
               "sdk.protocol.acp",  # the ACP views: the first event built from a dict
               "daemon.core.openapi", "daemon.backup", "daemon.transcript_backup",
               "daemon.export", "daemon.core.transcript_markdown", "daemon.metrics_exposition",
               "prometheus_client", "daemon.cluster", "coredis", "daemon.recover", "daemon.prune",
               "daemon.backup_command", "httpx", "sdk._client", "sdk._errors", "sdk._repair",
               # a session's machinery: the first session created or restored imports it
               "daemon.agent", "daemon.bus", "daemon.session", "daemon.streams",
               "daemon.load_snapshot", "daemon.core.acp_client", "daemon.core.restore",
               "daemon.core.replay_window", "daemon.core.live_journal", "daemon.core.ring",
               # the event types and their codecs: the first event built or read back (the
               # routes and their bodies, sdk.protocol.http, are all an idle daemon holds)
               "sdk.protocol.constants", "sdk.protocol.envelope", "sdk.protocol.events",
               "sdk.protocol.sse", "sdk.protocol.terminals", "sdk.protocol.cursor",
               "daemon.core.envelope", "daemon.core.frame_codec",
               "daemon.ui_files")  # the viewer: its first request (its files with it)

# Lists the modules in sys.modules and every module object still alive outside it (one dropped
# from sys.modules but still referenced holds all its memory).
_SITECUSTOMIZE = """\
import gc, json, os, signal, sys, types

def _dump(signum, frame):
    path = os.environ["TK_TEST_MODULES_OUT"]
    gc.collect()
    alive = {o.__name__ for o in gc.get_objects() if isinstance(o, types.ModuleType)}
    with open(path + ".tmp", "w") as out:
        json.dump(sorted(set(sys.modules) | alive), out)
    os.replace(path + ".tmp", path)

signal.signal(signal.SIGUSR1, _dump)
"""


def _modules_at_idle(tmp_path: Path) -> list[str]:
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    out = tmp_path / "modules.json"
    path = os.pathsep.join(p for p in (str(hook), os.environ.get("PYTHONPATH", "")) if p)
    with running_daemon(tmp_path, env={"PYTHONPATH": path,
                                       "TK_TEST_MODULES_OUT": str(out)}) as daemon:
        for _ in range(3):
            assert httpx.get(f"{daemon.url}/health", timeout=WAIT_S).status_code == 200
        daemon.proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + WAIT_S
        while not out.exists():
            assert time.monotonic() < deadline, "the daemon never listed its modules"
            assert daemon.proc.poll() is None, daemon.stderr()
            time.sleep(0.02)
        modules: list[str] = json.loads(out.read_text())
    return modules


def test_an_idle_daemon_has_not_loaded_what_only_later_requests_need(tmp_path: Path) -> None:
    modules = _modules_at_idle(tmp_path)
    assert "daemon.server" in modules and "sitecustomize" in modules  # the listing is real
    assert sorted(set(NOT_AT_IDLE) & set(modules)) == []


def test_the_viewer_files_are_read_by_the_first_request_for_one(tmp_path: Path) -> None:
    files = UiFiles()
    assert not files.loaded
    redirect = files.answer("GET", "/ui")
    assert redirect is not None and redirect.status == 308 and not files.loaded
    index = files.answer("GET", "/ui/")
    assert files.loaded and index is not None and index.status == 200
    assert index.body == (UI_DIR / "index.html").read_bytes()
    assert files.answer("GET", "/ui/no-such-file.js") is None
    with running_daemon(tmp_path) as daemon:  # a fresh daemon's first request is the page
        page = httpx.get(f"{daemon.url}/ui/app.js", timeout=WAIT_S)
        assert page.status_code == 200
        assert page.content == (UI_DIR / "app.js").read_bytes()
        assert page.headers["content-type"] == "text/javascript; charset=utf-8"


def _cache_size(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA cache_size").fetchone()[0])


def test_the_transcript_sets_its_small_cache_before_its_first_read(tmp_path: Path) -> None:
    path = tmp_path / "t.sqlite3"
    TranscriptDatabase(path).close()  # an existing file: opening it reads pages at once
    statements: list[str] = []

    def traced(conn: sqlite3.Connection) -> None:
        conn.set_trace_callback(statements.append)

    db = TranscriptDatabase(path, quick_check_s=5, hooks=StoreHooks(connected=traced))
    try:
        assert statements[0] == f"PRAGMA cache_size=-{CACHE_KIB}"
        assert _cache_size(db.connection) == -CACHE_BUSY_KIB  # the limit once open
    finally:
        db.close()


async def test_the_writer_gives_back_sqlites_cache_only_when_idle_and_commits_after(
        tmp_path: Path) -> None:
    store = TranscriptDatabase(tmp_path / "t.sqlite3", quick_check_s=5)
    writer = TranscriptWriter(store)
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        writer.submit(UpsertSession("s1", str(tmp_path), 1))
        assert not writer.release_memory()  # an op is queued: its pages are about to be used
        assert await writer.wait_flushed()
        assert writer.release_memory()
        writer.submit(UpsertSession("s2", str(tmp_path), 2))
        assert await writer.wait_flushed()
        ids = await writer.read(lambda db: sorted(
            row[0] for row in db.connection.execute("SELECT session_id FROM sessions")))
        assert ids == ["s1", "s2"]
        assert _cache_size(store.connection) == -CACHE_BUSY_KIB  # the limit stays; pages go
        await writer.aclose()
    assert not writer.release_memory()  # stopped: the store may be closed under it
    store.close()


async def test_every_trim_first_lets_the_releasers_give_memory_back() -> None:
    calls: list[str] = []

    def trim() -> bool:
        calls.append("trim")
        return True

    reclaimer = Reclaimer(trim=trim)
    reclaimer.releasers.append(lambda: calls.append("release"))
    reclaimer.trim_now("startup", quiet=True)
    async with trio.open_nursery() as nursery:
        await nursery.start(reclaimer.run)
        reclaimer.note(MIN_CHURN_BYTES)  # a churn trim, once publishing pauses
        with trio.fail_after(WAIT_S):
            while reclaimer.trims < 2:
                await trio.sleep(QUIET_S)
        nursery.cancel_scope.cancel()
    assert calls == ["release", "trim", "release", "trim"]


def _compiled_builders(rule: Rule) -> list[str]:
    """Which of ``rule``'s two URL builders are Werkzeug's generated code."""
    return [name for name in ("_build", "_build_unknown")
            if getattr(rule, name).__func__.__code__.co_filename == "<werkzeug routing>"]


def test_the_routes_compile_their_url_builders_with_the_first_url_built() -> None:
    app = create_app(DaemonConfig(), cast(SessionManager, None))
    rules = list(app.url_map.iter_rules())
    assert len(rules) > 10 and all(_compiled_builders(rule) == [] for rule in rules)
    # The same routes in a plain Werkzeug map (builders compiled as the routes are added).
    plain = Map([Rule(rule.rule, methods=rule.methods, endpoint=rule.endpoint)
                 for rule in rules], merge_slashes=False)
    assert all(_compiled_builders(rule) == ["_build", "_build_unknown"]
               for rule in plain.iter_rules())
    adapter, expected = app.url_map.bind("localhost"), plain.bind("localhost")
    for rule in rules:
        method = sorted(rule.methods or ())[0]
        values = {name: "a b/c" for name in rule.arguments}
        for append in (False, True):  # one builder each; an unknown value is a query or not
            args = (rule.endpoint, {**values, "extra": "1"}, method)
            built = adapter.build(*args, append_unknown=append)
            assert built == expected.build(*args, append_unknown=append)
            assert built == adapter.build(*args, append_unknown=append)  # compiled by now
            assert built.endswith("?extra=1") == append
        assert _compiled_builders(rule) == ["_build", "_build_unknown"]
    assert adapter.build("health", {"extra": "1"}) == "/health?extra=1"
