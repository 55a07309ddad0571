"""Agent updates spliced into envelopes: the agent's bytes are the event's ``update``.

The hot path of a turn is a long run of text chunks. Decoding each one into dicts and encoding
the envelope again costs more than everything else the daemon does with it, so a *plain text
chunk* (an ``agent_message_chunk`` / ``agent_thought_chunk`` update with exactly
``sessionUpdate`` and ``content: {type: "text", text}``, nothing else) is never re-encoded: its
envelope is the bytes the bus would have encoded (same members, same order) with the agent's
``update`` bytes copied in, made compact first if the agent wrote whitespace. Only the two
fields merging and compaction need (the kind and the text) are decoded, into a typed struct.
Every other update takes the general path (decoded, published as a dict, encoded once).

Pure: no trio, no clock, no I/O.
"""

from __future__ import annotations

import re
from operator import attrgetter
from typing import Final

import msgspec

from daemon.core.envelope import SCHEMA_VERSION, encode_json

__all__ = ["TEXT_CHUNK_KINDS", "EnvelopeSplicer", "compact", "plain_chunk", "plain_chunk_run"]

TEXT_CHUNK_KINDS: Final = frozenset({"agent_message_chunk", "agent_thought_chunk"})


# gc=False: they hold only strings, and a batch of them would otherwise set off the
# collector on every read.
class _TextContent(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    type: str
    text: str


class _PlainChunk(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    sessionUpdate: str
    content: _TextContent


_decode_chunk = msgspec.json.Decoder(_PlainChunk).decode
_decode_chunks = msgspec.json.Decoder(list[_PlainChunk]).decode
_kind_of = attrgetter("sessionUpdate")
_type_of = attrgetter("content.type")
_text_of = attrgetter("content.text")


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


def plain_chunk(update: bytes) -> tuple[str, str] | None:
    """``(kind, text)`` when ``update`` is a plain text chunk, else ``None``.

    Decoding validates the whole value (UTF-8, escapes, structure), so bytes accepted here are
    valid JSON. A chunk with any other member (``_meta``, say) is not plain.
    """
    try:
        chunk = _decode_chunk(update)
    except (msgspec.DecodeError, RecursionError):  # ValidationError is a DecodeError
        return None
    kind = chunk.sessionUpdate
    if chunk.content.type != "text" or kind not in TEXT_CHUNK_KINDS:
        return None
    return kind, chunk.content.text


def plain_chunk_run(updates: list[bytes]) -> tuple[str, list[str]] | None:
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
    kinds = set(map(_kind_of, chunks))
    if len(kinds) != 1:
        return None
    kind = kinds.pop()
    if kind not in TEXT_CHUNK_KINDS or set(map(_type_of, chunks)) != {"text"}:
        return None
    return kind, list(map(_text_of, chunks))


class EnvelopeSplicer:
    """Builds ``session_update`` envelopes around pre-encoded ``update`` bytes.

    The result is exactly what :func:`daemon.core.envelope.make_event` encodes for
    ``data = {sessionId, update}`` with the given prompt and originator ids and
    ``_meta.serverTimestamp = now_ms`` when ``update`` is in msgspec's compact form, and the
    same envelope with the agent's spelling of ``update`` otherwise.
    """

    __slots__ = ("_format", "_head", "_tail")

    def __init__(
        self, session_id: str, prompt_id: str | None, originator_client_id: str | None,
        now_ms: int,
    ) -> None:
        self._head = (b',"v":%d,"type":"session_update","data":{"sessionId":%b,"update":'
                      % (SCHEMA_VERSION, encode_json(session_id)))
        tail = b"}"
        if prompt_id is not None:
            tail += b',"promptId":' + encode_json(prompt_id)
        if originator_client_id is not None:
            tail += b',"originatorClientId":' + encode_json(originator_client_id)
        self._tail = tail + b',"_meta":{"serverTimestamp":%d}}' % now_ms
        self._format = (b'{"id":%d' + self._head.replace(b"%", b"%%") + b"%b"
                        + self._tail.replace(b"%", b"%%"))

    def envelope(self, event_id: int, update: bytes) -> bytes:
        return b'{"id":%d%b%b%b' % (event_id, self._head, update, self._tail)

    def envelopes(self, first_id: int, updates: list[bytes]) -> list[bytes]:
        """:meth:`envelope` of each update, the ids counting up from ``first_id``."""
        return list(map(self._format.__mod__,
                        zip(range(first_id, first_id + len(updates)), updates, strict=True)))
