"""Turn-boundary compaction. Pure core: no trio, no clock, no I/O.

While a turn runs, the bus hands every non-transient event to :meth:`TurnCompactor.add`, which
sorts it into an ordered *slot*:

- top-level ``agent_message_chunk`` / ``agent_thought_chunk`` text merges into the last slot when
  that slot has the same kind, is top-level and has the same ``sourceRecordIds``;
- subagent text (``update._meta.parentToolCallId``) merges into the one slot for
  ``(kind, parentToolCallId, sourceRecordIds)``, wherever it is;
- ``tool_call`` / ``tool_call_update`` frames with a ``toolCallId`` fold into one slot per tool
  call, at the position of its first frame;
- ``available_commands_update`` / ``current_mode_update`` keep one latest-wins slot per kind;
- everything else (user echo, plan, permission and pending-prompt frames, discrete messages,
  chunks whose content is not plain text) is kept as is.

:meth:`TurnCompactor.finish` renders the slots plus the terminal as envelope dicts: one segment
of the replay window and the turn's transcript records. :func:`stamp_record` puts a record id
on a compacted envelope.
"""

from __future__ import annotations

from typing import Any, Final

from daemon.core.envelope import Event, JsonObject, encode_json
from sdk.protocol.acp import (
    RECORD_ID_META_KEY,
    EnvelopeView,
    SessionUpdateView,
    TextBlockView,
    TranscriptMetaView,
    UpdateMetaView,
    UpdateView,
    view,
)

__all__ = ["TurnCompactor", "stamp_record"]

_TEXT_KINDS: Final = frozenset({"agent_message_chunk", "agent_thought_chunk"})
_TOOL_KINDS: Final = frozenset({"tool_call", "tool_call_update"})
_LATEST_KINDS: Final = frozenset({"available_commands_update", "current_mode_update"})

# Pieces are joined in groups of this many, and the groups again once as many accumulate, so a
# slot holds at most 2 * _JOIN_EVERY strings however many chunks arrive, and each byte of text is
# copied a bounded number of times (not once per join as a single running string would be).
_JOIN_EVERY: Final = 256

# A hashable stand-in for ``sourceRecordIds``: None when absent, a tuple for the normal list of
# strings, else the value's JSON bytes (odd values still compare by content, never crash).
_SourcesKey = tuple[str, ...] | bytes | None


def _sources_key(value: Any) -> _SourcesKey:
    if value is None:
        return None
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return tuple(value)
    return encode_json(value)


class _KeptSlot:
    """An event kept as is (or, for the latest-wins kinds, the latest one of its kind)."""

    __slots__ = ("env",)

    def __init__(self, env: JsonObject) -> None:
        self.env = env

    def emit(self) -> JsonObject:
        return self.env


class _TextSlot:
    """Merged text chunks of one kind (and one subagent, for subagent chunks)."""

    __slots__ = ("blocks", "kind", "last_event", "meta", "originator", "parent", "pieces",
                 "prompt_id", "sources")

    def __init__(self, kind: str, parent: str | None, sources: _SourcesKey) -> None:
        self.kind = kind
        self.parent = parent
        self.sources = sources
        self.pieces: list[str] = []
        self.blocks: list[str] = []
        self.meta: JsonObject = {}
        # The last chunk, as its event: its bytes are shared with the ring, and its envelope
        # is decoded again only when the turn is rendered (a dict per slot is never held).
        self.last_event: Event | None = None
        self.prompt_id: Any = None
        self.originator: Any = None

    def _join(self) -> None:
        blocks = self.blocks
        blocks.append("".join(self.pieces))
        self.pieces = []
        if len(blocks) >= _JOIN_EVERY:
            self.blocks = ["".join(blocks)]

    def absorb(self, event: Event, env: EnvelopeView, text: str, meta: JsonObject | None) -> None:
        pieces = self.pieces
        pieces.append(text)
        if len(pieces) >= _JOIN_EVERY:
            self._join()
        if meta:
            self.meta.update(meta)
        prompt_id = env.prompt_id
        if prompt_id is not None:
            self.prompt_id = prompt_id
        originator = env.originator_client_id
        if originator is not None:
            self.originator = originator
        self.last_event = event

    def absorb_run(self, events: list[Event], texts: list[str], prompt_id: str | None,
                   originator: str | None) -> None:
        """:meth:`absorb` of each plain chunk of a run (no ``_meta``; shared ids)."""
        self.pieces.extend(texts)
        if len(self.pieces) >= _JOIN_EVERY:
            self._join()
        if prompt_id is not None:
            self.prompt_id = prompt_id
        if originator is not None:
            self.originator = originator
        self.last_event = events[-1]

    @property
    def held_pieces(self) -> int:
        return len(self.blocks) + len(self.pieces)

    def text(self) -> str:
        return "".join(self.blocks) + "".join(self.pieces)

    def emit(self) -> JsonObject:
        # id, envelope _meta, data.sessionId and the other update keys are the last chunk's.
        assert self.last_event is not None  # a slot is made to absorb a chunk at once
        env = dict(self.last_event.env)
        # The last chunk was a text chunk when absorbed: data, update and content are objects.
        data_view = view(env, EnvelopeView)
        assert data_view is not None
        data = dict(data_view.data)
        update_view = view(data, SessionUpdateView)
        assert update_view is not None
        update = dict(update_view.update)
        content_view = view(update, UpdateView)
        assert content_view is not None
        content = dict(content_view.content)
        content["text"] = self.text()
        update["content"] = content
        if self.meta:
            update["_meta"] = dict(self.meta)
        else:
            update.pop("_meta", None)
        data["update"] = update
        env["data"] = data
        if self.prompt_id is not None:
            env["promptId"] = self.prompt_id
        if self.originator is not None:
            env["originatorClientId"] = self.originator
        return env


class _ToolSlot:
    """Every frame of one tool call, folded field by field into a ``tool_call``."""

    __slots__ = ("data", "env", "event_id", "meta", "originator", "prompt_id", "update")

    def __init__(self, env: JsonObject, view_: EnvelopeView, data: JsonObject,
                 update: JsonObject, update_view: UpdateView) -> None:
        self.env = env
        self.data = data
        self.update: JsonObject = dict(update)
        self.update["sessionUpdate"] = "tool_call"
        # The folded ``_meta`` (kept beside the dict, where it also sits in place).
        self.meta: Any = update_view.meta
        self.event_id: Any = view_.id
        self.prompt_id: Any = view_.prompt_id
        self.originator: Any = view_.originator_client_id

    def absorb(self, view_: EnvelopeView, update: JsonObject) -> None:
        merged = self.update
        for key, value in update.items():
            if value is None:
                # A null never erases what an earlier frame said.
                merged.setdefault(key, None)
            elif key == "_meta" and isinstance(value, dict):
                # Shallow-merged so that e.g. parentToolCallId from the first frame survives a
                # later frame that carries only a timestamp.
                old = self.meta
                self.meta = merged[key] = (
                    {**old, **value} if isinstance(old, dict) else dict(value))
            else:
                merged[key] = value
                if key == "_meta":
                    self.meta = value
        merged["sessionUpdate"] = "tool_call"
        event_id = view_.id
        if event_id is not None:
            self.event_id = event_id
        prompt_id = view_.prompt_id
        if prompt_id is not None:
            self.prompt_id = prompt_id
        originator = view_.originator_client_id
        if originator is not None:
            self.originator = originator

    def emit(self) -> JsonObject:
        env = dict(self.env)
        if self.event_id is not None:
            env["id"] = self.event_id
        if self.prompt_id is not None:
            env["promptId"] = self.prompt_id
        if self.originator is not None:
            env["originatorClientId"] = self.originator
        data = dict(self.data)
        data["update"] = dict(self.update)
        env["data"] = data
        return env


_Slot = _KeptSlot | _TextSlot | _ToolSlot


class TurnCompactor:
    """Folds one turn's events into slots; :meth:`finish` renders them at the terminal.

    ``add`` is on the publish hot path: a few dict lookups per event, no copying of envelopes
    (they are only read), and text kept as a bounded list of pieces.
    """

    __slots__ = ("_latest", "_slots", "_subagent", "_tools", "pending_events")

    def __init__(self) -> None:
        self._slots: list[_Slot] = []
        self._subagent: dict[tuple[str, str, _SourcesKey], _TextSlot] = {}
        self._tools: dict[str, _ToolSlot] = {}
        self._latest: dict[str, _KeptSlot] = {}
        self.pending_events = 0

    @property
    def slot_count(self) -> int:
        """Slots the turn has so far (what ``finish`` would emit, before the terminal)."""
        return len(self._slots)

    @property
    def held_text_pieces(self) -> int:
        """Text strings held across all open text slots (bounded per slot, whatever the chunk
        count); exposed so that memory behaviour can be observed."""
        return sum(slot.held_pieces for slot in self._slots if isinstance(slot, _TextSlot))

    def add(self, event: Event) -> None:
        """Classify one non-transient event of the running turn."""
        self.pending_events += 1
        env = event.env
        if event.type == "session_update":
            env_view = view(env, EnvelopeView)
            data = None if env_view is None else env_view.data
            data_view = view(data, SessionUpdateView)
            if data_view is not None:
                update = data_view.update
                update_view = view(update, UpdateView)
                if update_view is not None:
                    assert env_view is not None and type(data) is dict and type(update) is dict
                    kind = update_view.session_update
                    if isinstance(kind, str):
                        if kind in _TEXT_KINDS:
                            if self._add_text(event, env_view, update_view, kind):
                                return
                        elif kind in _TOOL_KINDS:
                            if self._add_tool(env, env_view, data, update, update_view):
                                return
                        elif kind in _LATEST_KINDS:
                            self._add_latest(env, kind)
                            return
        self._slots.append(_KeptSlot(env))

    def add_plain_chunks(self, kind: str, events: list[Event], texts: list[str],
                         prompt_id: str | None, originator: str | None) -> None:
        """:meth:`add` of each event of a run of plain top-level text chunks of one ``kind``
        (``daemon.core.frame_codec``: no ``_meta``, so no parent and no source records), whose texts
        are ``texts`` and whose envelopes carry ``prompt_id`` and ``originator``."""
        self.pending_events += len(events)
        slots = self._slots
        last = slots[-1] if slots else None
        if (
            isinstance(last, _TextSlot)
            and last.parent is None
            and last.kind == kind
            and last.sources is None
        ):
            slot = last
        else:
            slot = _TextSlot(kind, None, None)
            slots.append(slot)
        slot.absorb_run(events, texts, prompt_id, originator)

    def _add_text(self, event: Event, env: EnvelopeView, update: UpdateView, kind: str) -> bool:
        content = view(update.content, TextBlockView)
        if content is None or content.type != "text":
            return False
        text = content.text
        if not isinstance(text, str):
            return False
        meta = update.meta
        parent: str | None = None
        sources: _SourcesKey = None
        if meta is not None:
            meta_view = view(meta, UpdateMetaView)
            if meta_view is None or meta_view.qwen_discrete_message:
                return False
            candidate = meta_view.parent_tool_call_id
            if isinstance(candidate, str) and candidate:
                parent = candidate
            transcript = view(meta_view.qwen_transcript, TranscriptMetaView)
            if transcript is not None:
                sources = _sources_key(transcript.source_record_ids)
        slot: _TextSlot | None
        if parent is None:
            slots = self._slots
            last = slots[-1] if slots else None
            if (
                isinstance(last, _TextSlot)
                and last.parent is None
                and last.kind == kind
                and last.sources == sources
            ):
                slot = last
            else:
                slot = _TextSlot(kind, None, sources)
                slots.append(slot)
        else:
            key = (kind, parent, sources)
            slot = self._subagent.get(key)
            if slot is None:
                slot = _TextSlot(kind, parent, sources)
                self._subagent[key] = slot
                self._slots.append(slot)
        slot.absorb(event, env, text, meta)
        return True

    def _add_tool(self, env: JsonObject, env_view: EnvelopeView, data: JsonObject,
                  update: JsonObject, update_view: UpdateView) -> bool:
        tool_call_id = update_view.tool_call_id
        if not isinstance(tool_call_id, str) or not tool_call_id:
            return False
        slot = self._tools.get(tool_call_id)
        if slot is None:
            slot = _ToolSlot(env, env_view, data, update, update_view)
            self._tools[tool_call_id] = slot
            self._slots.append(slot)
        else:
            slot.absorb(env_view, update)
        return True

    def _add_latest(self, env: JsonObject, kind: str) -> None:
        slot = self._latest.get(kind)
        if slot is None:
            slot = _KeptSlot(env)
            self._latest[kind] = slot
            self._slots.append(slot)
        else:
            slot.env = env

    def finish(self, terminal: Event) -> list[JsonObject]:
        """The compacted turn: every slot rendered in order, then the terminal's envelope.

        Resets the compactor for the next turn. A terminal that was also passed to ``add`` is
        not emitted twice.
        """
        slots = self._slots
        if slots:
            last = slots[-1]
            if isinstance(last, _KeptSlot) and last.env is terminal.env:
                slots.pop()
        out = [slot.emit() for slot in slots]
        out.append(terminal.env)
        self.reset()
        return out

    def reset(self) -> None:
        """Drop everything held (turn boundary, or a turn abandoned after a failure)."""
        self._slots = []
        self._subagent = {}
        self._tools = {}
        self._latest = {}
        self.pending_events = 0


def stamp_record(env: JsonObject, record_id: str) -> JsonObject:
    """A new envelope carrying transcript record id ``record_id``.

    For ``session_update``: ``update._meta["qwen.session.recordId"] = record_id`` and
    ``update._meta.qwenTranscript.sourceRecordIds = [record_id]`` (other ``qwenTranscript`` keys
    are kept). Other types come back as a shallow copy. The input is never modified.
    """
    out = dict(env)
    env_view = view(out, EnvelopeView)
    if env_view is None or env_view.type != "session_update":
        return out
    data = env_view.data
    data_view = view(data, SessionUpdateView)
    if data_view is None:
        return out
    update = data_view.update
    update_view = view(update, UpdateView)
    if update_view is None:
        return out
    old_meta = update_view.meta
    meta: JsonObject = dict(old_meta) if isinstance(old_meta, dict) else {}
    meta_view = view(meta, UpdateMetaView)
    old_transcript = None if meta_view is None else meta_view.qwen_transcript
    transcript: JsonObject = dict(old_transcript) if isinstance(old_transcript, dict) else {}
    transcript["sourceRecordIds"] = [record_id]
    meta["qwenTranscript"] = transcript
    meta[RECORD_ID_META_KEY] = record_id
    new_update = dict(update)
    new_update["_meta"] = meta
    new_data = dict(data)
    new_data["update"] = new_update
    out["data"] = new_data
    return out
