"""Conformance vectors: the Python WebUI model's answers, for the browser viewer to match.

Each case is a list of wire frames (and loads, pages, live events) run through the real Python
code (``sdk._truncation``, ``sdk._repair``, ``webui_model``); the expected rendered blocks, status
texts, pagination states, repair targets, suffix starts, "is new" decisions and repaired states
are written to ``vectors.json``. ``tests/viewer/test_conformance.py`` regenerates them in memory and
fails when the committed file is stale; ``viewer.test.mjs`` runs the same vectors against the
viewer's ES modules under ``node --test``.

Regenerate: ``python -m tests.conformance.generate``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec

from sdk._repair import (
    RepairEpisode,
    RepairValidationError,
    find_repair_target,
    repair_failure_notice,
    validate_fresh_snapshot,
)
from sdk._truncation import parse_truncation, status_text
from sdk.protocol.envelope import DaemonEvent, decode_events, normalize_page_event
from webui_model.blocks import Block
from webui_model.pagination import HistoryPage, PaginationState
from webui_model.reducer import SideEffect
from webui_model.repair_commit import build_repair, make_is_new, mirror_page, take_checkpoint
from webui_model.replay import apply_history_page, replay_snapshot, visible_blocks
from webui_model.store import TranscriptStore

VECTORS = Path(__file__).with_name("vectors.json")
SID = "6f1c0d7e-2b1e-4c55-9d8e-0c1f9a1b2c3d"
P1, P2, P3 = "prompt-aaa", "prompt-bbb", "prompt-ccc"
Frame = dict[str, Any]

# --- frame builders --------------------------------------------------------------------------


def frame(kind: str, data: Any, *, id: int | None = None, pid: str | None = None,
          ts: float | None = None, **extra: Any) -> Frame:
    out: Frame = {"v": 1, "type": kind, "data": data}
    if id is not None:
        out["id"] = id
    if pid is not None:
        out["promptId"] = pid
    if ts is not None:
        out["_meta"] = {"serverTimestamp": ts}
    out.update(extra)
    return out


def su(kind: str, /, *, id: int | None = None, pid: str | None = None, text: str | None = None,
       rid: str | None = None, meta: dict[str, Any] | None = None, **fields: Any) -> Frame:
    update: dict[str, Any] = {"sessionUpdate": kind, **fields}
    if text is not None:
        update["content"] = {"type": "text", "text": text}
    umeta = dict(meta or {})
    if rid is not None:
        umeta["qwen.session.recordId"] = rid
        umeta["qwenTranscript"] = {"sourceRecordIds": [rid]}
    if umeta:
        update["_meta"] = umeta
    return frame("session_update", {"sessionId": SID, "update": update}, id=id, pid=pid,
                 ts=None if id is None else 1_700_000_000_000 + id)


def user(text: str, **kw: Any) -> Frame:
    kw.setdefault("meta", {"source": "bridge-echo"})
    return su("user_message_chunk", text=text, **kw)


def agent(text: str, **kw: Any) -> Frame:
    return su("agent_message_chunk", text=text, **kw)


def done(pid: str, *, id: int | None = None, reason: str = "end_turn") -> Frame:
    return frame("turn_complete", {"sessionId": SID, "stopReason": reason, "promptId": pid},
                 id=id, pid=pid)


def failed(pid: str, *, id: int | None = None, code: Any = "channel_closed") -> Frame:
    return frame("turn_error", {"sessionId": SID, "message": "agent exited", "code": code,
                                "promptId": pid}, id=id, pid=pid)


def marker(*, pid: str | None = P1, scope: str | None = "live_journal", truncated: int = 4,
           retained: int = 2, full: bool = True, max_events: int | None = 3, max_bytes: int = 300,
           record_id: str | None = None) -> Frame:
    data: dict[str, Any] = {"reason": "replay_window_exceeded", "truncatedEvents": truncated,
                            "retainedEvents": retained, "maxBytes": max_bytes,
                            "fullTranscriptAvailable": full}
    if scope is not None:
        data["scope"] = scope
    if max_events is not None:
        data["maxEvents"] = max_events
    if record_id is not None:
        data["recordId"] = record_id
    return frame("history_truncated", data, pid=pid)


def compacted_turn(pid: str, first_id: int, chunks: int, prefix: str) -> list[Frame]:
    """A completed turn as the replay window / transcript holds it (record ids stamped)."""
    out = [user(f"{prefix} prompt", id=first_id, pid=pid, rid=f"{prefix}-r0")]
    out.append(agent("".join(f"chunk-{n}" for n in range(chunks)), id=first_id + 1, pid=pid,
                     rid=f"{prefix}-r1"))
    out.append(done(pid, id=first_id + chunks + 1))
    return out


# --- projections -------------------------------------------------------------------------------


def block_dict(block: Block) -> dict[str, Any]:
    out: dict[str, Any] = msgspec.to_builtins(block)
    return out


def effect_list(effects: list[SideEffect] | tuple[SideEffect, ...]) -> list[list[Any]]:
    return [[type(e).__name__, e.event_id] for e in effects]


def pagination_dict(p: PaginationState) -> dict[str, Any]:
    out: dict[str, Any] = msgspec.to_builtins(p)
    return out


def events(frames: list[Frame]) -> list[DaemonEvent]:
    return decode_events(frames)


# --- status texts --------------------------------------------------------------------------------

BASE_MARKER = {"reason": "replay_window_exceeded", "truncatedEvents": 4, "retainedEvents": 2,
               "maxBytes": 512, "fullTranscriptAvailable": True}


def status_cases() -> list[dict[str, Any]]:
    payloads: list[tuple[str, Any]] = []
    for scope in ("live_journal", None, "future_scope"):
        for full in (True, False):
            for max_events in (10000, None):
                p: dict[str, Any] = {**BASE_MARKER, "fullTranscriptAvailable": full}
                if scope is not None:
                    p["scope"] = scope
                if max_events is not None:
                    p["maxEvents"] = max_events
                payloads.append((f"scope={scope} full={full} maxEvents={max_events}", p))
    payloads += [
        ("float counts are integers", {**BASE_MARKER, "truncatedEvents": 3.0, "maxBytes": 512.0,
                                       "scope": "live_journal"}),
        ("unknown keys kept", {**BASE_MARKER, "extraKey": [1, 2], "recordId": 7}),
        ("zero counts", {**BASE_MARKER, "truncatedEvents": 0, "retainedEvents": 0}),
        ("wrong reason", {**BASE_MARKER, "reason": "other"}),
        ("empty scope", {**BASE_MARKER, "scope": ""}),
        ("non-string scope", {**BASE_MARKER, "scope": 3}),
        ("negative maxEvents", {**BASE_MARKER, "maxEvents": -1}),
        ("fractional maxEvents", {**BASE_MARKER, "maxEvents": 1.5}),
        ("string maxEvents", {**BASE_MARKER, "maxEvents": "3"}),
        ("string count", {**BASE_MARKER, "truncatedEvents": "4"}),
        ("boolean count", {**BASE_MARKER, "retainedEvents": True}),
        ("missing maxBytes", {k: v for k, v in BASE_MARKER.items() if k != "maxBytes"}),
        ("full is a string", {**BASE_MARKER, "fullTranscriptAvailable": "yes"}),
        ("full is 1", {**BASE_MARKER, "fullTranscriptAvailable": 1}),
        ("negative truncatedTurns", {**BASE_MARKER, "truncatedTurns": -2}),
        ("not an object", [1, 2]),
    ]
    out = []
    for name, data in payloads:
        parsed = parse_truncation(data)
        out.append({"name": name, "payload": data,
                    "text": None if parsed is None else status_text(parsed)})
    return out


# --- reducer --------------------------------------------------------------------------------------


def reducer_cases() -> list[dict[str, Any]]:
    tool = {"toolCallId": "t1", "title": "Read file", "kind": "read", "status": "pending"}
    cases: list[tuple[str, int, list[Frame]]] = [
        ("agent text streams into one block", 1000, [
            user("hello", id=1, pid=P1), agent("chunk-0", id=2, pid=P1),
            agent("chunk-1", id=3, pid=P1), agent("chunk-2", id=4, pid=P1)]),
        ("terminal ends streaming", 1000, [
            user("hello", id=1, pid=P1), agent("a", id=2, pid=P1), agent("b", id=3, pid=P1),
            done(P1, id=4)]),
        ("thought, tools and a cancelled turn", 1000, [
            user("go", id=1, pid=P1), su("agent_thought_chunk", text="thinking", id=2, pid=P1),
            su("agent_thought_chunk", text=" more", id=3, pid=P1),
            su("tool_call", id=4, pid=P1, **tool),
            su("tool_call_update", id=5, pid=P1, toolCallId="t1", status="in_progress",
               content=[{"type": "content", "content": {"type": "text", "text": "x"}}]),
            su("tool_call", id=6, pid=P1, toolCallId="t2", title="Write", status="completed"),
            agent("partial", id=7, pid=P1),
            frame("prompt_cancelled", {"sessionId": SID, "reason": "user"}, id=8, pid=P1),
            done(P1, id=9, reason="cancelled")]),
        ("permission asked and answered", 1000, [
            user("edit", id=1, pid=P1), agent("I need to", id=2, pid=P1),
            frame("permission_request", {"requestId": "req-1", "sessionId": SID,
                                         "toolCall": {"toolCallId": "t9", "title": "Edit"},
                                         "options": [{"optionId": "allow", "name": "Allow",
                                                      "kind": "allow_once"},
                                                     {"optionId": "reject", "name": "Reject",
                                                      "kind": "reject_once"}]}, id=3, pid=P1),
            frame("permission_resolved", {"requestId": "req-1",
                                          "outcome": {"outcome": "selected",
                                                      "optionId": "allow"}}, id=4, pid=P1),
            agent("done", id=5, pid=P1), done(P1, id=6)]),
        ("permission timed out", 1000, [
            user("edit", id=1, pid=P1),
            frame("permission_request", {"requestId": "req-2", "sessionId": SID,
                                         "options": [{"optionId": "allow", "name": "Allow",
                                                      "kind": "allow_once"}]}, id=2, pid=P1),
            frame("permission_resolved", {"requestId": "req-2",
                                          "outcome": {"outcome": "cancelled"},
                                          "reason": "timeout"}, id=3, pid=P1),
            agent("went on without it", id=4, pid=P1), done(P1, id=5)]),
        ("turn error with a numeric code", 1000, [
            user("x", id=1, pid=P1), su("tool_call", id=2, pid=P1, toolCallId="t1"),
            failed(P1, id=3, code=-32603)]),
        ("status, error and debug lines", 1000, [
            frame("slow_client_warning", {"queueSize": 200, "maxQueued": 256}),
            frame("state_resync_required", {"reason": "ring_evicted", "lastDeliveredId": 3}),
            frame("some_future_event", {"x": 1}, id=5),
            su("brand_new_update", id=6, pid=P1),
            frame("session_update", {"sessionId": SID}, id=7),
            su("tool_call", id=8, pid=P1),
            marker(), marker(scope=None, full=True, record_id="r-9"),
            frame("history_truncated", {"reason": "nope"}, pid=P1),
            frame("session_closed", {"sessionId": SID, "reason": "client_close"}, id=9),
            frame("permission_request", {"sessionId": SID}, id=10)]),
        ("side effects only", 1000, [
            su("available_commands_update", id=1, availableCommands=[]),
            su("current_mode_update", id=2, currentModeId="code"),
            frame("pending_prompt_added", {"sessionId": SID, "promptId": P2, "text": "q"}, id=3),
            frame("replay_complete", {"replayedCount": 0}),
            frame("client_evicted", {"reason": "queue_overflow"}),
            frame("session_died", {"sessionId": SID, "reason": "channel_closed"}, id=4),
            frame("stream_error", {"error": "boom"}),
            frame("session_snapshot", {}),
            agent("suggest", id=5, pid=P1, meta={"followupSuggestion": "try again"})]),
        ("injected user message mid-turn", 1000, [
            user("first", id=1, pid=P1), agent("a", id=2, pid=P1),
            su("user_message_chunk", text="steer", id=3, pid=P1, meta={"source": "mid-turn"}),
            agent("b", id=4, pid=P1), done(P1, id=5),
            user("second", id=6, pid=P2), user(" part two", id=7, pid=P2)]),
        ("plan upserts one block per prompt", 1000, [
            su("plan", id=1, pid=P1, entries=[{"content": "a", "status": "pending"}]),
            su("plan", id=2, pid=P1, entries=[{"content": "a", "status": "completed"}]),
            done(P1, id=3),
            su("plan", id=4, pid=P2, entries=[])]),
        ("empty and non-text chunks", 1000, [
            agent("", id=1, pid=P1), su("agent_message_chunk", id=2, pid=P1,
                                        content={"type": "image", "data": "..."}),
            agent("", id=3, pid=P1), agent("tail", id=4, pid=P1)]),
        ("reference page shape and record ids", 1000, [
            frame("session_update", {"sessionUpdate": "agent_message_chunk",
                                     "content": {"type": "text", "text": "ref"},
                                     "_meta": {"qwen.session.recordId": "r1",
                                               "promptId": P1}}),
            agent("", pid=P1, rid="r2"), agent("!", pid=P1, rid="r3")]),
        ("max_blocks trims the oldest and active pointers", 3, [
            user("u1", id=1, pid=P1), agent("a1", id=2, pid=P1),
            su("tool_call", id=3, pid=P1, toolCallId="t1", status="in_progress"),
            agent("a2", id=4, pid=P1),
            frame("permission_request", {"requestId": "r", "sessionId": SID}, id=5, pid=P1),
            agent("a3", id=6, pid=P1),
            su("tool_call_update", id=7, pid=P1, toolCallId="t1", status="completed"),
            frame("permission_resolved", {"requestId": "r", "outcome": {"outcome": "cancelled"}},
                  id=8),
            done(P1, id=9, reason="cancelled")]),
        ("assistant.done on its own", 1000, [
            agent("x", id=1, pid=P1), frame("assistant.done", {"reason": "error"}),
            agent("y", id=2, pid=P1)]),
    ]
    out = []
    for name, max_blocks, frames in cases:
        store = TranscriptStore(max_blocks=max_blocks)
        effects = [effect_list(store.dispatch(e)) for e in events(frames)]
        out.append({"name": name, "max_blocks": max_blocks, "events": frames,
                    "effects": effects, "blocks": [block_dict(b) for b in store.blocks]})
    return out


# --- snapshot replay and pages ---------------------------------------------------------------------


def replay_result(case: dict[str, Any]) -> dict[str, Any]:
    opts = case["options"]
    compacted, live = events(case["compacted"]), events(case["live"])
    result = replay_snapshot(
        compacted, live, configured_max_blocks=opts["configured_max_blocks"],
        pagination_enabled=opts["pagination_enabled"],
        history_has_more=opts["history_has_more"],
        history_anchor_record_id=opts["history_anchor_record_id"],
        page_size=opts["page_size"])
    target = find_repair_target(SID, live, opts.get("last_event_id"), opts.get("degraded", False))
    return {
        "max_blocks": result.state.max_blocks,
        "blocks": [block_dict(b) for b in result.state.blocks],
        "pagination": pagination_dict(result.state.pagination),
        "visible": [b.id for b in visible_blocks(result.state.blocks, result.state.pagination)],
        "effects": effect_list(result.side_effects),
        "marker_block_id": result.marker_block_id,
        "checkpoint_blocks": None if result.marker_state is None
        else [b.id for b in result.marker_state.blocks],
        "target": None if target is None
        else {"prompt_id": target.prompt_id, "signature": target.signature},
    }


def options(configured: int = 1000, *, enabled: bool = True, has_more: bool = False,
            anchor: str | None = None, page_size: int = 100, last_event_id: int | None = 20,
            degraded: bool = False) -> dict[str, Any]:
    return {"configured_max_blocks": configured, "pagination_enabled": enabled,
            "history_has_more": has_more, "history_anchor_record_id": anchor,
            "page_size": page_size, "last_event_id": last_event_id, "degraded": degraded}


def live_tail(pid: str | None = P1, first: int = 10, *, stamp: bool = True) -> list[Frame]:
    """A live journal that overflowed: the marker, then the retained tail."""
    return [marker(pid=pid), agent("chunk-4", id=first, pid=pid if stamp else None),
            agent("chunk-5", id=first + 1, pid=pid if stamp else None)]


def replay_cases() -> list[dict[str, Any]]:
    prev = compacted_turn(P3, 1, 3, "old")
    cases = [
        {"name": "compacted turn then an overflowed live turn", "compacted": prev,
         "live": live_tail(), "options": options()},
        {"name": "replay marker hidden while older pages exist",
         "compacted": [marker(pid=None, scope=None, record_id="old-r0"), *prev],
         "live": [], "options": options(has_more=True)},
        {"name": "replay marker shown without pagination",
         "compacted": [marker(pid=None, scope=None), *prev], "live": [],
         "options": options(enabled=False)},
        {"name": "anchor from the load body", "compacted": [], "live": live_tail(),
         "options": options(anchor="anchor-9")},
        {"name": "oversized replay keeps every block", "compacted": prev,
         "live": [user("now", id=8, pid=P1), *live_tail()], "options": options(2)},
        {"name": "older daemon: unique prompt among the tail", "compacted": [],
         "live": [*live_tail(pid=None, stamp=False), agent("x", id=12, pid=P1)],
         "options": options()},
        {"name": "older daemon: two prompts, no target", "compacted": [],
         "live": [marker(pid=None), agent("a", id=10, pid=P1), agent("b", id=11, pid=P2)],
         "options": options()},
        {"name": "non-recoverable live marker", "compacted": [],
         "live": [marker(full=False), agent("a", id=10, pid=P1)], "options": options()},
        {"name": "degraded replay has no target", "compacted": [], "live": live_tail(),
         "options": options(degraded=True, last_event_id=None)},
    ]
    for case in cases:
        case["expected"] = replay_result(case)
    return cases


def page_cases() -> list[dict[str, Any]]:
    older = compacted_turn(P2, 1, 2, "p2")
    prev = compacted_turn(P3, 5, 2, "p3")
    base = {"compacted": [marker(pid=None, scope=None, record_id="p3-r0"), *prev],
            "live": [], "options": options(has_more=True)}
    cases = [
        {"name": "older page prepended, duplicates dropped", **base,
         "page": {"events": [*older, prev[0]], "hasMore": True}},
        {"name": "last page completes history", **base,
         "page": {"events": older, "hasMore": False}},
        {"name": "page with only a cursor", **base,
         "page": {"events": [frame("turn_complete", {"promptId": P2, "stopReason": "end_turn"})],
                  "hasMore": True, "nextCursor": "cur-1"}},
        {"name": "page over the cap is rejected", **{**base, "options": options(4, has_more=True)},
         "page": {"events": older, "hasMore": True}},
        {"name": "reference-shaped page events",
         **base, "page": {"events": [frame("session_update", {
             "sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "ref"},
             "_meta": {"qwen.session.recordId": "ref-1"}})], "hasMore": True}},
    ]
    for case in cases:
        opts = case["options"]
        result = replay_snapshot(
            events(case["compacted"]), events(case["live"]),
            configured_max_blocks=opts["configured_max_blocks"], pagination_enabled=True,
            history_has_more=opts["history_has_more"], page_size=opts["page_size"])
        page = HistoryPage(
            events=[e for e in (normalize_page_event(f, SID) for f in case["page"]["events"])
                    if e is not None],
            has_more=case["page"]["hasMore"], next_cursor=case["page"].get("nextCursor"))
        outcome = apply_history_page(result.state, page,
                                     configured_max_blocks=opts["configured_max_blocks"])
        case["expected"] = {
            "accepted": outcome.accepted, "dropped_events": outcome.dropped_events,
            "page_blocks": [b.id for b in outcome.page_blocks],
            "blocks": [block_dict(b) for b in outcome.state.blocks],
            "pagination": pagination_dict(outcome.state.pagination),
            "visible": [b.id for b in visible_blocks(outcome.state.blocks,
                                                     outcome.state.pagination)],
        }
    return cases


# --- repair ------------------------------------------------------------------------------------------


def run_repair(case: dict[str, Any]) -> dict[str, Any]:
    opts = case["options"]
    load = case["load"]
    compacted, live = events(load["compacted"]), events(load["live"])
    configured = opts["configured_max_blocks"]
    replay = replay_snapshot(compacted, live, configured_max_blocks=configured,
                             pagination_enabled=True, history_has_more=opts["history_has_more"])
    store = TranscriptStore(max_blocks=configured)
    store.reset(replay.state)
    target = find_repair_target(SID, live, load["lastEventId"], load.get("replayDegraded", False))
    out: dict[str, Any] = {
        "target": None if target is None
        else {"prompt_id": target.prompt_id, "signature": target.signature},
        "loaded_blocks": [b.id for b in store.blocks],
    }
    if target is None:
        return out
    observed = [e.id for e in live if e.id is not None]
    episode = RepairEpisode(SID, target, observed, load["lastEventId"])
    checkpoint = take_checkpoint(replay)
    assert checkpoint is not None
    for page_frames in case.get("pages", []):
        page = HistoryPage(events=events(page_frames["events"]), has_more=page_frames["hasMore"])
        outcome = apply_history_page(store.snapshot_state(), page,
                                     configured_max_blocks=configured)
        store.reset(outcome.state)
        checkpoint = mirror_page(checkpoint, outcome.page_blocks,
                                 pagination=outcome.state.pagination)
    armed_at = None
    for index, event in enumerate(events(case["live"])):
        store.dispatch(event)
        if episode.observe_live(event) and armed_at is None:
            armed_at = index
    out["armed_at"] = armed_at
    out["highest_live_id"] = episode.highest_live_id
    out["before_blocks"] = [block_dict(b) for b in store.blocks]
    if armed_at is None:
        return out
    fresh = case["fresh"]
    fresh_compacted, fresh_live = events(fresh["compacted"]), events(fresh["live"])
    checked = validate_fresh_snapshot(fresh_compacted, fresh_live,
                                      fresh.get("replayDegraded", False), target.prompt_id)
    if isinstance(checked, RepairValidationError):
        notice = repair_failure_notice(target.signature, checked.message)
        out["validation"] = {"error": checked.reason, "message": checked.message}
        out["notice"] = {"id": notice.id, "message": notice.message,
                         "debug_message": notice.debug_message}
        return out
    out["validation"] = {"start": checked.start}
    out["is_new"] = [episode.is_new(e.id) for e in checked.events]
    build = build_repair(store.snapshot_state(), checkpoint, checked.events, checked.start,
                         make_is_new(episode.observed_ids, episode.watermark,
                                     episode.highest_live_id), configured)
    out["result"] = {
        "from_checkpoint": build.from_checkpoint,
        "max_blocks": build.state.max_blocks,
        "blocks": [block_dict(b) for b in build.state.blocks],
        "pagination": pagination_dict(build.state.pagination),
        "effects": effect_list(build.side_effects),
        "next_checkpoint": None if build.checkpoint is None else {
            "marker_block_id": build.checkpoint.marker_block_id,
            "prompt_id": build.checkpoint.prompt_id,
            "blocks": [b.id for b in build.checkpoint.state.blocks]},
    }
    return out


def whole_turn(pid: str, first: int, chunks: int, *, end: Frame | None = None,
               signal_at: int | None = None) -> list[Frame]:
    """The target turn as the fresh replay window holds it after the terminal (compacted)."""
    out = [user("the prompt", id=first, pid=pid, rid=f"{pid}-u")]
    text = "".join(f"chunk-{n}" for n in range(chunks))
    out.append(agent(text, id=first + 1, pid=pid, rid=f"{pid}-a"))
    if signal_at is not None:
        out.append(su("available_commands_update", id=signal_at, availableCommands=[]))
    out.append(end if end is not None else done(pid, id=first + chunks + 2))
    return out


def repair_cases() -> list[dict[str, Any]]:
    prev = compacted_turn(P3, 1, 2, "p3")  # ids 1, 2, 4
    load = {"compacted": prev, "live": [marker(), agent("chunk-4", id=10, pid=P1),
                                         agent("chunk-5", id=11, pid=P1)], "lastEventId": 11}
    live_after = [agent("chunk-6", id=12, pid=P1), agent("chunk-7", id=13, pid=P1)]
    fresh_ok = {"compacted": [*prev, *whole_turn(P1, 5, 8, signal_at=7)], "live": []}
    cases: list[dict[str, Any]] = [
        {"name": "end_turn repairs from the checkpoint", "load": load,
         "live": [*live_after, done(P1, id=14)], "fresh": fresh_ok, "options": options()},
        {"name": "cancelled terminal repairs", "load": load,
         "live": [*live_after, frame("prompt_cancelled", {"sessionId": SID}, id=14, pid=P1),
                  done(P1, id=15, reason="cancelled")],
         "fresh": {"compacted": [*prev, *whole_turn(P1, 5, 8, end=done(P1, id=15,
                                                                     reason="cancelled"))],
                   "live": []}, "options": options()},
        {"name": "turn_error repairs", "load": load, "live": [*live_after, failed(P1, id=14)],
         "fresh": {"compacted": [*prev, *whole_turn(P1, 5, 8, end=failed(P1, id=14))],
                   "live": []}, "options": options()},
        {"name": "another prompt's terminal does not arm", "load": load,
         "live": [*live_after, done(P2, id=14)], "fresh": fresh_ok, "options": options()},
        {"name": "fresh replay without the terminal", "load": load,
         "live": [*live_after, done(P1, id=14)],
         "fresh": {"compacted": prev, "live": [marker(), *live_after]}, "options": options()},
        {"name": "fresh replay without the user input", "load": load,
         "live": [*live_after, done(P1, id=14)],
         "fresh": {"compacted": [*prev, agent("x", id=6, pid=P1), done(P1, id=14)], "live": []},
         "options": options()},
        {"name": "degraded fresh replay", "load": load, "live": [*live_after, done(P1, id=14)],
         "fresh": {**fresh_ok, "replayDegraded": True}, "options": options()},
        {"name": "marker trimmed away: rebuilt whole and re-anchored", "load": load,
         "live": [su("tool_call", id=12 + n, pid=P1, toolCallId=f"t{n}", status="completed")
                  for n in range(6)] + [done(P1, id=18)],
         "fresh": {"compacted": [*prev, *whole_turn(P1, 5, 8)], "live": []},
         "options": options(6)},
        {"name": "history page mirrored into the checkpoint",
         "load": {**load, "compacted": [marker(pid=None, scope=None, record_id="p3-r0"), *prev]},
         "pages": [{"events": compacted_turn(P2, 100, 1, "p2"), "hasMore": False}],
         "live": [*live_after, done(P1, id=14)], "fresh": fresh_ok,
         "options": options(has_more=True)},
        {"name": "fresh live journal starts the next episode", "load": load,
         "live": [*live_after, done(P1, id=14), user("next", id=15, pid=P2)],
         "fresh": {"compacted": [*prev, *whole_turn(P1, 5, 8)],
                   "live": [marker(pid=P2), agent("n-3", id=20, pid=P2)]},
         "options": options()},
        {"name": "older daemon marker without promptId",
         "load": {**load, "live": [marker(pid=None), agent("chunk-4", id=10, pid=P1)],
                  "lastEventId": 10},
         "live": [done(P1, id=11)],
         "fresh": {"compacted": [*prev, *whole_turn(P1, 5, 5)], "live": []},
         "options": options()},
    ]
    for case in cases:
        case["expected"] = run_repair(case)
    return cases


def build_vectors() -> dict[str, Any]:
    return {
        "about": "Generated by tests/conformance/generate.py from the Python WebUI model; "
                 "do not edit by hand.",
        "session_id": SID,
        "status_texts": status_cases(),
        "reducer": reducer_cases(),
        "replay": replay_cases(),
        "pages": page_cases(),
        "repair": repair_cases(),
    }


def render(vectors: dict[str, Any]) -> str:
    return json.dumps(vectors, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def main() -> None:
    VECTORS.write_text(render(build_vectors()), encoding="utf-8")
    print(f"wrote {VECTORS.name}")


if __name__ == "__main__":
    main()
