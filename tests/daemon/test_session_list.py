"""GET /sessions lists every session, loaded or not, page by page; GET /daemon/status stays small.

A real daemon on loopback with a real transcript: sessions unloaded when idle and sessions
stored before a restart are listed (``state: unloaded``) beside the live ones; paging with the
cursor gives each session exactly once in the list's order (newest created first), also while
sessions are created, loaded and unloaded meanwhile; the filters hold; a closed session is not
listed; a bad parameter is a 400 with its code. The status lists at most its cap of live
sessions, says it left some out, and counts them all.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from sdk.protocol.http import STATUS_SESSIONS_MAX
from tests.harness import RunningDaemon, running_daemon
from tests.sse_client import Subscriber

pytestmark = pytest.mark.processes  # starts processes: not in make unit-fast

IDLE_MS = 300
ENV = {"MOCK_ACP_LOAD_SESSION": "1"}


async def until(what: str, check: Callable[[], Any], timeout: float = 20) -> Any:
    with trio.move_on_after(timeout):
        while True:
            got = await check()
            if got:
                return got
            await trio.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


async def create(client: httpx.AsyncClient, cwd: str | None = None) -> str:
    body: dict[str, Any] = {"sessionScope": "thread"}
    if cwd is not None:
        body["cwd"] = cwd
    resp = await client.post("/session", json=body)
    assert resp.status_code == 200, resp.text
    return str(resp.json()["sessionId"])


async def every_page(client: httpx.AsyncClient, limit: int,
                     between: Callable[[int], Any] | None = None,
                     **filters: str) -> list[dict[str, Any]]:
    """Every session, page by page; ``between(n)`` runs after page ``n``."""
    listed: list[dict[str, Any]] = []
    cursor = None
    pages = 0
    while True:
        params = {"limit": str(limit), **filters}
        if cursor is not None:
            params["cursor"] = cursor
        resp = await client.get("/sessions", params=params)
        assert resp.status_code == 200, resp.text
        body = resp.json()
        assert body["v"] == 1
        assert len(body["sessions"]) <= limit
        listed.extend(body["sessions"])
        pages += 1
        if between is not None:
            await between(pages)
        if not body["hasMore"]:
            assert "nextCursor" not in body
            return listed
        cursor = body["nextCursor"]


def order_key(item: dict[str, Any]) -> tuple[str, str]:
    return item["createdAt"], item["sessionId"]


async def test_sessions_lists_live_and_unloaded_each_once_in_order(tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    with running_daemon(tmp_path, ["--session-idle-ms", str(IDLE_MS)], ENV) as daemon:
        async with httpx.AsyncClient(base_url=daemon.url, timeout=30) as client:
            ids = [await create(client) for _ in range(5)]
            ids += [await create(client, str(other)) for _ in range(2)]

            async def all_unloaded() -> bool:
                return (await client.get("/daemon/status")).json()["liveSessions"] == 0

            await until("every session unloaded", all_unloaded)
            # Two come back (a stream restores them, and keeps them loaded); the rest stay on
            # disk only.
            async with trio.open_nursery() as nursery:
                for sid in (ids[1], ids[5]):
                    sub = Subscriber(client, f"/session/{sid}/events")
                    await nursery.start(sub.run)
                    assert sub.status == 200
                await check_listing(client, ids, str(other))
                nursery.cancel_scope.cancel()


async def check_listing(client: httpx.AsyncClient, ids: list[str], other: str) -> None:
    listed = await every_page(client, 2)
    assert [s["sessionId"] for s in listed] == [s["sessionId"] for s in sorted(
        listed, key=order_key, reverse=True)]
    assert sorted(s["sessionId"] for s in listed) == sorted(ids)
    states = {s["sessionId"]: s["state"] for s in listed}
    assert {sid for sid, state in states.items() if state == "unloaded"} == \
        set(ids) - {ids[1], ids[5]}
    by_id = {s["sessionId"]: s for s in listed}
    assert by_id[ids[1]]["lastEventId"] is not None
    assert by_id[ids[0]]["lastEventId"] is None
    assert by_id[ids[1]]["subscribers"] == 1
    assert by_id[ids[5]]["workspaceCwd"] == str(Path(other).resolve())

    # Filters: by state, by workspace, both.
    unloaded = await every_page(client, 3, state="unloaded")
    assert sorted(s["sessionId"] for s in unloaded) == sorted(
        set(ids) - {ids[1], ids[5]})
    assert {s["sessionId"] for s in await every_page(client, 3, state="idle")} \
        == {ids[1], ids[5]}
    assert {s["sessionId"] for s in await every_page(
        client, 1, workspace=str(other))} == set(ids[5:])
    assert [s["sessionId"] for s in await every_page(
        client, 5, workspace=str(other), state="unloaded")] == [ids[6]]

    # A closed session is not listed.
    assert (await client.delete(f"/session/{ids[5]}")).status_code == 204
    assert ids[5] not in {s["sessionId"] for s in await every_page(client, 100)}


async def test_paging_while_sessions_come_and_go_lists_each_once(tmp_path: Path) -> None:
    with running_daemon(tmp_path, [], ENV) as daemon:
        async with httpx.AsyncClient(base_url=daemon.url, timeout=30) as client:
            ids = [await create(client) for _ in range(9)]
            made: list[str] = []

            async def churn(page: int) -> None:
                made.append(await create(client))
                # A session closed meanwhile may or may not be listed; it is never listed twice.
                if page == 2:
                    await client.delete(f"/session/{ids[0]}")

            listed = [s["sessionId"] for s in await every_page(client, 2, churn)]
            assert len(listed) == len(set(listed))
            # Every session that existed throughout is listed; the ones made while paging come
            # before the first page (newest first), so none is.
            assert set(ids[1:]) <= set(listed) <= set(ids)


async def test_sessions_stored_before_a_restart_are_listed_unloaded(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with running_daemon(tmp_path, [], ENV, data_dir=data, tag="a") as daemon:
        async with httpx.AsyncClient(base_url=daemon.url, timeout=30) as client:
            ids = [await create(client) for _ in range(3)]
    with running_daemon(tmp_path, [], ENV, data_dir=data, tag="b") as daemon:
        async with httpx.AsyncClient(base_url=daemon.url, timeout=30) as client:
            listed = (await client.get("/sessions")).json()
            assert {s["sessionId"]: s["state"] for s in listed["sessions"]} == dict.fromkeys(
                ids, "unloaded")
            assert listed["hasMore"] is False
            assert (await client.post(f"/session/{ids[0]}/load", json={})).status_code == 200
            after = (await client.get("/sessions")).json()["sessions"]
            assert {s["sessionId"]: s["state"] for s in after}[ids[0]] == "idle"


@pytest.fixture(scope="module")
def listing_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    """One daemon for the bad-parameter cases: each only reads GET /sessions."""
    with running_daemon(tmp_path_factory.mktemp("listing"), ["--no-persistence"], ENV) as daemon:
        yield daemon


@pytest.mark.parametrize(("query", "code"), [
    ("limit=0", "invalid_sessions_limit"),
    ("limit=501", "invalid_sessions_limit"),
    ("limit=x", "invalid_sessions_limit"),
    ("state=sleeping", "invalid_sessions_state"),
    ("workspace=relative/dir", "invalid_sessions_workspace"),
    ("cursor=bm90LWEtY3Vyc29y", "invalid_sessions_cursor"),
    ("cursor=%FF%FE", "invalid_sessions_cursor"),
])
async def test_a_bad_list_parameter_is_a_400_with_its_code(listing_daemon: RunningDaemon,
                                                           query: str, code: str) -> None:
    async with httpx.AsyncClient(base_url=listing_daemon.url, timeout=30) as client:
        resp = await client.get(f"/sessions?{query}")
        assert resp.status_code == 400, resp.text
        body = resp.json()
        assert body["code"] == code
        assert isinstance(body["error"], str) and body["error"]


async def test_status_lists_a_bounded_page_and_counts_every_session(tmp_path: Path) -> None:
    extra = 3
    with running_daemon(tmp_path, ["--session-idle-ms", "0"], ENV) as daemon:
        async with httpx.AsyncClient(base_url=daemon.url, timeout=30) as client:
            ids = [await create(client) for _ in range(STATUS_SESSIONS_MAX + extra)]
            status = (await client.get("/daemon/status")).json()
            listed = [s["sessionId"] for s in status["sessions"]]
            assert listed == ids[::-1][:STATUS_SESSIONS_MAX]  # the newest loaded first
            assert status["sessionsTruncated"] is True
            assert status["liveSessions"] == len(ids)
            assert status["totals"]["sessions"] == len(ids)
            # The whole list is GET /sessions.
            assert sorted(s["sessionId"] for s in await every_page(client, 500)) == sorted(ids)
            for sid in ids[STATUS_SESSIONS_MAX:]:
                assert (await client.delete(f"/session/{sid}")).status_code == 204
            status = (await client.get("/daemon/status")).json()
            assert status["sessionsTruncated"] is False
            assert len(status["sessions"]) == STATUS_SESSIONS_MAX


async def test_filtered_paging_lists_each_once_in_order_while_sessions_change(
        tmp_path: Path) -> None:
    """Every filter, paged two at a time while, between pages, a session is created, one is
    deleted and an unloaded one is loaded (restored among older sessions): each page's
    sessions pass the filter, nothing is listed twice, the order is the list's throughout, and
    every session that matched from start to end is listed."""
    data = tmp_path / "data"
    spaces = [tmp_path / "w1", tmp_path / "w2"]
    for space in spaces:
        space.mkdir()
    w1, w2 = (str(space.resolve()) for space in spaces)
    model: dict[str, tuple[str, str]] = {}  # session id -> (workspace, state)
    with running_daemon(tmp_path, [], ENV, data_dir=data, tag="a") as daemon:
        async with httpx.AsyncClient(base_url=daemon.url, timeout=30) as client:
            for i in range(28):
                cwd = (w1, w2)[i % 2]
                model[await create(client, cwd)] = (cwd, "unloaded")  # after the restart
    with running_daemon(tmp_path, ["--session-idle-ms", "0"], ENV, data_dir=data,
                        tag="b") as daemon:
        async with httpx.AsyncClient(base_url=daemon.url, timeout=30) as client:
            old = list(model)

            async def load(sid: str) -> None:
                resp = await client.post(f"/session/{sid}/load", json={})
                assert resp.status_code == 200, resp.text
                model[sid] = (model[sid][0], "idle")

            for sid in old[::4]:
                await load(sid)  # live again, each among sessions older and newer than it
            for i in range(6):
                cwd = (w1, w2)[i % 2]
                model[await create(client, cwd)] = (cwd, "idle")
            running = [old[4], list(model)[-1], list(model)[-4]]
            for sid in running:
                resp = await client.post(f"/session/{sid}/prompt", json={"prompt": [
                    {"type": "text", "text": "mock:chunks=1 mock:gate=never"}]})
                assert resp.status_code == 202, resp.text
                model[sid] = (model[sid][0], "running")

            async def is_running(sid: str) -> bool:
                return bool((await client.get(f"/session/{sid}/status")).json()
                            ["hasActivePrompt"])

            for sid in running:
                await until(f"{sid} running", lambda sid=sid: is_running(sid))
            # What changes between pages: idle or unloaded sessions, never a running one.
            victims = [sid for sid in reversed(old) if model[sid][1] == "idle"]
            # Six of each workspace's unloaded sessions stay so throughout.
            to_load = [sid for sid in old if model[sid][1] == "unloaded"][:-12]
            filters: list[dict[str, str]] = [
                {}, {"workspace": w1}, {"state": "idle"}, {"state": "unloaded"},
                {"state": "running"}, {"workspace": w2, "state": "idle"},
                {"workspace": w2, "state": "unloaded"}, {"workspace": w1, "state": "running"}]
            for query in filters:
                def matches(entry: tuple[str, str], query: dict[str, str] = query) -> bool:
                    return all(entry[0 if name == "workspace" else 1] == value
                               for name, value in query.items())

                at_start = dict(model)
                touched: set[str] = set()
                made: list[str] = []

                async def change(page: int, made: list[str] = made,
                                 touched: set[str] = touched) -> None:
                    cwd = (w1, w2)[page % 2]
                    sid = await create(client, cwd)
                    model[sid] = (cwd, "idle")
                    made.append(sid)
                    if victims:
                        victim = victims.pop()
                        resp = await client.delete(f"/session/{victim}")
                        assert resp.status_code == 204, resp.text
                        del model[victim]
                        touched.add(victim)
                    restored = next((sid for sid in to_load if sid in model), None)
                    if restored is not None:
                        to_load.remove(restored)
                        await load(restored)
                        touched.add(restored)

                listed = await every_page(client, 2, change, **query)
                ids = [entry["sessionId"] for entry in listed]
                assert len(ids) == len(set(ids)), f"{query}: listed twice: {ids}"
                keys = [order_key(entry) for entry in listed]
                assert keys == sorted(keys, reverse=True) and len(set(keys)) == len(keys), \
                    f"{query}: out of order"
                for entry in listed:
                    assert matches((entry["workspaceCwd"], entry["state"])), (query, entry)
                assert not set(ids) & set(made), f"{query}: listed a session made meanwhile"
                must = {sid for sid, entry in at_start.items()
                        if matches(entry) and sid not in touched}
                assert must <= set(ids), f"{query}: left out {must - set(ids)}"
                assert set(ids) <= {sid for sid, entry in at_start.items()
                                    if matches(entry) or sid in touched}
                assert len(must) >= 2, f"{query}: too few sessions to page through"
                victims[:0] = made  # the older sessions go first
