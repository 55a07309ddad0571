"""The daemon's Hypercorn patches (``daemon.bridge``): the installed Hypercorn still has
the shape they were written for, a changed shape is caught (and left unpatched), and a running
daemon reports them active in ``GET /daemon/status``."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from daemon import bridge as server_patches
from tests.harness import RunningDaemon, running_daemon

pytestmark = pytest.mark.processes  # starts processes: not in make unit-fast

ROOT = Path(__file__).resolve().parents[2]


def _fresh_interpreter(code: str) -> Any:
    """Run ``code`` (which prints JSON) where nothing has patched Hypercorn yet."""
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=60, check=True)
    return json.loads(out.stdout)


def test_installed_hypercorn_has_the_patched_shape() -> None:
    problems = _fresh_interpreter(
        "import json; from daemon import bridge as p; "
        "print(json.dumps(p.hypercorn_shape_problems()))")
    assert problems == [], problems


def test_patches_install_on_the_installed_hypercorn() -> None:
    status = _fresh_interpreter(
        "import json, msgspec; from daemon import bridge as p; "
        "print(json.dumps(msgspec.structs.asdict(p.install())))")
    assert all(status[name] is True for name in (
        "ws_keepalive", "connection_registry", "ws_limits", "http2_flow_control")), status


def _shapes() -> dict[str, Any]:
    from hypercorn.protocol import ws_stream
    from hypercorn.trio import run, tcp_server

    # The defining modules, as Hypercorn ships them. WSStream's methods may already be
    # patched in this process; the fakes below only change what each case is about.
    return {"ws_stream_cls": ws_stream.WSStream,
            "stream_closed": getattr(ws_stream, "StreamClosed", None),
            "tcp_server_cls": tcp_server.TCPServer, "worker_serve": run.worker_serve}


def test_a_changed_signature_is_caught() -> None:
    shapes = _shapes()
    base = shapes["tcp_server_cls"]

    class Renamed(base):  # type: ignore[misc,valid-type]
        def __init__(self, app: Any, config: Any, context: Any, state: Any,
                     transport: Any) -> None:  # "stream" renamed
            self.stream = transport

    problems = server_patches.shape_problems(**{**shapes, "tcp_server_cls": Renamed})
    assert any("Renamed.__init__" in p and "stream" in p for p in problems), problems


def test_a_method_gone_or_no_longer_a_coroutine_is_caught() -> None:
    shapes = _shapes()
    ws = shapes["ws_stream_cls"]
    gone = type("NoPings", (), {k: v for k, v in vars(ws).items() if k != "_send_pings"})
    problems = server_patches.shape_problems(**{**shapes, "ws_stream_cls": gone})
    assert "NoPings._send_pings is missing" in problems, problems

    def _handle_events(self: Any) -> None:  # synchronous now
        for _ in self.connection.events():
            pass

    sync = type("SyncEvents", (), {**vars(ws), "_handle_events": _handle_events})
    problems = server_patches.shape_problems(**{**shapes, "ws_stream_cls": sync})
    assert "SyncEvents._handle_events is no longer a coroutine function" in problems, problems


def test_code_that_stops_using_what_the_patch_relies_on_is_caught() -> None:
    shapes = _shapes()

    async def _handle_events(self: Any) -> None:  # reads events some other way
        for _ in self.protocol.next_events():
            pass

    ws = shapes["ws_stream_cls"]
    other = type("OtherEvents", (), {**vars(ws), "_handle_events": _handle_events})
    problems = server_patches.shape_problems(**{**shapes, "ws_stream_cls": other})
    assert any(p.startswith("OtherEvents._handle_events no longer uses") for p in problems)

    def worker_serve() -> None:  # builds its servers some other way
        pass

    problems = server_patches.shape_problems(**{**shapes, "worker_serve": worker_serve})
    assert "worker_serve no longer builds TCPServer through its module" in problems


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    with running_daemon(tmp_path_factory.mktemp("patches")) as d:
        yield d


def test_daemon_status_reports_the_patches(daemon: RunningDaemon) -> None:
    body = httpx.get(f"{daemon.url}/daemon/status", timeout=10).json()
    assert body["server"] == {"wsKeepalive": True, "connectionRegistry": True,
                              "wsLimits": True, "http2FlowControl": True,
                              "hypercornVersion": server_patches.hypercorn_version()}
