// The session list: live sessions grouped by workspace, a search box, and an "Archived" group
// of the sessions the daemon does not hold in memory now (unloaded when idle, or from before a
// restart: the daemon lists them, and this browser remembers those it has seen): opening one
// restores it from the transcript. A closed session is gone for good and leaves the list. It refreshes itself: on a timer while
// the tab is visible, and at once after anything that changes the list.

import { ago, basename, el } from "./dom.js";
import { icon } from "./icons.js";

export const POLL_MS = 2000;
const KNOWN_KEY = "turnkeeper.viewer.sessions";
const KNOWN_CAP = 200;
const TITLE_CHARS = 80;

// Sessions this browser has opened or seen, with a title (the first prompt, once known).
export class KnownSessions {
  constructor(storage = localStorage) {
    this.storage = storage;
    this.items = new Map();
    // Closed here: the daemon never brings a closed session back, so a list answer that was
    // already on its way when it closed must not note it again (it would land in "Archived").
    this.closed = new Set();
    try {
      const saved = JSON.parse(storage.getItem(KNOWN_KEY) || "[]");
      for (const item of Array.isArray(saved) ? saved : []) {
        if (item && typeof item.id === "string") this.items.set(item.id, item);
      }
    } catch {
      this.items.clear();
    }
  }

  note(id, fields) {
    if (this.closed.has(id)) return null;
    const old = this.items.get(id) || { id, title: null, cwd: null, seenAt: 0 };
    const next = { ...old, ...Object.fromEntries(Object.entries(fields).filter(([, v]) => v !== null && v !== undefined)) };
    const changed = JSON.stringify(old) !== JSON.stringify(next);
    this.items.set(id, next);
    if (changed) this.save();
    return next;
  }

  forget(id) {
    if (this.items.delete(id)) this.save();
  }

  closedForGood(id) {
    this.closed.add(id);
    this.forget(id);
  }

  get(id) {
    return this.items.get(id) || null;
  }

  save() {
    const newest = [...this.items.values()].sort((a, b) => (b.seenAt || 0) - (a.seenAt || 0))
      .slice(0, KNOWN_CAP);
    this.items = new Map(newest.map((item) => [item.id, item]));
    try {
      this.storage.setItem(KNOWN_KEY, JSON.stringify(newest));
    } catch {
      // Storage full or disabled: the list still works for this page's life.
    }
  }
}

export function sessionTitle(known, id) {
  const title = known && known.title;
  return title ? title : `Session ${id.slice(0, 8)}`;
}

export function clipTitle(text) {
  const line = String(text).replace(/\s+/g, " ").trim();
  return line.length > TITLE_CHARS ? `${line.slice(0, TITLE_CHARS - 1)}…` : line;
}

export class Sidebar {
  constructor(viewer, root) {
    this.viewer = viewer;
    this.root = root;
    this.known = new KnownSessions();
    this.live = [];
    this.unloaded = []; // listed by the daemon, not in its memory now
    this.approvalMode = null;
    this.query = "";
    this.archivedOpen = false;
    this.timer = null;
    this.inFlight = null;
    this.lastError = null;
    this.groups = root.querySelector("#session-groups");
    this.search = root.querySelector("#session-search");
    this.search.addEventListener("input", () => {
      this.query = this.search.value.trim().toLowerCase();
      this.render();
    });
    document.addEventListener("visibilitychange", () => {
      if (document.visibilityState === "visible") this.refresh().catch(() => {});
    });
  }

  start() {
    if (this.timer === null) {
      this.timer = setInterval(() => {
        if (document.visibilityState === "visible") this.refresh().catch(() => {});
      }, POLL_MS);
    }
    return this.refresh();
  }

  // One refresh at a time; a call during one waits for it and then refreshes again once.
  async refresh() {
    if (this.inFlight !== null) {
      this.again = true;
      return this.inFlight;
    }
    this.inFlight = (async () => {
      try {
        do {
          this.again = false;
          const listed = await this.viewer.api.listSessions();
          this.live = listed.sessions.filter((s) => s.state !== "unloaded");
          this.unloaded = listed.sessions.filter((s) => s.state === "unloaded");
          this.approvalMode = listed.approvalMode;
          this.defaultWorkspace = listed.defaultWorkspace;
          this.defaultBranch = listed.defaultBranch;
          const now = Date.now();
          for (const s of this.live) {
            this.known.note(s.sessionId, { cwd: s.workspaceCwd, seenAt: now });
          }
          this.lastError = null;
          this.render();
          this.viewer.listChanged();
        } while (this.again);
      } catch (error) {
        this.lastError = error;
        throw error;
      } finally {
        this.inFlight = null;
      }
    })();
    return this.inFlight;
  }

  liveById(id) {
    return this.live.find((s) => s.sessionId === id) || null;
  }

  matches(id, cwd, extra = "") {
    if (!this.query) return true;
    const known = this.known.get(id);
    const hay = `${id} ${cwd || ""} ${known && known.title ? known.title : ""} ${extra}`.toLowerCase();
    return hay.includes(this.query);
  }

  render() {
    const current = this.viewer.view ? this.viewer.view.id : null;
    const byWorkspace = new Map();
    const liveIds = new Set();
    for (const s of this.live) {
      liveIds.add(s.sessionId);
      if (!byWorkspace.has(s.workspaceCwd)) byWorkspace.set(s.workspaceCwd, []);
      byWorkspace.get(s.workspaceCwd).push(s);
    }
    const sections = [];
    const workspaces = [...byWorkspace.keys()].sort((a, b) => basename(a).localeCompare(basename(b)));
    for (const cwd of workspaces) {
      const rows = byWorkspace.get(cwd)
        .filter((s) => this.matches(s.sessionId, cwd, s.gitBranch || ""))
        .sort((a, b) => String(b.lastActivityAt || "").localeCompare(String(a.lastActivityAt || "")));
      if (!rows.length && this.query) continue;
      const branch = rows.find((s) => s.gitBranch) || byWorkspace.get(cwd).find((s) => s.gitBranch);
      sections.push(el("section", { class: "group", "data-workspace": cwd },
        el("header", { class: "group-head", title: cwd },
          icon("folder", { size: 15 }), el("span", { class: "group-name" }, basename(cwd)),
          branch ? el("span", { class: "group-branch", title: `git branch ${branch.gitBranch}` },
            icon("branch", { size: 12 }), branch.gitBranch) : null,
          el("span", { class: "count" }, String(byWorkspace.get(cwd).length))),
        el("ul", { class: "sessions" }, ...rows.map((s) => this.row(s, current)))));
    }
    if (!sections.length) {
      sections.push(el("p", { class: "empty-list" }, this.query ? "No session matches the search."
        : "No live sessions yet. Start one with New session."));
    }
    const stored = new Map(this.unloaded.map((s) => [s.sessionId, {
      ...(this.known.get(s.sessionId) || { title: null }), id: s.sessionId, cwd: s.workspaceCwd,
      seenAt: (this.known.get(s.sessionId) || {}).seenAt || Date.parse(s.createdAt) || 0,
    }]));
    const archived = [...stored.values(), ...[...this.known.items.values()]
      .filter((k) => !stored.has(k.id))]
      .filter((k) => !liveIds.has(k.id) && this.matches(k.id, k.cwd))
      .sort((a, b) => (b.seenAt || 0) - (a.seenAt || 0));
    const open = this.archivedOpen || (this.query !== "" && archived.length > 0);
    const toggle = el("button", { type: "button", class: "group-toggle", id: "archived-toggle",
      "aria-expanded": String(open), title: "Sessions the daemon does not hold in memory now (unloaded when idle, or from before a restart); opening one restores it from the transcript" },
    icon(open ? "chevronDown" : "chevronRight", { size: 14 }), icon("archive", { size: 15 }),
    el("span", { class: "group-name" }, "Archived"), el("span", { class: "count" }, String(archived.length)));
    toggle.addEventListener("click", () => { this.archivedOpen = !open; this.render(); });
    const archivedList = el("ul", { class: "sessions archived-list", hidden: !open },
      ...archived.map((k) => this.archivedRow(k, current)));
    sections.push(el("section", { class: "group archived", id: "archived" }, toggle, archivedList));
    this.groups.replaceChildren(...sections);
  }

  row(s, current) {
    const known = this.known.get(s.sessionId);
    const state = s.hasActivePrompt ? "running" : s.pendingPrompts > 0 ? "queued" : "idle";
    const meta = state === "running" ? "running"
      : state === "queued" ? `${s.pendingPrompts} queued`
        : ago(s.lastActivityAt || s.createdAt);
    const li = el("li", {
      class: `session${s.sessionId === current ? " current" : ""}`, "data-session": s.sessionId,
      "data-state": state, tabIndex: 0, role: "button",
      title: `${sessionTitle(known, s.sessionId)}\n${s.sessionId}\n${s.workspaceCwd}\nlast activity ${s.lastActivityAt || "?"}`,
    },
    el("span", { class: `dot dot-${state}`, "aria-hidden": "true" }),
    el("span", { class: "title" }, sessionTitle(known, s.sessionId)),
    el("span", { class: "meta", "data-meta": state }, meta));
    this.bindOpen(li, s.sessionId);
    return li;
  }

  archivedRow(k, current) {
    const li = el("li", {
      class: `session archived-session${k.id === current ? " current" : ""}`, "data-session": k.id,
      "data-state": "archived", tabIndex: 0, role: "button",
      title: `${sessionTitle(k, k.id)}\n${k.id}\n${k.cwd || ""}\nnot running: opening it restores it`,
    },
    el("span", { class: "dot dot-archived", "aria-hidden": "true" }),
    el("span", { class: "title" }, sessionTitle(k, k.id)),
    el("span", { class: "meta" }, basename(k.cwd || "")));
    this.bindOpen(li, k.id);
    return li;
  }

  bindOpen(li, id) {
    const open = () => this.viewer.navigate(id);
    li.addEventListener("click", open);
    li.addEventListener("keydown", (e) => {
      if (e.key === "Enter" || e.key === " ") { e.preventDefault(); open(); }
    });
  }
}
