"""The workload of ``python -m benchmarks client``: client-side decode and reduce, in one process.

Run by :mod:`benchmarks.client` as a script in a child process, once per checkout compared::

    python benchmarks/client_workload.py --tree CHECKOUT --rows model_sse,sdk_handle,replay \
        --repeat 2 --frames 40000 --history 200000 --live 10000

It puts ``CHECKOUT`` first on ``sys.path`` (and checks ``sdk`` and ``webui_model`` really load
from there), then measures, ``--repeat`` times each after one small warm-up pass:

- ``model_sse``: the SSE body of ``--frames`` realistic frames (one long agent turn: a bridge
  echo of the prompt, a live ``history_truncated`` marker, thought runs, tool calls and their
  updates, answer text chunks, usage-only chunks, one unknown event type, the terminal), fed
  in 64 KiB reads to ``sdk.sse.SSEParser`` and every event dispatched into a
  ``webui_model.TranscriptStore`` (the WebUI model's live path, without the network);
- ``sdk_handle``: the same body served by an ``httpx.MockTransport`` to a real
  ``sdk.SessionHandle`` subscription (EventStream, parser, cursor, taps, callback), timed from
  ``subscribe`` to the terminal;
- ``replay``: the in-process scale row of ``benchmarks/repair_cost.py``: a 200,000-event
  history plus a 10,000-entry live journal (with its marker), ``replay_snapshot`` and one store
  ``reset``;
- ``load_replay``: the same snapshot as a load answer's bytes, through
  ``DaemonClient.load_session`` (``httpx.MockTransport``) and then replayed the same way.

Only names that existed before the typed protocol are used (``sdk.sse``, ``sdk.events``,
``sdk.DaemonClient``, ``sdk.SessionHandle``, ``webui_model``), so the same workload measures an
old checkout and a new one. Each row also reports a digest of what it built (block count and
text length), and the driver checks the checkouts agree, so a faster checkout cannot be one
that skipped work. Prints one JSON object on stdout.

Standalone on purpose: it must not import the ``benchmarks`` package, which the checkout being
measured may have in another version.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

SID = "97ea491e-c339-49c7-a124-7737fb961931"
PROMPT = "70ed4f91-1eaf-4a5f-947b-012de441327f"
CLIENT = "client_e9d029a4-d686-465d-a72d-61b99f2769ba"
READ_SIZE = 65536
STAMP0 = 1796204622451

ROWS = ("model_sse", "sdk_handle", "replay", "load_replay")

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


def model_sse(body: bytes) -> tuple[float, int, dict[str, int]]:
    from sdk.sse import SSEParser
    from webui_model import DEFAULT_MAX_BLOCKS, TranscriptStore

    reads = _reads(body)
    started = time.perf_counter()
    parser = SSEParser()
    store = TranscriptStore(max_blocks=DEFAULT_MAX_BLOCKS)
    dispatch = store.dispatch
    events = 0
    for data in reads:
        for event in parser.feed(data):
            dispatch(event)
            events += 1
    parser.close()
    elapsed = time.perf_counter() - started
    return elapsed, events, _digest(store.blocks)


def sdk_handle(body: bytes) -> tuple[float, int, dict[str, int]]:
    import httpx
    import trio

    from sdk import DaemonClient, SessionHandle

    reads = _reads(body)

    class Body(httpx.AsyncByteStream):
        async def __aiter__(self) -> Any:
            for data in reads:
                yield data

    def answer(request: httpx.Request) -> httpx.Response:
        if not request.url.path.endswith("/events"):
            return httpx.Response(404, json={"error": "not_found"})
        return httpx.Response(200, stream=Body(), headers={
            "content-type": "text/event-stream", "x-qwen-event-epoch": "bench-epoch"})

    counts = {"events": 0, "text": 0}
    marks: dict[str, float] = {}

    async def main() -> None:
        async with DaemonClient("http://bench.invalid",
                                transport=httpx.MockTransport(answer)) as client:
            handle = SessionHandle(client.with_client_id(None), SID, last_event_id=0)
            async with trio.open_nursery() as nursery:
                async def on_event(event: Any) -> None:
                    counts["events"] += 1
                    if event.type == "turn_complete":
                        marks["end"] = time.perf_counter()
                        handle.stop()
                        nursery.cancel_scope.cancel()

                marks["start"] = time.perf_counter()
                handle.subscribe(nursery, on_event)

    trio.run(main)
    if "end" not in marks:
        raise RuntimeError(f"the handle never delivered the terminal ({counts['events']} events)")
    return marks["end"] - marks["start"], counts["events"], {"blocks": 0, "text_chars": 0}


def _scale_events(history_n: int, live_n: int) -> tuple[list[Any], list[Any]]:
    """The events of ``benchmarks/repair_cost.py``'s scale row, built the same way."""
    from sdk.events import DaemonEvent

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


def replay(history_n: int, live_n: int) -> tuple[float, int, dict[str, int]]:
    history, live = _scale_events(history_n, live_n)
    started = time.perf_counter()
    store = _replay(history, live)
    elapsed = time.perf_counter() - started
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
    })


def load_replay(answer_body: bytes) -> tuple[float, int, dict[str, int]]:
    import httpx
    import trio

    from sdk import DaemonClient

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=answer_body,
                              headers={"content-type": "application/json"})

    out: dict[str, Any] = {}

    async def main() -> None:
        async with DaemonClient("http://bench.invalid",
                                transport=httpx.MockTransport(answer)) as client:
            started = time.perf_counter()
            result = await client.load_session(SID)
            store = _replay(list(result.compacted_replay), list(result.live_journal))
            out["elapsed"] = time.perf_counter() - started
            out["events"] = len(result.compacted_replay) + len(result.live_journal)
            out["digest"] = _digest(store.blocks)

    trio.run(main)
    return out["elapsed"], out["events"], out["digest"]


# --- the driver's side ----------------------------------------------------------------------------


def _check_tree(tree: Path) -> None:
    for name in ("sdk", "webui_model"):
        module = __import__(name)
        where = Path(module.__file__ or "").resolve()
        if tree not in where.parents:
            raise RuntimeError(f"{name} loaded from {where}, not from {tree}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--tree", required=True, type=Path,
                        help="the checkout whose sdk/ and webui_model/ are measured")
    parser.add_argument("--rows", default=",".join(ROWS))
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--frames", type=int, default=40_000)
    parser.add_argument("--history", type=int, default=200_000)
    parser.add_argument("--live", type=int, default=10_000)
    args = parser.parse_args(argv)
    tree = args.tree.resolve()
    sys.path.insert(0, str(tree))
    _check_tree(tree)
    rows = [r for r in args.rows.split(",") if r]
    unknown = sorted(set(rows) - set(ROWS))
    if unknown:
        parser.error(f"unknown rows {unknown}; known: {', '.join(ROWS)}")
    body = sse_body(turn_envelopes(args.frames))
    small = sse_body(turn_envelopes(min(args.frames, 2_000)))
    answer_body = load_answer(args.history, args.live) if "load_replay" in rows else b""
    small_answer = load_answer(min(args.history, 2_000), min(args.live, 200)) \
        if "load_replay" in rows else b""
    work: dict[str, tuple[Callable[[], Any], Callable[[], Any]]] = {
        "model_sse": (lambda: model_sse(body), lambda: model_sse(small)),
        "sdk_handle": (lambda: sdk_handle(body), lambda: sdk_handle(small)),
        "replay": (lambda: replay(args.history, args.live),
                   lambda: replay(min(args.history, 2_000), min(args.live, 200))),
        "load_replay": (lambda: load_replay(answer_body), lambda: load_replay(small_answer)),
    }
    results: dict[str, Any] = {}
    for row in rows:
        measure, warm_up = work[row]
        warm_up()
        seconds: list[float] = []
        events = 0
        digest: dict[str, int] = {}
        for _ in range(args.repeat):
            gc.collect()
            elapsed, events, digest = measure()
            seconds.append(elapsed)
        results[row] = {"seconds": seconds, "events": events, "digest": digest,
                        "sse_bytes": len(body) if row in ("model_sse", "sdk_handle") else None}
    print(json.dumps({"tree": str(tree), "rows": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
