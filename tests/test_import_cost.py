"""The daemon imports the pure wire protocol (sdk.protocol) but none of the SDK's client side:
httpx, httpcore and the SDK's readers stay out of the daemon's memory; the SDK's public names
still resolve."""

from __future__ import annotations

import subprocess
import sys


def test_the_daemon_does_not_load_the_sdks_client_libraries() -> None:
    code = ("import sys, daemon.server; "
            "print(sorted(m for m in ('httpx', 'httpcore', 'sdk.client', 'sdk.ws', 'sdk.sync') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"


def test_lazy_sdk_names_resolve_to_their_modules() -> None:
    import sdk
    from sdk.client import DaemonClient
    from sdk.session import SessionHandle
    from sdk.ws import WebSocketEventStream

    assert sdk.DaemonClient is DaemonClient
    assert sdk.SessionHandle is SessionHandle
    assert sdk.WebSocketEventStream is WebSocketEventStream
    assert set(sdk.__all__) <= set(dir(sdk)) | set(sdk._LAZY)
