"""Routing requests in a cluster: served here, forwarded to the owner, answered 503, or the
session taken over. Trio shell over :func:`daemon.core.cluster.route`.

The router sits in front of the app (``DaemonASGI``): a request for a session this node does
not run is forwarded to its owner (signed, :mod:`daemon.core.cluster_auth`), answered ``503``
while a dead owner's lease runs, or takes the session over once the lease is gone (the op log is
replayed into the local store and the single-node cold restore runs on it); an event stream of
a session owned elsewhere is served from a mirror (:mod:`daemon.cluster._mirror`). Redis
trouble is a 503 ``cluster_unavailable`` with ``Retry-After``, never a 500 or a hang.
"""

from __future__ import annotations

import hmac
import logging
import secrets
import time
import uuid
from collections.abc import MutableMapping
from typing import Any

import httpx
import msgspec
import trio

from sdk.protocol import routes
from sdk.protocol.headers import CLUSTER_NODE, CLUSTER_PROBE, lower
from sdk.protocol.http import (
    CreateSessionResponse,
    ErrorBody,
    route_not_found,
    session_not_found,
    view_session_id,
)

from ..bus import BusLimits, SessionBus
from ..core import cluster_auth
from ..core.cluster import Forward, Local, TakeOver, Unavailable, Unknown, route
from ..core.envelope import decode_json, encode_json
from ..core.transcript_ops import DeleteSession
from ..manager import SESSION_LIMIT_RETRY_AFTER_S, SessionLimit, SessionManager, _KeyedLocks
from ..streams import StreamRequestError
from ..transcript_writer import TranscriptWriter
from ._membership import Membership
from ._mirror import Mirrors
from ._redis import ClusterUnavailable, Redis
from ._shipping import Shipping

_decode_created = msgspec.json.Decoder(CreateSessionResponse).decode

log = logging.getLogger("daemon.cluster")
# httpx logs each forwarded request at info: the daemon's own lines say what matters.
logging.getLogger("httpx").setLevel(logging.WARNING)

FORWARDED_HEADER = cluster_auth.FORWARDED_HEADER
SIGNATURE_HEADER = cluster_auth.SIGNATURE_HEADER
# Hop-by-hop headers, those the HTTP client sets itself, and the forward's own (signed anew at
# every hop). Everything else a client sent is carried through unchanged.
_DROP_REQUEST = frozenset({"host", "content-length", "connection", "keep-alive",
                           "transfer-encoding", "upgrade", FORWARDED_HEADER, SIGNATURE_HEADER})
_DROP_RESPONSE = frozenset({"content-length", "connection", "keep-alive", "transfer-encoding",
                            "date", "server"})
# A node checks that its --node-url reaches itself by asking it for a nonce only it knows.
PROBE_PATH = routes.NODE_PROBE.path
PROBE_HEADER = lower(CLUSTER_PROBE)
_NODE_HEADER = lower(CLUSTER_NODE)


class ClusterRouter:
    """Routes session requests in front of the app (see the module docstring)."""

    def __init__(self, redis: Redis, membership: Membership, shipping: Shipping,
                 mirrors: Mirrors, manager: SessionManager, writer: TranscriptWriter,
                 secret: bytes, *, token: str | None = None) -> None:
        self.redis = redis
        self.membership = membership
        self.shipping = shipping
        self.mirrors = mirrors
        self.manager = manager
        self.writer = writer
        self.secret = secret  # signs and checks the forwards (daemon.core.cluster_auth)
        self.token = token  # the daemon's own, for the --node-url probe through its guard
        lease_s = membership.lease_s
        # A forward gets the lease: an owner that does not answer within its own lease cannot
        # be relied on to still hold it. Its connection gets at most 2 s of it.
        self.http = httpx.AsyncClient(timeout=httpx.Timeout(
            max(lease_s, 0.5), connect=min(2.0, max(lease_s, 0.5))))
        self._takeover_locks = _KeyedLocks()
        self._nonces = cluster_auth.NonceWindow()
        self.ready = False  # set once --node-url was checked: until then sessions wait
        self.forwarded = 0
        self.takeovers = 0
        self.forwards_rejected = 0

    @staticmethod
    def session_id_of(path: str) -> str | None:
        return routes.session_of(path)

    def _grace_left_ms(self) -> int:
        return round(self.redis.link.grace_left(trio.current_time()) * 1000)

    async def _decide(self, session_id: str) -> Any:
        if self.manager.get(session_id) is not None and \
                session_id not in self.membership.fenced:
            return Local()
        entry, pttl, _ = await self.redis.lookup(session_id)
        return route(entry, pttl, self.membership.node_id, live_here=False,
                     grace_left_ms=self._grace_left_ms())

    async def _local(self, session_id: str) -> bool:
        """Is the session live here and this node still its owner? A lease in doubt (this
        node was paused, or Redis did not answer its renewals) is settled with Redis first:
        False once it turned out lost; :class:`ClusterUnavailable` when Redis would not say
        within a lease."""
        membership = self.membership
        if self.manager.get(session_id) is None or session_id in membership.fenced:
            return False
        if not membership.in_doubt(session_id) or await membership.settle(
                session_id, membership.lease_s):
            return True
        if membership.owns(session_id):
            raise ClusterUnavailable("this node's lease of the session is in doubt and Redis "
                                     "does not answer")
        return False  # lost: the session ends here; the request goes to the new owner

    async def take_over(self, session_id: str) -> bool:
        """Restore the session here after its owner's lease ran out: claim the lease, replay
        its op log into the local store, then the single-node cold restore."""
        membership, shipping = self.membership, self.shipping
        async with self._takeover_locks.hold(session_id):
            if self.manager.get(session_id) is not None:
                return True
            ending = self.manager.sessions.get(session_id)
            if ending is not None:
                # It is ending here (a client deleted it, its agent died): its last writes
                # (a close, a release) are queued once it has ended. Never restored meanwhile.
                with trio.move_on_after(membership.lease_s):
                    await ending.ended.wait()
                if not ending.ended.is_set():
                    raise ClusterUnavailable(f"{session_id} is still ending on this node")
            if not shipping.idle(session_id):
                # It just ended here (closed, its agent died): what it wrote last (a close,
                # a release) decides what the directory says. Let it land first.
                with trio.move_on_after(membership.lease_s):
                    await shipping.wait_acked(shipping.last_seq)
            entry, pttl, _ = await self.redis.lookup(session_id)
            decision = route(entry, pttl, membership.node_id, live_here=False,
                             grace_left_ms=self._grace_left_ms())
            if not isinstance(decision, TakeOver) or entry is None:
                return False
            # No free --max-sessions slot: a 503 session_limit, and no lease is taken.
            self.manager.refuse_past_cap()
            membership.busy.add(session_id)
            try:
                generation = await membership.claim(session_id, entry.workspace, entry.epoch)
                if generation is None:
                    return False
                ops = await shipping.compact_log(session_id,
                                                 await self.redis.op_log(session_id))
                self.writer.submit_local(DeleteSession(session_id))
                for op in ops:
                    self.writer.submit_local(op)
                try:
                    session = await self.manager.restore(session_id)
                except SessionLimit:  # the last slot went meanwhile: give the lease back
                    await membership.release(session_id, closed=False)
                    raise
            finally:
                membership.busy.discard(session_id)
            if session is None:
                await membership.release(session_id, closed=False)
                return False
            self.takeovers += 1
            log.info("event=session_taken_over session=%s generation=%d previous_owner=%s "
                     "ops=%d", session_id, generation, entry.owner_node_id, len(ops))
            return True

    # -- the ASGI side ----------------------------------------------------------------------

    def wrap_send(self, method: str, path: str, send: Any) -> Any:
        """``POST /session`` answers once Redis holds what it created (the directory entry and
        the lease): a client may take the session id to any other node at once. If Redis
        does not take it within a lease, the answer is 503 ``cluster_unavailable`` instead,
        and a session the request created is closed for good (it ends here, and once Redis
        answers it is marked closed there): nothing keeps running that no client knows of."""
        if method != routes.CREATE_SESSION.method or path != routes.CREATE_SESSION.path:
            return send
        shipping = self.shipping
        lease_s = self.membership.lease_s
        start: MutableMapping[str, Any] | None = None  # a 200's start, held with its body
        answer = bytearray()

        async def send_when_shipped(message: MutableMapping[str, Any]) -> None:
            nonlocal start
            if message["type"] == "http.response.start" and message.get("status") == 200:
                start = message
                return
            if start is None or message["type"] != "http.response.body":
                await send(message)
                return
            answer.extend(message.get("body", b""))
            if message.get("more_body", False):
                return
            acked = False
            with trio.move_on_after(lease_s):
                acked = await shipping.wait_acked(shipping.last_seq)
            if not acked:
                self._close_refused(bytes(answer))
                await self._send_unavailable(send, None, "the new session did not reach the "
                                             "cluster's Redis in time")
                return
            await send(start)
            await send({"type": "http.response.body", "body": bytes(answer),
                        "more_body": False})

        return send_when_shipped

    def _close_refused(self, answer: bytes) -> None:
        """The ``POST /session`` that made the session ``answer`` names was answered 503: a
        session it created (not one it attached to) is closed for good."""
        try:
            created = _decode_created(answer)
        except msgspec.DecodeError:  # not the app's session answer: nothing to close
            return
        if created.attached:
            return
        session = self.manager.sessions.get(created.session_id)
        if session is None:
            return
        log.warning("event=session_refused session=%s reason=not_in_redis_in_time",
                    session.id)
        self.manager.nursery.start_soon(self.manager.close_session, session, "client_close")

    async def handle(self, scope: MutableMapping[str, Any], receive: Any, send: Any,
                     headers: dict[str, str], body: bytes | None) -> bool:
        """Answer a request for a session this node does not run (or no longer owns); False
        to let the app (or the local stream) answer it as in single-node mode. Redis trouble
        is a 503 ``cluster_unavailable`` with ``Retry-After``, never a 500 or a hang."""
        path: str = scope["path"]
        if path == PROBE_PATH:
            await self._answer_probe(send, headers)
            return True
        session_id = self.session_id_of(path)
        creating = session_id is None and path == routes.CREATE_SESSION.path \
            and scope.get("method") == routes.CREATE_SESSION.method
        if creating and body:
            session_id = _requested_session_id(body)  # attach to a session of the cluster
        if not self.ready and (session_id is not None or creating):
            await self._send_unavailable(send, session_id, "this node is still starting")
            return True
        if session_id is None:
            return False
        forwarded = self._verified_forward(scope, headers, body or b"")
        try:
            return await self._route(scope, send, headers, body or b"", session_id, forwarded)
        except ClusterUnavailable as exc:
            log.info("event=cluster_unavailable session=%s error=%s", session_id, exc)
            await self._send_unavailable(send, session_id, str(exc))
            return True
        except SessionLimit as exc:  # a takeover here would pass --max-sessions
            await _send_json(send, 503, _session_limit_body(session_id, exc),
                             [(b"retry-after", str(SESSION_LIMIT_RETRY_AFTER_S).encode())])
            return True

    async def _route(self, scope: MutableMapping[str, Any], send: Any, headers: dict[str, str],
                     body: bytes, session_id: str, forwarded: bool) -> bool:
        node_id = self.membership.node_id
        for _ in range(3):  # a takeover lost to another node is routed again
            if await self._local(session_id):
                return False
            entry, pttl, _fields = await self.redis.lookup(session_id)
            decision = route(entry, pttl, node_id, live_here=False,
                             grace_left_ms=self._grace_left_ms())
            if isinstance(decision, Unknown):
                if entry is None:
                    return False  # not in the cluster: the app answers (404)
                # Closed for good: never restored from a stale local copy.
                await _send_json(send, 404, session_not_found(session_id), [])
                return True
            if isinstance(decision, TakeOver):
                if await self.take_over(session_id):
                    return False
                continue
            assert isinstance(decision, Forward)
            if not forwarded:
                try:
                    await self._forward(scope, send, headers, body, decision)
                    return True
                except (httpx.TransportError, httpx.TimeoutException) as exc:
                    log.info("event=owner_unreachable session=%s owner=%s error=%r",
                             session_id, decision.owner_node_id, exc)
            # The owner does not answer, or this is a forward the directory says belongs
            # elsewhere (never forwarded twice): 503 until the lease (or the grace) is over.
            entry, pttl, _fields = await self.redis.lookup(session_id)
            again = route(entry, pttl, node_id, live_here=False, owner_unreachable=True,
                          grace_left_ms=self._grace_left_ms())
            if isinstance(again, Unavailable):
                wait = again.retry_after_s
                await _send_json(send, 503, ErrorBody(
                    error="The session's node does not answer; retry once its lease expires",
                    code="session_owner_unavailable", session_id=session_id, retryable=True,
                    retry_after_ms=wait * 1000),
                    [(b"retry-after", str(wait).encode())])
                return True
        return False

    def _verified_forward(self, scope: MutableMapping[str, Any], headers: dict[str, str],
                          body: bytes) -> bool:
        """Is this request a genuine forward of another node (see daemon.core.cluster_auth)?
        A client's ``X-Turnkeeper-Forwarded`` without a valid signature counts for nothing."""
        sender = headers.get(FORWARDED_HEADER)
        signature = headers.get(SIGNATURE_HEADER)
        if sender is None and signature is None:
            return False
        why = "unsigned" if not sender or signature is None else cluster_auth.verify(
            self.secret, scope.get("method", "GET"), _target(scope), sender,
            signature, body, time.time_ns() // 1_000_000, self._nonces)
        if why is None:
            return True
        self.forwards_rejected += 1
        log.warning("event=forward_rejected reason=%s claimed_sender=%s path=%s", why,
                    (sender or "")[:64], scope["path"])
        return False

    async def _forward(self, scope: MutableMapping[str, Any], send: Any,
                       headers: dict[str, str], body: bytes, target: Forward) -> None:
        method = scope.get("method", "GET")
        path = _target(scope)
        url = target.node_url.rstrip("/") + path
        node_id = self.membership.node_id
        out = {k: v for k, v in headers.items() if k not in _DROP_REQUEST}
        out[FORWARDED_HEADER] = node_id
        out[SIGNATURE_HEADER] = cluster_auth.sign(
            self.secret, method, path, node_id, time.time_ns() // 1_000_000,
            secrets.token_hex(12), body)
        response = await self.http.request(method, url, headers=out, content=body)
        self.forwarded += 1
        raw = response.content
        answer = [(k.encode("latin-1"), v.encode("latin-1"))
                  for k, v in response.headers.items() if k.lower() not in _DROP_RESPONSE]
        answer.append((b"content-length", str(len(raw)).encode()))
        await send({"type": "http.response.start", "status": response.status_code,
                    "headers": answer})
        await send({"type": "http.response.body", "body": raw, "more_body": False})

    # -- the --node-url check ------------------------------------------------------------------

    async def probe(self, nonce: str) -> bool:
        """Ask ``--node-url`` for the start-up nonce (Membership.verify_url): True when
        this very process answered."""
        headers = {PROBE_HEADER: nonce}
        if self.token:
            headers["authorization"] = f"Bearer {self.token}"
        membership = self.membership
        response = await self.http.get(membership.node_url.rstrip("/") + PROBE_PATH,
                                       headers=headers)
        return response.status_code == 204 \
            and response.headers.get(_NODE_HEADER) == membership.node_id

    async def _answer_probe(self, send: Any, headers: dict[str, str]) -> None:
        nonce = self.membership.probe_nonce
        given = headers.get(PROBE_HEADER, "")
        if nonce is not None and hmac.compare_digest(given.encode(), nonce.encode()):
            await send({"type": "http.response.start", "status": 204, "headers": [
                (_NODE_HEADER.encode(), self.membership.node_id.encode())]})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        await _send_json(send, 404, route_not_found(), [])

    # -- event streams ---------------------------------------------------------------------------

    async def stream_bus(self, session_id: str, limits: BusLimits) -> SessionBus | None:
        """The bus an event stream of ``session_id`` reads: the local one, a mirror of the
        owner's Redis stream, or ``None`` (unknown: 404). Redis trouble (or this node's lease
        in doubt with Redis silent) raises :class:`StreamRequestError` 503."""
        try:
            return await self._stream_bus(session_id, limits)
        except ClusterUnavailable as exc:
            retry = self.redis.retry_after_s
            raise StreamRequestError(503, _unavailable_body(session_id, str(exc), retry),
                                     {"Retry-After": str(retry)}) from None
        except SessionLimit as exc:
            raise StreamRequestError(503, _session_limit_body(session_id, exc), {
                "Retry-After": str(SESSION_LIMIT_RETRY_AFTER_S)}) from None

    async def _stream_bus(self, session_id: str, limits: BusLimits) -> SessionBus | None:
        if await self._local(session_id):
            live = self.manager.get(session_id)
            return live.bus if live is not None else None
        decision = await self._decide(session_id)
        if isinstance(decision, TakeOver):
            if await self.take_over(session_id):
                live = self.manager.get(session_id)
                return live.bus if live is not None else None
            decision = await self._decide(session_id)
        if isinstance(decision, Local):
            live = self.manager.get(session_id)
            return live.bus if live is not None else None
        if not isinstance(decision, Forward):
            return None
        mirror = self.mirrors.live(session_id)
        if mirror is None:
            mirror = await self.mirrors.open(session_id, limits, self.manager.nursery)
            if mirror is None:
                return None
        return mirror.bus

    async def _send_unavailable(self, send: Any, session_id: str | None, why: str) -> None:
        retry = self.redis.retry_after_s
        await _send_json(send, 503, _unavailable_body(session_id, why, retry),
                         [(b"retry-after", str(retry).encode())])

    async def aclose(self) -> None:
        await self.http.aclose()


def _requested_session_id(body: bytes) -> str | None:
    """The ``sessionId`` a ``POST /session`` body asks for (lower-case, as the app keeps it),
    if it is a well-formed one; anything else is the app's to answer."""
    try:
        value = view_session_id(decode_json(body))
        return str(uuid.UUID(value)) if isinstance(value, str) else None
    except Exception:  # not JSON, not an object, not a UUID: the app answers it
        return None


def _target(scope: MutableMapping[str, Any]) -> str:
    """A request's path and query as signed (see daemon.core.cluster_auth)."""
    query = scope.get("query_string", b"").decode("latin-1")
    path: str = scope["path"]
    return path + (f"?{query}" if query else "")


def _session_limit_body(session_id: str, exc: SessionLimit) -> ErrorBody:
    return ErrorBody(error=f"{exc}: a session taken over here would pass it; retry",
                     code="session_limit", session_id=session_id, limit=exc.limit)


def _unavailable_body(session_id: str | None, why: str, retry_s: int) -> ErrorBody:
    return ErrorBody(error=f"The cluster cannot serve this now ({why}); retry",
                     code="cluster_unavailable",
                     session_id=session_id if session_id is not None else msgspec.UNSET,
                     retryable=True, retry_after_ms=retry_s * 1000)


async def _send_json(send: Any, status: int, body: ErrorBody,
                     extra: list[tuple[bytes, bytes]]) -> None:
    raw = encode_json(body)
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode()),
        *extra]})
    await send({"type": "http.response.body", "body": raw, "more_body": False})
