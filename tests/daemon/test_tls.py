"""TLS served by the daemon itself (--certfile/--keyfile), against a CA made at test time.

The certificate is issued by a throw-away CA (trustme) for 127.0.0.1; the SDK trusts it only
through ``ca_file``. A turn streams over HTTPS (SSE, several writes after the first) and over
WSS: the direct SSE write path must stay off for a TLS connection (its bytes would reach the
peer unencrypted and break the stream).
"""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import trustme

from sdk import DaemonClient
from sdk._errors import TransportError
from sdk._ws import WebSocketEventStream
from tests.harness import RunningDaemon, running_daemon

pytestmark = pytest.mark.processes  # starts processes: not in make unit-fast

CHUNKS = 40


@pytest.fixture(scope="module")
def ca_and_cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    base = tmp_path_factory.mktemp("tls-certs")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    ca_pem, cert_pem, key_pem = base / "ca.pem", base / "cert.pem", base / "key.pem"
    ca.cert_pem.write_to_path(str(ca_pem))
    cert.cert_chain_pems[0].write_to_path(str(cert_pem))
    for extra in cert.cert_chain_pems[1:]:
        extra.write_to_path(str(cert_pem), append=True)
    cert.private_key_pem.write_to_path(str(key_pem))
    return ca_pem, cert_pem, key_pem


@pytest.fixture(scope="module")
def tls_daemon(tmp_path_factory: pytest.TempPathFactory,
               ca_and_cert: tuple[Path, Path, Path]) -> Iterator[RunningDaemon]:
    _, cert_pem, key_pem = ca_and_cert
    with running_daemon(tmp_path_factory.mktemp("tls"),
                        ["--certfile", str(cert_pem), "--keyfile", str(key_pem)]) as d:
        yield d


def test_the_daemon_says_https(tls_daemon: RunningDaemon) -> None:
    assert tls_daemon.url.startswith("https://127.0.0.1:")


async def _stream_a_turn(client: DaemonClient, sid: str, ws: bool) -> list[str]:
    """Open the stream first, then run a turn held at its start, so the chunks arrive in
    writes after the stream's first one; returns the chunk texts in order."""
    stream = (WebSocketEventStream(client, sid) if ws else client.events(sid))
    texts: list[str] = []
    ids: list[int] = []
    async with stream:
        accepted = await client.send_prompt(
            sid, f"tls mock:chunks={CHUNKS} mock:bytes=200")
        async for event in stream:
            if event.id is not None:
                ids.append(event.id)
            if event.prompt_id != accepted.prompt_id:
                continue
            if event.type == "session_update":
                update = event.data.get("update", {}) if isinstance(event.data, dict) else {}
                content = update.get("content")
                if update.get("sessionUpdate") == "agent_message_chunk" and content:
                    texts.append(content.get("text", ""))
            if event.type in ("turn_complete", "turn_error"):
                assert event.type == "turn_complete", event
                break
    assert ids == list(range(ids[0], ids[0] + len(ids))), "event ids must not skip"
    return texts


@pytest.mark.parametrize("transport", ["sse", "ws"])
async def test_a_turn_streams_over_tls(tls_daemon: RunningDaemon,
                                       ca_and_cert: tuple[Path, Path, Path],
                                       transport: str) -> None:
    ca_pem, _, _ = ca_and_cert
    async with DaemonClient(tls_daemon.url, ca_file=ca_pem) as client:
        created = await client.create_session(scope="thread")
        texts = await _stream_a_turn(client, created.session_id, transport == "ws")
        page = await client.transcript_page(created.session_id)
    assert len(texts) == CHUNKS
    assert [t.split(".")[0] for t in texts] == [f"chunk-{i}" for i in range(CHUNKS)]
    assert all(len(t) == 200 for t in texts)
    assert page.events, "the transcript is served over TLS too"


async def test_an_untrusted_certificate_is_refused(tls_daemon: RunningDaemon) -> None:
    async with DaemonClient(tls_daemon.url) as client:  # the system CAs only
        with pytest.raises(TransportError) as caught:
            await client.health()
    causes: list[BaseException] = []
    cause: BaseException | None = caught.value
    while cause is not None:
        causes.append(cause)
        cause = cause.__cause__ or cause.__context__
    assert any(isinstance(c, ssl.SSLCertVerificationError) for c in causes), causes


def test_plain_http_is_not_served_on_the_tls_port(tls_daemon: RunningDaemon) -> None:
    plain = tls_daemon.url.replace("https://", "http://")
    try:
        response = httpx.get(f"{plain}/health", timeout=5)
    except httpx.HTTPError:
        return  # the connection was dropped: nothing was served in clear text
    assert response.status_code != 200, "a route must never be served without TLS"


def test_cert_without_key_is_a_bad_flag(tmp_path: Path,
                                        ca_and_cert: tuple[Path, Path, Path]) -> None:
    _, cert_pem, _ = ca_and_cert
    done = subprocess.run([sys.executable, "-m", "daemon", "--data-dir", str(tmp_path / "d"),
                           "--port", "0", "--certfile", str(cert_pem)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--certfile and --keyfile go together" in done.stderr


def test_an_unreadable_key_stops_the_start_with_one_line(
        tmp_path: Path, ca_and_cert: tuple[Path, Path, Path]) -> None:
    _, cert_pem, _ = ca_and_cert
    done = subprocess.run([sys.executable, "-m", "daemon", "--data-dir", str(tmp_path / "d"),
                           "--port", "0", "--certfile", str(cert_pem),
                           "--keyfile", str(tmp_path / "missing.pem")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "cannot serve TLS with --certfile" in done.stderr
    assert "Traceback" not in done.stderr


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sdk", *args], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "TURNKEEPER_CA_FILE": ""})


def test_the_cli_speaks_https_with_a_ca_file(tls_daemon: RunningDaemon,
                                             ca_and_cert: tuple[Path, Path, Path]) -> None:
    ca_pem, _, _ = ca_and_cert
    created = _cli("--url", tls_daemon.url, "--ca-file", str(ca_pem), "create")
    assert created.returncode == 0, created.stderr
    sid = created.stdout.strip()
    prompted = _cli("--url", tls_daemon.url, "--ca-file", str(ca_pem), "prompt", sid,
                    "hi mock:chunks=3")
    assert prompted.returncode == 0, prompted.stderr
    assert "chunk-2" in prompted.stdout
    untrusted = _cli("--url", tls_daemon.url, "create")
    assert untrusted.returncode == 3
    assert "certificate is not trusted" in untrusted.stderr
    assert "--ca-file" in untrusted.stderr
