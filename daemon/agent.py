"""The agent channel: a Trio shell around one ACP agent subprocess, spoken to over stdio.

One channel per workspace. It owns the process and four kinds of work inside ``run``'s
nursery: the stdin writer, the stdout reader (which dispatches every read synchronously, so
updates reach the sinks in stdout order and replies resolve after the updates that preceded
them), the stderr logger, and short tasks answering the agent's own requests. The framing is
the pure :mod:`daemon.core.acp_codec`; what the lines mean (initialize checks, routing, load
replays, request matching, answers to the agent's requests) is the pure
:mod:`daemon.core.acp_client`. This module only moves bytes, owns the process, the timers and
the tasks, and logs.

Writes never block a caller: every line goes into one queue that the writer task alone writes,
in order, a line at a time (so lines never interleave, and a caller that stops waiting never
leaves half a line in the pipe). An agent whose stdin accepts nothing for ``write_timeout``
seconds is declared dead: it is killed, and everything waiting on it fails as after a crash.
Its stderr is logged within a budget of lines and bytes per second; the rest is counted.
"""

from __future__ import annotations

import errno
import logging
import math
import os
import signal
import subprocess
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final, NamedTuple, Protocol

import trio

from daemon.core.acp_client import (
    DEFAULT_CLIENT_INFO,
    PROTOCOL_VERSION,
    AcpClient,
    AgentProtocolError,
    AgentRpcError,
    BadUpdate,
    HeldUpdatesDropped,
    MalformedLine,
    NotificationIgnored,
    PermissionAsked,
    PermissionRefused,
    Replied,
    ReplyUnknown,
    SessionIdInUse,
    UnroutedPermission,
    UnroutedUpdate,
    UnsupportedRequest,
    cancel_line,
    check_initialize,
    initialize_params,
    load_session_params,
    new_session_params,
    permission_failed,
    permission_granted,
    prompt_params,
    prompt_result,
    session_id_of,
)
from daemon.core.acp_codec import LineSplitter, Read
from daemon.core.throttle import LineBudget, LogThrottle
from daemon.core.updates import UpdateBatch
from daemon.delivery import Delivery
from sdk.protocol.acp import PermissionAnswer

__all__ = [
    "PROTOCOL_VERSION",
    "AgentChannel",
    "AgentProtocolError",
    "AgentRpcError",
    "AgentStartError",
    "ChannelClosed",
    "Flow",
    "SessionIdInUse",
    "SessionSink",
]

log = logging.getLogger("daemon.agent")

READ_CHUNK_BYTES: Final = 256 * 1024
# Lines dispatched between two yields when no sink says otherwise (see Flow.group_lines).
DISPATCH_GROUP_LINES: Final = 64
PIPE_BYTES: Final = 1024 * 1024
# How long a closing agent gets between stdin EOF and SIGKILL.
EXIT_GRACE_SECONDS: Final = 1.0
# aclose(): the stdin-EOF grace, then the helpers' SIGTERM grace, plus room to reap.
CLOSE_BOUND_S: Final = 2 * EXIT_GRACE_SECONDS + 1.0
# Agent stderr is for humans; a runaway line is cut rather than buffered.
_STDERR_LINE_BYTES: Final = 64 * 1024
# How much of an agent's stderr is logged: lines and bytes per second, and the bursts allowed
# above that; the rest is counted and reported in one line once the flood pauses for
# STDERR_QUIET_S, and at most every STDERR_REPORT_S while it lasts.
STDERR_LINES_PER_S: Final = 50.0
STDERR_LINE_BURST: Final = 500
STDERR_BYTES_PER_S: Final = 16 * 1024.0
STDERR_BYTE_BURST: Final = 256 * 1024
STDERR_REPORT_S: Final = 10.0
STDERR_QUIET_S: Final = 1.0
# Bytes handed to the agent's stdin per write: each must be accepted within write_timeout.
WRITE_PIECE_BYTES: Final = 64 * 1024
# Replies the stdout reader makes itself (refusals) that may wait in the write queue before
# the reader stops reading until the agent takes them: an agent that floods requests and does
# not read the answers is slowed down, not buffered for.
READER_REPLY_BACKLOG_BYTES: Final = 1024 * 1024
# One log line per this many seconds about refused permission requests, with a count.
REFUSAL_LOG_INTERVAL_S: Final = 10.0


class AgentStartError(Exception):
    """The agent could not be started: spawn failure, or initialize timed out / exited / failed."""

    code: Final = "agent_start_failed"


class ChannelClosed(Exception):
    """The agent process went away (or the channel was closed) while a request needed it."""


class Flow(Protocol):
    """A session's flow control, as the reader sees it (the session's bus)."""

    #: How many stdout lines the reader may dispatch before it yields, so that the session's
    #: subscribers write (and flow control checks them) at least that often. The channel
    #: keeps the smallest over its sinks: when this may have changed (the session's
    #: subscribers did), the session calls :meth:`AgentChannel.group_lines_changed`.
    group_lines: int

    async def wait_for_subscribers(self) -> None:
        """After a publish: return once the session's subscribers can take more (bounded)."""


class SessionSink(Protocol):
    """Where one ACP session's traffic goes (the daemon session implements it)."""

    flow: Flow

    def publish(self, batch: UpdateBatch) -> None:
        """The session's updates of one stdout read, in stdout order, from the reader task:
        published, and the session's subscribers woken, before it returns."""


    def permission_asked(self, params: dict[str, Any]) -> Awaitable[PermissionAnswer]:
        """A ``session/request_permission`` for this session, called as it is read (after the
        updates of the same read, before any task the read wakes runs): publish it and decide
        it or start waiting for the decision. The channel awaits the returned awaitable in a
        task of its own for the JSON-RPC result it answers the agent with."""
        ...


class _Write:
    """One line waiting in the write queue."""

    __slots__ = ("by_reader", "line", "skip", "started")

    def __init__(self, line: bytes, by_reader: bool) -> None:
        self.line = line
        self.by_reader = by_reader
        self.started = False
        self.skip = False  # its caller stopped waiting before it was written: not written


class _Slot:
    """A caller waiting for one reply."""

    __slots__ = ("done", "error", "result")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.result: Any = None
        self.error: BaseException | None = None


def _widen_pipe(stream: trio.abc.ReceiveStream | None) -> None:
    """Ask for a 1 MiB stdout pipe (Linux) so one read carries more lines and sinks flush less."""
    try:
        import fcntl  # POSIX only
    except ImportError:
        return
    set_size = getattr(fcntl, "F_SETPIPE_SZ", None)
    fileno = getattr(stream, "fileno", None)
    if set_size is None or fileno is None:
        return
    try:
        fcntl.fcntl(fileno(), set_size, PIPE_BYTES)
    except OSError:
        pass  # over /proc/sys/fs/pipe-max-size: the default pipe still works, in smaller reads


class _Received(NamedTuple):
    data: bytes | bytearray
    waited: bool  # the pipe was empty: the read parked until the agent wrote


async def _receive(stream: trio.abc.ReceiveStream, max_bytes: int, *, eager: bool
                   ) -> _Received:
    """``stream.receive_some(max_bytes)``, and whether it had to wait for the agent.

    Trio's pipe stream yields first and then reads; an empty pipe then parks it again until
    the pipe is readable: two passes of the scheduler per read, each a wake-up of the event
    loop. That order is kept while the agent is ahead of the reader (the last read found data
    waiting: a fast turn), so the read takes what piled up meanwhile. ``eager`` (the last read
    had to wait: an agent that writes a few lines at a time) reads first instead: an empty
    pipe parks once, data found waiting is returned after one yield (every call is still a
    checkpoint). Same results and errors as ``receive_some``, which reads a stream that is not
    a file descriptor's (``waited`` then False)."""
    fileno = getattr(stream, "fileno", None)
    if fileno is None:
        return _Received(await stream.receive_some(max_bytes), False)
    if not eager:
        await trio.lowlevel.checkpoint()
    waited = False
    while True:
        fd = fileno()
        try:
            data = os.read(fd, max_bytes)
        except BlockingIOError:
            await trio.lowlevel.wait_readable(fd)
            waited = True
            continue
        except OSError as exc:
            if exc.errno == errno.EBADF:
                raise trio.ClosedResourceError("the agent's stdout was closed") from None
            raise trio.BrokenResourceError from exc
        if eager and not waited:
            await trio.lowlevel.checkpoint()
        return _Received(data, waited)


def _signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to a process group; False if no process of it is left."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _group_running(pgid: int) -> bool:
    """Whether a process of the group runs (zombies do not count: an orphaned helper that
    exited waits for whoever adopted it to reap it). Without /proc, any member counts."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return _signal_group(pgid, 0)
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                raw = stat.read()
        except OSError:
            continue
        fields = raw[raw.rindex(b")") + 2:].split()  # state, ppid, pgrp, ...
        if fields[0] != b"Z" and int(fields[2]) == pgid:
            return True
    return False


async def _end_group(pgid: int) -> None:
    """End what is left of an agent's process group once the agent itself is gone: helpers it
    started (Codex's wrapper starts its native binary, which stays behind when the wrapper is
    killed) get SIGTERM, then SIGKILL after the grace."""
    if not await trio.to_thread.run_sync(_group_running, pgid):
        return
    _signal_group(pgid, signal.SIGTERM)
    log.info("event=agent_helpers_left pid=%s action=sigterm", pgid)
    with trio.move_on_after(EXIT_GRACE_SECONDS):
        while await trio.to_thread.run_sync(_group_running, pgid):
            await trio.sleep(0.05)  # polling the group: the helpers are not our children
        return
    if _signal_group(pgid, signal.SIGKILL):
        log.warning("event=agent_helpers_kill pid=%s reason=no_exit_after_sigterm", pgid)


def _signal_name(returncode: int) -> str:
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"SIG{-returncode}"


class AgentChannel:
    """One agent process, its sessions multiplexed by ACP session id.

    Every request method raises ChannelClosed if the process is gone (or goes away while the
    request waits) and AgentRpcError if the agent answers with a JSON-RPC error. ``on_exit``
    is called once, from ``run``, when the agent's stdout ends (a crash, or after ``aclose``);
    not when ``run`` is cancelled.
    """

    def __init__(
        self,
        argv: Sequence[str],
        cwd: str,
        *,
        init_timeout: float = 30.0,
        write_timeout: float = 30.0,
        env: Mapping[str, str] | None = None,
        client_info: dict[str, Any] | None = None,
        on_exit: Callable[[int | None, str | None], None] | None = None,
    ) -> None:
        if not argv:
            raise ValueError("agent argv must not be empty")
        for name, value in (("init_timeout", init_timeout), ("write_timeout", write_timeout)):
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a positive number, got {value!r}")
        self.argv = list(argv)
        self.cwd = cwd
        self.init_timeout = init_timeout
        self.write_timeout = write_timeout
        self.env = dict(env) if env is not None else None
        self.client_info = (
            dict(client_info) if client_info is not None else dict(DEFAULT_CLIENT_INFO)
        )
        self.on_exit = on_exit

        self.agent_capabilities: dict[str, Any] = {}
        self.supports_load_session = False
        self.closed = False
        self.exit_code: int | None = None
        self.signal_name: str | None = None
        self.pid: int | None = None
        # Why the daemon declared the agent dead (it was killed), if it did.
        self.death_reason: str | None = None

        self._proc: trio.Process | None = None
        self._nursery: trio.Nursery | None = None
        self._client: AcpClient[SessionSink, _Slot] = AcpClient()
        # The smallest flow.group_lines of the attached sinks (None: to be computed), so
        # a read costs O(1) however many sessions are attached.
        self._group_lines: int | None = None
        self._outbox: deque[_Write] = deque()
        self._outbox_bytes = 0
        self._outbox_ready = trio.Event()
        self._reader_backlog = 0
        self._backlog_drained = trio.Event()
        self._writer_done = False
        self._refusals = LogThrottle(REFUSAL_LOG_INTERVAL_S)
        self._stdout_eof = trio.Event()
        self._finished = trio.Event()
        self._ran = False

    # ---------------------------------------------------------------------------------------
    # Lifetime

    async def run(
        self, *, task_status: trio.TaskStatus[AgentChannel] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Start the agent, initialize it, then serve it until its stdout ends.

        Raises AgentStartError before ``task_status.started`` if the agent cannot be brought up
        (the process is killed first). Returns after the agent's stdout closes, once every
        pending request has failed with ChannelClosed and ``on_exit`` has been called.
        Cancelling it terminates the process (stdin EOF, then SIGKILL after a grace).
        """
        if self._ran:
            raise RuntimeError("AgentChannel.run() can only be called once")
        self._ran = True
        try:
            proc = await trio.lowlevel.open_process(
                self.argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=self.cwd,
                env=self.env,
                # A process group of its own: helpers it starts end with it (_end_group).
                start_new_session=True,
            )
        except OSError as exc:
            self.closed = True
            self._finished.set()
            raise AgentStartError(f"cannot start agent {self.argv[0]!r}: {exc}") from exc
        self._proc = proc
        self.pid = proc.pid
        _widen_pipe(proc.stdout)
        log.info("event=agent_started pid=%s argv=%r cwd=%r", proc.pid, self.argv, self.cwd)
        start_failure: str | None = None
        ended_on_its_own = False
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._pump_stdin, proc)
                nursery.start_soon(self._pump_stderr, proc)
                nursery.start_soon(self._pump_stdout, proc)
                nursery.start_soon(self._watch_exit, proc)
                start_failure = await self._initialize()
                if start_failure is None:
                    task_status.started(self)
                    await self._stdout_eof.wait()
                    ended_on_its_own = True
                    await self._reap(proc, grace=EXIT_GRACE_SECONDS)
                # Also stops the stderr pump, whose pipe a grandchild may hold open.
                nursery.cancel_scope.cancel()
        finally:
            self._close(f"agent channel for pid {proc.pid} stopped")
            with trio.CancelScope(shield=True):
                await self._reap(proc, grace=0.0 if start_failure else EXIT_GRACE_SECONDS)
                await _end_group(proc.pid)
            self._record_exit(proc)
            self._finished.set()
        if start_failure is not None:
            log.warning(
                "event=agent_start_failed pid=%s exit_code=%s signal=%s reason=%r",
                proc.pid,
                self.exit_code,
                self.signal_name,
                start_failure,
            )
            raise AgentStartError(
                f"agent {self.argv[0]!r} failed to start: {start_failure}"
                f" (exit_code={self.exit_code}, signal={self.signal_name})"
            )
        if ended_on_its_own and self.on_exit is not None:
            self.on_exit(self.exit_code, self.signal_name)

    def kill_group(self) -> None:
        """SIGKILL whatever is left of the agent's process group, at once and without waiting:
        the last resort when the process is about to exit with :meth:`aclose` unfinished, so no
        helper of the agent outlives the daemon."""
        proc = self._proc
        if proc is not None and _signal_group(proc.pid, signal.SIGKILL):
            log.warning("event=agent_group_kill pid=%s reason=close_unfinished", proc.pid)

    async def aclose(self) -> None:
        """Close the agent's stdin; kill it if it has not exited after the grace period, then
        end the helpers it left (see :func:`_end_group`). Takes at most about
        :data:`CLOSE_BOUND_S`."""
        proc = self._proc
        if proc is None or self._finished.is_set():
            self.closed = True
            return
        self._close("agent channel closed by the daemon")
        if proc.stdin is not None:
            await proc.stdin.aclose()
        with trio.move_on_after(EXIT_GRACE_SECONDS):
            await self._finished.wait()
        if not self._finished.is_set():
            if proc.returncode is None:
                log.warning("event=agent_kill pid=%s reason=no_exit_after_stdin_eof", proc.pid)
                proc.kill()
            await self._finished.wait()

    async def _initialize(self) -> str | None:
        """Send initialize; None on success, else why the start failed."""
        try:
            with trio.fail_after(self.init_timeout):
                result = await self._request("initialize", initialize_params(self.client_info))
        except trio.TooSlowError:
            return f"no initialize reply within {self.init_timeout:g} s"
        except ChannelClosed:
            return "agent exited during initialize"
        except AgentRpcError as exc:
            return f"initialize failed: {exc}"
        initialized = check_initialize(result)
        if isinstance(initialized, str):
            return initialized
        self.agent_capabilities = initialized.capabilities
        self.supports_load_session = initialized.supports_load_session
        log.info(
            "event=agent_initialized pid=%s load_session=%s agent_info=%r",
            self.pid,
            self.supports_load_session,
            initialized.agent_info,
        )
        return None

    def _close(self, reason: str) -> None:
        """Stop accepting requests and fail the ones in flight."""
        self.closed = True
        for pending in self._client.drain():
            slot = pending.waiter
            if not slot.done.is_set():
                slot.error = ChannelClosed(f"{reason} while {pending.method} was pending")
                slot.done.set()

    async def _reap(self, proc: trio.Process, *, grace: float) -> None:
        if proc.returncode is None and grace > 0:
            # Closing wakes the writer task if it is stuck on a full pipe.
            if proc.stdin is not None:
                await proc.stdin.aclose()
            with trio.move_on_after(grace):
                await proc.wait()
        if proc.returncode is None:
            log.warning("event=agent_kill pid=%s", proc.pid)
            proc.kill()
            await proc.wait()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                await stream.aclose()

    def _record_exit(self, proc: trio.Process) -> None:
        code = proc.returncode
        if code is None or self.exit_code is not None or self.signal_name is not None:
            return  # still running, or already recorded
        if code < 0:
            self.exit_code, self.signal_name = None, _signal_name(code)
        else:
            self.exit_code, self.signal_name = code, None
        log.info(
            "event=agent_exited pid=%s exit_code=%s signal=%s",
            proc.pid,
            self.exit_code,
            self.signal_name,
        )

    # ---------------------------------------------------------------------------------------
    # Sessions

    def attach(self, acp_session_id: str, sink: SessionSink, *, hold: bool = False) -> None:
        """Route the session's updates and permission requests to ``sink``. Raises
        :class:`SessionIdInUse` if another sink holds that id: an agent that hands out one
        session id twice never gets two daemon sessions' traffic mixed.

        The updates the agent sent for the session since its ``session/new`` or
        ``session/load`` reply reach ``sink`` here, first; with ``hold=True`` (the session is
        not ready for them yet) they, and the ones that follow, are held until the next
        ``attach`` of the same sink."""
        self._client.attach(acp_session_id, sink)
        if self._group_lines is not None:  # one more sink can only lower the smallest
            self._group_lines = max(1, min(self._group_lines, sink.flow.group_lines))
        if not hold:
            self._release_held(acp_session_id, sink)

    def _release_held(self, acp_session_id: str, sink: SessionSink) -> None:
        """The session is ready: hand ``sink`` the updates the agent sent for it since its
        ``session/new`` or ``session/load`` reply (held meanwhile, in stdout order); later
        ones go to the attached sink as they are read."""
        held = self._client.take_held(acp_session_id)
        if held:
            log.info("event=agent_updates_held pid=%s acp_session_id=%s count=%d",
                     self.pid, acp_session_id, len(held))
            sink.publish(UpdateBatch.of(held))

    def is_attached(self, acp_session_id: str) -> bool:
        return self._client.is_attached(acp_session_id)

    def detach(self, acp_session_id: str, sink: SessionSink | None = None) -> None:
        """Stop routing ``acp_session_id`` (with ``sink``: only if it is the one attached)."""
        self._client.detach(acp_session_id, sink)
        # One sink fewer: the smallest changes only if it was that sink's.
        if sink is None or (self._group_lines is not None
                            and sink.flow.group_lines <= self._group_lines):
            self._group_lines = None

    def group_lines_changed(self) -> None:
        """A sink's ``flow.group_lines`` may have changed."""
        self._group_lines = None

    async def new_session(self, cwd: str) -> str:
        return session_id_of(await self._request("session/new", new_session_params(cwd)))

    async def load_session(self, acp_session_id: str, cwd: str) -> None:
        """Restore an agent session; the updates it replays meanwhile are consumed, not routed."""
        await self._request(
            "session/load", load_session_params(acp_session_id, cwd), loading=acp_session_id
        )

    async def prompt(self, acp_session_id: str, prompt: list[Any]) -> dict[str, Any]:
        return prompt_result(
            await self._request("session/prompt", prompt_params(acp_session_id, prompt))
        )

    async def cancel(self, acp_session_id: str) -> None:
        """Queue ``session/cancel`` (returns at once); the running prompt's reply carries the
        outcome."""
        self._send(cancel_line(acp_session_id))
        await trio.lowlevel.checkpoint()

    # ---------------------------------------------------------------------------------------
    # Requests and writes

    async def _request(
        self, method: str, params: dict[str, Any], *, loading: str | None = None
    ) -> Any:
        if self.closed:
            raise ChannelClosed(f"agent channel is closed; cannot send {method}")
        slot = _Slot()
        request_id, line = self._client.request(method, params, slot, loading=loading)
        write = None
        try:
            write = self._send(line)
            await slot.done.wait()
        finally:
            # Answered, failed or cancelled: a late reply will be logged as unknown.
            self._client.finished(request_id)
            if write is not None and not write.started:
                write.skip = True  # nobody waits for it any more: the agent never sees it
        if slot.error is not None:
            raise slot.error
        return slot.result

    def _send(self, line: bytes, *, by_reader: bool = False) -> _Write:
        """Queue one line for the writer task; never blocks. ChannelClosed if the channel is
        closed. ``by_reader``: a reply the stdout reader made (counted in its backlog)."""
        if self._proc is None or self.closed or self._writer_done:
            raise ChannelClosed("agent channel is closed")
        write = _Write(line, by_reader)
        self._outbox.append(write)
        self._outbox_bytes += len(line)
        if by_reader:
            self._reader_backlog += len(line)
        self._outbox_ready.set()
        return write

    def _reply(self, line: bytes, *, by_reader: bool = False) -> None:
        """Answer one of the agent's requests; the agent being gone is not our failure."""
        try:
            self._send(line, by_reader=by_reader)
        except ChannelClosed:
            log.info("event=agent_reply_dropped pid=%s reason=channel_closed", self.pid)

    async def _pump_stdin(self, proc: trio.Process) -> None:
        """The one writer of the agent's stdin: the queued lines, in order, each whole."""
        assert proc.stdin is not None
        stdin = proc.stdin
        try:
            while True:
                if not self._outbox:
                    self._outbox_ready = trio.Event()
                    await self._outbox_ready.wait()
                    continue
                write = self._outbox.popleft()
                if not write.skip:
                    write.started = True
                    try:
                        written = await self._write_line(stdin, write.line)
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        return  # the agent closed its stdin, or we did: EOF and reaping follow
                    if not written:
                        self._stdin_stalled(proc, write)
                        return
                self._outbox_bytes -= len(write.line)
                if write.by_reader:
                    self._reader_backlog -= len(write.line)
                    if self._reader_backlog <= READER_REPLY_BACKLOG_BYTES:
                        self._backlog_drained.set()
        finally:
            self._writer_done = True
            self._backlog_drained.set()  # a reader waiting on the backlog goes back to reading

    async def _write_line(self, stdin: trio.abc.SendStream, line: bytes) -> bool:
        """Write ``line`` piece by piece; False if a piece was not taken within the timeout."""
        data = memoryview(line)
        for start in range(0, len(data), WRITE_PIECE_BYTES):
            with trio.move_on_after(self.write_timeout):
                await stdin.send_all(data[start:start + WRITE_PIECE_BYTES])
                continue
            return False
        return True

    def _stdin_stalled(self, proc: trio.Process, write: _Write) -> None:
        """The agent stopped reading its stdin: declare it dead. Killing it ends its stdout,
        and the ordinary end of the channel follows (pending requests fail, ``on_exit``)."""
        self.death_reason = (f"stdin accepted nothing for {self.write_timeout:g} s "
                             f"(agent declared dead)")
        self.closed = True  # no new request; the workspace's next session gets a new agent
        log.warning(
            "event=agent_stdin_stalled pid=%s timeout_ms=%d line_bytes=%d queued_lines=%d "
            "queued_bytes=%d action=kill",
            proc.pid, round(self.write_timeout * 1000), len(write.line), len(self._outbox),
            self._outbox_bytes - len(write.line),
        )
        if proc.returncode is None:
            proc.kill()

    # ---------------------------------------------------------------------------------------
    # Reading

    async def _pump_stdout(self, proc: trio.Process) -> None:
        assert proc.stdout is not None
        stream = proc.stdout
        splitter = LineSplitter()
        waited = False
        try:
            while True:
                try:
                    data, waited = await _receive(stream, READ_CHUNK_BYTES, eager=waited)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    break
                if not data:
                    break
                read = splitter.read(bytes(data))
                if read.discarded:
                    log.warning(
                        "event=agent_line_discarded pid=%s reason=line_over_%d_bytes count=%d",
                        proc.pid, splitter.max_line_bytes, read.discarded)
                # Dispatch in small groups and yield between them, so subscribers are woken
                # and write while a large read is still being published: a burst never
                # builds up more lag than one group. A session whose subscribers fell behind
                # holds the next group back for a moment (its flow control). The group is as
                # large as the attached sessions allow: each group costs a flush, a wake-up
                # and a write per subscriber, whatever its size.
                step = self._dispatch_group_lines()
                lines = read.lines
                for start in range(0, len(lines), step):
                    if start:
                        await trio.lowlevel.checkpoint()
                    last = start + step >= len(lines)
                    group = read if len(lines) <= step else Read(
                        lines[start:start + step], read.spaced)
                    # A read the agent made us wait for (paced output: a few lines of a few
                    # sessions) has its subscribers written by this task before it yields
                    # (see daemon.delivery). A read that found more waiting, or a group before
                    # the last, lets the loop gather them with what comes next.
                    delivery = Delivery.running() if last and waited else None
                    if delivery is not None:
                        delivery.hold()
                    try:
                        sinks = self._dispatch(group)
                    finally:
                        if delivery is not None:
                            delivery.deliver_held()
                    for sink in sinks:
                        await sink.flow.wait_for_subscribers()
                    await self._wait_reply_backlog()
            # Stdout ended: the agent is usually exiting. Learn how before failing the pending
            # requests, so the session can say which signal or exit code ended it.
            self.closed = True
            with trio.move_on_after(EXIT_GRACE_SECONDS):
                await proc.wait()
        finally:
            self._end_of_stdout(f"agent pid {proc.pid} closed its stdout")

    async def _wait_reply_backlog(self) -> None:
        """Hold the reader while the replies it made itself wait in the write queue past
        their bound (the writer's stall timeout bounds the wait)."""
        while self._reader_backlog > READER_REPLY_BACKLOG_BYTES and not self._writer_done:
            self._backlog_drained = trio.Event()
            await self._backlog_drained.wait()

    def _dispatch_group_lines(self) -> int:
        """The smallest group any attached sink allows (the default without sinks); computed
        over the sinks only after a change that may raise it."""
        if self._group_lines is None:
            sinks = self._client.attached()
            if not sinks:
                return DISPATCH_GROUP_LINES
            self._group_lines = max(1, min(sink.flow.group_lines for sink in sinks))
        return self._group_lines

    def _end_of_stdout(self, reason: str) -> None:
        if not self._stdout_eof.is_set():
            if self._proc is not None:
                self._record_exit(self._proc)
            self._close(reason if self.death_reason is None
                        else f"agent pid {self.pid}: {self.death_reason}")
            self._stdout_eof.set()

    async def _watch_exit(self, proc: trio.Process) -> None:
        """Treat the process's exit as the end of its stdout if EOF does not follow shortly.

        A grandchild that inherited the stdout pipe would otherwise keep the channel open.
        """
        await proc.wait()
        # Once the daemon has closed the channel nothing more is read from the agent: the
        # helpers holding its pipes are ended now (_end_group), not after a grace.
        with trio.move_on_after(0 if self.closed else EXIT_GRACE_SECONDS):
            await self._stdout_eof.wait()
            return
        log.warning("event=agent_stdout_held_open pid=%s", proc.pid)
        self._end_of_stdout(f"agent pid {proc.pid} exited")

    def _dispatch(self, read: Read) -> list[SessionSink]:
        """Handle one read (or one group of it) without yielding: each session's updates are
        published (its subscribers woken) in the order the sessions appear, then the rest is
        carried out; returns the sinks that got updates."""
        batch = self._client.receive(read)
        updates = batch.updates
        for session_id, (sink, published) in updates.items():
            try:
                sink.publish(published)
            except Exception:
                log.exception("event=sink_update_failed pid=%s acp_session_id=%s",
                              self.pid, session_id)
        # After the updates: a permission request is published behind the updates read with
        # it, and a reply wakes its waiter (which runs later) with all of them published.
        for event in batch.events:
            self._on_event(event)
        return [sink for sink, _ in updates.values()]

    def _on_event(self, event: object) -> None:
        """Carry out what the codec read besides updates: wake a waiter, start a task, log."""
        if isinstance(event, Replied):
            slot: _Slot = event.waiter
            if event.error is not None:
                slot.error = event.error
            else:
                slot.result = event.result
            slot.done.set()
        elif isinstance(event, PermissionAsked):
            try:
                decision = event.sink.permission_asked(event.params)
            except Exception as exc:
                self._permission_failed(event, exc)
                self._client.permission_answered(event.session_id)
                return
            assert self._nursery is not None
            self._nursery.start_soon(self._answer_permission, event, decision)
        elif isinstance(event, PermissionRefused):
            count = self._refusals.note(trio.current_time())
            if count is not None:
                log.warning("event=agent_permission_refused pid=%s acp_session_id=%s "
                            "reason=too_many_pending count=%d", self.pid, event.session_id, count)
            self._reply(event.reply, by_reader=True)
        elif isinstance(event, UnroutedPermission):
            log.warning("event=agent_permission_unrouted pid=%s acp_session_id=%r",
                        self.pid, event.session_id)
            self._reply(event.reply, by_reader=True)
        elif isinstance(event, UnsupportedRequest):
            log.info(
                "event=agent_request_unsupported pid=%s method=%r id=%r",
                self.pid,
                event.method,
                event.id,
            )
            self._reply(event.reply, by_reader=True)
        elif isinstance(event, HeldUpdatesDropped):
            log.warning("event=agent_held_updates_dropped pid=%s acp_session_id=%s reason=%s",
                        self.pid, event.session_id, event.reason)
        elif isinstance(event, UnroutedUpdate):
            log.info(
                "event=agent_update_unrouted pid=%s acp_session_id=%s", self.pid, event.session_id
            )
        elif isinstance(event, ReplyUnknown):
            log.warning("event=agent_reply_unknown_id pid=%s id=%r", self.pid, event.id)
        elif isinstance(event, BadUpdate):
            log.warning("event=agent_bad_update pid=%s excerpt=%r", self.pid, event.excerpt)
        elif isinstance(event, NotificationIgnored):
            log.info("event=agent_notification_ignored pid=%s method=%r", self.pid, event.method)
        elif isinstance(event, MalformedLine):
            log.warning(
                "event=agent_malformed_line pid=%s reason=%r excerpt=%r",
                self.pid,
                event.reason,
                event.excerpt,
            )

    async def _answer_permission(self, asked: PermissionAsked[SessionSink],
                                 decision: Awaitable[PermissionAnswer]) -> None:
        try:
            try:
                result = await decision
            except Exception as exc:
                self._permission_failed(asked, exc)
                return
            self._reply(permission_granted(asked.request, result))
        finally:
            self._client.permission_answered(asked.session_id)

    def _permission_failed(self, asked: PermissionAsked[SessionSink], exc: Exception) -> None:
        log.error("event=permission_handler_failed pid=%s acp_session_id=%s",
                  self.pid, asked.session_id, exc_info=exc)
        self._reply(permission_failed(asked.request, exc))

    async def _pump_stderr(self, proc: trio.Process) -> None:
        """Log the agent's stderr line by line within a :class:`LineBudget`; what is over it
        is read and dropped (the agent never blocks on a full pipe) and reported in one line:
        once the flood pauses for :data:`STDERR_QUIET_S`, at most every
        :data:`STDERR_REPORT_S` while it lasts, and when the stream ends."""
        assert proc.stderr is not None
        splitter = LineSplitter(_STDERR_LINE_BYTES)
        budget = LineBudget(lines_per_s=STDERR_LINES_PER_S, line_burst=STDERR_LINE_BURST,
                            bytes_per_s=STDERR_BYTES_PER_S, byte_burst=STDERR_BYTE_BURST)
        reported = last_read = trio.current_time()
        cut = 0
        try:
            while True:
                report_at = math.inf
                if budget.dropped_lines or splitter.discarded_lines != cut:
                    report_at = min(reported + STDERR_REPORT_S, last_read + STDERR_QUIET_S)
                with trio.move_on_at(report_at):
                    try:
                        data = await proc.stderr.receive_some(READ_CHUNK_BYTES)
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        return
                    if not data:
                        return
                    last_read = trio.current_time()
                    for line in splitter.feed(bytes(data)):
                        if budget.allow(last_read, len(line)):
                            log.info(
                                "event=agent_stderr pid=%s line=%r",
                                proc.pid,
                                line.decode("utf-8", errors="replace"),
                            )
                    if last_read < reported + STDERR_REPORT_S:
                        continue
                reported = trio.current_time()
                cut = self._report_stderr_dropped(proc, budget, splitter, cut)
        finally:
            self._report_stderr_dropped(proc, budget, splitter, cut)

    @staticmethod
    def _report_stderr_dropped(proc: trio.Process, budget: LineBudget, splitter: LineSplitter,
                               cut: int) -> int:
        lines, size = budget.take_dropped()
        too_long = splitter.discarded_lines - cut
        if lines or too_long:
            log.warning("event=agent_stderr_dropped pid=%s lines=%d bytes=%d "
                        "lines_over_%d_bytes=%d", proc.pid, lines, size, _STDERR_LINE_BYTES,
                        too_long)
        return splitter.discarded_lines
