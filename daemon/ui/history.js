// Snapshot replay, history pages and their pagination rules, built off-store (a port of the
// Python webui_model replay.py and pagination.py). Everything returns a complete state the view
// commits with one store.reset. Pure.

import {
  TranscriptDraft,
  applyEvent,
  defaultPagination,
  firstRecordId,
  isRecoverableLiveMarker,
  prependBlocks,
  settleStreaming,
  transcriptRecordIds,
  validMarkerPayload,
} from "./transcript.js";

export const PAGINATION_CAPABILITY = "session_transcript_pagination";
export const DEFAULT_PAGE_SIZE = 100;
export const HISTORY_FAILED_CODE = "daemon.transcript_history.failed";

// --- pagination ----------------------------------------------------------------------------------

function withPagination(p, changes) {
  return Object.freeze({ ...p, ...changes });
}

export function replayAnchor(events, historyAnchorRecordId = null) {
  let recordAnchor = null;
  let markerAnchor = null;
  let sawFullMarker = false;
  for (const event of events) {
    if (event.type === "history_truncated") {
      const data = validMarkerPayload(event);
      if (data === null) continue;
      if (data.fullTranscriptAvailable === true) sawFullMarker = true;
      if (markerAnchor === null && typeof data.recordId === "string" && data.recordId) {
        markerAnchor = data.recordId;
      }
    } else if (recordAnchor === null) {
      recordAnchor = firstRecordId(event);
    }
  }
  return [recordAnchor || markerAnchor || historyAnchorRecordId || null, sawFullMarker];
}

export function initialPagination(events, { enabled, historyHasMore = false,
  historyAnchorRecordId = null, pageSize = DEFAULT_PAGE_SIZE }) {
  const [anchor, sawFull] = replayAnchor(events, historyAnchorRecordId);
  return withPagination(defaultPagination(), {
    enabled, anchor_record_id: anchor, page_size: pageSize,
    has_more: enabled && (historyHasMore || sawFull) && anchor !== null,
  });
}

export function reanchored(p, events, { blockCount, configuredMaxBlocks }) {
  let anchor = null;
  for (const event of events) {
    anchor = firstRecordId(event);
    if (anchor !== null) break;
  }
  return withPagination(defaultPagination(), {
    enabled: p.enabled, anchor_record_id: anchor, page_size: p.page_size,
    has_more: p.enabled && anchor !== null && blockCount < configuredMaxBlocks,
  });
}

// The query of the next older page, or null (no request): [pagination, request].
export function loadMoreRequest(p, force = false) {
  if (p.pagination_error !== null) {
    if (!force) return [p, null];
    p = withPagination(p, { pagination_error: null });
  }
  if (!p.has_more) return [p, null];
  if (p.cursor !== null) return [p, { limit: p.page_size, cursor: p.cursor }];
  if (p.anchor_record_id !== null) {
    return [p, { limit: p.page_size, beforeRecordId: p.anchor_record_id }];
  }
  return [p, null];
}

// page = {events, has_more, next_cursor}
export function afterPage(p, page, { blockCount, configuredMaxBlocks }) {
  let anchor = p.anchor_record_id;
  let cursor = null;
  let pageAnchor = null;
  for (const event of page.events) {
    pageAnchor = firstRecordId(event);
    if (pageAnchor !== null) break;
  }
  if (pageAnchor !== null) anchor = pageAnchor;
  else if (page.next_cursor) cursor = page.next_cursor;
  const moved = pageAnchor !== null || cursor !== null;
  return withPagination(p, {
    anchor_record_id: anchor, cursor,
    has_more: page.has_more && moved && blockCount < configuredMaxBlocks,
    loaded_pages: p.loaded_pages + 1, history_complete: !page.has_more, pagination_error: null,
  });
}

export function capacityRejected(p) {
  return withPagination(p, { has_more: false, capacity_reached: true });
}

export function isTransientPageError(status) {
  return status === null || status >= 500 || status === 408 || status === 429;
}

// --- replay ----------------------------------------------------------------------------------------

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
  if (b.kind !== "status" || b.source !== "history_truncated") return false;
  if (b.data === null || typeof b.data !== "object" || Array.isArray(b.data)) return false;
  if ("scope" in b.data || b.data.fullTranscriptAvailable !== true) return false;
  return p.has_more || p.history_complete;
}

export function visibleBlocks(blocks, p) {
  return blocks.filter((b) => !isHiddenMarker(b, p));
}
