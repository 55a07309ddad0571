// DOM helpers: building elements (text always through textContent, never markup), a Markdown
// tree (markdown.js) as elements, copy buttons, and the short time words the lists use.

import { icon } from "./icons.js";

export const $ = (id) => document.getElementById(id);

// el("button", {class: "x", type: "button", title: "..."}, child, ...): properties are set as
// attributes for data-*, aria-* and a few names, else as properties. Strings become text nodes.
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") node.className = value;
    else if (key.startsWith("data-") || key.startsWith("aria-") || key === "role" ||
             key === "for" || key === "rel" || key === "target") {
      node.setAttribute(key, value === true ? "" : String(value));
    } else node[key] = value;
  }
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child);
  }
  return node;
}

// An icon button: an icon, an optional text label, and a title saying what it does.
export function iconButton(name, { label = null, title, id = null, cls = "" } = {}) {
  return el("button", { type: "button", id, class: `btn ${cls}`.trim(), title,
    "aria-label": label === null ? title : null }, icon(name), label === null ? null : el("span", {}, label));
}

// --- Markdown -----------------------------------------------------------------------------------

const INLINE_TAGS = { strong: "strong", em: "em", del: "del" };

function inline(nodes, parent) {
  for (const node of nodes) parent.append(inlineNode(node));
  return parent;
}

function inlineNode(node) {
  switch (node.t) {
    case "text": return document.createTextNode(node.text);
    case "br": return el("br");
    case "codespan": return el("code", { class: "md-code" }, node.text);
    case "link": {
      const a = el("a", { href: node.href, rel: "noopener noreferrer nofollow", target: "_blank",
        title: node.href });
      return inline(node.c, a);
    }
    default: {
      const tag = INLINE_TAGS[node.t];
      if (tag) return inline(node.c || [], el(tag));
      return document.createTextNode("");
    }
  }
}

export function copyButton(getText, what = "Copy") {
  const button = el("button", { type: "button", class: "btn btn-ghost btn-xs copy", title: what },
    icon("copy", { size: 14 }), el("span", {}, "Copy"));
  button.addEventListener("click", async () => {
    let ok = true;
    try {
      await navigator.clipboard.writeText(getText());
    } catch {
      ok = false;
    }
    button.dataset.copied = ok ? "true" : "false";
    button.replaceChildren(icon(ok ? "check" : "alert", { size: 14 }),
      el("span", {}, ok ? "Copied" : "Copy failed"));
    setTimeout(() => {
      button.replaceChildren(icon("copy", { size: 14 }), el("span", {}, "Copy"));
      delete button.dataset.copied;
    }, 1500);
  });
  return button;
}

function blockNode(node) {
  switch (node.t) {
    case "p": return inline(node.c, el("p"));
    case "h": return inline(node.c, el(`h${Math.min(6, Math.max(1, node.level)) + 0}`, { class: "md-h" }));
    case "hr": return el("hr");
    case "quote": return blocks(node.c, el("blockquote"));
    case "ul": return items(node.c, el("ul"));
    case "ol": return items(node.c, el("ol", { start: node.start }));
    case "code": {
      const code = el("code", {}, node.text);
      return el("figure", { class: "md-codeblock", "data-lang": node.lang || null },
        el("figcaption", {}, el("span", { class: "lang" }, node.lang || "code"),
          copyButton(() => node.text, "Copy this code")),
        el("pre", {}, code));
    }
    case "table": {
      const cellOf = (tag, content, index) => inline(content, el(tag, {
        class: node.align[index] ? `align-${node.align[index]}` : null }));
      const head = el("tr", {}, ...node.head.map((c, k) => cellOf("th", c, k)));
      const rows = node.rows.map((row) => el("tr", {}, ...row.map((c, k) => cellOf("td", c, k))));
      return el("div", { class: "md-table" }, el("table", {}, el("thead", {}, head), el("tbody", {}, ...rows)));
    }
    default: return inlineNode(node);
  }
}

function items(list, parent) {
  for (const item of list) {
    const li = el("li");
    for (const child of item.c) {
      li.append(["p", "ul", "ol", "code", "quote", "h", "hr", "table"].includes(child.t)
        ? blockNode(child) : inlineNode(child));
    }
    parent.append(li);
  }
  return parent;
}

function blocks(list, parent) {
  for (const node of list) parent.append(blockNode(node));
  return parent;
}

// A Markdown tree as a <div class="md">.
export function markdownElement(tree, cls = "md") {
  return blocks(tree.c, el("div", { class: cls }));
}

// --- time -----------------------------------------------------------------------------------------

// "now", "12 s", "4 min", "3 h", "2 d", then the date.
export function ago(isoOrMs, now = Date.now()) {
  const at = typeof isoOrMs === "number" ? isoOrMs : Date.parse(isoOrMs);
  if (!Number.isFinite(at)) return "";
  const s = Math.max(0, Math.round((now - at) / 1000));
  if (s < 5) return "now";
  if (s < 60) return `${s} s ago`;
  if (s < 3600) return `${Math.floor(s / 60)} min ago`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ago`;
  if (s < 7 * 86400) return `${Math.floor(s / 86400)} d ago`;
  return new Date(at).toISOString().slice(0, 10);
}

// Elapsed seconds as "7 s", "1 min 05 s", "1 h 02 min".
export function elapsed(seconds) {
  const s = Math.max(0, Math.floor(seconds));
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${String(s % 60).padStart(2, "0")} s`;
  return `${Math.floor(s / 3600)} h ${String(Math.floor((s % 3600) / 60)).padStart(2, "0")} min`;
}

export function basename(path) {
  if (typeof path !== "string" || !path) return "";
  const trimmed = path.replace(/\/+$/, "");
  return trimmed.split("/").pop() || "/";
}
