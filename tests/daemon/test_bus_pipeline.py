"""The publish pipeline as a whole (bus: envelope → ring → both journals → compactor → window),
driven without a server: however much the live journal evicts, the compacted turn is whole."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from daemon.bus import BusLimits, SessionBus
from daemon.core.envelope import decode_json
from sdk.protocol.events import SessionUpdateData, TurnCompleteData

chunk = st.tuples(st.sampled_from(["agent_message_chunk", "agent_thought_chunk"]),
                  st.text(min_size=0, max_size=40))
other = st.sampled_from(["tool", "plan", "user"])


@given(
    events=st.lists(st.one_of(chunk, other), min_size=1, max_size=120),
    max_events=st.integers(1, 6),
    max_bytes=st.integers(200, 3000),
)
def test_compacted_turn_is_whole_however_much_the_journal_evicted(
        events: list[object], max_events: int, max_bytes: int) -> None:
    bus = SessionBus("s", BusLimits(max_events, max_bytes, 4 * 1024 * 1024, 50), None,
                     clock_ms=lambda: 1)
    texts: dict[str, list[str]] = {"agent_message_chunk": [], "agent_thought_chunk": []}
    for n, item in enumerate(events):
        if isinstance(item, tuple):
            kind, text = item
            texts[kind].append(text)
            update = {"sessionUpdate": kind, "content": {"type": "text", "text": text}}
        elif item == "tool":
            update = {"sessionUpdate": "tool_call", "toolCallId": f"t{n}", "status": "pending"}
        elif item == "plan":
            update = {"sessionUpdate": "plan", "entries": []}
        else:
            update = {"sessionUpdate": "user_message_chunk",
                      "content": {"type": "text", "text": "u"}}
        bus.publish(SessionUpdateData(session_id="s", update=update), prompt_id="p",
                    flush=False)
        journal = bus.journals.full
        assert journal.entry_count <= max_events
        assert journal.total_bytes <= max_bytes or journal.entry_count == 1
        assert journal.retained_events + journal.truncated_events == n + 1
    bus.publish_terminal(TurnCompleteData(session_id="s", stop_reason="end_turn",
                                          prompt_id="p"), prompt_id="p",
                         originator_client_id=None, ledger_terminal="completed",
                         stop_reason="end_turn")
    assert bus.journals.full.entry_count == 0  # the terminal reset the live journal
    segment = [decode_json(raw) for raw in bus.window.snapshot(full_transcript_available=False)]
    assert segment[-1]["type"] == "turn_complete"
    for kind, parts in texts.items():
        compacted = "".join(
            e["data"]["update"]["content"]["text"] for e in segment
            if e["type"] == "session_update" and e["data"]["update"]["sessionUpdate"] == kind)
        assert compacted == "".join(parts)
