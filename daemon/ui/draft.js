// The transcript's state: immutable blocks, the mutable draft the reducer edits, and the
// frozen state a store or a repair checkpoint holds. A port of the Python webui_model/draft.py
// and blocks.py; the conformance vectors keep the two in agreement. Pure: no DOM, no network.
//
// Blocks are frozen objects; a change builds a new block and swaps it in (copy-on-write), so a
// repair checkpoint and the live store can share block objects. Ids are "<kind>-<ordinal>".

import { defaultPagination } from "./pagination.js";

export const STORE_MAX_BLOCKS = 1000;
export const DEFAULT_MAX_BLOCKS = 200000;
export const BLOCK_KINDS = new Set([
  "user", "assistant", "thought", "tool", "permission", "status", "error", "debug",
  "prompt_cancelled",
]);


export function block(fields) {
  return Object.freeze(fields);
}

export function replaced(old, changes) {
  return Object.freeze({ ...old, ...changes });
}

export function parseBlockId(value) {
  const at = value.lastIndexOf("-");
  const kind = value.slice(0, at);
  const ordinal = value.slice(at + 1);
  if (at < 0 || !BLOCK_KINDS.has(kind) || !/^[0-9]+$/.test(ordinal)) {
    throw new Error(`not a transcript block id: ${value}`);
  }
  return [kind, Number(ordinal)];
}

// --- state and draft ------------------------------------------------------------------------

// A frozen store state: blocks plus index maps, active pointers, counters, the effective cap and
// the pagination state. Making one copies references only.
export function emptyState(maxBlocks = STORE_MAX_BLOCKS) {
  return new TranscriptDraft(maxBlocks).toState();
}

export function stateHasBlock(state, id) {
  return state.positions.has(id);
}

export class TranscriptDraft {
  constructor(maxBlocks, pagination = null, counters = null) {
    if (maxBlocks !== null && maxBlocks < 1) throw new Error(`max_blocks must be >= 1`);
    this.blocks = [];
    this.base = 0;
    this.positions = new Map();
    this.tools = new Map();
    this.permissions = new Map();
    this.in_flight_tools = new Set();
    this.active_user = null;
    this.active_assistant = null;
    this.active_thought = null;
    this.counters = new Map(counters || []);
    this.open_prompt_id = null;
    this.max_blocks = maxBlocks;
    this.pagination = pagination || defaultPagination();
  }

  static fromState(state, maxBlocks = undefined) {
    const draft = new TranscriptDraft(
      maxBlocks === undefined ? state.max_blocks : maxBlocks, state.pagination, state.counters,
    );
    draft.blocks = [...state.blocks];
    draft.base = state.base;
    draft.positions = new Map(state.positions);
    draft.tools = new Map(state.tools);
    draft.permissions = new Map(state.permissions);
    draft.in_flight_tools = new Set(state.in_flight_tools);
    draft.active_user = state.active_user;
    draft.active_assistant = state.active_assistant;
    draft.active_thought = state.active_thought;
    draft.open_prompt_id = state.open_prompt_id;
    return draft;
  }

  toState(maxBlocks = null) {
    const cap = maxBlocks !== null ? maxBlocks : this.max_blocks;
    if (cap === null) throw new Error("an unbounded draft needs an explicit max_blocks to freeze");
    return Object.freeze({
      blocks: Object.freeze([...this.blocks]),
      base: this.base,
      positions: new Map(this.positions),
      tools: new Map(this.tools),
      permissions: new Map(this.permissions),
      in_flight_tools: new Set(this.in_flight_tools),
      active_user: this.active_user,
      active_assistant: this.active_assistant,
      active_thought: this.active_thought,
      counters: new Map(this.counters),
      open_prompt_id: this.open_prompt_id,
      max_blocks: cap,
      pagination: this.pagination,
    });
  }

  get length() {
    return this.blocks.length;
  }

  get(id) {
    if (id === null || id === undefined) return null;
    const position = this.positions.get(id);
    return position === undefined ? null : this.blocks[position - this.base];
  }

  newId(kind) {
    const ordinal = (this.counters.get(kind) || 0) + 1;
    this.counters.set(kind, ordinal);
    return `${kind}-${ordinal}`;
  }

  append(b) {
    if (this.positions.has(b.id)) throw new Error(`duplicate block id ${b.id}`);
    this.positions.set(b.id, this.base + this.blocks.length);
    this.blocks.push(b);
  }

  replace(b) {
    const position = this.positions.get(b.id);
    if (position === undefined) throw new Error(`no stored block ${b.id} to replace`);
    this.blocks[position - this.base] = b;
  }

  trim() {
    const cap = this.max_blocks;
    const excess = cap === null ? 0 : this.blocks.length - cap;
    if (excess <= 0) return [];
    const evicted = this.blocks.splice(0, excess);
    this.base += excess;
    for (const b of evicted) this.forget(b);
    return evicted;
  }

  forget(b) {
    const id = b.id;
    this.positions.delete(id);
    this.in_flight_tools.delete(id);
    if (b.kind === "tool" && this.tools.get(b.tool_call_id) === id) this.tools.delete(b.tool_call_id);
    else if (b.kind === "permission" && this.permissions.get(b.request_id) === id) {
      this.permissions.delete(b.request_id);
    }
    if (this.active_user === id) this.active_user = null;
    if (this.active_assistant === id) this.active_assistant = null;
    if (this.active_thought === id) this.active_thought = null;
  }
}

export function bumpCounters(counters, blocks) {
  const bumped = new Map(counters);
  for (const b of blocks) {
    const [kind, ordinal] = parseBlockId(b.id);
    if (ordinal > (bumped.get(kind) || 0)) bumped.set(kind, ordinal);
  }
  return bumped;
}

// state with older blocks in front (a history page), sharing every block object.
export function prependBlocks(state, blocks, pagination = null) {
  const newBase = state.base - blocks.length;
  const positions = new Map(state.positions);
  const tools = new Map(state.tools);
  const permissions = new Map(state.permissions);
  blocks.forEach((b, offset) => {
    if (positions.has(b.id)) throw new Error(`prepended block id ${b.id} is already stored`);
    positions.set(b.id, newBase + offset);
    if (b.kind === "tool" && !tools.has(b.tool_call_id)) tools.set(b.tool_call_id, b.id);
    else if (b.kind === "permission" && !permissions.has(b.request_id)) {
      permissions.set(b.request_id, b.id);
    }
  });
  return Object.freeze({
    ...state,
    blocks: Object.freeze([...blocks, ...state.blocks]),
    base: newBase,
    positions,
    tools,
    permissions,
    counters: bumpCounters(state.counters, blocks),
    pagination: pagination === null ? state.pagination : pagination,
  });
}

export function appendBlock(state, b) {
  const draft = TranscriptDraft.fromState(state);
  draft.append(b);
  draft.counters = bumpCounters(draft.counters, [b]);
  return draft.toState();
}
