"""The wire contract builds the bytes: every writer of an envelope or an SSE frame derives from
the protocol's one definition (``sdk.protocol.envelope.DaemonEvent``, ``sdk.protocol.sse.SSE_FRAME``)
and writes exactly what encoding that definition gives, for every kind of envelope."""

from __future__ import annotations

import itertools
from typing import Any

import msgspec
import pytest

from daemon.core.envelope import Event, make_event, synthetic, typed_event
from daemon.core.frame_codec import EnvelopeSplicer, run_envelopes, sse_chunks, sse_frames
from sdk.protocol.envelope import (
    HOLE,
    DaemonEvent,
    decode_event,
    encode_envelope,
    envelope_fields,
    envelope_template,
)
from sdk.protocol.events import (
    KNOWN_EVENT_TYPES,
    SessionUpdateData,
    TurnCompleteData,
    TurnErrorData,
)
from sdk.protocol.sse import (
    SSE_FRAME,
    SSE_FRAME_END,
    SSEParser,
    encode_sse_frame,
    frame_format,
    sse_head,
)

_encode = msgspec.json.encode

# Every optional member present and absent, with values that need escaping or hold a ``%``.
IDS = (None, 1, 9_007_199_254_740_991)
PROMPTS = (None, "p-1", 'q"%d\\\u00e9')
ORIGINATORS = (None, "client_1", "c%b")
METAS: tuple[dict[str, Any] | None, ...] = (None, {}, {"serverTimestamp": 1796204622451})
DATAS: tuple[Any, ...] = (
    None, {}, {"sessionId": "s", "update": {"sessionUpdate": "plan", "entries": []}},
    [1, "two"], "text", TurnCompleteData(prompt_id="p", session_id="s"),
)
TYPES = (*sorted(KNOWN_EVENT_TYPES), "some_future_event", "with%percent")


def struct_bytes(event_type: str, data: Any, *, event_id: int | None = None,
                 prompt_id: str | None = None, originator_client_id: str | None = None,
                 meta: dict[str, Any] | None = None) -> bytes:
    """The envelope's bytes as the one definition gives them: a DaemonEvent encoded."""
    return _encode(DaemonEvent(id=event_id, type=event_type, data=data, prompt_id=prompt_id,
                               originator_client_id=originator_client_id, meta=meta))


def test_the_envelope_struct_is_in_wire_order_and_always_says_v_type_and_data() -> None:
    assert DaemonEvent.__struct_encode_fields__ == (
        "id", "v", "type", "data", "promptId", "originatorClientId", "_meta")
    assert _encode(DaemonEvent(type="replay_complete")) == (
        b'{"v":1,"type":"replay_complete","data":null}')


@pytest.mark.parametrize("event_type", TYPES)
def test_every_dict_and_every_encoder_of_an_envelope_gives_the_structs_bytes(
        event_type: str) -> None:
    for event_id, prompt, originator, meta, data in itertools.product(
            IDS, PROMPTS, ORIGINATORS, METAS, DATAS):
        fields = {"event_id": event_id, "prompt_id": prompt,
                  "originator_client_id": originator, "meta": meta}
        expected = struct_bytes(event_type, data, **fields)
        assert _encode(envelope_fields(event_type, data, **fields)) == expected
        assert encode_envelope(event_type, data, **fields) == expected
        # What a client decodes is the same envelope again.
        decoded = decode_event(expected)
        assert decoded is not None and _encode(decoded) == _encode(
            DaemonEvent(id=event_id, type=event_type, data=msgspec.to_builtins(data),
                        prompt_id=prompt, originator_client_id=originator, meta=meta))


def test_the_daemons_events_are_the_structs_bytes() -> None:
    """The bus's builders (``make_event``, ``typed_event``, ``synthetic``) encode the one
    envelope: their bytes are a DaemonEvent's."""
    now = 1796204622451
    for prompt, originator in itertools.product(PROMPTS, ORIGINATORS):
        made = make_event(7, "tool_call", {"a": 1}, now_ms=now, prompt_id=prompt,
                          originator_client_id=originator)
        assert made is not None
        assert made.raw == struct_bytes("tool_call", {"a": 1}, event_id=7, prompt_id=prompt,
                                        originator_client_id=originator,
                                        meta={"serverTimestamp": now})
        payload = TurnErrorData(prompt_id="p", message="m", code="c", session_id="s")
        typed = typed_event(8, payload, now_ms=now, prompt_id=prompt,
                            originator_client_id=originator)
        assert typed is not None
        assert typed.raw == struct_bytes("turn_error", payload, event_id=8, prompt_id=prompt,
                                         originator_client_id=originator,
                                         meta={"serverTimestamp": now})
    assert synthetic("replay_complete", None).raw == struct_bytes("replay_complete", None)


@pytest.mark.parametrize(("prompt", "originator"), list(itertools.product(PROMPTS, ORIGINATORS)))
def test_the_splicers_templates_give_the_structs_bytes(prompt: str | None,
                                                       originator: str | None) -> None:
    """Every envelope the splicer makes (one by one, a run, a run made again from its stored
    template) is the DaemonEvent of the same members, byte for byte."""
    now = 1796204622451
    updates = [b'{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"a"}}',
               b'{"sessionUpdate":"agent_thought_chunk","content":{"type":"text","text":"%d"}}']
    splicer = EnvelopeSplicer('s"%b', prompt, originator, now)
    expected = [
        struct_bytes("session_update", SessionUpdateData(session_id='s"%b',
                                                         update=msgspec.json.decode(update)),
                     event_id=event_id, prompt_id=prompt, originator_client_id=originator,
                     meta={"serverTimestamp": now})
        for event_id, update in zip((41, 42), updates, strict=True)]
    assert [splicer.envelope(41, updates[0]), splicer.envelope(42, updates[1])] == expected
    assert splicer.envelopes(41, updates) == expected
    assert run_envelopes(splicer.template(41), updates) == expected


def test_a_template_is_the_envelope_cut_at_its_holes() -> None:
    pieces = envelope_template("session_update", {"sessionId": "s", "update": HOLE},
                               prompt_id="p", meta={"serverTimestamp": 5})
    assert len(pieces) == 3
    filled = pieces[0] + b"12" + pieces[1] + b'{"k":1}' + pieces[2]
    assert filled == struct_bytes("session_update", {"sessionId": "s", "update": {"k": 1}},
                                  event_id=12, prompt_id="p", meta={"serverTimestamp": 5})


def sse_frame_by_hand(event: Event) -> bytes:
    """One frame as an SSE reader expects it, from the frame format's parts."""
    head = b"" if event.id is None else b"id: %d\n" % event.id
    return head + b"event: " + event.type.encode() + b"\ndata: " + event.raw + b"\n\n"


def test_every_sse_writer_formats_the_one_frame() -> None:
    """``sse_frames`` (a run of one type, and mixed types), ``sse_chunks``, ``Event.sse_frame``
    and ``encode_sse_frame`` all write :data:`SSE_FRAME`, which a parser reads back."""
    run = [Event.from_env(envelope_fields("session_update", {"n": n}, event_id=n))
           for n in range(1, 6)]
    mixed = [Event.from_env(envelope_fields(kind, None, event_id=n))
             for n, kind in enumerate(TYPES, start=10)]
    for events in (run, mixed):
        expected = b"".join(
            SSE_FRAME % (event.id, event.type.encode(), event.raw) for event in events)
        assert expected == b"".join(map(sse_frame_by_hand, events))
        assert sse_frames(events) == expected
        assert b"".join(sse_chunks(events)) == expected
        assert b"".join(event.sse_frame for event in events) == expected
        assert b"".join(encode_sse_frame(e.raw, e.type, e.id) for e in events) == expected
        parsed = SSEParser().feed(expected)
        assert [(e.id, e.type) for e in parsed] == [(e.id, e.type) for e in events]
    for kind in TYPES:
        assert frame_format(kind) % (3, b"{}") == SSE_FRAME % (3, kind.encode(), b"{}")
    idless = synthetic("replay_complete", None)
    assert idless.sse_frame == sse_head("replay_complete", None) + idless.raw + SSE_FRAME_END
    assert idless.sse_frame == sse_frame_by_hand(idless)
