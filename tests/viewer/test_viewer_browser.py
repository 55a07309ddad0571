"""The web viewer (``/ui/``) in a real headless Chromium, against the real daemon and mock agent.

One daemon (token auth, live-journal caps of 3 entries / 300 bytes so a 20-chunk turn
overflows) and one browser serve every scenario; each scenario makes its own session. The
browser talks to the daemon through the fault proxy (``tests/fault_proxy.py``, run in its own
thread): it counts every request that reaches the daemon (loads per session) and can cut the
event streams. Model prompts are counted in the mock's prompt log. Waits are on DOM conditions
and the daemon's status, never sleeps. Pages are 1280x900 (desktop) or 400x800 (phone); a
screenshot of each scenario goes to ``tests/artifacts/`` (git-ignored);
``TURNKEEPER_UPDATE_SCREENSHOT=1`` also refreshes the images docs/viewer.md shows.

Chromium: Debian's ``chromium`` (``make test`` installs it when run as root), driven by
Playwright's bundled driver; no browser download.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from sdk._truncation import parse_truncation, status_text
from sdk.protocol.constants import AGENT_CONTEXT_LOST
from tests.fault_proxy import Chaos, ChaosKind, FaultProxy, Request
from tests.harness import RunningDaemon, start_daemon

pytestmark = pytest.mark.processes  # starts processes: not in make unit-fast

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed "
                               "(pip install -e '.[test]')")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None:
    pytest.skip("chromium is not installed (apt-get install chromium; `make test` does it as "
                "root)", allow_module_level=True)

TOKEN = "viewer-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "tests" / "artifacts"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
WAIT_MS = 20_000
WAIT_S = 20.0
DESKTOP = {"width": 1280, "height": 900}
PHONE = {"width": 400, "height": 800}


# --- the proxy in its own thread (Playwright's sync API owns the test thread) -------------------


class ProxyThread:
    def __init__(self, upstream: str) -> None:
        self.proxy = FaultProxy(upstream)
        self._ready = threading.Event()
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._thread = threading.Thread(target=trio.run, args=(self._main,), daemon=True)

    async def _main(self) -> None:
        self._stop = trio.Event()
        async with trio.open_nursery() as nursery:
            await nursery.start(self.proxy.run)
            self._token = trio.lowlevel.current_trio_token()
            self._ready.set()
            await self._stop.wait()
            nursery.cancel_scope.cancel()

    def __enter__(self) -> ProxyThread:
        self._thread.start()
        assert self._ready.wait(10), "the fault proxy did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._stop is not None
        trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
        self._thread.join(10)

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return trio.from_thread.run_sync(fn, *args, trio_token=self._token)

    @property
    def url(self) -> str:
        return self.proxy.url

    def loads(self, session_id: str) -> int:
        return int(self.call(self.proxy.count, "POST", rf"^/session/{session_id}/load$"))

    def streams(self, session_id: str) -> int:
        return int(self.call(self.proxy.count, "GET", rf"^/session/{session_id}/events$"))

    def sever(self) -> int:
        return int(self.call(self.proxy.sever_streams))


# --- fixtures --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    base = tmp_path_factory.mktemp("viewer")
    d = start_daemon(base, ["--token", TOKEN, "--max-journal-events", "3",
                            "--max-journal-bytes", "300"])
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture(scope="module")
def proxy(daemon: RunningDaemon) -> Iterator[ProxyThread]:
    with ProxyThread(daemon.url) as p:
        yield p


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def api(daemon: RunningDaemon) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=daemon.url, headers=AUTH, timeout=10) as client:
        yield client


@contextlib.contextmanager
def new_page(browser: Any, name: str, viewport: dict[str, int] = DESKTOP) -> Iterator[Any]:
    """A page in a fresh context (its own storage); no uncaught error or rejection allowed."""
    context = browser.new_context(viewport=viewport)
    p = context.new_page()
    p.set_default_timeout(WAIT_MS)
    errors: list[str] = []
    p.on("pageerror", lambda exc: errors.append(str(exc)))
    # The page turns an unhandled rejection into a notice; one showing is a failure too.
    try:
        yield p
        unexpected = p.locator("#notices li[data-notice='viewer.unexpected']")
        if unexpected.count():
            errors.append(str(unexpected.first.get_attribute("title")))
    finally:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        p.screenshot(path=str(ARTIFACTS / f"{name}-{viewport['width']}.png"))
        context.close()
    assert not errors, f"uncaught errors in the page: {errors}"


@pytest.fixture
def page(browser: Any, request: pytest.FixtureRequest) -> Iterator[Any]:
    with new_page(browser, request.node.name) as p:
        yield p


@pytest.fixture
def phone(browser: Any, request: pytest.FixtureRequest) -> Iterator[Any]:
    with new_page(browser, request.node.name, PHONE) as p:
        yield p


# --- helpers ----------------------------------------------------------------------------------


def new_session(api: httpx.Client) -> str:
    resp = api.post("/session", json={"sessionScope": "thread"})
    resp.raise_for_status()
    return str(resp.json()["sessionId"])


def send_prompt(api: httpx.Client, session_id: str, text: str) -> str:
    resp = api.post(f"/session/{session_id}/prompt",
                    json={"prompt": [{"type": "text", "text": text}]})
    assert resp.status_code == 202, resp.text
    return str(resp.json()["promptId"])


def wait_status(api: httpx.Client, session_id: str, pred: Callable[[dict[str, Any]], bool],
                what: str) -> dict[str, Any]:
    """Poll the daemon's own status route until ``pred`` holds (bounded deadline)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        status = api.get(f"/session/{session_id}/status").json()
        if pred(status):
            return status
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}: {status}")
        time.sleep(0.02)  # polling interval of a bounded status poll, not a synchronisation


def open_viewer(page: Any, proxy: ProxyThread, session_id: str | None = None) -> None:
    """Load /ui/ through the proxy, give the token once, wait until the viewer is ready (and,
    with a session, until its event stream is connected)."""
    url = f"{proxy.url}/ui/" + (f"#session={session_id}" if session_id else "")
    page.goto(url)
    page.wait_for_selector("#token-dialog[open]")
    page.fill("#token-input", TOKEN)
    page.click("#token-submit")
    page.wait_for_selector("body[data-ready='true']")
    assert TOKEN not in page.url
    if session_id is not None and "&" not in session_id:
        page.wait_for_selector("#connection[data-state='connected'], "
                               "#connection[data-state='repairing'], "
                               "#connection[data-state='missing']")


def pill(page: Any) -> tuple[str, str]:
    """The connection pill's state and what it says."""
    node = page.locator("#connection")
    return str(node.get_attribute("data-state")), node.inner_text().strip()


def record_pill_states(page: Any) -> None:
    """From now on, remember every state and text the pill shows (window.__pill)."""
    page.evaluate("""() => {
        window.__pill = [];
        const node = document.getElementById('connection');
        const note = () => window.__pill.push([node.dataset.state, node.innerText.trim()]);
        note();
        new MutationObserver(note).observe(node, {attributes: true, childList: true,
                                                  subtree: true, characterData: true});
    }""")


def session_row(page: Any, sid: str) -> Any:
    return page.locator(f"#session-groups li[data-session='{sid}']")


def blocks(page: Any, kind: str) -> list[str]:
    # The blocks in the page: the transcript is windowed, so these are the blocks near the
    # viewport (every block of the short transcripts these tests make).
    return list(page.locator(f"#blocks li.block[data-kind='{kind}'] .text").all_text_contents())


def stats(page: Any) -> dict[str, int]:
    return dict(page.evaluate("() => window.turnkeeperViewer.stats"))


def prompts_with(daemon: RunningDaemon, needle: str) -> int:
    return sum(1 for line in daemon.prompts() if needle in json.loads(line)["text"])


# --- scenarios --------------------------------------------------------------------------------


def test_static_files_need_no_token_but_every_api_call_does(daemon: RunningDaemon) -> None:
    with httpx.Client(base_url=daemon.url, timeout=10) as anon:
        index = anon.get("/ui/")
        assert index.status_code == 200 and "text/html" in index.headers["content-type"]
        assert "connect-src 'self'" in index.headers["content-security-policy"]
        assert anon.get("/ui/app.js").headers["content-type"].startswith("text/javascript")
        assert anon.get("/ui").status_code == 308
        assert anon.get("/ui/nope.js").json()["code"] == "route_not_found"
        assert anon.get("/ui/%2e%2e/config.py").status_code == 404  # names, never paths
        assert anon.get("/daemon/status").status_code == 401
        # The Host/Origin guard still runs before the static files.
        assert anon.get("/ui/", headers={"Host": "evil.example"}).status_code == 403
        assert anon.get("/ui/", headers={"Origin": "http://evil.example"}).status_code == 403
        # Same-origin (the page's own POSTs carry Origin) is allowed, with the token.
        own = daemon.url
        assert anon.post("/session", json={}, headers={"Origin": own}).status_code == 401
        assert anon.post("/session", json={}, headers={"Origin": own, **AUTH}).status_code == 200


def test_live_turn_streams_into_the_page(page: Any, proxy: ProxyThread, api: httpx.Client,
                                         daemon: RunningDaemon) -> None:
    sid = new_session(api)
    open_viewer(page, proxy, sid)
    session_row(page, sid).wait_for()
    page.fill("#prompt-input", "hello mock:chunks=5 mock:gate=live1")
    page.click("#send")
    page.wait_for_function(
        "() => [...document.querySelectorAll('#blocks li.assistant')].some("
        "li => li.textContent.includes('chunk-4'))")
    # One merged assistant block, still streaming while the gate holds the turn open.
    assert blocks(page, "assistant") == ["chunk-0chunk-1chunk-2chunk-3chunk-4"]
    assert page.locator("#blocks li.assistant.streaming").count() == 1
    assert blocks(page, "user") == ["hello mock:chunks=5 mock:gate=live1"]
    daemon.open_gate("live1")
    page.wait_for_selector("#blocks li.assistant:not(.streaming)")
    assert blocks(page, "assistant") == ["chunk-0chunk-1chunk-2chunk-3chunk-4"]
    assert proxy.loads(sid) == 1


def test_dropped_connection_resumes_without_gap_or_duplicate(
        page: Any, proxy: ProxyThread, api: httpx.Client, daemon: RunningDaemon) -> None:
    sid = new_session(api)
    open_viewer(page, proxy, sid)
    send_prompt(api, sid, "first mock:chunks=3")
    page.wait_for_selector("#blocks li.assistant:not(.streaming)")
    assert proxy.sever() >= 1
    # While the page is cut off, a whole second turn runs on the daemon.
    send_prompt(api, sid, "second mock:chunks=4")
    wait_status(api, sid, lambda s: not s["hasActivePrompt"] and s["pendingPrompts"] == 0,
                "the second turn to end")
    page.wait_for_function("() => document.querySelectorAll('#blocks li.assistant').length >= 2"
                           " && !document.querySelector('#blocks li.assistant.streaming')")
    assert blocks(page, "user") == ["first mock:chunks=3", "second mock:chunks=4"]
    assert blocks(page, "assistant") == ["chunk-0chunk-1chunk-2", "chunk-0chunk-1chunk-2chunk-3"]
    s = stats(page)
    assert s["resumes"] >= 1 and s["duplicatesDropped"] == 0, s
    assert proxy.streams(sid) >= 2 and proxy.loads(sid) == 1  # resumed, not reloaded


def test_mid_turn_truncation_then_one_repair(page: Any, proxy: ProxyThread, api: httpx.Client,
                                            daemon: RunningDaemon) -> None:
    sid = new_session(api)
    # An earlier turn taller than the window, so the user can scroll into the middle of it.
    send_prompt(api, sid, "earlier turn mock:chunks=40 mock:bytes=120")
    wait_status(api, sid, lambda s: not s["hasActivePrompt"], "the earlier turn to end")
    text = "long turn mock:chunks=20 mock:bytes=120 mock:gate=repair1"
    send_prompt(api, sid, text)
    wait_status(api, sid, lambda s: s["journal"]["truncatedEvents"] > 0
                and s["lastEventId"] >= 20, "the live journal to overflow")
    prompts_before = prompts_with(daemon, "mock:gate=repair1")
    load_bodies: list[dict[str, Any]] = []
    page.on("request", lambda r: load_bodies.append(json.loads(r.post_data or "{}"))
            if r.method == "POST" and r.url.endswith(f"/session/{sid}/load") else None)
    open_viewer(page, proxy, sid)
    marker = page.locator("#blocks li.source-history_truncated")
    marker.wait_for()
    # The exact SDK wording, computed by the Python SDK from the marker the daemon reports.
    live = page.evaluate("() => window.turnkeeperViewer.store.blocks"
                         ".filter(b => b.source === 'history_truncated').map(b => b.data)")
    assert len(live) == 1 and live[0]["scope"] == "live_journal"
    parsed = parse_truncation(live[0])
    assert parsed is not None
    assert marker.locator(".text").text_content() == status_text(parsed)
    assert status_text(parsed).startswith("History truncated for live turn replay: kept the latest")
    partial = blocks(page, "assistant")[-1]
    assert "chunk-0" not in partial and "chunk-19" in partial  # only the retained tail
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "mid_turn_truncated.png"))
    # The user types a draft and scrolls to the earlier turn, then the turn ends.
    page.fill("#prompt-input", "a draft the repair must keep")
    anchor_id = page.evaluate("""() => {
        const box = document.getElementById('transcript');
        const first = document.querySelector('#blocks li[data-kind=assistant]');
        box.scrollTop = first.offsetTop - box.offsetTop + 40;
        return first.dataset.id; }""")
    assert not page.evaluate("() => { const b = document.getElementById('transcript');"
                             " return b.scrollHeight - b.clientHeight - b.scrollTop < 30; }")
    offset = "(id) => document.querySelector(`#blocks li[data-id='${id}']`).getBoundingClientRect().top"
    before = page.evaluate(offset, anchor_id)
    assert page.evaluate("() => window.turnkeeperViewer.view.episode !== null")
    daemon.open_gate("repair1")
    page.wait_for_selector("body[data-repaired='1']")
    # The whole turn, once; no marker; exactly one extra load and no new agent prompt.
    assert marker.count() == 0
    repaired = blocks(page, "assistant")[-1]
    numbers = [int(n) for n in re.findall(r"chunk-(\d+)", repaired)]
    assert numbers == list(range(20)), numbers
    assert proxy.loads(sid) == 2
    # The open is a configured load; the repair is the one memory-replay load (no page size).
    assert [("historyPageSize" in body) for body in load_bodies] == [True, False], load_bodies
    assert prompts_with(daemon, "mock:gate=repair1") == prompts_before == 1
    assert page.input_value("#prompt-input") == "a draft the repair must keep"
    assert abs(page.evaluate(offset, anchor_id) - before) <= 2
    assert page.evaluate("() => window.turnkeeperViewer.lastRepair.from_checkpoint") is True
    s = stats(page)
    assert s["repairAttempts"] == 1 and s["repairs"] == 1 and s["repairFailures"] == 0, s
    assert page.locator("#notices li").count() == 0
    if os.environ.get("TURNKEEPER_UPDATE_SCREENSHOT") == "1":
        page.evaluate("() => { const b = document.getElementById('transcript');"
                      " b.scrollTop = b.scrollHeight; }")
        # The transcript pane only: the sidebar names this machine's temporary directories.
        page.locator("#main").screenshot(path=str(ROOT / "docs" / "viewer-repaired.png"))


def test_permission_request_answered_from_the_page(page: Any, proxy: ProxyThread,
                                                   api: httpx.Client) -> None:
    sid = new_session(api)
    open_viewer(page, proxy, sid)
    page.fill("#prompt-input", "edit please mock:chunks=1 mock:permission=ask")
    page.click("#send")
    allow = page.locator("#blocks li.permission button[data-option='allow-once']")
    allow.click()
    page.wait_for_selector("#blocks li.permission[data-resolved='true']")
    page.wait_for_function(
        "() => [...document.querySelectorAll('#blocks li.assistant')].some("
        "li => li.textContent.includes('permission:allow-once'))")
    page.wait_for_selector("#blocks li.assistant:not(.streaming)")
    assert "allow-once" in page.locator("#blocks li.permission .outcome").text_content()
    transcript = api.get(f"/session/{sid}/transcript").json()["events"]
    resolved = [e for e in transcript if e["type"] == "permission_resolved"]
    assert [e["data"]["outcome"] for e in resolved] == [
        {"outcome": "selected", "optionId": "allow-once"}]


def test_a_permission_request_the_daemon_answered_shows_why(
        page: Any, proxy: ProxyThread, api: httpx.Client) -> None:
    """Cancelling the prompt answers its pending request: the block says so, with the reason
    the daemon published (as it does for a request that timed out)."""
    sid = new_session(api)
    open_viewer(page, proxy, sid)
    page.fill("#prompt-input", "edit please mock:chunks=1 mock:permission=ask")
    page.click("#send")
    page.wait_for_selector("#blocks li.permission button[data-option='allow-once']")
    assert api.post(f"/session/{sid}/cancel").status_code == 204
    page.wait_for_selector("#blocks li.permission[data-resolved='true']")
    assert page.locator("#blocks li.permission .outcome").text_content() == (
        "Answered: cancelled (the prompt was cancelled)")


def test_navigation_during_a_repair_aborts_it(page: Any, proxy: ProxyThread, api: httpx.Client,
                                              daemon: RunningDaemon) -> None:
    sid = new_session(api)
    other = new_session(api)
    send_prompt(api, sid, "long mock:chunks=20 mock:bytes=120 mock:gate=nav1")
    wait_status(api, sid, lambda s: s["journal"]["truncatedEvents"] > 0
                and s["lastEventId"] >= 20, "the live journal to overflow")
    held: list[Any] = []

    def hold_repair_load(route: Any) -> None:
        body = route.request.post_data or ""
        if "historyPageSize" in body:
            route.continue_()
        else:
            held.append(route)  # the repair's load: never answered until we navigate away

    page.route(re.compile(r".*/session/[^/]+/load$"), hold_repair_load)
    open_viewer(page, proxy, sid)
    page.locator("#blocks li.source-history_truncated").wait_for()
    daemon.open_gate("nav1")
    page.wait_for_function("() => window.turnkeeperViewer.stats.repairAttempts === 1")
    assert len(held) == 1
    page.evaluate(f"() => {{ location.hash = 'session={other}'; }}")
    page.wait_for_function("() => window.turnkeeperViewer.stats.repairsAborted === 1")
    page.wait_for_function(f"() => window.turnkeeperViewer.view.id === '{other}'")
    try:
        held[0].continue_()
    except Exception:
        pass  # the page already aborted the request
    s = stats(page)
    assert s["repairs"] == 0 and s["repairFailures"] == 0, s
    assert page.locator("#notices li").count() == 0
    assert page.locator("#blocks li.source-history_truncated").count() == 0


def test_history_pages_load_as_the_user_scrolls_up(page: Any, proxy: ProxyThread,
                                                   api: httpx.Client) -> None:
    sid = new_session(api)
    for n in range(1, 5):
        send_prompt(api, sid, f"turn-{n} mock:chunks=1 mock:bytes=1500 mock:delay_ms=0")
        wait_status(api, sid, lambda s: not s["hasActivePrompt"] and s["pendingPrompts"] == 0,
                    f"turn {n} to end")
    open_viewer(page, proxy, f"{sid}&page=3")  # three transcript records per history page
    page.wait_for_selector("#load-older:not([hidden])")
    assert len(blocks(page, "user")) < 4
    box = page.locator("#transcript")
    box.hover()
    requests = 0
    while page.locator("#load-older:not([hidden])").count() and requests < 10:
        requests = stats(page)["pageRequests"]
        page.mouse.wheel(0, -4000)
        page.wait_for_function(f"() => window.turnkeeperViewer.stats.pageRequests > {requests}"
                               " && window.turnkeeperViewer.view.pageRequests === 0")
    users = [text.split(" ")[0] for text in blocks(page, "user")]
    assert users == ["turn-1", "turn-2", "turn-3", "turn-4"]
    assert proxy.call(proxy.proxy.count, "GET", rf"^/session/{sid}/transcript") >= 2
    assert proxy.loads(sid) == 1


def test_a_long_transcript_is_chunked_in_order_through_every_kind_of_change(
        page: Any, proxy: ProxyThread, api: httpx.Client) -> None:
    """Blocks are grouped in chunks of at most 10, of which only those near the viewport are in
    the page; whatever changes, the chunks hold the store's blocks in the store's order and the
    nodes in the page are those of the live chunks, in order: a first render, a history page
    before (filling the first chunk, then new ones), a block changed in place, blocks added at
    the end, and blocks taken out of the middle (everything regrouped)."""
    open_viewer(page, proxy, new_session(api))
    report = page.evaluate("""async () => {
      const { eventFromMapping } = await import("/ui/events.js");
      const { TranscriptStore } = await import("/ui/store.js");
      const viewer = window.turnkeeperViewer;
      const box = document.getElementById("transcript");
      const frame = () => new Promise((resolve) => requestAnimationFrame(() => resolve()));
      const scratch = new TranscriptStore(100000);
      let id = 0;
      const say = (kind, i) => scratch.dispatch(eventFromMapping({
        v: 1, id: ++id, type: "session_update", sessionId: "s", promptId: `p-${i}`,
        data: { sessionId: "s", update: { sessionUpdate: kind,
                                          content: { type: "text", text: `${kind} ${i}` } } } }));
      for (let i = 0; i < 140; i++) { say("user_message_chunk", i); say("agent_message_chunk", i); }
      const all = scratch.snapshotState();
      const steps = [];
      const look = (name, want) => {
        const d = viewer.transcript.describe();
        const live = d.chunks.filter((c) => c.live).flatMap((c) => c.ids);
        steps.push({ name, want, held: d.chunks.flatMap((c) => c.ids),
                     sizes: d.chunks.map((c) => c.ids.length), live,
                     got: [...document.querySelectorAll("#blocks li.block")].map((li) => li.dataset.id),
                     texts: [...document.querySelectorAll("#blocks li.block .text")].map((n) => n.textContent) });
      };
      const show = async (name, blocks) => {
        viewer.store.reset({ ...all, blocks: Object.freeze(blocks) });
        viewer.render();
        await frame(); await frame();
        look(name, blocks.map((b) => b.id));
      };
      const blocks = [...all.blocks];
      await show("first", blocks.slice(170, 230));
      await show("history page", blocks.slice(100, 230));
      await show("older history page", blocks.slice(5, 230));
      const changed = [...blocks.slice(5, 230)];
      changed[7] = Object.freeze({ ...changed[7], text: "changed in place" });
      await show("changed", changed);
      box.scrollTop = 0;
      for (let i = 0; i < 10; i++) await frame();
      look("scrolled to the top", changed.map((b) => b.id));
      await show("appended", [...changed, ...blocks.slice(230)]);
      await show("middle removed", [...changed.slice(0, 60), ...blocks.slice(120)]);
      return steps;
    }""")
    assert [step["name"] for step in report] == [
        "first", "history page", "older history page", "changed", "scrolled to the top",
        "appended", "middle removed"]
    for step in report:
        name = step["name"]
        assert step["held"] == step["want"], name
        assert all(1 <= size <= 10 for size in step["sizes"]), (name, step["sizes"])
        assert step["got"] == step["live"], name     # the page holds the live chunks' blocks
        assert step["got"], name
        start = step["want"].index(step["got"][0])  # ...a run of consecutive blocks
        assert step["want"][start:start + len(step["got"])] == step["got"], name
    # The history pages filled the first chunk, then new ones before it.
    assert report[0]["sizes"] == [10] * 6
    assert report[1]["sizes"] == [10] * 13
    assert report[2]["sizes"] == [5] + [10] * 22
    # Shown at the end (the view follows it): the top of the transcript is not in the page...
    assert report[3]["want"][0] not in report[3]["got"]
    # ...until it is scrolled to, and then the end is not.
    assert report[4]["got"][0] == report[4]["want"][0]
    assert report[4]["want"][-1] not in report[4]["got"]
    assert "changed in place" in report[4]["texts"]
    assert report[6]["sizes"] == [10] * 22


def test_ten_thousand_blocks_keep_the_page_small_and_every_block_findable(
        page: Any, proxy: ProxyThread, api: httpx.Client) -> None:
    """A 10,000-block transcript: the page holds a bounded number of block nodes wherever it is
    scrolled, scrolling to the top shows the first block and back to the end the last, and find
    (Ctrl+F) reaches any block, shown or not, and brings it into view."""
    open_viewer(page, proxy, new_session(api))
    page.evaluate("""() => {
      const viewer = window.turnkeeperViewer;
      const blocks = [];
      for (let i = 0; i < 5000; i++) {
        blocks.push(Object.freeze({ id: `u-${i}`, kind: "user", prompt_id: `p-${i}`,
                                    text: `question number ${i}`, streaming: false }));
        // Answers of uneven length: a chunk's estimated height is off until it is shown.
        const more = `\n- more`.repeat((i * 7) % 13);
        blocks.push(Object.freeze({ id: `a-${i}`, kind: "assistant", prompt_id: `p-${i}`,
                                    text: `answer **${i}**:\n\n- item\n- needle-${i}-x${more}`,
                                    streaming: false }));
      }
      viewer.store.reset({ ...viewer.store.snapshotState(), blocks: Object.freeze(blocks) });
      viewer.render();
    }""")
    counts = "() => document.querySelectorAll('#blocks li.block').length"

    def in_view(block_id: str) -> bool:
        """The block is inside the transcript's visible box, once what is drawn has settled
        (the window fills its margin a chunk a frame; the text read must not move meanwhile)."""
        return bool(page.evaluate("""async (id) => {
          for (let i = 0; i < 10; i++) await new Promise((r) => requestAnimationFrame(r));
          const node = document.querySelector(`#blocks li.block[data-id='${id}']`);
          if (node === null) return false;
          const r = node.getBoundingClientRect();
          const box = document.getElementById("transcript").getBoundingClientRect();
          return r.top >= box.top && r.bottom <= box.bottom;
        }""", block_id))

    page.wait_for_selector("#blocks li.block[data-id='a-4999']")
    assert page.evaluate("() => window.turnkeeperViewer.store.blocks.length") == 10_000
    seen = [page.evaluate(counts)]
    box = page.locator("#transcript")
    # Scroll up by wheel, a screen at a time for a while, then jump to the top.
    box.hover()
    for _ in range(12):
        page.mouse.wheel(0, -900)
        page.wait_for_function("() => new Promise((r) => requestAnimationFrame(() => r(true)))")
        seen.append(page.evaluate(counts))
    page.evaluate("() => { document.getElementById('transcript').scrollTop = 0; }")
    page.wait_for_selector("#blocks li.block[data-id='u-0']")
    assert page.locator("#blocks li.block[data-id='u-0']").is_visible()
    seen.append(page.evaluate(counts))
    assert page.locator("#blocks li.block[data-id='a-4999']").count() == 0
    assert max(seen) <= 200 and min(seen) > 0, seen
    # Find: Ctrl+F opens the bar; typing goes to the newest match; Enter to the next.
    page.keyboard.press("Control+f")
    assert page.locator("#find-input").is_visible()
    page.fill("#find-input", "needle-1234-x")
    page.wait_for_selector("#blocks li.block.found[data-id='a-1234']")
    assert page.locator("#find-count").inner_text() == "1 of 1"
    found = page.locator("#blocks li.block[data-id='a-1234']")
    assert in_view("a-1234") and "needle-1234-x" in found.inner_text()
    assert page.evaluate(counts) <= 200
    # The first block of its chunk: centred, the space above it is a spacer at first, and the
    # chunks drawn there (taller or shorter than estimated) must not push the match away.
    page.fill("#find-input", "question number 2345")
    page.wait_for_selector("#blocks li.block.found[data-id='u-2345']")
    assert page.evaluate("() => { const n = document.querySelector(\"li[data-id='u-2345']\");"
                         " return n === n.parentElement.firstElementChild; }")
    assert in_view("u-2345")
    page.fill("#find-input", "question number 12")  # 12, 120-129, 1200-1299: 111 matches
    page.wait_for_function("() => document.getElementById('find-count').textContent === '111 of 111'")
    page.wait_for_selector("#blocks li.block.found[data-id='u-1299']")
    page.keyboard.press("Enter")  # wraps to the first
    page.wait_for_selector("#blocks li.block.found[data-id='u-12']")
    assert page.locator("#find-count").inner_text() == "1 of 111"
    assert in_view("u-12")
    page.keyboard.press("Shift+Enter")
    page.wait_for_selector("#blocks li.block.found[data-id='u-1299']")
    assert in_view("u-1299")
    page.fill("#find-input", "nothing like this")
    page.wait_for_function("() => document.getElementById('find-count').textContent === 'no match'")
    page.keyboard.press("Escape")
    assert not page.locator("#find").is_visible()
    # Back to the end: the last block is shown again.
    page.evaluate("() => window.turnkeeperViewer.scrollToBottom()")
    page.wait_for_selector("#blocks li.block[data-id='a-4999']")
    assert page.evaluate(counts) <= 200


def test_after_a_restart_the_open_session_comes_back_and_others_wait_in_archived(
        page: Any, tmp_path: Path) -> None:
    """A restarted daemon holds no session in memory until one is loaded. The open session's
    stream gets "no session": the page restores it with one load, by itself (not "session
    missing"), and says what the restore means (the bundled mock has no session/load, so the
    agent's own context is gone). A session the page had only listed waits under Archived;
    opening it restores it too."""
    first = start_daemon(tmp_path, ["--token", TOKEN])
    with ProxyThread(first.url) as proxy:
        try:
            open_viewer(page, proxy)
            page.fill("#prompt-input", "before the restart mock:chunks=1")
            page.press("#prompt-input", "Enter")
            page.wait_for_selector("#blocks li.assistant:not(.streaming)")
            sid = page.evaluate("() => window.turnkeeperViewer.view.id")
            with httpx.Client(base_url=first.url, headers=AUTH, timeout=10) as client:
                other = new_session(client)
                send_prompt(client, other, "the other session mock:chunks=1")
                for each in (sid, other):
                    wait_status(client, each, lambda s: not s["hasActivePrompt"]
                                and s["durableEventId"] == s["lastEventId"], f"{each} durable")
            session_row(page, other).wait_for()
        finally:
            first.stop()
        page.wait_for_selector("#connection[data-state='reconnecting']")
        second = start_daemon(tmp_path, ["--token", TOKEN], data_dir=first.data_dir, tag="again")
        try:
            proxy.proxy.upstream_port = int(second.url.rsplit(":", 1)[1])
            notice = page.wait_for_selector("#notices li[data-notice='daemon.agent_context_lost']")
            assert notice.inner_text() == AGENT_CONTEXT_LOST
            page.wait_for_selector("#connection[data-state='connected']")
            assert blocks(page, "user") == ["before the restart mock:chunks=1"]
            assert stats(page)["restores"] == 1
            # The other session is not live on the new daemon: Archived lists it.
            archived = page.locator(f"#archived li[data-session='{other}']")
            page.click("#archived-toggle")
            archived.wait_for()
            # Never opened here, so it has no title yet: its short id.
            assert archived.locator(".title").text_content() == f"Session {other[:8]}"
            archived.click()
            page.wait_for_function(f"() => window.turnkeeperViewer.view.id === '{other}'")
            page.wait_for_selector("#connection[data-state='connected']")
            assert blocks(page, "user") == ["the other session mock:chunks=1"]
            page.wait_for_selector(f"#session-groups section.group:not(.archived) "
                                   f"li[data-session='{other}']")
        finally:
            second.stop()


def test_archived_lists_the_daemons_stored_sessions_this_browser_never_saw(
        page: Any, tmp_path: Path) -> None:
    """The list is the daemon's (GET /sessions): a session stored before a restart, which this
    browser never listed, waits under Archived all the same; opening it restores it."""
    first = start_daemon(tmp_path, ["--token", TOKEN])
    try:
        with httpx.Client(base_url=first.url, headers=AUTH, timeout=10) as client:
            stored = new_session(client)
    finally:
        first.stop()
    second = start_daemon(tmp_path, ["--token", TOKEN], data_dir=first.data_dir, tag="again")
    try:
        with ProxyThread(second.url) as proxy:
            open_viewer(page, proxy)
            assert page.evaluate("() => localStorage.getItem('turnkeeper.viewer.sessions')") \
                in (None, "[]")
            page.click("#archived-toggle")
            archived = page.locator(f"#archived li[data-session='{stored}']")
            archived.wait_for()
            assert page.locator(f"#session-groups section.group:not(.archived) "
                                f"li[data-session='{stored}']").count() == 0  # not live
            archived.click()
            page.wait_for_selector("#connection[data-state='connected']")
            page.wait_for_selector(f"#session-groups section.group:not(.archived) "
                                   f"li[data-session='{stored}']")
    finally:
        second.stop()


# --- state, controls, errors (issue: a viewer that feels finished) -------------------------------


def test_the_connection_pill_tells_the_truth_from_token_to_reconnect(
        page: Any, proxy: ProxyThread, api: httpx.Client) -> None:
    """Before anything is typed it asks for the token (not "auth failed"); a wrong token says so
    and keeps asking; the right one leaves "auth needed" behind; an open session is connected;
    a cut stream shows "reconnecting" with the countdown to the next attempt, then connected."""
    sid = new_session(api)
    page.goto(f"{proxy.url}/ui/")
    page.wait_for_selector("#token-dialog[open]")
    assert pill(page) == ("auth_needed", "auth needed")
    assert page.locator("#token-error").is_hidden()
    page.fill("#token-input", "not-the-token")
    page.click("#token-submit")
    page.wait_for_selector("#token-dialog[open] #token-error:not([hidden])")
    assert pill(page) == ("auth_needed", "auth needed")
    assert page.locator("#send").is_disabled()
    page.fill("#token-input", TOKEN)
    page.click("#token-submit")
    page.wait_for_selector("body[data-ready='true']")
    assert pill(page) == ("idle", "idle")
    session_row(page, sid).click()
    page.wait_for_selector("#connection[data-state='connected']")
    assert pill(page) == ("connected", "connected")
    record_pill_states(page)
    assert proxy.sever() >= 1
    page.wait_for_function("() => window.__pill.some(([s]) => s === 'reconnecting')"
                           " && document.getElementById('connection').dataset.state"
                           " === 'connected'")
    seen = page.evaluate("() => window.__pill")
    texts = [text for state, text in seen if state == "reconnecting"]
    assert texts and all(re.fullmatch(r"reconnecting (in \d+ s|now)", t) for t in texts), seen
    assert seen[-1] == ["connected", "connected"]


def test_a_missing_session_says_so_and_what_to_do(page: Any, proxy: ProxyThread) -> None:
    ghost = str(uuid.uuid4())
    open_viewer(page, proxy, ghost)
    page.wait_for_selector("#missing:not([hidden])")
    assert pill(page) == ("missing", "session missing")
    assert page.locator("#missing-id").inner_text() == ghost
    assert "Session not found" in page.locator("#missing").inner_text()
    # Nothing can be sent into it, and the reason is on the button.
    page.fill("#prompt-input", "hello?")
    send = page.locator("#send")
    assert send.is_disabled() and "does not exist" in str(send.get_attribute("title"))
    page.click("#missing-back")
    page.wait_for_selector("#welcome:not([hidden])")
    assert page.input_value("#prompt-input") == ""  # the draft of the missing session stays there
    assert pill(page) == ("idle", "idle") and "#session=" not in page.url


def test_a_running_turn_shows_who_works_for_how_long_and_stop_ends_it(
        page: Any, proxy: ProxyThread, api: httpx.Client, daemon: RunningDaemon) -> None:
    sid = new_session(api)
    open_viewer(page, proxy, sid)
    assert page.locator("#working").is_hidden()
    page.fill("#prompt-input", "work a while mock:chunks=2 mock:gate=never-opened")
    page.press("#prompt-input", "Enter")
    page.wait_for_selector("#working:not([hidden])")
    first = page.locator("#working-time").inner_text()
    assert re.fullmatch(r"\d+ s", first), first
    page.wait_for_function(f"() => document.getElementById('working-time').innerText !== {first!r}")
    # The list says so too, by itself (nobody pressed refresh).
    page.wait_for_selector(f"#session-groups li[data-session='{sid}'][data-state='running']")
    page.click("#stop")
    page.wait_for_selector("#working", state="hidden")
    wait_status(api, sid, lambda s: not s["hasActivePrompt"], "the stopped turn to end")
    page.wait_for_selector(f"#session-groups li[data-session='{sid}'][data-state='idle']")
    terminal = [e for e in api.get(f"/session/{sid}/transcript").json()["events"]
                if e["type"] in ("turn_complete", "turn_error")]
    assert terminal[-1]["type"] == "turn_complete"
    assert terminal[-1]["data"]["stopReason"] == "cancelled"


def test_the_session_list_updates_itself(page: Any, proxy: ProxyThread, api: httpx.Client,
                                         daemon: RunningDaemon) -> None:
    open_viewer(page, proxy)
    refreshes = []
    page.on("request", lambda r: refreshes.append(r.url) if r.url.endswith("/daemon/status")
            else None)
    sid = new_session(api)  # another client makes a session
    session_row(page, sid).wait_for()
    send_prompt(api, sid, "elsewhere mock:chunks=1 mock:gate=list1")
    page.wait_for_selector(f"#session-groups li[data-session='{sid}'][data-state='running']")
    assert session_row(page, sid).locator(".meta").inner_text() == "running"
    daemon.open_gate("list1")
    page.wait_for_selector(f"#session-groups li[data-session='{sid}'][data-state='idle']")
    assert refreshes  # polled by the page, never by a click on refresh


def test_controls_follow_state_and_input_is_never_dropped(
        page: Any, proxy: ProxyThread, api: httpx.Client, daemon: RunningDaemon) -> None:
    open_viewer(page, proxy)
    send = page.locator("#send")
    # Nothing typed: Send cannot act, and says why; no turn runs: no Stop.
    assert send.is_disabled() and send.get_attribute("title") == "Type a prompt first."
    assert page.locator("#stop").is_hidden()
    # With no session open, Send starts one and sends.
    page.fill("#prompt-input", "first prompt mock:chunks=1 mock:gate=ctl1")
    assert send.is_enabled() and "Start a new session" in str(send.get_attribute("title"))
    page.click("#send")
    page.wait_for_selector("#blocks li.user")
    sid = page.evaluate("() => window.turnkeeperViewer.view.id")
    assert f"#session={sid}" in page.url and page.input_value("#prompt-input") == ""
    page.wait_for_selector("#working:not([hidden])")
    # A prompt sent while a turn runs is shown as queued until it starts.
    page.fill("#prompt-input", "second prompt mock:chunks=1")
    assert "Queue this prompt" in str(send.get_attribute("title"))
    page.click("#send")
    queued = page.locator("#queue li")
    queued.wait_for()
    assert queued.locator(".text").inner_text() == "second prompt mock:chunks=1"
    assert queued.locator(".tag").inner_text().lower() == "queued"
    daemon.open_gate("ctl1")
    page.wait_for_selector("#queue", state="hidden")
    page.wait_for_function("() => document.querySelectorAll('#blocks li.user').length === 2")
    page.wait_for_selector("#working", state="hidden")
    # A prompt the daemon refuses stays in the box, with a notice saying why.
    page.route(re.compile(r".*/session/[^/]+/prompt$"), lambda route: route.fulfill(
        status=503, content_type="application/json",
        body=json.dumps({"error": "Prompt queue is full", "code": "prompt_queue_full"})))
    page.fill("#prompt-input", "this one must survive")
    page.press("#prompt-input", "Enter")
    notice = page.locator("#notices li[data-notice='viewer.prompt.failed']")
    notice.wait_for()
    assert "prompt_queue_full" in notice.inner_text()
    assert page.input_value("#prompt-input") == "this one must survive"
    assert sid


def test_a_turn_error_shows_its_code(page: Any, proxy: ProxyThread, api: httpx.Client) -> None:
    sid = new_session(api)
    open_viewer(page, proxy, sid)
    page.fill("#prompt-input", "fail please mock:mode=reject mock:chunks=0")
    page.click("#send")
    error = page.locator("#blocks li.error")
    error.wait_for()
    errors = [e["data"] for e in api.get(f"/session/{sid}/transcript").json()["events"]
              if e["type"] == "turn_error"]
    assert len(errors) == 1 and errors[0]["code"]
    assert error.locator(".code").text_content() == str(errors[0]["code"])
    assert error.locator(".text").text_content() == errors[0]["message"]


# --- phone width ---------------------------------------------------------------------------------


def test_at_phone_width_the_list_folds_behind_a_button(
        phone: Any, proxy: ProxyThread, api: httpx.Client) -> None:
    sid = new_session(api)
    send_prompt(api, sid, "on a phone mock:chunks=3")
    wait_status(api, sid, lambda s: not s["hasActivePrompt"], "the turn to end")
    open_viewer(phone, proxy, sid)
    phone.wait_for_selector("#blocks li.assistant:not(.streaming)")
    width = phone.evaluate("() => document.documentElement.clientWidth")
    assert width == PHONE["width"]
    assert not phone.locator("#sidebar").is_visible()
    assert phone.locator("#menu").is_visible()
    transcript = phone.locator("#transcript").bounding_box()
    box = phone.locator("#prompt-input").bounding_box()
    assert transcript is not None and box is not None
    assert transcript["x"] == 0 and transcript["width"] == width
    assert box["width"] >= width - 80, box  # the prompt box takes the width
    assert phone.locator("#prompt-input").get_attribute("placeholder") == "Ask the agent…"
    phone.click("#menu")
    phone.wait_for_selector("#sidebar", state="visible")
    phone.wait_for_function("() => document.getElementById('sidebar')"
                            ".getBoundingClientRect().left === 0")  # slid all the way in
    assert phone.locator("#menu").get_attribute("aria-expanded") == "true"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    phone.screenshot(path=str(ARTIFACTS / "phone-menu-open-400.png"))
    other = new_session(api)
    session_row(phone, other).click()
    phone.wait_for_selector("#sidebar", state="hidden")
    phone.wait_for_function(f"() => window.turnkeeperViewer.view.id === '{other}'")


# --- what the agent writes ------------------------------------------------------------------------


HOSTILE = "\n".join([
    "Plain **bold** and `code`.",
    "",
    "```python",
    "print('<b>not markup</b>')",
    "```",
    "",
    "- [ok link](https://example.com/docs)",
    "- [bad link](javascript:window.__pwned=1)",
    "- [encoded](java&#115;cript:window.__pwned=2)",
    "- <img src=x onerror=\"window.__pwned=3\">",
    "- <script>window.__pwned=4</script>",
    "- ![pic](https://example.com/pic.png)",
    "- [data](data:text/html,<script>window.__pwned=5</script>)",
    "- <a href=\"javascript:window.__pwned=6\">raw anchor</a>",
])


def test_agent_markdown_renders_safely(page: Any, proxy: ProxyThread, api: httpx.Client) -> None:
    """The mock echoes the prompt as its answer (mock:echo=1): Markdown with hostile parts comes
    back from the agent through the daemon and is rendered by the page."""
    sid = new_session(api)
    send_prompt(api, sid, f"{HOSTILE}\nmock:chunks=0 mock:echo=1")
    wait_status(api, sid, lambda s: not s["hasActivePrompt"], "the echo turn to end")
    open_viewer(page, proxy, sid)
    answer = page.locator("#blocks li.assistant").last
    answer.wait_for()
    body = answer.locator(".md")
    assert body.locator("strong").text_content() == "bold"
    code = body.locator("figure.md-codeblock")
    assert code.locator("pre").text_content() == "print('<b>not markup</b>')"
    assert code.get_attribute("data-lang") == "python"
    assert code.locator("button.copy").count() == 1
    links = body.locator("a")
    hrefs = [links.nth(i).get_attribute("href") for i in range(links.count())]
    assert hrefs == ["https://example.com/docs", "https://example.com/pic.png"], hrefs
    for i in range(links.count()):
        assert set(str(links.nth(i).get_attribute("rel")).split()) >= {"noopener", "noreferrer"}
        assert links.nth(i).get_attribute("target") == "_blank"
    # Hostile parts are shown as text; nothing of them became an element or ran.
    assert page.locator("#blocks img, #blocks script, #blocks iframe, #blocks object").count() == 0
    assert page.locator("#blocks [onerror], #blocks [onclick]").count() == 0
    assert page.evaluate("() => window.__pwned") is None
    text = body.text_content()
    assert '<img src=x onerror="window.__pwned=3">' in text and "bad link" in text
    assert "<script>window.__pwned=4</script>" in text
    assert body.locator("li").count() == 8


def test_tool_calls_fold_with_their_status(page: Any, proxy: ProxyThread,
                                           api: httpx.Client) -> None:
    """mock:rich=1: a thought, a plan, a tool call that runs to completion and a Markdown
    answer. Tool calls and thoughts fold; the status shows in the header."""
    sid = new_session(api)
    send_prompt(api, sid, "Give me an overview of this repository mock:rich=1 mock:chunks=0")
    wait_status(api, sid, lambda s: not s["hasActivePrompt"], "the rich turn to end")
    open_viewer(page, proxy, sid)
    tool = page.locator("#blocks li.tool[data-status='completed']").filter(has_text="Read README.md")
    tool.wait_for()
    assert tool.locator(".status").text_content() == "done"
    details = tool.locator("details")
    assert details.get_attribute("open") is None  # folded
    assert not tool.locator(".tool-body").is_visible()
    tool.locator("summary").click()
    assert tool.locator(".tool-body").is_visible()
    assert '"path": "README.md"' in tool.locator(".tool-body").text_content()
    thought = page.locator("#blocks li.thought details")
    assert thought.get_attribute("open") is None
    plan = page.locator("#blocks li.tool").filter(has_text="Plan")
    assert plan.locator(".plan li[data-status='completed']").count() == 2
    assert page.locator("#blocks li.assistant .md h2").text_content() == "Layout"
    assert page.locator("#blocks li.assistant .md table tr").count() == 3


# --- the list: workspaces, search, archive, theme ----------------------------------------------------


def test_sessions_group_by_workspace_with_search_and_close(
        page: Any, proxy: ProxyThread, api: httpx.Client, tmp_path: Path) -> None:
    alpha, beta = tmp_path / "alpha-ws", tmp_path / "beta-ws"
    (alpha / ".git").mkdir(parents=True)
    (alpha / ".git" / "HEAD").write_text("ref: refs/heads/feature-x\n")
    beta.mkdir()
    in_alpha = api.post("/session", json={"sessionScope": "thread", "cwd": str(alpha)}).json()
    in_beta = api.post("/session", json={"sessionScope": "thread", "cwd": str(beta)}).json()
    send_prompt(api, in_beta["sessionId"], "refactor the parser mock:chunks=1")
    wait_status(api, in_beta["sessionId"], lambda s: not s["hasActivePrompt"], "beta's turn")
    open_viewer(page, proxy, in_beta["sessionId"])
    group_a = page.locator(f"#session-groups section[data-workspace='{in_alpha['workspaceCwd']}']")
    group_b = page.locator(f"#session-groups section[data-workspace='{in_beta['workspaceCwd']}']")
    group_a.wait_for()
    assert group_a.locator(".group-name").text_content() == "alpha-ws"
    assert group_a.locator(".group-branch").text_content() == "feature-x"
    # The open session is named by its first prompt.
    row_b = session_row(page, in_beta["sessionId"])
    page.wait_for_function(f"""() => document.querySelector(
        "#session-groups li[data-session='{in_beta['sessionId']}'] .title").textContent
        .startsWith('refactor the parser')""")
    assert page.locator("#chip-workspace").text_content() == "beta-ws"
    assert page.locator("#chip-branch").count() == 0  # beta is not a git checkout
    # Search narrows the list (by title, id or workspace).
    page.fill("#session-search", "refactor")
    assert row_b.is_visible() and group_a.count() == 0
    page.fill("#session-search", "alpha-ws")
    assert session_row(page, in_alpha["sessionId"]).is_visible() and group_b.count() == 0
    page.fill("#session-search", "")
    # Closing asks once more (a closed session cannot be reopened), then ends it.
    page.click("#close-session")
    assert page.locator("#close-session[data-confirm='armed']").is_visible()
    assert api.get(f"/session/{in_beta['sessionId']}/status").status_code == 200
    page.click("#close-session")
    page.wait_for_selector("#welcome:not([hidden])")
    row_b.wait_for(state="detached")
    assert api.get(f"/session/{in_beta['sessionId']}/status").status_code == 404
    assert page.locator(f"#archived li[data-session='{in_beta['sessionId']}']").count() == 0


def test_the_theme_switches_and_is_remembered(page: Any, proxy: ProxyThread) -> None:
    open_viewer(page, proxy)
    html = page.locator("html")
    assert html.get_attribute("data-theme") == "dark"
    background = page.evaluate("() => getComputedStyle(document.body).backgroundColor")
    page.click("#theme")
    assert html.get_attribute("data-theme") == "light"
    assert page.evaluate("() => getComputedStyle(document.body).backgroundColor") != background
    page.reload()
    page.wait_for_selector("body[data-ready='true']")
    assert html.get_attribute("data-theme") == "light"


def test_the_root_leads_to_the_viewer_and_nothing_is_missing(page: Any, proxy: ProxyThread) -> None:
    failed: list[str] = []
    # Every request of the page load (the API calls answer 401 until the token is given).
    page.on("response", lambda r: failed.append(f"{r.status} {r.url}")
            if r.status >= 400 and r.status != 401 else None)
    page.goto(f"{proxy.url}/")
    page.wait_for_selector("#token-dialog[open]")
    assert page.url == f"{proxy.url}/ui/"
    icon = page.evaluate("() => document.querySelector('link[rel=icon]').href")
    assert icon.endswith("/ui/favicon.svg")
    assert page.request.get(icon).status == 200
    assert not failed, failed


# --- the screenshots docs/viewer.md shows ---------------------------------------------------------------


def test_screenshots_at_desktop_and_phone_width(browser: Any, tmp_path: Path) -> None:
    """A tidy daemon of its own (a workspace called my-project on branch main, three sessions:
    a rich answer, a permission question, a turn still running), shown at 1280 and 400 px.
    Before that, the same page right after start (viewer-start-*.png). The images land in
    tests/artifacts/ (viewer-1280.png, viewer-400.png, ...) and, with
    TURNKEEPER_UPDATE_SCREENSHOT=1, in docs/."""
    project = tmp_path / "my-project"
    (project / ".git").mkdir(parents=True)
    (project / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    d = start_daemon(tmp_path, ["--workspace", str(project)])
    shots: dict[str, Path] = {}
    try:
        # Right after start, no session yet: what the reference's screenshots show.
        for name, viewport in (("viewer-start-1280.png", DESKTOP), ("viewer-start-400.png", PHONE)):
            with new_page(browser, f"screenshot-{name[:-4]}", viewport) as p:
                p.goto(f"{d.url}/ui/")
                p.wait_for_selector("body[data-ready='true']")
                p.wait_for_selector("#welcome:not([hidden])")
                p.wait_for_function("() => document.getElementById('chip-workspace')"
                                    ".textContent === 'my-project'")
                p.mouse.move(0, viewport["height"] - 1)
                shots[name] = ARTIFACTS / name
                ARTIFACTS.mkdir(parents=True, exist_ok=True)
                p.screenshot(path=str(shots[name]))
        with httpx.Client(base_url=d.url, timeout=10) as client:
            running = new_session(client)
            send_prompt(client, running, "Run the test suite and fix what fails "
                                         "mock:chunks=2 mock:gate=shot")
            asks = new_session(client)
            send_prompt(client, asks, "Update the changelog for the release "
                                      "mock:chunks=1 mock:permission=ask")
            rich = new_session(client)
            send_prompt(client, rich, "Give me an overview of this repository "
                                      "mock:rich=1 mock:chunks=0")
            wait_status(client, rich, lambda s: not s["hasActivePrompt"], "the rich turn")
        for name, viewport in (("viewer-1280.png", DESKTOP), ("viewer-400.png", PHONE)):
            with new_page(browser, f"screenshot-{name[:-4]}", viewport) as p:
                for sid in (running, asks, rich):  # each opened once: the list learns its title
                    p.goto(f"{d.url}/ui/#session={sid}")
                    p.wait_for_selector("body[data-ready='true']")
                    p.wait_for_selector("#blocks li.user")
                    p.wait_for_selector("#connection[data-state='connected']")
                p.reload()
                p.wait_for_selector("#blocks li.assistant:not(.streaming) figure.md-codeblock")
                p.wait_for_function(f"""() => document.querySelectorAll(
                    "#session-groups li[data-session] .title").length === 3 &&
                    document.querySelector("#session-groups li[data-session='{running}']")
                    .dataset.state === 'running'""")
                p.evaluate("() => document.getElementById('transcript').scrollTop = 1e9")
                p.mouse.move(0, viewport["height"] - 1)  # no hover effects in the picture
                shots[name] = ARTIFACTS / name
                ARTIFACTS.mkdir(parents=True, exist_ok=True)
                p.screenshot(path=str(shots[name]))
                assert "/tmp" not in p.locator("body").inner_text()  # no path of this machine
                # Every composer chip shows its icon at this width (at 400 px the approval
                # chip is its shield alone: hiding its label must not hide the icon too).
                hidden = p.evaluate("""() => [...document.querySelectorAll('.chip')]
                    .filter(c => c.offsetParent !== null)
                    .filter(c => {
                        const i = c.querySelector('.icon');
                        return !i || i.getBoundingClientRect().width === 0;
                    }).map(c => c.id)""")
                assert hidden == [], f"chips without a visible icon at {name}: {hidden}"
        if os.environ.get("TURNKEEPER_UPDATE_SCREENSHOT") == "1":
            for name, path in shots.items():
                shutil.copyfile(path, ROOT / "docs" / name)
    finally:
        d.open_gate("shot")
        d.stop()


# --- issue 41: a prompt typed in the page runs once, whatever the network does -----------------


class CutPrompts:
    """A chaos plan for one session's prompt sends: the first ``cuts`` are cut after they
    reached the daemon (``kind``: right after the request, or in the middle of the answer; FIN
    and reset in turn); the others go through. Keeps every send it saw.

    Chromium itself sends a POST again when a reused connection is closed before any answer
    came (``cut_after_request``): with the same headers, so the same key. An answer cut in its
    middle it does not resend: the page has to."""

    def __init__(self, session_id: str, cuts: int, kind: ChaosKind = "cut_after_request") -> None:
        self.path = f"/session/{session_id}/prompt"
        self.cuts = cuts
        self.kind = kind
        self.sends: list[Request] = []

    def __call__(self, request: Request) -> Chaos | None:
        if request.method != "POST" or request.path != self.path:
            return None
        self.sends.append(request)
        if len(self.sends) <= self.cuts:
            return Chaos(self.kind, reset=len(self.sends) % 2 == 0)
        return None

    def keys(self) -> set[str]:
        return {r.headers.get("idempotency-key", "") for r in self.sends}


@contextlib.contextmanager
def chaos(proxy: ProxyThread, plan: CutPrompts) -> Iterator[CutPrompts]:
    """Connections opened from now on go through ``plan`` (a page opened after this one gets
    fresh connections); the proxy relays plainly again afterwards."""
    proxy.call(setattr, proxy.proxy, "chaos", plan)
    try:
        yield plan
    finally:
        proxy.call(setattr, proxy.proxy, "chaos", None)


def test_a_prompt_whose_answers_are_cut_is_resent_with_its_key_and_runs_once(
        page: Any, proxy: ProxyThread, api: httpx.Client, daemon: RunningDaemon) -> None:
    sid = new_session(api)
    with chaos(proxy, CutPrompts(sid, cuts=3, kind="cut_mid_answer")) as plan:
        open_viewer(page, proxy, sid)
        page.fill("#prompt-input", "resent-once mock:chunks=2")
        page.press("#prompt-input", "Enter")
        page.wait_for_selector("#blocks li.assistant:not(.streaming)")
        wait_status(api, sid, lambda s: not s["hasActivePrompt"] and s["pendingPrompts"] == 0,
                    "the turn to end")
        # The page's sends are over (the answer may stream in before a resend got its 202).
        page.wait_for_function("() => { const v = window.turnkeeperViewer.view;"
                               " return v.sending === 0 && v.unsent === null; }")
    assert len(plan.sends) >= 4 and len(plan.keys()) == 1, (len(plan.sends), plan.keys())
    assert prompts_with(daemon, "resent-once") == 1
    assert blocks(page, "user") == ["resent-once mock:chunks=2"]
    assert blocks(page, "assistant") == ["chunk-0chunk-1"]
    assert page.locator("#unsent").is_hidden()
    assert page.input_value("#prompt-input") == ""
    assert stats(page)["promptResends"] >= 1


def test_a_prompt_of_unknown_outcome_is_shown_and_resent_after_a_reconnect(
        page: Any, proxy: ProxyThread, api: httpx.Client, daemon: RunningDaemon) -> None:
    sid = new_session(api)
    text = "unknown-once mock:chunks=2"
    with chaos(proxy, CutPrompts(sid, cuts=1)) as plan:
        # The first send reaches the daemon and its answer is lost; the next is answered 500
        # by the proxy (a failing gateway), which is not resent: the page cannot know.
        proxy.call(lambda: proxy.proxy.fail("POST", rf"^/session/{sid}/prompt$", status=500,
                                            body={"error": "bad gateway", "code": "x"},
                                            skip=1))
        open_viewer(page, proxy, sid)
        page.fill("#prompt-input", text)
        page.press("#prompt-input", "Enter")
        unsent = page.locator("#unsent[data-state='unknown']")
        unsent.wait_for()
        assert "Not known whether" in unsent.inner_text() and text in unsent.inner_text()
        assert page.locator("#resend").is_visible()
        # Not put back in the box: sent from there, it would get a new key.
        assert page.input_value("#prompt-input") == ""
        assert page.locator("#send").get_attribute("title") == (
            "The prompt above is not known to have reached the daemon yet; it is resent first.")
        wait_status(api, sid, lambda s: not s["hasActivePrompt"] and s["pendingPrompts"] == 0,
                    "the admitted turn to end")
        assert prompts_with(daemon, "unknown-once") == 1
        # The event stream drops and comes back: the page sends the prompt again, same key.
        assert proxy.sever() >= 1
        page.wait_for_selector("#unsent", state="hidden")
        assert len(plan.sends) == 2 and len(plan.keys()) == 1, (len(plan.sends), plan.keys())
        assert proxy.call(lambda: [head for r, head in proxy.proxy.answers if r is plan.sends[1]])
    assert prompts_with(daemon, "unknown-once") == 1
    assert blocks(page, "user") == [text]
    assert blocks(page, "assistant") == ["chunk-0chunk-1"]
    assert not page.locator("#notices li[data-notice='viewer.prompt.failed']").count()
