"""The ACP client's rules without a process: initialize checks, routing of updates to sessions,
suppression of ``session/load`` replays, reply matching, and the answers to the agent's requests.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from daemon.core import acp_client as acp_client_module
from daemon.core import acp_codec as acp_codec_module
from daemon.core.acp_client import (
    MAX_HELD_BYTES,
    MAX_HELD_SESSIONS,
    MAX_HELD_UPDATES,
    MAX_PENDING_PERMISSIONS,
    PROTOCOL_VERSION,
    TOO_MANY_REQUESTS,
    AcpClient,
    AgentProtocolError,
    AgentRpcError,
    BadUpdate,
    Batch,
    HeldUpdatesDropped,
    Initialized,
    MalformedLine,
    NotificationIgnored,
    PermissionAsked,
    PermissionRefused,
    Replied,
    ReplyUnknown,
    SessionIdInUse,
    UnroutedPermission,
    UnroutedUpdate,
    UnsupportedRequest,
    cancel_line,
    check_initialize,
    initialize_params,
    load_session_params,
    new_session_params,
    permission_failed,
    permission_granted,
    prompt_params,
    prompt_result,
    session_id_of,
)
from daemon.core.acp_codec import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    Read,
    parse_update,
    prefix_of,
    splice_updates,
    update_prefix,
)
from daemon.core.updates import plain_chunk_run

Client = AcpClient[str, str]


def update(session_id: str, text: str, *, spaced: bool = False) -> bytes:
    body: dict[str, Any] = {"sessionUpdate": "agent_message_chunk",
                            "content": {"type": "text", "text": text}}
    msg = {"jsonrpc": "2.0", "method": "session/update",
           "params": {"sessionId": session_id, "update": body}}
    return json.dumps(msg, separators=(", ", ": ") if spaced else (",", ":")).encode()


def reply(request_id: Any, result: Any = None, **extra: Any) -> bytes:
    msg: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id}
    msg.update(extra if extra else {"result": result if result is not None else {}})
    return json.dumps(msg).encode()


def texts(batch: Batch[str, str], session_id: str) -> list[str]:
    """The texts routed to one session in a batch (and check the sink is the attached one)."""
    sink, published = batch.updates[session_id]
    assert sink == f"sink-{session_id}"
    assert published.run == plain_chunk_run(published.updates)  # the batch's facts hold
    return [json.loads(raw)["content"]["text"] for raw in published.updates]


def attached(*session_ids: str) -> Client:
    client: Client = AcpClient()
    for session_id in session_ids:
        client.attach(session_id, f"sink-{session_id}")
    return client


# -- initialize ----------------------------------------------------------------------------------


def test_initialize_request_offers_version_1_and_no_file_system() -> None:
    info = {"name": "n", "version": "v"}
    assert initialize_params(info) == {
        "protocolVersion": 1,
        "clientCapabilities": {"fs": {"readTextFile": False, "writeTextFile": False}},
        "clientInfo": info,
    }
    assert PROTOCOL_VERSION == 1


@pytest.mark.parametrize(
    ("result", "supports_load"),
    [
        ({"protocolVersion": 1}, False),
        ({"protocolVersion": 1, "agentCapabilities": None}, False),
        ({"protocolVersion": 1, "agentCapabilities": {"loadSession": True}}, True),
        ({"protocolVersion": 1, "agentCapabilities": {"loadSession": False}}, False),
        ({"protocolVersion": 1, "agentCapabilities": {"loadSession": "yes"}}, False),
        ({"protocolVersion": 1, "agentCapabilities": {"loadSession": 1}}, False),
    ],
)
def test_a_valid_initialize_result(result: dict[str, Any], supports_load: bool) -> None:
    outcome = check_initialize({**result, "agentInfo": {"name": "a"}})
    assert isinstance(outcome, Initialized)
    assert outcome.supports_load_session is supports_load
    assert outcome.capabilities == (result.get("agentCapabilities") or {})
    assert outcome.agent_info == {"name": "a"}


@pytest.mark.parametrize(
    ("result", "reason"),
    [
        ([1], "initialize result is not an object: [1]"),
        (None, "initialize result is not an object: None"),
        ({}, "unsupported protocolVersion None (we speak 1)"),
        ({"protocolVersion": 2}, "unsupported protocolVersion 2 (we speak 1)"),
        ({"protocolVersion": "1"}, "unsupported protocolVersion '1' (we speak 1)"),
        ({"protocolVersion": True}, "unsupported protocolVersion True (we speak 1)"),
        ({"protocolVersion": 1.0}, "unsupported protocolVersion 1.0 (we speak 1)"),
        ({"protocolVersion": 1, "agentCapabilities": []},
         "agentCapabilities is not an object: []"),
        ({"protocolVersion": 1, "agentCapabilities": "x" * 300},
         f"agentCapabilities is not an object: {('x' * 300)!r:.200}"),
    ],
)
def test_an_invalid_initialize_result_says_why(result: Any, reason: str) -> None:
    assert check_initialize(result) == reason


def test_session_results_are_checked() -> None:
    assert session_id_of({"sessionId": "s1"}) == "s1"
    for bad in ({}, {"sessionId": ""}, {"sessionId": 3}, ["s1"], None):
        with pytest.raises(AgentProtocolError, match="session/new result has no sessionId"):
            session_id_of(bad)
    assert prompt_result({"stopReason": "end_turn"}) == {"stopReason": "end_turn"}
    with pytest.raises(AgentProtocolError, match="session/prompt result is not an object") as err:
        prompt_result("end_turn")
    assert err.value.code == INTERNAL_ERROR


def test_request_bodies() -> None:
    assert new_session_params("/w") == {"cwd": "/w", "mcpServers": []}
    assert load_session_params("s", "/w") == {"sessionId": "s", "cwd": "/w", "mcpServers": []}
    assert prompt_params("s", [{"type": "text"}]) == {"sessionId": "s",
                                                      "prompt": [{"type": "text"}]}
    assert json.loads(cancel_line("s")) == {"jsonrpc": "2.0", "method": "session/cancel",
                                            "params": {"sessionId": "s"}}


# -- routing -------------------------------------------------------------------------------------


def test_updates_are_routed_by_session_in_stdout_order() -> None:
    client = attached("a", "b")
    batch = client.receive(Read([update("b", "1"), update("a", "2"), update("b", "3"),
                            update("a", "4"), update("a", "5")], spaced=False))
    assert list(batch.updates) == ["b", "a"]  # first-appearance order: the flush order
    assert texts(batch, "b") == ["1", "3"]
    assert texts(batch, "a") == ["2", "4", "5"]
    assert batch.events == []


def test_an_update_for_an_unknown_session_is_dropped_and_reported() -> None:
    client = attached("a")
    batch = client.receive(Read([update("ghost", "x"), update("a", "1"), update("ghost", "y")]))
    assert texts(batch, "a") == ["1"]
    assert batch.events == [UnroutedUpdate("ghost"), UnroutedUpdate("ghost")]
    client.detach("a")
    client.detach("never-attached")
    batch = client.receive(Read([update("a", "2")]))
    assert batch.updates == {} and batch.events == [UnroutedUpdate("a")]
    client.attach("a", "other")
    assert client.receive(Read([update("a", "3")])).updates["a"][0] == "other"


def test_updates_after_a_session_new_reply_are_held_until_the_session_is_attached() -> None:
    # opencode writes its first update in the same read as its session/new reply: the
    # daemon has not attached the session yet when the rest of that read is routed.
    client = attached("a")
    request_id, _ = client.request("session/new", new_session_params("/w"), "w")
    batch = client.receive(Read([reply(request_id, {"sessionId": "n"}), update("n", "first"),
                            update("a", "other"), update("ghost", "x")]))
    assert batch.events == [Replied("w", "session/new", {"sessionId": "n"}, None),
                            UnroutedUpdate("ghost")]
    assert list(batch.updates) == ["a"] and client.holding("n")
    assert client.receive(Read([update("n", "second")])).updates == {}  # a later read: held too
    client.attach("n", "sink-n")
    # Attached but not ready: still held, so nothing overtakes the held ones (either path).
    assert client.receive(Read([update("n", "third")])).updates == {}
    assert client.receive(Read([update("n", "4th"), update("a", "x")])).updates.keys() == {"a"}
    held = client.take_held("n")
    assert [json.loads(raw)["content"]["text"] for raw in held] == [
        "first", "second", "third", "4th"]
    assert not client.holding("n") and client.take_held("n") == []
    assert texts(client.receive(Read([update("n", "5th")])), "n") == ["5th"]
    # A session set up and dropped before it was ready leaves nothing held.
    request_id, _ = client.request("session/new", {}, "w")
    client.receive(Read([reply(request_id, {"sessionId": "gone"}), update("gone", "x")]))
    client.attach("gone", "sink-gone")
    client.detach("gone")
    assert not client.holding("gone")


def test_updates_after_a_session_load_reply_are_held_and_the_replay_still_consumed() -> None:
    client = attached()
    request_id, _ = client.request("session/load", load_session_params("l", "/w"), "w",
                                   loading="l")
    batch = client.receive(Read([update("l", "replayed"), reply(request_id, None),
                            update("l", "commands")]))
    assert batch.updates == {} and len(batch.events) == 1
    client.attach("l", "sink-l")
    assert [json.loads(raw)["content"]["text"] for raw in client.take_held("l")] == [
        "commands"]


def test_nothing_is_held_after_a_failed_create_or_load_or_for_an_attached_session() -> None:
    client = attached("a")
    failed_new, _ = client.request("session/new", {}, "w")
    failed_load, _ = client.request("session/load", {}, "w", loading="x")
    error = {"code": -32603, "message": "Internal error"}
    client.receive(Read([reply(failed_new, error=error), reply(failed_load, error=error)]))
    reload, _ = client.request("session/load", {}, "w", loading="a")
    prompt, _ = client.request("session/prompt", {}, "w")
    batch = client.receive(Read([reply(reload, None), update("a", "live"),
                            reply(prompt, {"sessionId": "p"}), update("p", "x"),
                            update("x", "y")]))
    assert texts(batch, "a") == ["live"]
    assert [e for e in batch.events if isinstance(e, UnroutedUpdate)] == [
        UnroutedUpdate("p"), UnroutedUpdate("x")]
    assert not client.holding("a") and not client.holding("x") and not client.holding("p")


def test_the_hold_is_bounded_in_updates_bytes_and_sessions() -> None:
    client = attached()
    request_id, _ = client.request("session/new", {}, "w")
    client.receive(Read([reply(request_id, {"sessionId": "n"})]))
    batch = client.receive(Read([update("n", str(i)) for i in range(MAX_HELD_UPDATES + 5)]))
    assert batch.events == [HeldUpdatesDropped("n", f"over_{MAX_HELD_UPDATES}_updates")]
    held = client.take_held("n")
    assert [json.loads(raw)["content"]["text"] for raw in held] == [
        str(i) for i in range(MAX_HELD_UPDATES)]
    request_id, _ = client.request("session/new", {}, "w")
    client.receive(Read([reply(request_id, {"sessionId": "big"})]))
    big = "x" * (MAX_HELD_BYTES // 3)
    batch = client.receive(Read([update("big", big) for _ in range(4)]))
    assert batch.events == [HeldUpdatesDropped("big", f"over_{MAX_HELD_BYTES}_bytes")]
    assert len(client.take_held("big")) == 2
    for n in range(MAX_HELD_SESSIONS + 1):  # never attached: the oldest is let go
        request_id, _ = client.request("session/new", {}, "w")
        client.receive(Read([reply(request_id, {"sessionId": f"s{n}"})]))
    assert not client.holding("s0") and client.holding("s1")
    assert client.holding(f"s{MAX_HELD_SESSIONS}")


def test_spaced_updates_are_handed_on_compact() -> None:
    client = attached("a")
    raws = client.receive(Read([update("a", "two words", spaced=True)],
                               spaced=True)).updates["a"][1].updates
    assert raws == [b'{"sessionUpdate":"agent_message_chunk",'
                    b'"content":{"type":"text","text":"two words"}}']


def test_an_update_off_the_fast_path_is_routed_the_same() -> None:
    # "update" is not an object at the front of the Raw here: the slow path decodes and routes.
    client = attached("a")
    line = b'{"method":"session/update","params":{"update":{"k":[1, 2]},"sessionId":"a"},"x":1}'
    batch = client.receive(Read([line]))
    assert batch.updates["a"][1].updates == [b'{"k":[1,2]}']


@pytest.mark.parametrize(
    "line",
    [
        b'{"jsonrpc":"2.0","method":"session/update","params":[1]}',
        b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":1,"update":{}}}',
        b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"a","update":[]}}',
        b'{"jsonrpc":"2.0","method":"session/update"}',
    ],
)
def test_a_bad_update_is_reported_with_an_excerpt(line: bytes) -> None:
    batch = attached("a").receive(Read([line]))
    assert batch.updates == {} and batch.events == [BadUpdate(line[:200])]


def test_other_notifications_and_malformed_lines_are_reported() -> None:
    batch = attached("a").receive(Read([b'{"jsonrpc":"2.0","method":"x/ping","params":{}}',
                                   b"not json", b'{"jsonrpc":"1.0","method":"m"}']))
    assert batch.events[0] == NotificationIgnored("x/ping")
    assert isinstance(batch.events[1], MalformedLine)
    assert batch.events[1].reason.startswith("invalid JSON") and batch.events[1].excerpt == b"not json"
    assert batch.events[2] == MalformedLine("unsupported jsonrpc version '1.0'",
                                            b'{"jsonrpc":"1.0","method":"m"}')


# -- session/load replays ------------------------------------------------------------------------


def test_updates_replayed_during_a_load_are_consumed_until_its_reply() -> None:
    client = attached("a", "b")
    request_id, line = client.request("session/load", load_session_params("a", "/w"), "w",
                                      loading="a")
    assert json.loads(line)["method"] == "session/load" and client.is_loading("a")
    batch = client.receive(Read([update("a", "old-1"), update("b", "live"), update("a", "old-2"),
                            reply(request_id), update("a", "new")]))
    # Only the update after the reply is routed; the other session is not affected.
    assert texts(batch, "a") == ["new"]
    assert texts(batch, "b") == ["live"]
    assert batch.events == [Replied("w", "session/load", {}, None)]
    assert not client.is_loading("a")


def test_a_failed_load_also_ends_the_suppression_at_its_reply() -> None:
    client = attached("a")
    request_id, _ = client.request("session/load", {}, "w", loading="a")
    error = {"code": -32002, "message": "no such session"}
    batch = client.receive(Read([update("a", "old"), reply(request_id, error=error),
                            update("a", "new")]))
    assert texts(batch, "a") == ["new"]
    (event,) = batch.events
    assert isinstance(event, Replied) and isinstance(event.error, AgentRpcError)
    assert (event.error.code, event.error.message) == (-32002, "no such session")


def test_a_load_whose_caller_gave_up_stops_suppressing() -> None:
    client = attached("a")
    request_id, _ = client.request("session/load", {}, "w", loading="a")
    assert client.receive(Read([update("a", "old")])).updates == {}
    client.finished(request_id)  # cancelled: no reply was read
    assert texts(client.receive(Read([update("a", "new")])), "a") == ["new"]
    # Its late reply is then unknown, and changes nothing.
    batch = client.receive(Read([reply(request_id), update("a", "after")]))
    assert batch.events == [ReplyUnknown(request_id)] and texts(batch, "a") == ["after"]


def test_overlapping_loads_of_one_session_suppress_until_the_last_ends() -> None:
    client = attached("a")
    first, _ = client.request("session/load", {}, "w1", loading="a")
    second, _ = client.request("session/load", {}, "w2", loading="a")
    batch = client.receive(Read([reply(first), update("a", "still-replayed")]))
    assert batch.updates == {}
    client.finished(first)  # the first caller's own cleanup must not end the second load
    assert client.receive(Read([update("a", "still-replayed")])).updates == {}
    batch = client.receive(Read([reply(second), update("a", "new")]))
    assert texts(batch, "a") == ["new"]
    client.finished(second)
    assert not client.is_loading("a")


def test_a_closed_connection_keeps_suppressing_until_the_load_caller_finishes() -> None:
    client = attached("a")
    request_id, _ = client.request("session/load", {}, "w", loading="a")
    assert [p.waiter for p in client.drain()] == ["w"]
    assert client.receive(Read([update("a", "old")])).updates == {}
    client.finished(request_id)
    assert texts(client.receive(Read([update("a", "new")])), "a") == ["new"]


def test_other_requests_do_not_suppress_anything() -> None:
    client = attached("a")
    client.request("session/prompt", prompt_params("a", []), "w")
    assert texts(client.receive(Read([update("a", "1")])), "a") == ["1"]


# -- replies -------------------------------------------------------------------------------------


def test_interleaved_replies_reach_their_own_waiters() -> None:
    client = attached("a")
    ids = [client.request(m, {}, w)[0] for m, w in
           [("session/new", "w-new"), ("session/prompt", "w-prompt"), ("session/new", "w-2")]]
    assert len(set(ids)) == 3
    error = {"code": -32603, "message": "boom"}
    batch = client.receive(Read([reply(ids[2], {"sessionId": "s2"}), update("a", "mid"),
                            reply(ids[0], {"sessionId": "s1"}), reply(ids[1], error=error),
                            reply(ids[1], {})]))
    first, second, third, fourth = batch.events
    assert first == Replied("w-2", "session/new", {"sessionId": "s2"}, None)
    assert second == Replied("w-new", "session/new", {"sessionId": "s1"}, None)
    assert isinstance(third, Replied) and third.waiter == "w-prompt" and third.result is None
    assert isinstance(third.error, AgentRpcError) and str(third.error) == "agent error -32603: boom"
    assert fourth == ReplyUnknown(ids[1])  # answered twice
    assert texts(batch, "a") == ["mid"]
    assert len(client.pending) == 0


def test_a_reply_nobody_waits_for_is_reported() -> None:
    client: Client = AcpClient()
    request_id, line = client.request("initialize", {}, "w")
    assert json.loads(line) == {"jsonrpc": "2.0", "id": request_id, "method": "initialize",
                                "params": {}}
    parse_error = {"code": -32700, "message": "Parse error"}
    batch = client.receive(Read([reply(999), reply(str(request_id)), reply(None, error=parse_error)]))
    assert batch.events == [ReplyUnknown(999), ReplyUnknown(str(request_id)), ReplyUnknown(None)]
    assert request_id in client.pending
    client.finished(request_id)
    assert client.receive(Read([reply(request_id)])).events == [ReplyUnknown(request_id)]


def test_ids_are_never_reused() -> None:
    client: Client = AcpClient()
    first, _ = client.request("a", {}, "w")
    client.finished(first)
    client.drain()
    second, _ = client.request("b", {}, "w")
    assert second > first


# -- the agent's requests ------------------------------------------------------------------------


def _permission(session_id: Any, request_id: Any = 7) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "session/request_permission",
                       "params": {"sessionId": session_id, "options": []}}).encode()


def test_a_permission_request_goes_to_the_session_it_names() -> None:
    client = attached("a")
    (event,) = client.receive(Read([_permission("a")])).events
    assert isinstance(event, PermissionAsked)
    assert (event.session_id, event.sink, event.params) == (
        "a", "sink-a", {"sessionId": "a", "options": []})
    granted = permission_granted(event.request, {"outcome": {"outcome": "cancelled"}})
    assert json.loads(granted) == {"jsonrpc": "2.0", "id": 7,
                                   "result": {"outcome": {"outcome": "cancelled"}}}
    failed = json.loads(permission_failed(event.request, ValueError("nope")))
    assert failed["error"] == {"code": INTERNAL_ERROR, "message": "permission failed: nope"}


@pytest.mark.parametrize("session_id", ["ghost", 5, None])
def test_a_permission_request_for_no_session_gets_invalid_params(session_id: Any) -> None:
    client = attached("a")
    (target,) = client.receive(Read([_permission(session_id, "r")])).events
    assert isinstance(target, UnroutedPermission) and target.session_id == session_id
    assert json.loads(target.reply) == {"jsonrpc": "2.0", "id": "r", "error": {
        "code": INVALID_PARAMS, "message": f"unknown session {session_id!r}"}}
    no_params = b'{"jsonrpc": "2.0", "id": 1, "method": "session/request_permission"}'
    (event,) = client.receive(Read([no_params])).events
    assert isinstance(event, UnroutedPermission) and event.session_id is None


def test_a_permission_request_after_the_session_detached_gets_invalid_params() -> None:
    client = attached("a")
    client.detach("a")
    (event,) = client.receive(Read([_permission("a")])).events
    assert isinstance(event, UnroutedPermission)


def test_permission_requests_over_the_cap_are_refused_until_answers_go_out() -> None:
    client = attached("a", "b")
    asked = client.receive(Read([_permission("a", i) for i in range(MAX_PENDING_PERMISSIONS)])).events
    assert all(isinstance(e, PermissionAsked) for e in asked)
    assert client.pending_permissions("a") == MAX_PENDING_PERMISSIONS
    (refused,) = client.receive(Read([_permission("a", "over")])).events
    assert isinstance(refused, PermissionRefused) and refused.session_id == "a"
    error = json.loads(refused.reply)
    assert error["id"] == "over" and error["error"]["code"] == TOO_MANY_REQUESTS
    assert f"limit {MAX_PENDING_PERMISSIONS}" in error["error"]["message"]
    # The cap is per session, and an answer frees one place.
    (other,) = client.receive(Read([_permission("b")])).events
    assert isinstance(other, PermissionAsked)
    client.permission_answered("a")
    (again,) = client.receive(Read([_permission("a", "again")])).events
    assert isinstance(again, PermissionAsked)
    for _ in range(MAX_PENDING_PERMISSIONS):
        client.permission_answered("a")
    assert client.pending_permissions("a") == 0
    client.permission_answered("a")  # more answers than asks never goes negative
    assert client.pending_permissions("a") == 0


def test_a_session_id_attached_to_one_sink_is_refused_to_another() -> None:
    client: Client = AcpClient()
    first, second = "first-sink", "second-sink"
    client.attach("dup", first)
    client.attach("dup", first)  # the same sink again: nothing changes
    with pytest.raises(SessionIdInUse) as caught:
        client.attach("dup", second)
    assert caught.value.acp_session_id == "dup" and "'dup'" in str(caught.value)
    assert client.receive(Read([update("dup", "x")])).updates["dup"][0] == first
    client.detach("dup", second)  # not its id: the first keeps it
    assert client.is_attached("dup")
    assert client.receive(Read([update("dup", "y")])).updates["dup"][0] == first
    client.detach("dup", first)
    assert not client.is_attached("dup")
    client.attach("dup", second)  # free again once its holder detached
    assert client.receive(Read([update("dup", "z")])).updates["dup"][0] == second


@pytest.mark.parametrize("method", ["fs/read_text_file", "session/request_permissions",
                                    "session/update", "terminal/create"])
def test_any_other_agent_request_gets_method_not_found(method: str) -> None:
    line = json.dumps({"jsonrpc": "2.0", "id": "q", "method": method,
                       "params": {"sessionId": "a"}}).encode()
    (event,) = attached("a").receive(Read([line])).events
    assert isinstance(event, UnsupportedRequest)
    assert (event.method, event.id) == (method, "q")
    assert json.loads(event.reply) == {"jsonrpc": "2.0", "id": "q", "error": {
        "code": METHOD_NOT_FOUND, "message": f"Method not found: {method}"}}


# -- one decode per batch ------------------------------------------------------------------------

# Lines a batch may hold: plain updates (fast path), updates the batch decoder refuses but the
# per-line path accepts (an extra member, a missing jsonrpc, spaces), replies, bad updates and
# lines that are not JSON at all.
_MIXED = [
    update("a", "1"),
    update("b", "2"),
    update("a", "three words", spaced=True),
    b'{"method":"session/update","params":{"sessionId":"a","update":{"k":1}}}',
    b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"a","update":{}},"x":1}',
    b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"a","update":[]}}',
    b'{"jsonrpc":"1.0","method":"session/update","params":{"sessionId":"a","update":{}}}',
    b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"ghost","update":{}}}',
    b'{"jsonrpc":"2.0","id":null,"method":"session/update","params":{"sessionId":"a","update":{}}}',
    reply(99),
    b"not json",
    b"{",
]


def _one_by_one(lines: list[bytes]) -> tuple[list[tuple[str, list[bytes]]], list[Any]]:
    """What the lines mean read one per batch (no batch ever spans two lines)."""
    client = attached("a", "b")
    routed: list[tuple[str, list[bytes]]] = []
    events: list[Any] = []
    for line in lines:
        batch = client.receive(Read([line]))
        routed += [(sid, published.updates) for sid, (_, published) in batch.updates.items()]
        events += batch.events
    return routed, events


def _merged(routed: list[tuple[str, list[bytes]]]) -> dict[str, list[bytes]]:
    out: dict[str, list[bytes]] = {}
    for session_id, raws in routed:
        out.setdefault(session_id, []).extend(raws)
    return out


@pytest.mark.parametrize("start", range(len(_MIXED)))
@pytest.mark.parametrize("size", [1, 2, 3, 5, len(_MIXED)])
def test_a_batch_means_what_its_lines_mean_one_by_one(start: int, size: int) -> None:
    lines = (_MIXED * 2)[start:start + size]
    batch = attached("a", "b").receive(Read(lines))
    routed, events = _one_by_one(lines)
    assert {sid: published.updates
            for sid, (_, published) in batch.updates.items()} == _merged(routed)
    assert batch.events == events


def _thought(session_id: str, text: str) -> bytes:
    return update_prefix(session_id) + json.dumps(
        {"sessionUpdate": "agent_thought_chunk", "content": {"type": "text", "text": text}},
        separators=(",", ":")).encode() + b"}}"


# Reads of several sessions' updates at once (many paced turns on one agent): each session's
# lines are read at once when every line is an update of an attached session starting with its
# prefix; anything else sends the whole read line by line.
_SESSIONS_READS = [
    [update("a", "1"), update("b", "2"), update("a", "3 4"), update("b", "5")],
    [update("b", "1"), update("a", "2")],
    [update("a", "1"), _thought("b", "t u"), _thought("b", "v"), update("a", "w x")],
    [update("a", "1"), _thought("a", "mixed kinds"), update("b", "2")],
    [update("a", "1"), update_prefix("b") + b'{"sessionUpdate":"tool_call","k": [1, 2]}}}'],
    [update("a", "1"), update("b", "2", spaced=True)],
    [update("a", "1"), update("ghost", "2")],
    [update("a", "1"), update_prefix("b") + b'{"k":1} }}'],
    [update("a", "1"), update("b", "2"), reply(99)],
]


# Read as the line splitter marks them (a read with a space is ``spaced``), and marked spaced.
@pytest.mark.parametrize(("lines", "spaced"), [
    (lines, spaced) for lines in _SESSIONS_READS
    for spaced in sorted({True, any(b" " in line for line in lines)})])
def test_a_read_of_several_sessions_means_what_its_lines_mean_one_by_one(
        lines: list[bytes], spaced: bool) -> None:
    batch = attached("a", "b").receive(Read(lines, spaced=spaced))
    routed, events = _one_by_one(lines)
    assert {sid: published.updates
            for sid, (_, published) in batch.updates.items()} == _merged(routed)
    assert list(batch.updates) == list(_merged(routed))  # sessions in first-line order
    for sid, (sink, published) in batch.updates.items():
        assert sink == f"sink-{sid}"
        assert published.run == plain_chunk_run(published.updates)
    assert batch.events == events


def test_a_read_of_several_sessions_plain_updates_reads_no_line_alone(
        monkeypatch: pytest.MonkeyPatch) -> None:
    alone: list[bytes] = []

    def counted(line: bytes) -> tuple[str, bytes] | None:
        alone.append(line)
        return parse_update(line)

    monkeypatch.setattr(acp_client_module, "parse_update", counted)
    lines = [update("a", "1"), update("b", "two words"), update("a", "3"),
             update_prefix("b") + b'{"sessionUpdate":"tool_call","toolCallId":"t"}}}']
    batch = attached("a", "b").receive(Read(lines, spaced=True))
    assert alone == []
    assert texts(batch, "a") == ["1", "3"]
    assert batch.updates["b"][1].updates[0] == (
        b'{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"two words"}}')
    # A line of a session that is not attached sends the read line by line.
    batch = attached("a", "b").receive(Read([update("a", "1"), update("c", "2")]))
    assert len(alone) == 2 and texts(batch, "a") == ["1"]


def test_a_read_of_one_sessions_plain_updates_is_checked_at_once() -> None:
    lines = [update("a", "1"), update("a", "2"), update("a", "3 4")]
    prefix = update_prefix("a")
    assert all(line.startswith(prefix) for line in lines)
    assert splice_updates(lines, prefix) == [parse_update(line)[1]  # type: ignore[index]
                                             for line in lines]
    assert splice_updates(lines, update_prefix("b")) is None
    assert splice_updates([], prefix) == []
    batch = attached("a", "b").receive(Read(lines))
    assert texts(batch, "a") == ["1", "2", "3 4"] and batch.events == []
    # An agent that puts spaces between the members is read line by line, made compact.
    spaced = [update("a", "1", spaced=True), update("a", "2 3", spaced=True)]
    assert not spaced[0].startswith(prefix)
    assert attached("a").receive(Read(spaced, spaced=True)).updates["a"][1].updates == [
        b'{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"1"}}',
        b'{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"2 3"}}']


def test_spaces_inside_the_updates_of_a_prefixed_read_are_made_compact() -> None:
    line = update_prefix("a") + b'{"k": [1, 2]}}}'
    assert attached("a").receive(Read([line, line], spaced=True)).updates["a"][1].updates == [
        b'{"k":[1,2]}', b'{"k":[1,2]}']


@pytest.mark.parametrize("middle", [
    b'[]', b'"x"', b'{"k":1} ', b' {"k":1}', b'{"k":', b'{"k":1},{"k":2}', b'{"k":1}{"k":2}',
    b"",
])
def test_a_line_that_only_looks_like_the_prefix_is_read_alone(middle: bytes) -> None:
    good = update("a", "1")
    line = update_prefix("a") + middle + b"}}"
    assert splice_updates([good, line], update_prefix("a")) is None
    batch = attached("a").receive(Read([good, line]))
    routed, events = _one_by_one([good, line])
    assert {sid: published.updates
            for sid, (_, published) in batch.updates.items()} == _merged(routed)
    assert batch.events == events


def test_lines_that_are_json_only_when_joined_are_still_malformed() -> None:
    # Joined as "[A,B]" the two middles are a valid two-element array; neither line alone is
    # JSON. Each must be reported, nothing routed.
    prefix = update_prefix("a")
    lines = [prefix + b'{"k":1},{"k":[{}' + b"}}", prefix + b'{}]}' + b"}}"]
    assert splice_updates(lines, prefix) is None
    batch = attached("a").receive(Read(lines))
    assert batch.updates == {}
    assert [type(event) for event in batch.events] == [MalformedLine, MalformedLine]
    # The same with whitespace making room for the brackets and the commas.
    assert splice_updates([prefix + b'{"k":1}, {"k":[{}}}', prefix + b' {}]}}}'],
                          prefix) is None


def test_a_read_for_a_session_being_loaded_is_consumed() -> None:
    client = attached("a")
    client.request("session/load", {}, "w", loading="a")
    assert client.receive(Read([update("a", "1"), update("a", "2")])) == Batch({}, [])
    client.finished(1)
    client.detach("a")
    batch = client.receive(Read([update("a", "1"), update("a", "2")]))
    assert batch.updates == {} and batch.events == [UnroutedUpdate("a")] * 2


@pytest.mark.parametrize("tail", [b"]}", b"}]", b"} ", b"}", b"}}}", b'},"x":1}'])
def test_a_prefixed_line_must_end_as_the_prefix_opened_it(tail: bytes) -> None:
    good = update("a", "1")
    line = update_prefix("a") + b'{"k":1}' + tail
    assert splice_updates([good, line], update_prefix("a")) is None
    batch = attached("a").receive(Read([good, line]))
    routed, events = _one_by_one([good, line])
    assert {sid: published.updates
            for sid, (_, published) in batch.updates.items()} == _merged(routed)
    assert batch.events == events


# -- a read's session is found in one lookup ----------------------------------------------------


@given(st.text(min_size=1, max_size=40))
def test_prefix_of_cuts_the_update_prefix_of_any_session_id(session_id: str) -> None:
    prefix = update_prefix(session_id)
    line = prefix + b'{"sessionUpdate":"agent_message_chunk","update":1}}'
    assert prefix_of(line) == prefix
    assert prefix_of(b'{"jsonrpc":"2.0","id":1,"result":{}}') is None
    assert prefix_of(prefix[:-1]) is None


def _lines_run(client: AcpClient[str, str], lines: list[bytes]) -> tuple[Any, int]:
    """``client.receive(Read(lines))`` and how many lines of the ACP client and codec it ran."""
    count = 0
    files = {acp_client_module.__file__, acp_codec_module.__file__}

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        nonlocal count
        if frame.f_code.co_filename not in files:
            return None
        if event == "line":
            count += 1
        return tracer

    sys.settrace(tracer)
    try:
        batch = client.receive(Read(lines))
    finally:
        sys.settrace(None)
    return batch, count


def test_a_read_is_routed_without_looking_at_the_other_sessions() -> None:
    # The same read with 2 and with 2,000 other sessions attached runs the same code: the
    # session is found from its line, not by trying every attached session's prefix.
    chunk = (b'{"sessionUpdate":"agent_message_chunk","content":{"type":"text",'
             b'"text":"hi"}}')
    lines = [update_prefix("target") + chunk + b"}}"] * 8
    counts = []
    for others in (2, 2000):
        client: AcpClient[str, str] = AcpClient()
        for i in range(others):
            client.attach(f"other-{i}", f"sink-{i}")
        client.attach("target", "target-sink")  # attached last: a scan would try it last
        batch, count = _lines_run(client, lines)
        (sink, got), = batch.updates.values()
        assert sink == "target-sink" and got.updates == [chunk] * 8
        counts.append(count)
    assert counts[0] == counts[1], counts
