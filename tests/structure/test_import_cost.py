"""The daemon imports the pure wire protocol (sdk.protocol) but none of the SDK's client side:
httpx, httpcore and the SDK's readers stay out of the daemon's memory; the SDK's public names
still resolve."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.processes  # starts processes: not in make unit-fast


def test_the_daemon_does_not_load_the_sdks_client_libraries() -> None:
    code = ("import sys, daemon.server; "
            "print(sorted(m for m in ('httpx', 'httpcore', 'sdk._client', 'sdk._ws', 'sdk._sync') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"


def test_a_plain_start_does_not_load_what_only_some_routes_or_the_sdk_use() -> None:
    """Each daemon start (and every test that starts one) pays for what it imports: the OpenAPI
    schemas (built on the first GET /openapi.json), backup and export (their routes), and the
    SDK's errors, repair rules and truncation texts load when first used."""
    later = ("daemon.core.openapi", "daemon.backup", "daemon.transcript_backup", "daemon.export",
             "daemon.core.transcript_markdown", "sdk._errors", "sdk._repair", "sdk._truncation")
    code = ("import sys, daemon.__main__, daemon.server; "
            f"print(sorted(m for m in {later!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"


def test_the_protocols_http_bodies_load_without_the_event_types() -> None:
    """The daemon answers its routes from the start (``sdk.protocol.http``, ``routes``) and
    builds its first event with its first session: neither ``sdk`` nor ``sdk.protocol`` imports
    the event modules with the package, and the daemon's start-up modules do not either."""
    events = ("sdk.protocol.constants", "sdk.protocol.envelope", "sdk.protocol.events",
              "sdk.protocol.sse", "sdk.protocol.terminals", "sdk.protocol.cursor",
              "daemon.core.envelope", "daemon.core.frame_codec")
    code = ("import sys, sdk, sdk.protocol, sdk.protocol.http, sdk.protocol.routes, "
            "daemon.__main__, daemon.server; "
            f"print(sorted(m for m in {events!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"


def test_the_protocols_names_load_their_modules_on_first_use() -> None:
    """Each public name of ``sdk.protocol`` and of ``sdk`` that comes from the protocol, read
    first thing in a fresh process, is its module's own object (one definition)."""
    code = (
        "import sys, sdk, sdk.protocol\n"
        "from importlib import import_module\n"
        "wrong = []\n"
        "for package, lazy in ((sdk.protocol, sdk.protocol._LAZY), (sdk, sdk._LAZY)):\n"
        "    for name, module in lazy.items():\n"
        "        if package is sdk and not module.startswith('sdk.protocol'):\n"
        "            continue\n"
        "        path = module if '.' in module else 'sdk.protocol.' + module\n"
        "        value = getattr(package, name)\n"
        "        own = import_module(path)\n"
        "        if value is not (own if path.endswith('.' + name) else getattr(own, name)):\n"
        "            wrong.append(name)\n"
        "print(wrong, sdk.protocol.http.__name__, sdk.protocol.DaemonEvent.__module__)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[] sdk.protocol.http sdk.protocol.envelope"


def test_the_daemons_configuration_compiles_no_code_as_it_is_defined() -> None:
    """A dataclass compiles its generated methods from source text when its class is made; for
    the configuration's ~45 fields that is code held for the daemon's life and the compiler's
    scratch memory at every start. ``DaemonConfig`` is a Struct: importing ``daemon.config``
    (its own imports done first) compiles no source text (a module read from source is not
    counted), and the class is still frozen, compared by value and given its defaults."""
    code = (
        "import sys\n"
        "import msgspec, pathlib, daemon.core.retention, daemon.logs, sdk.protocol\n"
        "compiled = []\n"
        "sys.addaudithook(lambda event, args: compiled.append(args[1]) "
        "if event == 'compile' and not str(args[1]).endswith('.py') else None)\n"
        "import daemon.config\n"
        "config = daemon.config.DaemonConfig(port=1, workspace='/w')\n"
        "try:\n"
        "    config.port = 2\n"
        "except AttributeError:\n"
        "    frozen = True\n"
        "else:\n"
        "    frozen = False\n"
        "print(compiled, config.port, config.workspace, frozen, config == "
        "daemon.config.DaemonConfig(port=1, workspace='/w', data_dir=config.data_dir))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[] 1 /w True True"


# Dataclasses a running daemon may still define: a route keeps a computed pattern (a field the
# caller does not pass), the reclaim policy its private counters, neither of which a Struct has.
DATACLASSES_ALLOWED = ["daemon.core.reclaim.ReclaimPolicy", "sdk.protocol.routes.Param",
                       "sdk.protocol.routes.Route"]


def test_a_running_daemon_defines_its_value_classes_as_structs() -> None:
    """A dataclass compiles its generated methods from source text when its class is made: code
    held for the daemon's life (about 0.3 MiB over the ~30 value classes a session's modules
    had, and more resident memory than that), where a msgspec Struct compiles nothing. The
    modules a daemon runs with a session (its start and a session's machinery) define no
    dataclass but the few listed."""
    code = (
        "import sys, dataclasses\n"
        "import daemon.__main__, daemon.server, daemon.session, daemon.streams, daemon.agent, "
        "daemon.bus, daemon.fanout, daemon.delivery, daemon.load_snapshot, daemon.core.restore, "
        "daemon.core.idempotency, daemon.ui_files, sdk.protocol.acp\n"
        "print(sorted(f'{name}.{attr}' for name, module in list(sys.modules.items())\n"
        "             if name.split('.')[0] in ('daemon', 'sdk')\n"
        "             for attr, value in vars(module).items()\n"
        "             if isinstance(value, type) and value.__module__ == name\n"
        "             and dataclasses.is_dataclass(value)))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == str(DATACLASSES_ALLOWED)


def test_the_command_line_does_not_load_httpxs_command_line() -> None:
    """httpx imports its own command line (rich, click, pygments) when they are installed, as
    they are here; ``turnkeeper`` never runs it, so its process leaves it out. WebSocket
    (wsproto) loads only for ``watch --ws``."""
    run = subprocess.run([sys.executable, "-X", "importtime", "-m", "sdk", "--version"],
                         capture_output=True, text=True, check=True)
    loaded = {line.rsplit("|", 1)[-1].strip() for line in run.stderr.splitlines()}
    assert {"httpx", "sdk._client", "sdk._session"} <= loaded
    assert sorted(loaded & {"rich", "click", "pygments", "wsproto",
                            "sdk._ws"}) == []


def test_lazy_sdk_names_resolve_to_their_modules() -> None:
    import sdk
    from sdk._client import DaemonClient
    from sdk._errors import DaemonError, error_for_status
    from sdk._repair import RepairEpisode
    from sdk._session import SessionHandle
    from sdk._truncation import status_text
    from sdk._ws import WebSocketEventStream

    assert sdk.DaemonClient is DaemonClient
    assert sdk.SessionHandle is SessionHandle
    assert sdk.WebSocketEventStream is WebSocketEventStream
    assert sdk.DaemonError is DaemonError
    assert sdk.error_for_status is error_for_status
    assert sdk.RepairEpisode is RepairEpisode
    assert sdk.status_text is status_text
    assert set(sdk.__all__) <= set(dir(sdk)) | set(sdk._LAZY)


def test_the_headless_model_loads_no_runtime_no_http_client_and_no_provider() -> None:
    """``import webui_model`` is the pure model: trio, anyio, httpx and the provider (the async
    shell) load when a provider name is first used, not before."""
    shells = ("trio", "anyio", "httpx", "httpcore", "sdk._client", "webui_model.provider")
    code = ("import sys, webui_model; "
            f"print(sorted(m for m in {shells!r} if m in sys.modules)); "
            "webui_model.WebUIProvider; "
            f"print(sorted(m for m in {shells!r} if m in sys.modules))")
    before, after = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                   check=True).stdout.split("\n")[:2]
    assert before == "[]"
    assert "webui_model.provider" in after and "httpx" in after


def test_no_module_of_the_daemon_holds_a_large_constant() -> None:
    """What a module keeps at its top level stays in the daemon's memory for its whole life:
    the start-up probe's bodies (~0.8 MB of test pieces) were such constants until they were
    made only while the probe runs. No bytes or text over 64 KiB at any daemon or protocol
    module's top level once the daemon's modules are imported."""
    code = (
        "import sys, daemon.server, daemon.http_api, daemon.manager, daemon.streams, "
        "daemon.asgi\n"
        "big = []\n"
        "for name, module in list(sys.modules.items()):\n"
        "    if name.split('.')[0] not in ('daemon', 'sdk'):\n"
        "        continue\n"
        "    for attr, value in vars(module).items():\n"
        "        if isinstance(value, (tuple, list)):\n"
        "            size = sum(len(v) for v in value if isinstance(v, (bytes, str)))\n"
        "        elif isinstance(value, (bytes, bytearray, str)):\n"
        "            size = len(value)\n"
        "        else:\n"
        "            continue\n"
        "        if size > 64 * 1024:\n"
        "            big.append(f'{name}.{attr}: {size}')\n"
        "print(big)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"


def test_the_frame_decoders_are_built_by_the_first_decode_of_their_type() -> None:
    """Importing the protocol builds no frame decoder (the daemon only writes frames); a fresh
    process's first decode of each type builds that type's decoder and types its payload."""
    code = (
        "import sys\n"
        "from sdk.protocol.events import _codec\n"
        "from sdk.protocol.events import TurnCompleteData, SessionUpdateData\n"
        "built = sorted(_codec._frame_decoders) + [_codec._update_decoders.cache_info().currsize]\n"
        "done = _codec.decode_payload('turn_complete',\n"
        "    b'{\"type\":\"turn_complete\",\"data\":{\"promptId\":\"p1\",\"stopReason\":\"end_turn\"}}',\n"
        "    {'promptId': 'p1', 'stopReason': 'end_turn'})\n"
        "update = {'sessionUpdate': 'agent_message_chunk',\n"
        "          'content': {'type': 'text', 'text': 'hi'}}\n"
        "chunk = _codec.decode_payload('session_update',\n"
        "    b'{\"type\":\"session_update\",\"data\":{\"sessionId\":\"s\",\"update\":'\n"
        "    b'{\"sessionUpdate\":\"agent_message_chunk\",\"content\":{\"type\":\"text\",\"text\":\"hi\"}}}}',\n"
        "    {'sessionId': 's', 'update': update})\n"
        "unknown = _codec.decode_payload('no_such_type', b'{}', {})\n"
        "print(built, type(done).__name__, done.prompt_id, type(chunk).__name__,\n"
        "      type(chunk.acp).__name__, unknown, sorted(_codec._frame_decoders))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == ("[0] TurnCompleteData p1 SessionUpdateData AgentMessageChunk None "
                   "['turn_complete']")
