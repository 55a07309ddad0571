"""The reducer: one daemon event → block changes + side effects (CLIENT-SPEC §4.1, §3.4).

:func:`apply_event` edits a :class:`~webui_model.store.TranscriptDraft` in place (always by
copy-on-write: a changed block is a *new* block object swapped into the list) and returns the
event's side effects as values. It never performs a side effect itself, so a caller can rebuild
transcript state from replayed events while suppressing the effects of events the client has
already acted on (``TranscriptStore.dispatch(event, side_effects=False)``, or a §3.4 filter).

Blocks
======

==========================================  ===========================================================
event                                       blocks
==========================================  ===========================================================
``session_update`` ``user_message_chunk``   merge into the active user block of the same prompt, else a
                                            new ``user`` block
``agent_message_chunk``                     append to the active assistant block of the same prompt
                                            (``streaming=True``), else a new ``assistant`` block
``agent_thought_chunk``                     the same with a collapsed ``thought`` block
``tool_call`` / ``tool_call_update``        upsert the ``tool`` block of ``toolCallId`` (later non-null
                                            fields win)
``plan``                                    upsert a ``tool`` block with ``tool_call_id="plan"`` (one
                                            per prompt)
``available_commands_update``,              no block
``current_mode_update``
other ``sessionUpdate`` kinds               ``debug`` (code ``unknown_session_update``)
``history_truncated`` (valid)               ``status``, ``source="history_truncated"``, the full payload
                                            as ``data``, the SDK's exact status text
``history_truncated`` (malformed)           one ``debug`` block, code ``malformed_payload``
``turn_complete``                           none, then the synthetic ``assistant.done``
``turn_error``                              ``error`` (``source="turn_error"``), then ``assistant.done``
``permission_request``                      ``permission``; ``permission_resolved`` resolves it
``slow_client_warning``, ``session_closed`` ``status``
``prompt_cancelled``                        ``prompt_cancelled``
``state_resync_required``                   ``error`` (the provider then does a configured reload)
``pending_prompt_*``, ``replay_complete``,  no block
``session_snapshot``, ``client_evicted``,
``session_died``, ``stream_error``
any other type                              ``debug`` (code ``unknown_event_type``, the raw frame as
                                            ``data``)
==========================================  ===========================================================

``assistant.done`` (reason = ``stopReason``, default ``end_turn``; ``error`` for
``turn_error``) ends streaming of the active text blocks and, for ``cancelled``/``error``,
marks every in-flight tool ``cancelled``. It may also be dispatched on its own as an event of
type ``assistant.done`` with ``data = {"reason": ...}``.

A text run ends (its block stops streaming and its pointer is cleared) when another
conversation block (a new text block, a new tool or plan block, a permission request) is
appended or at ``assistant.done``. Status, error and debug lines do not end a run, so a warning
never splits an answer in two.

Side effects
============

=======================================================  ===================================
event                                                    side effect
=======================================================  ===================================
``client_evicted``, ``session_died``, ``stream_error``,  :class:`Notice`
``slow_client_warning``
``available_commands_update``, ``current_mode_update``   :class:`WorkspaceSignal`
``pending_prompt_added/started/completed``               :class:`PendingPromptPublication`
any ``session_update`` whose ``update._meta``            :class:`FollowUpSuggestion`
carries ``followupSuggestion``
``user_message_chunk`` with ``update._meta.source``      :class:`InjectedMessage`
other than ``"bridge-echo"`` while a turn is open
``replay_complete``, ``state_resync_required``,          :class:`ConnectionMetadata`
``session_snapshot``
=======================================================  ===================================

A turn is *open* from the first ``session_update`` carrying a prompt id (envelope or
``data.promptId``) until a terminal of that prompt.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Final, Literal, TypeAlias

import msgspec

from sdk.events import TERMINAL_TYPES, DaemonEvent, event_prompt_id
from sdk.truncation import (
    LIVE_JOURNAL_SCOPE,
    MALFORMED_REASON,
    TruncationStatusItem,
    normalize_status_item,
    parse_truncation,
)
from webui_model.blocks import (
    TERMINAL_TOOL_STATUSES,
    Block,
    MessageBlock,
    PermissionBlock,
    TextBlock,
    ToolBlock,
)

if TYPE_CHECKING:
    from webui_model.store import TranscriptDraft

ASSISTANT_DONE: Final = "assistant.done"
BRIDGE_ECHO: Final = "bridge-echo"
FOLLOWUP_META_KEY: Final = "followupSuggestion"
RECORD_ID_META_KEY: Final = "qwen.session.recordId"
CANCELLING_REASONS: Final = frozenset({"cancelled", "error"})

# --- side effects -------------------------------------------------------------------------


class Notice(msgspec.Struct, frozen=True, kw_only=True):
    """A user-visible notice; the provider keeps a list deduplicated by ``id``."""

    id: str
    code: str
    message: str
    severity: Literal["info", "warning", "error"] = "warning"
    category: str = "connection"
    operation: str | None = None
    recoverable: bool = True
    debug_message: str | None = None
    event_id: int | None = None
    data: Any = None


class WorkspaceSignal(msgspec.Struct, frozen=True, kw_only=True):
    """The workspace changed: ``kind`` is the ``sessionUpdate`` kind, ``data`` the update."""

    kind: str
    data: Any = None
    event_id: int | None = None


class PendingPromptPublication(msgspec.Struct, frozen=True, kw_only=True):
    """A queued prompt was added, started or completed (``type`` is the event type)."""

    type: str
    prompt_id: str | None = None
    data: Any = None
    event_id: int | None = None


class FollowUpSuggestion(msgspec.Struct, frozen=True, kw_only=True):
    """The agent suggested a follow-up prompt (``update._meta.followupSuggestion``)."""

    suggestion: Any
    prompt_id: str | None = None
    event_id: int | None = None


class InjectedMessage(msgspec.Struct, frozen=True, kw_only=True):
    """A user message that arrived mid-turn from somewhere other than the daemon's echo."""

    text: str
    prompt_id: str | None = None
    event_id: int | None = None


class ConnectionMetadata(msgspec.Struct, frozen=True, kw_only=True):
    """Stream bookkeeping from a synthetic frame (``type`` is the event type)."""

    type: str
    data: Any = None
    event_id: int | None = None


SideEffect: TypeAlias = (
    Notice
    | WorkspaceSignal
    | PendingPromptPublication
    | FollowUpSuggestion
    | InjectedMessage
    | ConnectionMetadata
)

# --- reading events -------------------------------------------------------------------------


def session_update_of(event: DaemonEvent) -> dict[str, Any] | None:
    """The ACP update of a ``session_update`` (bus shape, or the reference page shape)."""
    data = event.data
    if event.type != "session_update" or not isinstance(data, dict):
        return None
    update = data.get("update")
    if isinstance(update, dict):
        return update
    if isinstance(data.get("sessionUpdate"), str):
        return data
    return None


def _meta_of(update: dict[str, Any] | None) -> dict[str, Any]:
    meta = None if update is None else update.get("_meta")
    return meta if isinstance(meta, dict) else {}


def transcript_record_ids(event: DaemonEvent) -> tuple[str, ...]:
    """The transcript record ids stamped on a compacted ``session_update`` (may be empty)."""
    return _record_ids(session_update_of(event))


def _record_ids(update: dict[str, Any] | None) -> tuple[str, ...]:
    meta = _meta_of(update)
    if not meta:
        return ()
    ids: list[str] = []
    rid = meta.get(RECORD_ID_META_KEY)
    if isinstance(rid, str) and rid:
        ids.append(rid)
    transcript = meta.get("qwenTranscript")
    if isinstance(transcript, dict):
        sources = transcript.get("sourceRecordIds")
        if isinstance(sources, list):
            ids.extend(s for s in sources if isinstance(s, str) and s and s not in ids)
    return tuple(ids)


def first_record_id(event: DaemonEvent) -> str | None:
    """``update._meta["qwen.session.recordId"]``, else ``qwenTranscript.sourceRecordIds[0]``."""
    ids = transcript_record_ids(event)
    return ids[0] if ids else None


def valid_marker_payload(event: DaemonEvent) -> dict[str, Any] | None:
    """The payload of a *valid* ``history_truncated`` event, else None."""
    if event.type != "history_truncated" or parse_truncation(event.data) is None:
        return None
    payload: dict[str, Any] = event.data
    return payload


def is_recoverable_live_marker(event: DaemonEvent) -> bool:
    """A valid live-turn marker with ``fullTranscriptAvailable: true`` (CLIENT-SPEC §3.1)."""
    marker = parse_truncation(event.data) if event.type == "history_truncated" else None
    return marker is not None and marker.scope == LIVE_JOURNAL_SCOPE and (
        marker.full_transcript_available
    )


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _server_timestamp(event: DaemonEvent) -> float | None:
    return None if event.meta is None else _number(event.meta.get("serverTimestamp"))


def _agent_timestamp(update: dict[str, Any] | None) -> float | None:
    if update is None:
        return None
    stamp = _number(update.get("timestamp"))
    return stamp if stamp is not None else _number(_meta_of(update).get("timestamp"))


def _update_prompt(update: dict[str, Any] | None) -> str | None:
    # Restored transcript records carry the prompt only inside update._meta.
    candidate = _meta_of(update).get("promptId")
    return candidate if isinstance(candidate, str) and candidate else None


def _payload(event: DaemonEvent) -> dict[str, Any]:
    return event.data if isinstance(event.data, dict) else {}


def _text_of(content: object) -> str:
    if isinstance(content, dict):
        if content.get("type") == "text" and isinstance(content.get("text"), str):
            text: str = content["text"]
            return text
        if isinstance(content.get("type"), str):
            return f"[{content['type']}]"
    return ""


def _merged_ids(old: tuple[str, ...], new: tuple[str, ...]) -> tuple[str, ...]:
    extra = tuple(rid for rid in new if rid not in old)
    return old + extra if extra else old


def _stamp(event: DaemonEvent, update: dict[str, Any] | None, prompt_id: str | None) -> dict[str, Any]:
    """The common block fields for a block created by ``event`` (``update`` = its ACP update)."""
    server = _server_timestamp(event)
    return {
        "event_id": event.id,
        "last_event_id": event.id,
        "prompt_id": prompt_id,
        "server_timestamp": server,
        "updated_at": server,
        "timestamp": _agent_timestamp(update),
        "source_record_ids": _record_ids(update),
    }


def _touch(
    block: Block, event: DaemonEvent, update: dict[str, Any] | None = None, **changes: Any
) -> dict[str, Any]:
    """Changes for a block updated by ``event``: latest event id, time and record ids."""
    server = _server_timestamp(event)
    changes["last_event_id"] = event.id if event.id is not None else block.last_event_id
    changes["updated_at"] = server if server is not None else block.updated_at
    changes["source_record_ids"] = _merged_ids(block.source_record_ids, _record_ids(update))
    return changes


def _compact_json(value: object) -> str:
    try:
        return msgspec.json.encode(value).decode()
    except (TypeError, msgspec.EncodeError):
        return repr(value)


# --- text runs and turn ends ------------------------------------------------------------------


_TextKind = Literal["user", "assistant", "thought"]


def _pointer(draft: TranscriptDraft, kind: _TextKind) -> str | None:
    if kind == "user":
        return draft.active_user
    if kind == "assistant":
        return draft.active_assistant
    return draft.active_thought


def _set_pointer(draft: TranscriptDraft, kind: _TextKind, value: str | None) -> None:
    if kind == "user":
        draft.active_user = value
    elif kind == "assistant":
        draft.active_assistant = value
    else:
        draft.active_thought = value


def settle_streaming(draft: TranscriptDraft) -> None:
    """End the current text run: active blocks stop streaming and no pointer stays active."""
    if draft.active_user is None and draft.active_assistant is None and (
        draft.active_thought is None
    ):
        return
    for kind in ("user", "assistant", "thought"):
        block = draft.get(_pointer(draft, kind))
        if isinstance(block, TextBlock) and block.streaming:
            draft.replace(msgspec.structs.replace(block, streaming=False))
        _set_pointer(draft, kind, None)


def assistant_done(draft: TranscriptDraft, reason: str) -> None:
    """The synthetic ``assistant.done``: stop streaming; cancel in-flight tools on cancel/error."""
    settle_streaming(draft)
    if reason in CANCELLING_REASONS:
        for bid in tuple(draft.in_flight_tools):
            block = draft.get(bid)
            if isinstance(block, ToolBlock):
                draft.replace(msgspec.structs.replace(block, status="cancelled"))
        draft.in_flight_tools.clear()


def _close_turn(draft: TranscriptDraft, prompt: str | None) -> None:
    if prompt is None or draft.open_prompt_id == prompt:
        draft.open_prompt_id = None


def _track_tool(draft: TranscriptDraft, block: ToolBlock) -> None:
    if block.status in TERMINAL_TOOL_STATUSES:
        draft.in_flight_tools.pop(block.id, None)
    else:
        draft.in_flight_tools[block.id] = None


# --- block builders ---------------------------------------------------------------------------


def _message(
    draft: TranscriptDraft,
    event: DaemonEvent,
    kind: Literal["status", "error", "debug", "prompt_cancelled"],
    text: str,
    *,
    code: str | None,
    source: str | None,
    data: Any,
    prompt_id: str | None = None,
) -> None:
    draft.append(
        MessageBlock(
            id=draft.new_id(kind),
            kind=kind,
            text=text,
            code=code,
            source=source,
            data=data,
            **_stamp(event, None, prompt_id if prompt_id is not None else event_prompt_id(event)),
        )
    )


def _raw_frame(event: DaemonEvent) -> dict[str, Any]:
    # The envelope omits defaults when encoded; a kept raw frame should still say v=1.
    raw: dict[str, Any] = msgspec.to_builtins(event)
    raw.setdefault("v", event.v)
    return raw


def _debug(draft: TranscriptDraft, event: DaemonEvent, code: str, text: str) -> list[SideEffect]:
    _message(draft, event, "debug", text, code=code, source=event.type, data=_raw_frame(event))
    return []


def _text_chunk(
    draft: TranscriptDraft,
    event: DaemonEvent,
    update: dict[str, Any],
    kind: _TextKind,
    prompt: str | None,
) -> None:
    text = _text_of(update.get("content"))
    active = draft.get(_pointer(draft, kind))
    if isinstance(active, TextBlock) and active.prompt_id == prompt:
        if text or _record_ids(update):
            draft.replace(
                msgspec.structs.replace(
                    active, **_touch(active, event, update, text=active.text + text)
                )
            )
        return
    if not text:
        # An empty chunk (e.g. a usage-only frame) has nothing to show on its own.
        return
    settle_streaming(draft)
    block = TextBlock(
        id=draft.new_id(kind),
        kind=kind,
        text=text,
        streaming=kind != "user",
        collapsed=kind == "thought",
        **_stamp(event, update, prompt),
    )
    draft.append(block)
    _set_pointer(draft, kind, block.id)


_TOOL_OWN_KEYS: Final = frozenset({"sessionUpdate", "toolCallId", "title", "status", "_meta"})


def _tool_update(
    draft: TranscriptDraft, event: DaemonEvent, update: dict[str, Any], prompt: str | None
) -> None:
    tool_call_id = update.get("toolCallId")
    if not isinstance(tool_call_id, str) or not tool_call_id:
        _debug(draft, event, MALFORMED_REASON, f"{update.get('sessionUpdate')}: missing toolCallId")
        return
    fields = {k: v for k, v in update.items() if k not in _TOOL_OWN_KEYS and v is not None}
    title = update.get("title") if isinstance(update.get("title"), str) else None
    status = update.get("status") if isinstance(update.get("status"), str) else None
    existing = draft.get(draft.tools.get(tool_call_id))
    if isinstance(existing, ToolBlock):
        block = msgspec.structs.replace(
            existing,
            **_touch(
                existing,
                event,
                update,
                title=title if title is not None else existing.title,
                status=status if status is not None else existing.status,
                data={**existing.data, **fields} if fields else existing.data,
            ),
        )
        draft.replace(block)
    else:
        settle_streaming(draft)
        block = ToolBlock(
            id=draft.new_id("tool"),
            tool_call_id=tool_call_id,
            title=title or "",
            status=status or "pending",
            data=fields,
            **_stamp(event, update, prompt),
        )
        draft.append(block)
        draft.tools[tool_call_id] = block.id
    _track_tool(draft, block)


def _plan(
    draft: TranscriptDraft, event: DaemonEvent, update: dict[str, Any], prompt: str | None
) -> None:
    raw_entries = update.get("entries")
    entries = raw_entries if isinstance(raw_entries, list) else []
    done = bool(entries) and all(
        isinstance(e, dict) and e.get("status") == "completed" for e in entries
    )
    status = "completed" if done else "in_progress"
    existing = draft.get(draft.tools.get("plan"))
    if isinstance(existing, ToolBlock) and existing.prompt_id == prompt:
        draft.replace(
            msgspec.structs.replace(
                existing, **_touch(existing, event, update, status=status, data={"entries": entries})
            )
        )
        return
    settle_streaming(draft)
    block = ToolBlock(
        id=draft.new_id("tool"),
        tool_call_id="plan",
        title="Plan",
        status=status,
        data={"entries": entries},
        **_stamp(event, update, prompt),
    )
    draft.append(block)
    draft.tools["plan"] = block.id


# --- handlers -----------------------------------------------------------------------------------

_Handler = Callable[["TranscriptDraft", DaemonEvent], list[SideEffect]]


def _session_update(draft: TranscriptDraft, event: DaemonEvent) -> list[SideEffect]:
    update = session_update_of(event)
    if update is None:
        return _debug(draft, event, MALFORMED_REASON, "session_update: missing update object")
    kind = update.get("sessionUpdate")
    meta = _meta_of(update)
    effects: list[SideEffect] = []
    turn_was_open = draft.open_prompt_id is not None
    envelope_prompt = event_prompt_id(event)
    if envelope_prompt is not None:
        draft.open_prompt_id = envelope_prompt
    prompt = envelope_prompt if envelope_prompt is not None else _update_prompt(update)
    if meta.get(FOLLOWUP_META_KEY) is not None:
        effects.append(
            FollowUpSuggestion(
                suggestion=meta[FOLLOWUP_META_KEY], prompt_id=prompt, event_id=event.id
            )
        )
    if kind == "user_message_chunk":
        _text_chunk(draft, event, update, "user", prompt)
        if turn_was_open and meta.get("source") != BRIDGE_ECHO:
            effects.append(
                InjectedMessage(
                    text=_text_of(update.get("content")), prompt_id=prompt, event_id=event.id
                )
            )
    elif kind == "agent_message_chunk":
        _text_chunk(draft, event, update, "assistant", prompt)
    elif kind == "agent_thought_chunk":
        _text_chunk(draft, event, update, "thought", prompt)
    elif kind in ("tool_call", "tool_call_update"):
        _tool_update(draft, event, update, prompt)
    elif kind == "plan":
        _plan(draft, event, update, prompt)
    elif kind in ("available_commands_update", "current_mode_update"):
        effects.append(WorkspaceSignal(kind=kind, data=update, event_id=event.id))
    else:
        _debug(draft, event, "unknown_session_update", f"unknown session update: {kind}")
    return effects


def _history_truncated(draft: TranscriptDraft, event: DaemonEvent) -> list[SideEffect]:
    item = normalize_status_item(event)
    if isinstance(item, TruncationStatusItem):
        _message(
            draft, event, "status", item.text, code=item.marker.reason, source=item.source,
            data=item.data, prompt_id=item.prompt_id,
        )
    else:
        _message(
            draft, event, "debug", item.text, code=item.reason, source=item.source,
            data=item.data, prompt_id=item.prompt_id,
        )
    return []


def _turn_complete(draft: TranscriptDraft, event: DaemonEvent) -> list[SideEffect]:
    reason = _payload(event).get("stopReason")
    assistant_done(draft, reason if isinstance(reason, str) and reason else "end_turn")
    _close_turn(draft, event_prompt_id(event))
    return []


def _turn_error(draft: TranscriptDraft, event: DaemonEvent) -> list[SideEffect]:
    data = _payload(event)
    message = data.get("message")
    code = data.get("code")
    _message(
        draft, event, "error",
        message if isinstance(message, str) and message else "The turn failed.",
        code=str(code) if code is not None else None, source="turn_error", data=event.data,
    )
    assistant_done(draft, "error")
    _close_turn(draft, event_prompt_id(event))
    return []


def _assistant_done_event(draft: TranscriptDraft, event: DaemonEvent) -> list[SideEffect]:
    reason = _payload(event).get("reason")
    assistant_done(draft, reason if isinstance(reason, str) and reason else "end_turn")
    return []


def _permission_request(draft: TranscriptDraft, event: DaemonEvent) -> list[SideEffect]:
    data = _payload(event)
    request_id = data.get("requestId")
    if not isinstance(request_id, str) or not request_id:
        return _debug(draft, event, MALFORMED_REASON, "permission_request: missing requestId")
    tool_call = data.get("toolCall")
    options = data.get("options")
    settle_streaming(draft)
    block = PermissionBlock(
        id=draft.new_id("permission"),
        request_id=request_id,
        tool_call=tool_call if isinstance(tool_call, dict) else {},
        options=tuple(options) if isinstance(options, list) else (),
        **_stamp(event, None, event_prompt_id(event)),
    )
    draft.append(block)
    draft.permissions[request_id] = block.id
    return []


def _permission_resolved(draft: TranscriptDraft, event: DaemonEvent) -> list[SideEffect]:
    data = _payload(event)
    request_id = data.get("requestId")
    block = draft.get(draft.permissions.get(request_id)) if isinstance(request_id, str) else None
    # A resolution for a request trimmed away (or never seen) has nothing left to update.
    if isinstance(block, PermissionBlock):
        draft.replace(
            msgspec.structs.replace(
                block, **_touch(block, event, resolved=True, outcome=data.get("outcome"))
            )
        )
    return []


def _prompt_cancelled(draft: TranscriptDraft, event: DaemonEvent) -> list[SideEffect]:
    reason = _payload(event).get("reason")
    text = "Cancellation requested."
    if isinstance(reason, str) and reason:
        text = f"Cancellation requested ({reason})."
    _message(draft, event, "prompt_cancelled", text, code=None, source=event.type, data=event.data)
    return []


def _session_closed(draft: TranscriptDraft, event: DaemonEvent) -> list[SideEffect]:
    reason = _payload(event).get("reason")
    text = f"Session closed ({reason})." if isinstance(reason, str) and reason else "Session closed."
    _message(draft, event, "status", text, code=event.type, source=event.type, data=event.data)
    return []


def _notice(event: DaemonEvent, message: str, **fields: Any) -> Notice:
    code = f"daemon.{event.type}"
    return Notice(
        id=code,
        code=code,
        message=message,
        debug_message=_compact_json(event.data),
        event_id=event.id,
        data=event.data,
        **fields,
    )


def _slow_client_warning(draft: TranscriptDraft, event: DaemonEvent) -> list[SideEffect]:
    data = _payload(event)
    text = (
        "This client is falling behind the event stream "
        f"({data.get('queueSize', '?')} of {data.get('maxQueued', '?')} events queued)."
    )
    _message(draft, event, "status", text, code=event.type, source=event.type, data=event.data)
    return [
        _notice(
            event,
            "This client is falling behind the event stream; updates may be delayed.",
            severity="warning", operation="subscribe",
        )
    ]


def _client_evicted(draft: TranscriptDraft, event: DaemonEvent) -> list[SideEffect]:
    return [
        _notice(
            event,
            "The daemon closed this client's event stream because it fell too far behind.",
            severity="warning", operation="subscribe",
        )
    ]


def _session_died(draft: TranscriptDraft, event: DaemonEvent) -> list[SideEffect]:
    return [
        _notice(
            event, "The agent process of this session exited.",
            severity="error", category="session", recoverable=False,
        )
    ]


def _stream_error(draft: TranscriptDraft, event: DaemonEvent) -> list[SideEffect]:
    return [
        _notice(event, "The event stream failed.", severity="error", operation="subscribe")
    ]


def _state_resync_required(draft: TranscriptDraft, event: DaemonEvent) -> list[SideEffect]:
    reason = _payload(event).get("reason")
    suffix = f" ({reason})" if isinstance(reason, str) and reason else ""
    _message(
        draft, event, "error",
        f"The event stream lost continuity{suffix}; the session will be reloaded.",
        code=event.type, source=event.type, data=event.data,
    )
    return [ConnectionMetadata(type=event.type, data=event.data, event_id=event.id)]


def _connection_metadata(draft: TranscriptDraft, event: DaemonEvent) -> list[SideEffect]:
    return [ConnectionMetadata(type=event.type, data=event.data, event_id=event.id)]


def _pending_prompt(draft: TranscriptDraft, event: DaemonEvent) -> list[SideEffect]:
    return [
        PendingPromptPublication(
            type=event.type, prompt_id=event_prompt_id(event), data=event.data, event_id=event.id
        )
    ]


def _unknown(draft: TranscriptDraft, event: DaemonEvent) -> list[SideEffect]:
    return _debug(draft, event, "unknown_event_type", f"unknown event type: {event.type}")


_HANDLERS: Final[dict[str, _Handler]] = {
    "session_update": _session_update,
    "history_truncated": _history_truncated,
    "turn_complete": _turn_complete,
    "turn_error": _turn_error,
    ASSISTANT_DONE: _assistant_done_event,
    "permission_request": _permission_request,
    "permission_resolved": _permission_resolved,
    "prompt_cancelled": _prompt_cancelled,
    "session_closed": _session_closed,
    "slow_client_warning": _slow_client_warning,
    "client_evicted": _client_evicted,
    "session_died": _session_died,
    "stream_error": _stream_error,
    "state_resync_required": _state_resync_required,
    "replay_complete": _connection_metadata,
    "session_snapshot": _connection_metadata,
    "pending_prompt_added": _pending_prompt,
    "pending_prompt_started": _pending_prompt,
    "pending_prompt_completed": _pending_prompt,
}
assert TERMINAL_TYPES <= _HANDLERS.keys()


def apply_event(draft: TranscriptDraft, event: DaemonEvent) -> list[SideEffect]:
    """Reduce ``event`` into ``draft`` (not trimmed); return the side effects it calls for."""
    return _HANDLERS.get(event.type, _unknown)(draft, event)


def apply_events(draft: TranscriptDraft, events: Iterable[DaemonEvent]) -> None:
    """Reduce many events with the store's policy (trim after each), dropping side effects."""
    for event in events:
        apply_event(draft, event)
        draft.trim()
