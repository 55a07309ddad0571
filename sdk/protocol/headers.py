"""The HTTP header names of the wire, each written once.

The daemon reads and writes them by these names (ASGI hands them over lower-case:
:func:`lower`), the SDK sends and reads them, the OpenAPI document describes them, the CORS
lists are made of them, and the viewer's constants are generated from them. HTTP header names
are case-insensitive; these are the spellings the daemon writes.

Pure: no I/O.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "AUTHORIZATION",
    "CLIENT_ID",
    "CLUSTER_FORWARDED",
    "CLUSTER_NODE",
    "CLUSTER_PROBE",
    "CLUSTER_SIGNATURE",
    "CONTENT_TYPE",
    "CORS_ALLOWED",
    "CORS_EXPOSED",
    "EVENT_EPOCH",
    "IDEMPOTENCY_KEY",
    "IDEMPOTENT_REPLAYED",
    "LAST_EVENT_ID",
    "RETRY_AFTER",
    "SSE_STREAM_ID",
    "lower",
]

#: ``Bearer <token>``: every route but ``GET /health`` when the daemon has a token.
AUTHORIZATION: Final = "Authorization"
CONTENT_TYPE: Final = "Content-Type"
#: The client's identity on a session (``[A-Za-z0-9._:-]{1,128}``).
CLIENT_ID: Final = "X-Qwen-Client-Id"
#: The event stream's epoch: answered on every stream, sent back with a resume cursor.
EVENT_EPOCH: Final = "X-Qwen-Event-Epoch"
#: The id of one SSE response (observability).
SSE_STREAM_ID: Final = "X-Qwen-SSE-Stream-Id"
#: The SSE resume cursor (the standard SSE request header).
LAST_EVENT_ID: Final = "Last-Event-ID"
#: One value per logical prompt, the same on every retry of it.
IDEMPOTENCY_KEY: Final = "Idempotency-Key"
#: ``true`` on a prompt answer that repeats an earlier admission instead of making one.
IDEMPOTENT_REPLAYED: Final = "Idempotent-Replayed"
#: Seconds to wait before asking again (a 429 or 503).
RETRY_AFTER: Final = "Retry-After"

# Between the nodes of a cluster (never from a client: a forward is signed).
#: The node that forwarded a request, and its signature over the request.
CLUSTER_FORWARDED: Final = "X-Turnkeeper-Forwarded"
CLUSTER_SIGNATURE: Final = "X-Turnkeeper-Signature"
#: A node's check that its own URL reaches itself: the nonce asked, the node id answered.
CLUSTER_PROBE: Final = "X-Turnkeeper-Probe"
CLUSTER_NODE: Final = "X-Turnkeeper-Node"

#: Request headers a browser client sends beyond the CORS-safelisted ones.
CORS_ALLOWED: Final = (AUTHORIZATION, CONTENT_TYPE, IDEMPOTENCY_KEY, LAST_EVENT_ID, CLIENT_ID,
                       EVENT_EPOCH)
#: Response headers a browser client reads (the SSE stream's epoch and id, a 429/503's wait, a
#: prompt answer that repeats an admission).
CORS_EXPOSED: Final = (EVENT_EPOCH, SSE_STREAM_ID, RETRY_AFTER, IDEMPOTENT_REPLAYED)


def lower(name: str) -> str:
    """``name`` as ASGI servers hand request headers over, and as HTTP/2 writes them."""
    return name.lower()
