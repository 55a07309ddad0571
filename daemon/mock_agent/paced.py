"""LLM-paced turns of the mock agent (``mock:pace=LO-HI``): what a real agent's stream looks like.

A real agent streams 30-100 chunks a second per session, with thoughts and tool calls between.
A paced turn does that for ``mock:pace_ms`` milliseconds: a thought of a few chunks, a tool call
that runs for a moment (no output meanwhile) and completes, an answer of a few dozen chunks, and
again, every chunk ``1/rate`` seconds after the last with +-50% jitter. The session's rate is
drawn once in ``[LO, HI]``; everything is drawn from ``random.Random(mock:seed)``, so a seed
gives the same script (:func:`paced_steps`) on the agent and on a benchmark that wants to know
what it was meant to send.

Every update of the script carries a stamp in its text, ``~t<ns>.<seq>~``: the agent's
``CLOCK_MONOTONIC`` in nanoseconds when it wrote the line (system-wide on Linux, so a reader on
the same machine can take publish-to-delivery latency from the frame alone, whatever daemon
carried it) and the update's number in the turn, from 0. After the last one the turn sends one
more message chunk, ``~end<n>~``: how many stamped updates came before it. A turn whose
writes are held back (its reader is slower than the pace) until :data:`LATE_S` past its script's
end stops there: the closing count says how many it sent.

One scheduler thread (:class:`PacedScheduler`) serves every paced turn of the process: it wakes
when the earliest update is due, writes every update of every session due within
:data:`BATCH_S` in one write (each stamped as it is written), and
schedules each session's next update from its nominal time (a late wake-up does not slow the
script down). Stdlib only, like the agent.
"""

from __future__ import annotations

import heapq
import json
import random
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

# Updates of a script, in order: (seconds after the turn's start, kind).
THOUGHT: Final = "thought"
TOOL_CALL: Final = "tool_call"
TOOL_DONE: Final = "tool_done"
MESSAGE: Final = "message"
THOUGHT_CHUNKS: Final = (4, 12)
MESSAGE_CHUNKS: Final = (15, 60)
TOOL_SECONDS: Final = (0.1, 0.6)
JITTER: Final = (0.5, 1.5)  # each gap is 1/rate times a factor drawn in this range
BATCH_S: Final = 0.001  # updates due this close together are written together
LATE_S: Final = 2.0  # a turn this far behind its script's end stops (see PacedRun.cutoff)

#: A stamp as it appears in a frame's bytes: the write time (ns) and the update's number.
STAMP_RE: Final = re.compile(rb"~t(\d+)\.(\d+)~")
#: The closing chunk: how many stamped updates the turn sent.
END_RE: Final = re.compile(rb"~end(\d+)~")
PACE_RE: Final = re.compile(r"^(\d+(?:\.\d+)?)-(\d+(?:\.\d+)?)$")


def parse_pace(raw: str) -> tuple[float, float]:
    """``"30-100"`` -> ``(30.0, 100.0)``; ``ValueError`` unless ``0 < LO <= HI``."""
    match = PACE_RE.match(raw)
    if match is None:
        raise ValueError(f"mock:pace must be LO-HI chunks a second (e.g. 30-100), got {raw!r}")
    low, high = float(match.group(1)), float(match.group(2))
    if not 0 < low <= high:
        raise ValueError(f"mock:pace needs 0 < LO <= HI, got {raw!r}")
    return low, high


def paced_steps(seed: int, low: float, high: float, duration_s: float) -> list[tuple[float, str]]:
    """The script of one paced turn: ``(offset_s, kind)`` for every stamped update, offsets
    below ``duration_s``. Deterministic in its arguments."""
    rng = random.Random(seed)
    gap = 1.0 / rng.uniform(low, high)
    t = rng.uniform(0.0, gap)
    steps: list[tuple[float, str]] = []

    def emit(kind: str) -> None:
        nonlocal t
        steps.append((t, kind))
        t += gap * rng.uniform(*JITTER)

    while t < duration_s:
        for _ in range(rng.randint(*THOUGHT_CHUNKS)):
            emit(THOUGHT)
        emit(TOOL_CALL)
        t += rng.uniform(*TOOL_SECONDS)
        emit(TOOL_DONE)
        for _ in range(rng.randint(*MESSAGE_CHUNKS)):
            emit(MESSAGE)
    return [step for step in steps if step[0] < duration_s]


def _update_line(session_json: str, update: str) -> bytes:
    return ('{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":' + session_json
            + ',"update":' + update + "}}\n").encode()


def _text(kind: str, text: str) -> str:
    return ('{"sessionUpdate":"' + kind + '","content":{"type":"text","text":'
            + json.dumps(text) + "}}")


_STAMP_HOLE = "\x00"  # where a line's stamp goes (never in JSON text)


def _templates(session_id: str) -> dict[str, tuple[bytes, bytes]]:
    """Each kind's line for ``session_id``, split where its stamp goes (``~t<ns>.<seq>~``):
    a line is then two joins and one format, not a JSON encoding."""
    session_json = json.dumps(session_id)
    tool = "paced-\x01"
    updates = {
        THOUGHT: _text("agent_thought_chunk", _STAMP_HOLE + " considering "),
        MESSAGE: _text("agent_message_chunk", _STAMP_HOLE + " token "),
        TOOL_CALL: json.dumps({"sessionUpdate": "tool_call", "toolCallId": tool,
                               "title": _STAMP_HOLE + " run a step", "kind": "execute",
                               "status": "in_progress"}, separators=(",", ":")),
        TOOL_DONE: json.dumps({"sessionUpdate": "tool_call_update", "toolCallId": tool,
                               "status": "completed", "content": [{"type": "content", "content": {
                                   "type": "text", "text": _STAMP_HOLE + " ok"}}]},
                              separators=(",", ":")),
    }
    out: dict[str, tuple[bytes, bytes]] = {}
    for kind, update in updates.items():
        # json.dumps spells the holes as \u0000 and \u0001.
        line = _update_line(session_json, update.replace("\\u0000", _STAMP_HOLE)
                            .replace("\\u0001", "\x01"))
        head, tail = line.split(_STAMP_HOLE.encode())
        out[kind] = head, tail
    return out


@dataclass
class PacedRun:
    """One paced turn: its script, where it is, and the events its prompt thread waits on."""

    session_id: str
    steps: list[tuple[float, str]]
    start: float  # time.monotonic() of offset 0
    cancelled: threading.Event
    finished: threading.Event = field(default_factory=threading.Event)
    # time.monotonic() past which the turn sends nothing more of its script (a reader too slow
    # for the pace would otherwise be fed the rest of it as fast as it reads).
    cutoff: float = float("inf")
    index: int = 0
    tool: int = 0
    ended: bool = False

    def __post_init__(self) -> None:
        self._templates = _templates(self.session_id)

    def next_due(self) -> float:
        """When the next line is due: the next step's time, or now-ish for the closing chunk."""
        if self.index < len(self.steps):
            return self.start + self.steps[self.index][0]
        return self.start + (self.steps[-1][0] if self.steps else 0.0)

    def line(self, now_ns: int) -> bytes:
        """The next line, stamped ``now_ns``; after the last step, the closing chunk."""
        if (self.index >= len(self.steps) or self.cancelled.is_set()
                or now_ns > self.cutoff * 1e9):
            self.ended = True
            return _update_line(json.dumps(self.session_id),
                                _text("agent_message_chunk", f"~end{self.index}~"))
        kind = self.steps[self.index][1]
        head, tail = self._templates[kind]
        stamp = b"~t%d.%d~" % (now_ns, self.index)
        self.index += 1
        if kind == TOOL_CALL:
            self.tool += 1
        if kind in (TOOL_CALL, TOOL_DONE):
            number = b"%d" % self.tool
            return head.replace(b"\x01", number) + stamp + tail.replace(b"\x01", number)
        return head + stamp + tail


class PacedScheduler:
    """Writes the due lines of every paced turn of the process, one write per wake-up."""

    def __init__(self, write: Callable[[bytes], None]) -> None:
        self._write = write
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, PacedRun]] = []
        self._order = 0
        self._thread: threading.Thread | None = None

    def run(self, paced: PacedRun) -> None:
        """Schedule ``paced`` and block until its closing chunk is written."""
        with self._cond:
            self._push(paced)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, daemon=True,
                                                name="paced-scheduler")
                self._thread.start()
            self._cond.notify()
        paced.finished.wait()

    def _push(self, paced: PacedRun) -> None:
        self._order += 1
        heapq.heappush(self._heap, (paced.next_due(), self._order, paced))

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._heap:
                    self._cond.wait()
                wait = self._heap[0][0] - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                # What falls due in the next moment goes in this write too: at most about
                # 1/BATCH_S wake-ups and writes a second, however many sessions.
                until = time.monotonic() + BATCH_S
                due: list[PacedRun] = []
                while self._heap and self._heap[0][0] <= until:
                    due.append(heapq.heappop(self._heap)[2])
            now_ns = time.monotonic_ns()
            lines = [paced.line(now_ns) for paced in due]
            self._write(b"".join(lines))
            with self._cond:
                for paced in due:
                    if not paced.ended:
                        self._push(paced)
            for paced in due:
                if paced.ended:
                    paced.finished.set()
