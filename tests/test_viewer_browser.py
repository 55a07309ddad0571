"""The web viewer (``/ui/``) in a real headless Chromium, against the real daemon and mock agent.

One daemon (token auth, live-journal caps of 3 entries / 300 bytes so a 20-chunk turn
overflows) and one browser serve every scenario; each scenario makes its own session. The
browser talks to the daemon through the fault proxy (``tests/fault_proxy.py``, run in its own
thread): it counts every request that reaches the daemon (loads per session) and can cut the
event streams. Model prompts are counted in the mock's prompt log. Waits are on DOM conditions
and the daemon's status, never sleeps. A screenshot of each scenario goes to
``tests/artifacts/`` (git-ignored); ``TURNKEEPER_UPDATE_SCREENSHOT=1`` also refreshes
``docs/viewer-repaired.png``.

Chromium: Debian's ``chromium`` (``make test`` installs it when run as root), driven by
Playwright's bundled driver; no browser download.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from sdk.protocol.constants import AGENT_CONTEXT_LOST
from sdk.truncation import parse_truncation, status_text
from tests.fault_proxy import FaultProxy
from tests.harness import RunningDaemon, start_daemon

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed "
                               "(pip install -e '.[test]')")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None:
    pytest.skip("chromium is not installed (apt-get install chromium; `make test` does it as "
                "root)", allow_module_level=True)

TOKEN = "viewer-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "tests" / "artifacts"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
WAIT_MS = 20_000
WAIT_S = 20.0


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


@pytest.fixture
def page(browser: Any, request: pytest.FixtureRequest) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1000, "height": 640})
    p = context.new_page()
    p.set_default_timeout(WAIT_MS)
    errors: list[str] = []
    p.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        yield p
    finally:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        p.screenshot(path=str(ARTIFACTS / f"{request.node.name}.png"))
        context.close()
    assert not errors, f"uncaught errors in the page: {errors}"


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
    """Load /ui/ through the proxy, give the token once, wait until the viewer is ready."""
    url = f"{proxy.url}/ui/" + (f"#session={session_id}" if session_id else "")
    page.goto(url)
    page.wait_for_selector("#token-dialog[open]")
    page.fill("#token-input", TOKEN)
    page.click("#token-submit")
    page.wait_for_selector("body[data-ready='true']")
    assert TOKEN not in page.url


def blocks(page: Any, kind: str) -> list[str]:
    return list(page.locator(f"#blocks > li[data-kind='{kind}'] .text").all_inner_texts())


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
    page.wait_for_selector(f"#sessions li[data-session='{sid}']")
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
    assert marker.locator(".text").inner_text() == status_text(parsed)
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
    assert "allow-once" in page.locator("#blocks li.permission .outcome").inner_text()
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
    assert page.locator("#blocks li.permission .outcome").inner_text() == (
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


def test_a_session_restored_without_the_agents_context_says_so(
        page: Any, tmp_path: Path) -> None:
    """After a restart, a session whose agent cannot restore its own session (the bundled mock
    has no session/load) is restored from the transcript on a new agent session: the load
    answers agentSessionRestored false, and the page says what that means."""
    first = start_daemon(tmp_path, ["--token", TOKEN])
    try:
        with httpx.Client(base_url=first.url, headers=AUTH, timeout=10) as client:
            sid = new_session(client)
            prompt_id = send_prompt(client, sid, "before the restart")
            wait_status(client, sid, lambda s: not s["hasActivePrompt"]
                        and s["durableEventId"] == s["lastEventId"], f"turn {prompt_id}")
    finally:
        first.stop()
    second = start_daemon(tmp_path, ["--token", TOKEN], data_dir=first.data_dir, tag="again")
    try:
        with ProxyThread(second.url) as proxy:
            open_viewer(page, proxy, sid)
            notice = page.wait_for_selector("#notices li[data-notice='daemon.agent_context_lost']")
            assert notice.inner_text() == AGENT_CONTEXT_LOST
            assert blocks(page, "user") == ["before the restart"]
    finally:
        second.stop()
