"""The SDK's list_sessions and the CLI's ``list`` read GET /sessions: every session, unloaded ones
included, a page at a time, with the workspace and state filters; against a daemon without the
route the SDK falls back to the live sessions of GET /daemon/status."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import msgspec
import pytest

from sdk import DaemonClient, SyncDaemonClient
from tests.builders.cli import cli
from tests.harness import running_daemon

pytestmark = pytest.mark.processes  # starts processes: not in make unit-fast


def _create(url: str, cwd: Path | None = None) -> str:
    body = {"sessionScope": "thread", **({"cwd": str(cwd)} if cwd else {})}
    resp = httpx.post(f"{url}/session", json=body, timeout=30)
    assert resp.status_code == 200, resp.text
    return str(resp.json()["sessionId"])


async def test_sdk_and_cli_list_unloaded_sessions_page_by_page(tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    data = tmp_path / "data"
    with running_daemon(tmp_path, [], data_dir=data, tag="a") as first:
        mine = [_create(first.url) for _ in range(4)]
        theirs = [_create(first.url, other) for _ in range(2)]
    everyone = mine + theirs
    with running_daemon(tmp_path, [], data_dir=data, tag="b") as daemon:
        live = _create(daemon.url)
        async with DaemonClient(daemon.url) as client:
            listed = await client.list_sessions(page_size=2)  # four pages
            assert listed[0].session_id == live  # newest created first
            assert sorted(s.session_id for s in listed) == sorted([*everyone, live])
            assert {s.session_id: s.state for s in listed} == {
                **dict.fromkeys(everyone, "unloaded"), live: "idle"}
            assert all(s.last_event_id is None for s in listed if s.state == "unloaded")
            page = await client.list_sessions_page(3)
            assert len(page.sessions) == 3 and page.has_more and page.next_cursor
            rest = await client.list_sessions_page(10, page.next_cursor)
            assert not rest.has_more and rest.next_cursor is msgspec.UNSET
            assert [s.session_id for s in page.sessions + rest.sessions] == [
                s.session_id for s in listed]
            assert {s.session_id for s in await client.list_sessions(
                workspace=str(other))} == set(theirs)
            assert {s.session_id for s in await client.list_sessions(state="idle")} == {live}

        with SyncDaemonClient(daemon.url) as blocking:
            assert [s.session_id for s in blocking.list_sessions(page_size=3)] == [
                s.session_id for s in listed]
            assert len(blocking.list_sessions_page(1).sessions) == 1

        table = cli(daemon.url, "list")
        assert table.returncode == 0, table.stderr
        rows = {line.split()[0]: line.split()[1] for line in table.stdout.splitlines()[1:]}
        assert rows == {**dict.fromkeys(everyone, "unloaded"), live: "idle"}
        unloaded_here = cli(daemon.url, "--json", "list", "--state", "unloaded",
                            "--cwd", str(other))
        assert unloaded_here.returncode == 0, unloaded_here.stderr
        assert sorted(json.loads(line)["sessionId"]
                      for line in unloaded_here.stdout.splitlines()) == sorted(theirs)


async def test_without_the_route_the_sdk_lists_the_live_sessions_of_the_status() -> None:
    status = {"v": 1, "limits": {}, "sessions": [
        {"sessionId": "s-1", "workspaceCwd": "/w", "hasActivePrompt": True, "pendingPrompts": 0,
         "lastEventId": 7},
        {"sessionId": "s-2", "workspaceCwd": "/v", "hasActivePrompt": False,
         "pendingPrompts": 2, "lastEventId": 3}]}
    asked: list[str] = []

    def reference(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.path)
        if request.url.path == "/daemon/status":
            return httpx.Response(200, json=status)
        return httpx.Response(404, json={"error": "Route not found", "code": "route_not_found"})

    async with DaemonClient("http://reference.test",
                            transport=httpx.MockTransport(reference)) as client:
        listed = await client.list_sessions()
        assert [(s.session_id, s.state) for s in listed] == [("s-1", "running"),
                                                             ("s-2", "queued")]
        assert [s.session_id for s in await client.list_sessions(workspace="/v")] == ["s-2"]
    assert asked[:2] == ["/sessions", "/daemon/status"]
