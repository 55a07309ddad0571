// One open session: load -> replay -> subscribe -> resume, the live-journal repair episode,
// history pages, the turn that runs and the prompts queued behind it, and the actions (prompt,
// stop, vote). It talks to the viewer (app.js) through a few calls: setConnection, commitState,
// perform, addNotice, sessionMissing, turnChanged. Every rule about blocks, markers and repair
// is in the pure modules, which the conformance vectors keep in agreement with the Python model.

import { HttpError, NetworkError, isAbort, isAuthStatus, isMissingStatus } from "./api.js";
import { decodeEvents, eventFromMapping, eventPromptId, normalizePageEvent } from "./events.js";
import { isTransientPageError, loadMoreRequest } from "./pagination.js";
import {
  AGENT_CONTEXT_LOST, AGENT_CONTEXT_LOST_CODE, EVENT, EVENT_STREAM_TYPE, HEADER_EVENT_EPOCH,
  HEADER_IDEMPOTENCY_KEY, HEADER_LAST_EVENT_ID, HISTORY_FAILED_CODE, ROUTES, TERMINAL_TYPES,
} from "./protocol.js";
import { RepairEpisode, findRepairTarget, repairNotice, validateFreshSnapshot } from "./repair.js";
import { buildRepair, mirrorPage, takeCheckpoint } from "./repair_commit.js";
import { applyHistoryPage, replaySnapshot } from "./replay.js";
import { SseParser } from "./sse.js";
import {
  RESEND_BUDGET_MS, SEND_TIMEOUT_MS, Submission, newIdempotencyKey, resendDelayMs,
} from "./submission.js";

export const BACKOFF_BASE_MS = 1000;
export const BACKOFF_CAP_MS = 10000;

// A prompt whose sends gave up after one may have been admitted: the daemon may run it or not.
// It is sent again, with its key, when the event stream connects again (or on "Resend now").
export class PromptOutcomeUnknown extends Error {
  constructor(submission) {
    super("not known whether the prompt reached the daemon: it is sent again, with the same "
      + "Idempotency-Key (so it runs at most once), when the connection is back");
    this.submission = submission;
  }
}

function serverTime(event) {
  const meta = event.meta;
  if (meta && Number.isFinite(meta.serverTimestamp)) return meta.serverTimestamp;
  const update = event.data && event.data.update;
  const inner = update && update._meta;
  if (inner && Number.isFinite(inner.serverTimestamp)) return inner.serverTimestamp;
  return null;
}

export class SessionView {
  constructor(viewer, sessionId, pageSize) {
    this.viewer = viewer;
    this.api = viewer.api;
    this.id = sessionId;
    this.store = viewer.store;
    this.closed = false;
    this.clientId = null;
    this.cursor = null;       // the highest event id seen (Last-Event-ID)
    this.epoch = null;        // X-Qwen-Event-Epoch
    this.stream = null;       // {controller, promise}
    this.episode = null;
    this.loads = 0;
    this.pageRequests = 0;
    this.pageController = null;
    this.localPrompts = new Set();   // prompt ids sent here whose terminal has not arrived
    this.sending = 0;                // prompt POSTs in flight
    this.terminals = new Set();      // prompt ids whose terminal was seen
    this.repairController = null;
    this.resyncScheduled = false;
    this.backoff = 0;
    this.pageSize = pageSize;
    this.workspace = null;
    this.missing = false;
    // The turn that runs ({promptId, since: ms}) and the prompts queued behind it (id -> text).
    this.running = null;
    this.queued = new Map();
    this.restoreTried = false;   // a stream's "no session" was answered with one restoring load
    this.unsent = null;          // the Submission being resent, or whose outcome is unknown
  }

  // -- lifecycle --

  async open() {
    this.viewer.setConnection("connecting");
    await this.load(this.pageSize);
  }

  close() {
    // Navigation: stop the stream, abort a repair or page request, forget the episode.
    this.closed = true;
    this.abortRepair();
    this.stopStream();
    if (this.pageController) this.pageController.abort();
    if (this.clientId) {
      this.api.request("POST", ROUTES.detach(this.id), { clientId: this.clientId }).catch(() => {});
    }
  }

  abortRepair() {
    if (this.repairController !== null) {
      this.repairController.abort();
      this.repairController = null;
      this.viewer.stats.repairsAborted += 1;
    }
    if (this.episode !== null) this.episode.finish();
    this.episode = null;
  }

  async load(historyPageSize) {
    // A configured load (open, reload after state_resync_required): aborts any repair episode.
    this.abortRepair();
    this.stopStream();
    this.loads += 1;
    this.viewer.stats.loads += 1;
    try {
      const body = historyPageSize === null ? {} : { historyPageSize };
      const result = await this.api.request("POST", ROUTES.load(this.id), { body, clientId: this.clientId });
      if (this.closed) return;
      this.commitLoad(result);
    } catch (error) {
      if (this.closed || isAbort(error)) return;
      this.failed(error);
    } finally {
      this.loads -= 1;
      this.idlePoint();
    }
  }

  commitLoad(result) {
    const compacted = decodeEvents(result.compactedReplay);
    const live = decodeEvents(result.liveJournal);
    const replay = replaySnapshot(compacted, live, {
      configuredMaxBlocks: this.store.configured_max_blocks,
      paginationEnabled: this.viewer.paginationEnabled,
      historyHasMore: result.historyHasMore === true,
      historyAnchorRecordId: typeof result.historyAnchorRecordId === "string" ? result.historyAnchorRecordId : null,
      pageSize: this.pageSize,
    });
    this.clientId = result.clientId || this.clientId;
    this.cursor = Number.isInteger(result.lastEventId) ? result.lastEventId : null;
    this.epoch = typeof result.eventEpoch === "string" ? result.eventEpoch : null;
    this.workspace = typeof result.workspaceCwd === "string" ? result.workspaceCwd : this.workspace;
    this.running = null;
    this.queued.clear();
    for (const event of [...compacted, ...live]) { this.noteTerminal(event); this.trackTurn(event); }
    if (result.hasActivePrompt !== true) this.running = null;
    this.viewer.commitState(replay.state);
    this.viewer.perform(replay.side_effects);
    if (result.agentSessionRestored === false) {
      // Restored from the transcript on a new agent session: the agent forgot the earlier turns.
      this.viewer.addNotice({ id: AGENT_CONTEXT_LOST_CODE, message: AGENT_CONTEXT_LOST });
    }
    this.viewer.turnChanged();
    this.startEpisode(live, result, takeCheckpoint(replay));
    this.subscribe();
  }

  startEpisode(live, result, checkpoint) {
    const target = findRepairTarget(this.id, live, this.cursor, result.replayDegraded === true);
    if (target === null || checkpoint === null) {
      this.episode = null;
      return;
    }
    const attempted = this.viewer.attempted.has(target.signature);
    const observed = live.filter((e) => e.id !== null).map((e) => e.id);
    this.episode = new RepairEpisode(this.id, target, observed, this.cursor, attempted);
    this.episode.checkpoint = checkpoint;
    this.viewer.stats.episodes += 1;
  }

  // -- the turn and the queue (what the working indicator and the queue tray show) --

  trackTurn(event) {
    const promptId = eventPromptId(event);
    if (promptId === null) return false;
    const before = this.running === null ? null : this.running.promptId;
    const queuedBefore = this.queued.size;
    if (event.type === EVENT.pendingPromptAdded) {
      const text = event.data && typeof event.data.text === "string" ? event.data.text : "";
      if (!this.terminals.has(promptId)) this.queued.set(promptId, text);
    } else if (event.type === EVENT.pendingPromptCompleted) {
      this.queued.delete(promptId);
    } else if (TERMINAL_TYPES.has(event.type)) {
      this.queued.delete(promptId);
      if (this.running !== null && this.running.promptId === promptId) this.running = null;
    } else if (!this.terminals.has(promptId) &&
               (this.running === null || this.running.promptId !== promptId)) {
      // Any other event of a prompt whose terminal has not come: that prompt is running.
      this.queued.delete(promptId);
      const since = serverTime(event);
      this.running = { promptId, since: since !== null ? since : Date.now() };
    }
    const after = this.running === null ? null : this.running.promptId;
    return before !== after || queuedBefore !== this.queued.size;
  }

  // -- the event stream --

  subscribe() {
    this.stopStream();
    const controller = new AbortController();
    const stream = { controller };
    stream.promise = this.readStream(controller).catch(() => {});
    this.stream = stream;
  }

  stopStream() {
    // Pausing keeps the cursor and epoch: the next subscribe resumes from them.
    if (this.stream !== null) {
      this.stream.controller.abort();
      this.stream = null;
    }
  }

  async readStream(controller) {
    while (!controller.signal.aborted && !this.closed) {
      let retryable = true;
      try {
        await this.readOnce(controller);
      } catch (error) {
        if (controller.signal.aborted || this.closed) return;
        if (error instanceof HttpError) {
          if (isMissingStatus(error.status) && !this.restoreTried) {
            // A restarted daemon knows a persisted session only once it is loaded again: one
            // load restores it (and resubscribes); a second "no session" is final.
            this.restoreTried = true;
            this.viewer.stats.restores += 1;
            queueMicrotask(() => { this.load(this.pageSize); });
            return;
          }
          if (isAuthStatus(error.status) || isMissingStatus(error.status)) { this.failed(error); return; }
          retryable = !(error.body && error.body.retryable === false);
          if (!retryable) { this.failed(error); return; }
        }
      }
      if (controller.signal.aborted || this.closed || !retryable) return;
      this.backoff += 1;
      const delay = Math.min(BACKOFF_BASE_MS * 2 ** (this.backoff - 1), BACKOFF_CAP_MS) *
        (0.8 + Math.random() * 0.4);
      this.viewer.setConnection("reconnecting", { retryAt: Date.now() + delay, attempt: this.backoff });
      await new Promise((resolve) => {
        const timer = setTimeout(resolve, delay);
        controller.signal.addEventListener("abort", () => { clearTimeout(timer); resolve(); }, { once: true });
      });
      if (!controller.signal.aborted && !this.closed) this.viewer.setConnection("connecting");
    }
  }

  async readOnce(controller) {
    const headers = this.api.headers({ Accept: EVENT_STREAM_TYPE });
    if (this.cursor !== null) {
      headers[HEADER_LAST_EVENT_ID] = String(this.cursor);
      if (this.epoch !== null) headers[HEADER_EVENT_EPOCH] = this.epoch;
    }
    const response = await fetch(ROUTES.events(this.id), {
      headers, signal: controller.signal, cache: "no-store",
    });
    if (!response.ok) {
      let body = null;
      try { body = await response.json(); } catch { body = null; }
      throw new HttpError(response.status, body);
    }
    const contentType = response.headers.get("content-type") || "";
    if (!contentType.startsWith(EVENT_STREAM_TYPE)) throw new Error("not an event stream");
    const epoch = response.headers.get(HEADER_EVENT_EPOCH);
    if (epoch) this.epoch = epoch;
    this.viewer.stats.streamsOpened += 1;
    if (this.cursor !== null && this.viewer.stats.streamsOpened > 1) this.viewer.stats.resumes += 1;
    this.viewer.setConnection("connected");
    this.restoreTried = false;
    // The connection is back: a prompt whose outcome is unknown is sent again with its key.
    if (this.unsent !== null && this.unsent.state === "unknown") {
      queueMicrotask(() => { this.resendUnsent().catch(() => {}); });
    }
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    const parser = new SseParser();
    for (;;) {
      const { value, done } = await reader.read();
      if (done) throw new Error("event stream ended");
      const events = [];
      for (const data of parser.feed(value)) {
        let obj;
        try { obj = JSON.parse(data); } catch { continue; }
        const event = eventFromMapping(obj);
        if (event !== null) events.push(event);
      }
      if (events.length) this.backoff = 0;
      for (const event of events) {
        if (controller.signal.aborted || this.closed) return;
        try {
          this.onEvent(event);
        } catch (error) {
          // A bug in showing one event must not cost the stream (its cursor has moved on).
          this.viewer.unexpected(error);
        }
      }
    }
  }

  onEvent(event) {
    if (event.id !== null) {
      if (this.cursor !== null && event.id <= this.cursor) {
        // The daemon never sends one twice; a client must still never show one twice.
        this.viewer.stats.duplicatesDropped += 1;
        return;
      }
      this.cursor = event.id;
    }
    this.viewer.stats.eventsReceived += 1;
    this.viewer.perform(this.store.dispatch(event));
    this.noteTerminal(event);
    if (this.trackTurn(event)) this.viewer.turnChanged();
    if (TERMINAL_TYPES.has(event.type) || event.type === EVENT.sessionClosed) {
      this.viewer.sidebar.refresh().catch(() => {});
    }
    if (event.type === EVENT.stateResyncRequired) {
      // The stream lost continuity: reload the session (a configured load; aborts a repair).
      if (!this.resyncScheduled) {
        this.resyncScheduled = true;
        this.viewer.stats.resyncs += 1;
        queueMicrotask(() => {
          this.load(this.pageSize).finally(() => { this.resyncScheduled = false; });
        });
      }
      return;
    }
    if (this.episode !== null) this.episode.observeLive(event);
    this.idlePoint();
  }

  noteTerminal(event) {
    if (!TERMINAL_TYPES.has(event.type)) return;
    const promptId = eventPromptId(event);
    if (promptId === null) return;
    this.terminals.add(promptId);
    this.localPrompts.delete(promptId);
  }

  // A load or the stream failed for good: say what the user can do.
  failed(error) {
    if (error instanceof HttpError && isAuthStatus(error.status)) {
      this.viewer.setConnection("auth_needed");
    } else if (error instanceof HttpError && isMissingStatus(error.status)) {
      this.missing = true;
      this.stopStream();
      this.viewer.sessionMissing(this);
    } else {
      this.viewer.setConnection("error", { message: error && error.message ? error.message : String(error) });
      this.viewer.addNotice({ id: "viewer.session.failed", message: error instanceof NetworkError
        ? "Cannot reach the daemon. Is it still running?"
        : "Could not open the session.", debug_message: String(error && error.message) });
    }
  }

  // -- the repair episode --

  guards() {
    return {
      current_session_id: this.closed ? null : this.id,
      load_in_flight: this.loads > 0,
      page_request_in_flight: this.pageRequests > 0,
      local_prompt_in_flight: this.sending > 0 || this.localPrompts.size > 0,
      navigation_in_flight: this.viewer.navigating,
    };
  }

  // Re-check the guards at every idle point (no timers): after each live event, when a load,
  // a page request or a local prompt settles.
  idlePoint() {
    const episode = this.episode;
    if (episode !== null && !this.closed && episode.shouldAttempt(this.guards())) {
      this.attemptRepair(episode);
    }
  }

  async attemptRepair(episode) {
    episode.markAttempted();
    this.viewer.attempted.add(episode.target.signature);
    this.viewer.stats.repairAttempts += 1;
    this.viewer.setConnection("repairing");
    this.stopStream();   // pause: keep the cursor and epoch
    const controller = new AbortController();
    this.repairController = controller;
    let result;
    try {
      // The one extra load: memory replay (no historyPageSize).
      result = await this.api.request("POST", ROUTES.load(this.id), {
        body: {}, clientId: this.clientId, signal: controller.signal,
      });
    } catch (error) {
      if (controller.signal.aborted || this.closed) return;
      this.repairController = null;
      this.repairFailed(episode, error);
      return;
    }
    if (controller.signal.aborted || this.closed) return;
    this.repairController = null;
    const checked = validateFreshSnapshot(decodeEvents(result.compactedReplay),
      decodeEvents(result.liveJournal), result.replayDegraded === true, episode.target.prompt_id);
    if (checked.error !== undefined) {
      this.repairFailed(episode, new Error(checked.message));
      return;
    }
    this.commitRepair(episode, result, checked);
  }

  commitRepair(episode, result, checked) {
    const build = buildRepair(this.store.snapshotState(), episode.checkpoint, checked.events,
      checked.start, (event) => episode.isNew(event.id), this.store.configured_max_blocks);
    episode.finish();
    this.episode = null;
    this.clientId = result.clientId || this.clientId;
    this.cursor = Number.isInteger(result.lastEventId) ? result.lastEventId : this.cursor;
    this.epoch = typeof result.eventEpoch === "string" ? result.eventEpoch : this.epoch;
    for (const event of checked.events) { this.noteTerminal(event); this.trackTurn(event); }
    this.viewer.commitState(build.state, { keepScroll: true });
    this.viewer.perform(build.side_effects);
    this.viewer.stats.repairs += 1;
    this.viewer.lastRepair = { from_checkpoint: build.from_checkpoint, signature: episode.target.signature };
    // A fresh live journal that itself overflowed (another prompt) is the next episode.
    const live = decodeEvents(result.liveJournal);
    const next = findRepairTarget(this.id, live, this.cursor, result.replayDegraded === true);
    if (next !== null && build.checkpoint !== null && next.signature !== episode.target.signature) {
      this.startEpisode(live, result, build.checkpoint);
    }
    this.viewer.turnChanged();
    this.subscribe();
    document.body.dataset.repaired = String(this.viewer.stats.repairs);
  }

  repairFailed(episode, error) {
    episode.finish();
    this.episode = null;
    this.viewer.stats.repairFailures += 1;
    const n = repairNotice(episode.target.signature, String(error && error.message ? error.message : error));
    this.viewer.addNotice(n);
    if (error instanceof HttpError && (isAuthStatus(error.status) || isMissingStatus(error.status))) {
      this.failed(error);
      return;
    }
    this.subscribe();   // resume the previous subscription from its cursor
  }

  // -- history pages --

  async loadMore(force = false) {
    if (this.pageRequests > 0 || this.closed) return;
    const [pagination, request] = loadMoreRequest(this.store.pagination, force);
    if (pagination !== this.store.pagination) this.store.setPagination(pagination);
    if (request === null) return;
    const query = new URLSearchParams({ limit: String(request.limit) });
    if (request.cursor) query.set("cursor", request.cursor);
    else query.set("beforeRecordId", request.beforeRecordId);
    this.pageRequests += 1;
    this.viewer.stats.pageRequests += 1;
    const controller = new AbortController();
    this.pageController = controller;
    try {
      const page = await this.api.request("GET", `${ROUTES.transcript(this.id)}?${query}`, { signal: controller.signal });
      if (this.closed) return;
      const events = (page.events || []).map((e) => normalizePageEvent(e, this.id)).filter((e) => e !== null);
      const outcome = applyHistoryPage(this.store.snapshotState(),
        { events, has_more: page.hasMore === true, next_cursor: page.nextCursor || null },
        this.store.configured_max_blocks);
      if (this.episode !== null && this.episode.checkpoint !== null) {
        this.episode.checkpoint = mirrorPage(this.episode.checkpoint, outcome.page_blocks, outcome.state.pagination);
      }
      this.viewer.commitState(outcome.state, { prepend: true });
    } catch (error) {
      if (this.closed || isAbort(error)) return;
      const status = error instanceof HttpError ? error.status : null;
      if (isTransientPageError(status)) {
        this.viewer.addNotice({ id: HISTORY_FAILED_CODE, message: "Could not load older messages. Try again.",
          debug_message: String(error.message) });
      } else {
        this.store.setPagination({ ...this.store.pagination, pagination_error: String(error.message) });
      }
    } finally {
      this.pageRequests -= 1;
      this.pageController = null;
      this.idlePoint();
    }
  }

  // -- actions --

  // Send a prompt exactly once: one Idempotency-Key for all its sends; a send that failed in a
  // way that may pass is sent again with it (submission.js), for up to RESEND_BUDGET_MS. Throws
  // the refusal when nothing was admitted, PromptOutcomeUnknown when a send may have been.
  async prompt(text, submission = new Submission(text, newIdempotencyKey())) {
    this.sending += 1;
    this.unsent = submission;
    submission.state = submission.attempts ? "resending" : "sending";
    this.viewer.unsentChanged();
    const started = Date.now();
    try {
      let accepted;
      for (;;) {
        try {
          accepted = await this.api.request("POST", ROUTES.prompt(this.id), {
            body: { prompt: [{ type: "text", text: submission.text }] }, clientId: this.clientId,
            headers: { [HEADER_IDEMPOTENCY_KEY]: submission.key },
            // A stalled send is given up (a TimeoutError, so a NetworkError) and resent.
            signal: AbortSignal.timeout(SEND_TIMEOUT_MS),
          });
          if (!accepted || typeof accepted.promptId !== "string") {
            // A 2xx whose body cannot be read (cut short): admitted, most likely; the resend's
            // answer is the readable copy of it.
            throw new NetworkError("the daemon's answer to the prompt could not be read");
          }
          break;
        } catch (error) {
          if (isAbort(error)) throw error;
          const status = error instanceof HttpError ? error.status : null;
          if (status === null && !(error instanceof NetworkError)) throw error;
          const again = submission.failed(status, error);
          const delay = resendDelayMs(submission.attempts);
          if (this.closed || !again || Date.now() - started + delay > RESEND_BUDGET_MS) {
            if (!submission.maybeAdmitted) { this.unsent = null; throw error; }
            submission.state = "unknown";
            throw new PromptOutcomeUnknown(submission);
          }
          submission.state = "resending";
          this.viewer.stats.promptResends += 1;
          this.viewer.unsentChanged();
          await new Promise((resolve) => { setTimeout(resolve, delay); });
        }
      }
      this.unsent = null;
      if (accepted && accepted.promptId && !this.terminals.has(accepted.promptId)) {
        this.localPrompts.add(accepted.promptId);
        // Shown at once: running, or queued behind the turn that runs (the daemon's own
        // pending_prompt_added / the prompt's first event confirm it).
        if (this.running === null) this.running = { promptId: accepted.promptId, since: Date.now() };
        else if (this.running.promptId !== accepted.promptId) this.queued.set(accepted.promptId, text);
        this.viewer.turnChanged();
      }
      return accepted;
    } finally {
      this.sending -= 1;
      this.viewer.unsentChanged();
      this.idlePoint();
    }
  }

  // Send the prompt whose outcome is unknown again, with its key (at most one such send at a
  // time): the daemon answers with the first admission if there was one.
  async resendUnsent() {
    const submission = this.unsent;
    if (submission === null || submission.state !== "unknown" || this.closed) return;
    this.viewer.stats.promptResends += 1;
    try {
      await this.prompt(submission.text, submission);
    } catch (error) {
      if (!(error instanceof PromptOutcomeUnknown)) {
        this.viewer.addNotice({ id: "viewer.prompt.failed", message: `Could not send the prompt: ${error.message}`,
          debug_message: String(error.message) });
      }
    }
  }

  cancel() {
    return this.api.request("POST", ROUTES.cancel(this.id), { clientId: this.clientId });
  }

  vote(requestId, optionId) {
    return this.api.request("POST", ROUTES.permission(this.id, requestId), { body: { optionId } });
  }
}
