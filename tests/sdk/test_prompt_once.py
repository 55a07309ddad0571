"""A prompt's submission, unit by unit: the pure rules of :mod:`sdk._submission` exhaustively,
then :meth:`DaemonClient.send_prompt` and :meth:`DaemonClient.find_prompt` against a scripted
``httpx.MockTransport`` (the waits are recorded, not slept). The same rules against a real
daemon through a fault-injecting proxy: tests/sdk/test_prompt_exactly_once.py.

- Every send carries an ``Idempotency-Key``: a fresh one per call, the caller's when given, the
  same one (and the same body bytes) on every resend of one call.
- Network failures, timeouts, 408/429/502/503/504 are sent again after the policy's wait (at
  least ``Retry-After``), within the call's timeout; a refusal (4xx, a full queue) is not.
- Giving up says what is known: nothing left (no connection) or the daemon refused every send
  → that error itself; any send that may have been admitted → ``PromptOutcomeUnknownError``
  with the session id, the key, the attempts and the last failure.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import anyio
import httpx
import pytest

from sdk import (
    DaemonClient,
    IdempotencyKeyReusedError,
    PromptAccepted,
    PromptOutcomeUnknownError,
    PromptQueueFullError,
    PromptRetryPolicy,
    ServerError,
    SessionNotFoundError,
    TransportError,
    is_retriable,
)
from sdk._errors import DaemonError, DaemonHTTPError, error_for_status
from sdk._submission import Submission, check_idempotency_key, refused, resendable

pytestmark = pytest.mark.anyio

SID = "5d4f3e2a-0000-4000-8000-00000000a001"
ACCEPTED = {"promptId": "p-1", "lastEventId": 4, "eventEpoch": "ep"}
FIXED = PromptRetryPolicy(base_s=0.1, cap_s=0.4, jitter_low=1.0, jitter_high=1.0)
Answer = httpx.Response | Exception


def http_error(status: int, body: dict[str, Any] | None = None,
               headers: dict[str, str] | None = None) -> DaemonHTTPError:
    raw = json.dumps(body if body is not None else {"error": "x"}).encode()
    return error_for_status(status, raw, httpx.Headers(headers or {}))


QUEUE_FULL = {"error": "Prompt queue is full", "code": "prompt_queue_full", "limit": 5,
              "pendingCount": 5}
REUSED = {"error": "reused", "code": "idempotency_key_reused", "idempotencyKey": "k",
          "promptId": "p-0"}


# --- the pure rules ---------------------------------------------------------------------------


@pytest.mark.parametrize(("error", "is_refusal", "is_resendable"), [
    (TransportError("reset"), False, True),
    (TransportError("x", body={"retryable": False}), False, False),
    (http_error(400, {"error": "bad", "code": "invalid_prompt"}), True, False),
    (http_error(401), True, False),
    (http_error(404, {"error": "gone", "code": "session_not_found"}), True, False),
    (http_error(408), True, True),
    (http_error(409, REUSED), True, False),
    (http_error(429, headers={"Retry-After": "2"}), True, True),
    (http_error(503, QUEUE_FULL), True, False),
    (http_error(503, {"error": "owner", "code": "session_owner_unavailable",
                      "retryable": True}), False, True),
    (http_error(503, {"error": "nope", "retryable": False}), False, False),
    (http_error(500), False, False),
    (http_error(500, {"error": "try again", "retryable": True}), False, True),
    (http_error(502), False, True),
    (http_error(504), False, True),
    (http_error(501), False, False),
    (DaemonError("other"), False, False),
])
def test_what_a_failure_proves_and_whether_to_send_again(
        error: DaemonError, is_refusal: bool, is_resendable: bool) -> None:
    assert refused(error) is is_refusal
    assert resendable(error) is is_resendable


def test_a_submission_that_never_left_or_was_refused_gives_up_with_that_error() -> None:
    sub = Submission(SID, "key-1")
    assert sub.failed(TransportError("refused"), delivered=False)
    last = http_error(503, QUEUE_FULL)
    assert not sub.failed(last, delivered=True)
    assert (sub.attempts, sub.maybe_admitted) == (2, False)
    assert sub.give_up() is last


@pytest.mark.parametrize("later", [
    http_error(409, REUSED), http_error(503, QUEUE_FULL), http_error(400),
    TransportError("refused")])
def test_one_send_that_may_have_been_admitted_makes_the_outcome_unknown(
        later: DaemonError) -> None:
    """A later refusal proves nothing about an earlier send: it may still be on its way."""
    sub = Submission(SID, "key-2")
    sub.failed(TransportError("read reset"), delivered=True)
    sub.failed(later, delivered=not isinstance(later, TransportError))
    unknown = sub.give_up()
    assert isinstance(unknown, PromptOutcomeUnknownError)
    assert (unknown.session_id, unknown.idempotency_key, unknown.attempts) == (SID, "key-2", 2)
    assert unknown.last_error is later and unknown.__cause__ is later
    assert "key-2" in str(unknown) and "find_prompt" in str(unknown)
    assert not is_retriable(unknown)  # never blindly: only with its key


def test_give_up_needs_a_failure_and_a_key_must_be_valid() -> None:
    with pytest.raises(RuntimeError):
        Submission(SID, "k").give_up()
    for bad in ("", "a b", "x" * 129, "naïve", "a/b"):
        with pytest.raises(ValueError):
            check_idempotency_key(bad)
    assert check_idempotency_key("A-z_0.9:~" + "k" * 119) == "A-z_0.9:~" + "k" * 119


def test_the_policy_doubles_up_to_its_cap_and_honours_retry_after() -> None:
    def low(a: float, b: float) -> float:
        return a

    policy = PromptRetryPolicy(base_s=0.1, cap_s=1.0, jitter_low=0.5, jitter_high=2.0)
    assert [policy.delay(n, low) for n in (1, 2, 3, 4, 5, 500)] == \
        [0.05, 0.1, 0.2, 0.4, 0.5, 0.5]
    assert policy.delay(1, low, retry_after_s=3.0) == 3.0
    assert policy.delay(5, low, retry_after_s=0.01) == 0.5
    with pytest.raises(ValueError):
        policy.delay(0, low)
    with pytest.raises(ValueError):
        PromptRetryPolicy(base_s=-1)
    with pytest.raises(ValueError):
        PromptRetryPolicy(jitter_low=2, jitter_high=1)
    with pytest.raises(ValueError):
        PromptRetryPolicy(timeout_s=0)


# --- the client against a scripted transport -------------------------------------------------


class Script:
    """Answers each prompt send with the next scripted answer (a response, or an httpx
    exception raised as the transport would), recording what was sent."""

    def __init__(self, answers: list[Answer]) -> None:
        self.answers = list(answers)
        self.sent: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(request)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    @property
    def keys(self) -> list[str | None]:
        return [r.headers.get("idempotency-key") for r in self.sent]


class Waits:
    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


def client_for(script: Script | Callable[[httpx.Request], Any], waits: Waits,
               **kw: Any) -> DaemonClient:
    return DaemonClient("http://daemon", transport=httpx.MockTransport(script), sleep=waits,
                        prompt_retry=FIXED, **kw)


def answer(status: int, body: Any = None, headers: dict[str, str] | None = None,
           ) -> httpx.Response:
    return httpx.Response(status, json=body if body is not None else {"error": "x"},
                          headers=headers)


def read_error() -> Exception:
    return httpx.ReadError("connection reset by peer")


def connect_error() -> Exception:
    return httpx.ConnectError("connection refused")


async def test_each_call_has_a_fresh_key_and_a_callers_key_is_sent_as_is() -> None:
    script = Script([answer(202, ACCEPTED)] * 3)
    async with client_for(script, Waits()) as client:
        first = await client.send_prompt(SID, "one")
        await client.send_prompt(SID, "two")
        await client.send_prompt(SID, "three", idempotency_key="mine-1")
        with pytest.raises(ValueError):
            await client.send_prompt(SID, "four", idempotency_key="not a key")
    assert first == PromptAccepted(prompt_id="p-1", last_event_id=4, event_epoch="ep")
    keys = script.keys
    assert len(script.sent) == 3 and keys[2] == "mine-1"
    assert keys[0] and keys[1] and keys[0] != keys[1]
    assert all(check_idempotency_key(k or "") for k in keys)


async def test_failures_are_resent_with_the_same_key_and_body_until_the_202() -> None:
    script = Script([read_error(), httpx.RemoteProtocolError("server disconnected"),
                     httpx.ReadTimeout("read timed out"), answer(502), answer(504),
                     answer(503, {"error": "owner", "code": "session_owner_unavailable",
                                  "retryable": True}, {"Retry-After": "1"}),
                     answer(429, headers={"Retry-After": "2"}),
                     answer(202, {"lastEventId": 4}),  # unreadable: admitted, most likely
                     answer(202, ACCEPTED)])
    waits = Waits()
    async with client_for(script, waits) as client:
        got = await client.send_prompt(SID, "hello", deadline_ms=5000)
        stats = client.statistics()
    assert got.prompt_id == "p-1"
    assert len(script.sent) == 9 and len(set(script.keys)) == 1
    assert {r.content for r in script.sent} == \
        {b'{"prompt":[{"type":"text","text":"hello"}],"deadlineMs":5000}'}
    assert waits.waits == [0.1, 0.2, 0.4, 0.4, 0.4, 1.0, 2.0, 0.4]
    assert (stats.prompts, stats.failures) == (9, 8)


@pytest.mark.parametrize(("reply", "raised"), [
    (answer(400, {"error": "bad", "code": "invalid_prompt"}), DaemonHTTPError),
    (answer(404, {"error": "gone", "code": "session_not_found"}), SessionNotFoundError),
    (answer(409, REUSED), IdempotencyKeyReusedError),
    (answer(503, QUEUE_FULL, {"Retry-After": "5"}), PromptQueueFullError),
])
async def test_a_refusal_is_raised_at_once(reply: httpx.Response, raised: type[Exception]
                                           ) -> None:
    script = Script([reply])
    waits = Waits()
    async with client_for(script, waits) as client:
        with pytest.raises(raised) as info:
            await client.send_prompt(SID, "hi")
    assert type(info.value) is raised and len(script.sent) == 1 and waits.waits == []
    if isinstance(info.value, IdempotencyKeyReusedError):
        assert (info.value.idempotency_key, info.value.prompt_id) == ("k", "p-0")


async def test_an_unreachable_daemon_is_retried_and_then_known_not_to_have_run() -> None:
    script = Script([connect_error()] * 100)
    waits = Waits()
    async with client_for(script, waits, timeout=1.0) as client:
        with pytest.raises(TransportError, match="connection refused") as info:
            await client.send_prompt(SID, "hi")
    assert not isinstance(info.value, PromptOutcomeUnknownError)
    assert waits.waits == [0.1, 0.2, 0.4]  # a fourth wait would pass the 1 s timeout
    assert len(script.sent) == 4 and len(set(script.keys)) == 1


async def test_the_policys_timeout_bounds_a_call_that_names_none() -> None:
    script = Script([connect_error()] * 100)
    waits = Waits()
    # Waits far longer than the sends take in real time (the injected sleep takes none, and a
    # call's time spent is the larger of the two), so a loaded machine cannot change the count.
    policy = PromptRetryPolicy(base_s=5.0, cap_s=5.0, jitter_low=1.0, jitter_high=1.0,
                               timeout_s=20.0)
    async with DaemonClient("http://daemon", transport=httpx.MockTransport(script),
                            sleep=waits, prompt_retry=policy, timeout=30.0) as client:
        with pytest.raises(TransportError):
            await client.send_prompt(SID, "hi")
        assert waits.waits == [5.0, 5.0, 5.0]
        with pytest.raises(TransportError):
            await client.send_prompt(SID, "hi", timeout=12.0)  # the call's own wins
        assert waits.waits == [5.0, 5.0, 5.0, 5.0, 5.0]


async def test_a_send_that_may_have_been_admitted_makes_giving_up_say_so() -> None:
    script = Script([connect_error(), read_error(), answer(503, QUEUE_FULL)])
    waits = Waits()
    async with client_for(script, waits) as client:
        with pytest.raises(PromptOutcomeUnknownError) as info:
            await client.send_prompt(SID, "hi", idempotency_key="k-7")
    unknown = info.value
    assert (unknown.session_id, unknown.idempotency_key, unknown.attempts) == (SID, "k-7", 3)
    assert isinstance(unknown.last_error, PromptQueueFullError)
    assert len(script.sent) == 3


@pytest.mark.parametrize("reply", [answer(500), answer(501),
                                   answer(503, {"error": "no", "retryable": False})])
async def test_a_final_5xx_is_an_unknown_outcome_at_once(reply: httpx.Response) -> None:
    """A 5xx does not say whether the request was admitted before it failed."""
    script = Script([reply])
    async with client_for(script, Waits()) as client:
        with pytest.raises(PromptOutcomeUnknownError) as info:
            await client.send_prompt(SID, "hi")
    assert isinstance(info.value.last_error, ServerError) and len(script.sent) == 1


async def test_a_daemon_that_never_answers_ends_within_the_calls_timeout() -> None:
    """Real time: each send waits for an answer that never comes; the call gives up within
    its timeout, with sends that may all have been admitted."""
    sent: list[str | None] = []
    never = anyio.Event()

    async def hang(request: httpx.Request) -> httpx.Response:
        sent.append(request.headers.get("idempotency-key"))
        await never.wait()
        raise AssertionError("unreachable")

    async with DaemonClient("http://daemon", transport=httpx.MockTransport(hang),
                            timeout=0.2, prompt_retry=FIXED) as client:
        with anyio.fail_after(10):
            with pytest.raises(PromptOutcomeUnknownError) as info:
                await client.send_prompt(SID, "hi", timeout=1.0)
    assert len(sent) >= 2 and len(set(sent)) == 1
    assert info.value.attempts == len(sent)
    assert "timed out" in str(info.value.last_error) or "no answer" in str(info.value.last_error)


async def test_find_prompt_answers_the_ledger_none_or_a_missing_session() -> None:
    found = {"v": 1, "sessionId": SID, "idempotencyKey": "k-1", "promptId": "p-1",
             "lastEventId": 4, "eventEpoch": "ep", "state": "completed",
             "stopReason": "end_turn", "admittedAt": 1, "endedAt": 2}
    answers = {
        "k-1": answer(200, found),
        "k-2": answer(404, {"error": "no prompt", "code": "prompt_not_found",
                            "sessionId": SID, "idempotencyKey": "k-2"}),
        "k-3": answer(404, {"error": "no session", "code": "session_not_found"}),
    }
    asked: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.path)
        return answers[request.url.path.rsplit("/", 1)[1]]

    async with client_for(handler, Waits()) as client:
        got = await client.find_prompt(SID, "k-1")
        assert got is not None
        assert (got.prompt_id, got.state, got.stop_reason) == ("p-1", "completed", "end_turn")
        assert await client.find_prompt(SID, "k-2") is None
        with pytest.raises(SessionNotFoundError):
            await client.find_prompt(SID, "k-3")
        with pytest.raises(ValueError):
            await client.find_prompt(SID, "no/slash")
        assert client.statistics().count("find_prompt") == 3
    assert asked[0] == f"/session/{SID}/prompts/k-1"
