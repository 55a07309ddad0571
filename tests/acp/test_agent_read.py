"""The agent reader's pipe read (``daemon.agent._receive``): what ``receive_some`` returns and
raises, and whether it waited for the agent. After a read that waited (``eager``) it takes one
scheduler pass where Trio's pipe stream takes two (it yields, reads, finds the pipe empty and
parks again); after one that found data waiting it reads as Trio's does (yield, then read what
piled up meanwhile). Counted in steps of the reading task (a Trio instrument)."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager

import pytest
import trio
import trio.testing

from daemon.agent import _receive, _Received


class _Steps(trio.abc.Instrument):
    """How many times ``task`` was scheduled to run."""

    def __init__(self, task: trio.lowlevel.Task) -> None:
        self.task = task
        self.count = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task is self.task:
            self.count += 1


@contextmanager
def _pipe() -> Iterator[tuple[trio.lowlevel.FdStream, int]]:
    read_fd, write_fd = os.pipe()
    stream = trio.lowlevel.FdStream(read_fd)
    try:
        yield stream, write_fd
    finally:
        os.close(write_fd)


async def _steps_of(read: Callable[[], Awaitable[bytes]], write_fd: int, *, later: bool
                    ) -> tuple[bytes, int]:
    """What ``read()`` returned and how many times its task was scheduled again before it
    returned; the pipe is written before the read starts, or once every task waits
    (``later``)."""
    got: list[tuple[bytes, int]] = []

    async def reader() -> None:
        steps = _Steps(trio.lowlevel.current_task())
        trio.lowlevel.add_instrument(steps)
        try:
            data = await read()
        finally:
            trio.lowlevel.remove_instrument(steps)
        got.append((data, steps.count))

    if not later:
        os.write(write_fd, b"ready\n")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader)
        if later:
            await trio.testing.wait_all_tasks_blocked()
            os.write(write_fd, b"later\n")
    return got[0]


@pytest.mark.parametrize("later", [False, True], ids=["data_waiting", "empty_pipe"])
async def test_after_a_wait_a_read_is_one_scheduler_pass(later: bool) -> None:
    expected = b"later\n" if later else b"ready\n"
    with _pipe() as (stream, write_fd):
        got, steps = await _steps_of(lambda: _data(_receive(stream, 1024, eager=True)),
                                     write_fd, later=later)
        assert got == expected + (b" waited" if later else b"")
        assert steps == 1
    with _pipe() as (stream, write_fd):
        got, steps = await _steps_of(lambda: _data(_receive(stream, 1024, eager=False)),
                                     write_fd, later=later)
        assert got == expected + (b" waited" if later else b"")
        assert steps == (2 if later else 1)  # Trio's order
    with _pipe() as (stream, write_fd):
        got, steps = await _steps_of(lambda: stream.receive_some(1024), write_fd, later=later)
        assert got == expected
        assert steps == (2 if later else 1)


async def _data(receiving: Awaitable[_Received]) -> bytes:
    data, waited = await receiving
    return bytes(data) + (b" waited" if waited else b"")


async def test_end_of_file_and_a_closed_stream_read_as_receive_some_reads_them() -> None:
    read_fd, write_fd = os.pipe()
    stream = trio.lowlevel.FdStream(read_fd)
    os.write(write_fd, b"last\n")
    os.close(write_fd)
    assert await _receive(stream, 1024, eager=True) == (b"last\n", False)
    assert await _receive(stream, 1024, eager=False) == (b"", False)  # the agent closed it
    await stream.aclose()
    with pytest.raises(trio.ClosedResourceError):
        await _receive(stream, 1024, eager=True)


async def test_a_stream_closed_while_the_read_waits_ends_the_read() -> None:
    with _pipe() as (stream, _):
        async with trio.open_nursery() as nursery:
            async def read() -> None:
                with pytest.raises(trio.ClosedResourceError):
                    await _receive(stream, 1024, eager=True)

            nursery.start_soon(read)
            await trio.testing.wait_all_tasks_blocked()
            await stream.aclose()


async def test_a_stream_without_a_descriptor_is_read_with_receive_some() -> None:
    send, receive = trio.testing.memory_stream_one_way_pair()
    await send.send_all(b"memory\n")
    assert await _receive(receive, 1024, eager=True) == (b"memory\n", False)
