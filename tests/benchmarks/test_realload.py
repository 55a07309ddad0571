"""The ``realload`` benchmark's measuring parts, against real processes and real frames.

Its figures are never asserted here (timing belongs to the benchmark). What is checked is that
the figures are made of the right things: the mock agent's LLM-paced turn sends the script its
seed names (thoughts, tool calls, answers, every update stamped with its write time, the closing
count), the subscriber process reads every stamp of every stream from real SSE frames of a real
daemon (as many as each session's script has, on both of its streams), and a latency is the read
time less the stamp: positive and bounded. The stamp reader is also fed streams cut at arbitrary
points, and streams missing a frame, which must be caught.
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from benchmarks import realload
from benchmarks.harness import Context, CpuUse, Progress
from benchmarks.launcher import start_daemon
from benchmarks.realload_client import BIN_NS, StampCounter, Window
from daemon.mock_agent.paced import (
    MESSAGE,
    STAMP_RE,
    THOUGHT,
    TOOL_CALL,
    TOOL_DONE,
    paced_steps,
)

pytestmark = pytest.mark.processes  # starts processes: not in make unit-fast

ROOT = Path(__file__).resolve().parents[2]
GUARD_S = 60  # hang guard only; every wait is on a line or a frame


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    realload.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_a_seed_names_one_script_of_thoughts_tool_calls_and_answers() -> None:
    script = paced_steps(7, 30, 100, 5.0)
    assert script == paced_steps(7, 30, 100, 5.0)
    assert script != paced_steps(8, 30, 100, 5.0)
    kinds = Counter(kind for _, kind in script)
    assert kinds[THOUGHT] and kinds[MESSAGE] and kinds[TOOL_CALL] == kinds[TOOL_DONE] >= 1
    times = [at for at, _ in script]
    assert times == sorted(times) and 0 <= times[0] and times[-1] < 5.0
    gaps = [b - a for a, b in itertools.pairwise(times)]
    # Every gap is 1/rate times 0.5-1.5 (rate in 30-100), or a tool's run on top of that.
    assert min(gaps) >= 0.5 / 100 and max(gaps) <= 1.5 / 30 + 0.6


def test_the_mock_agent_streams_the_seeded_script_stamped() -> None:
    prompt = "mock:pace=30-100 mock:pace_ms=1500 mock:seed=11 mock:delay_ms=0"
    proc = subprocess.Popen([sys.executable, "-m", "daemon.mock_agent"], cwd=ROOT,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        for message in ({"id": 1, "method": "initialize", "params": {}},
                        {"id": 2, "method": "session/prompt", "params": {
                            "sessionId": "s1", "prompt": [{"type": "text", "text": prompt}]}}):
            proc.stdin.write(json.dumps({"jsonrpc": "2.0", **message}).encode() + b"\n")
        proc.stdin.flush()
        started = time.monotonic_ns()
        updates: list[dict[str, Any]] = []
        deadline = time.monotonic() + GUARD_S
        while time.monotonic() < deadline:
            line = json.loads(proc.stdout.readline())
            if line.get("id") == 2:
                assert line["result"] == {"stopReason": "end_turn"}
                break
            if line.get("method") == "session/update":
                updates.append(line["params"]["update"])
        else:
            pytest.fail("the paced turn did not end")
    finally:
        proc.kill()
        proc.wait()
    script = paced_steps(11, 30, 100, 1.5)
    kinds = {THOUGHT: "agent_thought_chunk", MESSAGE: "agent_message_chunk",
             TOOL_CALL: "tool_call", TOOL_DONE: "tool_call_update"}
    assert [u["sessionUpdate"] for u in updates] == [kinds[k] for _, k in script] + [
        "agent_message_chunk"]
    assert updates[-1]["content"]["text"] == f"~end{len(script)}~"
    stamps = [_stamp(json.dumps(u)) for u in updates[:-1]]
    assert [seq for _, seq in stamps] == list(range(len(script)))
    written = [ns for ns, _ in stamps]
    assert written == sorted(written) and written[0] >= started


def _stamp(text: str) -> tuple[int, int]:
    found = STAMP_RE.findall(text.encode())
    assert len(found) == 1, text
    return int(found[0][0]), int(found[0][1])


def test_a_step_against_a_real_daemon_reads_every_stamp_of_every_stream() -> None:
    args = _args("--window", "1", "--per-session", "2", "--clients", "2")
    ctx = Context(quick=True, progress=Progress(enabled=False))
    with start_daemon(["--max-sessions", "0", "--max-connections", "0"]) as daemon:
        # --reference finds a daemon's pid from its port, for its CPU.
        assert realload.listening_pid(daemon.host_port[1]) == daemon.pid
        target = realload.SearchedDaemon("this daemon", daemon.url, daemon.pid)
        step = realload.run_step(ctx, target, 3, args, 1.0, 30.0, 100.0)
    assert step.problems == []
    assert len(step.subs) == 6 and len(step.scripts) == 3
    for sub in step.subs:
        # As many stamps as the session's script has, 0..n-1, and the closing count agrees.
        assert sub["stamps"] == sub["end_count"] == step.scripts[sub["session"]] > 0
        assert sub["id_error"] is None and sub["done"] and not sub["evicted"]
    assert sum(sub["in_window"] for sub in step.subs) == 2 * step.events > 0
    # Latency from real reads: positive, and bounded by the run itself.
    assert 0 < step.p50_ms <= step.p99_ms <= step.max_ms < GUARD_S * 1000
    assert step.cpu.daemon_ms is not None and step.cpu.daemon_ms > 0
    assert step.cpu.clients_ms is not None and step.cpu.agent_ms is not None


# --- the stamp reader on its own -----------------------------------------------------------------

HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        b"transfer-encoding: chunked\r\n\r\n")
T0 = 1_000_000_000


def _frames(count: int, drop: int | None = None) -> bytes:
    frames = [b"retry: 3000\n\n"]
    for i in range(count):
        if i == drop:
            continue
        text = b"~t%d.%d~ token " % (T0 + i * 1_000_000, i)
        frames.append(b'id: %d\nevent: session_update\ndata: {"text":"%s"}\n\n' % (i + 1, text))
    frames.append(b'id: %d\nevent: session_update\ndata: {"text":"~end%d~"}\n\n'
                  % (count + 1, count))
    frames.append(b'id: %d\nevent: turn_complete\ndata: {}\n\n' % (count + 2))
    return b"".join(frames)


def _feed(counter: StampCounter, payload: bytes, cuts: list[int], now_ns: int) -> None:
    bounds = [0, *sorted(set(cuts)), len(payload)]
    pieces = [payload[a:b] for a, b in itertools.pairwise(bounds) if b > a]
    raw = HEAD + b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"
    for a, b in itertools.pairwise([0, *sorted(set(c + len(HEAD) for c in cuts)), len(raw)]):
        counter.now_ns = now_ns
        counter.feed(raw[a:b])


@given(cuts=st.lists(st.integers(1, len(_frames(30)) - 1), max_size=12))
def test_stamps_are_read_however_the_stream_is_cut(cuts: list[int]) -> None:
    window = Window()
    window.t0, window.t1 = T0 + 10_000_000, T0 + 20_000_000  # stamps 10..19
    counter = StampCounter(b"event: turn_complete\n", window)
    now = T0 + 50_000_000
    _feed(counter, _frames(30), cuts, now)
    assert counter.done and counter.error is None and counter.id_error is None
    assert (counter.stamps, counter.end_count, counter.stamp_error) == (30, 30, None)
    assert counter.in_window == 10
    expected = Counter((now - (T0 + i * 1_000_000)) // BIN_NS for i in range(10, 20))
    assert {i: n for i, n in enumerate(window.hist) if n} == dict(expected)
    assert counter.max_latency_ns == now - (T0 + 10_000_000)


@given(drop=st.integers(0, 29), cuts=st.lists(st.integers(1, 2000), max_size=6))
def test_a_missing_stamped_frame_is_caught(drop: int, cuts: list[int]) -> None:
    counter = StampCounter(b"event: turn_complete\n", Window())
    payload = _frames(30, drop=drop)
    _feed(counter, payload, [c for c in cuts if c < len(payload)], T0)
    assert counter.stamps == 29
    assert counter.stamp_error is not None


def test_stream_problems_name_a_session_whose_streams_disagree() -> None:
    good = {"session": 0, "done": True, "terminal_id": 9, "last_id": 9, "stamps": 5,
            "end_count": 5}
    assert realload.stream_problems([good, dict(good)], 2) == []
    short = {**good, "stamps": 4, "stamp_error": "the turn sent 5 stamps, 4 arrived"}
    problems = realload.stream_problems([good, short], 2)
    assert any("5 stamps, 4 arrived" in p for p in problems)
    assert any("[4, 5] stamps" in p for p in problems)
    evicted = {**good, "evicted": True}
    assert any("evicted" in p for p in realload.stream_problems([good, evicted], 2))
    assert any("1 streams" in p for p in realload.stream_problems([good], 2))


def _step(sessions: int, p99_ms: float, daemon_ms: float) -> realload.Step:
    return realload.Step(sessions, p99_ms / 2, p99_ms, p99_ms * 1.2, events=1000 * sessions,
                         nominal=1000 * sessions, window_s=1.0,
                         cpu=CpuUse(daemon_ms * sessions, 1.0, 1.0), problems=[], prompt_s=0.1)


def test_rows_set_the_largest_n_and_the_cpu_against_the_reference() -> None:
    ctx = Context(quick=False, progress=Progress(enabled=False))
    ours = [_step(250, 10, 4.0), _step(500, 40, 4.0), _step(1000, 300, 4.0)]
    theirs = [_step(250, 60, 10.0), _step(500, 900, 10.0)]
    rows = realload.rows_for(ctx, _args("--reference", "http://127.0.0.1:1"), ours, theirs)
    largest = next(r for r in rows if r.name.startswith("largest N"))
    assert (largest.value, largest.baseline, largest.ratio) == (500, 250, 2.0)
    assert largest.ok is False  # 500 < 2,000
    cpu = next(r for r in rows if r.name.startswith("daemon CPU per 1,000 events"))
    # At 250 sessions, the largest both held: 4 ms against 10 ms per 1,000 events.
    assert cpu.params["sessions"] == 250 and cpu.ratio == pytest.approx(0.4)
    steps = [r for r in rows if r.name.endswith("p99 publish-to-delivery")]
    assert [r.ok for r in steps] == [True, True, False, True, False]


@pytest.mark.parametrize(("limit", "tried"), [
    (300, [250, 500, 375, 312, 281]),  # doubles, then bisects to within 15%
    (40, [250, 125, 62, 31, 46, 38, 42]),  # halves while none holds, then bisects
])
def test_the_search_doubles_or_halves_then_bisects(monkeypatch: pytest.MonkeyPatch, limit: int,
                                                   tried: list[int]) -> None:
    seen: list[int] = []

    def fake_step(ctx: Context, target: object, count: int, *rest: object) -> realload.Step:
        seen.append(count)
        return _step(count, 50 if count <= limit else 500, 4.0)

    monkeypatch.setattr(realload, "run_step", fake_step)
    ctx = Context(quick=False, progress=Progress(enabled=False))
    steps = realload.search(ctx, realload.SearchedDaemon("x", "http://127.0.0.1:1", None),
                            _args("--start", "250"))
    assert seen == tried
    best = realload.largest_held(steps)
    assert best is not None and best.sessions <= limit
    assert min(s.sessions for s in steps if not s.holds) / best.sessions <= realload.BISECT_UNTIL
