// Event envelopes: the frame-validity rules every client shares (one JSON object, v == 1, a
// string type, an optional integer id in 1..2^53-1) and the prompt an event belongs to.
// Pure: no DOM, no network.

import { ENVELOPE_VERSION, EVENT, MAX_EVENT_ID, TERMINAL_TYPES } from "./protocol.js";

export { MAX_EVENT_ID, TERMINAL_TYPES };

export function isObject(value) {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}

function validId(value) {
  if (typeof value !== "number" || !Number.isInteger(value)) return null;
  return value >= 1 && value <= MAX_EVENT_ID ? value : null;
}

// A parsed wire frame -> a normalized event {type, id, data, prompt_id, originator_client_id,
// meta}, or null when the frame must be skipped. Wrongly typed optional fields are absent.
export function eventFromMapping(obj) {
  if (!isObject(obj)) return null;
  if (typeof obj.v !== "number" || obj.v !== ENVELOPE_VERSION) return null;
  if (typeof obj.type !== "string") return null;
  let id = null;
  if ("id" in obj) {
    id = validId(obj.id);
    if (id === null) return null;
  }
  return Object.freeze({
    type: obj.type,
    id,
    data: obj.data === undefined ? null : obj.data,
    prompt_id: typeof obj.promptId === "string" ? obj.promptId : null,
    originator_client_id:
      typeof obj.originatorClientId === "string" ? obj.originatorClientId : null,
    meta: isObject(obj._meta) ? obj._meta : null,
  });
}

export function decodeEvents(items) {
  const out = [];
  for (const item of items || []) {
    const event = eventFromMapping(item);
    if (event !== null) out.push(event);
  }
  return out;
}

// The envelope as a plain frame again (absent fields omitted), e.g. the raw frame a debug
// block keeps.
export function rawFrame(event) {
  const raw = { type: event.type, v: ENVELOPE_VERSION };
  if (event.id !== null) raw.id = event.id;
  if (event.data !== null) raw.data = event.data;
  if (event.prompt_id !== null) raw.promptId = event.prompt_id;
  if (event.originator_client_id !== null) raw.originatorClientId = event.originator_client_id;
  if (event.meta !== null) raw._meta = event.meta;
  return raw;
}

// The envelope promptId, else data.promptId.
export function eventPromptId(event) {
  if (typeof event.prompt_id === "string" && event.prompt_id) return event.prompt_id;
  const data = event.data;
  if (isObject(data) && typeof data.promptId === "string" && data.promptId) return data.promptId;
  return null;
}

// A transcript-page event in the bus shape (data = {sessionId, update}); the reference daemon
// puts the update itself in data.
export function normalizePageEvent(obj, sessionId = null) {
  const event = eventFromMapping(obj);
  if (event === null || event.type !== EVENT.sessionUpdate) return event;
  const data = event.data;
  if (!isObject(data) || "update" in data || !("sessionUpdate" in data)) return event;
  const sid = sessionId !== null ? sessionId : data.sessionId;
  const wrapped = typeof sid === "string" ? { sessionId: sid, update: data } : { update: data };
  return Object.freeze({ ...event, data: wrapped });
}
