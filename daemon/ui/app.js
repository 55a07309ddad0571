// The viewer: wires the page together. The session list (sidebar.js), the open session
// (session_view.js), the transcript's rendering (render.js), the prompt box (composer.js), the
// connection pill (connection.js); the token dialog, notices, the theme and the phone-width
// layout live here. Everything it shows comes from the daemon that served the page.

import { Api, HttpError, NetworkError } from "./api.js";
import { Composer } from "./composer.js";
import { ConnectionPill } from "./connection.js";
import { $, basename, el } from "./dom.js";
import { icon } from "./icons.js";
import { PAGINATION_CAPABILITY } from "./protocol.js";
import { FindBar } from "./find.js";
import { visibleBlocks } from "./replay.js";
import { PromptOutcomeUnknown, SessionView } from "./session_view.js";
import { Sidebar, clipTitle, sessionTitle } from "./sidebar.js";
import { DEFAULT_MAX_BLOCKS, TranscriptStore } from "./store.js";
import { TranscriptWindow } from "./transcript_window.js";

const HISTORY_PAGE_SIZE = 100;
const NOTICE_CAP = 50;
const TOP_THRESHOLD_PX = 40;
const BOTTOM_THRESHOLD_PX = 30;
const THEME_KEY = "turnkeeper.viewer.theme";
const CLOSE_TITLE = "Close this session: the agent's session ends and it cannot be reopened";
const NARROW = window.matchMedia("(max-width: 760px)");

class Viewer {
  constructor() {
    this.api = new Api({ onUnauthorized: () => this.onUnauthorized() });
    this.store = new TranscriptStore(DEFAULT_MAX_BLOCKS);
    this.view = null;
    this.navigating = false;
    this.paginationEnabled = false;
    this.attempted = new Set();   // repair signatures already attempted (at most once each)
    this.notices = [];
    this.pendingRender = null;
    this.lastRepair = null;
    this.started = false;
    this.following = true;   // the transcript is scrolled to its end (and stays there)
    this.stats = {
      loads: 0, repairAttempts: 0, repairs: 0, repairFailures: 0, repairsAborted: 0, episodes: 0,
      streamsOpened: 0, resumes: 0, eventsReceived: 0, duplicatesDropped: 0, pageRequests: 0,
      resyncs: 0, renders: 0, restores: 0, promptResends: 0,
    };
    this.pill = new ConnectionPill($("connection"));
    this.sidebar = new Sidebar(this, $("sidebar"));
    this.composer = new Composer(this);
    this.actions = {
      vote: (requestId, optionId) => this.vote(requestId, optionId),
    };
    // The blocks near the viewport, as DOM (the rest are placeholders of their height).
    this.transcript = new TranscriptWindow($("blocks"), $("transcript"), this.actions);
    // A live chunk was measured (first shown, or its blocks grew): the spacers take the new
    // height, the view stays at the end if it follows it, and the window is looked at again in
    // the next frame (not in this observation: that would resize what is being observed).
    this.transcript.onMeasured = () => {
      this.transcript.spacers();
      if (this.following) this.scrollToBottom();
      this.updateWindowNextFrame();
    };
    this.windowFrame = null;
    this.find = new FindBar(this);
    this.store.subscribe(() => this.scheduleRender());
    this.bindUi();
    this.applyTheme(localStorage.getItem(THEME_KEY) || "dark");
  }

  // -- start and auth --

  async start() {
    this.setConnection("connecting");
    try {
      const caps = await this.api.capabilities();
      this.paginationEnabled = Array.isArray(caps.features) && caps.features.includes(PAGINATION_CAPABILITY);
    } catch (error) {
      if (error instanceof HttpError && error.status === 401) return;   // the token dialog is open
      this.setConnection("error", { message: error.message });
      this.addNotice({ id: "viewer.start.failed", message: error instanceof NetworkError
        ? "Cannot reach the daemon. Start it (make serve) and reload this page."
        : `The daemon answered with an error: ${error.message}` });
      return;
    }
    this.started = true;
    this.setConnection("idle");
    await this.sidebar.start().catch(() => {});
    await this.openFromHash();
    document.body.dataset.ready = "true";
  }

  onUnauthorized() {
    const hadToken = Boolean(this.api.token);
    this.api.setToken(null);
    $("token-error").hidden = !hadToken;
    this.setConnection("auth_needed");
    if (!$("token-dialog").open) $("token-dialog").showModal();
    $("token-input").focus();
  }

  bindUi() {
    for (const slot of document.querySelectorAll("[data-icon]")) {
      slot.replaceWith(icon(slot.dataset.icon, { size: slot.classList.contains("panel-icon") ? 28 : 16 }));
    }
    $("sidebar-close").addEventListener("click", () => this.toggleSidebar(false));
    $("new-session").addEventListener("click", () => this.newSession());
    $("refresh").addEventListener("click", () => this.sidebar.refresh().catch(() => {}));
    $("theme").addEventListener("click", () => this.applyTheme(
      document.documentElement.dataset.theme === "dark" ? "light" : "dark", true));
    $("menu").addEventListener("click", () => this.toggleSidebar());
    $("scrim").addEventListener("click", () => this.toggleSidebar(false));
    $("load-older").addEventListener("click", () => this.view && this.view.loadMore(true));
    $("close-session").addEventListener("click", () => this.closeSession());
    $("missing-back").addEventListener("click", () => this.backToList());
    $("missing-new").addEventListener("click", () => this.newSession());
    // Scrolling up to the top loads the next older page (a wheel counts too: a short
    // transcript that does not scroll yet still asks for more when the user scrolls up).
    const box = $("transcript");
    box.addEventListener("scroll", () => {
      this.following = box.scrollHeight - box.clientHeight - box.scrollTop <= BOTTOM_THRESHOLD_PX;
      if (box.scrollTop < TOP_THRESHOLD_PX && this.view) this.view.loadMore();
      this.updateWindow();
    }, { passive: true });
    // While the view follows the end, it stays at the end as blocks grow (streaming text, and
    // chunks measured when they are first shown); a taller or shorter viewport shows more or
    // fewer chunks.
    new ResizeObserver(() => {
      if (this.following) this.scrollToBottom();
      this.updateWindow();
    }).observe(box);
    box.addEventListener("wheel", (e) => {
      if (e.deltaY < 0 && box.scrollTop < TOP_THRESHOLD_PX && this.view) this.view.loadMore();
    }, { passive: true });
    $("token-form").addEventListener("submit", (e) => {
      e.preventDefault();
      this.api.setToken($("token-input").value.trim());
      $("token-input").value = "";
      $("token-dialog").close();
      this.start().catch(() => {});
    });
    window.addEventListener("hashchange", () => { this.openFromHash().catch(() => {}); });
    NARROW.addEventListener("change", () => this.toggleSidebar(false));
    document.addEventListener("keydown", (e) => {
      if (e.key === "Escape" && document.body.classList.contains("sidebar-open")) this.toggleSidebar(false);
      this.find.onKeydown(e);
    });
  }

  applyTheme(theme, save = false) {
    const next = theme === "light" ? "light" : "dark";
    document.documentElement.dataset.theme = next;
    const button = $("theme");
    button.replaceChildren(icon(next === "dark" ? "sun" : "moon"));
    button.title = next === "dark" ? "Switch to the light theme" : "Switch to the dark theme";
    button.setAttribute("aria-label", button.title);
    if (save) localStorage.setItem(THEME_KEY, next);
  }

  toggleSidebar(open = undefined) {
    const want = open === undefined ? !document.body.classList.contains("sidebar-open") : open;
    document.body.classList.toggle("sidebar-open", want && NARROW.matches);
    $("menu").setAttribute("aria-expanded", String(want && NARROW.matches));
  }

  defaultWorkspace() {
    return this.sidebar.defaultWorkspace || null;
  }

  // -- navigation --

  // History page size: 100, or the hash's page=N (1..500), e.g. #session=<id>&page=20.
  pageSize() {
    const match = /(?:^#|&)page=([0-9]{1,3})(?:&|$)/.exec(location.hash);
    const size = match ? Number(match[1]) : HISTORY_PAGE_SIZE;
    return size >= 1 && size <= 500 ? size : HISTORY_PAGE_SIZE;
  }

  navigate(sessionId) {
    this.toggleSidebar(false);
    if (this.view && this.view.id === sessionId && !this.view.missing) return;
    location.hash = `session=${sessionId}`;
  }

  async openFromHash() {
    if (!this.started) return;
    const match = /session=([^&]+)/.exec(location.hash);
    const id = match ? decodeURIComponent(match[1]) : null;
    if (id === null) {
      if (this.view !== null) this.showWelcome();
      return;
    }
    if (!this.view || this.view.id !== id) await this.open(id);
  }

  clearView() {
    this.disarmClose();
    if (this.view) this.view.close();
    this.view = null;
    this.transcript.clear();
    this.find.close();
    this.notices = [];
    this.renderNotices();
    this.store.clear();
  }

  showWelcome() {
    this.navigating = true;
    try {
      this.clearView();
    } finally {
      this.navigating = false;
    }
    this.setConnection("idle");
    this.composer.switchTo(null);
    this.paintFrame();
  }

  async open(sessionId) {
    // Navigation: the current session (its stream, repair and page requests) goes first.
    this.navigating = true;
    try {
      this.clearView();
      const view = new SessionView(this, sessionId, this.pageSize());
      this.view = view;
      this.following = true;
      this.sidebar.known.note(sessionId, { seenAt: Date.now() });
      this.composer.switchTo(sessionId);
      this.paintFrame();
      this.navigating = false;
      await view.open();
      if (this.view === view && !view.missing) {
        this.sidebar.known.note(sessionId, { cwd: view.workspace });
        this.scrollToBottom();
      }
      this.paintFrame();
    } finally {
      this.navigating = false;
    }
  }

  backToList() {
    history.replaceState(null, "", location.pathname + location.search);
    this.showWelcome();
    if (NARROW.matches) this.toggleSidebar(true);
  }

  // The frame around the transcript: title, chips, welcome or missing panel, controls.
  paintFrame() {
    const view = this.view;
    const main = $("main");
    main.dataset.mode = view === null ? "welcome" : view.missing ? "missing" : "session";
    $("welcome").hidden = view !== null;
    $("missing").hidden = !(view !== null && view.missing);
    $("transcript").hidden = view === null || view.missing;
    $("close-session").hidden = view === null || view.missing;
    $("find-open").hidden = view === null || view.missing;
    if (view === null || view.missing) this.find.close();
    const known = view ? this.sidebar.known.get(view.id) : null;
    $("session-title").textContent = view === null ? "New session" : sessionTitle(known, view.id);
    $("session-id").textContent = view === null ? "" : view.id;
    $("session-id").title = view === null ? "" : `session ${view.id}`;
    if (view !== null && view.missing) $("missing-id").textContent = view.id;
    const live = view ? this.sidebar.liveById(view.id) : null;
    const workspace = view ? (view.workspace || (live && live.workspaceCwd)) : this.defaultWorkspace();
    const branchOf = live || this.sidebar.live.find((s) => s.workspaceCwd === workspace) || null;
    const branch = branchOf ? branchOf.gitBranch
      : workspace === this.defaultWorkspace() ? this.sidebar.defaultBranch : null;
    this.composer.showChips({ workspace, branch, approvalMode: this.sidebar.approvalMode });
    const home = this.defaultWorkspace();
    $("welcome-workspace").textContent = home ? basename(home) : "the daemon's workspace";
    $("welcome-workspace").title = home || "";
    for (const li of document.querySelectorAll("#session-groups li[data-session]")) {
      li.classList.toggle("current", view !== null && li.dataset.session === view.id);
    }
    this.composer.showTurn();
  }

  listChanged() {
    this.paintFrame();
  }

  turnChanged() {
    this.composer.showTurn();
    this.sidebar.refresh().catch(() => {});
  }

  sessionMissing(view) {
    if (view !== this.view) return;
    this.setConnection("missing");
    this.sidebar.known.forget(view.id);
    this.sidebar.render();
    this.paintFrame();
  }

  // -- actions --

  async newSession() {
    try {
      const created = await this.api.createSession(this.defaultWorkspace());
      this.sidebar.known.note(created.sessionId, { cwd: created.workspaceCwd, seenAt: Date.now() });
      await this.sidebar.refresh().catch(() => {});
      this.navigate(created.sessionId);
      return created.sessionId;
    } catch (error) {
      this.addNotice({ id: "viewer.create.failed", message: `Could not start a session: ${error.message}` });
      return null;
    }
  }

  // Send a prompt; with no session open, start one first. False when it could not be sent
  // (a notice says why; the composer puts the text back).
  async sendPrompt(text) {
    let view = this.view;
    if (view === null) {
      const id = await this.newSession();
      if (id === null) return false;
      location.hash = `session=${id}`;
      await this.openFromHash();
      view = this.view;
      if (view === null || view.id !== id) return false;
    }
    if (!this.sidebar.known.get(view.id) || !this.sidebar.known.get(view.id).title) {
      this.sidebar.known.note(view.id, { title: clipTitle(text) });
      this.paintFrame();
    }
    try {
      await view.prompt(text);
      return true;
    } catch (error) {
      // Kept by the view with its key and shown above the box; resent when the connection
      // is back. Not put back in the box: sent from there it would get a new key.
      if (error instanceof PromptOutcomeUnknown) return true;
      this.addNotice({ id: "viewer.prompt.failed", message: `Could not send the prompt: ${error.message}`,
        debug_message: String(error.message) });
      return false;
    }
  }

  async stop() {
    const view = this.view;
    if (view === null || view.running === null) return;
    $("stop").disabled = true;
    try {
      await view.cancel();
    } catch (error) {
      this.addNotice({ id: "viewer.cancel.failed", message: `Could not stop the turn: ${error.message}` });
    } finally {
      $("stop").disabled = false;
    }
  }

  async vote(requestId, optionId) {
    const view = this.view;
    if (view === null) return;
    try {
      await view.vote(requestId, optionId);
    } catch (error) {
      this.addNotice({ id: "daemon.permission_vote.failed", message: `Could not send the answer: ${error.message}`,
        debug_message: String(error.message) });
      throw error;
    }
  }

  // Closing ends the session for good (the daemon never restores a closed session), so the
  // button asks once more: the first click arms it for a few seconds, the second closes.
  async closeSession() {
    const view = this.view;
    const button = $("close-session");
    if (view === null) return;
    if (button.dataset.confirm !== "armed") {
      button.dataset.confirm = "armed";
      button.replaceChildren(icon("archive"), el("span", {}, "Close for good?"));
      button.title = "Click again to end this session; it cannot be reopened";
      clearTimeout(this.closeTimer);
      this.closeTimer = setTimeout(() => this.disarmClose(), 4000);
      return;
    }
    this.disarmClose();
    try {
      await this.api.closeSession(view.id);
    } catch (error) {
      if (!(error instanceof HttpError && error.status === 404)) {
        this.addNotice({ id: "viewer.close.failed", message: `Could not close the session: ${error.message}` });
        return;
      }
    }
    this.sidebar.known.closedForGood(view.id);
    await this.sidebar.refresh().catch(() => {});
    this.backToList();
  }

  disarmClose() {
    const button = $("close-session");
    clearTimeout(this.closeTimer);
    delete button.dataset.confirm;
    button.replaceChildren(icon("archive"));
    button.title = CLOSE_TITLE;
  }

  // -- state shown --

  unsentChanged() {
    this.composer.showUnsent();
  }

  setConnection(state, detail = {}) {
    this.pill.show(state, detail);
    this.composer.update();
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

  unexpected(error) {
    const text = error && error.stack ? error.stack : String(error && error.message ? error.message : error);
    this.addNotice({ id: "viewer.unexpected", message: "Something went wrong in the viewer.",
      severity: "error", debug_message: text });
  }

  dismissNotice(id) {
    this.notices = this.notices.filter((n) => n.id !== id);
    this.renderNotices();
  }

  renderNotices() {
    $("notices").replaceChildren(...this.notices.map((n) => {
      const dismiss = el("button", { type: "button", class: "btn btn-ghost btn-xs", title: "Dismiss" }, icon("close", { size: 14 }));
      dismiss.addEventListener("click", () => this.dismissNotice(n.id));
      return el("li", { "data-notice": n.id, title: n.debug_message || "" },
        icon(n.severity === "error" ? "alert" : "info", { size: 16 }), el("span", { class: "text" }, n.message), dismiss);
    }));
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
    this.maybeTitle();
  }

  // The first prompt names the session in the list (this browser only).
  maybeTitle() {
    const view = this.view;
    if (view === null) return;
    const known = this.sidebar.known.get(view.id);
    if (known && known.title) return;
    const first = this.store.blocks.find((b) => b.kind === "user" && b.text);
    if (first) {
      this.sidebar.known.note(view.id, { title: clipTitle(first.text) });
      this.sidebar.render();
      $("session-title").textContent = sessionTitle(this.sidebar.known.get(view.id), view.id);
    }
  }

  scrollAnchor() {
    // The first block whose bottom is below the top edge, and its offset from that edge; or
    // "bottom" when the view was following the end. The blocks in view are live.
    const box = $("transcript");
    if (box.scrollHeight - box.clientHeight - box.scrollTop <= BOTTOM_THRESHOLD_PX) return { bottom: true };
    const edge = box.getBoundingClientRect().top;
    for (const [b, node] of this.transcript.liveNodes()) {
      const rect = node.getBoundingClientRect();
      if (rect.bottom > edge) return { bottom: false, id: b.id, offset: rect.top - edge };
    }
    return { bottom: true };
  }

  restoreAnchor(anchor) {
    const box = $("transcript");
    if (anchor.bottom) { this.scrollToBottom(); return; }
    const index = this.transcript.blocks.findIndex((b) => b.id === anchor.id);
    if (index < 0) return;
    const node = this.transcript.nodeAt(index);
    const edge = box.getBoundingClientRect().top;
    box.scrollTop += node.getBoundingClientRect().top - edge - anchor.offset;
    this.updateWindow();
  }

  // The chunks in view made live now; the next one in the margin too, and the one after it
  // in the next frame (one a frame), until the margin is full.
  updateWindow() {
    if (this.windowFrame !== null) { cancelAnimationFrame(this.windowFrame); this.windowFrame = null; }
    if (this.transcript.update()) this.updateWindowNextFrame();
  }

  updateWindowNextFrame() {
    if (this.windowFrame === null) {
      this.windowFrame = requestAnimationFrame(() => { this.windowFrame = null; this.updateWindow(); });
    }
  }

  // Bring the block at this index into view (find): its chunk is made live first.
  reveal(index) {
    const node = this.transcript.nodeAt(index);
    if (node === null) return;
    this.following = false;
    node.scrollIntoView({ block: "center" });
    this.updateWindow();
    this.transcript.mark(this.transcript.blocks[index].id);
  }

  scrollToBottom() {
    const box = $("transcript");
    box.scrollTop = box.scrollHeight;
    this.following = true;
  }

  scheduleRender() {
    if (this.pendingRender === null) this.pendingRender = setTimeout(() => this.render(), 0);
  }

  // The store's blocks into the transcript window (transcript_window.js: only changed blocks are
  // rebuilt, and only the blocks near the viewport have nodes).
  render() {
    if (this.pendingRender !== null) { clearTimeout(this.pendingRender); this.pendingRender = null; }
    this.stats.renders += 1;
    const following = this.following;
    const blocks = visibleBlocks(this.store.blocks, this.store.pagination);
    const changed = this.transcript.show(blocks);
    const p = this.store.pagination;
    $("load-older").hidden = !(p.has_more || p.pagination_error !== null);
    $("empty-session").hidden = !(this.view !== null && !this.view.missing && blocks.length === 0);
    if (following && changed) this.scrollToBottom();
    if (changed) this.updateWindow();
    this.find.refresh();
  }
}

const viewer = new Viewer();
// For tests and the curious: counters and the current state (no secrets: the token is not here).
window.turnkeeperViewer = viewer;
// Nothing should reach these; if something does, say so instead of failing silently.
window.addEventListener("unhandledrejection", (event) => viewer.unexpected(event.reason));
window.addEventListener("error", (event) => viewer.unexpected(event.error || event.message));
viewer.start().catch((error) => {
  viewer.addNotice({ id: "viewer.start.failed", message: "The viewer could not start.", debug_message: String(error.message) });
});
