// Find in the transcript: Ctrl+F (or ⌘F, or the top bar's search button) opens a find bar that
// searches every block of the open session, shown or not (the transcript renders only the
// blocks near the viewport, so the browser's own find would see only those). Enter goes to the
// next match, Shift+Enter to the previous, Escape closes. A match is a block whose text (what
// its copy button copies; a tool call's title) contains the query, ignoring case.

import { $ } from "./dom.js";
import { blockText } from "./render.js";

// The indexes of the blocks that match the query (pure: the browser test and find share it).
export function findMatches(blocks, query) {
  const needle = query.trim().toLowerCase();
  if (needle === "") return [];
  const found = [];
  for (let i = 0; i < blocks.length; i += 1) {
    const b = blocks[i];
    const text = `${blockText(b)}\n${typeof b.title === "string" ? b.title : ""}`;
    if (text.toLowerCase().includes(needle)) found.push(i);
  }
  return found;
}

export class FindBar {
  constructor(viewer) {
    this.viewer = viewer;
    this.matches = [];
    this.current = -1;
    this.searched = null;   // the blocks the matches were found in
    this.bar = $("find");
    this.input = $("find-input");
    this.count = $("find-count");
    this.input.addEventListener("input", () => this.search(true));
    this.input.addEventListener("keydown", (e) => {
      if (e.key === "Enter") { e.preventDefault(); this.step(e.shiftKey ? -1 : 1); }
      else if (e.key === "Escape") { e.preventDefault(); this.close(); }
    });
    $("find-open").addEventListener("click", () => this.open());
    $("find-next").addEventListener("click", () => this.step(1));
    $("find-prev").addEventListener("click", () => this.step(-1));
    $("find-close").addEventListener("click", () => this.close());
  }

  get isOpen() {
    return !this.bar.hidden;
  }

  onKeydown(e) {
    if ((e.ctrlKey || e.metaKey) && !e.altKey && e.key.toLowerCase() === "f" && this.viewer.view !== null
        && !this.viewer.view.missing) {
      e.preventDefault();
      this.open();
    }
  }

  open() {
    this.bar.hidden = false;
    this.input.focus();
    this.input.select();
    if (this.input.value) this.search(false);
  }

  close() {
    if (!this.isOpen) return;
    this.bar.hidden = true;
    this.matches = [];
    this.current = -1;
    this.searched = null;
    this.viewer.transcript.mark(null);
    this.showCount();
  }

  // The query changed (jump to the first match from the end: the newest) or the blocks did.
  search(jump) {
    const blocks = this.viewer.transcript.blocks;
    const markedId = this.current >= 0 && this.searched ? this.searched[this.matches[this.current]].id : null;
    this.matches = findMatches(blocks, this.input.value);
    this.searched = blocks;
    this.current = markedId === null ? -1 : this.matches.findIndex((i) => blocks[i].id === markedId);
    if (jump && this.matches.length) {
      this.current = this.matches.length - 1;
      this.viewer.reveal(this.matches[this.current]);
    } else if (this.current < 0) {
      this.viewer.transcript.mark(null);
    }
    this.showCount();
  }

  step(direction) {
    if (this.searched !== this.viewer.transcript.blocks) this.search(false);
    if (!this.matches.length) return;
    const n = this.matches.length;
    this.current = this.current < 0 ? (direction > 0 ? 0 : n - 1) : (this.current + direction + n) % n;
    this.viewer.reveal(this.matches[this.current]);
    this.showCount();
  }

  // The blocks changed (a turn goes on): the count follows while the bar is open.
  refresh() {
    if (this.isOpen && this.input.value && this.searched !== this.viewer.transcript.blocks) this.search(false);
  }

  showCount() {
    const n = this.matches.length;
    this.count.textContent = !this.isOpen || !this.input.value.trim() ? ""
      : n === 0 ? "no match" : `${this.current < 0 ? "–" : this.current + 1} of ${n}`;
    this.bar.dataset.matches = String(n);
  }
}
