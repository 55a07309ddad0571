"""Builders shared by the tests of webui e2e."""

from __future__ import annotations

import re
from collections import Counter

import httpx

from webui_model import Block, MessageBlock, TextBlock, WebUIProvider

CHUNK_RE = re.compile(r"chunk-(\d+)")


TWENTY = Counter({n: 1 for n in range(20)})


class CountingTransport(httpx.AsyncBaseTransport):
    """The real network transport, recording ``(method, path)`` of every request."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.requests: list[tuple[str, str]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append((request.method, request.url.path))
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()

    @property
    def loads(self) -> int:
        return sum(1 for method, path in self.requests if method == "POST" and path.endswith("/load"))


def is_live_marker(block: Block) -> bool:
    return (
        isinstance(block, MessageBlock)
        and block.source == "history_truncated"
        and isinstance(block.data, dict)
        and block.data.get("scope") == "live_journal"
    )


def chunk_counts(provider: WebUIProvider) -> Counter[int]:
    """How often each ``chunk-N`` appears across the transcript's text blocks."""
    text = "\n".join(b.text for b in provider.store.blocks if isinstance(b, TextBlock))
    return Counter(int(n) for n in CHUNK_RE.findall(text))

