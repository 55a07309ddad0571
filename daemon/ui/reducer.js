// The reducer: one event -> block changes in the draft + side effects (a port of the Python
// webui_model/reducer.py; the conformance vectors keep the two in agreement). Pure.

import { eventPromptId, isObject, rawFrame } from "./events.js";
import { block, replaced } from "./draft.js";
import { BRIDGE_ECHO, FOLLOWUP_META_KEY, HISTORY_TRUNCATED } from "./protocol.js";
import { metaOf, recordIds, sessionUpdateOf } from "./records.js";
import { MALFORMED_REASON, MALFORMED_TEXT, parseTruncation, statusText } from "./truncation.js";

export const ASSISTANT_DONE = "assistant.done";
const CANCELLING_REASONS = new Set(["cancelled", "error"]);
const TERMINAL_TOOL_STATUSES = new Set(["completed", "failed", "cancelled"]);

function finiteNumber(value) {
  return typeof value === "number" && Number.isFinite(value) ? value : null;
}

function serverTimestamp(event) {
  return event.meta === null ? null : finiteNumber(event.meta.serverTimestamp);
}

function agentTimestamp(update) {
  if (update === null) return null;
  const stamp = finiteNumber(update.timestamp);
  return stamp !== null ? stamp : finiteNumber(metaOf(update).timestamp);
}

function updatePrompt(update) {
  const candidate = metaOf(update).promptId;
  return typeof candidate === "string" && candidate ? candidate : null;
}

function payload(event) {
  return isObject(event.data) ? event.data : {};
}

function textOf(content) {
  if (isObject(content)) {
    if (content.type === "text" && typeof content.text === "string") return content.text;
    if (typeof content.type === "string") return `[${content.type}]`;
  }
  return "";
}

function mergedIds(old, fresh) {
  const extra = fresh.filter((rid) => !old.includes(rid));
  return extra.length ? Object.freeze([...old, ...extra]) : old;
}

function stamp(event, update, promptId) {
  const server = serverTimestamp(event);
  return {
    event_id: event.id,
    last_event_id: event.id,
    prompt_id: promptId,
    server_timestamp: server,
    updated_at: server,
    timestamp: agentTimestamp(update),
    source_record_ids: Object.freeze(recordIds(update)),
  };
}

function touch(b, event, update, changes) {
  const server = serverTimestamp(event);
  return {
    ...changes,
    last_event_id: event.id !== null ? event.id : b.last_event_id,
    updated_at: server !== null ? server : b.updated_at,
    source_record_ids: mergedIds(b.source_record_ids, recordIds(update)),
  };
}

// --- text runs and turn ends ---------------------------------------------------------------------

const POINTER = { user: "active_user", assistant: "active_assistant", thought: "active_thought" };

export function settleStreaming(draft) {
  if (draft.active_user === null && draft.active_assistant === null && draft.active_thought === null) {
    return;
  }
  for (const kind of ["user", "assistant", "thought"]) {
    const b = draft.get(draft[POINTER[kind]]);
    if (b !== null && b.streaming) draft.replace(replaced(b, { streaming: false }));
    draft[POINTER[kind]] = null;
  }
}

function assistantDone(draft, reason) {
  settleStreaming(draft);
  if (CANCELLING_REASONS.has(reason)) {
    for (const id of [...draft.in_flight_tools]) {
      const b = draft.get(id);
      if (b !== null && b.kind === "tool") draft.replace(replaced(b, { status: "cancelled" }));
    }
    draft.in_flight_tools.clear();
  }
}

function closeTurn(draft, prompt) {
  if (prompt === null || draft.open_prompt_id === prompt) draft.open_prompt_id = null;
}

function trackTool(draft, b) {
  if (TERMINAL_TOOL_STATUSES.has(b.status)) draft.in_flight_tools.delete(b.id);
  else draft.in_flight_tools.add(b.id);
}

// --- block builders ----------------------------------------------------------------------------

function message(draft, event, kind, text, { code, source, data, promptId = null }) {
  draft.append(block({
    id: draft.newId(kind), kind, text, code, source, data,
    ...stamp(event, null, promptId !== null ? promptId : eventPromptId(event)),
  }));
}

function debug(draft, event, code, text) {
  message(draft, event, "debug", text, { code, source: event.type, data: rawFrame(event) });
  return [];
}

function textChunk(draft, event, update, kind, prompt) {
  const text = textOf(update.content);
  const active = draft.get(draft[POINTER[kind]]);
  if (active !== null && active.prompt_id === prompt) {
    if (text || recordIds(update).length) {
      draft.replace(replaced(active, touch(active, event, update, { text: active.text + text })));
    }
    return;
  }
  if (!text) return;
  settleStreaming(draft);
  const b = block({
    id: draft.newId(kind), kind, text, streaming: kind !== "user", collapsed: kind === "thought",
    ...stamp(event, update, prompt),
  });
  draft.append(b);
  draft[POINTER[kind]] = b.id;
}

const TOOL_OWN_KEYS = new Set(["sessionUpdate", "toolCallId", "title", "status", "_meta"]);

function toolUpdate(draft, event, update, prompt) {
  const toolCallId = update.toolCallId;
  if (typeof toolCallId !== "string" || !toolCallId) {
    debug(draft, event, MALFORMED_REASON, `${update.sessionUpdate}: missing toolCallId`);
    return;
  }
  const fields = {};
  for (const [k, v] of Object.entries(update)) {
    if (!TOOL_OWN_KEYS.has(k) && v !== null && v !== undefined) fields[k] = v;
  }
  const hasFields = Object.keys(fields).length > 0;
  const title = typeof update.title === "string" ? update.title : null;
  const status = typeof update.status === "string" ? update.status : null;
  const existing = draft.get(draft.tools.get(toolCallId));
  let b;
  if (existing !== null && existing.kind === "tool") {
    b = replaced(existing, touch(existing, event, update, {
      title: title !== null ? title : existing.title,
      status: status !== null ? status : existing.status,
      data: hasFields ? { ...existing.data, ...fields } : existing.data,
    }));
    draft.replace(b);
  } else {
    settleStreaming(draft);
    b = block({
      id: draft.newId("tool"), kind: "tool", tool_call_id: toolCallId, title: title || "",
      status: status || "pending", data: fields, ...stamp(event, update, prompt),
    });
    draft.append(b);
    draft.tools.set(toolCallId, b.id);
  }
  trackTool(draft, b);
}

function plan(draft, event, update, prompt) {
  const entries = Array.isArray(update.entries) ? update.entries : [];
  const done = entries.length > 0 && entries.every((e) => isObject(e) && e.status === "completed");
  const status = done ? "completed" : "in_progress";
  const existing = draft.get(draft.tools.get("plan"));
  if (existing !== null && existing.kind === "tool" && existing.prompt_id === prompt) {
    draft.replace(replaced(existing, touch(existing, event, update, { status, data: { entries } })));
    return;
  }
  settleStreaming(draft);
  const b = block({
    id: draft.newId("tool"), kind: "tool", tool_call_id: "plan", title: "Plan", status,
    data: { entries }, ...stamp(event, update, prompt),
  });
  draft.append(b);
  draft.tools.set("plan", b.id);
}

// --- side effects (kind names match the Python classes) ---------------------------------------------

function effect(kind, fields) {
  return Object.freeze({ kind, ...fields });
}

function notice(event, msg, fields = {}) {
  const code = `daemon.${event.type}`;
  return effect("Notice", {
    id: code, code, message: msg, severity: "warning", category: "connection",
    operation: null, recoverable: true, debug_message: JSON.stringify(event.data),
    event_id: event.id, data: event.data, ...fields,
  });
}

// --- handlers ------------------------------------------------------------------------------------

function onSessionUpdate(draft, event) {
  const update = sessionUpdateOf(event);
  if (update === null) return debug(draft, event, MALFORMED_REASON, "session_update: missing update object");
  const kind = update.sessionUpdate;
  const meta = metaOf(update);
  const effects = [];
  const turnWasOpen = draft.open_prompt_id !== null;
  const envelopePrompt = eventPromptId(event);
  if (envelopePrompt !== null) draft.open_prompt_id = envelopePrompt;
  const prompt = envelopePrompt !== null ? envelopePrompt : updatePrompt(update);
  if (meta[FOLLOWUP_META_KEY] !== undefined && meta[FOLLOWUP_META_KEY] !== null) {
    effects.push(effect("FollowUpSuggestion", {
      suggestion: meta[FOLLOWUP_META_KEY], prompt_id: prompt, event_id: event.id,
    }));
  }
  if (kind === "user_message_chunk") {
    textChunk(draft, event, update, "user", prompt);
    if (turnWasOpen && meta.source !== BRIDGE_ECHO) {
      effects.push(effect("InjectedMessage", {
        text: textOf(update.content), prompt_id: prompt, event_id: event.id,
      }));
    }
  } else if (kind === "agent_message_chunk") {
    textChunk(draft, event, update, "assistant", prompt);
  } else if (kind === "agent_thought_chunk") {
    textChunk(draft, event, update, "thought", prompt);
  } else if (kind === "tool_call" || kind === "tool_call_update") {
    toolUpdate(draft, event, update, prompt);
  } else if (kind === "plan") {
    plan(draft, event, update, prompt);
  } else if (kind === "available_commands_update" || kind === "current_mode_update") {
    effects.push(effect("WorkspaceSignal", { type: kind, data: update, event_id: event.id }));
  } else {
    debug(draft, event, "unknown_session_update", `unknown session update: ${pyStr(kind)}`);
  }
  return effects;
}

// How Python's f-string prints a JSON value that is not a string (None, True, 3).
function pyStr(value) {
  if (value === undefined || value === null) return "None";
  if (value === true) return "True";
  if (value === false) return "False";
  return typeof value === "string" ? value : JSON.stringify(value);
}

function onHistoryTruncated(draft, event) {
  const marker = parseTruncation(event.data);
  const promptId = typeof event.prompt_id === "string" && event.prompt_id ? event.prompt_id : null;
  if (marker !== null) {
    message(draft, event, "status", statusText(marker), {
      code: marker.reason, source: HISTORY_TRUNCATED, data: event.data, promptId,
    });
  } else {
    message(draft, event, "debug", MALFORMED_TEXT, {
      code: MALFORMED_REASON, source: HISTORY_TRUNCATED, data: event.data, promptId,
    });
  }
  return [];
}

function onTurnComplete(draft, event) {
  const reason = payload(event).stopReason;
  assistantDone(draft, typeof reason === "string" && reason ? reason : "end_turn");
  closeTurn(draft, eventPromptId(event));
  return [];
}

function onTurnError(draft, event) {
  const data = payload(event);
  const code = data.code;
  message(draft, event, "error",
    typeof data.message === "string" && data.message ? data.message : "The turn failed.",
    {
      code: code !== undefined && code !== null ? pyStr(code) : null,
      source: "turn_error", data: event.data,
    });
  assistantDone(draft, "error");
  closeTurn(draft, eventPromptId(event));
  return [];
}

function onAssistantDone(draft, event) {
  const reason = payload(event).reason;
  assistantDone(draft, typeof reason === "string" && reason ? reason : "end_turn");
  return [];
}

function onPermissionRequest(draft, event) {
  const data = payload(event);
  const requestId = data.requestId;
  if (typeof requestId !== "string" || !requestId) {
    return debug(draft, event, MALFORMED_REASON, "permission_request: missing requestId");
  }
  settleStreaming(draft);
  const b = block({
    id: draft.newId("permission"), kind: "permission", request_id: requestId,
    tool_call: isObject(data.toolCall) ? data.toolCall : {},
    options: Object.freeze(Array.isArray(data.options) ? [...data.options] : []),
    resolved: false, outcome: null, reason: null, ...stamp(event, null, eventPromptId(event)),
  });
  draft.append(b);
  draft.permissions.set(requestId, b.id);
  return [];
}

function onPermissionResolved(draft, event) {
  const data = payload(event);
  const b = typeof data.requestId === "string" ? draft.get(draft.permissions.get(data.requestId)) : null;
  if (b !== null && b.kind === "permission") {
    draft.replace(replaced(b, touch(b, event, null, {
      resolved: true, outcome: data.outcome === undefined ? null : data.outcome,
      reason: typeof data.reason === "string" ? data.reason : null,
    })));
  }
  return [];
}

function onPromptCancelled(draft, event) {
  const reason = payload(event).reason;
  const text = typeof reason === "string" && reason
    ? `Cancellation requested (${reason}).` : "Cancellation requested.";
  message(draft, event, "prompt_cancelled", text, { code: null, source: event.type, data: event.data });
  return [];
}

function onSessionClosed(draft, event) {
  const reason = payload(event).reason;
  const text = typeof reason === "string" && reason ? `Session closed (${reason}).` : "Session closed.";
  message(draft, event, "status", text, { code: event.type, source: event.type, data: event.data });
  return [];
}

function onSlowClientWarning(draft, event) {
  const data = payload(event);
  const q = data.queueSize === undefined ? "?" : pyStr(data.queueSize);
  const m = data.maxQueued === undefined ? "?" : pyStr(data.maxQueued);
  message(draft, event, "status",
    `This client is falling behind the event stream (${q} of ${m} events queued).`,
    { code: event.type, source: event.type, data: event.data });
  return [notice(event, "This client is falling behind the event stream; updates may be delayed.",
    { operation: "subscribe" })];
}

function onStateResync(draft, event) {
  const reason = payload(event).reason;
  const suffix = typeof reason === "string" && reason ? ` (${reason})` : "";
  message(draft, event, "error",
    `The event stream lost continuity${suffix}; the session will be reloaded.`,
    { code: event.type, source: event.type, data: event.data });
  return [effect("ConnectionMetadata", { type: event.type, data: event.data, event_id: event.id })];
}

const HANDLERS = {
  session_update: onSessionUpdate,
  history_truncated: onHistoryTruncated,
  turn_complete: onTurnComplete,
  turn_error: onTurnError,
  [ASSISTANT_DONE]: onAssistantDone,
  permission_request: onPermissionRequest,
  permission_resolved: onPermissionResolved,
  prompt_cancelled: onPromptCancelled,
  session_closed: onSessionClosed,
  slow_client_warning: onSlowClientWarning,
  client_evicted: (d, e) => [notice(e,
    "The daemon closed this client's event stream because it fell too far behind.",
    { operation: "subscribe" })],
  session_died: (d, e) => [notice(e, "The agent process of this session exited.",
    { severity: "error", category: "session", recoverable: false })],
  stream_error: (d, e) => [notice(e, "The event stream failed.",
    { severity: "error", operation: "subscribe" })],
  state_resync_required: onStateResync,
  replay_complete: (d, e) => [effect("ConnectionMetadata", { type: e.type, data: e.data, event_id: e.id })],
  session_snapshot: (d, e) => [effect("ConnectionMetadata", { type: e.type, data: e.data, event_id: e.id })],
  pending_prompt_added: pendingPrompt,
  pending_prompt_started: pendingPrompt,
  pending_prompt_completed: pendingPrompt,
};

function pendingPrompt(draft, event) {
  return [effect("PendingPromptPublication", {
    type: event.type, prompt_id: eventPromptId(event), data: event.data, event_id: event.id,
  })];
}

// Reduce one event into the draft (not trimmed); return its side effects.
export function applyEvent(draft, event) {
  const handler = Object.hasOwn(HANDLERS, event.type) ? HANDLERS[event.type] : null;
  if (handler === null) return debug(draft, event, "unknown_event_type", `unknown event type: ${event.type}`);
  return handler(draft, event);
}
