"""The agent's own echo of the running prompt, recognised without a process (daemon.core.prompt_echo)."""

from __future__ import annotations

from typing import Any

from daemon.core.prompt_echo import USER_CHUNK, PromptEcho


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


IMAGE = {"type": "image", "mimeType": "image/png", "data": "AAAA"}


def test_the_prompt_echoed_whole_or_in_pieces_is_taken_once() -> None:
    echo = PromptEcho([text("hello "), text("world")])
    assert echo.take(USER_CHUNK, text("hel")) and echo.take(USER_CHUNK, text("lo world"))
    assert not echo.open and echo.taken == 2
    assert not echo.take(USER_CHUNK, text("hello world"))  # a second copy is the agent's own
    whole = PromptEcho([text("hello world")])
    assert whole.take(USER_CHUNK, text("hello world")) and not whole.open


def test_a_different_user_message_is_kept_and_closes_the_window() -> None:
    echo = PromptEcho([text("run the tests")])
    assert not echo.take(USER_CHUNK, text("something else"))
    assert not echo.open and not echo.take(USER_CHUNK, text("run the tests"))
    partial = PromptEcho([text("run the tests")])
    assert partial.take(USER_CHUNK, text("run "))
    assert not partial.take(USER_CHUNK, text("the docs"))  # not how the prompt goes on
    assert partial.taken == 1


def test_the_answer_starting_closes_the_window_but_other_updates_do_not() -> None:
    echo = PromptEcho([text("hi")])
    assert not echo.take("available_commands_update", None)
    assert not echo.take("current_mode_update", None) and echo.open
    assert not echo.take("agent_message_chunk", text("hi"))
    assert not echo.open and not echo.take(USER_CHUNK, text("hi"))
    for kind in ("agent_thought_chunk", "tool_call", "plan"):
        other = PromptEcho([text("hi")])
        other.take(kind, None)
        assert not other.open


def test_non_text_blocks_are_taken_when_equal_to_the_prompts() -> None:
    echo = PromptEcho([text("look: "), IMAGE])
    assert echo.take(USER_CHUNK, text("look: "))
    assert not echo.take(USER_CHUNK, {**IMAGE, "data": "BBBB"})
    echo = PromptEcho([text("look: "), IMAGE])
    assert echo.take(USER_CHUNK, IMAGE) and echo.take(USER_CHUNK, text("look: "))
    assert not echo.open


def test_empty_texts_and_empty_prompts_take_nothing() -> None:
    assert not PromptEcho([]).open
    echo = PromptEcho([text("x")])
    assert not echo.take(USER_CHUNK, text("")) and not echo.open
    assert echo.take_texts("agent_message_chunk", ["a", "b"]) == [False, False]
    echo = PromptEcho([text("ab")])
    assert echo.take_texts(USER_CHUNK, ["a", "b", "a"]) == [True, True, False]
