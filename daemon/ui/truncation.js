// history_truncated markers: validation and the exact status text (the same wording as the
// Python SDK's sdk/truncation.py; the conformance vectors hold both to it). Pure.

import { isObject } from "./events.js";
import { HISTORY_TRUNCATED, LIVE_JOURNAL_SCOPE, REPLAY_WINDOW_EXCEEDED } from "./protocol.js";

export { HISTORY_TRUNCATED, LIVE_JOURNAL_SCOPE, REPLAY_WINDOW_EXCEEDED };
export const MALFORMED_REASON = "malformed_payload";
export const MALFORMED_TEXT = "history_truncated: malformed history_truncated payload";

// JSON has one number type: 3.0 is 3. Booleans are not counts.
function isCount(value) {
  return typeof value === "number" && Number.isFinite(value) && Number.isInteger(value) &&
    value >= 0;
}

// A validated marker {reason, scope, truncated_events, retained_events, max_bytes, max_events,
// truncated_turns, record_id, full_transcript_available}, or null when malformed.
export function parseTruncation(data) {
  if (!isObject(data)) return null;
  if (data.reason !== REPLAY_WINDOW_EXCEEDED) return null;
  let scope = null;
  if ("scope" in data) {
    if (typeof data.scope !== "string" || !data.scope) return null;
    scope = data.scope;
  }
  for (const key of ["truncatedEvents", "retainedEvents", "maxBytes"]) {
    if (!isCount(data[key])) return null;
  }
  for (const key of ["maxEvents", "truncatedTurns"]) {
    if (key in data && !isCount(data[key])) return null;
  }
  if (typeof data.fullTranscriptAvailable !== "boolean") return null;
  return {
    reason: REPLAY_WINDOW_EXCEEDED,
    scope,
    truncated_events: data.truncatedEvents,
    retained_events: data.retainedEvents,
    max_bytes: data.maxBytes,
    max_events: "maxEvents" in data ? data.maxEvents : null,
    truncated_turns: "truncatedTurns" in data ? data.truncatedTurns : null,
    record_id: typeof data.recordId === "string" ? data.recordId : null,
    full_transcript_available: data.fullTranscriptAvailable,
  };
}

export function isRecoverableLive(marker) {
  return marker !== null && marker.scope === LIVE_JOURNAL_SCOPE && marker.full_transcript_available;
}

function limits(marker, unit) {
  if (marker.max_events === null) return `${marker.max_bytes} bytes`;
  return `${marker.max_events} ${unit} / ${marker.max_bytes} bytes`;
}

export function statusText(marker) {
  const kept = marker.retained_events;
  const dropped = marker.truncated_events;
  const full = marker.full_transcript_available;
  if (marker.scope === LIVE_JOURNAL_SCOPE) {
    return `History truncated for live turn replay: kept the latest ${kept} source events and ` +
      `dropped ${dropped} older source events (limits: ${limits(marker, "replay entries")}). ` +
      (full
        ? "Complete content remains available after the turn finishes."
        : "Complete content is not available for automatic recovery.");
  }
  if (marker.scope === null) {
    return `History truncated in replay history: kept the latest ${kept} events and ` +
      `dropped ${dropped} older replay events (limits: ${limits(marker, "events")}). ` +
      (full
        ? "Older content remains available from the full transcript."
        : "Older content is not available from a full transcript.");
  }
  return `History truncated: kept the latest ${kept} events and dropped ${dropped} older replay ` +
    `events (limits: ${limits(marker, "events")}). ` +
    (full ? "Full transcript content remains available." : "Full transcript content is not available.");
}
