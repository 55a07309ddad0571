"""The viewer with a long transcript, in headless Chromium (only when named:
``python -m benchmarks viewer``; needs Debian's ``chromium`` and Playwright, the test extra).

A real daemon serves the page at 1280x900 with a session open and connected. The transcript is
then filled through the page's own store (``TranscriptStore.dispatch`` of wire-shaped
``session_update`` events, decoded by the page's ``events.js``): alternating prompts and
Markdown answers, one block each, up to 10,000 blocks. Measured at the baseline size (100
blocks) and at the full size, in the same run, each step in a frame of its own:

- append: a new prompt and its answer added at the end (two dispatches and the view's render);
- chunk: one more chunk into the streaming answer at the end (its Markdown re-parsed and the
  node rebuilt);
- scroll: the transcript scrolled from the bottom towards the top, 800 px per frame (at most
  150 frames);
- an empty frame: the measuring alone, the floor every other figure includes.

Each of ``--trials`` trials (default 3) measures both sizes on fresh pages; a row's value is the
median of the trials' p95s, its spread their range, and its notes list every trial's p95.
The transcript is windowed (``daemon/ui/transcript_window.js``): the run fails if the page holds
no block node or more than ``MAX_LIVE_BLOCKS`` of them at the end.

A step's figure is its frame's work: the CPU time of the page's renderer main thread from
the step's start (in a ``requestAnimationFrame`` callback) to the end of that frame's rendering
update (style, layout, paint), read from ``/proc`` around the step. CPU time, not wall time: on
a loaded machine a frame's wall time is mostly waiting for a core (the wall p95 is in the
notes). Rasterising runs on other threads and is not in the figures; nor is the network path
(the e2e and load benchmarks measure it).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
from typing import Any

from benchmarks.harness import Context, Row
from benchmarks.launcher import descendants, start_daemon

NAME = "viewer"
TITLE = "viewer: append, stream and scroll with 10,000 blocks (headless Chromium)"
BASE_BLOCKS = 100
SCROLL_FRAMES = 150  # at most: 120,000 px from the bottom, a few minutes at worst
FRAME_MS = 16.7  # one frame at 60 Hz
RATIO_TARGET = 1.5  # against the baseline size, measured in the same run
MAX_LIVE_BLOCKS = 200  # block nodes in the page, whatever the transcript's length (windowed)

# Installed in the page: fills the transcript, then runs one timed step per call. A step runs in
# a requestAnimationFrame callback (a dispatch and the view's render, or a scroll) and ends at a
# message posted from it, which the page handles only after that frame's rendering update
# (style, layout, paint on the main thread). Resolves with the step's wall time in ms.
_SETUP = """
async ([target, sessionId]) => {
  const { eventFromMapping } = await import("/ui/events.js");
  const viewer = window.turnkeeperViewer;
  const box = document.getElementById("transcript");
  const frame = () => new Promise((resolve) => requestAnimationFrame(() => resolve()));
  const channel = new MessageChannel();
  const frameWork = (step) => new Promise((resolve) => requestAnimationFrame(() => {
    const t0 = performance.now();
    step();
    channel.port1.onmessage = () => resolve(performance.now() - t0);
    channel.port2.postMessage(null);
  }));
  let id = 1e6 + viewer.store.blocks.length;
  const update = (promptId, kind, text) => eventFromMapping({
    v: 1, id: ++id, type: "session_update", sessionId, promptId,
    data: { sessionId, update: { sessionUpdate: kind, content: { type: "text", text } } } });
  const answer = (i) => `Step ${i}: read **README.md**, then:\\n\\n- \\`make serve\\`\\n- \\`make test\\`\\n`;
  let n = 0;
  const pair = () => {
    const promptId = `bench-${n++}`;
    viewer.store.dispatch(update(promptId, "user_message_chunk", `Prompt number ${n}`));
    viewer.store.dispatch(update(promptId, "agent_message_chunk", answer(n)));
  };
  const steps = {
    idle: () => {},
    append: () => { pair(); viewer.render(); },
    chunk: () => {
      viewer.store.dispatch(update(`bench-${n - 1}`, "agent_message_chunk", " and one more line."));
      viewer.render();
    },
    scroll: () => { box.scrollTop = Math.max(0, box.scrollTop - 800); },
  };
  while (viewer.store.blocks.length < target) pair();
  viewer.render();
  box.scrollTop = box.scrollHeight;
  await frame();
  await frame();
  window.turnkeeperBench = {
    step: (kind) => frameWork(steps[kind]),
    bottom: async () => { box.scrollTop = box.scrollHeight; await frame(); await frame(); },
    atTop: () => box.scrollTop <= 0,
    counts: () => ({ blocks: viewer.store.blocks.length,
                     nodes: document.querySelectorAll("#blocks li.block").length,
                     elements: document.getElementsByTagName("*").length }),
  };
}
"""


class MainThreadClock:
    """CPU time of the page's renderer main thread (``/proc/PID/schedstat``, in ns): the work
    a step cost, without the time the thread waited for a core (on a loaded machine the wall
    time of a frame is mostly that)."""

    def __init__(self, pid: int) -> None:
        self.path = f"/proc/{pid}/task/{pid}/schedstat"

    def ns(self) -> int:
        with open(self.path) as f:
            return int(f.read().split()[0])

    @staticmethod
    def renderers() -> dict[int, int]:
        found = {}
        for pid in descendants(os.getpid()):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmdline = f.read()
                if b"--type=renderer" not in cmdline or b"--top-chrome-webui" in cmdline:
                        continue
                found[pid] = MainThreadClock(pid).ns()
            except (OSError, ValueError):
                continue
        return found


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--blocks", type=int, default=None,
                        help="transcript size (default 10,000; quick 2,000)")
    parser.add_argument("--appends", type=int, default=None,
                        help="appends and chunks timed per size (default 40; quick 10)")


def _p95(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]


def _measure(page: Any, size: int, appends: int, session_id: str,
             ctx: Context) -> dict[str, Any]:
    page.evaluate(_SETUP, [size, session_id])
    # The page's renderer: the one whose main thread grows most while the page spins through
    # a fixed amount of work (about 100 ms of CPU), far more than any other's (tried 3 times:
    # the browser's own renderers are busy for a moment after a page opens).
    for _ in range(3):
        before = MainThreadClock.renderers()
        page.evaluate("() => { let x = 0; for (let i = 0; i < 3e7; i++) x = (x + i) % 7919; }")
        after = MainThreadClock.renderers()
        grown = sorted(((ns - before.get(pid, ns), pid) for pid, ns in after.items()),
                       reverse=True)
        if grown and (len(grown) == 1 or grown[0][0] > 5 * grown[1][0] + 1e6):
            break
    else:
        raise RuntimeError(f"no single busy Chromium renderer: {grown}")
    clock = MainThreadClock(grown[0][1])

    def step(kind: str) -> tuple[float, float]:
        t0 = clock.ns()
        wall = float(page.evaluate("(kind) => window.turnkeeperBench.step(kind)", kind))
        return (clock.ns() - t0) / 1e6, wall

    out: dict[str, Any] = {key: [] for key in ("idle", "append", "chunk", "scroll")}
    walls: dict[str, list[float]] = {key: [] for key in out}
    for _ in range(appends):
        for kind in ("idle", "append", "chunk"):
            cpu, wall = step(kind)
            out[kind].append(cpu)
            walls[kind].append(wall)
    page.evaluate("() => window.turnkeeperBench.bottom()")
    while len(out["scroll"]) < SCROLL_FRAMES and not page.evaluate(
            "() => window.turnkeeperBench.atTop()"):
        cpu, wall = step("scroll")
        out["scroll"].append(cpu)
        walls["scroll"].append(wall)
    counts = page.evaluate("() => window.turnkeeperBench.counts()")
    if not 0 < counts["nodes"] <= MAX_LIVE_BLOCKS:
        raise RuntimeError(f"{counts['nodes']} block nodes in the page ({counts['blocks']} blocks): "
                           f"the window holds 1 to {MAX_LIVE_BLOCKS}")
    ctx.progress(f"{counts['blocks']} blocks: main-thread CPU medians (ms) "
                 + ", ".join(f"{k} {statistics.median(v):.2f}" for k, v in out.items()))
    return {"blocks": counts["blocks"], **out, "walls": walls}


def run(ctx: Context, args: argparse.Namespace) -> list[Row]:
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise RuntimeError("chromium is not installed (apt-get install chromium)")
    size = args.blocks or ctx.pick(10_000, 2_000)
    appends = args.appends or ctx.pick(40, 10)
    trials = ctx.trials(3)  # --trials: each trial measures both sizes on fresh pages
    runs: dict[int, list[dict[str, Any]]] = {BASE_BLOCKS: [], size: []}
    with start_daemon([], persistence=False) as daemon, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"])
        try:
            for trial in range(trials):
                for blocks in (BASE_BLOCKS, size):  # a fresh page per size: the baseline first
                    session_id, _client = daemon.create_session()
                    page = browser.new_page(viewport={"width": 1280, "height": 900})
                    page.goto(f"{daemon.url}/ui/#session={session_id}")
                    page.wait_for_selector("#connection[data-state='connected']", timeout=30_000)
                    ctx.progress(f"trial {trial + 1}/{trials}, {blocks} blocks: fill, {appends} "
                                 "appends and chunks, a scroll")
                    runs[blocks].append(_measure(page, blocks, appends, session_id, ctx))
                    page.close()
        finally:
            browser.close()
    base, full = runs[BASE_BLOCKS], runs[size]
    params = {"blocks": full[0]["blocks"], "appends": appends, "trials": trials,
              "viewport": "1280x900"}
    rows = []
    for key, label in (("append", "append a prompt and its answer: frame work p95"),
                       ("chunk", "one chunk into the streaming answer: frame work p95"),
                       ("scroll", "scroll bottom -> top, 800 px a frame: frame work p95"),
                       ("idle", "an empty frame (the measuring alone): frame work p95")):
        # One p95 per trial; the row's value is their median, its spread their range.
        full_p95 = [_p95(r[key]) for r in full]
        base_p95 = [_p95(r[key]) for r in base]
        row = Row(benchmark=NAME, name=label, params=params, unit="ms", samples=full_p95,
                  quick=ctx.quick)
        row.baseline = statistics.median(base_p95)
        row.baseline_label = f"{base[0]['blocks']} blocks"
        row.ratio = (row.value or 0.0) / row.baseline if row.baseline else None
        if key != "idle":  # the floor every other row includes: informational
            row.target = f"<= {FRAME_MS:g} ms and <= {RATIO_TARGET:g}x the baseline"
            row.ok = (row.value or 0.0) <= FRAME_MS and row.ratio is not None \
                and row.ratio <= RATIO_TARGET
        row.notes.append(
            f"p95 per trial (ms): {', '.join(f'{v:.1f}' for v in full_p95)} at "
            f"{full[0]['blocks']} blocks, {', '.join(f'{v:.1f}' for v in base_p95)} at "
            f"{base[0]['blocks']}; main-thread CPU median "
            f"{statistics.median(v for r in full for v in r[key]):.2f} ms and "
            f"{statistics.median(v for r in base for v in r[key]):.2f} ms "
            f"({sum(len(r[key]) for r in full)} samples); wall p95 "
            f"{statistics.median(_p95(r['walls'][key]) for r in full):.1f} ms and "
            f"{statistics.median(_p95(r['walls'][key]) for r in base):.1f} ms")
        rows.append(row)
    return rows
