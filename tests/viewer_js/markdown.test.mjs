// The viewer's Markdown subset (daemon/ui/markdown.js): what it renders, what it refuses to
// make a link, and that hostile input stays text and costs linear time.
// Run: node --test tests/viewer_js/ (tests/viewer/test_viewer_modules.py does, in make test).
import assert from "node:assert/strict";
import { test } from "node:test";

import { MAX_INLINE_CHARS, parseMarkdown, plainText, safeHref } from "../../daemon/ui/markdown.js";

const doc = (text) => parseMarkdown(text).c;
const inline = (text) => doc(text)[0].c;

function walk(node, visit) {
  visit(node);
  for (const key of ["c", "head"]) {
    if (Array.isArray(node[key])) for (const child of node[key].flat()) walk(child, visit);
  }
  if (Array.isArray(node.rows)) for (const row of node.rows) for (const cell of row) for (const c of cell) walk(c, visit);
}

function links(text) {
  const found = [];
  walk(parseMarkdown(text), (n) => { if (n.t === "link") found.push(n.href); });
  return found;
}

test("paragraphs, emphasis, code spans and strikethrough", () => {
  assert.deepEqual(inline("a **b** *c* `d` ~~e~~ snake_case_name"), [
    { t: "text", text: "a " }, { t: "strong", c: [{ t: "text", text: "b" }] },
    { t: "text", text: " " }, { t: "em", c: [{ t: "text", text: "c" }] },
    { t: "text", text: " " }, { t: "codespan", text: "d" }, { t: "text", text: " " },
    { t: "del", c: [{ t: "text", text: "e" }] }, { t: "text", text: " snake_case_name" },
  ]);
  assert.deepEqual(inline("chunk-0chunk-1chunk-2"), [{ t: "text", text: "chunk-0chunk-1chunk-2" }]);
  // A line break in agent text is a line break (as in chat), not a space.
  assert.deepEqual(inline("one\ntwo"), [{ t: "text", text: "one" }, { t: "br" }, { t: "text", text: "two" }]);
  assert.deepEqual(inline("\\*not em\\*"), [{ t: "text", text: "*not em*" }]);
});

test("headings, lists, quotes, rules and tables", () => {
  const blocks = doc("# Title\n\n- a\n- b\n  - c\n\n1. one\n2. two\n\n> quoted\n\n---\n\n| x | y |\n|:--|--:|\n| 1 | 2 |");
  assert.deepEqual(blocks.map((b) => b.t), ["h", "ul", "ol", "quote", "hr", "table"]);
  assert.equal(blocks[0].level, 1);
  assert.equal(blocks[1].c.length, 2);
  assert.equal(blocks[1].c[1].c[1].t, "ul");   // nested under "b"
  assert.deepEqual(blocks[5].align, ["left", "right"]);
  assert.equal(plainText(blocks[5]), "x\ty\n1\t2");
});

test("fenced code keeps its text exactly, and an unclosed fence is code to the end", () => {
  const [code, after] = doc("```python\nprint('<b>hi</b>')\n  indented\n```\nafter");
  assert.deepEqual(code, { t: "code", lang: "python", text: "print('<b>hi</b>')\n  indented" });
  assert.equal(after.t, "p");
  const [open] = doc("```js\nconst x = 1;\nstill streaming");
  assert.deepEqual(open, { t: "code", lang: "js", text: "const x = 1;\nstill streaming" });
  // A language that is not a plain word is not kept (it becomes a data attribute).
  assert.equal(doc('```" onmouseover=x\ncode\n```')[0].lang, "");
});

test("links: only absolute http, https and mailto targets", () => {
  assert.deepEqual(links("[ok](https://example.com/a_(b)) <http://x.test> see https://y.test/p."), [
    "https://example.com/a_(b)", "http://x.test/", "https://y.test/p",
  ]);
  assert.deepEqual(links("[mail](mailto:someone@example.com)"), ["mailto:someone@example.com"]);
  for (const bad of [
    "[x](javascript:alert(1))", "[x](JavaScript:alert(1))", "[x](java\tscript:alert(1))",
    "[x]( javascript:alert(1))", "[x](data:text/html,<script>alert(1)</script>)",
    "[x](vbscript:msgbox(1))", "[x](/session/abc/cancel)", "[x](#top)", "[x](//evil.test/)",
    "<javascript:alert(1)>", "![img](javascript:alert(1))", "[x](file:///etc/passwd)",
  ]) {
    assert.deepEqual(links(bad), [], bad);
  }
  for (const raw of ["javascript:alert(1)", "JAVASCRIPT:x", "java\nscript:x", "data:x", "/rel", "", null]) {
    assert.equal(safeHref(raw), null, String(raw));
  }
  // The label of a refused link stays, as text.
  assert.equal(plainText(parseMarkdown("[click me](javascript:alert(1))")), "click me");
});

test("raw HTML is text", () => {
  const text = '<script>alert(1)</script><img src=x onerror="alert(2)"><a href="javascript:1">a</a>';
  assert.deepEqual(inline(text), [{ t: "text", text }]);
  let kinds = new Set();
  walk(parseMarkdown(`# ${text}\n\n- ${text}\n\n> ${text}`), (n) => kinds.add(n.t));
  kinds = [...kinds].sort();
  assert.deepEqual(kinds, ["doc", "h", "li", "p", "quote", "text", "ul"]);
});

test("images are never loaded: the alt text links to the image", () => {
  assert.deepEqual(inline("![a cat](https://img.test/cat.png)"), [
    { t: "link", href: "https://img.test/cat.png", c: [{ t: "text", text: "a cat" }] },
  ]);
});

test("hostile input stays linear", () => {
  const cases = [
    "*".repeat(100000), "_".repeat(100000), "[".repeat(50000), "[a](".repeat(20000),
    "**a ".repeat(25000), "` ".repeat(50000), "<".repeat(50000), "http://a".repeat(10000),
    ">".repeat(20000) + " x", "- ".repeat(20000) + "x", "\n".repeat(100000), "~~a ".repeat(25000),
    "| a ".repeat(20000) + "\n" + "|--".repeat(20000),
  ];
  for (const text of cases) {
    // CPU time of this process, not wall time: a busy machine makes the wait for a core longer,
    // never the parse's own work. Linear parses of these take tens of milliseconds; a quadratic
    // one (10^9-10^10 steps) takes tens of seconds, so the bound only tells the two apart.
    const started = process.cpuUsage();
    parseMarkdown(text);
    const spent = process.cpuUsage(started);
    const took = (spent.user + spent.system) / 1000;
    assert.ok(took < 2000, `${JSON.stringify(text.slice(0, 12))}… took ${took.toFixed(0)} ms of CPU`);
  }
  // Past the inline limit a paragraph is plain text.
  const long = "*a* ".repeat(MAX_INLINE_CHARS / 4 + 1);
  const nodes = inline(long);
  assert.ok(nodes.length === 1 && nodes[0].t === "text" && nodes[0].text.startsWith("*a* *a*"));
});

test("deep nesting is cut off, not recursed into", () => {
  const nested = Array.from({ length: 100 }, (_, i) => `${"  ".repeat(i)}- level ${i}`).join("\n");
  let depth = 0;
  const measure = (node, d) => {
    depth = Math.max(depth, d);
    for (const child of node.c || []) if (child && typeof child === "object") measure(child, d + 1);
  };
  measure(parseMarkdown(nested), 0);
  assert.ok(depth < 40, `depth ${depth}`);
  assert.ok(plainText(parseMarkdown(nested)).includes("level 99"));
  assert.ok(plainText(parseMarkdown(">".repeat(500) + " deep")).includes("deep"));
});
