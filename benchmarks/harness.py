"""Shared benchmark machinery: trials, medians and spread, CPU accounting, rows, the results
table, JSON output and the progress display.

Every row compares a figure with a baseline measured in the same run (the machine is a small,
shared one: the daemon, the agent and the clients compete for two cores, so only same-run ratios
are stable). A row carries the CPU the daemon, the agent and the clients spent on it, read from
``/proc/<pid>/stat``, so a throughput figure can be told apart from a starved process.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
MIB = 1024 * 1024


# --- statistics ----------------------------------------------------------------------------------


def percentile(samples: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile, ``q`` in [0, 100]."""
    if not samples:
        raise ValueError("percentile of no samples")
    ordered = sorted(samples)
    if len(ordered) == 1:
        return ordered[0]
    pos = (len(ordered) - 1) * q / 100.0
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def spread(samples: Sequence[float]) -> float | None:
    """Relative spread of repeated trials: the interquartile range over the median with four or
    more samples, the full range over the median with two or three, ``None`` with one."""
    if len(samples) < 2:
        return None
    mid = statistics.median(samples)
    if mid == 0:
        return None
    if len(samples) >= 4:
        return (percentile(samples, 75) - percentile(samples, 25)) / abs(mid)
    return (max(samples) - min(samples)) / abs(mid)


# --- CPU accounting ------------------------------------------------------------------------------


def _cpu_clock(pid: int) -> int:
    """Linux's CPU-time clock of process ``pid`` (what ``clock_getcpuclockid`` returns, built
    the same way: the negated pid, shifted, with the "scheduler" clock type)."""
    return ((~pid) << 3) | 2


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU of one process, all its threads (also those that have ended), not its
    children, or ``None`` once it is gone. Read from the process's CPU-time clock, to the
    nanosecond: ``/proc/<pid>/stat`` counts in clock ticks (10 ms), which made a 50 ms agent
    figure +-20%. Falls back to that where the clock cannot be read."""
    try:
        return time.clock_gettime(_cpu_clock(pid))
    except OSError:
        pass
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            raw = stat.read()
    except OSError:
        return None
    # The command name is parenthesised and may hold spaces: split after the last ')'.
    fields = raw[raw.rindex(b")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def own_cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


@dataclass
class CpuUse:
    """CPU milliseconds spent by each party over one measured interval."""

    daemon_ms: float | None = None
    agent_ms: float | None = None
    clients_ms: float | None = None

    def __add__(self, other: CpuUse) -> CpuUse:
        def plus(a: float | None, b: float | None) -> float | None:
            if a is None:
                return b
            return a if b is None else a + b

        return CpuUse(plus(self.daemon_ms, other.daemon_ms), plus(self.agent_ms, other.agent_ms),
                      plus(self.clients_ms, other.clients_ms))

    def scaled(self, factor: float) -> CpuUse:
        def mul(a: float | None) -> float | None:
            return None if a is None else a * factor

        return CpuUse(mul(self.daemon_ms), mul(self.agent_ms), mul(self.clients_ms))


class CpuMeter:
    """Reads the daemon's and the agents' CPU from /proc and this process's own, around an
    interval; client subprocesses report theirs and are added with :meth:`add_client`."""

    def __init__(self, daemon_pid: int | None, agent_pids: Iterable[int] = (),
                 include_self: bool = True) -> None:
        self.daemon_pid = daemon_pid
        self.agent_pids = list(agent_pids)
        self.include_self = include_self
        self._start: tuple[float | None, list[float | None], float] | None = None
        self._client_extra = 0.0

    def start(self) -> None:
        self._client_extra = 0.0
        self._start = (
            process_cpu_seconds(self.daemon_pid) if self.daemon_pid else None,
            [process_cpu_seconds(pid) for pid in self.agent_pids],
            own_cpu_seconds(),
        )

    def add_client(self, seconds: float) -> None:
        self._client_extra += seconds

    def stop(self) -> CpuUse:
        if self._start is None:
            raise RuntimeError("CpuMeter.stop() before start()")
        daemon0, agents0, self0 = self._start
        daemon_ms = None
        if self.daemon_pid and daemon0 is not None:
            now = process_cpu_seconds(self.daemon_pid)
            daemon_ms = None if now is None else (now - daemon0) * 1000
        agent_ms: float | None = None
        for pid, before in zip(self.agent_pids, agents0, strict=True):
            now = process_cpu_seconds(pid)
            if before is not None and now is not None:
                agent_ms = (agent_ms or 0.0) + (now - before) * 1000
        clients = self._client_extra
        if self.include_self:
            clients += own_cpu_seconds() - self0
        return CpuUse(daemon_ms, agent_ms, clients * 1000)


# --- rows ----------------------------------------------------------------------------------------


@dataclass
class Row:
    """One line of the results table (and one object of the JSON output)."""

    benchmark: str
    name: str
    params: dict[str, Any]
    unit: str
    samples: list[float]
    value: float | None = None  # the median of samples unless set
    baseline: float | None = None
    baseline_label: str = ""
    ratio: float | None = None
    ratio_label: str = ""
    target: str = ""
    ok: bool | None = None  # None: informational, no target
    cpu: CpuUse = field(default_factory=CpuUse)
    cpu_note: str = "per trial"
    notes: list[str] = field(default_factory=list)
    error: str | None = None
    quick: bool = False
    interrupted: bool = False  # the run was stopped by a signal while this benchmark ran

    def __post_init__(self) -> None:
        if self.value is None and self.samples:
            self.value = statistics.median(self.samples)

    @property
    def spread(self) -> float | None:
        return spread(self.samples)

    @property
    def verdict(self) -> str:
        if self.interrupted:
            return "INTERRUPTED"
        if self.error is not None:
            return "ERROR"
        if self.ok is None:
            return "-"
        return "PASS" if self.ok else "MISS"

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["spread"] = self.spread
        out["verdict"] = self.verdict
        out["trials"] = len(self.samples)
        return out


def error_row(benchmark: str, exc: BaseException, quick: bool) -> Row:
    return Row(benchmark=benchmark, name="(failed)", params={}, unit="", samples=[],
               error=f"{type(exc).__name__}: {exc}", quick=quick)


def interrupted_row(benchmark: str, reason: str, quick: bool) -> Row:
    """The row of the benchmark a signal stopped: no figure, the reason as its error."""
    return Row(benchmark=benchmark, name="(interrupted)", params={}, unit="", samples=[],
               error=reason, quick=quick, interrupted=True)


# --- formatting ----------------------------------------------------------------------------------


def fmt_number(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    magnitude = abs(value)
    if magnitude >= 100_000:
        text = f"{value:,.0f}"
    elif magnitude >= 100:
        text = f"{value:,.0f}"
    elif magnitude >= 10:
        text = f"{value:.1f}"
    elif magnitude >= 1:
        text = f"{value:.2f}"
    else:
        text = f"{value:.3f}"
    return f"{text} {unit}".rstrip()


def fmt_params(params: Mapping[str, Any]) -> str:
    def one(value: Any) -> str:
        if isinstance(value, bool):
            return "yes" if value else "no"
        if isinstance(value, int) and value >= 10_000:
            return f"{value:,}"
        if isinstance(value, float):
            return fmt_number(value)
        return str(value)

    return " ".join(f"{key}={one(value)}" for key, value in params.items())


def fmt_cpu(cpu: CpuUse) -> str:
    def one(value: float | None) -> str:
        return "-" if value is None else f"{value:,.0f}"

    return f"{one(cpu.daemon_ms)}/{one(cpu.agent_ms)}/{one(cpu.clients_ms)}"


TABLE_COLUMNS = ("benchmark", "parameters", "value", "spread", "baseline", "ratio", "target",
                 "result", "cpu ms d/a/c")


def table_cells(row: Row) -> tuple[str, ...]:
    baseline = fmt_number(row.baseline) if row.baseline is not None else "-"
    if row.baseline_label:
        baseline = f"{baseline} ({row.baseline_label})"
    ratio = "-" if row.ratio is None else f"{row.ratio:.2f}x"
    if row.ratio is not None and row.ratio_label:
        ratio = f"{ratio} {row.ratio_label}"
    spread_ = row.spread
    return (
        f"{row.benchmark}: {row.name}",
        fmt_params(row.params),
        fmt_number(row.value, row.unit) if row.error is None else "-",
        "-" if spread_ is None else f"±{spread_ * 50:.0f}%",
        baseline,
        ratio,
        row.target or "-",
        row.verdict,
        fmt_cpu(row.cpu),
    )


DEFAULT_TABLE_WIDTH = 100
_RIGHT_ALIGNED = frozenset({2, 3, 5})
# In a narrowed table: the columns that may wrap onto continuation lines, between words
# (parameters, value and unit, baseline, ratio, target, CPU).
_WRAPPABLE = frozenset({1, 2, 4, 5, 6, 8})
_MIN_WRAP_WIDTH = 8
_MAX_WORD = 20
_INDENT = "  "


def terminal_width() -> int:
    """The terminal's width (``COLUMNS`` first), 100 columns when it cannot be told."""
    return shutil.get_terminal_size((DEFAULT_TABLE_WIDTH, 24)).columns


def _fit_widths(lines: Sequence[Sequence[str]], natural: list[int], width: int,
                wrappable: frozenset[int]) -> list[int]:
    """Narrow the wrappable columns, widest first, until the columns fit ``width`` (or every
    wrappable one is down to its minimum: its longest word, within [8, 20] characters)."""
    widths = list(natural)
    floor = {i: min(natural[i], max(_MIN_WRAP_WIDTH, min(_MAX_WORD, max(
        (len(word) for line in lines for word in line[i].split()), default=0))))
        for i in wrappable}
    gaps = 2 * (len(widths) - 1)
    while sum(widths) + gaps > width:
        candidates = [i for i in wrappable if widths[i] > floor[i]]
        if not candidates:
            break
        widest = max(candidates, key=lambda i: widths[i])
        widths[widest] -= 1
    return widths


def _wrap(text: str, width: int, indent: str = "") -> list[str]:
    if len(text) <= width:
        return [text]
    return textwrap.wrap(text, max(width, _MIN_WRAP_WIDTH), subsequent_indent=indent,
                         break_long_words=True, break_on_hyphens=False) or [""]


def _render(lines: Sequence[Sequence[str]], widths: Sequence[int], right: frozenset[int],
            prefix: str = "", header: bool = True) -> list[str]:
    """Rows of cells in fixed columns (the first one a header, underlined, unless ``header``
    is false); a cell longer than its column wraps onto more lines."""
    out: list[str] = []
    for index, line in enumerate(lines, start=0 if header else 1):
        wrapped = [_wrap(cell, w) for cell, w in zip(line, widths, strict=True)]
        for part in range(max(len(cell) for cell in wrapped)):
            cells = []
            for i, (cell_lines, w) in enumerate(zip(wrapped, widths, strict=True)):
                text = cell_lines[part] if part < len(cell_lines) else ""
                cells.append(text.rjust(w) if i in right and index else text.ljust(w))
            out.append((prefix + "  ".join(cells)).rstrip())
        if index == 0:
            out.append(prefix + "-" * (sum(widths) + 2 * (len(widths) - 1)))
    return out


def _records(lines: Sequence[Sequence[str]], width: int) -> list[str]:
    """The narrowest layout: each row's name, then its non-empty cells as ``column: value``
    wrapped to ``width``."""
    out: list[str] = []
    for line in lines[1:]:
        out.extend(_wrap(line[0], width, _INDENT))
        fields = "; ".join(f"{column}: {cell}" for column, cell
                           in zip(TABLE_COLUMNS[1:], line[1:], strict=True) if cell != "-")
        out.extend(textwrap.wrap(fields, max(width, _MIN_WRAP_WIDTH), initial_indent=_INDENT,
                                 subsequent_indent=_INDENT * 2, break_on_hyphens=False))
    return out


def format_table(rows: Sequence[Row], width: int | None = None) -> str:
    """The results table; rows that failed and row notes follow it.

    Without ``width`` (``--wide``) every row is one line, however long. With it, a table wider
    than ``width`` is stacked: each row's name on a line of its own, its figures on the next
    (indented), the parameter, value, baseline, ratio, target and CPU cells wrapping onto
    continuation lines between words; a terminal too narrow even for that gets each row as ``column: value``
    text. Footnotes wrap too. Nothing is cut.
    """
    lines = [TABLE_COLUMNS, *(table_cells(row) for row in rows)]
    natural = [max(len(line[i]) for line in lines) for i in range(len(TABLE_COLUMNS))]
    if width is None or sum(natural) + 2 * (len(natural) - 1) <= width:
        out = _render(lines, natural, _RIGHT_ALIGNED)
    else:
        rest = [line[1:] for line in lines]
        right = frozenset(i - 1 for i in _RIGHT_ALIGNED)
        wrappable = frozenset(i - 1 for i in _WRAPPABLE)
        rest_natural = natural[1:]
        widths = _fit_widths(rest, rest_natural, width - len(_INDENT), wrappable)
        header = _render(rest[:1], widths, right, _INDENT)
        out = [TABLE_COLUMNS[0], *header]
        for line, cells in zip(lines[1:], rest[1:], strict=True):
            out.extend(_wrap(line[0], width, _INDENT))
            out.extend(_render([cells], widths, right, _INDENT, header=False))
        if max(map(len, out)) > width:
            out = _records(lines, width)
    footnotes: list[str] = []
    for row in rows:
        label = f"{row.benchmark}: {row.name}"
        if row.error is not None:
            kind = "INTERRUPTED" if row.interrupted else "ERROR"
            footnotes.append(f"{kind} {label}: {row.error}")
        footnotes.extend(f"{label}: {note}" for note in row.notes)
    if footnotes:
        out.append("")
        for note in footnotes:
            out.extend([note] if width is None else _wrap(note, width, "    "))
    return "\n".join(out)


def summary_line(rows: Sequence[Row]) -> str:
    counts = {verdict: sum(1 for row in rows if row.verdict == verdict)
              for verdict in ("PASS", "MISS", "ERROR", "INTERRUPTED", "-")}
    stopped = f", {counts['INTERRUPTED']} INTERRUPTED" if counts["INTERRUPTED"] else ""
    return (f"{len(rows)} rows: {counts['PASS']} PASS, {counts['MISS']} MISS, "
            f"{counts['ERROR']} ERROR{stopped}, {counts['-']} informational")


def write_json(path: str, rows: Sequence[Row], meta: Mapping[str, Any]) -> None:
    body = {"meta": dict(meta), "rows": [row.to_json() for row in rows]}
    with open(path, "w", encoding="utf-8") as out:
        json.dump(body, out, indent=1, default=str)
        out.write("\n")


def git_commit(where: Path | None = None) -> str | None:
    """``git rev-parse HEAD`` of the checkout holding ``where`` (this package by default), or
    ``None`` outside a git checkout or without git."""
    cwd = where if where is not None else Path(__file__).resolve().parent
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True,
                              text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    commit = done.stdout.strip()
    return commit if done.returncode == 0 and commit else None


def package_version() -> str:
    from sdk.protocol import __version__

    return __version__


def run_meta(argv: Sequence[str], quick: bool, started: float,
             commit: str | None = None) -> dict[str, Any]:
    """What the JSON output says about the run: the code measured (package version, git commit
    or ``None``), when (UTC date), where and how."""
    return {
        "version": package_version(),
        "commit": commit,
        "date": datetime.fromtimestamp(started, UTC).isoformat(timespec="seconds"),
        "argv": list(argv),
        "quick": quick,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "started_unix": started,
        "duration_s": time.time() - started,
    }


# --- progress ------------------------------------------------------------------------------------


class Progress:
    """One line per step on stderr, prefixed with the time since the run started."""

    def __init__(self, stream: IO[str] | None = None, enabled: bool = True) -> None:
        self.t0 = time.monotonic()
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.prefix = ""

    def __call__(self, message: str) -> None:
        if self.enabled:
            elapsed = time.monotonic() - self.t0
            print(f"[{elapsed:7.1f}s] {self.prefix}{message}", file=self.stream, flush=True)

    @contextmanager
    def section(self, name: str) -> Iterator[None]:
        previous = self.prefix
        self.prefix = f"{name}: "
        start = time.monotonic()
        self("start")
        try:
            yield
        finally:
            self(f"done in {time.monotonic() - start:.1f}s")
            self.prefix = previous


@dataclass
class Context:
    """What every benchmark gets: the mode, the trial count, and the progress display."""

    quick: bool
    progress: Progress
    trials_override: int | None = None

    def trials(self, full: int, quick: int = 1) -> int:
        if self.trials_override is not None:
            return self.trials_override
        return quick if self.quick else full

    def pick(self, full: Any, quick: Any) -> Any:
        return quick if self.quick else full


# --- a trivial static HTTP server (a baseline for moving bytes) ----------------------------------


def _static_response(size: int) -> bytes:
    head = (f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            f"content-length: {size}\r\n\r\n").encode()
    return head + b"[" + b" " * max(0, size - 2) + b"]"[: max(0, size - 1)]


def _serve_static_connection(conn: socket.socket, cache: dict[int, bytes]) -> None:
    buf = b""
    with conn:
        while True:
            while b"\r\n\r\n" not in buf:
                data = conn.recv(65536)
                if not data:
                    return
                buf += data
            head, buf = buf.split(b"\r\n\r\n", 1)
            lines = head.split(b"\r\n")
            length = 0
            for line in lines[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            while len(buf) < length:
                data = conn.recv(65536)
                if not data:
                    return
                buf += data
            buf = buf[length:]
            path = lines[0].split()[1].decode()
            size = int(path.rsplit("/", 1)[-1]) if path.startswith("/bytes/") else 2
            if size not in cache:
                cache[size] = _static_response(size)
            conn.sendall(cache[size])


def serve_static_forever() -> None:
    """The static server's process: print the port, then answer until killed."""
    listener = socket.create_server(("127.0.0.1", 0))
    print(listener.getsockname()[1], flush=True)
    cache: dict[int, bytes] = {}
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=_serve_static_connection, args=(conn, cache),
                         daemon=True).start()


class StaticByteServer:
    """Answers every HTTP/1.1 request on ``/bytes/<n>`` with ``n`` filler bytes, keep-alive.

    It does nothing but write a pre-built response, so fetching from it with the same client
    measures the floor for moving that many bytes over loopback and parsing them as one HTTP
    response: the baseline against which a daemon response of the same size is judged. It runs
    in its own process, like the daemon, so it never competes with the client for a GIL.
    """

    def __init__(self) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-c", "from benchmarks.harness import serve_static_forever; "
                                   "serve_static_forever()"],
            stdout=subprocess.PIPE)
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line.strip().isdigit():
            self.close()
            raise RuntimeError(f"static server did not report its port: {line!r}")
        self.port = int(line)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        if self._proc.stdout is not None:
            self._proc.stdout.close()
