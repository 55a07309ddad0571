"""One name means one type: every result a client route returns is the protocol's body (the
type the daemon encodes its answer from), never an SDK-side copy of it."""

from __future__ import annotations

import inspect
import typing

import msgspec

from sdk import DaemonClient, SyncDaemonClient


def _struct_results(kind: type) -> dict[str, type]:
    found: dict[str, type] = {}
    for name, method in inspect.getmembers(kind, inspect.isfunction):
        if name.startswith("_"):
            continue
        result = typing.get_type_hints(method).get("return")
        for part in (result, *typing.get_args(result)):
            origin = typing.get_origin(part) or part
            if isinstance(origin, type) and issubclass(origin, msgspec.Struct):
                found[name] = origin
    return found


def test_every_struct_a_client_route_returns_is_a_protocol_type() -> None:
    results = {**_struct_results(DaemonClient), **{
        f"sync.{name}": kind for name, kind in _struct_results(SyncDaemonClient).items()}}
    assert {"daemon_status", "list_sessions_page", "list_sessions", "health",
            "sync.daemon_status"} <= results.keys()
    outside = {name: f"{kind.__module__}.{kind.__qualname__}" for name, kind in results.items()
               if not kind.__module__.startswith("sdk.protocol.")}
    assert outside == {}
