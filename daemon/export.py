"""A whole session's transcript as one streamed body (``GET /session/{id}/export``). Trio shell.

The transcript is read a page of records at a time, oldest first, each page one read on the
writer's connection (so the commits of live turns go on between pages), and written out as it
is read: JSON Lines (each stored event envelope as it is, one a line: the events the paged
transcript route returns, in order) or Markdown (:mod:`daemon.core.transcript_markdown`).
Memory holds one page, never the whole transcript. After the last record comes the unfinished
turn's events, if a turn is running, read with the check that no record was stored meanwhile
(a turn that ended during the export is then exported as its records).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Final

from .core.transcript_markdown import MarkdownTranscript
from .transcript_store import TranscriptDatabase
from .transcript_writer import TranscriptWriter

__all__ = ["CONTENT_TYPES", "EXPORT_FORMATS", "PAGE_RECORDS", "export_body"]

EXPORT_FORMATS: Final = ("jsonl", "markdown")
CONTENT_TYPES: Final = {"jsonl": "application/x-ndjson",
                        "markdown": "text/markdown; charset=utf-8"}
PAGE_RECORDS: Final = 500


async def export_body(writer: TranscriptWriter, session_id: str, fmt: str,
                      workspace_cwd: str | None, *, page: int = PAGE_RECORDS
                      ) -> AsyncIterator[bytes]:
    """The export of ``session_id`` in ``fmt`` (one of :data:`EXPORT_FORMATS`), piece by piece:
    one read of at most ``page`` records per piece."""
    markdown = MarkdownTranscript() if fmt == "markdown" else None
    if markdown is not None:
        yield markdown.header(session_id, workspace_cwd).encode()
    after = 0
    while True:
        def read(store: TranscriptDatabase, after: int = after) -> tuple[list[bytes], int, bool]:
            events, last = store.records_forward(session_id, after, page)
            if events:
                return events, last, False
            return store.raw_events(session_id), last, True

        events, after, final = await writer.read(read, session_id=session_id)
        if events:
            if markdown is None:
                yield b"\n".join(events) + b"\n"
            else:
                text = "".join(markdown.event(raw) for raw in events)
                if text:
                    yield text.encode()
        if final:
            if markdown is not None:
                yield b"\n"
            return
