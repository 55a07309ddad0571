// History paging rules (a port of the Python webui_model/pagination.py): the anchor of the
// next older page, the request, the state after a page or a failure. Pure.

import { HISTORY_TRUNCATED } from "./protocol.js";
import { firstRecordId, validMarkerPayload } from "./records.js";

export const DEFAULT_PAGE_SIZE = 100;

export function defaultPagination() {
  return Object.freeze({
    enabled: false, anchor_record_id: null, cursor: null, has_more: false,
    capacity_reached: false, pagination_error: null, loaded_pages: 0, history_complete: false,
    page_size: DEFAULT_PAGE_SIZE,
  });
}

function withPagination(p, changes) {
  return Object.freeze({ ...p, ...changes });
}

export function replayAnchor(events, historyAnchorRecordId = null) {
  let recordAnchor = null;
  let markerAnchor = null;
  let sawFullMarker = false;
  for (const event of events) {
    if (event.type === HISTORY_TRUNCATED) {
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
