"""One event's walk through the daemon, measured on a real daemon.

What the interpreter enters to move one read of agent output to an SSE socket: a daemon runs in
this process (its agent, the mock, is a real subprocess; its subscriber a real TCP socket),
the agent writes one read of plain text chunks, and a profiler (``sys.setprofile``) records
every call into and every return out of the product's modules (``daemon.*``, ``sdk.*``) made
by the tasks that carry the read: the agent's stdout reader, from the moment the read wakes it
to the moment it waits for the next one; the delivery loop (:mod:`daemon.delivery`), which
writes the frames of a caught-up SSE subscriber; and the subscriber's own stream task, which
waits in that loop and is not woken for a live write (its walk stays empty). Calls into the standard
library, Trio or msgspec are not counted; a call within one module is not a step.

The walk is the sequence of module changes: *entering* a module (a call from another one) or
*returning* to the module the call came from (always one already left). ``python -m
tests.event_walk`` prints it; ``tests/streams/test_event_walk.py`` holds the counts to the figures
docs/architecture.md states.
"""

from __future__ import annotations

import io
import os
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
import trio
import trio.testing

PRODUCT = ("daemon.", "sdk.")
# The functions whose tasks carry the read: the agent's stdout reader and the SSE stream
# (waiting in the delivery loop, whose task writes it: it is not woken).
READER = "_pump_stdout"
STREAM = "_stream_sse"
CHUNKS = 8


@dataclass
class Walk:
    """One task's module changes, in order: ("enter" | "return", module)."""

    steps: list[tuple[str, str]] = field(default_factory=list)

    @property
    def entered(self) -> int:
        return sum(1 for kind, _ in self.steps if kind == "enter")

    @property
    def returns(self) -> int:
        return sum(1 for kind, _ in self.steps if kind == "return")

    def render(self) -> str:
        return " ".join(("-> " if kind == "enter" else "<- ") + module.split(".", 1)[1]
                        for kind, module in self.steps)


def _product(frame: FrameType | None) -> str | None:
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if name.startswith(PRODUCT):
            return str(name)
        frame = frame.f_back
    return None


def _await_chain(coro: Any) -> Iterator[str]:
    """The function names of a suspended coroutine and everything it awaits."""
    seen = 0
    while coro is not None and seen < 64:
        code = getattr(coro, "cr_code", None) or getattr(coro, "gi_code", None)
        if code is not None:
            yield code.co_name
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
        seen += 1


def _tasks() -> Iterator[trio.lowlevel.Task]:
    stack = [trio.lowlevel.current_root_task()]
    while stack:
        task = stack.pop()
        if task is None:
            continue
        yield task
        for nursery in task.child_nurseries:
            stack.extend(nursery.child_tasks)


class Tracer:
    """The profiler: module changes per traced task."""

    def __init__(self, roles: dict[trio.lowlevel.Task, str]) -> None:
        self.roles = roles
        self.walks = {role: Walk() for role in roles.values()}
        self._at: dict[str, str | None] = dict.fromkeys(roles.values())

    def __call__(self, frame: FrameType, event: str, arg: object) -> None:
        if event not in ("call", "return"):
            return
        module = frame.f_globals.get("__name__", "")
        if not module.startswith(PRODUCT):
            return
        try:
            role = self.roles.get(trio.lowlevel.current_task())
        except RuntimeError:
            return
        if role is None:
            return
        at = self._at[role]
        if event == "call":
            if module != at:
                self.walks[role].steps.append(("enter", module))
            self._at[role] = module
            return
        back = _product(frame.f_back)
        if back is not None and back != module:
            self.walks[role].steps.append(("return", back))
        self._at[role] = back


async def measure(workdir: Path) -> dict[str, Walk]:
    """One read of :data:`CHUNKS` plain text chunks through a daemon started here, walked."""
    from daemon.config import parse_config

    gates = workdir / "gates"
    gates.mkdir()
    config = parse_config(["--port", "0", "--data-dir", str(workdir / "data"),
                           "--workspace", str(workdir)], environ={})
    (gates / "open").touch()
    previous = os.environ.get("MOCK_ACP_GATE_DIR")
    os.environ["MOCK_ACP_GATE_DIR"] = str(gates)  # the agent subprocess inherits it
    try:
        return await _measure(workdir, gates, config)
    finally:
        if previous is None:
            del os.environ["MOCK_ACP_GATE_DIR"]
        else:
            os.environ["MOCK_ACP_GATE_DIR"] = previous


async def _measure(workdir: Path, gates: Path, config: Any) -> dict[str, Walk]:
    from daemon import server

    async with trio.open_nursery() as nursery:
        binds: list[str] = await nursery.start(lambda task_status: server.run_daemon(
            config, handle_signals=False, out=io.StringIO(), task_status=task_status))
        url = binds[0]
        host, port = url.rsplit("/", 1)[1].rsplit(":", 1)
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            sid = (await client.post("/session", json={})).json()["sessionId"]
            sock = await trio.open_tcp_stream(host, int(port))
            await sock.send_all(f"GET /session/{sid}/events?maxQueued=2048 HTTP/1.1\r\n"
                                f"Host: {host}\r\n\r\n".encode())
            received = bytearray()

            async def read_until(needle: bytes, count: int) -> None:
                with trio.fail_after(30):
                    while received.count(needle) < count:
                        received.extend(await sock.receive_some(1 << 16))

            await read_until(b"retry:", 1)
            prompt = (f"mock:chunks={CHUNKS} mock:delay_ms=0 mock:start_gate=go "
                      "mock:gate=end")
            accepted = await client.post(f"/session/{sid}/prompt",
                                         json={"prompt": [{"type": "text", "text": prompt}]})
            assert accepted.status_code == 202, accepted.text
            await read_until(b"event: session_update", 1)  # the daemon's echo of the prompt
            await trio.testing.wait_all_tasks_blocked(0.2)
            from daemon.delivery import Delivery

            roles: dict[trio.lowlevel.Task, str] = {}
            for task in _tasks():
                names = set(_await_chain(task.coro))
                if READER in names:
                    roles[task] = "reader"
                elif STREAM in names:
                    roles[task] = "stream"
            delivery = Delivery.running()
            assert delivery is not None and delivery.task is not None, "no delivery loop"
            roles[delivery.task] = "delivery"
            assert sorted(roles.values()) == ["delivery", "reader", "stream"], roles
            tracer = Tracer(roles)
            before = received.count(b"event: session_update")
            sys.setprofile(tracer)
            try:
                (gates / "go").touch()
                await read_until(b"event: session_update", before + CHUNKS)
                await trio.testing.wait_all_tasks_blocked(0.2)
            finally:
                sys.setprofile(None)
            (gates / "end").touch()
            await sock.aclose()
        nursery.cancel_scope.cancel()
    return tracer.walks


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        walks = trio.run(measure, Path(tmp))
    for role, walk in walks.items():
        print(f"{role}: entered {walk.entered}, returned {walk.returns}")
        print(f"  {walk.render()}")
    total_in = sum(w.entered for w in walks.values())
    total_back = sum(w.returns for w in walks.values())
    print(f"total: entered {total_in}, returned {total_back}")


if __name__ == "__main__":
    main()
