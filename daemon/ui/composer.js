// The prompt box and what sits on it: the text area, Send (enabled only when it can act, with
// the reason on hover when it cannot), the "agent is working" bar with the elapsed time and
// Stop, the prompts queued behind the running turn, and chips for the workspace, its git
// branch and the daemon's approval mode. A draft is kept per session and never dropped: a
// prompt that cannot be sent stays in the box with a notice that says why.

import { $, basename, el, elapsed } from "./dom.js";
import { icon } from "./icons.js";

export const APPROVAL_LABELS = Object.freeze({
  default: ["Ask for permission", "The agent asks before acting; you answer in the transcript."],
  plan: ["Plan only", "The agent plans and does not act."],
  "auto-edit": ["Auto-approve edits", "File edits are approved by the daemon; other actions ask."],
  auto: ["Auto-approve", "The daemon approves the agent's requests it deems safe."],
  yolo: ["Approve everything", "Every permission request is approved by the daemon."],
});

export class Composer {
  constructor(viewer) {
    this.viewer = viewer;
    this.input = $("prompt-input");
    this.send = $("send");
    this.form = $("prompt-form");
    this.note = $("composer-note");
    this.working = $("working");
    this.workingTime = $("working-time");
    this.queue = $("queue");
    this.drafts = new Map();   // session id (or "" for a new session) -> draft text
    this.draftKey = "";
    this.ticker = null;
    this.form.addEventListener("submit", (e) => { e.preventDefault(); this.submit(); });
    this.input.addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); this.submit(); }
    });
    this.input.addEventListener("input", () => { this.autosize(); this.update(); });
    $("stop").addEventListener("click", () => this.viewer.stop());
    $("resend").addEventListener("click", () => {
      if (this.viewer.view) this.viewer.view.resendUnsent().catch(() => {});
    });
  }

  autosize() {
    this.input.style.height = "auto";
    this.input.style.height = `${Math.min(this.input.scrollHeight, 240)}px`;
  }

  // Switch the box to another session's draft (the current one is kept for when we return).
  switchTo(sessionId) {
    this.drafts.set(this.draftKey, this.input.value);
    this.draftKey = sessionId || "";
    this.input.value = this.drafts.get(this.draftKey) || "";
    this.autosize();
    this.showUnsent();
  }

  async submit() {
    const text = this.input.value.trim();
    const why = this.blocked(text);
    if (why !== null) {
      this.viewer.addNotice({ id: "viewer.prompt.blocked", message: why });
      return;
    }
    this.input.value = "";
    this.drafts.set(this.draftKey, "");
    this.autosize();
    this.update();
    const sent = await this.viewer.sendPrompt(text);
    if (!sent && !this.input.value) {
      this.input.value = text;   // never drop what the user typed
      this.autosize();
      this.update();
    }
  }

  // Why Send cannot act now, or null.
  blocked(text = this.input.value.trim()) {
    const state = this.viewer.pill.state;
    if (state === "auth_needed") return "Enter the daemon's token first.";
    if (this.viewer.view !== null && this.viewer.view.missing) {
      return "This session does not exist: go back to the list or start a new session.";
    }
    if (this.viewer.view !== null && this.viewer.view.unsent !== null &&
        this.viewer.view.unsent.state !== "sending") {
      return "The prompt above is not known to have reached the daemon yet; it is resent first.";
    }
    if (!text) return "Type a prompt first.";
    return null;
  }

  // The prompt being resent, or whose outcome is unknown (sent again when the connection is
  // back), above the box with its text.
  showUnsent() {
    const view = this.viewer.view;
    const unsent = view !== null ? view.unsent : null;
    const box = $("unsent");
    const shown = unsent !== null && unsent.state !== "sending";
    box.hidden = !shown;
    box.dataset.state = shown ? unsent.state : "";
    if (shown) {
      const what = `“${unsent.text.length > 80 ? `${unsent.text.slice(0, 79)}…` : unsent.text}”`;
      box.querySelector(".text").textContent = unsent.state === "resending"
        ? `Sending ${what} again (attempt ${unsent.attempts + 1}): the connection failed. The same key makes sure it runs once.`
        : `Not known whether ${what} reached the daemon. It is sent again when the connection is back, with the same key, so it runs at most once.`;
      box.title = `Idempotency-Key ${unsent.key}`;
      $("resend").hidden = unsent.state !== "unknown";
    }
    this.update();
  }

  update() {
    const view = this.viewer.view;
    const why = this.blocked();
    this.send.disabled = why !== null;
    let title;
    if (why !== null) title = why;
    else if (view === null) title = `Start a new session in ${basename(this.viewer.defaultWorkspace()) || "the daemon's workspace"} and send (Enter)`;
    else if (view.running !== null) title = "Queue this prompt: it runs when the current turn ends (Enter)";
    else title = "Send (Enter; Shift+Enter for a new line)";
    this.send.title = title;
    this.send.setAttribute("aria-label", title);
    const state = this.viewer.pill.state;
    const blockedNote = state === "auth_needed" ? "The daemon needs its token before anything can be sent."
      : view !== null && view.missing ? "This session does not exist; the prompt box is kept for a new session."
        : view === null ? "Enter sends and starts a new session. Shift+Enter adds a line."
          : view.running !== null ? "A turn is running: what you send now waits in the queue."
            : "Enter sends. Shift+Enter adds a line.";
    this.note.textContent = blockedNote;
    this.form.dataset.state = view === null ? "new" : view.missing ? "missing" : view.running !== null ? "running" : "ready";
  }

  // The running turn and the queue, from the open session.
  showTurn() {
    const view = this.viewer.view;
    const running = view !== null && !view.missing ? view.running : null;
    this.working.hidden = running === null;
    document.body.dataset.turn = running === null ? "idle" : "running";
    if (running !== null) {
      const tick = () => {
        this.workingTime.textContent = elapsed((Date.now() - running.since) / 1000);
      };
      tick();
      if (this.ticker === null) this.ticker = setInterval(() => {
        const current = this.viewer.view && this.viewer.view.running;
        if (current) this.workingTime.textContent = elapsed((Date.now() - current.since) / 1000);
      }, 500);
    } else if (this.ticker !== null) {
      clearInterval(this.ticker);
      this.ticker = null;
    }
    const queued = view !== null && !view.missing ? [...view.queued] : [];
    this.queue.hidden = queued.length === 0;
    this.queue.replaceChildren(...queued.map(([promptId, text]) => el("li", {
      "data-prompt": promptId, title: `Queued prompt ${promptId}: it runs when the turn before it ends` },
    icon("queue", { size: 14 }), el("span", { class: "tag" }, "Queued"),
    el("span", { class: "text" }, text || "(a prompt from another client)"))));
    this.update();
  }

  // Workspace, branch and approval-mode chips for the open session (or the default workspace).
  showChips({ workspace, branch, approvalMode }) {
    const chips = $("chips");
    const items = [];
    if (workspace) {
      items.push(el("span", { class: "chip", id: "chip-workspace", title: `workspace ${workspace}` },
        icon("folder", { size: 14 }), el("span", {}, basename(workspace))));
    }
    if (branch) {
      items.push(el("span", { class: "chip chip-branch", id: "chip-branch", title: `git branch ${branch}` },
        icon("branch", { size: 14 }), el("span", {}, branch)));
    }
    if (approvalMode) {
      const [label, why] = APPROVAL_LABELS[approvalMode] || [approvalMode, "The daemon's approval mode."];
      items.push(el("span", { class: "chip", id: "chip-approval",
        title: `${why} (the daemon's --approval-mode ${approvalMode}, set when it starts)` },
      icon("shield", { size: 14 }), el("span", {}, label)));
    }
    chips.replaceChildren(...items);
  }
}
