"""A fork server for the tests' daemons: the daemon's imports paid once per xdist worker.

``python -m daemon`` spends most of a test daemon's start-up CPU importing trio, Quart, Hypercorn
and the daemon's own modules; the suite starts a few hundred daemons. A zygote is a process that
imports exactly what ``daemon/__main__.py`` imports (plus the cluster modules, for the zygote that
starts cluster nodes), starts no thread and no trio run, and then forks once per daemon: the child
takes the request's argv, environment, working directory, session and stdio, and runs the
``daemon`` package as ``__main__`` the way ``python -m daemon`` does (runpy). What it runs is the
real entry point in a real process of its own (SIGKILL, SIGSTOP, restarts and process groups
behave as for an exec'd one); only the interpreter start and the imports are inherited.

:class:`ForkedPopen` is a :class:`subprocess.Popen` whose child comes from the zygote, so the
harness and the launcher keep their ``poll``/``wait``/``send_signal``/``stdout`` code. The zygote
is the child's parent: it reports each exit (``waitid`` with ``WNOWAIT``, the child stays a
zombie, so its pid cannot be reused while the worker may still signal it) and reaps it when the
worker has read the status.

Not forked (a real exec instead): a start whose environment differs from the zygote's in what the
interpreter or libc read at start-up (``PYTHON*``, ``LD_*``, ``MALLOC_*``, locale), tests marked
``pytest.mark.exec_daemon`` (start-path and memory tests), and every start when
``TK_TEST_EXEC_DAEMONS=1``.

Run as ``python -m tests.harness_zygote FD MODULE...`` by :class:`Zygote` (FD: its control socket).
"""

from __future__ import annotations

import array
import atexit
import importlib
import json
import os
import runpy
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
# Read by the interpreter or libc before any Python code runs: a child forked from a zygote
# started with other values would not be what an exec with these values gives.
_STARTUP_ENV_PREFIXES = ("PYTHON", "LD_", "MALLOC_", "GLIBC_TUNABLES", "LC_", "LANG")
_MAX_FDS = 3
_READY_TIMEOUT_S = 60.0
_SPAWN_TIMEOUT_S = 30.0
# What ``python -m daemon`` imports before it runs; the cluster zygote adds what cluster mode
# imports when it starts (coredis and its beartype).
PRELOAD = ("daemon.__main__",)
PRELOAD_CLUSTER = ("daemon.__main__", "daemon.cluster")


def _startup_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(_STARTUP_ENV_PREFIXES)}


# --- the zygote process ------------------------------------------------------------------------


def _send(sock: socket.socket, message: dict[str, Any], fds: Sequence[int] = ()) -> None:
    ancillary = ([(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())]
                 if fds else [])
    sock.sendmsg([json.dumps(message).encode()], ancillary)


def _receive(sock: socket.socket) -> tuple[dict[str, Any] | None, list[int]]:
    fds = array.array("i")
    data, ancdata, _flags, _addr = sock.recvmsg(1 << 20, socket.CMSG_SPACE(_MAX_FDS * fds.itemsize))
    for level, kind, blob in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(blob[: len(blob) - len(blob) % fds.itemsize])
    return (json.loads(data) if data else None), list(fds)


def _exit_code(status: Any) -> int:
    """A ``waitid`` result as a ``Popen.returncode``: the exit status, or minus the signal."""
    if status.si_code == os.CLD_EXITED:
        return int(status.si_status)
    return -int(status.si_status)


def _run_daemon_child(request: dict[str, Any], stdio: list[int | None]) -> None:
    """In the forked child: become ``python -m daemon *argv`` and never return."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        if request["new_session"]:
            os.setsid()
        for target, fd in enumerate(stdio):
            if fd is not None:
                os.dup2(fd, target)
        os.closerange(3, 1 << 16)  # what an exec with close_fds leaves: the three stdio fds
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        tempfile.tempdir = None  # recomputed from the new TMPDIR when first asked
        # `python -m` puts the working directory first on the path and the module's file in
        # argv[0] (runpy sets it); the zygote's own module is not the daemon's business.
        sys.path[0] = os.getcwd()
        sys.argv = ["-m", *request["argv"]]
        sys.orig_argv = [sys.executable, "-m", "daemon", *request["argv"]]
        for name in [m for m in sys.modules if m == "tests" or m.startswith("tests.")]:
            del sys.modules[name]
        runpy._run_module_as_main("daemon")  # type: ignore[attr-defined]
        code = 0
    except SystemExit as exc:
        if exc.code is None:
            code = 0
        elif isinstance(exc.code, int):
            code = exc.code
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:  # what the interpreter does with an uncaught exception
        traceback.print_exc()
        code = 1
    finally:
        # The interpreter's own exit: join the non-daemon threads, run atexit, flush.
        try:
            threading._shutdown()  # type: ignore[attr-defined]
            atexit._run_exitfuncs()
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
        finally:
            os._exit(code)


def serve(control_fd: int, preload: Sequence[str]) -> None:
    for name in preload:
        importlib.import_module(name)
    # `python -m daemon` runs daemon/__main__.py as __main__, never as daemon.__main__.
    sys.modules.pop("daemon.__main__", None)
    if threading.active_count() != 1:
        raise SystemExit(f"zygote: importing {preload} started a thread; cannot fork safely")
    control = socket.socket(fileno=control_fd)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # only to wake the selector
    children: dict[int, bool] = {}  # pid -> its exit was reported
    outbox: list[dict[str, Any]] = []
    selector = selectors.DefaultSelector()
    selector.register(control, selectors.EVENT_READ)
    selector.register(wake_r, selectors.EVENT_READ)
    outbox.append({"op": "ready", "pid": os.getpid(), "env": _startup_env(os.environ)})
    while True:
        for pid, reported in list(children.items()):
            if reported:
                continue
            status = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            if status is not None:
                children[pid] = True
                outbox.append({"op": "exited", "pid": pid, "code": _exit_code(status)})
        control.setblocking(False)
        try:
            while outbox:
                _send(control, outbox[0])
                outbox.pop(0)
        except BlockingIOError:
            pass
        except (BrokenPipeError, ConnectionResetError):
            return
        control.setblocking(True)
        selector.modify(control, selectors.EVENT_READ | (selectors.EVENT_WRITE if outbox else 0))
        for key, events in selector.select():
            if key.fileobj == wake_r:
                os.read(wake_r, 4096)
                continue
            if not events & selectors.EVENT_READ:
                continue
            try:
                request, fds = _receive(control)
            except ConnectionResetError:
                return
            if request is None:
                return  # the worker is gone: its daemons live on until it (or init) stops them
            if request["op"] == "reap":
                os.waitpid(request["pid"], 0)
                children.pop(request["pid"], None)
                continue
            stdio: list[int | None] = []
            given = iter(fds)
            for present in request["stdio"]:
                stdio.append(next(given) if present else None)
            pid = os.fork()
            if pid == 0:
                control.close()
                selector.close()
                os.close(wake_r)
                os.close(wake_w)
                _run_daemon_child(request, stdio)
            for fd in fds:
                os.close(fd)
            children[pid] = False
            outbox.append({"op": "spawned", "id": request["id"], "pid": pid})


# --- the worker's side -------------------------------------------------------------------------


class ZygoteGone(RuntimeError):
    """The zygote exited (or was killed): the worker starts another."""


class Zygote:
    """One zygote process and its control socket, used from any thread of the worker."""

    def __init__(self, preload: Sequence[str]) -> None:
        self.preload = tuple(preload)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = dict(os.environ)
        env.pop("QWEN_SERVER_TOKEN", None)
        env["PYTHONUNBUFFERED"] = "1"  # what the launcher gives every daemon
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.harness_zygote", str(theirs.fileno()), *self.preload],
            pass_fds=(theirs.fileno(),), env=env, cwd=str(REPO), stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL)
        theirs.close()
        self.sock = ours
        self.lock = threading.Lock()
        self.exits: dict[int, int] = {}
        self.spawned: dict[int, int] = {}
        self.next_id = 0
        self.ready: dict[str, Any] | None = None
        deadline = time.monotonic() + _READY_TIMEOUT_S
        with self.lock:
            while self.ready is None:
                if not self._pump(deadline) and time.monotonic() > deadline:
                    self.proc.kill()
                    raise ZygoteGone(f"the zygote was not ready within {_READY_TIMEOUT_S:.0f} s")

    def fits(self, env: Mapping[str, str]) -> bool:
        """Whether a child forked here starts as an exec with ``env`` would."""
        assert self.ready is not None
        return _startup_env(env) == self.ready["env"]

    def _pump(self, deadline: float | None) -> bool:
        """Handle one message (lock held); False when none came before ``deadline``."""
        if self.proc.poll() is not None:
            raise ZygoteGone(f"zygote exited with {self.proc.returncode}")
        # A bounded slice, so that a zygote that dies is noticed and other threads get the lock;
        # past the deadline only what already arrived.
        timeout = 0.05 if deadline is None else max(0.0, min(deadline - time.monotonic(), 0.05))
        self.sock.settimeout(timeout)
        try:
            message, _fds = _receive(self.sock)
        except (TimeoutError, BlockingIOError):
            return False
        except OSError as exc:
            raise ZygoteGone(f"zygote control socket: {exc}") from exc
        if message is None:
            raise ZygoteGone("zygote closed its control socket")
        if message["op"] == "ready":
            self.ready = message
        elif message["op"] == "spawned":
            self.spawned[message["id"]] = message["pid"]
        elif message["op"] == "exited":
            self.exits[message["pid"]] = message["code"]
            _send(self.sock, {"op": "reap", "pid": message["pid"]})
        return True

    def spawn(self, argv: Sequence[str], env: Mapping[str, str], cwd: str, new_session: bool,
              stdio: Sequence[int]) -> int:
        with self.lock:
            self.next_id += 1
            ident = self.next_id
            _send(self.sock, {"op": "spawn", "id": ident, "argv": list(argv), "env": dict(env),
                              "cwd": cwd, "new_session": new_session,
                              "stdio": [fd != -1 for fd in stdio]},
                  [fd for fd in stdio if fd != -1])
            deadline = time.monotonic() + _SPAWN_TIMEOUT_S
            while ident not in self.spawned:
                if not self._pump(deadline) and time.monotonic() > deadline:
                    raise RuntimeError("the zygote did not fork within "
                                       f"{_SPAWN_TIMEOUT_S:.0f} s")
            return self.spawned.pop(ident)

    def exit_code(self, pid: int, timeout: float | None) -> int | None:
        """The child's exit code once it exited (within ``timeout``; 0: just look)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self.lock:
                if pid in self.exits:
                    return self.exits.pop(pid)
                came = self._pump(deadline)
            if not came and deadline is not None and time.monotonic() >= deadline:
                with self.lock:  # a last look at what arrived meanwhile
                    return self.exits.pop(pid, None)

    def close(self) -> None:
        self.sock.close()  # the zygote exits on EOF; its children are not touched
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


_REST = list(__import__("inspect").signature(subprocess.Popen._execute_child).parameters)[17:]


class ForkedPopen(subprocess.Popen[bytes]):
    """A ``Popen`` for ``python -m daemon ...`` whose child the zygote forks."""

    def __init__(self, zygote: Zygote, args: Sequence[str], **kwargs: Any) -> None:
        self._zygote = zygote
        super().__init__(args, **kwargs)

    def _execute_child(self, args: Any, executable: Any, preexec_fn: Any, close_fds: Any,
                       pass_fds: Any, cwd: Any, env: Any, startupinfo: Any, creationflags: Any,
                       shell: Any, p2cread: int, p2cwrite: int, c2pread: int, c2pwrite: int,
                       errread: int, errwrite: int, *rest: Any) -> None:
        options = dict(zip(_REST, rest, strict=True))
        try:
            assert list(args[:3]) == [sys.executable, "-m", "daemon"], args
            self.pid = self._zygote.spawn(
                list(args[3:]), dict(env), os.fspath(cwd or os.getcwd()),
                bool(options.get("start_new_session")), [p2cread, c2pwrite, errwrite])
            self._child_created = True
        finally:
            self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)

    def _internal_poll(self, _deadstate: int | None = None, **_: Any) -> int | None:
        if self.returncode is None:
            try:
                code = self._zygote.exit_code(self.pid, 0)
            except Exception:  # the zygote is gone: called from __del__ too, so never raise
                code = _deadstate
            if code is not None:
                self.returncode = code
        return self.returncode

    def _wait(self, timeout: float | None) -> int:
        if self.returncode is None:
            code = self._zygote.exit_code(self.pid, timeout)
            if code is None:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            self.returncode = code
        return self.returncode


# What the launcher passes; anything else (preexec_fn, pass_fds, ...) gets a real exec.
_FORKABLE_OPTIONS = {"stdin", "stdout", "stderr", "env", "cwd", "start_new_session"}
_zygotes: dict[tuple[str, ...], Zygote] = {}
_zygotes_lock = threading.Lock()


def _zygote_for(preload: tuple[str, ...]) -> Zygote:
    with _zygotes_lock:
        zygote = _zygotes.get(preload)
        if zygote is None or zygote.proc.poll() is not None:
            zygote = _zygotes[preload] = Zygote(preload)
        return zygote


def daemon_popen(args: Sequence[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    """``subprocess.Popen`` for ``python -m daemon ...``, forked from this worker's zygote when
    that starts the same process an exec would (else exec'd)."""
    env = kwargs.get("env") or os.environ
    if set(kwargs) - _FORKABLE_OPTIONS:
        return subprocess.Popen(args, **kwargs)
    preload = PRELOAD_CLUSTER if "--cluster-redis" in args else PRELOAD
    if os.environ.get("TK_TEST_EXEC_DAEMONS") == "1":
        return subprocess.Popen(args, **kwargs)
    zygote = _zygote_for(preload)
    if not zygote.fits(env):
        return subprocess.Popen(args, **kwargs)
    try:
        return ForkedPopen(zygote, args, **kwargs)
    except ZygoteGone:  # killed under us (a test's kill-everything): one more, once
        return ForkedPopen(_zygote_for(preload), args, **kwargs)


def close_all() -> None:
    with _zygotes_lock:
        for zygote in _zygotes.values():
            zygote.close()
        _zygotes.clear()


if __name__ == "__main__":
    serve(int(sys.argv[1]), sys.argv[2:])
