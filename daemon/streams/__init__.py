"""SSE and WebSocket event streams, as plain ASGI handlers (:func:`serve_sse`,
:func:`serve_ws`). Trio shells.

- ``_request``: the stream request (cursor, epoch, ``maxQueued``), the subscriber cap, the
  errors answered before a stream starts;
- ``_subscription``: one reader of a bus (cursor, writes in flight), its watchers, the pump of
  the next events or shared frames, the replay of a resume plan;
- ``_sse``, ``_ws``: the two transports.
"""

from sdk.protocol.sse import SSE_HEARTBEAT

from ._request import (
    EPOCH_RE,
    MAX_SUBSCRIBERS,
    Receive,
    Scope,
    Send,
    StreamRequest,
    StreamRequestError,
    check_capacity,
    deny_ws,
    parse_cursor,
    parse_epoch,
    parse_stream_request,
    send_json_error,
)
from ._sse import SSE_RETRY, serve_sse
from ._subscription import (
    EVICTED_FRAME_TIMEOUT_S,
    EVICTED_WRITE_GRACE_S,
    REPLAY_CHUNK_BYTES,
    EventPump,
    Subscription,
    final_send,
    replay_events,
    replay_groups,
    watch_eviction,
    watch_stalled_writes,
)
from ._ws import serve_ws

__all__ = [
    "EPOCH_RE",
    "EVICTED_FRAME_TIMEOUT_S",
    "EVICTED_WRITE_GRACE_S",
    "MAX_SUBSCRIBERS",
    "REPLAY_CHUNK_BYTES",
    "SSE_HEARTBEAT",
    "SSE_RETRY",
    "EventPump",
    "Receive",
    "Scope",
    "Send",
    "StreamRequest",
    "StreamRequestError",
    "Subscription",
    "check_capacity",
    "deny_ws",
    "final_send",
    "parse_cursor",
    "parse_epoch",
    "parse_stream_request",
    "replay_events",
    "replay_groups",
    "send_json_error",
    "serve_sse",
    "serve_ws",
    "watch_eviction",
    "watch_stalled_writes",
]
