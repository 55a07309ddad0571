// The connection pill: what the page's link to the daemon is doing, always true. States:
// idle (no session open), connecting, connected, reconnecting (with the countdown to the next
// attempt), repairing, auth_needed, missing (the session does not exist) and error.

import { el } from "./dom.js";

export const STATES = Object.freeze({
  idle: { label: "idle", title: "No session is open." },
  connecting: { label: "connecting…", title: "Opening the session's event stream." },
  connected: { label: "connected", title: "Live: events arrive as the agent works." },
  reconnecting: { label: "reconnecting", title: "The event stream dropped; it resumes from the last event seen, with nothing lost or repeated." },
  repairing: { label: "repairing", title: "Loading the complete turn once more to replace a truncated view." },
  auth_needed: { label: "auth needed", title: "The daemon needs its token." },
  missing: { label: "session missing", title: "The daemon has no such session." },
  error: { label: "error", title: "The daemon could not be reached." },
});

export class ConnectionPill {
  constructor(node) {
    this.node = node;
    this.state = "idle";
    this.detail = {};
    this.timer = null;
    this.show("idle");
  }

  show(state, detail = {}) {
    if (!Object.hasOwn(STATES, state)) throw new Error(`unknown connection state ${state}`);
    this.state = state;
    this.detail = detail;
    if (this.timer !== null) { clearInterval(this.timer); this.timer = null; }
    if (state === "reconnecting" && Number.isFinite(detail.retryAt)) {
      this.timer = setInterval(() => this.paint(), 250);
    }
    this.paint();
  }

  paint() {
    const { label, title } = STATES[this.state];
    let text = label;
    let hover = title;
    if (this.state === "reconnecting" && Number.isFinite(this.detail.retryAt)) {
      const seconds = Math.max(0, Math.ceil((this.detail.retryAt - Date.now()) / 1000));
      text = seconds > 0 ? `reconnecting in ${seconds} s` : "reconnecting now";
      hover = `${title} Attempt ${this.detail.attempt || 1}.`;
    } else if (this.state === "error" && this.detail.message) {
      hover = `${title} ${this.detail.message}`;
    }
    this.node.dataset.state = this.state;
    this.node.title = hover;
    this.node.replaceChildren(el("span", { class: "pulse", "aria-hidden": "true" }),
      el("span", { class: "label" }, text));
  }
}
