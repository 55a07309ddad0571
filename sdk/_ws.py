"""The WebSocket variant of the event stream: wsproto over the httpx client's own connection.

``GET /session/{id}/ws?lastEventId=&epoch=&maxQueued=`` carries the same envelopes as the SSE
stream, one JSON text message each, with the same resume algorithm. The cursor travels in the
query (a browser cannot set headers on an upgrade). Errors on the upgrade are plain HTTP answers
and map to the same :mod:`sdk._errors` hierarchy as :class:`sdk._client.EventStream`.

The upgrade is an ordinary request of the :class:`~sdk._client.DaemonClient`'s httpx pool (its
token, client id, TLS settings and proxies apply as to every other request); after the ``101``
the connection's byte stream is framed by wsproto's sans-IO :class:`~wsproto.connection.Connection`
right here, pulled by the reader: no background task, so a stream can be opened and closed
anywhere and runs on whatever loop httpx runs on (Trio, asyncio). Pings are answered as they
are read, so a reader that keeps up with its events answers the daemon's keepalive.

Close codes: 1000 when the session ends, 1008 after ``client_evicted``; both end the iteration
cleanly (``ended``). Any other close (1006 abnormal, 1011 missed pongs, 1009 a message over
``max_message_bytes``, …) raises :class:`TransportError`, so a reconnecting reader resumes from
its cursor either way.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
from collections import deque
from types import TracebackType
from typing import Any, Final, NoReturn
from urllib.parse import urlencode, urlsplit

import anyio
import httpx
from wsproto.connection import Connection, ConnectionState, ConnectionType
from wsproto.events import CloseConnection, Message, Ping
from wsproto.utilities import LocalProtocolError, RemoteProtocolError

from sdk._client import DEFAULT_MAX_QUEUED, DaemonClient
from sdk._errors import TransportError, error_for_status
from sdk._httpcore import load_httpcore
from sdk.protocol import headers as wire_headers
from sdk.protocol import routes
from sdk.protocol.cursor import FollowsCursor, ResumeCursor
from sdk.protocol.envelope import DaemonEvent, decode_event
from sdk.protocol.sse import MAX_BUFFER_BYTES

__all__ = ["CLEAN_CLOSE_CODES", "WebSocketEventStream", "ws_url"]

CLOSE_NORMAL: Final = 1000
CLOSE_GOING_AWAY: Final = 1001
CLOSE_POLICY_VIOLATION: Final = 1008
CLOSE_MESSAGE_TOO_BIG: Final = 1009
CLOSE_ABNORMAL: Final = 1006
CLEAN_CLOSE_CODES: Final = frozenset({CLOSE_NORMAL, CLOSE_GOING_AWAY, CLOSE_POLICY_VIOLATION})

# A peer that never takes our close frame must not hold a pause or a reconnect hostage.
_DISCONNECT_TIMEOUT_S: Final = 2.0
_READ_BYTES: Final = 65536
_ACCEPT_GUID: Final = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
_GONE: Final = (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError)


def ws_url(
    base_url: str,
    session_id: str,
    last_event_id: int | None,
    epoch: str | None,
    max_queued: int | None,
) -> str:
    """The stream's ``ws(s)://`` URL: ``http`` becomes ``ws``, ``https`` becomes ``wss``; the
    epoch is sent only together with a cursor, as the daemon ignores it otherwise."""
    if not session_id:
        raise ValueError("session_id must be a non-empty string")
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"base_url must be an http(s) URL, got {base_url!r}")
    scheme = "wss" if parts.scheme == "https" else "ws"
    query = _query(last_event_id, epoch, max_queued)
    path = parts.path.rstrip("/") + routes.EVENTS_WS.url(sessionId=session_id)
    suffix = f"?{urlencode(query)}" if query else ""
    return f"{scheme}://{parts.netloc}{path}{suffix}"


def _query(last_event_id: int | None, epoch: str | None, max_queued: int | None) -> dict[str, str]:
    query: dict[str, str] = {}
    if last_event_id is not None:
        query["lastEventId"] = str(last_event_id)
        if epoch:
            query["epoch"] = epoch
    if max_queued is not None:
        query["maxQueued"] = str(max_queued)
    return query


def _accept_value(key: str) -> str:
    return base64.b64encode(hashlib.sha1(key.encode("ascii") + _ACCEPT_GUID).digest()).decode()


class WebSocketEventStream(FollowsCursor):
    """One WebSocket connection read as typed events; the same surface as ``EventStream``.

    ``last_event_id`` follows :class:`ResumeCursor`'s rules (``max(previous, id)`` from
    frames with an id, 0 on an ``epoch_reset``); ``epoch`` is the ``X-Qwen-Event-Epoch`` of
    the accept (the requested one until then); ``close_code`` is the code the connection ended
    with. Use it as ``async with WebSocketEventStream(client, sid, ...) as stream: async for
    event in stream``. It holds no task: :meth:`aclose` may run in any task.
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
        """The WebSocket close code once the stream ended (1000, 1008, 1006 when dropped, …)."""
        self.retry_ms: int | None = None
        """Always None: a WebSocket has no ``retry:`` field (the SSE stream's surface)."""
        self.url = ws_url(client.base_url, session_id, last_event_id, epoch, max_queued)
        self._client = client
        self._query = _query(last_event_id, epoch, max_queued)
        self._max_message_bytes = max_message_bytes
        self._response: httpx.Response | None = None
        self._network: Any = None  # httpcore's AsyncNetworkStream of the upgraded connection
        self._ws: Connection | None = None
        self._pending: deque[DaemonEvent] = deque()
        self._parts: list[str | bytes] = []
        self._part_bytes = 0
        self._opened = False
        # httpcore's read/write errors, and anyio's: a connection that is gone.
        self._network_errors: tuple[type[BaseException], ...] = (
            load_httpcore().NetworkError, *_GONE)
        self._close_errors: tuple[type[BaseException], ...] = (
            *self._network_errors, LocalProtocolError)

    @property
    def buffered(self) -> int:
        """Events already decoded and not yet handed over (the next ones need no read)."""
        return len(self._pending)

    def request_headers(self) -> dict[str, str]:
        """The headers of the upgrade request, without its ``Sec-WebSocket-Key``."""
        headers = self._client.headers()
        headers.pop("Accept", None)
        headers.update({"Connection": "Upgrade", "Upgrade": "websocket",
                        "Sec-WebSocket-Version": "13"})
        return headers

    async def __aenter__(self) -> WebSocketEventStream:
        if self._opened:
            raise RuntimeError("a WebSocketEventStream can be opened only once; make a new one")
        self._opened = True
        path = routes.EVENTS_WS.url(sessionId=self.session_id)
        what = f"GET {self.url}"
        key = base64.b64encode(secrets.token_bytes(16)).decode()
        headers = self.request_headers()
        headers["Sec-WebSocket-Key"] = key
        http = self._client._http
        # The whole handshake is bounded by the client's timeout; the stream after it is not.
        request = http.build_request("GET", path, headers=headers, params=self._query,
                                     timeout=httpx.Timeout(self._client.timeout))
        self._client._count("GET", path)
        try:
            response = await http.send(request, stream=True)
        except httpx.TimeoutException as exc:
            self._client._count_failure()
            raise TransportError(f"{what}: timed out opening the WebSocket: {exc!r}") from exc
        except httpx.TransportError as exc:
            self._client._count_failure()
            raise TransportError(f"{what}: {exc!r}") from exc
        if response.status_code != 101:
            self._client._count_failure()
            try:
                content = await response.aread()
            except httpx.HTTPError:
                content = b""
            finally:
                await response.aclose()
            if response.status_code >= 300 or response.status_code < 200:
                raise error_for_status(response.status_code, content, response.headers)
            raise TransportError(f"{what}: the daemon answered {response.status_code}, "
                                 "not 101 Switching Protocols", status=response.status_code)
        network = response.extensions.get("network_stream")
        accept = response.headers.get("sec-websocket-accept")
        if network is None or accept != _accept_value(key):
            self._client._count_failure()
            await response.aclose()
            reason = ("the transport gave no connection to upgrade" if network is None
                      else "a wrong Sec-WebSocket-Accept")
            raise TransportError(f"{what}: bad WebSocket handshake: {reason}")
        self._response = response
        self._network = network
        self._ws = Connection(ConnectionType.CLIENT)
        self.cursor.answered(response.headers.get(wire_headers.EVENT_EPOCH))
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Say goodbye (close 1000, at most 2 s) and release the connection, even when the
        caller's scope is cancelled."""
        await self._release(CLOSE_NORMAL)

    async def _release(self, goodbye: int | None) -> None:
        response, self._response = self._response, None
        network, self._network = self._network, None
        ws, self._ws = self._ws, None
        if response is None:
            return
        with anyio.CancelScope(shield=True):
            if goodbye is not None and ws is not None and ws.state is ConnectionState.OPEN:
                with anyio.move_on_after(_DISCONNECT_TIMEOUT_S):
                    try:
                        await network.write(ws.send(CloseConnection(goodbye)))
                    except self._close_errors:
                        pass  # the peer is gone: that is how a severed stream ends
            # Closing the 101 response closes its connection (httpcore does not reuse it).
            await response.aclose()

    def __aiter__(self) -> WebSocketEventStream:
        return self

    async def __anext__(self) -> DaemonEvent:
        if not self._opened:
            raise RuntimeError("use 'async with WebSocketEventStream(...)' before iterating")
        while not self._pending:
            if self._ws is None:
                raise StopAsyncIteration
            await self._read()
        event = self._pending.popleft()
        self.events_received += 1
        self.cursor.observe(event)
        return event

    async def _read(self) -> None:
        """Read once from the connection: decode its messages, answer pings, see a close."""
        ws, network = self._ws, self._network
        assert ws is not None
        try:
            data = await network.read(_READ_BYTES)
        except self._network_errors as exc:
            await self._fail(CLOSE_ABNORMAL, repr(exc), cause=exc)
        if not data:
            await self._fail(CLOSE_ABNORMAL, "the connection dropped without a close frame")
        ws.receive_data(data)
        try:
            for event in ws.events():
                if isinstance(event, Message):
                    if not self._take(event):
                        await self._fail(
                            CLOSE_MESSAGE_TOO_BIG,
                            f"a message over {self._max_message_bytes} bytes",
                            goodbye=CLOSE_MESSAGE_TOO_BIG,
                        )
                elif isinstance(event, Ping):
                    try:
                        await network.write(ws.send(event.response()))
                    except self._network_errors as exc:
                        await self._fail(CLOSE_ABNORMAL, repr(exc), cause=exc)
                elif isinstance(event, CloseConnection):
                    await self._closed(event)
                    return
        except RemoteProtocolError as exc:
            hint = exc.event_hint
            code = hint.code if isinstance(hint, CloseConnection) else 1002
            await self._fail(code, f"protocol error: {exc}", cause=exc, goodbye=code)

    def _take(self, message: Message[Any]) -> bool:
        """Keep a message's data; False when it grew past ``max_message_bytes``."""
        data = message.data
        self._part_bytes += len(data)
        if self._part_bytes > self._max_message_bytes:
            return False
        if not message.message_finished:
            self._parts.append(data)
            return True
        if self._parts:
            self._parts.append(data)
            data = "".join(self._parts) if isinstance(data, str) else b"".join(self._parts)  # type: ignore[arg-type]
            self._parts.clear()
        self._part_bytes = 0
        event = decode_event(data)
        if event is not None:  # the same rule as SSE: invalid frames are skipped silently
            self._pending.append(event)
        return True

    async def _closed(self, event: CloseConnection) -> None:
        """The daemon closed: answer its close frame, then end cleanly or raise."""
        ws = self._ws
        assert ws is not None
        if ws.state is ConnectionState.REMOTE_CLOSING:
            with anyio.move_on_after(_DISCONNECT_TIMEOUT_S):
                try:
                    await self._network.write(ws.send(event.response()))
                except self._close_errors:
                    pass
        code = event.code
        self.close_code = code
        await self._release(None)
        if code in CLEAN_CLOSE_CODES:
            self.ended = True
            return
        detail = f" ({event.reason})" if event.reason else ""
        raise TransportError(
            f"event stream {self.session_id}: WebSocket closed with code {code}{detail}",
            code=str(code),
        )

    async def _fail(self, code: int, why: str, *, cause: BaseException | None = None,
                    goodbye: int | None = None) -> NoReturn:
        self.close_code = code
        await self._release(goodbye)
        raise TransportError(
            f"event stream {self.session_id}: WebSocket closed with code {code}: {why}",
            code=str(code),
        ) from cause
