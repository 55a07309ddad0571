// Snapshot replay and history pages, built off-store (a port of the Python
// webui_model/replay.py): everything returns a complete state the view commits with one
// store.reset. Pure.

import { TranscriptDraft, prependBlocks } from "./draft.js";
import {
  DEFAULT_PAGE_SIZE, afterPage, capacityRejected, initialPagination,
} from "./pagination.js";
import { HISTORY_TRUNCATED } from "./protocol.js";
import { isRecoverableLiveMarker, transcriptRecordIds } from "./records.js";
import { applyEvent, settleStreaming } from "./reducer.js";

// Reduce events into the draft, trimming after each; keepEffects(index, event) filters effects.
// Captures the state just before the first recoverable live marker.
export function runEvents(draft, events, keepEffects = null, captureMarker = true) {
  const effects = [];
  let markerState = null;
  let markerBlockId = null;
  let markerEvent = null;
  events.forEach((event, index) => {
    const capture = captureMarker && markerEvent === null && isRecoverableLiveMarker(event);
    const before = draft.length;
    const preMarker = capture ? draft.toState(draft.max_blocks || Math.max(1, before)) : null;
    const produced = applyEvent(draft, event);
    if (preMarker !== null && draft.length > before) {
      markerState = preMarker;
      markerEvent = event;
      markerBlockId = draft.blocks[draft.blocks.length - 1].id;
    }
    draft.trim();
    if (produced.length && (keepEffects === null || keepEffects(index, event))) effects.push(...produced);
  });
  return { side_effects: effects, marker_state: markerState, marker_block_id: markerBlockId,
    marker_event: markerEvent };
}

export function replaySnapshot(compacted, live, { configuredMaxBlocks, paginationEnabled = false,
  historyHasMore = false, historyAnchorRecordId = null, pageSize = DEFAULT_PAGE_SIZE }) {
  const events = [...compacted, ...live];
  const pagination = initialPagination(events, {
    enabled: paginationEnabled, historyHasMore, historyAnchorRecordId, pageSize,
  });
  const draft = new TranscriptDraft(null, pagination);
  const run = runEvents(draft, events);
  const cap = Math.max(configuredMaxBlocks, draft.length);
  let markerState = run.marker_state;
  if (markerState !== null) markerState = Object.freeze({ ...markerState, max_blocks: cap, pagination });
  return {
    state: draft.toState(cap), side_effects: run.side_effects, marker_state: markerState,
    marker_block_id: run.marker_block_id, marker_event: run.marker_event,
  };
}

// --- history pages ------------------------------------------------------------------------------------

export function displayedRecordIds(blocks) {
  const shown = new Set();
  for (const b of blocks) for (const rid of b.source_record_ids) shown.add(rid);
  return shown;
}

// Prepend an older page, or reject it whole when it would exceed the cap.
export function applyHistoryPage(state, page, configuredMaxBlocks) {
  const shown = displayedRecordIds(state.blocks);
  const kept = page.events.filter((event) => {
    const ids = transcriptRecordIds(event);
    return !(ids.length && ids.every((rid) => shown.has(rid)));
  });
  const draft = new TranscriptDraft(null, null, state.counters);
  for (const event of kept) applyEvent(draft, event);
  settleStreaming(draft);
  const pageBlocks = [...draft.blocks];
  const dropped = page.events.length - kept.length;
  const total = state.blocks.length + pageBlocks.length;
  if (total > state.max_blocks) {
    const rejected = Object.freeze({ ...state, pagination: capacityRejected(state.pagination) });
    return { state: rejected, page_blocks: [], accepted: false, dropped_events: dropped };
  }
  const pagination = afterPage(state.pagination, page, { blockCount: total, configuredMaxBlocks });
  return {
    state: prependBlocks(state, pageBlocks, pagination), page_blocks: pageBlocks, accepted: true,
    dropped_events: dropped,
  };
}

// --- what is shown ---------------------------------------------------------------------------------------

export function isHiddenMarker(b, p) {
  if (b.kind !== "status" || b.source !== HISTORY_TRUNCATED) return false;
  if (b.data === null || typeof b.data !== "object" || Array.isArray(b.data)) return false;
  if ("scope" in b.data || b.data.fullTranscriptAvailable !== true) return false;
  return p.has_more || p.history_complete;
}

export function visibleBlocks(blocks, p) {
  return blocks.filter((b) => !isHiddenMarker(b, p));
}
