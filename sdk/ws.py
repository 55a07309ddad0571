"""The WebSocket variant of the event stream over ``trio-websocket``.

``GET /session/{id}/ws?lastEventId=&epoch=&maxQueued=`` carries the same envelopes as the SSE
stream, one JSON text message each, with the same resume algorithm. The cursor travels in the
query (a browser cannot set headers on an upgrade). Errors on the upgrade are plain HTTP answers
and map to the same :mod:`sdk.errors` hierarchy as :class:`sdk.client.EventStream`.

Close codes: 1000 when the session ends, 1008 after ``client_evicted``; both end the iteration
cleanly (``ended``). Any other close (1006 abnormal, 1011 missed pongs, …) raises
:class:`TransportError`, so a reconnecting reader resumes from its cursor either way.
"""

from __future__ import annotations

import contextlib
from types import TracebackType
from typing import Final
from urllib.parse import quote, urlencode, urlsplit

import trio
import trio_websocket

from sdk.client import DEFAULT_MAX_QUEUED, EPOCH_HEADER, DaemonClient
from sdk.errors import TransportError, error_for_status
from sdk.protocol.cursor import FollowsCursor, ResumeCursor
from sdk.protocol.envelope import DaemonEvent, decode_event
from sdk.protocol.sse import MAX_BUFFER_BYTES

__all__ = ["CLEAN_CLOSE_CODES", "WebSocketEventStream", "ws_url"]

CLOSE_NORMAL: Final = 1000
CLOSE_GOING_AWAY: Final = 1001
CLOSE_POLICY_VIOLATION: Final = 1008
CLEAN_CLOSE_CODES: Final = frozenset({CLOSE_NORMAL, CLOSE_GOING_AWAY, CLOSE_POLICY_VIOLATION})

# A peer that never answers our close frame must not hold a pause or a reconnect hostage.
_DISCONNECT_TIMEOUT_S: Final = 2.0


def ws_url(
    base_url: str,
    session_id: str,
    last_event_id: int | None,
    epoch: str | None,
    max_queued: int | None,
) -> str:
    """The upgrade URL: ``http`` becomes ``ws``, ``https`` becomes ``wss``; the epoch is sent
    only together with a cursor, as the daemon ignores it otherwise."""
    if not session_id:
        raise ValueError("session_id must be a non-empty string")
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"base_url must be an http(s) URL, got {base_url!r}")
    scheme = "wss" if parts.scheme == "https" else "ws"
    query: dict[str, str] = {}
    if last_event_id is not None:
        query["lastEventId"] = str(last_event_id)
        if epoch:
            query["epoch"] = epoch
    if max_queued is not None:
        query["maxQueued"] = str(max_queued)
    path = f"{parts.path.rstrip('/')}/session/{quote(session_id, safe='')}/ws"
    suffix = f"?{urlencode(query)}" if query else ""
    return f"{scheme}://{parts.netloc}{path}{suffix}"


class WebSocketEventStream(FollowsCursor):
    """One WebSocket connection read as typed events; the same surface as ``EventStream``.

    ``last_event_id`` follows :class:`ResumeCursor`'s rules (``max(previous, id)`` from
    frames with an id, 0 on an ``epoch_reset``); ``epoch`` is the ``X-Qwen-Event-Epoch`` of
    the accept (the requested one until then); ``close_code`` is the code the connection ended with. Use it as
    ``async with WebSocketEventStream(client, sid, ...) as stream: async for event in stream``:
    the connection runs trio-websocket's reader in a nursery, so it must be opened and closed
    in the same task at the same scope level, which ``async with`` guarantees.
    """

    def __init__(
        self,
        client: DaemonClient,
        session_id: str,
        last_event_id: int | None = None,
        epoch: str | None = None,
        *,
        max_queued: int | None = DEFAULT_MAX_QUEUED,
        max_message_bytes: int = MAX_BUFFER_BYTES,
    ) -> None:
        self.cursor = ResumeCursor(last_event_id, epoch)
        """The resume cursor and epoch (:mod:`sdk.protocol.cursor`'s rules)."""
        self.session_id = session_id
        self.events_received = 0
        self.ended = False
        self.close_code: int | None = None
        """The WebSocket close code once the daemon closed the stream (1000, 1008, …)."""
        self.retry_ms: int | None = None
        """Always None: a WebSocket has no ``retry:`` field (the SSE stream's surface)."""
        self.url = ws_url(client.base_url, session_id, last_event_id, epoch, max_queued)
        self._client = client
        self._max_message_bytes = max_message_bytes
        self._stack: contextlib.AsyncExitStack | None = None
        self._ws: trio_websocket.WebSocketConnection | None = None
        self._opened = False

    def request_headers(self) -> list[tuple[bytes, bytes]]:
        headers = self._client.headers()
        headers.pop("Accept", None)
        return [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]

    async def __aenter__(self) -> WebSocketEventStream:
        if self._opened:
            raise RuntimeError("a WebSocketEventStream can be opened only once; make a new one")
        self._opened = True
        stack = contextlib.AsyncExitStack()
        what = f"GET {self.url}"
        self._client._count("GET", urlsplit(self.url).path)
        try:
            ws = await stack.enter_async_context(
                trio_websocket.open_websocket_url(
                    self.url,
                    extra_headers=self.request_headers(),
                    max_message_size=self._max_message_bytes,
                    connect_timeout=self._client.timeout,
                    disconnect_timeout=_DISCONNECT_TIMEOUT_S,
                )
            )
        except trio_websocket.ConnectionRejected as exc:
            self._client._count_failure()
            await stack.aclose()
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in exc.headers}
            raise error_for_status(exc.status_code, exc.body or b"", headers) from exc
        except trio_websocket.ConnectionTimeout as exc:
            self._client._count_failure()
            await stack.aclose()
            raise TransportError(f"{what}: timed out opening the WebSocket") from exc
        except (trio_websocket.HandshakeError, OSError, trio.BrokenResourceError) as exc:
            self._client._count_failure()
            await stack.aclose()
            cause = exc.__cause__ if exc.__cause__ is not None else exc
            raise TransportError(f"{what}: {cause!r}") from exc
        self._stack = stack
        self._ws = ws
        for key, value in ws.handshake_headers:
            if key.decode("latin-1").lower() == EPOCH_HEADER.lower():
                self.cursor.answered(value.decode("latin-1"))
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection; call it from the scope level that opened the stream."""
        stack, self._stack = self._stack, None
        self._ws = None
        if stack is None:
            return
        try:
            await stack.aclose()
        except (trio_websocket.HandshakeError, OSError, trio.BrokenResourceError):
            # The close handshake failing (peer gone) is the expected way a severed stream ends.
            pass

    def __aiter__(self) -> WebSocketEventStream:
        return self

    async def __anext__(self) -> DaemonEvent:
        if not self._opened:
            raise RuntimeError("use 'async with WebSocketEventStream(...)' before iterating")
        while True:
            ws = self._ws
            if ws is None:
                raise StopAsyncIteration
            try:
                message = await ws.get_message()
            except trio_websocket.ConnectionClosed as exc:
                reason = exc.reason
                # No close reason at all means the connection dropped: 1006 (abnormal).
                code = reason.code if reason is not None else 1006
                self.close_code = code
                # Not closed here: the connection's nursery must be exited where it was
                # entered (``__aexit__``/``aclose``), never from inside the caller's scopes.
                self._ws = None
                if code in CLEAN_CLOSE_CODES:
                    self.ended = True
                    raise StopAsyncIteration from None
                detail = f" ({reason.reason})" if reason is not None and reason.reason else ""
                raise TransportError(
                    f"event stream {self.session_id}: WebSocket closed with code {code}{detail}",
                    code=str(code),
                ) from exc
            event = decode_event(message)
            if event is None:
                continue  # the same rule as SSE: invalid frames are skipped silently
            self.events_received += 1
            self.cursor.observe(event)
            return event
