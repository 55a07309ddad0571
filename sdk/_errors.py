"""The SDK's one small error hierarchy and the retriable/final predicate.

    DaemonError
    ├── DaemonHTTPError(status, body, code)      any non-2xx answer
    │   ├── AuthError                            401 / 403
    │   ├── SessionNotFoundError                 404 / 410
    │   ├── PromptQueueFullError                 503 prompt_queue_full
    │   ├── IdempotencyKeyReusedError            409 idempotency_key_reused
    │   └── ServerError (also a TransportError)  other 5xx
    ├── TransportError                           network, timeout, wrong content type
    ├── InvalidTokenError (also a ValueError)    a token no HTTP header can carry
    ├── SSEBufferOverflow                        an SSE frame over the 16 MiB buffer cap
    ├── PromptOutcomeUnknownError(session_id,    a prompt's sends failed and one may have
    │       idempotency_key, last_error)         been admitted: ask with find_prompt
    └── TurnError(code, message, prompt_id)      a ``turn_error`` terminal

``DaemonError``, ``SSEBufferOverflow`` and ``TurnError`` are the protocol's own
(:mod:`sdk.protocol.errors`: its SSE parser and terminal reader raise them); the HTTP and
transport errors are the SDK's.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from sdk.protocol.errors import DaemonError, SSEBufferOverflow, TurnError
from sdk.protocol.http import view_error_body

__all__ = [
    "AuthError",
    "DaemonError",
    "DaemonHTTPError",
    "InvalidTokenError",
    "PromptQueueFullError",
    "SSEBufferOverflow",
    "ServerError",
    "SessionNotFoundError",
    "TransportError",
    "TurnError",
    "error_for_status",
    "is_retriable",
    "parse_error_body",
]


class DaemonHTTPError(DaemonError):
    """The daemon answered with a non-2xx status. ``body`` is the parsed JSON (or raw text)."""

    def __init__(
        self,
        status: int,
        body: Any = None,
        code: str | None = None,
        message: str | None = None,
    ) -> None:
        text = message if message is not None else _body_message(body)
        detail = f": {text}" if text else ""
        tag = f" ({code})" if code else ""
        # In ServerError the next class in the MRO is TransportError, whose __init__ resets
        # these attributes: assign them after it runs.
        super().__init__(f"HTTP {status}{tag}{detail}")
        self.status = status
        self.body = body
        self.code = code
        self.message = text
        self.retry_after: float | None = None
        """Seconds from the ``Retry-After`` header of a 429 or 503 answer, when it had one."""


class AuthError(DaemonHTTPError):
    """401/403: the token is missing or wrong, or the Host/Origin was refused. Final."""


class SessionNotFoundError(DaemonHTTPError):
    """404/410: the session does not exist (or is gone). Final."""


class TransportError(DaemonError):
    """The exchange failed below the application: network, timeout, 5xx, wrong content type.

    Retriable: reconnecting or resending may succeed.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        body: Any = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = body
        self.code = code


# Both bases name ``status``; here it is always an int, which satisfies both uses.
class ServerError(DaemonHTTPError, TransportError):  # type: ignore[misc]
    """A 5xx answer: an HTTP error with a status and body, and a retriable transport failure."""

    def __init__(
        self,
        status: int,
        body: Any = None,
        code: str | None = None,
        message: str | None = None,
    ) -> None:
        DaemonHTTPError.__init__(self, status, body, code, message)


class PromptQueueFullError(DaemonHTTPError):
    """503 ``prompt_queue_full``: five prompts already run or wait in this session."""

    def __init__(
        self,
        status: int,
        body: Any = None,
        code: str | None = "prompt_queue_full",
        message: str | None = None,
        *,
        retry_after: float | None = None,
        limit: int | None = None,
        pending_count: int | None = None,
    ) -> None:
        super().__init__(status, body, code, message)
        self.retry_after = retry_after
        self.limit = limit
        self.pending_count = pending_count


class IdempotencyKeyReusedError(DaemonHTTPError):
    """409 ``idempotency_key_reused``: this session admitted another prompt request with the
    ``Idempotency-Key`` sent (``prompt_id`` is that prompt). Nothing was admitted for this
    request. Final: a key names one logical prompt, so the caller mixed two up."""

    def __init__(
        self,
        status: int,
        body: Any = None,
        code: str | None = "idempotency_key_reused",
        message: str | None = None,
        *,
        idempotency_key: str | None = None,
        prompt_id: str | None = None,
    ) -> None:
        super().__init__(status, body, code, message)
        self.idempotency_key = idempotency_key
        self.prompt_id = prompt_id


class PromptOutcomeUnknownError(DaemonError):
    """A prompt's submission gave up without knowing whether the daemon admitted it.

    At least one send may have reached the daemon (the connection broke after the request was
    written, no answer came in time, a 5xx answered) and none was answered with the 202, so the
    prompt may be queued, running or done, or may never run. ``idempotency_key`` is the key
    every send carried: ``find_prompt(session_id, idempotency_key)`` asks the daemon, and
    sending the same prompt again with ``idempotency_key=`` set to it admits it at most once.
    Sending it again with a new key may run it twice. ``last_error`` is the last send's failure
    (also ``__cause__``); ``attempts`` counts the sends. Not retriable by a blind resend.
    """

    def __init__(
        self,
        session_id: str,
        idempotency_key: str,
        last_error: DaemonError,
        attempts: int,
    ) -> None:
        self.session_id = session_id
        self.idempotency_key = idempotency_key
        self.last_error = last_error
        self.attempts = attempts
        self.__cause__ = last_error
        super().__init__(
            f"prompt to session {session_id}: not known whether it was admitted after "
            f"{attempts} send{'s' if attempts != 1 else ''} with Idempotency-Key "
            f"{idempotency_key} (last: {last_error}); ask with find_prompt(session_id, "
            f"{idempotency_key!r}) or send it again with that idempotency_key"
        )


class InvalidTokenError(DaemonError, ValueError):
    """The bearer token cannot travel in an HTTP header (raised when the client is built).

    A token must be visible ASCII (``!`` to ``~``, no spaces), the same rule the daemon
    applies when it starts. Final; the message never repeats the token.
    """


_RETRIABLE_CLIENT_STATUSES = frozenset({408, 429})


def is_retriable(exc: BaseException) -> bool:
    """True when retrying (reconnecting, resending) may succeed; False when the error is final.

    Final: auth (401/403) and missing-session (404/410) errors, a ``turn_error``, an oversized
    SSE frame, a :class:`PromptOutcomeUnknownError` (resend that prompt only with its key), and
    any answer whose body says ``retryable: false``. Otherwise an explicit
    ``retryable: true`` is retriable, and so are network errors, timeouts, wrong content
    types, 5xx, 408, 429 and a full prompt queue. Other 4xx answers are final: the same request
    would be refused again.
    """
    if isinstance(exc, AuthError | SessionNotFoundError | TurnError | SSEBufferOverflow):
        return False
    found = view_error_body(getattr(exc, "body", None))
    if found is not None:
        flag = found.retryable
        if isinstance(flag, bool):
            return flag
    if isinstance(exc, TransportError | PromptQueueFullError):
        return True
    if isinstance(exc, DaemonHTTPError):
        return exc.status in _RETRIABLE_CLIENT_STATUSES or exc.status >= 500
    if isinstance(exc, DaemonError):
        return False
    # Raw network failures that escaped wrapping are transport failures too.
    return isinstance(exc, OSError | TimeoutError)


def _body_message(body: Any) -> str | None:
    found = view_error_body(body)
    if found is not None:
        text = found.error
        if isinstance(text, str):
            return text
        text = found.message
        if isinstance(text, str):
            return text
        return None
    if isinstance(body, str) and body:
        return body[:200]
    return None


def parse_error_body(content: bytes) -> Any:
    """The error body as JSON when it is JSON, else as text (never raises)."""
    if not content:
        return None
    try:
        return msgspec.json.decode(content)
    except msgspec.DecodeError:
        return content.decode("utf-8", "replace")


def _optional_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _optional_str(body: Any, name: str) -> str | None:
    value = body.get(name) if isinstance(body, Mapping) else None
    return value if isinstance(value, str) else None


def _retry_after(value: str | None) -> float | None:
    # Only the delta-seconds form: the daemon never sends an HTTP date.
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    return seconds if seconds >= 0 and seconds == seconds else None


def error_for_status(
    status: int, content: bytes, headers: Mapping[str, str] | None = None
) -> DaemonHTTPError:
    """Map a non-2xx answer to the hierarchy. ``headers`` may be any case-insensitive mapping."""
    body = parse_error_body(content)
    found = view_error_body(body)
    code = None if found is None else found.code
    if not isinstance(code, str):
        code = None
    if status in (401, 403):
        return AuthError(status, body, code)
    if status in (404, 410):
        return SessionNotFoundError(status, body, code)
    if status == 503 and code == "prompt_queue_full":
        return PromptQueueFullError(
            status,
            body,
            code,
            retry_after=_retry_after(headers.get("retry-after") if headers is not None else None),
            limit=None if found is None else _optional_int(found.limit),
            pending_count=None if found is None else _optional_int(found.pending_count),
        )
    if status == 409 and code == "idempotency_key_reused":
        return IdempotencyKeyReusedError(
            status,
            body,
            code,
            idempotency_key=_optional_str(body, "idempotencyKey"),
            prompt_id=_optional_str(body, "promptId"),
        )
    error = ServerError(status, body, code) if status >= 500 else DaemonHTTPError(status, body, code)
    if status in (429, 503) and headers is not None:
        error.retry_after = _retry_after(headers.get("retry-after"))
    return error
