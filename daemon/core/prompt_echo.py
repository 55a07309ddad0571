"""Recognising an agent's own echo of the prompt it is running (pure).

The daemon publishes the prompt being run as ``user_message_chunk`` updates itself (the bridge
echo), so every client sees the prompt once, whatever the agent does. Some agents (Mistral Vibe)
also send the prompt back as ``user_message_chunk`` updates of their own before they answer;
published as they come, the prompt would show twice, live and in the transcript.

:class:`PromptEcho` follows one turn's agent updates and says which of them are that echo: the
agent's ``user_message_chunk`` updates that, in order, spell the prompt's text exactly (in one
piece or in several), and non-text blocks equal to the prompt's own. Only one copy is taken per
turn. The echo window closes for good at the first user message that is not the prompt (it and
everything after it are kept: a genuinely different user message from the agent is never
dropped) and at the first update that starts the agent's answer (text, thought, tool call or
plan), since an echo comes before the answer.

No I/O: the session shell feeds it the kind and content of each update while it is open.
"""

from __future__ import annotations

from typing import Any, Final

from sdk.protocol.acp import TextBlockView, view

__all__ = ["ANSWER_KINDS", "USER_CHUNK", "PromptEcho"]

USER_CHUNK: Final = "user_message_chunk"
# Update kinds that start the agent's answer: after one of them an echo no longer comes.
ANSWER_KINDS: Final = frozenset({"agent_message_chunk", "agent_thought_chunk", "tool_call",
                                 "tool_call_update", "plan"})


def _text_of(block: Any) -> str | None:
    found = view(block, TextBlockView)
    if found is not None and found.type == "text" and type(found.text) is str:
        return found.text
    return None


class PromptEcho:
    """The prompt being run, as far as the agent has not echoed it yet.

    ``open`` is true while an update can still be taken as the echo; ``taken`` counts the
    updates taken as the echo so far."""

    __slots__ = ("_blocks", "_text", "open", "taken")

    def __init__(self, blocks: list[Any]) -> None:
        texts = [_text_of(block) for block in blocks]
        self._text = "".join(text for text in texts if text is not None)
        self._blocks = [block for block, text in zip(blocks, texts, strict=True) if text is None]
        self.open = bool(self._text or self._blocks)
        self.taken = 0

    def take(self, kind: object, content: object) -> bool:
        """Whether the update (its ``sessionUpdate`` and ``content``) is the agent's echo of
        the prompt, to be dropped; everything else is kept, and may close the window."""
        if not self.open:
            return False
        if kind != USER_CHUNK:
            if kind in ANSWER_KINDS:
                self.open = False
            return False
        text = _text_of(content)
        if text is not None:
            if text and self._text.startswith(text):
                self._text = self._text[len(text):]
                self._took()
                return True
        elif content in self._blocks:
            self._blocks.remove(content)
            self._took()
            return True
        self.open = False  # a user message that is not the prompt: kept, and so is the rest
        return False

    def take_texts(self, kind: str, texts: list[str]) -> list[bool]:
        """:meth:`take` for a run of text chunks of one kind (their texts), in order."""
        return [self.take(kind, {"type": "text", "text": text}) for text in texts]

    def _took(self) -> None:
        self.taken += 1
        if not self._text and not self._blocks:
            self.open = False
