"""The viewer with a long transcript, in headless Chromium (only when named:
``python -m benchmarks viewer``; needs Debian's ``chromium`` and Playwright, the test extra).

A real daemon serves the page at 1280x900 with a session open and connected. The transcript is
then filled through the page's own store (``TranscriptStore.dispatch`` of wire-shaped
``session_update`` events, decoded by the page's ``events.js``): alternating prompts and
Markdown answers, one block each, up to 10,000 blocks. Measured at the baseline size (100
blocks) and at the full size, in the same run and the same page:

- append: a new prompt and its answer added at the end, from ``dispatch`` to the DOM updated
  and laid out (the page's ``render`` plus a forced layout);
- stream: one more chunk into the streaming answer at the end (its Markdown re-parsed and the
  node rebuilt), dispatch to layout;
- scroll: the transcript scrolled from the bottom towards the top, 800 px per frame (at most
  150 frames); the time between animation frames while it scrolls (p95).

The network path is not in these figures (the e2e and load benchmarks measure it).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
from typing import Any

from benchmarks.harness import Context, Row
from benchmarks.launcher import start_daemon

NAME = "viewer"
TITLE = "viewer: append, stream and scroll with 10,000 blocks (headless Chromium)"
BASE_BLOCKS = 100
SCROLL_FRAMES = 150  # at most: 120,000 px from the bottom, a few minutes at worst
APPEND_TARGET_MS = 16.7  # one frame at 60 Hz
SCROLL_TARGET_RATIO = 1.5

# Runs in the page: fill, then time appends, chunks and a scroll. Returns the samples in ms.
_MEASURE = """
async ([target, appends, sessionId, maxFrames]) => {
  const { eventFromMapping } = await import("/ui/events.js");
  const viewer = window.turnkeeperViewer;
  const box = document.getElementById("transcript");
  const frame = () => new Promise((resolve) => requestAnimationFrame(() => resolve()));
  let id = 1e6 + viewer.store.blocks.length;
  const update = (promptId, kind, text) => eventFromMapping({
    v: 1, id: ++id, type: "session_update", sessionId, promptId,
    data: { sessionId, update: { sessionUpdate: kind, content: { type: "text", text } } } });
  const answer = (i) => `Step ${i}: read **README.md**, then:\\n\\n- \\`make serve\\`\\n- \\`make test\\`\\n`;
  const pair = (i) => {
    const promptId = `bench-${i}`;
    viewer.store.dispatch(update(promptId, "user_message_chunk", `Prompt number ${i}`));
    viewer.store.dispatch(update(promptId, "agent_message_chunk", answer(i)));
  };
  let n = 0;
  while (viewer.store.blocks.length < target) pair(n++);
  viewer.render();
  void box.scrollHeight;
  await frame();
  const appendMs = [];
  const streamMs = [];
  for (let k = 0; k < appends; k++) {
    let t0 = performance.now();
    pair(n++);
    viewer.render();
    void box.scrollHeight;
    appendMs.push(performance.now() - t0);
    await frame();
    t0 = performance.now();
    viewer.store.dispatch(update(`bench-${n - 1}`, "agent_message_chunk", " and one more line."));
    viewer.render();
    void box.scrollHeight;
    streamMs.push(performance.now() - t0);
    await frame();
  }
  box.scrollTop = box.scrollHeight;
  await frame();
  const frames = [];
  let last = performance.now();
  while (box.scrollTop > 0 && frames.length < maxFrames) {
    box.scrollTop = Math.max(0, box.scrollTop - 800);
    await frame();
    const now = performance.now();
    frames.push(now - last);
    last = now;
  }
  return { blocks: viewer.store.blocks.length, nodes: document.querySelectorAll("#blocks > li").length,
           appendMs, streamMs, frames };
}
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--blocks", type=int, default=None,
                        help="transcript size (default 10,000; quick 2,000)")
    parser.add_argument("--appends", type=int, default=None,
                        help="appends and chunks timed per size (default 40; quick 10)")


def _p95(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]


def _measure(page: Any, size: int, appends: int, session_id: str) -> dict[str, Any]:
    result: dict[str, Any] = page.evaluate(_MEASURE, [size, appends, session_id, SCROLL_FRAMES])
    if result["nodes"] != result["blocks"]:
        raise RuntimeError(f"{result['blocks']} blocks but {result['nodes']} nodes in the page")
    return result


def run(ctx: Context, args: argparse.Namespace) -> list[Row]:
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise RuntimeError("chromium is not installed (apt-get install chromium)")
    size = args.blocks or ctx.pick(10_000, 2_000)
    appends = args.appends or ctx.pick(40, 10)
    results: dict[int, dict[str, Any]] = {}
    with start_daemon([], persistence=False) as daemon, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"])
        try:
            for blocks in (BASE_BLOCKS, size):  # a fresh page per size: the baseline first
                session_id, _client = daemon.create_session()
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                page.goto(f"{daemon.url}/ui/#session={session_id}")
                page.wait_for_selector("#connection[data-state='connected']", timeout=30_000)
                ctx.progress(f"{blocks} blocks: fill, {appends} appends and chunks, a scroll")
                results[blocks] = _measure(page, blocks, appends, session_id)
                page.close()
        finally:
            browser.close()
    base, full = results[BASE_BLOCKS], results[size]
    params = {"blocks": full["blocks"], "appends": appends, "viewport": "1280x900"}
    rows = []
    for key, label in (("appendMs", "append a prompt and its answer: dispatch -> laid out"),
                       ("streamMs", "one chunk into the streaming answer: dispatch -> laid out")):
        row = Row(benchmark=NAME, name=label, params=params, unit="ms", samples=full[key],
                  quick=ctx.quick)
        row.baseline = statistics.median(base[key])
        row.baseline_label = f"{base['blocks']} blocks"
        row.ratio = (row.value or 0.0) / row.baseline if row.baseline else None
        row.target = f"<= {APPEND_TARGET_MS:g} ms (one frame)"
        row.ok = _p95(full[key]) <= APPEND_TARGET_MS
        row.notes.append(f"p95 {_p95(full[key]):.2f} ms at {full['blocks']} blocks, "
                         f"{_p95(base[key]):.2f} ms at {base['blocks']}")
        rows.append(row)
    scroll = Row(benchmark=NAME, name="scroll bottom -> top, 800 px a frame: frame interval p95",
                 params={**params, "frames": len(full["frames"])}, unit="ms",
                 samples=full["frames"], value=_p95(full["frames"]), quick=ctx.quick)
    scroll.baseline = _p95(base["frames"])
    scroll.baseline_label = f"{base['blocks']} blocks"
    scroll.ratio = (scroll.value or 0.0) / scroll.baseline if scroll.baseline else None
    scroll.target = f"<= {SCROLL_TARGET_RATIO:g}x the baseline"
    scroll.ok = scroll.ratio is not None and scroll.ratio <= SCROLL_TARGET_RATIO
    rows.append(scroll)
    return rows
