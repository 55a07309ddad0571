// The viewer's shell: HTTP and SSE against the daemon that served this page, the session's
// lifecycle (load -> replay -> subscribe -> resume), the live-journal repair episode, history
// paging and the DOM. Every rule about blocks, markers and repair lives in the pure modules
// (transcript.js, history.js, repair.js), which the conformance vectors keep in agreement with
// the Python model.

import { TERMINAL_TYPES, decodeEvents, eventFromMapping, eventPromptId, normalizePageEvent } from "./events.js";
import {
  HISTORY_FAILED_CODE, PAGINATION_CAPABILITY, applyHistoryPage, isTransientPageError,
  loadMoreRequest, replaySnapshot, visibleBlocks,
} from "./history.js";
import {
  RepairEpisode, buildRepair, findRepairTarget, mirrorPage, repairNotice, takeCheckpoint,
  validateFreshSnapshot,
} from "./repair.js";
import { SseParser } from "./sse.js";
import { DEFAULT_MAX_BLOCKS, TranscriptStore } from "./transcript.js";

const TOKEN_KEY = "turnkeeper.viewer.token";
const HISTORY_PAGE_SIZE = 100;
const NOTICE_CAP = 50;
const TOP_THRESHOLD_PX = 40;
const BOTTOM_THRESHOLD_PX = 30;

const $ = (id) => document.getElementById(id);

// --- HTTP -------------------------------------------------------------------------------------------

class HttpError extends Error {
  constructor(status, body) {
    super(`HTTP ${status}: ${body && body.error ? body.error : ""}`);
    this.status = status;
    this.body = body;
  }
}

class Api {
  constructor() {
    this.token = sessionStorage.getItem(TOKEN_KEY);
  }

  setToken(token) {
    this.token = token || null;
    if (this.token) sessionStorage.setItem(TOKEN_KEY, this.token);
    else sessionStorage.removeItem(TOKEN_KEY);
  }

  headers(extra = {}) {
    const headers = { ...extra };
    if (this.token) headers.Authorization = `Bearer ${this.token}`;
    return headers;
  }

  async request(method, path, { body = undefined, clientId = null, signal = undefined } = {}) {
    const extra = {};
    if (body !== undefined) extra["Content-Type"] = "application/json";
    if (clientId) extra["X-Qwen-Client-Id"] = clientId;
    const response = await fetch(path, {
      method, headers: this.headers(extra), signal, cache: "no-store",
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await response.text();
    let parsed = null;
    if (text) {
      try { parsed = JSON.parse(text); } catch { parsed = { error: text }; }
    }
    if (!response.ok) {
      if (response.status === 401) viewer.onUnauthorized();
      throw new HttpError(response.status, parsed);
    }
    return parsed;
  }
}

const isAuthStatus = (s) => s === 401 || s === 403;
const isMissingStatus = (s) => s === 404 || s === 410;
const isAbort = (e) => e && e.name === "AbortError";

// --- one open session ---------------------------------------------------------------------------------

class SessionView {
  constructor(viewer, sessionId) {
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
    this.localPrompts = new Set();   // prompt ids sent here whose terminal has not arrived
    this.sending = 0;                // prompt POSTs in flight
    this.terminals = new Set();      // prompt ids whose terminal was seen
    this.repairController = null;
    this.resyncScheduled = false;
    this.backoff = 0;
    this.pageSize = viewer.pageSize();
  }

  // -- lifecycle --

  async open() {
    await this.load(this.pageSize);
  }

  close() {
    // Navigation: stop the stream, abort a repair or page request, forget the episode.
    this.closed = true;
    this.abortRepair();
    this.stopStream();
    if (this.pageController) this.pageController.abort();
    if (this.clientId) {
      this.api.request("POST", `/session/${this.id}/detach`, { clientId: this.clientId }).catch(() => {});
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
      const result = await this.api.request("POST", `/session/${this.id}/load`, { body, clientId: this.clientId });
      if (this.closed) return;
      this.commitLoad(result);
    } catch (error) {
      if (this.closed || isAbort(error)) return;
      this.connectionFailed(error);
      throw error;
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
    for (const event of [...compacted, ...live]) this.noteTerminal(event);
    this.viewer.commitState(replay.state);
    this.viewer.perform(replay.side_effects);
    if (result.agentSessionRestored === false) {
      // Restored from the transcript on a new agent session: the agent forgot the earlier turns.
      this.viewer.addNotice({ id: AGENT_CONTEXT_LOST_CODE, message: AGENT_CONTEXT_LOST });
    }
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
          if (isAuthStatus(error.status)) { this.viewer.setConnection("auth_failed"); return; }
          if (isMissingStatus(error.status)) { this.viewer.setConnection("missing_session"); return; }
          retryable = !(error.body && error.body.retryable === false);
        }
      }
      if (controller.signal.aborted || this.closed || !retryable) return;
      this.viewer.setConnection("reconnecting");
      this.backoff += 1;
      const delay = Math.min(1000 * 2 ** (this.backoff - 1), 10000) * (0.8 + Math.random() * 0.4);
      await new Promise((resolve) => {
        const timer = setTimeout(resolve, delay);
        controller.signal.addEventListener("abort", () => { clearTimeout(timer); resolve(); }, { once: true });
      });
    }
  }

  async readOnce(controller) {
    const headers = this.api.headers({ Accept: "text/event-stream" });
    if (this.cursor !== null) {
      headers["Last-Event-ID"] = String(this.cursor);
      if (this.epoch !== null) headers["X-Qwen-Event-Epoch"] = this.epoch;
    }
    const response = await fetch(`/session/${this.id}/events`, {
      headers, signal: controller.signal, cache: "no-store",
    });
    if (!response.ok) {
      let body = null;
      try { body = await response.json(); } catch { body = null; }
      throw new HttpError(response.status, body);
    }
    const contentType = response.headers.get("content-type") || "";
    if (!contentType.startsWith("text/event-stream")) throw new Error("not an event stream");
    const epoch = response.headers.get("x-qwen-event-epoch");
    if (epoch) this.epoch = epoch;
    this.viewer.stats.streamsOpened += 1;
    if (this.cursor !== null && this.viewer.stats.streamsOpened > 1) this.viewer.stats.resumes += 1;
    this.viewer.setConnection("connected");
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
        this.onEvent(event);
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
    if (TERMINAL_TYPES.has(event.type)) this.viewer.refreshList().catch(() => {});
    if (event.type === "state_resync_required") {
      // The stream lost continuity: reload the session (a configured load; aborts a repair).
      if (!this.resyncScheduled) {
        this.resyncScheduled = true;
        this.viewer.stats.resyncs += 1;
        queueMicrotask(() => {
          this.load(this.pageSize).catch((error) => {
            this.viewer.addNotice({ id: "daemon.session_reload.failed", message:
              "Could not reload the session after the event stream lost continuity.", debug_message: String(error) });
          }).finally(() => { this.resyncScheduled = false; });
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

  connectionFailed(error) {
    if (error instanceof HttpError && isAuthStatus(error.status)) this.viewer.setConnection("auth_failed");
    else if (error instanceof HttpError && isMissingStatus(error.status)) this.viewer.setConnection("missing_session");
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
      result = await this.api.request("POST", `/session/${this.id}/load`, {
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
    for (const event of checked.events) this.noteTerminal(event);
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
    this.subscribe();
    document.body.dataset.repaired = String(this.viewer.stats.repairs);
  }

  repairFailed(episode, error) {
    episode.finish();
    this.episode = null;
    this.viewer.stats.repairFailures += 1;
    const n = repairNotice(episode.target.signature, String(error && error.message ? error.message : error));
    this.viewer.addNotice(n);
    if (error instanceof HttpError && isAuthStatus(error.status)) { this.viewer.setConnection("auth_failed"); return; }
    if (error instanceof HttpError && isMissingStatus(error.status)) { this.viewer.setConnection("missing_session"); return; }
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
      const page = await this.api.request("GET", `/session/${this.id}/transcript?${query}`, { signal: controller.signal });
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

  async prompt(text) {
    this.sending += 1;
    try {
      const accepted = await this.api.request("POST", `/session/${this.id}/prompt`, {
        body: { prompt: [{ type: "text", text }] }, clientId: this.clientId,
      });
      if (accepted && accepted.promptId && !this.terminals.has(accepted.promptId)) {
        this.localPrompts.add(accepted.promptId);
      }
      return accepted;
    } finally {
      this.sending -= 1;
      this.idlePoint();
    }
  }

  cancel() {
    return this.api.request("POST", `/session/${this.id}/cancel`, { clientId: this.clientId });
  }

  vote(requestId, optionId) {
    return this.api.request("POST", `/session/${this.id}/permission/${encodeURIComponent(requestId)}`,
      { body: { optionId } });
  }
}

// The load answer's agentSessionRestored: false (sdk.protocol.constants.AGENT_CONTEXT_LOST).
const AGENT_CONTEXT_LOST_CODE = "daemon.agent_context_lost";
const AGENT_CONTEXT_LOST = "the agent could not restore its own context; the transcript is intact";

// --- rendering -------------------------------------------------------------------------------------

// Why the daemon answered a permission request by itself (permission_resolved.reason).
const PERMISSION_REASONS = {
  timeout: "timed out: nobody answered in time",
  prompt_cancelled: "the prompt was cancelled",
  turn_ended: "the turn ended first",
  no_running_prompt: "no prompt was running",
  approval_mode: "approved by the daemon's approval mode",
};

const KIND_LABELS = {
  user: "You", assistant: "Agent", thought: "Thought", tool: "Tool", permission: "Permission",
  status: "Status", error: "Error", debug: "Debug", prompt_cancelled: "Cancelled",
};

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "class") node.className = value;
    else if (key.startsWith("data-")) node.setAttribute(key, value);
    else node[key] = value;
  }
  for (const child of children) if (child !== null && child !== undefined) node.append(child);
  return node;
}

function renderBlock(b, view) {
  const classes = [b.kind];
  if (b.streaming) classes.push("streaming");
  if (b.source) classes.push(`source-${b.source}`);
  const li = el("li", { class: classes.join(" "), "data-id": b.id, "data-kind": b.kind });
  if (b.prompt_id) li.dataset.prompt = b.prompt_id;
  li.append(el("span", { class: "kind" }, KIND_LABELS[b.kind] || b.kind));
  if (b.kind === "tool") {
    li.dataset.status = b.status;
    li.append(el("span", { class: "title" }, b.title || b.tool_call_id), " ",
      el("span", { class: "status" }, `[${b.status}]`));
  } else if (b.kind === "permission") {
    const title = b.tool_call && typeof b.tool_call.title === "string" ? b.tool_call.title : "A tool";
    li.dataset.resolved = String(b.resolved);
    li.append(el("span", { class: "text" }, `${title} asks for permission.`));
    if (b.resolved) {
      const outcome = b.outcome && b.outcome.optionId ? b.outcome.optionId : (b.outcome && b.outcome.outcome) || "resolved";
      const why = b.reason ? ` (${PERMISSION_REASONS[b.reason] || b.reason})` : "";
      li.append(el("div", { class: "outcome" }, `Answered: ${outcome}${why}`));
    } else {
      const row = el("div", { class: "options" });
      for (const option of b.options) {
        if (!option || typeof option.optionId !== "string") continue;
        const button = el("button", { type: "button", "data-option": option.optionId },
          option.name || option.optionId);
        button.addEventListener("click", () => {
          for (const other of row.querySelectorAll("button")) other.disabled = true;
          view.vote(b.request_id, option.optionId).catch((error) => {
            viewer.addNotice({ id: "daemon.permission_vote.failed", message: "Could not send the vote.",
              debug_message: String(error.message) });
            for (const other of row.querySelectorAll("button")) other.disabled = false;
          });
        });
        row.append(button);
      }
      li.append(row);
    }
  } else {
    li.append(el("span", { class: "text" }, b.text));
  }
  return li;
}

// --- the viewer ---------------------------------------------------------------------------------------

class Viewer {
  constructor() {
    this.api = new Api();
    this.store = new TranscriptStore(DEFAULT_MAX_BLOCKS);
    this.view = null;
    this.navigating = false;
    this.paginationEnabled = false;
    this.attempted = new Set();   // repair signatures already attempted (at most once each)
    this.notices = [];
    this.rendered = new Map();    // block id -> {block, node}
    this.renderedIds = [];
    this.pendingRender = null;
    this.lastRepair = null;
    this.stats = {
      loads: 0, repairAttempts: 0, repairs: 0, repairFailures: 0, repairsAborted: 0, episodes: 0,
      streamsOpened: 0, resumes: 0, eventsReceived: 0, duplicatesDropped: 0, pageRequests: 0,
      resyncs: 0, renders: 0,
    };
    this.store.subscribe(() => this.scheduleRender());
  }

  async start() {
    if (!this.bound) { this.bindUi(); this.bound = true; }
    try {
      const caps = await this.api.request("GET", "/capabilities");
      this.paginationEnabled = Array.isArray(caps.features) && caps.features.includes(PAGINATION_CAPABILITY);
    } catch (error) {
      if (error instanceof HttpError && error.status === 401) return;   // the token dialog is open
      throw error;
    }
    await this.refreshList();
    await this.openFromHash();
    document.body.dataset.ready = "true";
  }

  bindUi() {
    $("refresh").addEventListener("click", () => this.refreshList());
    $("new-session").addEventListener("click", () => this.newSession());
    $("load-older").addEventListener("click", () => this.view && this.view.loadMore(true));
    // Scrolling up to the top loads the next older page (a wheel counts too: a short
    // transcript that does not scroll yet still asks for more when the user scrolls up).
    $("transcript").addEventListener("scroll", () => {
      if ($("transcript").scrollTop < TOP_THRESHOLD_PX && this.view) this.view.loadMore();
    });
    $("transcript").addEventListener("wheel", (e) => {
      if (e.deltaY < 0 && $("transcript").scrollTop < TOP_THRESHOLD_PX && this.view) this.view.loadMore();
    }, { passive: true });
    $("prompt-form").addEventListener("submit", (e) => { e.preventDefault(); this.sendPrompt(); });
    $("prompt-input").addEventListener("keydown", (e) => {
      if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) { e.preventDefault(); this.sendPrompt(); }
    });
    $("cancel").addEventListener("click", () => this.view && this.view.cancel().catch(() => {}));
    $("token-form").addEventListener("submit", (e) => {
      e.preventDefault();
      this.api.setToken($("token-input").value.trim());
      $("token-input").value = "";
      $("token-dialog").close();
      this.start().catch(() => {});
    });
    window.addEventListener("hashchange", () => this.openFromHash());
  }

  onUnauthorized() {
    const hadToken = Boolean(this.api.token);
    this.api.setToken(null);
    $("token-error").hidden = !hadToken;
    this.setConnection("auth_failed");
    if (!$("token-dialog").open) $("token-dialog").showModal();
  }

  async refreshList() {
    const status = await this.api.request("GET", "/daemon/status");
    const sessions = Array.isArray(status.sessions) ? status.sessions : [];
    const workspaces = new Map();
    for (const agent of status.agents || []) workspaces.set(agent.workspaceCwd, 0);
    for (const s of sessions) workspaces.set(s.workspaceCwd, (workspaces.get(s.workspaceCwd) || 0) + 1);
    $("workspaces").replaceChildren(...[...workspaces].map(([cwd, count]) =>
      el("li", { title: cwd }, `${cwd} (${count})`)));
    $("sessions").replaceChildren(...sessions.map((s) => {
      const li = el("li", { title: `${s.sessionId}\n${s.workspaceCwd}`, "data-session": s.sessionId },
        s.sessionId.slice(0, 8), " ", el("span", { class: "cwd" }, s.workspaceCwd.split("/").pop() || "/"),
        s.hasActivePrompt ? el("span", { class: "busy" }, " ● running") : null);
      if (this.view && this.view.id === s.sessionId) li.classList.add("current");
      li.addEventListener("click", () => { location.hash = `session=${s.sessionId}`; });
      return li;
    }));
  }

  async newSession() {
    const created = await this.api.request("POST", "/session", { body: { sessionScope: "thread" } });
    await this.refreshList();
    location.hash = `session=${created.sessionId}`;
  }

  // History page size: 100, or the hash's page=N (1..500), e.g. #session=<id>&page=20.
  pageSize() {
    const match = /(?:^#|&)page=([0-9]{1,3})(?:&|$)/.exec(location.hash);
    const size = match ? Number(match[1]) : HISTORY_PAGE_SIZE;
    return size >= 1 && size <= 500 ? size : HISTORY_PAGE_SIZE;
  }

  async openFromHash() {
    const match = /session=([A-Za-z0-9-]+)/.exec(location.hash);
    if (match && (!this.view || this.view.id !== match[1])) await this.open(match[1]);
  }

  async open(sessionId) {
    // Navigation: the current session (its stream, repair and page requests) goes first.
    this.navigating = true;
    try {
      if (this.view) this.view.close();
      this.view = null;
      this.rendered.clear();
      this.renderedIds = [];
      $("blocks").replaceChildren();
      this.notices = [];
      this.renderNotices();
      this.store.clear();
      const view = new SessionView(this, sessionId);
      this.view = view;
      $("session-title").textContent = sessionId;
      for (const li of $("sessions").children) li.classList.toggle("current", li.dataset.session === sessionId);
      this.navigating = false;
      await view.open();
      this.scrollToBottom();
    } finally {
      this.navigating = false;
    }
  }

  async sendPrompt() {
    const input = $("prompt-input");
    const text = input.value.trim();
    if (!text || !this.view) return;
    input.value = "";
    try {
      await this.view.prompt(text);
    } catch (error) {
      input.value = text;
      this.addNotice({ id: "daemon.prompt.failed", message: "Could not send the prompt.", debug_message: String(error.message) });
    }
  }

  setConnection(state) {
    $("connection").dataset.state = state;
    $("connection").textContent = state.replace("_", " ");
  }

  perform(effects) {
    for (const effect of effects) if (effect.kind === "Notice") this.addNotice(effect);
  }

  addNotice(notice) {
    this.notices = this.notices.filter((n) => n.id !== notice.id);
    this.notices.push(notice);
    if (this.notices.length > NOTICE_CAP) this.notices = this.notices.slice(-NOTICE_CAP);
    this.renderNotices();
  }

  renderNotices() {
    $("notices").replaceChildren(...this.notices.map((n) =>
      el("li", { "data-notice": n.id, title: n.debug_message || "" }, n.message)));
  }

  // -- committing and rendering --

  commitState(state, { keepScroll = false, prepend = false } = {}) {
    const box = $("transcript");
    const anchor = keepScroll ? this.scrollAnchor() : null;
    const height = box.scrollHeight;
    const top = box.scrollTop;
    this.store.reset(state);
    this.render();
    if (anchor !== null) this.restoreAnchor(anchor);
    else if (prepend) box.scrollTop = top + (box.scrollHeight - height);
  }

  scrollAnchor() {
    // The first block whose bottom is below the top edge, and its offset from that edge; or
    // "bottom" when the view was following the end.
    const box = $("transcript");
    if (box.scrollHeight - box.clientHeight - box.scrollTop <= BOTTOM_THRESHOLD_PX) return { bottom: true };
    const edge = box.getBoundingClientRect().top;
    for (const node of $("blocks").children) {
      const rect = node.getBoundingClientRect();
      if (rect.bottom > edge) return { bottom: false, id: node.dataset.id, offset: rect.top - edge };
    }
    return { bottom: true };
  }

  restoreAnchor(anchor) {
    const box = $("transcript");
    if (anchor.bottom) { this.scrollToBottom(); return; }
    const entry = this.rendered.get(anchor.id);
    if (!entry) return;
    const edge = box.getBoundingClientRect().top;
    box.scrollTop += entry.node.getBoundingClientRect().top - edge - anchor.offset;
  }

  scrollToBottom() {
    const box = $("transcript");
    box.scrollTop = box.scrollHeight;
  }

  scheduleRender() {
    if (this.pendingRender === null) this.pendingRender = setTimeout(() => this.render(), 0);
  }

  render() {
    if (this.pendingRender !== null) { clearTimeout(this.pendingRender); this.pendingRender = null; }
    this.stats.renders += 1;
    const box = $("transcript");
    const following = box.scrollHeight - box.clientHeight - box.scrollTop <= BOTTOM_THRESHOLD_PX;
    const blocks = visibleBlocks(this.store.blocks, this.store.pagination);
    const ids = blocks.map((b) => b.id);
    const next = new Map();
    const nodes = [];
    let changed = false;
    for (const b of blocks) {
      const cached = this.rendered.get(b.id);
      let node;
      if (cached && cached.block === b) node = cached.node;
      else {
        node = renderBlock(b, this.view);
        if (cached) cached.node.replaceWith(node);
        changed = true;
      }
      next.set(b.id, { block: b, node });
      nodes.push(node);
    }
    const sameOrder = ids.length === this.renderedIds.length && ids.every((id, i) => id === this.renderedIds[i]);
    if (!sameOrder) $("blocks").replaceChildren(...nodes);
    this.rendered = next;
    this.renderedIds = ids;
    const p = this.store.pagination;
    $("load-older").hidden = !(p.has_more || p.pagination_error !== null);
    $("empty").hidden = this.view !== null;
    if (following && (changed || !sameOrder)) this.scrollToBottom();
  }
}

const viewer = new Viewer();
// For tests and the curious: counters and the current state (no secrets: the token is not here).
window.turnkeeperViewer = viewer;
viewer.start().catch((error) => {
  viewer.addNotice({ id: "viewer.start.failed", message: "The viewer could not start.", debug_message: String(error.message) });
});
