// The repair's commit (a port of the Python webui_model/repair_commit.py): the checkpoint
// taken at the marker, pages mirrored into it, and the repaired state built off-store. Pure.

import { TranscriptDraft, appendBlock, prependBlocks, stateHasBlock } from "./draft.js";
import { eventPromptId } from "./events.js";
import { reanchored } from "./pagination.js";
import { runEvents } from "./replay.js";

export function takeCheckpoint(replay) {
  if (replay.marker_state === null || replay.marker_block_id === null) return null;
  return Object.freeze({
    state: replay.marker_state, marker_block_id: replay.marker_block_id,
    prompt_id: replay.marker_event === null ? null : eventPromptId(replay.marker_event),
  });
}

export function mirrorPage(checkpoint, pageBlocks, pagination = null) {
  const fresh = pageBlocks.filter((b) => !stateHasBlock(checkpoint.state, b.id));
  if (!fresh.length && pagination === null) return checkpoint;
  return Object.freeze({ ...checkpoint, state: prependBlocks(checkpoint.state, fresh, pagination) });
}

export function mirrorStatus(checkpoint, b) {
  if (stateHasBlock(checkpoint.state, b.id)) return checkpoint;
  return Object.freeze({ ...checkpoint, state: appendBlock(checkpoint.state, b) });
}

function nextCheckpoint(run, state) {
  if (run.marker_state === null || run.marker_block_id === null) return null;
  return Object.freeze({
    state: Object.freeze({ ...run.marker_state, max_blocks: state.max_blocks, pagination: state.pagination }),
    marker_block_id: run.marker_block_id,
    prompt_id: run.marker_event === null ? null : eventPromptId(run.marker_event),
  });
}

// {state, side_effects, from_checkpoint, checkpoint}: the repaired state to commit with one reset.
export function buildRepair(storeState, checkpoint, freshEvents, suffixStart, isNew, configuredMaxBlocks) {
  if (suffixStart < 0 || suffixStart > freshEvents.length) throw new Error("suffix_start outside the fresh replay");
  if (stateHasBlock(storeState, checkpoint.marker_block_id)) {
    const draft = TranscriptDraft.fromState(checkpoint.state);
    const run = runEvents(draft, freshEvents.slice(suffixStart), (_i, event) => isNew(event));
    const state = draft.toState();
    return { state, side_effects: run.side_effects, from_checkpoint: true, checkpoint: nextCheckpoint(run, state) };
  }
  const draft = new TranscriptDraft(configuredMaxBlocks);
  const run = runEvents(draft, freshEvents, (index, event) => index >= suffixStart && isNew(event));
  draft.pagination = reanchored(checkpoint.state.pagination, freshEvents,
    { blockCount: draft.length, configuredMaxBlocks });
  const state = draft.toState();
  return { state, side_effects: run.side_effects, from_checkpoint: false, checkpoint: nextCheckpoint(run, state) };
}

