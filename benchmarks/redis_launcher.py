"""Real ``redis-server`` processes on loopback, for the cluster-mode tests and benchmarks (the
one launcher both use, as :mod:`benchmarks.launcher` is for daemons).

Each server gets a free port, its own directory and AOF on (``--appendonly yes``, no RDB
snapshots); :func:`redis_cluster` joins three of them into a 3-master Redis Cluster with
``redis-cli --cluster create``. Readiness is waited for by asking the server (``PING``,
``CLUSTER INFO``), never by sleeping a fixed time. Every process started here is stopped (and
reaped) when its context ends, whatever happened inside.

Without ``redis-server``/``redis-cli`` on ``PATH`` the callers skip with :data:`SKIP_REASON`
(``make test`` installs Debian's ``redis-server`` package when run as root).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

REDIS_SERVER = shutil.which("redis-server")
REDIS_CLI = shutil.which("redis-cli")
HAVE_REDIS = REDIS_SERVER is not None and REDIS_CLI is not None
SKIP_REASON = ("redis-server is not installed (apt-get install redis-server; `make test` does "
               "it as root)")
READY_TIMEOUT_S = 20.0


@dataclass
class RedisServer:
    port: int
    directory: Path
    proc: subprocess.Popen[bytes]
    log_path: Path
    argv: list[str]

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def cli(self, *args: str, timeout: float = 10.0) -> str:
        """One ``redis-cli`` command against this server; its stdout."""
        assert REDIS_CLI is not None
        done = subprocess.run([REDIS_CLI, "-h", "127.0.0.1", "-p", str(self.port), *args],
                              capture_output=True, timeout=timeout, check=True)
        return done.stdout.decode(errors="replace").strip()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        """SIGTERM and reap (Redis writes its AOF out and exits); the port stays this
        server's for :meth:`start`. The fault tests' "Redis restarts"."""
        _stop(self.proc)

    def start(self) -> None:
        """Start it again after :meth:`stop`: same port, directory and AOF (what it had
        acknowledged comes back), ready once it answers ``PING``."""
        if self.proc.poll() is None:
            raise RuntimeError(f"redis-server on port {self.port} is still running")
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait_until(partial(_pings, self), f"redis-server on port {self.port} (restarted)",
                    self)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _wait_until(check: Callable[[], bool], what: str, server: RedisServer | None = None) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        if server is not None and server.proc.poll() is not None:
            raise RuntimeError(f"redis-server exited ({server.proc.returncode}) before {what}:"
                               f"\n{server.log()[-2000:]}")
        try:
            if check():
                return
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.02)  # polling the server's own answer, not standing in for it


@contextmanager
def redis_server(directory: Path, *, appendonly: bool = True,
                 extra: Sequence[str] = ()) -> Iterator[RedisServer]:
    """One ``redis-server`` on a free loopback port, AOF on unless ``appendonly=False``."""
    if REDIS_SERVER is None:
        raise RuntimeError(SKIP_REASON)
    directory.mkdir(parents=True, exist_ok=True)
    last_error: Exception | None = None
    for _ in range(5):  # a free port can be taken between the probe and the bind: try again
        port = free_port()
        log_path = directory / f"redis-{port}.log"
        argv = [REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(directory),
                "--appendonly", "yes" if appendonly else "no", "--save", "",
                "--logfile", str(log_path), "--daemonize", "no", "--protected-mode", "no",
                *extra]
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        server = RedisServer(port, directory, proc, log_path, argv)
        try:
            _wait_until(partial(_pings, server), f"redis-server on port {port}", server)
        except RuntimeError as exc:
            last_error = exc
            _stop(proc)
            continue
        try:
            yield server
        finally:
            _stop(server.proc)  # the process of the last start()
        return
    raise RuntimeError(f"could not start redis-server: {last_error}")


def _pings(server: RedisServer) -> bool:
    return server.cli("PING", timeout=2) == "PONG"


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclass
class RedisCluster:
    masters: list[RedisServer]

    @property
    def url(self) -> str:
        """The first master's URL: a cluster client discovers the others from it."""
        return self.masters[0].url


def _cluster_ok(server: RedisServer) -> bool:
    return "cluster_state:ok" in server.cli("CLUSTER", "INFO")


@contextmanager
def redis_cluster(directory: Path, size: int = 3) -> Iterator[RedisCluster]:
    """``size`` masters (no replicas) joined into one Redis Cluster covering every slot."""
    if REDIS_CLI is None:
        raise RuntimeError(SKIP_REASON)
    with ExitStack() as stack:
        masters = [stack.enter_context(redis_server(
            directory / f"node{n}", extra=("--cluster-enabled", "yes",
                                           "--cluster-config-file", "nodes.conf",
                                           "--cluster-node-timeout", "2000")))
            for n in range(size)]
        subprocess.run(
            [REDIS_CLI, "--cluster", "create",
             *[f"127.0.0.1:{m.port}" for m in masters],
             "--cluster-replicas", "0", "--cluster-yes"],
            capture_output=True, timeout=60, check=True)
        for master in masters:
            _wait_until(partial(_cluster_ok, master), f"cluster state ok on port {master.port}",
                        master)
        yield RedisCluster(masters)
