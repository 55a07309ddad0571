"""Submitting a prompt exactly once: the rules of the client's resend loop. Pure: no I/O, no
clock, no randomness of its own (the caller passes the jitter source).

Every logical prompt carries one ``Idempotency-Key`` on every send, so the daemon admits it at
most once however often it is sent. A :class:`Submission` records what each failed send proves
and decides what the caller may say when it gives up:

- a send that never left (the connection could not be opened) proves nothing was admitted;
- a send the daemon answered with a refusal (a 4xx, a full prompt queue) was not admitted;
- any other failure (the connection broke after the request was written, no answer in time,
  a 5xx, a 2xx whose body is unreadable) may have been admitted, and a request stuck on its
  way may still arrive later. Once one send is like that, only a 202 settles it: giving up
  raises :class:`~sdk._errors.PromptOutcomeUnknownError` with the key.

Which failures are worth sending again (:func:`resendable`): network failures and timeouts,
408, 429, 502, 503 and 504 (gateways and a cluster's unavailable owner), and any answer whose
body says ``retryable: true``; never one that says ``retryable: false``, and never a full queue
(503 ``prompt_queue_full``: the caller decides whether to wait for the queue).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Final

import msgspec

from sdk._errors import (
    DaemonError,
    DaemonHTTPError,
    PromptOutcomeUnknownError,
    PromptQueueFullError,
    TransportError,
)
from sdk.protocol.http import IDEMPOTENCY_KEY_PATTERN, view_error_body

__all__ = ["PromptRetryPolicy", "Submission", "check_idempotency_key", "refused", "resendable"]

UniformFn = Callable[[float, float], float]

_KEY_RE: Final = re.compile(IDEMPOTENCY_KEY_PATTERN)
_RESENT_STATUSES: Final = frozenset({408, 429, 502, 503, 504})


def check_idempotency_key(key: str) -> str:
    """``key`` when the daemon accepts it as an ``Idempotency-Key`` (1-128 of letters, digits
    and ``_ . : ~ -``), else :class:`ValueError` (nothing is sent)."""
    if not isinstance(key, str) or not _KEY_RE.fullmatch(key):
        raise ValueError(
            f"idempotency_key must be 1-128 of letters, digits and _ . : ~ -, got {key!r}")
    return key


class PromptRetryPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """How one prompt's sends are spaced and bounded: ``min(base_s · 2^(n−1), cap_s) ×
    uniform[jitter_low, jitter_high]`` before send n+1, at least the answer's ``Retry-After``
    when it had one; the whole submission ends within ``timeout_s`` (``None``: the client's
    ``timeout``) unless the call names its own (:meth:`sdk._client.DaemonClient.send_prompt`).
    Each send gets at most the client's ``timeout`` of that."""

    base_s: float = 0.1
    cap_s: float = 2.0
    jitter_low: float = 0.8
    jitter_high: float = 1.2
    timeout_s: float | None = None

    def __post_init__(self) -> None:
        if not (self.base_s >= 0 and self.cap_s >= 0):
            raise ValueError("PromptRetryPolicy delays must be >= 0")
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise ValueError(f"PromptRetryPolicy timeout_s must be positive, got {self.timeout_s}")
        if not 0 <= self.jitter_low <= self.jitter_high:
            raise ValueError("PromptRetryPolicy needs 0 <= jitter_low <= jitter_high")

    def delay(self, failures: int, uniform: UniformFn, retry_after_s: float | None = None) -> float:
        """The wait after ``failures`` failed sends (1-based)."""
        if failures < 1:
            raise ValueError(f"failures is 1-based, got {failures}")
        backoff = min(self.base_s * 2.0 ** min(failures - 1, 64), self.cap_s)
        wait = backoff * uniform(self.jitter_low, self.jitter_high)
        if retry_after_s is not None and retry_after_s > wait:
            wait = retry_after_s
        return wait


def _says_retryable(error: DaemonError) -> bool | None:
    found = view_error_body(getattr(error, "body", None))
    flag = None if found is None else found.retryable
    return flag if isinstance(flag, bool) else None


def refused(error: DaemonError) -> bool:
    """The daemon answered this very send with a refusal, so that send admitted nothing: a 4xx
    (validation, auth, no such session, a key reused for another request) or a full queue."""
    if isinstance(error, PromptQueueFullError):
        return True
    return isinstance(error, DaemonHTTPError) and 400 <= error.status < 500


def resendable(error: DaemonError) -> bool:
    """Sending the same request again (with the same key) may succeed (see the module
    docstring)."""
    said = _says_retryable(error)
    if said is False or isinstance(error, PromptQueueFullError):
        return False
    if said is True:
        return True
    if isinstance(error, DaemonHTTPError):
        return error.status in _RESENT_STATUSES
    return isinstance(error, TransportError)


class Submission:
    """The sends of one logical prompt: its session, its key, and what the failures so far
    prove (see the module docstring)."""

    __slots__ = ("attempts", "idempotency_key", "last_error", "maybe_admitted", "session_id")

    def __init__(self, session_id: str, idempotency_key: str) -> None:
        self.session_id = session_id
        self.idempotency_key = check_idempotency_key(idempotency_key)
        self.attempts = 0
        self.maybe_admitted = False
        """Some send may have reached the daemon without an answer that refused it."""
        self.last_error: DaemonError | None = None

    def failed(self, error: DaemonError, *, delivered: bool) -> bool:
        """Record a failed send: ``delivered`` is False only when the request cannot have left
        (the connection was never opened). Returns whether sending again may succeed."""
        self.attempts += 1
        self.last_error = error
        if delivered and not refused(error):
            self.maybe_admitted = True
        return resendable(error)

    def retry_after(self) -> float | None:
        """The last answer's ``Retry-After`` in seconds, when it had one."""
        value = getattr(self.last_error, "retry_after", None)
        return value if isinstance(value, int | float) else None

    def give_up(self) -> DaemonError:
        """The error to raise now: :class:`PromptOutcomeUnknownError` when a send may have
        been admitted, else the last failure itself (nothing was admitted, nothing will be)."""
        if self.last_error is None:
            raise RuntimeError("give_up() before any send failed")
        if self.maybe_admitted:
            return PromptOutcomeUnknownError(
                self.session_id, self.idempotency_key, self.last_error, self.attempts)
        return self.last_error
