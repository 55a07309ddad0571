"""Views of the ACP ``session/update`` shapes, and of the envelope around them, that the daemon
reads: the ``sessionUpdate`` tag, a text content block, ``toolCallId``, the ``_meta`` keys.

The daemon keeps an agent's update as the agent wrote it (unknown members pass through to the
wire byte for byte), so these Structs are *views*: decoding one picks out the members it names
and ignores the rest, and nothing is ever encoded from a view. Where a member may hold anything
(an agent can send any JSON), its field is ``Any`` and the reader judges the value; the Structs
of the mergeable text chunk are strict instead (unknown members refused, each value of the one
type the merge rule allows), so that decoding one *is* the check.

Each view is decoded from the plain value (a dict, already decoded off the wire) with
:func:`view`; a value of the wrong shape (not an object, or, for the strict Structs, anything
the Struct does not allow) gives ``None``. ``Any`` fields hold the very objects of the input,
not copies, so a reader can pass a nested member on unchanged.

Pure: no trio, no I/O, no clock.
"""

from __future__ import annotations

from typing import Any, ClassVar, Final, Literal, TypeVar

import msgspec

from sdk.protocol.constants import BRIDGE_ECHO, RECORD_ID_META_KEY
from sdk.protocol.http import PermissionOutcome

__all__ = [
    "ACP_WIRE_NAMES",
    "AGENT_MESSAGE_CHUNK",
    "AGENT_THOUGHT_CHUNK",
    "DISCRETE_MESSAGE_META_KEY",
    "RECORD_ID_META_KEY",
    "EchoMeta",
    "EnvelopeMetaView",
    "EnvelopeView",
    "MergeFields",
    "MergeableChunk",
    "MergeableUpdate",
    "NewSessionResultView",
    "OtherUpdate",
    "PermissionAnswer",
    "PermissionOptionView",
    "PermissionParamsView",
    "PromptResultView",
    "SessionUpdateView",
    "TextBlockView",
    "TranscriptMetaView",
    "UpdateEnvelopeView",
    "UpdateMetaView",
    "UpdateView",
    "UserEcho",
    "mergeable_chunk_fields",
    "view",
]

AGENT_MESSAGE_CHUNK: Final = "agent_message_chunk"
AGENT_THOUGHT_CHUNK: Final = "agent_thought_chunk"
DISCRETE_MESSAGE_META_KEY: Final = "qwenDiscreteMessage"

_T = TypeVar("_T", bound=msgspec.Struct)
_convert: Final = msgspec.convert


def view(value: object, kind: type[_T]) -> _T | None:
    """``value`` decoded as the view ``kind``; ``None`` when it does not have that shape."""
    if type(value) is not dict:
        return None
    try:
        return _convert(value, kind)
    except msgspec.ValidationError:
        return None


# --- lenient views: every field Any, absent members None -------------------------------------


class EnvelopeView(msgspec.Struct, frozen=True, rename="camel", gc=False):
    """The envelope members the daemon reads back (``v`` and anything new are ignored)."""

    id: Any = None
    type: Any = None
    prompt_id: Any = None
    originator_client_id: Any = None
    data: Any = None
    meta: Any = msgspec.field(default=None, name="_meta")


class EnvelopeMetaView(msgspec.Struct, frozen=True, rename="camel", gc=False):
    """The envelope's own ``_meta``."""

    server_timestamp: Any = None
    timestamp: Any = None


class SessionUpdateView(msgspec.Struct, frozen=True, rename="camel", gc=False):
    """A ``session_update`` event's ``data``: ``{sessionId, update}``."""

    session_id: Any = None
    update: Any = None


class UpdateView(msgspec.Struct, frozen=True, rename="camel", gc=False):
    """An ACP ``session/update`` update object: its tag and the members the daemon folds by."""

    session_update: Any = None
    content: Any = None
    tool_call_id: Any = None
    meta: Any = msgspec.field(default=None, name="_meta")


class TextBlockView(msgspec.Struct, frozen=True, gc=False):
    """A content block; ``{type: "text", text}`` is a text block."""

    type: Any = None
    text: Any = None


class UpdateMetaView(msgspec.Struct, frozen=True, rename="camel", gc=False):
    """The ``_meta`` keys of an update that the daemon acts on."""

    parent_tool_call_id: Any = None
    subagent_type: Any = None
    qwen_transcript: Any = None
    qwen_discrete_message: Any = None
    usage: Any = None
    server_timestamp: Any = None
    timestamp: Any = None
    record_id: Any = msgspec.field(default=None, name=RECORD_ID_META_KEY)


class TranscriptMetaView(msgspec.Struct, frozen=True, rename="camel", gc=False):
    """``_meta.qwenTranscript``: the transcript records an update stands for."""

    source_record_ids: Any = None
    plan_tool_call_id: Any = None


class NewSessionResultView(msgspec.Struct, frozen=True, rename="camel", gc=False):
    """A ``session/new`` (or ``session/load``) result."""

    session_id: Any = None


class PromptResultView(msgspec.Struct, frozen=True, rename="camel", gc=False):
    """A ``session/prompt`` result."""

    stop_reason: Any = None


class PermissionParamsView(msgspec.Struct, frozen=True, rename="camel", gc=False):
    """``session/request_permission`` params (``toolCall`` and ``options`` pass on as sent)."""

    session_id: Any = None
    tool_call: Any = None
    options: Any = None


class PermissionOptionView(msgspec.Struct, frozen=True, rename="camel", gc=False):
    """One option of a permission request."""

    option_id: Any = None
    kind: Any = None
    name: Any = None


class _NestedUpdate(msgspec.Struct, frozen=True, rename="camel", gc=False):
    session_update: Any = None
    tool_call_id: Any = None
    meta: UpdateMetaView | None = msgspec.field(default=None, name="_meta")


class _NestedData(msgspec.Struct, frozen=True, gc=False):
    update: _NestedUpdate | None = None


class UpdateEnvelopeView(msgspec.Struct, frozen=True, gc=False):
    """A ``session_update`` envelope viewed down to its update's tag, ``toolCallId`` and
    ``_meta`` in one decode; :func:`view` gives ``None`` when ``data``, ``update`` or
    ``_meta`` is there but not an object."""

    data: _NestedData | None = None

    @property
    def update(self) -> _NestedUpdate | None:
        data = self.data
        return None if data is None else data.update


# --- the mergeable text chunk: strict, decoding is the check -----------------------------------
# A chunk merges with its neighbour in the live journal only when it is exactly this shape:
# ``data`` has only ``sessionId`` and ``update``; ``update`` only ``sessionUpdate`` (a text chunk
# kind), ``content`` (``{type: "text", text: str}``, nothing else) and ``_meta``; ``_meta`` only
# ``timestamp``, ``serverTimestamp``, ``parentToolCallId`` (str), ``subagentType`` (str) and
# ``qwenTranscript`` (only ``sourceRecordIds``: list of str, ``planToolCallId``: str); the
# envelope's own ``_meta`` only ``serverTimestamp`` and ``timestamp``. Absent members are UNSET,
# so "absent" never equals an explicit value (null included).

_Unset = msgspec.UnsetType
_UNSET: Final = msgspec.UNSET


class _MergeText(msgspec.Struct, frozen=True, forbid_unknown_fields=True, gc=False):
    type: Literal["text"]
    text: str


class _MergeTranscript(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel",
                       gc=False):
    source_record_ids: list[str] | _Unset = _UNSET
    plan_tool_call_id: str | _Unset = _UNSET


class _MergeUpdateMeta(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel",
                       gc=False):
    timestamp: Any = _UNSET
    server_timestamp: Any = _UNSET
    parent_tool_call_id: str | _Unset = _UNSET
    subagent_type: str | _Unset = _UNSET
    qwen_transcript: _MergeTranscript | _Unset = _UNSET


class MergeableUpdate(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel",
                      tag_field="sessionUpdate", gc=False):
    """A text chunk update of the shape that may merge (``kind``: its ``sessionUpdate``)."""

    kind: ClassVar[str]
    content: _MergeText
    meta: _MergeUpdateMeta | _Unset = msgspec.field(default=_UNSET, name="_meta")


class _MergeMessageChunk(MergeableUpdate, frozen=True, tag=AGENT_MESSAGE_CHUNK):
    kind: ClassVar[str] = AGENT_MESSAGE_CHUNK


class _MergeThoughtChunk(MergeableUpdate, frozen=True, tag=AGENT_THOUGHT_CHUNK):
    kind: ClassVar[str] = AGENT_THOUGHT_CHUNK


class _OtherMeta(msgspec.Struct, frozen=True, rename="camel", gc=False):
    parent_tool_call_id: Any = None


# The other updates an agent commonly sends, tagged so that telling them from a chunk takes no
# exception; they carry what the summary journal asks of them (``toolCallId`` and
# ``_meta.parentToolCallId``). An update of another kind, or whose ``_meta`` is not an object,
# fails the view.
class OtherUpdate(msgspec.Struct, frozen=True, rename="camel", tag_field="sessionUpdate",
                  gc=False):
    """A ``session/update`` update of a common kind that is not a mergeable text chunk."""

    tool_call_id: Any = None
    meta: _OtherMeta | None = msgspec.field(default=None, name="_meta")


class _UserChunk(OtherUpdate, frozen=True, tag="user_message_chunk"):
    pass


class _ToolCall(OtherUpdate, frozen=True, tag="tool_call"):
    pass


class _ToolCallUpdate(OtherUpdate, frozen=True, tag="tool_call_update"):
    pass


class _Plan(OtherUpdate, frozen=True, tag="plan"):
    pass


class _Commands(OtherUpdate, frozen=True, tag="available_commands_update"):
    pass


class _Mode(OtherUpdate, frozen=True, tag="current_mode_update"):
    pass


_MergeUpdate = (_MergeMessageChunk | _MergeThoughtChunk | _UserChunk | _ToolCall
                | _ToolCallUpdate | _Plan | _Commands | _Mode)


class _MergeData(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel",
                 gc=False):
    update: _MergeUpdate
    session_id: Any = _UNSET


class _MergeEnvelopeMeta(msgspec.Struct, frozen=True, forbid_unknown_fields=True,
                         rename="camel", gc=False):
    server_timestamp: Any = _UNSET
    timestamp: Any = _UNSET


class MergeableChunk(msgspec.Struct, frozen=True, rename="camel", gc=False):
    """A ``session_update`` envelope (its ``type`` is checked by the caller) viewed for merging:
    ``data.update`` is a :class:`MergeableUpdate` when it is a text chunk of the one shape that
    may merge (another view for the other common kinds); any other shape fails the view. Every other member of
    the envelope (``id``, ``v``, ...) is ignored."""

    data: _MergeData
    prompt_id: Any = _UNSET
    originator_client_id: Any = _UNSET
    meta: _MergeEnvelopeMeta | _Unset = msgspec.field(default=_UNSET, name="_meta")


def _encoded_names(*kinds: type[msgspec.Struct]) -> frozenset[str]:
    names: set[str] = set()
    for kind in kinds:
        names.update(field.encode_name for field in msgspec.structs.fields(kind))
    return frozenset(names)


# Every wire member name these views read: a module outside sdk/protocol that digs one of them
# out of a dict by hand is reading the wire around the protocol (tests/structure/test_payload_reads.py).
ACP_WIRE_NAMES: Final[frozenset[str]] = _encoded_names(
    EnvelopeView, EnvelopeMetaView, SessionUpdateView, UpdateView, TextBlockView, UpdateMetaView,
    TranscriptMetaView, NewSessionResultView, PromptResultView, PermissionParamsView,
    PermissionOptionView, _NestedUpdate, _NestedData, UpdateEnvelopeView, _MergeText, _MergeTranscript, _MergeUpdateMeta, MergeableUpdate, _OtherMeta, OtherUpdate, _MergeData,
    _MergeEnvelopeMeta, MergeableChunk,
) | {DISCRETE_MESSAGE_META_KEY, RECORD_ID_META_KEY}


# --- the mergeable text chunk, read from a dict at hand-written speed ------------------------
# The same shape as :class:`MergeableChunk` with a text-chunk update, checked with dict lookups:
# the live journal classifies every dict-built chunk, and a Struct conversion costs about three
# times these lookups. tests/protocol/test_acp_views.py checks, over generated envelopes, that this gives
# exactly what the view gives.

_MERGE_ENVELOPE_META_KEYS: Final = frozenset({"serverTimestamp", "timestamp"})
_MERGE_UPDATE_META_KEYS: Final = frozenset(
    {"timestamp", "serverTimestamp", "parentToolCallId", "subagentType", "qwenTranscript"})
_MERGE_TRANSCRIPT_KEYS: Final = frozenset({"sourceRecordIds", "planToolCallId"})

MergeFields = tuple[tuple[str, Any, Any, Any, Any, Any], str]
"""``((kind, promptId, originatorClientId, sessionId, parentToolCallId, sourceRecordIds), text)``
of a mergeable text chunk; an absent member is ``UNSET``."""


def _transcript_ok(value: object) -> bool:
    if type(value) is not dict or not value.keys() <= _MERGE_TRANSCRIPT_KEYS:
        return False
    sources = value.get("sourceRecordIds", _UNSET)
    if sources is not _UNSET and not (
            type(sources) is list and all(type(s) is str for s in sources)):
        return False
    plan = value.get("planToolCallId", _UNSET)
    return plan is _UNSET or type(plan) is str


def mergeable_chunk_fields(env: Any) -> MergeFields | None:
    """What :func:`view` of ``env`` (a JSON object as decoded) as :class:`MergeableChunk` yields
    for a text chunk that may merge, or ``None`` when that view fails or its update is not such
    a chunk."""
    try:
        # Subscripting by a string succeeds only on objects (a list, string or number raises
        # TypeError), so it doubles as the type check, cheaper than isinstance.
        data = env["data"]
        update = data["update"]
        kind = update["sessionUpdate"]
        if kind != AGENT_MESSAGE_CHUNK and kind != AGENT_THOUGHT_CHUNK:
            return None
        content = update["content"]
        text = content["text"]
    except (KeyError, TypeError):
        return None
    # Only an object takes a string subscript, so data, update and content are objects here.
    if type(text) is not str or len(content) != 2 or content.get("type") != "text":
        return None
    size = len(data)
    if size != 1 and (size != 2 or "sessionId" not in data):
        return None
    if "_meta" in env:
        env_meta = env["_meta"]
        if type(env_meta) is not dict or not (
                (len(env_meta) == 1 and "serverTimestamp" in env_meta)
                or env_meta.keys() <= _MERGE_ENVELOPE_META_KEYS):
            return None
    parent: object = _UNSET
    sources: object = _UNSET
    if len(update) != 2:
        # sessionUpdate and content are present, so a third member may only be _meta.
        if len(update) != 3 or "_meta" not in update:
            return None
        meta = update["_meta"]
        if type(meta) is not dict or not meta.keys() <= _MERGE_UPDATE_META_KEYS:
            return None
        if meta:
            parent = meta.get("parentToolCallId", _UNSET)
            if parent is not _UNSET and type(parent) is not str:
                return None
            subagent = meta.get("subagentType", _UNSET)
            if subagent is not _UNSET and type(subagent) is not str:
                return None
            transcript = meta.get("qwenTranscript", _UNSET)
            if transcript is not _UNSET:
                if not _transcript_ok(transcript):
                    return None
                sources = transcript.get("sourceRecordIds", _UNSET)
    return (kind, env.get("promptId", _UNSET), env.get("originatorClientId", _UNSET),
            data.get("sessionId", _UNSET), parent, sources), text


# --- what the daemon writes in ACP's shapes (built, never views) ------------------------------


class EchoMeta(msgspec.Struct, frozen=True, rename="camel", gc=False):
    """``_meta`` of the daemon's echo of a prompt: when it started, and that it is the echo."""

    server_timestamp: int
    source: str = BRIDGE_ECHO


class UserEcho(msgspec.Struct, frozen=True, tag_field="sessionUpdate",
               tag="user_message_chunk"):
    """The ``user_message_chunk`` update the daemon publishes for each block of a prompt as it
    starts running: the client's block as sent (every member of it) as ``content``."""

    content: Any
    meta: EchoMeta = msgspec.field(name="_meta")


class PermissionAnswer(msgspec.Struct, frozen=True, gc=False):
    """The result the daemon answers an agent's ``session/request_permission`` with."""

    outcome: PermissionOutcome
