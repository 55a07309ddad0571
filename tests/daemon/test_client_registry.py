"""The client-id registry (daemon/core/clients.py): minted ids are kept, others replaced; both the
per-session registrations and the set of known ids stay bounded; a removed session takes its ids."""

from __future__ import annotations

import itertools

import pytest

from daemon.core.clients import ClientRegistry


def minter() -> tuple[list[str], object]:
    made: list[str] = []
    counter = itertools.count(1)

    def mint() -> str:
        made.append(f"client_{next(counter)}")
        return made[-1]
    return made, mint


def test_a_known_id_is_kept_and_an_unknown_one_replaced() -> None:
    reg = ClientRegistry()
    _, mint = minter()
    first = reg.register("s1", None, mint)  # type: ignore[arg-type]
    assert first == "client_1"
    assert reg.register("s2", first, mint) == first  # type: ignore[arg-type]
    assert reg.register("s2", "made-up", mint) == "client_2"  # type: ignore[arg-type]
    assert reg.is_registered("s1", first) and reg.is_registered("s2", first)
    assert not reg.is_registered("s1", "client_2")
    assert not reg.is_registered("nope", first)
    assert len(reg) == 2


def test_registering_twice_on_one_session_counts_once() -> None:
    reg = ClientRegistry()
    _, mint = minter()
    cid = reg.register("s", None, mint)  # type: ignore[arg-type]
    for _ in range(5):
        assert reg.register("s", cid, mint) == cid  # type: ignore[arg-type]
    assert reg.session_clients("s") == 1 and len(reg) == 1
    reg.drop_session("s")
    assert len(reg) == 0 and not reg.is_known(cid)


def test_a_session_keeps_its_newest_registrations_and_a_use_counts_as_new() -> None:
    reg = ClientRegistry(per_session_cap=3)
    _, mint = minter()
    a, b, c = (reg.register("s", None, mint) for _ in range(3))  # type: ignore[arg-type]
    assert reg.is_registered("s", a)  # a is now the newest use; b is the oldest
    d = reg.register("s", None, mint)  # type: ignore[arg-type]
    assert reg.session_clients("s") == 3
    assert not reg.is_registered("s", b) and not reg.is_known(b)
    assert all(reg.is_registered("s", x) for x in (a, c, d))
    # b is unknown again: presenting it gets a fresh id rather than b back.
    assert reg.register("s", b, mint) not in {a, b, c, d}  # type: ignore[arg-type]


def test_many_loads_without_an_id_stay_bounded() -> None:
    reg = ClientRegistry(per_session_cap=100)
    _, mint = minter()
    for _ in range(10_000):
        reg.register("s", None, mint)  # type: ignore[arg-type]
    assert reg.session_clients("s") == 100 and len(reg) == 100


def test_an_id_on_two_sessions_is_known_until_both_let_go() -> None:
    reg = ClientRegistry(per_session_cap=2)
    _, mint = minter()
    cid = reg.register("s1", None, mint)  # type: ignore[arg-type]
    reg.register("s2", cid, mint)  # type: ignore[arg-type]
    reg.drop_session("s1")
    assert reg.is_known(cid) and reg.is_registered("s2", cid)
    # Evicted from s2 by two newer registrations: now nobody holds it.
    reg.register("s2", None, mint)  # type: ignore[arg-type]
    reg.register("s2", None, mint)  # type: ignore[arg-type]
    assert not reg.is_known(cid)
    assert len(reg) == 2


def test_detach_releases_only_that_session() -> None:
    reg = ClientRegistry()
    _, mint = minter()
    cid = reg.register("s1", None, mint)  # type: ignore[arg-type]
    reg.register("s2", cid, mint)  # type: ignore[arg-type]
    reg.detach("s1", cid)
    reg.detach("s1", cid)  # twice is harmless
    reg.detach("s1", "never")
    assert not reg.is_registered("s1", cid) and reg.is_registered("s2", cid)
    reg.detach("s2", cid)
    assert len(reg) == 0 and reg.session_clients("s2") == 0


def test_cap_must_be_positive() -> None:
    with pytest.raises(ValueError):
        ClientRegistry(per_session_cap=0)
