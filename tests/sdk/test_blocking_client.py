"""The blocking SDK (``SyncDaemonClient``, ``SyncSessionHandle``) against the real daemon: the
async client's methods, results, errors and timeouts; events through a plain ``for`` loop over
SSE and WebSocket; callbacks in the caller's thread; leaving a loop early stops its stream; and
Ctrl-C (a real SIGINT to a real subprocess) stops a blocked stream and a blocked prompt cleanly.
"""

from __future__ import annotations

import inspect
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sdk import (
    AuthError,
    DaemonClient,
    DaemonEvent,
    SessionHandle,
    SessionNotFoundError,
    SyncDaemonClient,
    SyncSessionHandle,
    TransportError,
    TurnError,
)
from sdk._session import SubscriptionState
from tests.harness import RunningDaemon, running_daemon
from tests.sse_client import chunk_kind, text_of

pytestmark = pytest.mark.processes  # starts processes: not in make unit-fast

TOKEN = "sync-token"
WAIT_S = 30.0
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    with running_daemon(tmp_path_factory.mktemp("sdk-sync"), ["--token", TOKEN]) as d:
        yield d


@pytest.fixture
def client(daemon: RunningDaemon) -> Iterator[SyncDaemonClient]:
    with SyncDaemonClient(daemon.url, token=TOKEN) as sync_client:
        yield sync_client


def gate_name(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:12]}"


def until(predicate: Callable[[], bool], what: str) -> None:
    """Poll a condition a client cannot be told about (the daemon's subscriber count), bounded."""
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def agent_texts(events: list[DaemonEvent]) -> list[str]:
    return [text_of(e) for e in events if chunk_kind(e) == "agent_message_chunk"]


# --- the surface ------------------------------------------------------------------------------


def _public_methods(cls: type) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(member)
        for name, member in vars(cls).items()
        if not name.startswith("_") and callable(member) and not isinstance(member, type)
    }


def test_every_async_client_method_has_a_blocking_twin_with_the_same_parameters() -> None:
    mine = _public_methods(SyncDaemonClient)
    theirs = _public_methods(DaemonClient)
    assert set(theirs) - set(mine) == {"aclose"}  # close() instead
    for name, signature in theirs.items():
        if name == "aclose":
            continue
        ours = list(mine[name].parameters.values())
        expected = list(signature.parameters.values())
        # events() may take more (the transport), never fewer or different ones.
        assert ours[: len(expected)] == expected, name
        assert name == "events" or len(ours) == len(expected), name


# --- request/response -------------------------------------------------------------------------


def test_export_streams_the_whole_transcript_with_a_plain_for_loop(
    client: SyncDaemonClient,
) -> None:
    created = client.create_session(scope="thread")
    accepted = client.send_prompt(created.session_id, "exported mock:chunks=3")
    with client.events(created.session_id, 0) as stream:
        for event in stream:
            if event.type == "turn_complete" and event.prompt_id == accepted.prompt_id:
                break
    with client.export_session(created.session_id) as chunks:
        body = b"".join(chunks)
    types = [json.loads(line)["type"] for line in body.splitlines()]
    assert types[-1] == "turn_complete" and "session_update" in types
    with client.export_session(created.session_id, "markdown") as chunks:
        text = b"".join(chunks).decode()
    assert text.startswith(f"# Session {created.session_id}") and "chunk-0chunk-1chunk-2" in text
    with pytest.raises(SessionNotFoundError), client.export_session("no-such-session"):
        pass



def test_methods_return_the_async_clients_typed_results(
    client: SyncDaemonClient, daemon: RunningDaemon
) -> None:
    assert client.health().status == "ok"
    assert client.capabilities().supports("session_transcript_pagination")
    created = client.create_session(scope="thread")
    assert client.client_id == created.client_id  # adopted, as the async client does
    accepted = client.send_prompt(created.session_id, "sync mock:chunks=3")
    assert accepted.prompt_id and accepted.last_event_id is not None
    loaded = client.load_session(created.session_id)
    assert loaded.session_id == created.session_id
    status = client.session_status(created.session_id)
    assert status.session_id == created.session_id
    stats = client.statistics()
    assert (stats.count("create"), stats.prompts, stats.loads) == (1, 1, 1)


def test_a_prompt_sent_twice_with_its_key_is_admitted_once_and_can_be_found(
    client: SyncDaemonClient, daemon: RunningDaemon
) -> None:
    """The blocking client sends the key it is given (and the handle does too): the same key
    again answers the first admission, and find_prompt reads it back."""
    sid = client.create_session(scope="thread").session_id
    text = f"keyed {uuid.uuid4().hex} mock:chunks=1"
    key = f"sync-{uuid.uuid4().hex}"
    first = client.send_prompt(sid, text, idempotency_key=key)
    assert client.send_prompt(sid, text, idempotency_key=key) == first
    assert client.find_prompt(sid, f"never-{uuid.uuid4().hex}") is None
    handle = SyncSessionHandle(client, SessionHandle(client.client, sid))
    done = handle.prompt(text, idempotency_key=key)  # the same prompt: its terminal, no rerun
    assert done.prompt_id == first.prompt_id
    found = client.find_prompt(sid, key)
    assert found is not None and (found.prompt_id, found.state) == (first.prompt_id, "completed")
    assert sum(text in line for line in daemon.prompts()) == 1


def test_errors_are_the_async_clients(client: SyncDaemonClient, daemon: RunningDaemon) -> None:
    with pytest.raises(SessionNotFoundError) as missing:
        client.session_status("no-such-session")
    assert missing.value.status == 404 and missing.value.code == "session_not_found"
    with SyncDaemonClient(daemon.url, token="wrong") as bad, pytest.raises(AuthError) as auth:
        bad.create_session()
    assert auth.value.status == 401
    with pytest.raises(ValueError):
        SyncDaemonClient("ftp://nowhere")  # refused before any thread starts


def test_the_timeout_applies_as_in_the_async_client() -> None:
    # A server that accepts and never answers: the request must fail after `timeout`.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        with SyncDaemonClient(url, timeout=0.3) as sync_client:
            started = time.monotonic()
            with pytest.raises(TransportError, match="timed out"):
                sync_client.health()
            assert time.monotonic() - started < 10


# --- events -----------------------------------------------------------------------------------


@pytest.mark.parametrize("transport", ["sse", "ws"])
def test_events_through_a_for_loop_follow_the_cursor(
    client: SyncDaemonClient, transport: str
) -> None:
    created = client.create_session(scope="thread")
    sid = created.session_id
    accepted = client.send_prompt(sid, "loop mock:chunks=200")
    seen: list[DaemonEvent] = []
    with client.events(sid, 0, created.event_epoch, transport=transport) as stream:  # type: ignore[arg-type]
        assert stream.epoch == created.event_epoch
        for event in stream:
            seen.append(event)
            assert stream.last_event_id == max(e.id for e in seen if e.id is not None)
            if event.type == "turn_complete":
                break
    ids = [e.id for e in seen if e.id is not None]
    assert ids == list(range(1, len(ids) + 1)), "gap or duplicate"
    assert agent_texts(seen) == [f"chunk-{i}" for i in range(200)]
    assert seen[-1].data["promptId"] == accepted.prompt_id
    # Leaving the `with` closed the stream: the daemon drops the subscriber.
    until(lambda: client.session_status(sid).subscribers == 0, "the stream to close")


def test_a_stream_refused_on_open_raises_before_the_first_event(
    client: SyncDaemonClient,
) -> None:
    with pytest.raises(SessionNotFoundError), client.events("no-such-session", 0):
        pass


# --- the session handle -----------------------------------------------------------------------


def test_prompt_calls_back_in_the_callers_thread(client: SyncDaemonClient) -> None:
    handle = SyncSessionHandle.create(client)
    threads: set[str] = set()
    updates: list[DaemonEvent] = []
    accepted: list[str] = []

    def on_update(event: DaemonEvent) -> None:
        threads.add(threading.current_thread().name)
        updates.append(event)

    done = handle.prompt("hello mock:chunks=4", on_update=on_update,
                         on_accepted=lambda a: accepted.append(a.prompt_id))
    assert done.stop_reason == "end_turn" and accepted == [done.prompt_id]
    assert threads == {threading.current_thread().name}
    assert agent_texts(updates) == [f"chunk-{i}" for i in range(4)]
    assert updates[-1].type == "turn_complete"
    with pytest.raises(TurnError) as failed:
        handle.prompt("no mock:mode=reject")
    assert failed.value.code == "-32603"
    handle.close()


def test_follow_reconnects_like_the_async_handle_and_stops_when_left(
    client: SyncDaemonClient,
) -> None:
    handle = SyncSessionHandle.create(client)
    first = handle.prompt("before mock:chunks=2")
    events = handle.follow()
    seen: list[DaemonEvent] = []
    for event in events:
        seen.append(event)
        if event.type == "turn_complete" and event.data["promptId"] == first.prompt_id:
            break
    assert handle.last_event_id == seen[-1].id
    events.close()  # leaving the loop stops the subscription
    assert handle.state is SubscriptionState.IDLE
    until(lambda: client.session_status(handle.session_id).subscribers == 0,
          "the subscription to stop")
    # From the kept cursor: a later turn arrives, nothing repeats.
    later = client.with_client_id(None).send_prompt(handle.session_id, "later mock:chunks=2")
    more: list[DaemonEvent] = []
    for event in handle.follow():
        more.append(event)
        if event.type == "turn_complete" and event.data["promptId"] == later.prompt_id:
            break
    assert more[0].id == seen[-1].id + 1  # type: ignore[operator]
    assert agent_texts(more) == ["chunk-0", "chunk-1"]
    # The subscription's final error ends the loop: the session is closed.
    client.close_session(handle.session_id)
    with pytest.raises(SessionNotFoundError):
        for _event in handle.follow():
            pass


def test_the_trio_backend_drives_the_same_client(daemon: RunningDaemon) -> None:
    with SyncDaemonClient(daemon.url, token=TOKEN, backend="trio") as on_trio:
        handle = SyncSessionHandle.create(on_trio)
        done = handle.prompt("trio mock:chunks=1")
        assert done.stop_reason == "end_turn"
        handle.close()


# --- Ctrl-C -----------------------------------------------------------------------------------

CHILD = textwrap.dedent("""
    import sys, threading
    from sdk import SyncDaemonClient, SyncSessionHandle

    url, token, sid, mode, gate = sys.argv[1:6]
    with SyncDaemonClient(url, token=token) as client:
        try:
            if mode == "stream":
                with client.events(sid, 0) as stream:
                    for event in stream:
                        if event.type == "replay_complete":
                            print("blocked", flush=True)
            else:
                handle = SyncSessionHandle.create(client)
                print("session", handle.session_id, flush=True)
                handle.prompt(f"held mock:chunks=1 mock:gate={gate}",
                              on_update=lambda e: print("blocked", flush=True)
                              if e.type == "session_update" and "chunk-0" in str(e.data)
                              else None)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            sys.stdin.readline()  # the test checks the daemon's side meanwhile
    print("threads", sorted(t.name for t in threading.enumerate()), flush=True)
""")


class Child:
    def __init__(self, argv: list[str]) -> None:
        self.proc = subprocess.Popen(
            argv, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.buf = b""

    def read_until(self, needle: bytes) -> str:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + WAIT_S
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            while needle not in self.buf:
                remaining = deadline - time.monotonic()
                assert remaining > 0, f"no {needle!r} in time: {self.buf!r}"
                if sel.select(remaining):
                    chunk = os.read(self.proc.stdout.fileno(), 4096)
                    assert chunk, f"exited before {needle!r}: {self.buf!r} {self.stderr()}"
                    self.buf += chunk
        return self.buf.decode()

    def stderr(self) -> str:
        if self.proc.poll() is None or self.proc.stderr is None:
            return ""
        return self.proc.stderr.read().decode(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.mark.parametrize("mode", ["stream", "prompt"])
def test_ctrl_c_stops_a_blocked_call_and_closes_its_stream(
    client: SyncDaemonClient, daemon: RunningDaemon, mode: str
) -> None:
    gate = gate_name("sigint")
    sid = client.create_session(scope="thread").session_id if mode == "stream" else "-"
    child = Child([sys.executable, "-c", CHILD, daemon.url, TOKEN, sid, mode, gate])
    try:
        head = child.read_until(b"blocked")
        if mode == "prompt":
            sid = head.split("session ", 1)[1].split()[0]
        assert client.session_status(sid).subscribers == 1
        child.proc.send_signal(signal.SIGINT)
        child.read_until(b"interrupted")
        # Still running, the child has already closed its stream: Ctrl-C cancelled the call in
        # the loop and let it clean up before raising.
        until(lambda: client.session_status(sid).subscribers == 0,
              "the interrupted stream to close")
        assert child.proc.stdin is not None
        out, err = child.proc.communicate(b"\n", timeout=WAIT_S)
    finally:
        daemon.open_gate(gate)
        child.stop()
    assert child.proc.returncode == 0, err.decode()
    assert "turnkeeper-sdk-loop" not in out.decode(), "the loop's thread outlived the client"
    assert b"Traceback" not in err, err.decode()
