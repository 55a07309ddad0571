// A safe subset of Markdown for agent text, parsed into a plain tree (no DOM, no HTML strings):
// dom.js turns the tree into elements with textContent only, so nothing in the input is ever
// interpreted as HTML. Pure.
//
// Blocks: paragraphs, ATX headings, fenced code (``` or ~~~, an unclosed fence runs to the end:
// a code block still streaming shows as code), block quotes, bullet and ordered lists (nested by
// indentation), GFM tables, thematic breaks. Inline: code spans, **strong**, *em*, ~~del~~,
// [links](url), <autolinks>, bare http(s) URLs, backslash escapes, hard and soft line breaks
// (a soft break is a line break, as in chat). Raw HTML is text. A link's target must be an
// absolute http:, https: or mailto: URL; anything else (javascript:, data:, relative paths)
// stays text. Bounded: nesting depth, and inline parsing of very long paragraphs.
//
// Node shapes: {t: "doc"|"p"|"quote"|"ul"|"ol"|"li"|"strong"|"em"|"del"|"h", c: [...]}
// (h adds level, ol adds start), {t: "code", lang, text}, {t: "hr"}, {t: "br"},
// {t: "text", text}, {t: "codespan", text}, {t: "link", href, c}, {t: "table", align, head, rows}.

export const MAX_DEPTH = 8;
export const MAX_INLINE_CHARS = 100_000;
export const SAFE_SCHEMES = new Set(["http:", "https:", "mailto:"]);

// --- links -------------------------------------------------------------------------------------

// The URL a link may point to, or null. Parsed as the browser would (which drops tabs and
// newlines, so "java\nscript:" is caught), and only absolute http(s)/mailto URLs pass.
export function safeHref(raw) {
  if (typeof raw !== "string") return null;
  const text = raw.trim();
  if (!text || text.length > 4096) return null;
  let url;
  try {
    url = new URL(text);
  } catch {
    return null;
  }
  if (!SAFE_SCHEMES.has(url.protocol)) return null;
  return url.href;
}

// --- blocks ------------------------------------------------------------------------------------

const FENCE = /^ {0,3}(`{3,}|~{3,})[ \t]*([^`\s]*)[^`]*$/;
const HEADING = /^ {0,3}(#{1,6})(?:[ \t]+(.*?))?[ \t#]*$/;
const HR = /^ {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$/;
const QUOTE = /^ {0,3}> ?(.*)$/;
const BULLET = /^( {0,3})([-*+])([ \t]+)(.*)$/;
const ORDERED = /^( {0,3})(\d{1,9})([.)])([ \t]+)(.*)$/;
const TABLE_SEP = /^ {0,3}\|?[ \t]*:?-{1,}:?[ \t]*(\|[ \t]*:?-{1,}:?[ \t]*)*\|?[ \t]*$/;
const BLANK = /^[ \t]*$/;

export function parseMarkdown(source) {
  const text = typeof source === "string" ? source.replace(/\r\n?/g, "\n") : "";
  return { t: "doc", c: parseBlocks(text.split("\n"), 0) };
}

function listMarker(line) {
  let m = BULLET.exec(line);
  if (m) return { ordered: false, indent: m[1].length + 1 + m[3].length, rest: m[4], bullet: m[2] };
  m = ORDERED.exec(line);
  if (m) {
    return { ordered: true, indent: m[1].length + m[2].length + 1 + m[4].length, rest: m[5],
      start: Number(m[2]), delim: m[3] };
  }
  return null;
}

function startsBlock(line) {
  return FENCE.test(line) || HEADING.test(line) || HR.test(line) || QUOTE.test(line) ||
    listMarker(line) !== null;
}

function parseBlocks(lines, depth) {
  if (depth >= MAX_DEPTH) return [{ t: "p", c: [{ t: "text", text: lines.join("\n") }] }];
  const out = [];
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    if (BLANK.test(line)) { i += 1; continue; }
    let m = FENCE.exec(line);
    if (m) {
      const fence = m[1];
      const lang = /^[A-Za-z0-9_+#.-]{1,32}$/.test(m[2]) ? m[2] : "";
      const body = [];
      i += 1;
      while (i < lines.length) {
        const close = /^ {0,3}(`{3,}|~{3,})[ \t]*$/.exec(lines[i]);
        if (close && close[1][0] === fence[0] && close[1].length >= fence.length) { i += 1; break; }
        body.push(lines[i]);
        i += 1;
      }
      out.push({ t: "code", lang, text: body.join("\n") });
      continue;
    }
    m = HEADING.exec(line);
    if (m) {
      out.push({ t: "h", level: m[1].length, c: parseInline(m[2] || "") });
      i += 1;
      continue;
    }
    if (HR.test(line)) { out.push({ t: "hr" }); i += 1; continue; }
    if (QUOTE.test(line)) {
      const body = [];
      while (i < lines.length && !BLANK.test(lines[i])) {
        const q = QUOTE.exec(lines[i]);
        if (q) body.push(q[1]);
        else if (startsBlock(lines[i])) break;
        else body.push(lines[i]);   // a lazy continuation line
        i += 1;
      }
      out.push({ t: "quote", c: parseBlocks(body, depth + 1) });
      continue;
    }
    const marker = listMarker(line);
    if (marker !== null) {
      const [node, next] = parseList(lines, i, marker, depth);
      out.push(node);
      i = next;
      continue;
    }
    if (i + 1 < lines.length && line.includes("|") && TABLE_SEP.test(lines[i + 1])) {
      const [node, next] = parseTable(lines, i);
      if (node !== null) { out.push(node); i = next; continue; }
    }
    const para = [line];
    i += 1;
    while (i < lines.length && !BLANK.test(lines[i]) && !startsBlock(lines[i])) {
      para.push(lines[i]);
      i += 1;
    }
    out.push({ t: "p", c: parseInline(para.join("\n")) });
  }
  return out;
}

function parseList(lines, start, first, depth) {
  const node = first.ordered ? { t: "ol", start: first.start, c: [] } : { t: "ul", c: [] };
  let i = start;
  while (i < lines.length) {
    const marker = listMarker(lines[i]);
    if (marker === null || marker.ordered !== first.ordered) break;
    if (!first.ordered && marker.bullet !== first.bullet) break;
    if (first.ordered && marker.delim !== first.delim) break;
    const body = [marker.rest];
    i += 1;
    let blankRun = 0;
    while (i < lines.length) {
      const line = lines[i];
      if (BLANK.test(line)) { blankRun += 1; body.push(""); i += 1; continue; }
      const indent = line.length - line.trimStart().length;
      if (indent >= marker.indent || (indent >= 2 && blankRun === 0 && listMarker(line) !== null)) {
        body.push(line.slice(Math.min(indent, marker.indent)));
      } else if (blankRun === 0 && !startsBlock(line)) {
        body.push(line.trimStart());   // a lazy continuation of the item's paragraph
      } else {
        break;
      }
      blankRun = 0;
      i += 1;
    }
    while (body.length && body[body.length - 1] === "") body.pop();
    const blocks = parseBlocks(body, depth + 1);
    // A tight item's lone paragraph is its inline content (no <p> inside the <li>).
    const tight = blocks.length >= 1 && blocks[0].t === "p" && !body.includes("");
    node.c.push({ t: "li", c: tight ? [...blocks[0].c, ...blocks.slice(1)] : blocks });
    if (blankRun > 0 && (i >= lines.length || listMarker(lines[i]) === null)) break;
  }
  return [node, i];
}

function splitRow(line) {
  let text = line.trim();
  if (text.startsWith("|")) text = text.slice(1);
  if (text.endsWith("|") && !text.endsWith("\\|")) text = text.slice(0, -1);
  const cells = [];
  let cell = "";
  for (let k = 0; k < text.length; k += 1) {
    const ch = text[k];
    if (ch === "\\" && text[k + 1] === "|") { cell += "|"; k += 1; continue; }
    if (ch === "|") { cells.push(cell.trim()); cell = ""; continue; }
    cell += ch;
  }
  cells.push(cell.trim());
  return cells;
}

function parseTable(lines, start) {
  const head = splitRow(lines[start]);
  const align = splitRow(lines[start + 1]).map((spec) => {
    const left = spec.startsWith(":");
    const right = spec.endsWith(":");
    return left && right ? "center" : right ? "right" : left ? "left" : null;
  });
  if (align.length !== head.length) return [null, start];
  const rows = [];
  let i = start + 2;
  while (i < lines.length && !BLANK.test(lines[i]) && lines[i].includes("|")) {
    const cells = splitRow(lines[i]).slice(0, head.length);
    while (cells.length < head.length) cells.push("");
    rows.push(cells.map(parseInline));
    i += 1;
  }
  return [{ t: "table", align, head: head.map(parseInline), rows }, i];
}

// --- inline ------------------------------------------------------------------------------------

const ESCAPABLE = "\\`*_{}[]()#+-.!|~<>\"'";
const BARE_URL = /^https?:\/\/[^\s<>"'`]+/;

// Inline content: first tokens (text, code spans, links, breaks, delimiter runs), then the
// delimiter runs matched into emphasis with one stack per kind (each opener is popped at most
// once, so the pass is linear).
export function parseInline(text) {
  if (text.length > MAX_INLINE_CHARS) return [{ t: "text", text }];
  return matchDelimiters(tokenize(text));
}

function pushText(tokens, text) {
  const last = tokens[tokens.length - 1];
  if (last && last.t === "text") last.text += text;
  else tokens.push({ t: "text", text });
}

// For each "[" the index of its matching "]" (escapes skipped), in one pass: links are then
// found without rescanning the text from every bracket.
function bracketPairs(text) {
  const pairs = new Map();
  const open = [];
  for (let k = 0; k < text.length; k += 1) {
    const ch = text[k];
    if (ch === "\\") k += 1;
    else if (ch === "[") open.push(k);
    else if (ch === "]" && open.length) pairs.set(open.pop(), k);
  }
  return pairs;
}

function tokenize(text) {
  const tokens = [];
  const pairs = text.includes("[") ? bracketPairs(text) : null;
  let nextGt = -2;   // the next ">" at or after the current "<" (-1: none left)
  let i = 0;
  while (i < text.length) {
    const ch = text[i];
    if (ch === "\\" && i + 1 < text.length) {
      if (text[i + 1] === "\n") { tokens.push({ t: "br" }); i += 2; continue; }
      if (ESCAPABLE.includes(text[i + 1])) { pushText(tokens, text[i + 1]); i += 2; continue; }
    }
    if (ch === "\n") {
      // A soft or hard break; trailing spaces of the line go.
      const last = tokens[tokens.length - 1];
      if (last && last.t === "text") last.text = last.text.replace(/[ \t]+$/, "");
      tokens.push({ t: "br" });
      i += 1;
      while (text[i] === " " || text[i] === "\t") i += 1;
      continue;
    }
    if (ch === "`") {
      let run = 1;
      while (text[i + run] === "`") run += 1;
      const fence = "`".repeat(run);
      const end = text.indexOf(fence, i + run);
      if (end !== -1 && text[end + run] !== "`") {
        let code = text.slice(i + run, end).replace(/\n/g, " ");
        if (code.length > 2 && code.startsWith(" ") && code.endsWith(" ") && code.trim()) {
          code = code.slice(1, -1);
        }
        tokens.push({ t: "codespan", text: code });
        i = end + run;
        continue;
      }
      pushText(tokens, fence);
      i += run;
      continue;
    }
    if (ch === "<") {
      if (nextGt !== -1 && nextGt <= i) nextGt = text.indexOf(">", i + 1);
      const close = nextGt;
      if (close !== -1 && close - i < 2048) {
        const inner = text.slice(i + 1, close);
        const href = /^[A-Za-z][A-Za-z0-9+.-]{1,31}:[^\s<>]*$/.test(inner) ? safeHref(inner) : null;
        if (href !== null) {
          tokens.push({ t: "link", href, c: [{ t: "text", text: inner }] });
          i = close + 1;
          continue;
        }
      }
    }
    if (ch === "!" && text[i + 1] === "[") {
      const link = readLink(text, i + 1, pairs);
      if (link !== null) {
        // Images are never loaded: the alt text links to the image (when its URL is safe).
        const alt = { t: "text", text: link.label || link.href || "image" };
        if (link.href !== null) tokens.push({ t: "link", href: link.href, c: [alt] });
        else pushText(tokens, text.slice(i, link.end));
        i = link.end;
        continue;
      }
    }
    if (ch === "[") {
      const link = readLink(text, i, pairs);
      if (link !== null) {
        const label = matchDelimiters(tokenize(link.label));
        if (link.href !== null) tokens.push({ t: "link", href: link.href, c: label });
        else tokens.push(...label);   // an unsafe target: the label stays, as text
        i = link.end;
        continue;
      }
    }
    if ((ch === "h" || ch === "H") && (i === 0 || /[\s(]/.test(text[i - 1]))) {
      const m = BARE_URL.exec(text.slice(i, i + 2048));
      if (m) {
        const url = m[0].replace(/[.,;:!?)]+$/, "");
        const href = safeHref(url);
        if (href !== null) {
          tokens.push({ t: "link", href, c: [{ t: "text", text: url }] });
          i += url.length;
          continue;
        }
      }
    }
    if (ch === "*" || ch === "_" || ch === "~") {
      let run = 1;
      while (text[i + run] === ch) run += 1;
      if (ch === "~" && run !== 2) { pushText(tokens, ch.repeat(run)); i += run; continue; }
      const before = i === 0 ? " " : text[i - 1];
      const after = i + run >= text.length ? " " : text[i + run];
      let canOpen = !/\s/.test(after);
      let canClose = !/\s/.test(before);
      if (ch === "_") {   // no intraword emphasis with underscores (snake_case stays as is)
        canOpen = canOpen && !/[A-Za-z0-9]/.test(before);
        canClose = canClose && !/[A-Za-z0-9]/.test(after);
      }
      tokens.push({ t: "delim", ch, run, canOpen, canClose });
      i += run;
      continue;
    }
    let j = i + 1;
    while (j < text.length && !"\\\n`<![*_~hH".includes(text[j])) j += 1;
    pushText(tokens, text.slice(i, j));
    i = j;
  }
  return tokens;
}

// [label](url "title") starting at text[start] === "["; {label, href (safe or null), end}.
// The URL may hold balanced parentheses (https://en.wikipedia.org/wiki/A_(B)).
function readLink(text, start, pairs) {
  const k = pairs === null ? undefined : pairs.get(start);
  if (k === undefined || text[k + 1] !== "(") return null;
  let depth = 0;
  let close = -1;
  for (let j = k + 2; j < text.length && j - k < 2048; j += 1) {
    const ch = text[j];
    if (ch === "\\") { j += 1; continue; }
    if (ch === "\n" || ch === "[") return null;   // a URL never holds these unescaped
    if (ch === "(") depth += 1;
    else if (ch === ")") {
      if (depth === 0) { close = j; break; }
      depth -= 1;
    }
  }
  if (close === -1) return null;
  const target = text.slice(k + 2, close).trim();
  const url = target.replace(/\s+"[^"]*"$/, "").replace(/^<(.*)>$/, "$1");
  return { label: text.slice(start + 1, k), href: safeHref(url), end: close + 1 };
}

function delimKind(token) {
  if (token.ch === "~") return "del";
  return token.run >= 2 ? "strong" : "em";
}

function matchDelimiters(tokens) {
  const out = [];
  const stacks = { em: [], strong: [], del: [] };
  const stackOf = (kind) => stacks[kind];
  for (const token of tokens) {
    if (token.t !== "delim") { out.push(token); continue; }
    const kind = delimKind(token);
    const openers = stackOf(kind);
    let matched = false;
    if (token.canClose) {
      // The nearest opener of the same kind and character.
      while (openers.length) {
        const at = openers[openers.length - 1];
        if (out[at] && out[at].t === "delim" && out[at].ch === token.ch) break;
        openers.pop();
      }
      if (openers.length) {
        const at = openers.pop();
        for (const other of Object.values(stacks)) {
          while (other.length && other[other.length - 1] > at) other.pop();
        }
        const children = out.splice(at).slice(1).map(literal);
        out.push({ t: kind, c: children });
        matched = true;
      }
    }
    if (matched) continue;
    if (token.canOpen) {
      stackOf(kind).push(out.length);
      out.push(token);
    } else {
      out.push({ t: "text", text: token.ch.repeat(token.run) });
    }
  }
  return mergeText(out.map(literal));
}

function literal(token) {
  return token.t === "delim" ? { t: "text", text: token.ch.repeat(token.run) } : token;
}

function mergeText(nodes) {
  const out = [];
  for (const node of nodes) {
    const last = out[out.length - 1];
    if (node.t === "text" && last && last.t === "text") last.text += node.text;
    else out.push(node);
  }
  return out;
}

// The plain text of a tree (a block's copy text, search).
export function plainText(node) {
  if (node.t === "text" || node.t === "codespan" || node.t === "code") return node.text;
  if (node.t === "br") return "\n";
  if (node.t === "table") {
    return [node.head, ...node.rows].map((row) => row.map((c) => c.map(plainText).join("")).join("\t"))
      .join("\n");
  }
  return (node.c || []).map(plainText).join(node.t === "doc" ? "\n\n" : "");
}
