"""The workload of ``python -m benchmarks client``: client-side decode and reduce, in one process.

Run by :mod:`benchmarks.client` as a script in a child process, once per checkout and event
loop compared::

    python benchmarks/client_workload.py --tree CHECKOUT --backend asyncio \
        --rows model_sse,sdk_handle,replay --repeat 2 --frames 40000 --history 200000 --live 10000

It puts ``CHECKOUT`` first on ``sys.path`` (and checks ``sdk`` and ``webui_model`` really load
from there), then measures (CPU seconds of this process, and wall seconds beside them), ``--repeat`` times
each after one small warm-up pass, every row
inside one ``anyio.run`` of ``--backend`` (``trio``, ``asyncio`` or ``uvloop``; a checkout from
before the SDK ran on anyio is measured on ``trio`` only):

- ``model_sse``: the SSE body of ``--frames`` realistic frames (one long agent turn: a bridge
  echo of the prompt, a live ``history_truncated`` marker, thought runs, tool calls and their
  updates, answer text chunks, usage-only chunks, one unknown event type, the terminal), fed
  in 64 KiB reads to ``sdk.SSEParser`` and every event dispatched into a
  ``webui_model.TranscriptStore`` (the WebUI model's live path, without the network);
- ``sdk_handle``: the same body served by an ``httpx.MockTransport`` to a real
  ``sdk.SessionHandle`` subscription (EventStream, parser, cursor, taps, callback), timed from
  ``subscribe`` to the terminal;
- ``sse_socket`` / ``ws_socket``: the same events over a real loopback socket (the loop's own
  network stack), served by a child process of this script (``--serve sse|ws``: plain blocking
  sockets, the whole turn written at once) as an SSE body or as WebSocket text messages, to a
  ``SessionHandle`` with ``transport="sse"`` / ``"ws"``, timed from ``subscribe`` to the terminal;
- ``replay``: the in-process scale row of ``benchmarks/repair_cost.py``: a 200,000-event
  history plus a 10,000-entry live journal (with its marker), ``replay_snapshot`` and one store
  ``reset``;
- ``load_replay``: the same snapshot as a load answer's bytes, through
  ``DaemonClient.load_session`` (``httpx.MockTransport``) and then replayed the same way.

Only names that existed before the typed protocol are used (``sdk.SSEParser``, ``sdk.DaemonEvent``,
``sdk.DaemonClient``, ``sdk.SessionHandle``, ``webui_model``), and subscriptions run in an anyio
task group (a Trio nursery underneath on ``trio``), so the same workload measures an old
checkout and a new one. Each row also reports a digest of what it built (block count and
text length), and the driver checks the checkouts agree, so a faster checkout cannot be one
that skipped work. Prints one JSON object on stdout.

Standalone on purpose: it must not import the ``benchmarks`` package, which the checkout being
measured may have in another version.
"""

from __future__ import annotations

import argparse
import base64
import gc
import hashlib
import json
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Literal

import msgspec

SID = "97ea491e-c339-49c7-a124-7737fb961931"
PROMPT = "70ed4f91-1eaf-4a5f-947b-012de441327f"
CLIENT = "client_e9d029a4-d686-465d-a72d-61b99f2769ba"
READ_SIZE = 65536
STAMP0 = 1796204622451

ROWS = ("model_sse", "sdk_handle", "sse_socket", "ws_socket", "replay", "load_replay")
BACKENDS: dict[str, tuple[str, dict[str, Any]]] = {
    "trio": ("trio", {}),
    "asyncio": ("asyncio", {}),
    "uvloop": ("asyncio", {"use_uvloop": True}),
}
EPOCH = "bench-epoch"


def _epoch_header() -> str:
    """The epoch header's name, from the measured checkout's protocol: imported when used, after
    ``main`` has put that checkout first on ``sys.path`` (a module-level import would load this
    checkout's ``sdk`` before it)."""
    from sdk.protocol.headers import EVENT_EPOCH

    return EVENT_EPOCH


def _epoch_line() -> bytes:
    return _epoch_header().lower().encode() + b": "

Spent = tuple[float, float]
"""(CPU seconds of this process, wall seconds): on a shared machine the wall time mostly
measures the neighbours, the CPU time what the client itself spent."""
Measured = tuple[Spent, int, dict[str, int]]


def _now() -> Spent:
    return time.process_time(), time.perf_counter()


def _since(start: Spent) -> Spent:
    cpu, wall = _now()
    return cpu - start[0], wall - start[1]

_encode = msgspec.json.encode


# --- the frames ---------------------------------------------------------------------------------


def _envelope(event_id: int, kind: str, data: dict[str, Any], *, prompt: bool = True) -> bytes:
    # The reference daemon's key order (its samples): id, v, type, data, promptId,
    # originatorClientId, _meta.
    env: dict[str, Any] = {"id": event_id, "v": 1, "type": kind, "data": data}
    if prompt:
        env["promptId"] = PROMPT
        env["originatorClientId"] = CLIENT
    env["_meta"] = {"serverTimestamp": STAMP0 + event_id}
    return _encode(env)


def _update(update: dict[str, Any]) -> dict[str, Any]:
    return {"sessionId": SID, "update": update}


def _chunk(kind: str, text: str, meta: dict[str, Any] | None = None) -> dict[str, Any]:
    update: dict[str, Any] = {"content": {"text": text, "type": "text"}, "sessionUpdate": kind}
    if meta is not None:
        update["_meta"] = meta
    return _update(update)


def turn_envelopes(frames: int) -> list[bytes]:
    """``frames`` envelopes of one long agent turn, ending with its ``turn_complete``."""
    if frames < 16:
        raise ValueError(f"frames must be >= 16, got {frames}")
    out: list[bytes] = []

    def add(kind: str, data: dict[str, Any], *, prompt: bool = True) -> None:
        out.append(_envelope(len(out) + 1, kind, data, prompt=prompt))

    add("session_update", _chunk("user_message_chunk", "refactor the parser and run the tests",
                                 {"serverTimestamp": STAMP0, "source": "bridge-echo"}))
    add("history_truncated", {
        "reason": "replay_window_exceeded", "scope": "live_journal", "truncatedEvents": 5000,
        "retainedEvents": frames, "maxBytes": 8388608, "maxEvents": 10000,
        "fullTranscriptAvailable": True, "promptId": PROMPT})
    add("agent_lifecycle_hint", {"sessionId": SID, "phase": "planning"})  # a future event type
    segment = 0
    while len(out) < frames - 1:
        segment += 1
        for i in range(12):
            add("session_update", _chunk("agent_thought_chunk", f" thinking {segment}.{i}"))
        tool = f"call_{segment}"
        add("session_update", _update({
            "sessionUpdate": "tool_call", "toolCallId": tool, "title": f"Read file {segment}",
            "kind": "read", "status": "pending",
            "locations": [{"path": f"src/module_{segment}.py"}],
            "rawInput": {"path": f"src/module_{segment}.py"}}))
        add("session_update", _update({
            "sessionUpdate": "tool_call_update", "toolCallId": tool, "status": "in_progress"}))
        add("session_update", _update({
            "sessionUpdate": "tool_call_update", "toolCallId": tool, "status": "completed",
            "content": [{"type": "content",
                         "content": {"type": "text", "text": f"{segment} lines read"}}]}))
        for i in range(90):
            add("session_update", _chunk("agent_message_chunk", f" word{segment}-{i}"))
        add("session_update", _chunk("agent_message_chunk", "", {
            "usage": {"inputTokens": 10, "outputTokens": 3, "totalTokens": 13},
            "durationMs": 277}))
    del out[frames - 1:]
    add("turn_complete", {"sessionId": SID, "stopReason": "end_turn", "promptId": PROMPT})
    return out


def sse_body(envelopes: list[bytes]) -> bytes:
    """The SSE stream the daemon writes for ``envelopes`` (``retry:`` first)."""
    parts = [b"retry: 3000\n\n"]
    for raw in envelopes:
        head = msgspec.json.decode(raw)
        parts.append(b"id: %d\nevent: %s\ndata: %s\n\n"
                     % (head["id"], head["type"].encode(), raw))
    return b"".join(parts)


def _reads(body: bytes) -> list[bytes]:
    return [body[i:i + READ_SIZE] for i in range(0, len(body), READ_SIZE)]


def _digest(blocks: Any) -> dict[str, int]:
    text = 0
    for block in blocks:
        value = getattr(block, "text", "")
        text += len(value) if isinstance(value, str) else 0
    return {"blocks": len(blocks), "text_chars": text}


# --- the rows -----------------------------------------------------------------------------------


def model_sse(body: bytes) -> Measured:
    from sdk import SSEParser
    from webui_model import DEFAULT_MAX_BLOCKS, TranscriptStore

    reads = _reads(body)
    started = _now()
    parser = SSEParser()
    store = TranscriptStore(max_blocks=DEFAULT_MAX_BLOCKS)
    dispatch = store.dispatch
    events = 0
    for data in reads:
        for event in parser.feed(data):
            dispatch(event)
            events += 1
    parser.close()
    elapsed = _since(started)
    return elapsed, events, _digest(store.blocks)


async def sdk_handle(body: bytes) -> Measured:
    import httpx

    from sdk import DaemonClient

    reads = _reads(body)

    class Body(httpx.AsyncByteStream):
        async def __aiter__(self) -> Any:
            for data in reads:
                yield data

    def answer(request: httpx.Request) -> httpx.Response:
        if not request.url.path.endswith("/events"):
            return httpx.Response(404, json={"error": "not_found"})
        return httpx.Response(200, stream=Body(), headers={
            "content-type": "text/event-stream", _epoch_header(): EPOCH})

    async with DaemonClient("http://bench.invalid",
                            transport=httpx.MockTransport(answer)) as client:
        return await _follow_to_terminal(client, "sse")


async def _follow_to_terminal(client: Any, transport: Literal["sse", "ws"]) -> Measured:
    """A ``SessionHandle`` subscription from the first event to the terminal."""
    import anyio

    from sdk import SessionHandle

    counts = {"events": 0}
    marks: dict[str, Spent] = {}
    handle = SessionHandle(client.with_client_id(None), SID, last_event_id=0,
                           transport=transport)
    async with anyio.create_task_group() as nursery:
        async def on_event(event: Any) -> None:
            counts["events"] += 1
            if event.type == "turn_complete":
                marks["end"] = _since(marks["start"])
                handle.stop()
                nursery.cancel_scope.cancel()

        marks["start"] = _now()
        handle.subscribe(nursery, on_event)
    if "end" not in marks:
        raise RuntimeError(f"the handle never delivered the terminal ({counts['events']} events)")
    return marks["end"], counts["events"], {"blocks": 0, "text_chars": 0}


async def socket_row(url: str, transport: Literal["sse", "ws"]) -> Measured:
    from sdk import DaemonClient

    async with DaemonClient(url) as client:
        return await _follow_to_terminal(client, transport)


# --- the loopback server of the socket rows (a child process: --serve) ----------------------------


def _ws_frame(payload: bytes, opcode: int = 0x1) -> bytes:
    size = len(payload)
    if size < 126:
        head = struct.pack("!BB", 0x80 | opcode, size)
    elif size < 65536:
        head = struct.pack("!BBH", 0x80 | opcode, 126, size)
    else:
        head = struct.pack("!BBQ", 0x80 | opcode, 127, size)
    return head + payload


def _read_head(conn: socket.socket) -> bytes:
    buf = b""
    while b"\r\n\r\n" not in buf:
        data = conn.recv(65536)
        if not data:
            break
        buf += data
    return buf


def _answer(conn: socket.socket, kind: str, envelopes: list[bytes], sse: bytes) -> None:
    with conn:
        head = _read_head(conn)
        if kind == "sse":
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                         + _epoch_line() + EPOCH.encode() + b"\r\n"
                         b"connection: close\r\n\r\n" + sse)
            return
        key = b""
        for line in head.split(b"\r\n"):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"sec-websocket-key":
                key = value.strip()
        accept = base64.b64encode(
            hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
        conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\n"
                     b"connection: upgrade\r\nsec-websocket-accept: " + accept + b"\r\n"
                     + _epoch_line() + EPOCH.encode() + b"\r\n\r\n"
                     + b"".join(_ws_frame(raw) for raw in envelopes)
                     + _ws_frame(struct.pack("!H", 1000), opcode=0x8))
        while conn.recv(65536):  # until the client's close frame and EOF
            pass


def serve(kind: str, frames: int) -> None:
    """Serve the turn on 127.0.0.1 until stdin closes; prints the URL first."""
    envelopes = turn_envelopes(frames)
    sse = sse_body(envelopes)
    listener = socket.create_server(("127.0.0.1", 0))
    print(f"http://127.0.0.1:{listener.getsockname()[1]}", flush=True)

    def accept_forever() -> None:
        while True:
            conn, _ = listener.accept()
            threading.Thread(target=_answer, args=(conn, kind, envelopes, sse),
                             daemon=True).start()

    threading.Thread(target=accept_forever, daemon=True).start()
    sys.stdin.read()  # the parent closes it (or exits)


class Server:
    """``--serve KIND`` in a child process, for one socket row."""

    def __init__(self, kind: str, frames: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--serve", kind, "--frames", str(frames)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.url = self.proc.stdout.readline().strip()
        if not self.url:
            raise RuntimeError(f"the {kind} server did not start")

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(10)


def _scale_events(history_n: int, live_n: int) -> tuple[list[Any], list[Any]]:
    """The events of ``benchmarks/repair_cost.py``'s scale row, built the same way."""
    from sdk import DaemonEvent

    scale_sid = "00000000-0000-4000-8000-0000000000aa"
    scale_prompt = "00000000-0000-4000-8000-0000000000bb"

    def su(update: dict[str, object], event_id: int, prompt: str | None = None) -> Any:
        return DaemonEvent(type="session_update", id=event_id, prompt_id=prompt,
                           data={"sessionId": scale_sid, "update": update})

    history = [su({"sessionUpdate": "tool_call", "toolCallId": f"h{i}", "title": f"h{i}",
                   "status": "completed"}, i + 1) for i in range(history_n)]
    live: list[Any] = [DaemonEvent(type="history_truncated", prompt_id=scale_prompt, data={
        "reason": "replay_window_exceeded", "scope": "live_journal", "truncatedEvents": 5000,
        "retainedEvents": live_n, "maxBytes": 8388608, "maxEvents": 10000,
        "fullTranscriptAvailable": True})]
    base_id = history_n + 100_000
    for i in range(live_n):
        live.append(su({"sessionUpdate": "agent_message_chunk",
                        "content": {"type": "text", "text": f" w{i}"}}, base_id + i, scale_prompt))
    return history, live


def _replay(history: list[Any], live: list[Any]) -> Any:
    from webui_model import DEFAULT_MAX_BLOCKS, TranscriptStore, replay_snapshot

    result = replay_snapshot(history, live, configured_max_blocks=DEFAULT_MAX_BLOCKS,
                             pagination_enabled=True)
    store = TranscriptStore(max_blocks=DEFAULT_MAX_BLOCKS)
    store.reset(result.state)
    if result.marker_state is None:
        raise RuntimeError("the replay did not capture the live marker's checkpoint state")
    return store


def replay(history_n: int, live_n: int) -> Measured:
    history, live = _scale_events(history_n, live_n)
    started = _now()
    store = _replay(history, live)
    elapsed = _since(started)
    return elapsed, len(history) + len(live), _digest(store.blocks)


def load_answer(history_n: int, live_n: int) -> bytes:
    """A ``POST /session/{id}/load`` answer holding the scale row's snapshot, as bytes."""
    history, live = _scale_events(history_n, live_n)

    def frame(event: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if event.id is not None:
            out["id"] = event.id
        out.update(v=1, type=event.type, data=event.data)
        if event.prompt_id is not None:
            out["promptId"] = event.prompt_id
        return out

    return _encode({
        "sessionId": SID, "workspaceCwd": "/srv/workspace", "attached": True,
        "clientId": CLIENT, "createdAt": "2026-12-02T09:43:34.405Z", "state": {},
        "hasRunningBackgroundTasks": False, "hasActivePrompt": True,
        "compactedReplay": [frame(e) for e in history],
        "liveJournal": [frame(e) for e in live],
        "lastEventId": history_n + 100_000 + live_n - 1,
        "eventEpoch": "4b2d7775-0118-4dc1-96b7-f333ca18ab6e",
    })


async def load_replay(answer_body: bytes) -> Measured:
    import httpx

    from sdk import DaemonClient

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=answer_body,
                              headers={"content-type": "application/json"})

    async with DaemonClient("http://bench.invalid",
                            transport=httpx.MockTransport(answer)) as client:
        started = _now()
        result = await client.load_session(SID)
        store = _replay(list(result.compacted_replay), list(result.live_journal))
        elapsed = _since(started)
        events = len(result.compacted_replay) + len(result.live_journal)
        return elapsed, events, _digest(store.blocks)


# --- the driver's side ----------------------------------------------------------------------------


def _check_tree(tree: Path) -> None:
    for name in ("sdk", "webui_model"):
        module = __import__(name)
        where = Path(module.__file__ or "").resolve()
        if tree not in where.parents:
            raise RuntimeError(f"{name} loaded from {where}, not from {tree}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--tree", type=Path,
                        help="the checkout whose sdk/ and webui_model/ are measured")
    parser.add_argument("--backend", choices=sorted(BACKENDS), default="trio")
    parser.add_argument("--rows", default=",".join(ROWS))
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--frames", type=int, default=40_000)
    parser.add_argument("--history", type=int, default=200_000)
    parser.add_argument("--live", type=int, default=10_000)
    parser.add_argument("--serve", choices=("sse", "ws"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.serve, args.frames)
        return 0
    if args.tree is None:
        parser.error("--tree is required")
    tree = args.tree.resolve()
    sys.path.insert(0, str(tree))
    _check_tree(tree)
    rows = [r for r in args.rows.split(",") if r]
    unknown = sorted(set(rows) - set(ROWS))
    if unknown:
        parser.error(f"unknown rows {unknown}; known: {', '.join(ROWS)}")
    import anyio

    backend, options = BACKENDS[args.backend]
    results = anyio.run(_measure, args, rows, backend=backend, backend_options=options)
    print(json.dumps({"tree": str(tree), "backend": args.backend, "rows": results}))
    return 0


async def _measure(args: argparse.Namespace, rows: list[str]) -> dict[str, Any]:
    """Every row, inside the one running loop."""
    body = sse_body(turn_envelopes(args.frames))
    small = sse_body(turn_envelopes(min(args.frames, 2_000)))
    answer_body = load_answer(args.history, args.live) if "load_replay" in rows else b""
    small_answer = load_answer(min(args.history, 2_000), min(args.live, 200)) \
        if "load_replay" in rows else b""
    servers = {kind: Server(kind, args.frames) for kind in ("sse", "ws")
               if f"{kind}_socket" in rows}

    async def sync(fn: Callable[[], Measured]) -> Measured:
        return fn()

    work: dict[str, Callable[[bool], Awaitable[Measured]]] = {
        "model_sse": lambda warm: sync(lambda: model_sse(small if warm else body)),
        "sdk_handle": lambda warm: sdk_handle(small if warm else body),
        "sse_socket": lambda warm: socket_row(servers["sse"].url, "sse"),
        "ws_socket": lambda warm: socket_row(servers["ws"].url, "ws"),
        "replay": lambda warm: sync(lambda: replay(min(args.history, 2_000), min(args.live, 200))
                                    if warm else replay(args.history, args.live)),
        "load_replay": lambda warm: load_replay(small_answer if warm else answer_body),
    }
    results: dict[str, Any] = {}
    try:
        for row in rows:
            await work[row](True)
            seconds: list[float] = []
            wall: list[float] = []
            events = 0
            digest: dict[str, int] = {}
            for _ in range(args.repeat):
                gc.collect()
                (cpu_s, wall_s), events, digest = await work[row](False)
                seconds.append(cpu_s)
                wall.append(wall_s)
            sse_bytes = len(body) if row in ("model_sse", "sdk_handle", "sse_socket") else None
            results[row] = {"seconds": seconds, "wall": wall, "events": events,
                            "digest": digest, "sse_bytes": sse_bytes}
    finally:
        for server in servers.values():
            server.close()
    return results


if __name__ == "__main__":
    sys.exit(main())
