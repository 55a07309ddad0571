// Live-journal repair, the pure rules (a port of the Python sdk/repair.py): the target, the
// fresh snapshot's validation, which replayed events may repeat their side effects, the
// notice, and one repair episode's states. Pure.

import { eventPromptId } from "./events.js";
import { EVENT, HISTORY_TRUNCATED, TERMINAL_TYPES } from "./protocol.js";
import { isRecoverableLive, parseTruncation } from "./truncation.js";

export const DEGRADED_TEXT = "Fresh replay is degraded";
export const INCOMPLETE_TEXT = "Fresh replay does not contain the complete target turn";
export const NOTICE_CODE = "daemon.live_journal_repair.failed";
export const NOTICE_MESSAGE = "Could not restore the complete turn. The retained replay remains visible.";

function formatCount(value) {
  if (typeof value !== "number" || !Number.isFinite(value)) return "unknown";
  return String(value);
}

export function repairSignature(sessionId, promptId, lastEventId, truncatedEvents) {
  const cursor = Number.isInteger(lastEventId) ? String(lastEventId) : "unknown";
  return `${sessionId}:${promptId}:${cursor}:${formatCount(truncatedEvents)}`;
}

// {marker, prompt_id, signature, marker_data} or null (no automatic repair).
export function findRepairTarget(sessionId, liveJournal, lastEventId, degraded) {
  if (degraded) return null;
  let found = null;
  for (const event of liveJournal) {
    if (event.type !== HISTORY_TRUNCATED) continue;
    const marker = parseTruncation(event.data);
    if (marker !== null && isRecoverableLive(marker)) {
      found = [event, marker];
      break;
    }
  }
  if (found === null) return null;
  const [event, marker] = found;
  let promptId = typeof event.prompt_id === "string" && event.prompt_id ? event.prompt_id : null;
  if (promptId === null) {
    const ids = new Set();
    for (const other of liveJournal) {
      if (other.type === HISTORY_TRUNCATED) continue;
      const pid = eventPromptId(other);
      if (pid !== null) ids.add(pid);
    }
    if (ids.size !== 1) return null;
    [promptId] = ids;
  }
  return {
    marker: event, prompt_id: promptId, marker_data: marker,
    signature: repairSignature(sessionId, promptId, lastEventId, marker.truncated_events),
  };
}

function isUserInput(event) {
  if (event.type !== EVENT.sessionUpdate || event.data === null || typeof event.data !== "object") return false;
  const update = event.data.update;
  return update !== null && typeof update === "object" && update.sessionUpdate === "user_message_chunk";
}

export function findSuffixStart(events, promptId) {
  let start = null;
  for (let index = 0; index < events.length; index += 1) {
    const event = events[index];
    if (start === null) {
      if (isUserInput(event) && eventPromptId(event) === promptId) start = index;
    } else if (TERMINAL_TYPES.has(event.type) && eventPromptId(event) === promptId) {
      return start;
    }
  }
  return null;
}

// {events, start} or {error: "degraded"|"incomplete_turn", message}.
export function validateFreshSnapshot(compacted, live, degraded, promptId) {
  if (degraded) return { error: "degraded", message: DEGRADED_TEXT };
  const events = [...compacted, ...live];
  const start = findSuffixStart(events, promptId);
  if (start === null) return { error: "incomplete_turn", message: INCOMPLETE_TEXT };
  return { events, start };
}

export function isNewEvent(eventId, observedIds, watermark, highestLiveId) {
  if (eventId === null || observedIds.has(eventId)) return false;
  return !(watermark !== null && highestLiveId !== null && watermark < eventId && eventId <= highestLiveId);
}

export function repairNotice(signature, errorText) {
  return Object.freeze({
    kind: "Notice", id: `${NOTICE_CODE}:${signature}`, code: NOTICE_CODE, message: NOTICE_MESSAGE,
    severity: "warning", category: "connection", operation: "load_session", recoverable: true,
    debug_message: errorText,
  });
}

// --- the episode --------------------------------------------------------------------------------

// One repair episode: PENDING -> ARMED (the target's terminal arrived) -> RELOADING -> NONE.
export class RepairEpisode {
  constructor(sessionId, target, observedIds, watermark, attempted = false) {
    this.session_id = sessionId;
    this.target = target;
    this.observed_ids = new Set(observedIds);
    this.watermark = watermark;
    this.highest_live_id = null;
    this.terminal_seen = false;
    this.attempted = attempted;
    this.state = "pending";
    this.checkpoint = null;
  }

  // Account for one live event; true when it is the terminal that arms the episode.
  observeLive(event) {
    if (event.id !== null && (this.highest_live_id === null || event.id > this.highest_live_id)) {
      this.highest_live_id = event.id;
    }
    if (this.state !== "pending" || this.attempted || !TERMINAL_TYPES.has(event.type) ||
        eventPromptId(event) !== this.target.prompt_id) {
      return false;
    }
    this.terminal_seen = true;
    this.state = "armed";
    return true;
  }

  shouldAttempt(guards) {
    return this.state === "armed" && this.terminal_seen && !this.attempted &&
      guards.current_session_id === this.session_id && !guards.load_in_flight &&
      !guards.page_request_in_flight && !guards.local_prompt_in_flight &&
      !guards.navigation_in_flight;
  }

  markAttempted() {
    if (this.state !== "armed" || this.attempted) throw new Error("repair episode cannot start");
    this.attempted = true;
    this.state = "reloading";
  }

  isNew(eventId) {
    return isNewEvent(eventId, this.observed_ids, this.watermark, this.highest_live_id);
  }

  finish() {
    this.state = "none";
  }
}
