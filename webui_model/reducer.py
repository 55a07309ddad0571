"""The reducer: one daemon event → block changes + side effects.

:func:`apply_event` edits a :class:`~webui_model.store.TranscriptDraft` in place (always by
copy-on-write: a changed block is a *new* block object swapped into the list) and returns the
event's side effects as values. It never performs a side effect itself, so a caller can rebuild
transcript state from replayed events while suppressing the effects of events the client has
already acted on (``TranscriptStore.dispatch(event, side_effects=False)``, or an "is this event new" filter).

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

The side-effect values live in :mod:`webui_model.effects` and the record-id helpers in
:mod:`webui_model.records` (both re-exported here). Dispatch is on the typed payload
(:attr:`~sdk.protocol.envelope.DaemonEvent.payload`): each payload Struct has its handler, and a
known type whose payload does not fit its Struct has a *malformed* handler (a terminal still
ends the turn; most others become one ``debug`` block, code ``malformed_payload``).

A turn is *open* from the first ``session_update`` carrying a prompt id (envelope or
``data.promptId``) until a terminal of that prompt.
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final, Literal, TypeAlias

import msgspec

from sdk._truncation import MALFORMED_REASON, TruncationStatusItem, normalize_status_item
from sdk.protocol.constants import BRIDGE_ECHO, RECORD_ID_META_KEY, TERMINAL_TYPES
from sdk.protocol.envelope import DaemonEvent, event_prompt_id, server_timestamp
from sdk.protocol.events import (
    PAYLOAD_TYPES,
    AgentMessageChunk,
    AgentThoughtChunk,
    AvailableCommandsUpdate,
    ClientEvictedData,
    CurrentModeUpdate,
    DaemonHistoryTruncatedData,
    EventPayload,
    PendingPromptAddedData,
    PendingPromptCompletedData,
    PendingPromptStartedData,
    PermissionRequestData,
    PermissionResolvedData,
    Plan,
    PromptCancelledData,
    RawUpdate,
    ReplayCompleteData,
    SessionClosedData,
    SessionDiedData,
    SessionSnapshotData,
    SessionUpdateData,
    SlowClientWarningData,
    StateResyncRequiredData,
    StreamErrorData,
    ToolCall,
    ToolCallUpdate,
    TurnCompleteData,
    TurnErrorData,
    UpdateMeta,
    UserMessageChunk,
)
from sdk.protocol.terminals import terminal_fields
from webui_model.blocks import (
    TERMINAL_TOOL_STATUSES,
    Block,
    MessageBlock,
    PermissionBlock,
    TextBlock,
    ToolBlock,
)
from webui_model.effects import (
    ConnectionMetadata,
    FollowUpSuggestion,
    InjectedMessage,
    Notice,
    PendingPromptPublication,
    SideEffect,
    WorkspaceSignal,
)
from webui_model.records import (
    first_record_id,
    is_recoverable_live_marker,
    transcript_record_ids,
    valid_marker_payload,
)

if TYPE_CHECKING:
    from webui_model.draft import TranscriptDraft

__all__ = [
    "ASSISTANT_DONE",
    "BRIDGE_ECHO",
    "CANCELLING_REASONS",
    "FOLLOWUP_META_KEY",
    "RECORD_ID_META_KEY",
    "ConnectionMetadata",
    "FollowUpSuggestion",
    "InjectedMessage",
    "Notice",
    "PendingPromptPublication",
    "SideEffect",
    "WorkspaceSignal",
    "apply_event",
    "apply_events",
    "apply_typed",
    "assistant_done",
    "first_record_id",
    "is_recoverable_live_marker",
    "settle_streaming",
    "transcript_record_ids",
    "valid_marker_payload",
]

ASSISTANT_DONE: Final = "assistant.done"
FOLLOWUP_META_KEY: Final = "followupSuggestion"
CANCELLING_REASONS: Final = frozenset({"cancelled", "error"})


class AssistantDoneData(msgspec.Struct, frozen=True):
    """The payload of the model's own ``assistant.done`` event (never on the wire)."""

    reason: str | None = None


_Update: TypeAlias = (
    UserMessageChunk
    | AgentMessageChunk
    | AgentThoughtChunk
    | ToolCall
    | ToolCallUpdate
    | Plan
    | AvailableCommandsUpdate
    | CurrentModeUpdate
    | RawUpdate
)

# --- reading events -------------------------------------------------------------------------


def _update_prompt(meta: UpdateMeta | None) -> str | None:
    # Restored transcript records carry the prompt only inside update._meta.
    return meta.prompt_id if meta is not None and meta.prompt_id else None


def _merged_ids(old: tuple[str, ...], new: tuple[str, ...]) -> tuple[str, ...]:
    if not new:
        return old
    extra = tuple(rid for rid in new if rid not in old)
    return old + extra if extra else old


def _stamp(event: DaemonEvent, update: _Update | None, prompt_id: str | None) -> dict[str, Any]:
    """The common block fields for a block created by ``event`` (``update`` = its ACP update)."""
    server = server_timestamp(event)
    return {
        "event_id": event.id,
        "last_event_id": event.id,
        "prompt_id": prompt_id,
        "server_timestamp": server,
        "updated_at": server,
        "timestamp": None if update is None else update.agent_timestamp,
        "source_record_ids": () if update is None else update.record_ids,
    }


def _touch(
    block: Block, event: DaemonEvent, update: _Update | None = None, **changes: Any
) -> dict[str, Any]:
    """Changes for a block updated by ``event``: latest event id, time and record ids."""
    server = server_timestamp(event)
    changes["last_event_id"] = event.id if event.id is not None else block.last_event_id
    changes["updated_at"] = server if server is not None else block.updated_at
    ids = () if update is None else update.record_ids
    changes["source_record_ids"] = _merged_ids(block.source_record_ids, ids)
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
    raw: dict[str, Any] = msgspec.to_builtins(event)  # the envelope's members, as on the wire
    return raw


def _debug(draft: TranscriptDraft, event: DaemonEvent, code: str, text: str) -> list[SideEffect]:
    _message(draft, event, "debug", text, code=code, source=event.type, data=_raw_frame(event))
    return []


def _text_chunk(
    draft: TranscriptDraft,
    event: DaemonEvent,
    update: UserMessageChunk | AgentMessageChunk | AgentThoughtChunk,
    kind: _TextKind,
    prompt: str | None,
    active_id: str | None,
) -> str | None:
    """Extend the active ``kind`` block (``active_id``) or start one; the new block's id when
    one was started (the caller makes it the active ``kind`` block), else None.

    The hot path of a streamed turn (one call per chunk), so the common reads are inlined:
    the text is ``update.text``, the record ids ``update.record_ids``, the time
    ``server_timestamp(event)``.
    """
    content = update.content
    if content is None:
        text = ""
    else:
        value = content.text
        text = value if content.type == "text" and isinstance(value, str) else content.display_text
    meta = update.meta
    active = draft.get(active_id)
    if type(active) is TextBlock and active.prompt_id == prompt:
        ids = () if meta is None else meta.record_ids
        if text or ids:
            server = server_timestamp(event)
            ident = event.id
            draft.replace(
                msgspec.structs.replace(
                    active,
                    text=active.text + text,
                    last_event_id=ident if ident is not None else active.last_event_id,
                    updated_at=server if server is not None else active.updated_at,
                    source_record_ids=_merged_ids(active.source_record_ids, ids)
                    if ids
                    else active.source_record_ids,
                )
            )
        return None
    if not text:
        # An empty chunk (e.g. a usage-only frame) has nothing to show on its own.
        return None
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
    return block.id


_TOOL_OWN_KEYS: Final = frozenset({"sessionUpdate", "toolCallId", "title", "status", "_meta"})


def _tool_update(
    draft: TranscriptDraft,
    event: DaemonEvent,
    raw: Mapping[str, Any],
    update: ToolCall | ToolCallUpdate,
    prompt: str | None,
) -> None:
    tool_call_id = update.tool_call_id
    if not tool_call_id:
        _debug(draft, event, MALFORMED_REASON, f"{raw['sessionUpdate']}: missing toolCallId")
        return
    # The tool block keeps every other field the agent sent (known or not) as its data.
    fields = {k: v for k, v in raw.items() if k not in _TOOL_OWN_KEYS and v is not None}
    title, status = update.title, update.status
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
        server = server_timestamp(event)
        block = ToolBlock(  # the fields of _stamp, without building its dict (the replay's hot path)
            id=draft.new_id("tool"),
            tool_call_id=tool_call_id,
            title=title or "",
            status=status or "pending",
            data=fields,
            event_id=event.id,
            last_event_id=event.id,
            prompt_id=prompt,
            server_timestamp=server,
            updated_at=server,
            timestamp=update.agent_timestamp,
            source_record_ids=update.record_ids,
        )
        draft.append(block)
        draft.tools[tool_call_id] = block.id
    _track_tool(draft, block)


def _plan(draft: TranscriptDraft, event: DaemonEvent, update: Plan, prompt: str | None) -> None:
    entries = update.entries
    status = "completed" if update.completed else "in_progress"
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
#
# A handler gets the draft, the event and the event's typed payload — or None when the event's
# type is known but its payload did not fit (a malformed payload).

_Handler = Callable[["TranscriptDraft", DaemonEvent, Any], list[SideEffect]]


def _session_update(
    draft: TranscriptDraft, event: DaemonEvent, payload: SessionUpdateData | None
) -> list[SideEffect]:
    if payload is None:
        return _debug(draft, event, MALFORMED_REASON, "session_update: missing update object")
    update: _Update = payload.acp
    meta = update.meta
    effects: list[SideEffect] = []
    turn_was_open = draft.open_prompt_id is not None
    envelope_prompt = event.prompt_id or event_prompt_id(event)
    if envelope_prompt is not None:
        draft.open_prompt_id = envelope_prompt
    prompt = envelope_prompt if envelope_prompt is not None else _update_prompt(meta)
    if meta is not None and meta.followup_suggestion is not None:
        effects.append(
            FollowUpSuggestion(
                suggestion=meta.followup_suggestion, prompt_id=prompt, event_id=event.id
            )
        )
    _BY_UPDATE[type(update)](draft, event, payload, update, prompt, turn_was_open, effects)
    return effects


# One handler per ACP update Struct, looked up by the update's type: (draft, event, payload,
# update, prompt, turn_was_open, effects) -> None, effects appended to ``effects``.
_UpdateHandler = Callable[
    ["TranscriptDraft", DaemonEvent, SessionUpdateData, Any, "str | None", bool, list[SideEffect]],
    None,
]


def _on_user_chunk(
    draft: TranscriptDraft, event: DaemonEvent, payload: SessionUpdateData,
    update: UserMessageChunk, prompt: str | None, turn_was_open: bool,
    effects: list[SideEffect],
) -> None:
    started = _text_chunk(draft, event, update, "user", prompt, draft.active_user)
    if started is not None:
        draft.active_user = started
    meta = update.meta
    if turn_was_open and (meta is None or meta.source != BRIDGE_ECHO):
        effects.append(InjectedMessage(text=update.text, prompt_id=prompt, event_id=event.id))


def _on_agent_chunk(
    draft: TranscriptDraft, event: DaemonEvent, payload: SessionUpdateData,
    update: AgentMessageChunk, prompt: str | None, turn_was_open: bool,
    effects: list[SideEffect],
) -> None:
    started = _text_chunk(draft, event, update, "assistant", prompt, draft.active_assistant)
    if started is not None:
        draft.active_assistant = started


def _on_thought_chunk(
    draft: TranscriptDraft, event: DaemonEvent, payload: SessionUpdateData,
    update: AgentThoughtChunk, prompt: str | None, turn_was_open: bool,
    effects: list[SideEffect],
) -> None:
    started = _text_chunk(draft, event, update, "thought", prompt, draft.active_thought)
    if started is not None:
        draft.active_thought = started


def _on_tool(
    draft: TranscriptDraft, event: DaemonEvent, payload: SessionUpdateData,
    update: ToolCall | ToolCallUpdate, prompt: str | None, turn_was_open: bool,
    effects: list[SideEffect],
) -> None:
    _tool_update(draft, event, payload.update, update, prompt)


def _on_plan(
    draft: TranscriptDraft, event: DaemonEvent, payload: SessionUpdateData, update: Plan,
    prompt: str | None, turn_was_open: bool, effects: list[SideEffect],
) -> None:
    _plan(draft, event, update, prompt)


def _on_workspace(
    draft: TranscriptDraft, event: DaemonEvent, payload: SessionUpdateData,
    update: AvailableCommandsUpdate | CurrentModeUpdate, prompt: str | None,
    turn_was_open: bool, effects: list[SideEffect],
) -> None:
    kind = payload.kind
    assert kind is not None  # the tag the update was decoded by
    effects.append(WorkspaceSignal(kind=kind, data=payload.update, event_id=event.id))


def _on_raw(
    draft: TranscriptDraft, event: DaemonEvent, payload: SessionUpdateData, update: RawUpdate,
    prompt: str | None, turn_was_open: bool, effects: list[SideEffect],
) -> None:
    if update.typed_kind:
        _debug(draft, event, MALFORMED_REASON, f"{update.kind}: malformed update")
    else:
        _debug(draft, event, "unknown_session_update", f"unknown session update: {update.kind}")


_BY_UPDATE: Final[Mapping[type, _UpdateHandler]] = {
    UserMessageChunk: _on_user_chunk,
    AgentMessageChunk: _on_agent_chunk,
    AgentThoughtChunk: _on_thought_chunk,
    ToolCall: _on_tool,
    ToolCallUpdate: _on_tool,
    Plan: _on_plan,
    AvailableCommandsUpdate: _on_workspace,
    CurrentModeUpdate: _on_workspace,
    RawUpdate: _on_raw,
}
assert set(_BY_UPDATE) == set(typing.get_args(_Update))


def _history_truncated(
    draft: TranscriptDraft, event: DaemonEvent, payload: DaemonHistoryTruncatedData | None
) -> list[SideEffect]:
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


def _turn_complete(
    draft: TranscriptDraft, event: DaemonEvent, payload: TurnCompleteData | None
) -> list[SideEffect]:
    # A terminal ends the turn even when its other fields do not fit.
    reason = terminal_fields(event).stop_reason
    assistant_done(draft, reason or "end_turn")
    _close_turn(draft, event_prompt_id(event))
    return []


def _turn_error(
    draft: TranscriptDraft, event: DaemonEvent, payload: TurnErrorData | None
) -> list[SideEffect]:
    fields = terminal_fields(event)
    _message(
        draft, event, "error", fields.message or "The turn failed.",
        code=fields.code, source="turn_error", data=event.data,
    )
    assistant_done(draft, "error")
    _close_turn(draft, event_prompt_id(event))
    return []


def _assistant_done_event(draft: TranscriptDraft, event: DaemonEvent) -> list[SideEffect]:
    try:
        reason = msgspec.convert(event.data, AssistantDoneData).reason
    except msgspec.ValidationError:
        reason = None
    assistant_done(draft, reason or "end_turn")
    return []


def _permission_request(
    draft: TranscriptDraft, event: DaemonEvent, payload: PermissionRequestData | None
) -> list[SideEffect]:
    if payload is None:
        return _debug(draft, event, MALFORMED_REASON, "permission_request: malformed payload")
    if not payload.request_id:
        return _debug(draft, event, MALFORMED_REASON, "permission_request: missing requestId")
    settle_streaming(draft)
    block = PermissionBlock(
        id=draft.new_id("permission"),
        request_id=payload.request_id,
        tool_call=payload.tool_call if payload.tool_call is not None else {},
        options=tuple(payload.options),
        **_stamp(event, None, event_prompt_id(event)),
    )
    draft.append(block)
    draft.permissions[payload.request_id] = block.id
    return []


def _permission_resolved(
    draft: TranscriptDraft, event: DaemonEvent, payload: PermissionResolvedData | None
) -> list[SideEffect]:
    block = None if payload is None else draft.get(draft.permissions.get(payload.request_id))
    # A resolution for a request trimmed away (or never seen) has nothing left to update.
    if isinstance(block, PermissionBlock) and payload is not None:
        reason = payload.reason if isinstance(payload.reason, str) else None
        draft.replace(
            msgspec.structs.replace(
                block,
                **_touch(block, event, resolved=True, outcome=payload.outcome, reason=reason),
            )
        )
    return []


def _prompt_cancelled(
    draft: TranscriptDraft, event: DaemonEvent, payload: PromptCancelledData | None
) -> list[SideEffect]:
    reason = None if payload is None else payload.reason
    text = f"Cancellation requested ({reason})." if reason else "Cancellation requested."
    _message(draft, event, "prompt_cancelled", text, code=None, source=event.type, data=event.data)
    return []


def _session_closed(
    draft: TranscriptDraft, event: DaemonEvent, payload: SessionClosedData | None
) -> list[SideEffect]:
    reason = None if payload is None else payload.reason
    text = f"Session closed ({reason})." if reason else "Session closed."
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


def _slow_client_warning(
    draft: TranscriptDraft, event: DaemonEvent, payload: SlowClientWarningData | None
) -> list[SideEffect]:
    queued = "?" if payload is None else payload.queue_size
    cap = "?" if payload is None else payload.max_queued
    text = f"This client is falling behind the event stream ({queued} of {cap} events queued)."
    _message(draft, event, "status", text, code=event.type, source=event.type, data=event.data)
    return [
        _notice(
            event,
            "This client is falling behind the event stream; updates may be delayed.",
            severity="warning", operation="subscribe",
        )
    ]


def _client_evicted(draft: TranscriptDraft, event: DaemonEvent, payload: Any) -> list[SideEffect]:
    return [
        _notice(
            event,
            "The daemon closed this client's event stream because it fell too far behind.",
            severity="warning", operation="subscribe",
        )
    ]


def _session_died(draft: TranscriptDraft, event: DaemonEvent, payload: Any) -> list[SideEffect]:
    return [
        _notice(
            event, "The agent process of this session exited.",
            severity="error", category="session", recoverable=False,
        )
    ]


def _stream_error(draft: TranscriptDraft, event: DaemonEvent, payload: Any) -> list[SideEffect]:
    return [
        _notice(event, "The event stream failed.", severity="error", operation="subscribe")
    ]


def _state_resync_required(
    draft: TranscriptDraft, event: DaemonEvent, payload: StateResyncRequiredData | None
) -> list[SideEffect]:
    reason = None if payload is None else payload.reason
    suffix = f" ({reason})" if reason else ""
    _message(
        draft, event, "error",
        f"The event stream lost continuity{suffix}; the session will be reloaded.",
        code=event.type, source=event.type, data=event.data,
    )
    return [ConnectionMetadata(type=event.type, data=event.data, event_id=event.id)]


def _connection_metadata(
    draft: TranscriptDraft, event: DaemonEvent, payload: Any
) -> list[SideEffect]:
    return [ConnectionMetadata(type=event.type, data=event.data, event_id=event.id)]


def _pending_prompt(draft: TranscriptDraft, event: DaemonEvent, payload: Any) -> list[SideEffect]:
    return [
        PendingPromptPublication(
            type=event.type, prompt_id=event_prompt_id(event), data=event.data, event_id=event.id
        )
    ]


# Dispatch on the payload's Struct: one handler per payload type.
_BY_PAYLOAD: Final[Mapping[type[msgspec.Struct], _Handler]] = {
    SessionUpdateData: _session_update,
    DaemonHistoryTruncatedData: _history_truncated,
    TurnCompleteData: _turn_complete,
    TurnErrorData: _turn_error,
    PermissionRequestData: _permission_request,
    PermissionResolvedData: _permission_resolved,
    PromptCancelledData: _prompt_cancelled,
    SessionClosedData: _session_closed,
    SlowClientWarningData: _slow_client_warning,
    ClientEvictedData: _client_evicted,
    SessionDiedData: _session_died,
    StreamErrorData: _stream_error,
    StateResyncRequiredData: _state_resync_required,
    ReplayCompleteData: _connection_metadata,
    SessionSnapshotData: _connection_metadata,
    PendingPromptAddedData: _pending_prompt,
    PendingPromptStartedData: _pending_prompt,
    PendingPromptCompletedData: _pending_prompt,
}

# A known event type whose payload did not fit: the same handler, told there is no payload.
_MALFORMED: Final[Mapping[str, _Handler]] = {
    "history_truncated": _history_truncated,
    **{kind: _BY_PAYLOAD[cls] for kind, cls in PAYLOAD_TYPES.items()},
}
assert TERMINAL_TYPES <= _MALFORMED.keys()


def apply_event(draft: TranscriptDraft, event: DaemonEvent) -> list[SideEffect]:
    """Reduce ``event`` into ``draft`` (not trimmed); return the side effects it calls for."""
    return apply_typed(draft, event, event.payload)


def apply_typed(
    draft: TranscriptDraft, event: DaemonEvent, payload: EventPayload | None
) -> list[SideEffect]:
    """:func:`apply_event` given ``event``'s typed payload (``event.payload``, or
    :func:`~sdk.protocol.envelope.read_payload` for a one-pass replay that keeps none)."""
    if event.type == ASSISTANT_DONE:
        return _assistant_done_event(draft, event)
    if payload is not None:
        return _BY_PAYLOAD[type(payload)](draft, event, payload)
    handler = _MALFORMED.get(event.type)
    if handler is None:
        return _debug(draft, event, "unknown_event_type", f"unknown event type: {event.type}")
    return handler(draft, event, None)


def apply_events(draft: TranscriptDraft, events: Iterable[DaemonEvent]) -> None:
    """Reduce many events with the store's policy (trim after each), dropping side effects."""
    for event in events:
        apply_event(draft, event)
        draft.trim()
