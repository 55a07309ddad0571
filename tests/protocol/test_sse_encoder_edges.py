"""The daemon's side of the SSE codec pinned down by mutation testing: the frame head, the
whole frame, the opening ``retry:`` frame and the heartbeat, each parsed back by the client's
parser."""

from __future__ import annotations

import pytest

from sdk.protocol.envelope import encode_envelope
from sdk.protocol.sse import (
    DEFAULT_RETRY_MS,
    SSE_HEARTBEAT,
    SSEParser,
    encode_sse_frame,
    sse_head,
    sse_retry,
)


def test_the_head_has_an_id_line_only_for_an_event_with_an_id() -> None:
    assert sse_head("session_update", 3) == b"id: 3\nevent: session_update\ndata: "
    assert sse_head("replay_complete", None) == b"event: replay_complete\ndata: "
    assert sse_head("x", 0) == b"id: 0\nevent: x\ndata: "


def test_a_frame_is_the_head_the_envelope_and_a_blank_line() -> None:
    raw = encode_envelope("turn_complete", {"promptId": "p"}, event_id=9)
    frame = encode_sse_frame(raw, "turn_complete", 9)
    assert frame == b"id: 9\nevent: turn_complete\ndata: " + raw + b"\n\n"
    idless = encode_envelope("replay_complete", {"replayedCount": 0})
    assert encode_sse_frame(idless, "replay_complete", None) == (
        b"event: replay_complete\ndata: " + idless + b"\n\n")
    parser = SSEParser()
    events = parser.feed(sse_retry() + frame + SSE_HEARTBEAT)
    assert [(e.type, e.id, e.data) for e in events] == [("turn_complete", 9, {"promptId": "p"})]
    assert parser.retry_ms == DEFAULT_RETRY_MS


def test_the_retry_frame() -> None:
    assert DEFAULT_RETRY_MS == 3000
    assert sse_retry() == b"retry: 3000\n\n"
    assert sse_retry(0) == b"retry: 0\n\n"
    assert sse_retry(250) == b"retry: 250\n\n"
    with pytest.raises(ValueError) as info:
        sse_retry(-1)
    assert str(info.value) == "retry_ms must be >= 0, got -1"


def test_the_heartbeat_is_a_comment_frame_the_parser_ignores() -> None:
    assert SSE_HEARTBEAT == b": heartbeat\n\n"
    parser = SSEParser()
    assert parser.feed(SSE_HEARTBEAT * 3) == []
    assert parser.pending_bytes == 0
