"""The agent matrix's fake model servers speak each API the way its clients read it: every
streamed reply reassembles into the text :func:`reply_for` promises, ends the way the API ends a
turn, and a request for structured output gets JSON its schema accepts."""

from __future__ import annotations

import json
from typing import Any

import httpx

from tests.agent_matrix.fake_models import from_schema, reply_for, serving

PROBE = "tkprobe-unit"


def sse_data(body: str) -> list[tuple[str | None, str]]:
    frames = []
    for block in body.split("\n\n"):
        event, data = None, []
        for line in block.splitlines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                data.append(line[6:])
        if data:
            frames.append((event, "\n".join(data)))
    return frames


def post(url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    with httpx.Client(base_url=url, timeout=10) as client:
        return client.post(path, json=body)


def test_each_api_streams_the_promised_text() -> None:
    user = {"role": "user", "content": f"old tkprobe-old then {PROBE}"}
    with serving() as fakes:
        anthropic = sse_data(post(fakes.url, "/v1/messages",
                                  {"model": "m", "stream": True, "messages": [user]}).text)
        gemini = sse_data(post(fakes.url, "/v1beta/models/m:streamGenerateContent?alt=sse",
                               {"contents": [{"parts": [{"text": PROBE}]}]}).text)
        chat = sse_data(post(fakes.url, "/v1/chat/completions",
                             {"model": "m", "stream": True, "messages": [user],
                              "stream_options": {"include_usage": True}}).text)
        responses = sse_data(post(fakes.url, "/v1/responses",
                                  {"model": "m", "stream": True, "input": PROBE}).text)
        missing = post(fakes.url, "/v1/nothing", {})
        seen = fakes.seen()
    want = reply_for(PROBE)
    deltas = [json.loads(d)["delta"] for e, d in anthropic if e == "content_block_delta"]
    assert "".join(x["text"] for x in deltas) == want and len(deltas) > 1
    assert [e for e, _ in anthropic][-2:] == ["message_delta", "message_stop"]
    parts = [json.loads(d)["candidates"][0] for _, d in gemini]
    assert "".join(p["content"]["parts"][0]["text"] for p in parts) == want
    assert parts[-1]["finishReason"] == "STOP"
    assert chat[-1][1] == "[DONE]"
    chunks = [json.loads(d) for _, d in chat[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks
                   if c["choices"]) == want
    assert chunks[-1]["usage"]["completion_tokens"] == len(deltas)
    text = "".join(json.loads(d)["delta"] for e, d in responses
                   if e == "response.output_text.delta")
    assert text == want
    assert responses[-1][0] == "response.completed"
    assert json.loads(responses[-1][1])["response"]["output"][0]["content"][0]["text"] == want
    assert missing.status_code == 404
    assert [(r.api, r.probe) for r in seen] == [
        ("anthropic", PROBE), ("gemini", PROBE), ("chat", PROBE), ("responses", PROBE),
        ("unknown", None)]
    assert seen[0].probes == ("tkprobe-old", PROBE)


def test_a_request_for_json_gets_what_its_schema_accepts() -> None:
    schema = {"type": "object", "properties": {
        "reasoning": {"type": "string"}, "model_choice": {"type": "string",
                                                          "enum": ["flash", "pro"]},
        "score": {"type": "integer", "minimum": 1}, "tags": {"type": "array"}}}
    with serving() as fakes:
        body = post(fakes.url, "/v1beta/models/m:generateContent", {
            "contents": [], "generationConfig": {"responseMimeType": "application/json",
                                                 "responseJsonSchema": schema}}).json()
    answer = json.loads(body["candidates"][0]["content"]["parts"][0]["text"])
    assert answer == {"reasoning": "fake", "model_choice": "flash", "score": 1, "tags": []}
    assert from_schema({"type": "boolean"}) is False
