// Transcript blocks as DOM: one <li> per block, built from the block alone (a block is frozen,
// so a node is rebuilt only when its block object changes). Agent text is Markdown (the safe
// subset of markdown.js); everything else is plain text. No markup strings anywhere.

import { copyButton, el, elapsed, markdownElement } from "./dom.js";
import { icon } from "./icons.js";
import { parseMarkdown, plainText } from "./markdown.js";
import { PERMISSION_REASONS } from "./protocol.js";

export const KIND_LABELS = {
  user: "You", assistant: "Agent", thought: "Thinking", tool: "Tool", permission: "Permission",
  status: "Status", error: "Error", debug: "Debug", prompt_cancelled: "Cancelled",
};

const TOOL_STATUS = {
  pending: ["clock", "pending"],
  in_progress: ["refresh", "running"],
  completed: ["check", "done"],
  failed: ["alert", "failed"],
  cancelled: ["close", "cancelled"],
};

// Options whose kind says they grant something get the primary style.
const GRANTING = new Set(["allow_once", "allow_always"]);

function blockShell(b, extraClasses = []) {
  const classes = ["block", b.kind, ...extraClasses];
  if (b.streaming) classes.push("streaming");
  if (b.source) classes.push(`source-${b.source}`);
  const li = el("li", { class: classes.join(" "), "data-id": b.id, "data-kind": b.kind,
    "data-prompt": b.prompt_id || null });
  return li;
}

function textOrMarkdown(b) {
  // Long streaming text is re-parsed on every chunk; the parser is linear, and the view
  // batches renders, so this is one parse per batch of chunks.
  const tree = parseMarkdown(b.text);
  return markdownElement(tree, "text md");
}

function renderUser(b) {
  const li = blockShell(b);
  li.append(el("div", { class: "bubble" },
    el("div", { class: "who" }, icon("user", { size: 14 }), el("span", {}, KIND_LABELS.user)),
    el("div", { class: "text" }, b.text)));
  return li;
}

function renderAssistant(b) {
  const li = blockShell(b);
  const body = textOrMarkdown(b);
  li.append(
    el("div", { class: "avatar", title: "Agent" }, icon("agent", { size: 16 })),
    el("div", { class: "content" },
      el("div", { class: "who" }, el("span", {}, KIND_LABELS.assistant),
        b.streaming ? null : copyButton(() => b.text, "Copy this answer (Markdown)")),
      body));
  return li;
}

function renderThought(b) {
  const li = blockShell(b);
  const details = el("details", { class: "fold" },
    el("summary", {}, icon("spark", { size: 14 }), el("span", {}, b.streaming ? "Thinking…" : "Thought"),
      icon("chevronRight", { size: 14 })),
    el("div", { class: "text" }, b.text));
  if (!b.collapsed) details.open = true;
  li.append(details);
  return li;
}

function jsonText(value) {
  try {
    return JSON.stringify(value, null, 2);
  } catch {
    return String(value);
  }
}

function toolBody(b) {
  const data = b.data && typeof b.data === "object" ? b.data : {};
  const parts = [];
  if (Array.isArray(data.entries)) {
    parts.push(el("ol", { class: "plan" }, ...data.entries.map((entry) => {
      const status = entry && typeof entry.status === "string" ? entry.status : "pending";
      const [name] = TOOL_STATUS[status] || TOOL_STATUS.pending;
      return el("li", { "data-status": status }, icon(name, { size: 14 }),
        el("span", {}, entry && typeof entry.content === "string" ? entry.content : jsonText(entry)));
    })));
  }
  if (data.kind !== undefined) parts.push(el("div", { class: "kv" }, el("span", {}, "kind"), el("code", {}, String(data.kind))));
  if (data.rawInput !== undefined) {
    parts.push(el("div", { class: "kv" }, el("span", {}, "input")), el("pre", { class: "json" }, jsonText(data.rawInput)));
  }
  if (Array.isArray(data.content) && data.content.length) {
    parts.push(el("div", { class: "kv" }, el("span", {}, "output")));
    for (const item of data.content) {
      const inner = item && item.content && typeof item.content.text === "string" ? item.content.text : null;
      if (inner !== null) parts.push(markdownElement(parseMarkdown(inner), "md tool-output"));
      else parts.push(el("pre", { class: "json" }, jsonText(item)));
    }
  }
  if (data.rawOutput !== undefined) {
    parts.push(el("div", { class: "kv" }, el("span", {}, "output")), el("pre", { class: "json" }, jsonText(data.rawOutput)));
  }
  if (Array.isArray(data.locations) && data.locations.length) {
    parts.push(el("div", { class: "kv" }, el("span", {}, "files"),
      el("span", {}, data.locations.map((l) => (l && l.path) || "?").join(", "))));
  }
  const known = new Set(["entries", "kind", "rawInput", "content", "rawOutput", "locations"]);
  const rest = Object.fromEntries(Object.entries(data).filter(([k]) => !known.has(k)));
  if (Object.keys(rest).length) parts.push(el("pre", { class: "json" }, jsonText(rest)));
  if (!parts.length) parts.push(el("p", { class: "muted" }, "No details yet."));
  return parts;
}

function renderTool(b) {
  const li = blockShell(b);
  li.dataset.status = b.status;
  const [name, word] = TOOL_STATUS[b.status] || ["info", b.status];
  const isPlan = b.tool_call_id === "plan";
  const details = el("details", { class: "fold" },
    el("summary", {},
      icon(isPlan ? "queue" : "tool", { size: 14 }),
      el("span", { class: "title" }, b.title || b.tool_call_id),
      el("span", { class: `status badge status-${b.status}`, title: `status: ${b.status}` },
        icon(name, { size: 12 }), el("span", {}, word)),
      icon("chevronRight", { size: 14 })),
    el("div", { class: "tool-body" }, ...toolBody(b)));
  if (isPlan) details.open = true;
  li.append(details);
  return li;
}

function optionLabel(option) {
  return option && typeof option.name === "string" && option.name ? option.name : option.optionId;
}

function renderPermission(b, actions) {
  const li = blockShell(b);
  const title = b.tool_call && typeof b.tool_call.title === "string" ? b.tool_call.title : "A tool";
  li.dataset.resolved = String(b.resolved);
  const card = el("div", { class: "card" },
    el("div", { class: "card-head" }, icon("shield", { size: 16 }),
      el("span", { class: "text" }, `${title} asks for permission.`)));
  if (b.resolved) {
    const outcome = b.outcome && b.outcome.optionId ? b.outcome.optionId
      : (b.outcome && b.outcome.outcome) || "resolved";
    const why = b.reason ? ` (${PERMISSION_REASONS[b.reason] || b.reason})` : "";
    card.append(el("div", { class: "outcome" }, `Answered: ${outcome}${why}`));
  } else {
    const row = el("div", { class: "options" });
    for (const option of b.options) {
      if (!option || typeof option.optionId !== "string") continue;
      const primary = GRANTING.has(option.kind);
      const button = el("button", { type: "button", class: `btn ${primary ? "btn-primary" : ""}`,
        "data-option": option.optionId, title: `Answer: ${optionLabel(option)} (${option.optionId})` },
      icon(primary ? "check" : "close", { size: 14 }), el("span", {}, optionLabel(option)));
      button.addEventListener("click", () => {
        for (const other of row.querySelectorAll("button")) other.disabled = true;
        actions.vote(b.request_id, option.optionId).catch(() => {
          for (const other of row.querySelectorAll("button")) other.disabled = false;
        });
      });
      row.append(button);
    }
    card.append(row, el("div", { class: "hint" }, "The turn waits for an answer."));
  }
  li.append(card);
  return li;
}

function renderStrip(b, iconName) {
  const li = blockShell(b);
  li.append(el("div", { class: "strip" }, icon(iconName, { size: 16 }),
    el("div", { class: "strip-body" },
      b.kind === "error" && b.code ? el("span", { class: "code badge", title: "error code" }, b.code) : null,
      el("span", { class: "text" }, b.text))));
  return li;
}

function renderDebug(b) {
  const li = blockShell(b);
  li.append(el("details", { class: "fold" },
    el("summary", {}, icon("info", { size: 14 }), el("span", { class: "text" }, b.text),
      icon("chevronRight", { size: 14 })),
    el("pre", { class: "json" }, jsonText(b.data))));
  return li;
}

export function renderBlock(b, actions) {
  switch (b.kind) {
    case "user": return renderUser(b);
    case "assistant": return renderAssistant(b);
    case "thought": return renderThought(b);
    case "tool": return renderTool(b);
    case "permission": return renderPermission(b, actions);
    case "error": return renderStrip(b, "alert");
    case "status": return renderStrip(b, "info");
    case "prompt_cancelled": return renderStrip(b, "stop");
    case "debug": return renderDebug(b);
    default: return renderStrip(b, "info");
  }
}

// The plain text of a block (for copy and search).
export function blockText(b) {
  if (b.kind === "assistant") return plainText(parseMarkdown(b.text));
  return typeof b.text === "string" ? b.text : "";
}

export { elapsed };
