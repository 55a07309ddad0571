// The transcript store the view subscribes to (a port of the Python webui_model/store.py).
// Pure: listeners are plain callbacks.

import { DEFAULT_MAX_BLOCKS, STORE_MAX_BLOCKS, TranscriptDraft, block, emptyState } from "./draft.js";
import { applyEvent } from "./reducer.js";

export { DEFAULT_MAX_BLOCKS, STORE_MAX_BLOCKS };

export class TranscriptStore {
  constructor(maxBlocks = STORE_MAX_BLOCKS) {
    this.configured_max_blocks = maxBlocks;
    this.draft = new TranscriptDraft(maxBlocks);
    this.listeners = new Set();
    this.version = 0;
  }

  get blocks() {
    return this.draft.blocks;
  }

  get pagination() {
    return this.draft.pagination;
  }

  get max_blocks() {
    return this.draft.max_blocks;
  }

  snapshotState() {
    return this.draft.toState();
  }

  dispatch(event) {
    const effects = applyEvent(this.draft, event);
    this.draft.trim();
    this.notify();
    return effects;
  }

  addStatus(text, source = "provider") {
    const b = block({
      id: this.draft.newId("status"), kind: "status", text, code: null, source, data: null,
      event_id: null, last_event_id: null, prompt_id: null, server_timestamp: null,
      updated_at: null, timestamp: null, source_record_ids: Object.freeze([]),
    });
    this.draft.append(b);
    this.draft.trim();
    this.notify();
    return b;
  }

  setPagination(pagination) {
    this.draft.pagination = pagination;
    this.notify();
  }

  reset(state) {
    this.draft = TranscriptDraft.fromState(state);
    this.notify();
  }

  clear() {
    this.reset(emptyState(this.configured_max_blocks));
  }

  subscribe(listener) {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  notify() {
    this.version += 1;
    for (const listener of [...this.listeners]) listener();
  }
}
