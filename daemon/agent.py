"""The agent channel: a Trio shell around one ACP agent subprocess, spoken to over stdio.

One channel per workspace. It owns the process and three kinds of work inside ``run``'s
nursery: the stdout reader (which dispatches every read synchronously, so updates reach the
sinks in stdout order and replies resolve after the updates that preceded them), the stderr
logger, and short tasks answering the agent's own requests. The framing is the pure
:mod:`daemon.core.acp_codec`; what the lines mean (initialize checks, routing, load replays,
request matching, answers to the agent's requests) is the pure :mod:`daemon.core.acp_client`.
This module only moves bytes, owns the process, the timers and the tasks, and logs.
"""

from __future__ import annotations

import logging
import math
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Protocol

import trio

from daemon.core.acp_client import (
    DEFAULT_CLIENT_INFO,
    PROTOCOL_VERSION,
    AcpClient,
    AgentProtocolError,
    AgentRpcError,
    BadUpdate,
    MalformedLine,
    NotificationIgnored,
    PermissionAsked,
    Replied,
    ReplyUnknown,
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
from daemon.core.acp_codec import LineSplitter, Request
from daemon.core.splice import ChunkRun
from sdk.protocol.acp import PermissionParamsView, view

__all__ = [
    "PROTOCOL_VERSION",
    "AgentChannel",
    "AgentProtocolError",
    "AgentRpcError",
    "AgentStartError",
    "ChannelClosed",
    "SessionSink",
]

log = logging.getLogger("daemon.agent")

READ_CHUNK_BYTES: Final = 256 * 1024
# Lines dispatched between two yields when no sink says otherwise (see
# SessionSink.dispatch_group_lines).
DISPATCH_GROUP_LINES: Final = 64
PIPE_BYTES: Final = 1024 * 1024
# How long a closing agent gets between stdin EOF and SIGKILL.
EXIT_GRACE_SECONDS: Final = 1.0
# Agent stderr is for humans; a runaway line is cut rather than buffered.
_STDERR_LINE_BYTES: Final = 64 * 1024


class AgentStartError(Exception):
    """The agent could not be started: spawn failure, or initialize timed out / exited / failed."""

    code: Final = "agent_start_failed"


class ChannelClosed(Exception):
    """The agent process went away (or the channel was closed) while a request needed it."""


class SessionSink(Protocol):
    """Where one ACP session's traffic goes (the daemon session implements it)."""

    def on_updates(self, updates: list[bytes], chunks: ChunkRun | None) -> None:
        """``session/update`` ``update`` objects of one read batch, in stdout order, from the
        reader task: the agent's own JSON bytes of each object, without insignificant
        whitespace (its strings and numbers spelled as the agent spelled them, never
        re-encoded). ``chunks``, when not ``None``, is what ``splice.plain_chunk_run`` of
        ``updates`` would return (they are all plain text chunks of that kind), already read."""

    def flush(self) -> None:
        """End of one stdout read batch in which this sink received updates."""

    async def wait_subscribers(self) -> None:
        """After a flush: return once the session's subscribers can take more (flow
        control; the sink bounds how long that may take)."""

    def dispatch_group_lines(self) -> int:
        """How many stdout lines the reader may dispatch before it yields, so that the
        session's subscribers write (and flow control checks them) at least that often."""
        ...

    async def on_permission_request(self, params: dict[str, Any]) -> dict[str, Any]:
        """Decide a ``session/request_permission``; returns the JSON-RPC result. Own task."""
        ...


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
        env: Mapping[str, str] | None = None,
        client_info: dict[str, Any] | None = None,
        on_exit: Callable[[int | None, str | None], None] | None = None,
    ) -> None:
        if not argv:
            raise ValueError("agent argv must not be empty")
        if not (init_timeout > 0 and math.isfinite(init_timeout)):
            raise ValueError(f"init_timeout must be a positive number, got {init_timeout!r}")
        self.argv = list(argv)
        self.cwd = cwd
        self.init_timeout = init_timeout
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

        self._proc: trio.Process | None = None
        self._nursery: trio.Nursery | None = None
        self._client: AcpClient[SessionSink, _Slot] = AcpClient()
        self._write_lock = trio.Lock()
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

    async def aclose(self) -> None:
        """Close the agent's stdin; kill it if it has not exited after the grace period."""
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
            # Not under the write lock: closing wakes a writer stuck on a full pipe.
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

    def attach(self, acp_session_id: str, sink: SessionSink) -> None:
        """Route the session's updates and permission requests to ``sink`` (replacing any)."""
        self._client.attach(acp_session_id, sink)

    def detach(self, acp_session_id: str) -> None:
        self._client.detach(acp_session_id)

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
        """Send ``session/cancel``; the running prompt's reply carries the outcome."""
        await self._send(cancel_line(acp_session_id))

    # ---------------------------------------------------------------------------------------
    # Requests and writes

    async def _request(
        self, method: str, params: dict[str, Any], *, loading: str | None = None
    ) -> Any:
        if self.closed:
            raise ChannelClosed(f"agent channel is closed; cannot send {method}")
        slot = _Slot()
        request_id, line = self._client.request(method, params, slot, loading=loading)
        try:
            await self._send(line)
            await slot.done.wait()
        finally:
            # Answered, failed or cancelled: a late reply will be logged as unknown.
            self._client.finished(request_id)
        if slot.error is not None:
            raise slot.error
        return slot.result

    async def _send(self, line: bytes) -> None:
        proc = self._proc
        if proc is None or proc.stdin is None or self.closed:
            raise ChannelClosed("agent channel is closed")
        async with self._write_lock:
            try:
                await proc.stdin.send_all(line)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                raise ChannelClosed(f"agent pid {proc.pid} stdin is closed") from exc

    async def _reply(self, line: bytes) -> None:
        """Answer one of the agent's requests; the agent being gone is not our failure."""
        try:
            await self._send(line)
        except ChannelClosed:
            log.info("event=agent_reply_dropped pid=%s reason=channel_closed", self.pid)

    # ---------------------------------------------------------------------------------------
    # Reading

    async def _pump_stdout(self, proc: trio.Process) -> None:
        assert proc.stdout is not None
        stream = proc.stdout
        splitter = LineSplitter()
        discarded = 0
        carried_spaced = False
        try:
            while True:
                try:
                    data = await stream.receive_some(READ_CHUNK_BYTES)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    break
                if not data:
                    break
                chunk = bytes(data)
                lines = splitter.feed(chunk)
                # Update bytes are handed on compact. Agents that write compact JSON (most)
                # put whitespace only inside strings, and a read without any spares each of
                # its lines the check; the first line may have started in the previous read.
                spaced = b" " in chunk or b"\t" in chunk or b"\r" in chunk
                may_be_spaced, carried_spaced = spaced or carried_spaced, spaced
                if splitter.discarded_lines != discarded:
                    log.warning(
                        "event=agent_line_discarded pid=%s reason=line_over_%d_bytes count=%d",
                        proc.pid,
                        splitter.max_line_bytes,
                        splitter.discarded_lines - discarded,
                    )
                    discarded = splitter.discarded_lines
                # Dispatch in small groups and yield between them, so subscribers are woken
                # and write while a large read is still being published: a burst never
                # builds up more lag than one group. A session whose subscribers fell behind
                # holds the next group back for a moment (its flow control). The group is as
                # large as the attached sessions allow: each group costs a flush, a wake-up
                # and a write per subscriber, whatever its size.
                step = self._dispatch_group_lines()
                for start in range(0, len(lines), step):
                    if start:
                        await trio.lowlevel.checkpoint()
                    group = lines[start:start + step]
                    for sink in self._dispatch(group, spaced=may_be_spaced):
                        await sink.wait_subscribers()
            # Stdout ended: the agent is usually exiting. Learn how before failing the pending
            # requests, so the session can say which signal or exit code ended it.
            self.closed = True
            with trio.move_on_after(EXIT_GRACE_SECONDS):
                await proc.wait()
        finally:
            self._end_of_stdout(f"agent pid {proc.pid} closed its stdout")

    def _dispatch_group_lines(self) -> int:
        """The smallest group any attached sink allows (the default without sinks)."""
        sinks = self._client.attached()
        if not sinks:
            return DISPATCH_GROUP_LINES
        return max(1, min(sink.dispatch_group_lines() for sink in sinks))

    def _end_of_stdout(self, reason: str) -> None:
        if not self._stdout_eof.is_set():
            if self._proc is not None:
                self._record_exit(self._proc)
            self._close(reason)
            self._stdout_eof.set()

    async def _watch_exit(self, proc: trio.Process) -> None:
        """Treat the process's exit as the end of its stdout if EOF does not follow shortly.

        A grandchild that inherited the stdout pipe would otherwise keep the channel open.
        """
        await proc.wait()
        with trio.move_on_after(EXIT_GRACE_SECONDS):
            await self._stdout_eof.wait()
            return
        log.warning("event=agent_stdout_held_open pid=%s", proc.pid)
        self._end_of_stdout(f"agent pid {proc.pid} exited")

    def _dispatch(self, lines: list[bytes], *, spaced: bool = True) -> list[SessionSink]:
        """Handle one read batch without yielding, then flush each sink that got updates;
        returns those sinks. ``spaced=False`` promises that no line holds a space, tab or CR
        (so no update needs making compact)."""
        batch = self._client.receive(lines, spaced=spaced)
        for event in batch.events:
            self._on_event(event)
        updates = batch.updates
        chunks = batch.chunks
        for session_id, (sink, raws) in updates.items():
            try:
                sink.on_updates(raws, chunks.get(session_id))
            except Exception:
                log.exception("event=sink_update_failed pid=%s acp_session_id=%s",
                              self.pid, session_id)
        for session_id, (sink, _) in updates.items():
            try:
                sink.flush()
            except Exception:
                log.exception(
                    "event=sink_flush_failed pid=%s acp_session_id=%s", self.pid, session_id
                )
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
            assert self._nursery is not None
            self._nursery.start_soon(self._answer_permission, event.request)
        elif isinstance(event, UnsupportedRequest):
            log.info(
                "event=agent_request_unsupported pid=%s method=%r id=%r",
                self.pid,
                event.method,
                event.id,
            )
            assert self._nursery is not None
            self._nursery.start_soon(self._reply, event.reply)
        elif isinstance(event, UnroutedUpdate):
            log.debug(
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

    async def _answer_permission(self, request: Request) -> None:
        target = self._client.permission_target(request)
        if isinstance(target, UnroutedPermission):
            log.warning(
                "event=agent_permission_unrouted pid=%s acp_session_id=%r",
                self.pid,
                target.session_id,
            )
            await self._reply(target.reply)
            return
        sink, params = target
        try:
            result = await sink.on_permission_request(params)
        except Exception as exc:
            found = view(params, PermissionParamsView)
            log.exception(
                "event=permission_handler_failed pid=%s acp_session_id=%s",
                self.pid,
                None if found is None else found.session_id,
            )
            await self._reply(permission_failed(request, exc))
            return
        await self._reply(permission_granted(request, result))

    async def _pump_stderr(self, proc: trio.Process) -> None:
        assert proc.stderr is not None
        splitter = LineSplitter(_STDERR_LINE_BYTES)
        while True:
            try:
                data = await proc.stderr.receive_some(READ_CHUNK_BYTES)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
            if not data:
                return
            for line in splitter.feed(bytes(data)):
                log.info(
                    "event=agent_stderr pid=%s line=%r",
                    proc.pid,
                    line.decode("utf-8", errors="replace"),
                )
