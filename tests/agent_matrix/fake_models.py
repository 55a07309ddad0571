"""Fake model servers for the agent matrix: one loopback HTTP server that answers the four model
APIs popular ACP agents speak, each with a short deterministic reply streamed in several pieces.

- Anthropic Messages: ``POST /v1/messages`` (``stream: true`` as SSE, else one JSON message) and
  ``POST /v1/messages/count_tokens``.
- Gemini: ``POST /v1beta/models/{model}:generateContent``, ``:streamGenerateContent`` (SSE with
  ``alt=sse``, else one JSON array) and ``:countTokens``.
- OpenAI Chat Completions: ``POST /v1/chat/completions`` (chunks then ``[DONE]``, or one JSON).
- OpenAI Responses: ``POST /v1/responses`` (the ``response.*`` event sequence, or one JSON).
- ``GET /v1/models`` and ``GET /v1beta/models`` list one model, for agents that look first.

Any path prefix before those is accepted (``/api/v1/chat/completions`` too). The reply names the
newest probe word of the request (``tkprobe-<word>``, see :func:`reply_for`) so a test knows
exactly which text each turn must stream; a request without one (a title or summary request)
gets a short fixed reply. Every request is recorded (method, path, api, probe), and unknown
paths get a 404 that is recorded too, so a failing agent shows what it asked for.

Standard library only: a ``ThreadingHTTPServer`` speaking HTTP/1.1 with chunked streaming
responses, started in a thread by :func:`serving` (or ``python -m tests.agent_matrix.fake_models``
for a manual run).
"""

from __future__ import annotations

import gzip
import json
import os
import re
import threading
import time
import uuid
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

PROBE_RE = re.compile(r"tkprobe-[a-z0-9]+")
NO_PROBE_REPLY = "Fake title"
MODEL_ID = "fake-model"


def reply_for(probe: str | None) -> str:
    """The whole text the fake streams for a request whose newest probe word is ``probe``."""
    if probe is None:
        return NO_PROBE_REPLY
    return f"Fake reply to {probe}: alpha beta gamma."


def from_schema(schema: Any) -> Any:
    """The smallest value a JSON schema accepts (an enum's first choice, empty strings become
    "fake"): what the fake answers a request for structured output with, e.g. Gemini CLI's
    model router, which asks for ``{"reasoning", "model_choice"}``."""
    if not isinstance(schema, dict):
        return "fake"
    if schema.get("enum"):
        return schema["enum"][0]
    kind = str(schema.get("type", "object")).lower()
    if kind == "object":
        props = schema.get("properties") or {}
        return {name: from_schema(sub) for name, sub in props.items()}
    if kind == "array":
        return []
    if kind in ("number", "integer"):
        return schema.get("minimum", 0)
    if kind == "boolean":
        return False
    return "fake"


def pieces(text: str) -> list[str]:
    """The deltas a reply is streamed in: word by word, spaces kept."""
    return re.findall(r"\S+\s*", text) or [text]


@dataclass(frozen=True)
class Recorded:
    method: str
    path: str
    api: str
    probe: str | None
    stream: bool
    status: int
    # Every probe word the request holds, in order (the conversation the agent sent).
    probes: tuple[str, ...]
    at: float = field(default_factory=time.time)


@dataclass
class FakeModels:
    """The server's shared state: what was asked, for the test to read."""

    host: str = "127.0.0.1"
    port: int = 0
    requests: list[Recorded] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def record(self, entry: Recorded) -> None:
        with self.lock:
            self.requests.append(entry)

    def seen(self) -> list[Recorded]:
        with self.lock:
            return list(self.requests)


def _probes(body: bytes) -> tuple[str, ...]:
    return tuple(PROBE_RE.findall(body.decode("utf-8", errors="replace")))


def _sse(event: str | None, data: Any) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


# --------------------------------------------------------------------------------------------
# One reply per API: a list of SSE frames when streaming, else one JSON body


def anthropic(text: str, model: str, stream: bool) -> list[bytes] | dict[str, Any]:
    msg_id = f"msg_{uuid.uuid4().hex[:24]}"
    usage = {"input_tokens": 10, "output_tokens": len(pieces(text)),
             "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
    if not stream:
        return {"id": msg_id, "type": "message", "role": "assistant", "model": model,
                "content": [{"type": "text", "text": text}], "stop_reason": "end_turn",
                "stop_sequence": None, "usage": usage}
    frames = [
        _sse("message_start", {"type": "message_start", "message": {
            "id": msg_id, "type": "message", "role": "assistant", "model": model,
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {**usage, "output_tokens": 1}}}),
        _sse("content_block_start", {"type": "content_block_start", "index": 0,
                                     "content_block": {"type": "text", "text": ""}}),
    ]
    frames += [_sse("content_block_delta", {"type": "content_block_delta", "index": 0,
                                            "delta": {"type": "text_delta", "text": piece}})
               for piece in pieces(text)]
    frames += [
        _sse("content_block_stop", {"type": "content_block_stop", "index": 0}),
        _sse("message_delta", {"type": "message_delta",
                               "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                               "usage": {"output_tokens": usage["output_tokens"]}}),
        _sse("message_stop", {"type": "message_stop"}),
    ]
    return frames


def _gemini_chunk(piece: str, last: bool, total: int) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": [{"text": piece}]},
                                 "index": 0}
    chunk: dict[str, Any] = {"candidates": [candidate], "modelVersion": MODEL_ID}
    if last:
        candidate["finishReason"] = "STOP"
        chunk["usageMetadata"] = {"promptTokenCount": 10, "candidatesTokenCount": total,
                                  "totalTokenCount": 10 + total}
    return chunk


def gemini(text: str, stream: bool, sse: bool) -> list[bytes] | dict[str, Any] | list[Any]:
    parts = pieces(text)
    if not stream:
        return _gemini_chunk(text, True, len(parts))
    chunks = [_gemini_chunk(p, i == len(parts) - 1, len(parts)) for i, p in enumerate(parts)]
    if sse:
        return [_sse(None, chunk) for chunk in chunks]
    return chunks  # without alt=sse: one JSON array of the chunks


def chat_completions(text: str, model: str, stream: bool, usage: bool
                     ) -> list[bytes] | dict[str, Any]:
    cid = f"chatcmpl-{uuid.uuid4().hex[:24]}"
    created = int(time.time())
    counts = {"prompt_tokens": 10, "completion_tokens": len(pieces(text)),
              "total_tokens": 10 + len(pieces(text))}
    if not stream:
        return {"id": cid, "object": "chat.completion", "created": created, "model": model,
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": text}}],
                "usage": counts}
    base = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model}
    frames = [_sse(None, {**base, "choices": [{"index": 0, "finish_reason": None,
                                               "delta": {"role": "assistant", "content": ""}}]})]
    frames += [_sse(None, {**base, "choices": [{"index": 0, "finish_reason": None,
                                                "delta": {"content": piece}}]})
               for piece in pieces(text)]
    last: dict[str, Any] = {**base, "choices": [{"index": 0, "finish_reason": "stop",
                                                 "delta": {}}]}
    if usage:
        frames.append(_sse(None, last))
        last = {**base, "choices": [], "usage": counts}
    else:
        last["usage"] = counts
    frames.append(_sse(None, last))
    frames.append(b"data: [DONE]\n\n")
    return frames


def responses(text: str, model: str, stream: bool) -> list[bytes] | dict[str, Any]:
    resp_id = f"resp_{uuid.uuid4().hex[:24]}"
    item_id = f"msg_{uuid.uuid4().hex[:24]}"
    created = int(time.time())
    usage = {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 0},
             "output_tokens": len(pieces(text)),
             "output_tokens_details": {"reasoning_tokens": 0},
             "total_tokens": 10 + len(pieces(text))}
    part = {"type": "output_text", "text": text, "annotations": []}
    item = {"id": item_id, "type": "message", "status": "completed", "role": "assistant",
            "content": [part]}
    done = {"id": resp_id, "object": "response", "created_at": created, "status": "completed",
            "model": model, "output": [item], "usage": usage}
    if not stream:
        return done
    shell = {**done, "status": "in_progress", "output": [], "usage": None}
    seq = iter(range(1_000_000))

    def ev(kind: str, **data: Any) -> bytes:
        return _sse(kind, {"type": kind, "sequence_number": next(seq), **data})

    frames = [
        ev("response.created", response=shell),
        ev("response.in_progress", response=shell),
        ev("response.output_item.added", output_index=0,
           item={**item, "status": "in_progress", "content": []}),
        ev("response.content_part.added", item_id=item_id, output_index=0, content_index=0,
           part={**part, "text": ""}),
    ]
    frames += [ev("response.output_text.delta", item_id=item_id, output_index=0,
                  content_index=0, delta=piece, logprobs=[]) for piece in pieces(text)]
    frames += [
        ev("response.output_text.done", item_id=item_id, output_index=0, content_index=0,
           text=text, logprobs=[]),
        ev("response.content_part.done", item_id=item_id, output_index=0, content_index=0,
           part=part),
        ev("response.output_item.done", output_index=0, item=item),
        ev("response.completed", response=done),
    ]
    return frames


def models_list(gemini_style: bool) -> dict[str, Any]:
    if gemini_style:
        return {"models": [{"name": f"models/{MODEL_ID}", "displayName": MODEL_ID,
                            "supportedGenerationMethods": ["generateContent",
                                                           "streamGenerateContent"]}]}
    return {"object": "list", "data": [{"id": MODEL_ID, "object": "model", "created": 0,
                                        "owned_by": "fake", "type": "model",
                                        "display_name": MODEL_ID}]}


# --------------------------------------------------------------------------------------------
# The HTTP side


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass  # recorded in FakeModels.requests instead

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            data = bytearray()
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    break
                data += self.rfile.read(size)
                self.rfile.readline()
            raw = bytes(data)
        else:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        encoding = self.headers.get("Content-Encoding", "").lower()
        if encoding == "gzip":
            return gzip.decompress(raw)
        if encoding == "deflate":
            return zlib.decompress(raw)
        return raw

    def _json(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, frames: list[bytes]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for frame in frames:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(frame), frame))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        fakes = self.server.fakes
        if path.endswith("/models"):
            fakes.record(Recorded("GET", self.path, "models", None, False, 200, ()))
            self._json(200, models_list("/v1beta/" in path))
            return
        fakes.record(Recorded("GET", self.path, "unknown", None, False, 404, ()))
        self._json(404, {"error": {"message": f"fake model server: no GET {path}"}})

    def do_POST(self) -> None:
        body = self._body()
        path, _, query = self.path.partition("?")
        fakes = self.server.fakes
        try:
            request = json.loads(body or b"{}")
        except ValueError:
            request = {}
        if not isinstance(request, dict):
            request = {}
        probes = _probes(body)
        dump = os.environ.get("FAKE_MODELS_DUMP_DIR")
        if dump:  # every request body, for a look at what an agent sent
            Path(dump).mkdir(parents=True, exist_ok=True)
            (Path(dump) / f"{time.time():.3f}-{path.rsplit('/', 1)[-1]}.json").write_bytes(body)
        probe = probes[-1] if probes else None
        text = reply_for(probe)
        model = str(request.get("model") or MODEL_ID)
        stream = request.get("stream") is True
        reply: list[bytes] | dict[str, Any] | list[Any]
        if path.endswith("/messages/count_tokens"):
            api, reply, stream = "anthropic-count", {"input_tokens": 10}, False
        elif path.endswith("/messages"):
            api, reply = "anthropic", anthropic(text, model, stream)
        elif ":countTokens" in path:
            api, reply, stream = "gemini-count", {"totalTokens": 10}, False
        elif ":streamGenerateContent" in path:
            api, stream = "gemini", True
            reply = gemini(text, True, "alt=sse" in query)
        elif ":generateContent" in path:
            config = request.get("generationConfig") or {}
            if isinstance(config, dict) and config.get("responseMimeType") == "application/json":
                schema = config.get("responseJsonSchema") or config.get("responseSchema")
                text = json.dumps(from_schema(schema))
            api, reply, stream = "gemini", gemini(text, False, False), False
        elif path.endswith("/chat/completions"):
            options = request.get("stream_options")
            usage = isinstance(options, dict) and options.get("include_usage") is True
            api, reply = "chat", chat_completions(text, model, stream, usage)
        elif path.endswith("/responses"):
            api, reply = "responses", responses(text, model, stream)
        else:
            fakes.record(Recorded("POST", self.path, "unknown", probe, stream, 404, probes))
            self._json(404, {"error": {"message": f"fake model server: no POST {path}"}})
            return
        fakes.record(Recorded("POST", self.path, api, probe, stream, 200, probes))
        if isinstance(reply, list) and reply and isinstance(reply[0], bytes):
            self._stream(reply)
        else:
            self._json(200, reply)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    fakes: FakeModels


@contextmanager
def serving(host: str = "127.0.0.1") -> Iterator[FakeModels]:
    """Serve the fakes on ``host`` (a free port) in a thread for the block's duration."""
    server = _Server((host, 0), _Handler)
    fakes = FakeModels(host=host, port=server.server_address[1])
    server.fakes = fakes
    thread = threading.Thread(target=server.serve_forever, name="fake-models", daemon=True)
    thread.start()
    try:
        yield fakes
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=0)
    port = parser.parse_args().port
    server = _Server(("127.0.0.1", port), _Handler)
    server.fakes = FakeModels(port=server.server_address[1])
    print(f"fake models on {server.fakes.url}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
