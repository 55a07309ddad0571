"""What one agent read gives a session: an :class:`UpdateBatch`, the updates and their facts.

The hot path of a turn is a long run of text chunks. Decoding each one into dicts and encoding
the envelope again costs more than everything else the daemon does with it, so a *plain text
chunk* (an ``agent_message_chunk`` / ``agent_thought_chunk`` update with exactly
``sessionUpdate`` and ``content: {type: "text", text}``, nothing else) is never re-encoded: the
frame codec (:mod:`daemon.core.frame_codec`) splices the agent's ``update`` bytes into the
envelope, made compact first if the agent wrote whitespace. Only the two fields merging and
compaction need (the kind and the text) are decoded, into a typed struct. This module reads
them: it recognises plain text chunks (for a whole read at once where it can) and makes updates
compact, and :class:`UpdateBatch` carries what it found with the updates, so that nobody reads
them again.

Pure: no trio, no clock, no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from operator import attrgetter, itemgetter
from typing import Final, Literal

import msgspec

__all__ = ["TEXT_CHUNK_KINDS", "ChunkRun", "UpdateBatch", "compact", "compact_chunks",
           "plain_chunk", "plain_chunk_lines", "plain_chunk_run"]

TEXT_CHUNK_KINDS: Final = frozenset({"agent_message_chunk", "agent_thought_chunk"})

#: What merging and compaction need of a run of plain text chunks of one kind: the kind and
#: each chunk's text, in order.
ChunkRun = tuple[str, list[str]]


# gc=False: they hold only strings, and a batch of them would otherwise set off the
# collector on every read. The Literal members make the decoder itself refuse anything but a
# plain text chunk (no check of the decoded values afterwards).
class _TextContent(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    type: Literal["text"]
    text: str


class _PlainChunk(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    sessionUpdate: Literal["agent_message_chunk", "agent_thought_chunk"]
    content: _TextContent


class _MessageChunk(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    sessionUpdate: Literal["agent_message_chunk"]
    content: _TextContent


class _ThoughtChunk(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    sessionUpdate: Literal["agent_thought_chunk"]
    content: _TextContent


_decode_chunk = msgspec.json.Decoder(_PlainChunk).decode
_decode_chunks = msgspec.json.Decoder(list[_PlainChunk]).decode
# A run's decoders, one per kind, the usual kind first: a run of the other kind fails the
# first one at its first member.
_DECODE_RUN: Final = (msgspec.json.Decoder(list[_MessageChunk]).decode,
                      msgspec.json.Decoder(list[_ThoughtChunk]).decode)


def _middle_of(start: int) -> Callable[[bytes], bytes]:
    """What takes ``line[start:-2]`` of a line: mapped over a batch, one C call per line (a
    slice built per line in a comprehension costs a third more)."""
    return itemgetter(slice(start, -2))
_kind_of = attrgetter("sessionUpdate")
_text_of = attrgetter("content.text")
_UPDATE_SUFFIX: Final = b"}}"


_WHITESPACE: Final = re.compile(rb"[ \t\n\r]").search


def compact(raw: bytes) -> bytes:
    """``raw`` (one JSON value) without insignificant whitespace; ``raw`` itself when it has
    none (the usual case: a whitespace-free value needs no pass over it at all)."""
    if _WHITESPACE(raw) is not None:
        try:
            return msgspec.json.format(raw, indent=-1)
        except msgspec.DecodeError:
            return raw  # not JSON: whoever decodes it next refuses it
    return raw


def compact_chunks(updates: list[bytes], texts: list[str]) -> list[bytes]:
    """:func:`compact` of each of ``updates``, plain text chunks whose texts are ``texts``
    (what :func:`plain_chunk_lines` returns), found without a pass over each when none needs
    it: an agent whose text has spaces puts them in every read, and compacting each update
    costs several times its whole trip through the daemon.

    In such a chunk the only string that can hold a space is the text (the member names and
    the kind are fixed words; an escape in them decodes to no space), a raw tab, CR or
    newline can only stand outside strings (JSON strings cannot hold them raw), and a space
    in the text is either a raw space or the escape ``\\u0020``. So when the updates hold no
    tab, CR, newline or ``\\u0020``, their raw spaces are the texts' spaces plus those outside
    strings, and as many raw spaces as the texts hold means none is outside any string:
    every update is compact already and is returned as it is.
    """
    joined = b"".join(updates)
    if (b"\t" in joined or b"\r" in joined or b"\n" in joined or b"\\u0020" in joined
            or joined.count(b" ") != "".join(texts).count(" ")):
        return list(map(compact, updates))
    return updates


def plain_chunk(update: bytes) -> tuple[str, str] | None:
    """``(kind, text)`` when ``update`` is a plain text chunk, else ``None``.

    Decoding validates the whole value (UTF-8, escapes, structure), so bytes accepted here are
    valid JSON. A chunk with any other member (``_meta``, say) is not plain.
    """
    try:
        chunk = _decode_chunk(update)
    except (msgspec.DecodeError, RecursionError):  # ValidationError is a DecodeError
        return None
    return chunk.sessionUpdate, chunk.content.text


def _one_kind(chunks: list[_PlainChunk]) -> ChunkRun | None:
    kinds = set(map(_kind_of, chunks))
    if len(kinds) != 1:
        return None
    return kinds.pop(), list(map(_text_of, chunks))


def plain_chunk_run(updates: list[bytes]) -> ChunkRun | None:
    """``(kind, texts)`` when every one of ``updates`` (each one JSON value, as the agent
    channel hands them on) is a plain text chunk and all are of one kind, else ``None``: the
    same verdict as :func:`plain_chunk` of each, reached in one decode of the whole batch."""
    if not updates:
        return None
    try:
        chunks = _decode_chunks(b"[" + b",".join(updates) + b"]")
    except (msgspec.DecodeError, RecursionError):
        return None
    if len(chunks) != len(updates):  # an update that was not one value: judge each alone
        return None
    return _one_kind(chunks)


def plain_chunk_lines(lines: list[bytes], prefix: bytes) -> tuple[list[bytes], ChunkRun] | None:
    """The agent channel's read of a batch of ``session/update`` lines that are all plain text
    chunks of one kind, in one decode: the ``update`` bytes of each line (``prefix``, one
    update object, ``}}``: what ``acp_codec.splice_updates`` returns) and the run's kind and
    texts (what :func:`plain_chunk_run` of those bytes returns); ``None`` when any line is
    not such a line, or the kinds differ (the caller then reads the batch as before).

    Every check is one pass over the batch's bytes in C, never a Python call per line: this
    runs on every agent read of a turn.
    """
    count = len(lines)
    if not count:
        return None
    updates = list(map(_middle_of(len(prefix)), lines))
    # No line holds a newline (lines from acp_codec.LineSplitter never do).
    if b"\n" in b"".join(updates):
        return None
    # Joined by newlines, the lines start with prefix{, end with }}, and hold }}\n prefix{ once
    # per joint: with no other newline every occurrence is at a joint, so every line starts
    # with prefix and an object and ends with }}.
    head = prefix + b"{"
    block = b"\n".join(lines)
    if (not block.startswith(head) or not block.endswith(_UPDATE_SUFFIX)
            or block.count(_UPDATE_SUFFIX + b"\n" + head) != count - 1):
        return None
    # The middles as [m1\n,m2\n,...] decode as plain chunks of one kind. A JSON string cannot
    # hold a raw newline, so every joint lies outside strings, and a joint inside an object
    # would put a middle's first byte, {, where a member name must start: each joint separates
    # two elements, and as many elements as lines leaves one per line.
    joined = b"[" + b"\n,".join(updates) + b"]"
    for decode in _DECODE_RUN:
        try:
            chunks = decode(joined)
        except msgspec.ValidationError:
            continue  # not all of this kind (or not plain chunks at all): the next kind
        except (msgspec.DecodeError, RecursionError):
            return None  # not JSON: no kind will do
        if len(chunks) != count:
            return None
        # A list comprehension reads the texts faster than map(attrgetter("content.text")).
        return updates, (chunks[0].sessionUpdate, [chunk.content.text for chunk in chunks])
    return None


class UpdateBatch(msgspec.Struct, frozen=True, gc=False):
    """One read's ``session/update`` updates for one session, in stdout order, with what the
    read found out about them.

    ``updates``: the agent's own JSON bytes of each ``update`` object, compact (no
    insignificant whitespace; strings and numbers spelled as the agent spelled them, never
    re-encoded). ``run``: ``(kind, texts)`` when every update is a plain text chunk and all are
    of one kind, else ``None``; always exactly what :func:`plain_chunk_run` of ``updates``
    returns. Make one with :meth:`of` (which reads the updates) unless the read already did
    (the agent channel's reader, :func:`plain_chunk_lines`).
    """

    updates: list[bytes]
    run: ChunkRun | None

    @classmethod
    def of(cls, updates: list[bytes]) -> UpdateBatch:
        """The batch of ``updates`` (compact already), read once to find its run."""
        return cls(updates, plain_chunk_run(updates))

    def keep(self, kept: list[int]) -> UpdateBatch:
        """The batch of the updates at the positions ``kept`` (ascending)."""
        updates = [self.updates[i] for i in kept]
        if self.run is None:
            return UpdateBatch.of(updates)
        kind, texts = self.run
        return UpdateBatch(updates, (kind, [texts[i] for i in kept]) if kept else None)
