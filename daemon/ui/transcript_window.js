// The transcript's blocks as DOM, windowed: only the blocks near the viewport have nodes.
//
// Blocks are grouped in chunks (at most CHUNK_BLOCKS consecutive blocks). A contiguous run of
// chunks is live: each an <ol class="chunk"> holding its blocks' nodes. The chunks before and
// after it have no nodes at all: a spacer above and one below stand for them, as tall as those
// chunks were when last shown, or as estimated (block count times the mean height of the blocks
// measured so far). So the page holds a few dozen block nodes and a handful of elements in the
// list whether the transcript has a hundred blocks or ten thousand, and a frame's style, layout,
// paint and garbage collection do not grow with the transcript. Which chunks are live follows
// from the scroll position and the chunks' heights (nothing is measured in a scroll event):
// those in view, the ones within WINDOW_MARGIN_PX already live, and one more per frame coming
// into the margin, so no frame builds many. The spacers are siblings of the blocks, not their
// ancestors, so the browser's scroll anchoring keeps what is read in place when a chunk above
// turns out taller or shorter than its estimate. The whole transcript stays searchable through the viewer's own find (find.js), which
// searches the blocks, not the page.

import { el } from "./dom.js";
import { renderBlock } from "./render.js";

export const CHUNK_BLOCKS = 10;
export const WINDOW_MARGIN_PX = 1000;
const FIRST_ESTIMATE_PX = 110;   // a block's height before any block was measured

class Chunk {
  constructor(blocks, height) {
    this.blocks = blocks;     // the chunk's blocks, in order
    this.nodes = null;        // their nodes while live, by the same index
    this.el = null;           // its <ol> while live
    this.height = height;     // px: measured while live (kept after), else an estimate
    this.measured = 0;        // blocks the height was measured with (0: an estimate)
  }
}

export class TranscriptWindow {
  constructor(list, box, actions) {
    this.list = list;          // #blocks
    this.box = box;            // the scrolling element (#transcript)
    this.actions = actions;
    this.blocks = [];          // the blocks shown, in order
    this.chunks = [];
    this.lo = 0;               // the live chunks: lo..hi (none when hi < lo)
    this.hi = -1;
    this.marked = null;        // the id of the block find marks
    this.measuredPx = 0;       // the measured chunks' heights, summed...
    this.measuredBlocks = 0;   // ...and their blocks: the estimate for a block never shown
    this.hydrations = 0;       // chunks made live so far (for tests and the curious)
    this.tops = null;          // each chunk's offset in the list, and the list's height (cached)
    this.byElement = new WeakMap();
    this.above = el("div", { class: "spacer", "aria-hidden": "true" });
    this.below = el("div", { class: "spacer", "aria-hidden": "true" });
    this.resize = new ResizeObserver((entries) => this.measure(entries));
    this.onMeasured = null;
    this.list.replaceChildren(this.above, this.below);
  }

  // -- what is shown --

  // Show these blocks. Only changed blocks are rebuilt (a block is frozen: a changed block is
  // a new object), and only if their chunk is live. When the blocks shown before are still
  // there in order, with new ones after them (a turn goes on) or before them (a history page),
  // the chunks are kept; otherwise they are made again (none live). Returns whether anything
  // changed. Call update() after it.
  show(blocks) {
    const old = this.blocks;
    const n = blocks.length;
    const m = old.length;
    const alignedAt = (offset) => {
      for (let i = 0; i < m; i += 1) if (blocks[i + offset].id !== old[i].id) return false;
      return true;
    };
    let offset = null;
    if (n >= m && alignedAt(0)) offset = 0;
    else if (n > m && alignedAt(n - m)) offset = n - m;
    this.blocks = blocks;
    if (offset === null) {
      this.clear();
      this.tops = null;
      this.blocks = blocks;
      for (let i = 0; i < n; i += CHUNK_BLOCKS) this.chunks.push(this.chunk(blocks.slice(i, i + CHUNK_BLOCKS)));
      this.list.replaceChildren(this.above, this.below);
      this.spacers();
      return true;
    }
    let changed = false;
    let i = 0;
    for (const chunk of this.chunks) {
      for (let j = 0; j < chunk.blocks.length; j += 1, i += 1) {
        const b = blocks[i + offset];
        if (b === chunk.blocks[j]) continue;
        chunk.blocks[j] = b;
        changed = true;
        if (chunk.nodes !== null) {
          const node = this.node(b);
          chunk.nodes[j].replaceWith(node);
          chunk.nodes[j] = node;
        }
      }
    }
    if (n > m) {
      if (offset === 0) this.append(blocks.slice(m));
      else this.prepend(blocks.slice(0, n - m));
      this.tops = null;
      this.spacers();
      changed = true;
    }
    return changed;
  }

  // New blocks at the end fill the last chunk, then new chunks.
  append(fresh) {
    let k = 0;
    const last = this.chunks[this.chunks.length - 1];
    if (last !== undefined && last.blocks.length < CHUNK_BLOCKS) {
      const take = fresh.slice(0, CHUNK_BLOCKS - last.blocks.length);
      k = take.length;
      last.blocks.push(...take);
      if (last.nodes !== null) {
        const nodes = take.map((b) => this.node(b));
        last.nodes.push(...nodes);
        last.el.append(...nodes);
      } else this.estimate(last);
    }
    for (; k < fresh.length; k += CHUNK_BLOCKS) this.chunks.push(this.chunk(fresh.slice(k, k + CHUNK_BLOCKS)));
  }

  // An older page fills the first chunk from its front, then new chunks before it.
  prepend(fresh) {
    let k = fresh.length;
    const first = this.chunks[0];
    if (first !== undefined && first.blocks.length < CHUNK_BLOCKS) {
      const take = fresh.slice(Math.max(0, k - (CHUNK_BLOCKS - first.blocks.length)));
      k -= take.length;
      first.blocks.unshift(...take);
      if (first.nodes !== null) {
        const nodes = take.map((b) => this.node(b));
        first.nodes.unshift(...nodes);
        first.el.prepend(...nodes);
      } else this.estimate(first);
    }
    const added = [];
    for (; k > 0; k -= CHUNK_BLOCKS) added.unshift(this.chunk(fresh.slice(Math.max(0, k - CHUNK_BLOCKS), k)));
    this.chunks.unshift(...added);
    this.lo += added.length;
    this.hi += added.length;
  }

  clear() {
    for (let c = this.lo; c <= this.hi; c += 1) this.resize.unobserve(this.chunks[c].el);
    this.chunks = [];
    this.blocks = [];
    this.lo = 0;
    this.hi = -1;
    this.measuredPx = 0;
    this.measuredBlocks = 0;
    this.tops = null;
    this.list.replaceChildren(this.above, this.below);
    this.spacers();
  }

  // -- the window --

  // Make live the chunks in view (and `keep`, a chunk index that must have nodes now), keep the
  // live ones within the margin, and add at most one more within it (the nearest to the view).
  // Reads the scroll position and the list's offset: call it where layout is clean (a scroll
  // event, a resize observation) or where a layout is due anyway. Returns whether a chunk within
  // the margin is still to be made live (the caller asks again next frame).
  update(keep = null) {
    const count = this.chunks.length;
    if (count === 0) return false;
    const box = this.box;
    const listTop = this.list.getBoundingClientRect().top - box.getBoundingClientRect().top + box.scrollTop;
    const top = box.scrollTop - listTop;
    const bottom = top + box.clientHeight;
    const tops = this.offsets();
    const end = (c) => tops[c] + this.chunks[c].height;
    // The first chunk that ends within the margin above the view (a binary search: a scroll
    // frame costs the same with 10 chunks or 1,000), then the chunks from there to the margin
    // below it.
    let a = 0;
    let b = count;
    while (a < b) {
      const mid = (a + b) >> 1;
      if (end(mid) >= top - WINDOW_MARGIN_PX) b = mid; else a = mid + 1;
    }
    let vlo = -1; let vhi = -1; let mlo = -1; let mhi = -1;
    for (let c = a; c < count && tops[c] <= bottom + WINDOW_MARGIN_PX; c += 1) {
      if (mlo < 0) mlo = c;
      mhi = c;
      if (end(c) >= top && tops[c] <= bottom) { if (vlo < 0) vlo = c; vhi = c; }
    }
    if (vlo < 0) {   // nothing in view (above the first chunk or below the last)
      vlo = vhi = top < 0 ? 0 : count - 1;
      if (mlo < 0) { mlo = vlo; mhi = vhi; }
    }
    if (keep !== null) { vlo = Math.min(vlo, keep); vhi = Math.max(vhi, keep); mlo = Math.min(mlo, vlo); mhi = Math.max(mhi, vhi); }
    let lo = vlo; let hi = vhi;
    if (this.hi >= this.lo && this.lo <= vhi + 1 && this.hi >= vlo - 1) {   // overlaps or touches
      lo = Math.max(mlo, Math.min(this.lo, vlo));
      hi = Math.min(mhi, Math.max(this.hi, vhi));
    }
    const upward = lo > mlo ? top - end(lo - 1) : Infinity;
    const downward = hi < mhi ? tops[hi + 1] - bottom : Infinity;
    if (upward <= downward && upward !== Infinity) lo -= 1;
    else if (downward !== Infinity) hi += 1;
    this.setRange(lo, hi);
    return lo > mlo || hi < mhi;
  }

  // Each chunk's offset in the list (chunk heights and the gaps between them), and the end:
  // made again only when a height or the chunks change.
  offsets() {
    if (this.tops === null) {
      const gap = this.gap();
      const tops = new Float64Array(this.chunks.length + 1);
      let y = 0;
      for (let c = 0; c < this.chunks.length; c += 1) {
        tops[c] = y;
        y += this.chunks[c].height + gap;
      }
      tops[this.chunks.length] = y;
      this.tops = tops;
    }
    return this.tops;
  }

  // The node of the block at this index, made live if it was not (find, scroll anchors).
  nodeAt(index) {
    let i = 0;
    for (let c = 0; c < this.chunks.length; c += 1) {
      const chunk = this.chunks[c];
      if (index < i + chunk.blocks.length) {
        if (chunk.nodes === null) {
          if (this.hi >= this.lo && c >= this.lo - 1 && c <= this.hi + 1) this.setRange(Math.min(c, this.lo), Math.max(c, this.hi));
          else this.setRange(c, c);
        }
        return chunk.nodes[index - i];
      }
      i += chunk.blocks.length;
    }
    return null;
  }

  // The live nodes with their blocks, in order.
  *liveNodes() {
    for (let c = this.lo; c <= this.hi; c += 1) {
      const chunk = this.chunks[c];
      for (let j = 0; j < chunk.nodes.length; j += 1) yield [chunk.blocks[j], chunk.nodes[j]];
    }
  }

  // Find marks one block (its node carries .found while live, also when built again).
  mark(id) {
    this.marked = id;
    for (const [b, node] of this.liveNodes()) node.classList.toggle("found", b.id === id);
  }

  // For tests and the curious: the chunks' blocks and heights, and which are live.
  describe() {
    return { lo: this.lo, hi: this.hi, hydrations: this.hydrations,
      chunks: this.chunks.map((c) => ({ ids: c.blocks.map((b) => b.id), live: c.nodes !== null,
        height: c.height, measured: c.measured > 0 })) };
  }

  // -- chunks --

  chunk(blocks) {
    const chunk = new Chunk(blocks, 0);
    chunk.height = this.estimateFor(chunk);
    return chunk;
  }

  node(b) {
    const node = renderBlock(b, this.actions);
    if (b.id === this.marked) node.classList.add("found");
    return node;
  }

  // Live exactly the chunks lo..hi (in the list between the spacers, in order).
  setRange(lo, hi) {
    if (lo === this.lo && hi === this.hi) return;
    for (let c = this.lo; c <= this.hi; c += 1) if (c < lo || c > hi) this.dehydrate(this.chunks[c]);
    const before = [];
    const after = [];
    for (let c = lo; c <= hi; c += 1) {
      const chunk = this.chunks[c];
      if (chunk.nodes !== null) continue;
      this.hydrate(chunk);
      (this.hi < this.lo || c < this.lo ? before : after).push(chunk.el);
    }
    if (this.hi < this.lo) this.above.after(...before);
    else {
      if (before.length) this.above.after(...before);
      if (after.length) this.below.before(...after);
    }
    this.lo = lo;
    this.hi = hi;
    this.spacers();
  }

  hydrate(chunk) {
    this.hydrations += 1;
    chunk.nodes = chunk.blocks.map((b) => this.node(b));
    chunk.el = el("ol", { class: "chunk" }, ...chunk.nodes);
    this.byElement.set(chunk.el, chunk);
    this.resize.observe(chunk.el);
  }

  dehydrate(chunk) {
    this.resize.unobserve(chunk.el);
    chunk.el.remove();
    chunk.el = null;
    chunk.nodes = null;
  }

  // The spacers stand for the chunks before and after the live ones (with the gaps between).
  spacers() {
    const gap = this.gap();
    const tops = this.offsets();
    const count = this.chunks.length;
    const live = this.hi >= this.lo;
    const above = live ? tops[this.lo] : tops[count];
    const below = live ? tops[count] - tops[this.hi + 1] : 0;
    this.above.hidden = above === 0;
    this.above.style.height = `${Math.max(0, above - gap)}px`;
    this.below.hidden = below === 0;
    this.below.style.height = `${Math.max(0, below - gap)}px`;
  }

  // A chunk not live whose blocks changed in number: a measured height no longer holds for it.
  estimate(chunk) {
    if (chunk.measured) { this.measuredPx -= chunk.height; this.measuredBlocks -= chunk.measured; }
    chunk.measured = 0;
    chunk.height = this.estimateFor(chunk);
    this.tops = null;
  }

  estimateFor(chunk) {
    const per = this.measuredBlocks > 0 ? this.measuredPx / this.measuredBlocks : FIRST_ESTIMATE_PX;
    return Math.round(chunk.blocks.length * per);
  }

  measure(entries) {
    let changed = false;
    for (const entry of entries) {
      const chunk = this.byElement.get(entry.target);
      if (chunk === undefined || chunk.el !== entry.target) continue;
      const size = entry.borderBoxSize && entry.borderBoxSize[0];
      const height = size ? size.blockSize : entry.target.offsetHeight;
      if (chunk.measured) { this.measuredPx -= chunk.height; this.measuredBlocks -= chunk.measured; }
      if (height !== chunk.height) { changed = true; this.tops = null; }
      chunk.height = height;
      chunk.measured = chunk.blocks.length;
      this.measuredPx += height;
      this.measuredBlocks += chunk.blocks.length;
    }
    if (changed && this.onMeasured) this.onMeasured();
  }

  gap() {
    if (this.gapPx === undefined) this.gapPx = parseFloat(getComputedStyle(this.list).rowGap) || 0;
    return this.gapPx;
  }
}
