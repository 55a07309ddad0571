"""The pure rules of idempotent prompt admission (``daemon.core.idempotency``) and the key's
grammar (``sdk.protocol.http.parse_idempotency_key``)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from daemon.core.idempotency import (
    AdmissionKeys,
    Conflict,
    KeyedAdmission,
    Replay,
    decide,
    request_digest,
)
from sdk.protocol.http import PromptAccepted, parse_idempotency_key


def admission(key: str, digest: str = "d", prompt_id: str = "p") -> KeyedAdmission:
    return KeyedAdmission(key, digest, PromptAccepted(prompt_id=prompt_id, last_event_id=3,
                                                      event_epoch="e"))


def test_decide_admits_a_new_key_replays_the_same_request_and_refuses_another() -> None:
    found = admission("k", "same", "p1")
    assert decide(None, "anything") is None
    assert decide(found, "same") == Replay(found.accepted)
    assert decide(found, "other") == Conflict("p1")


def test_the_digest_ignores_layout_but_not_content() -> None:
    body = {"prompt": [{"type": "text", "text": "hi", "x": {"b": 1, "a": 2}}], "deadlineMs": 5}
    reordered = {"deadlineMs": 5, "prompt": [{"x": {"a": 2, "b": 1}, "text": "hi",
                                              "type": "text"}]}
    assert request_digest(body) == request_digest(reordered)
    assert len(request_digest(body)) == 64
    for changed in ({**body, "deadlineMs": 6}, {"prompt": body["prompt"]},
                    {**body, "prompt": [{"type": "text", "text": "hi!"}]},
                    {**body, "prompt": body["prompt"] * 2}):
        assert request_digest(changed) != request_digest(body)


def test_memory_forgets_the_oldest_and_then_is_no_longer_complete() -> None:
    keys = AdmissionKeys(complete=True, capacity=3)
    for n in range(3):
        keys.remember(admission(f"k{n}"))
    assert keys.complete and len(keys) == 3
    assert keys.get("k0") is not None
    keys.remember(admission("k3"))
    assert not keys.complete and len(keys) == 3
    assert keys.get("k0") is None and keys.get("k3") is not None
    restored = AdmissionKeys(complete=False)
    assert not restored.complete and restored.get("k0") is None
    with pytest.raises(ValueError):
        AdmissionKeys(complete=True, capacity=0)


def test_a_remembered_key_is_kept_longest_when_seen_again() -> None:
    keys = AdmissionKeys(complete=True, capacity=2)
    keys.remember(admission("a"))
    keys.remember(admission("b"))
    keys.remember(admission("a"))  # found again (e.g. read back from the ledger)
    keys.remember(admission("c"))
    assert keys.get("a") is not None and keys.get("b") is None


@pytest.mark.parametrize(("value", "key"), [
    ("abc", "abc"), ('"abc"', "abc"), ("A-z_0.9:~", "A-z_0.9:~"), ("k" * 128, "k" * 128),
    ("8e03978e-40d5-43e8-bc93-6894a57f9324", "8e03978e-40d5-43e8-bc93-6894a57f9324"),
    ("", None), ('""', None), ('"', None), ("k" * 129, None), ("a b", None), ("a/b", None),
    ('"a', None), ("a\"", None), ("é", None), ("a\n", None), ('""abc""', None),
])
def test_the_key_grammar(value: str, key: str | None) -> None:
    assert parse_idempotency_key(value) == key


@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=140))
def test_a_parsed_key_is_always_a_valid_path_segment(value: str) -> None:
    key = parse_idempotency_key(value)
    if key is not None:
        assert 1 <= len(key) <= 128 and key.isascii() and "/" not in key
        assert parse_idempotency_key(key) == key
