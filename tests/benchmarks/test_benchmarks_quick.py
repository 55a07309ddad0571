"""The benchmark smoke run: ``python -m benchmarks --quick`` must keep working.

It runs every benchmark end to end against real daemons at small sizes. Only the harness is
checked here (every row present, numeric, no ERROR row, well-formed JSON, a readable table); the
figures themselves are never asserted, because timing belongs to the benchmarks, not to the test
suite. A row computed from other rows may lack a figure only where those rows bear out the
reason its note gives (:func:`why_no_figure`). An ERROR row is a benchmark that could not run the real code, or whose subscribers did not
receive what was published: it fails the run. The load generator's frame counter and delivery
check, which every throughput figure rests on, are checked on their own against HTTP/1.1 chunked
SSE streams cut at arbitrary points, and the journal benchmark's pipeline check against a bus
that did not run the turn.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from benchmarks import client as client_bench
from benchmarks.__main__ import journal_rows
from benchmarks.e2e import (
    EvictedPastRing,
    RawRun,
    TurnRun,
    cpu_budget_row,
    evicted_past_ring,
    fanout_model_row,
    measure_turn_again,
    note_repeats,
    rows_for,
    targets_budget_row,
)
from benchmarks.harness import Context, CpuUse, Progress, process_cpu_seconds
from benchmarks.journal import check_pipeline_ran
from benchmarks.loadgen import LoadGenError, SSECounter, check_delivery, delivery_problems
from daemon.bus import BusLimits, SessionBus
from sdk.protocol.events import SessionUpdateData

pytestmark = pytest.mark.processes  # starts processes: not in make unit-fast

ROOT = Path(__file__).resolve().parents[2]

# Each benchmark's rows, by a fragment of the row name (quick sizes change the rest).
EXPECTED_ROWS: dict[str, list[str]] = {
    "journal": ["LiveJournal.append at caps", "pipeline"],
    "load_latency": ["small session", "full live journal", "full caps", "cost growth",
                     "in-process, "],
    "e2e": ["agent raw emission", "1 subscriber", "8 subscribers", "64 subscribers",
            "CPU per 1,000 events", "bare Hypercorn ceiling, 1 subscriber",
            "bare Hypercorn ceiling, 64 subscribers",
            "Trio socket floor (no HTTP server), 1 subscriber",
            "Trio socket floor (no HTTP server), 8 subscribers",
            "targets together under the 8-subscriber ceiling",
            "CPU the 1- and 8-subscriber targets need together",
            "fan-out the daemon's measured costs allow"],
    "memory": ["RSS idle", "third-party stack alone", "at full caps", "RSS growth",
               "turn ended"],
    "resume": ["back", "cursor at head"],
    "transcript_cost": ["transcript on", "transcript off", "store CPU per 1,000 events"],
    "repair_cost": ["terminal -> committed repair", "model: replay history",
                    "model: repair commit"],
    "crash_loss": ["ms of output lost at SIGKILL", "events lost at SIGKILL"],
    "stall_cut": ["eviction -> connection closed", "408 and EOF"],
    "client": ["SSE bytes -> parser -> reducer/store", "SessionHandle subscription",
               "replay history + live journal", "load answer bytes"],
}
TABLE_HEADER = ("benchmark", "parameters", "value", "spread", "baseline", "ratio", "target",
                "result", "cpu ms d/a/c")


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str],
                                                                 dict[str, Any]]:
    out = tmp_path_factory.mktemp("bench") / "quick.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--wide", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,  # a hang guard, not a bound
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-6000:]}"
    return proc, json.loads(out.read_text())


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def test_every_expected_row_is_present(quick_run: tuple[Any, dict[str, Any]]) -> None:
    _, results = quick_run
    rows = results["rows"]
    for benchmark, fragments in EXPECTED_ROWS.items():
        names = [row["name"] for row in rows if row["benchmark"] == benchmark]
        assert names, f"no rows for {benchmark}"
        for fragment in fragments:
            assert any(fragment in name for name in names), (benchmark, fragment, names)
    assert {row["benchmark"] for row in rows} == set(EXPECTED_ROWS)


def test_no_row_is_an_error(quick_run: tuple[Any, dict[str, Any]]) -> None:
    _, results = quick_run
    errors = [f"{row['benchmark']}: {row['name']}: {row['error']}"
              for row in results["rows"] if row["verdict"] == "ERROR" or row["error"]]
    assert errors == []


# e2e's rows computed from its measured rows, which give no figure when the measured rows do not
# allow one: the row's note says so. Each is checked against the rows it is computed from.
FANOUT_MODEL = "fan-out the daemon's measured costs allow"
CPU_BUDGET = "CPU the 1- and 8-subscriber targets need together"


def _daemon_ms(rows: list[dict[str, Any]], subscribers: int) -> float | None:
    name = f"throughput, {subscribers} subscriber{'s' if subscribers > 1 else ''}"
    (row,) = [r for r in rows if r["benchmark"] == "e2e" and r["name"] == name]
    assert row["trials"] == 1, row  # the quick run: the row's mean CPU is its one turn's
    value = row["cpu"]["daemon_ms"]
    return None if value is None else float(value)


def why_no_figure(row: dict[str, Any], rows: list[dict[str, Any]]) -> str | None:
    """The reason a row computed from others may have no figure, when the rows it is computed
    from bear it out; ``None`` when they would have given one (a row without a figure is then
    a fault).

    The fan-out model splits the daemon's CPU per event at 1 subscriber into ingest and one
    delivery, taking a delivery's cost from what 7 more subscribers added (both turns publish
    the same events): in a quick run of 5,000 events that is a difference of a few ms of CPU,
    which the daemon's other work during a turn on a busy machine can cancel. No CPU added at 8
    subscribers (or more than 8 times the 1-subscriber CPU) leaves nothing to model, and the
    row says so rather than give a figure made of noise."""
    if row["benchmark"] != "e2e" or row["value"] is not None or row["samples"]:
        return None
    notes = " ".join(row["notes"])
    if row["name"].startswith(FANOUT_MODEL) and "too small to model in this run" in notes:
        one, eight = _daemon_ms(rows, 1), _daemon_ms(rows, 8)
        if one is not None and eight is not None and not one < eight < 8 * one:
            return f"daemon CPU {one:.1f} ms at 1 subscriber, {eight:.1f} ms at 8"
    if row["name"].startswith(CPU_BUDGET) and "agent CPU too small to measure" in notes:
        (single,) = [r for r in rows if r["benchmark"] == "e2e"
                     and r["name"] == "throughput, 1 subscriber"]
        if not single["cpu"]["agent_ms"]:
            return "no agent CPU measured in the 1-subscriber turn"
    return None


def test_why_no_figure_holds_a_row_to_the_rows_it_is_computed_from() -> None:
    def throughput(n: int, daemon_ms: float | None, agent_ms: float | None = 30.0
                   ) -> dict[str, Any]:
        return {"benchmark": "e2e", "name": f"throughput, {n} subscriber{'s' if n > 1 else ''}",
                "trials": 1, "cpu": {"daemon_ms": daemon_ms, "agent_ms": agent_ms}}

    model = {"benchmark": "e2e", "name": FANOUT_MODEL + ", 8 subscribers", "value": None,
             "samples": [], "notes": ["CPU per event 7.00 us at 1 subscriber, delivery adds "
                                      "-0.050 us: too small to model in this run"]}
    assert why_no_figure(model, [throughput(1, 40.0), throughput(8, 38.0)]) is not None
    assert why_no_figure(model, [throughput(1, 40.0), throughput(8, 330.0)]) is not None
    # The inputs would have given a figure: the missing one is a fault.
    assert why_no_figure(model, [throughput(1, 35.0), throughput(8, 50.0)]) is None
    assert why_no_figure({**model, "notes": []}, [throughput(1, 40.0), throughput(8, 38.0)]) \
        is None
    budget = {"benchmark": "e2e", "name": CPU_BUDGET, "value": None, "samples": [],
              "notes": ["agent CPU too small to measure in this run: nothing to add up"]}
    assert why_no_figure(budget, [throughput(1, 35.0, agent_ms=None)]) is not None
    assert why_no_figure(budget, [throughput(1, 35.0, agent_ms=4.0)]) is None
    measured = {**throughput(8, None), "value": None, "samples": [], "notes": []}
    assert why_no_figure(measured, [throughput(1, 35.0), measured]) is None


def test_every_row_has_numbers(quick_run: tuple[Any, dict[str, Any]]) -> None:
    _, results = quick_run
    assert results["meta"]["quick"] is True
    for row in results["rows"]:
        label = f"{row['benchmark']}: {row['name']}"
        assert row["error"] is None, label
        assert row["verdict"] in ("PASS", "MISS", "-"), label
        if row["value"] is None and why_no_figure(row, results["rows"]) is not None:
            assert row["verdict"] == "-" and not row["target"], label
            continue
        assert _is_number(row["value"]), label
        assert row["unit"], label
        assert row["trials"] >= 1 and all(_is_number(s) for s in row["samples"]), label
        if row["baseline"] is not None:
            assert _is_number(row["baseline"]), label
        if row["ratio"] is not None:
            assert _is_number(row["ratio"]), label
        if row["target"]:
            assert isinstance(row["ok"], bool), label
        for party in ("daemon_ms", "agent_ms", "clients_ms"):
            value = row["cpu"][party]
            assert value is None or _is_number(value), (label, party)


def test_rows_with_targets_and_cpu(quick_run: tuple[Any, dict[str, Any]]) -> None:
    _, results = quick_run
    rows = results["rows"]
    targeted = {row["benchmark"] for row in rows if row["target"]}
    # Every benchmark has targets; the client rows' Trio target is another checkout
    # (--compare-tree), so without one only its other loops' rows have a target (checked below,
    # without child processes).
    assert targeted == set(EXPECTED_ROWS), targeted
    # Out-of-process rows account the daemon's CPU beside the clients'.
    for benchmark in ("e2e", "resume", "transcript_cost", "repair_cost"):
        assert any(_is_number(row["cpu"]["daemon_ms"]) for row in rows
                   if row["benchmark"] == benchmark), benchmark


def test_repair_row_counts_loads_and_prompts(quick_run: tuple[Any, dict[str, Any]]) -> None:
    _, results = quick_run
    (row,) = [r for r in results["rows"] if r["benchmark"] == "repair_cost"
              and r["name"].startswith("terminal")]
    assert row["params"]["loads"] == "2"
    assert row["params"]["prompts"] == "1"
    (commit,) = [r for r in results["rows"] if r["name"].startswith("model: repair commit")]
    shared, total = commit["params"]["shared_blocks"].split("/")
    assert shared == total  # the repair shares every unchanged block


def test_table_is_printed(quick_run: tuple[subprocess.CompletedProcess[str], Any]) -> None:
    proc, results = quick_run
    header = proc.stdout.splitlines()[0].split()
    assert tuple(header[:len(TABLE_HEADER) - 1]) == TABLE_HEADER[:-1]
    for row in results["rows"]:
        assert f"{row['benchmark']}: {row['name']}" in proc.stdout
    # Progress goes to stderr, one line per step with the elapsed time.
    assert "load_latency: start" in proc.stderr and "s] " in proc.stderr
    assert "journal: step 8/8 " in proc.stderr  # journal reports each step and trial


# --- the client benchmark's comparison of two checkouts ---------------------------------------------


def _client_rows(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                 results: dict[str, dict[str, Any]]) -> list[Any]:
    """``benchmarks client --compare-tree OTHER --backends trio,asyncio`` with each child's
    results given: ``mine``/``theirs`` on Trio, ``asyncio`` for this checkout on asyncio."""
    other = tmp_path / "other"
    (other / "sdk").mkdir(parents=True)
    runs: list[tuple[Path, str]] = []

    def child(tree: Path, rows: str, sizes: dict[str, int],
              backend: str) -> tuple[dict[str, Any], float]:
        runs.append((tree, backend))
        mine = tree == client_bench.ROOT
        key = "asyncio" if backend == "asyncio" else "mine" if mine else "theirs"
        digest = "digest_mine" if mine else "digest_theirs"
        return {row: {"seconds": [results[row][key]], "events": 10,
                      "digest": results[row].get(f"{digest}_{backend}", results[row][digest])}
                for row in rows.split(",")}, 0.5

    monkeypatch.setattr(client_bench, "_child", child)
    parser = __import__("argparse").ArgumentParser()
    client_bench.add_arguments(parser)
    args = parser.parse_args(["--compare-tree", str(other), "--rows", ",".join(results),
                              "--backends", "trio,asyncio"])
    rows = client_bench.run(Context(quick=True, progress=Progress(enabled=False)), args)
    # The other checkout runs on Trio only: the SDK ran on nothing else before anyio.
    assert sorted(set(runs)) == sorted({(client_bench.ROOT, "trio"),
                                        (client_bench.ROOT, "asyncio"), (other, "trio")})
    return rows


def test_client_compare_is_not_slower_and_needs_equal_digests(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    same = {"blocks": 3, "text_chars": 12}
    rows = _client_rows(monkeypatch, tmp_path, {
        "model_sse": {"mine": 1.0, "theirs": 2.0, "asyncio": 1.5, "digest_mine": same,
                      "digest_theirs": same},
        "replay": {"mine": 3.0, "theirs": 2.0, "asyncio": 4.6, "digest_mine": same,
                   "digest_theirs": same},
        "load_replay": {"mine": 1.0, "theirs": 1.0, "asyncio": 1.0, "digest_mine": same,
                        "digest_theirs": {"blocks": 2, "text_chars": 12},
                        "digest_mine_asyncio": {"blocks": 1, "text_chars": 12}},
    })
    by_row = {row.name: row for row in rows}

    def row(name: str, loop: str) -> Any:
        return by_row[client_bench.row_name(name, loop)]

    assert len(rows) == 6  # each row on each loop
    faster = row("model_sse", "trio")
    assert (faster.ok, faster.ratio, faster.baseline, faster.error) == (True, 0.5, 2000.0, None)
    slower = row("replay", "trio")
    assert (slower.ok, slower.ratio, slower.error) == (False, 1.5, None)
    different = row("load_replay", "trio")
    assert different.error is not None and "different results" in different.error
    # asyncio against this checkout's Trio row of the same run: at most 1.5x.
    on_asyncio = row("model_sse", "asyncio")
    assert (on_asyncio.ok, on_asyncio.ratio, on_asyncio.baseline) == (True, 1.5, 1000.0)
    assert "1.5x" in on_asyncio.target
    too_slow = row("replay", "asyncio")
    assert too_slow.ok is False and too_slow.ratio == pytest.approx(4.6 / 3.0)
    differs = row("load_replay", "asyncio")
    assert differs.error is not None and "different results" in differs.error


# --- the load generator's frame counter ----------------------------------------------------------

HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        b"transfer-encoding: chunked\r\n\r\n")
FRAMES = [b"retry: 3000\n\n"] + [
    b'id: %d\nevent: session_update\ndata: {"id":%d,"v":1,"type":"session_update"}\n\n' % (i, i)
    for i in range(1, 40)
] + [b'id: 40\nevent: turn_complete\ndata: {"id":40,"v":1,"type":"turn_complete"}\n\n']
PAYLOAD = b"".join(FRAMES)


def _chunked(payload: bytes, cuts: list[int]) -> bytes:
    """``payload`` as an HTTP/1.1 chunked body, split into chunks at ``cuts`` (which may fall
    inside a frame, even between the two newlines of a separator)."""
    bounds = [0, *sorted(set(cuts)), len(payload)]
    pieces = [payload[a:b] for a, b in itertools.pairwise(bounds) if b > a]
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


def _feed(counter: SSECounter, raw: bytes, cuts: list[int]) -> None:
    # Like the load generator: every read lands in one reused buffer holding stale bytes.
    buf = bytearray(b"\n" * (len(raw) + 8))
    bounds = [0, *sorted(set(cuts)), len(raw)]
    for a, b in itertools.pairwise(bounds):
        if b > a:
            buf[: b - a] = raw[a:b]
            counter.feed(buf, b - a)


@given(
    chunk_cuts=st.lists(st.integers(1, len(PAYLOAD) - 1), max_size=12),
    read_cuts=st.lists(st.integers(1, len(HEAD) + len(PAYLOAD)), max_size=12),
)
def test_counter_counts_frames_however_the_stream_is_cut(chunk_cuts: list[int],
                                                        read_cuts: list[int]) -> None:
    raw = HEAD + _chunked(PAYLOAD, chunk_cuts)
    counter = SSECounter(b"event: turn_complete\n")
    _feed(counter, raw, [c for c in read_cuts if c < len(raw)])
    assert counter.status == 200
    assert counter.error is None
    assert counter.bytes == len(PAYLOAD)
    assert counter.done and not counter.evicted
    assert counter.ended  # the zero-length last chunk
    assert (counter.first_id, counter.last_id, counter.ids) == (1, 40, 40)
    assert counter.id_error is None and counter.terminal_id == 40


def test_counter_flags_eviction_and_waits_for_its_event() -> None:
    evicted = PAYLOAD[: -len(FRAMES[-1])] + b'event: client_evicted\ndata: {"v":1}\n\n'
    counter = SSECounter(b"event: turn_complete\n")
    _feed(counter, HEAD + _chunked(evicted, []), [])
    assert counter.evicted and not counter.done
    assert counter.ids == len(FRAMES) - 2 and counter.id_error is None  # ids 1..39
    pending = SSECounter(b"event: turn_complete\n")
    open_stream = _chunked(PAYLOAD[: -len(FRAMES[-1])], [100]).removesuffix(b"0\r\n\r\n")
    _feed(pending, HEAD + open_stream, [])
    assert not pending.finished  # no terminal and no end of stream: keep reading
    assert pending.ids == len(FRAMES) - 2 and pending.last_id == 39


def test_counter_reports_an_error_status() -> None:
    counter = SSECounter(b"event: turn_complete\n")
    counter.feed(b"HTTP/1.1 429 Too Many Requests\r\ncontent-length: 9\r\n\r\n{\"x\":1}")
    assert counter.status == 429
    assert counter.error is not None and "429" in counter.error
    assert counter.finished


# --- the delivery check: what a subscriber received against what was published -----------------


def _report(payload: bytes, cuts: list[int] = ()) -> dict[str, Any]:  # type: ignore[assignment]
    counter = SSECounter(b"event: turn_complete\n")
    _feed(counter, HEAD + _chunked(payload, list(cuts)), list(cuts))
    return {"ids": counter.ids, "first_id": counter.first_id, "last_id": counter.last_id,
            "id_error": counter.id_error, "terminal_id": counter.terminal_id,
            "done": counter.done, "evicted": counter.evicted}


@given(cuts=st.lists(st.integers(1, len(PAYLOAD) - 1), max_size=8),
       drop=st.integers(1, 39), duplicate=st.booleans())
def test_a_dropped_or_repeated_frame_is_a_delivery_error(cuts: list[int], drop: int,
                                                          duplicate: bool) -> None:
    assert delivery_problems(_report(PAYLOAD, cuts), 1, 40) == []
    frames = list(FRAMES)
    if duplicate:
        frames.insert(drop + 1, frames[drop])
    else:
        del frames[drop]
    report = _report(b"".join(frames), [c for c in cuts if c < sum(map(len, frames))])
    # Dropping id 1 leaves 2..40, contiguous but short; anything else breaks the sequence.
    assert (report["id_error"] is None) == (drop == 1 and not duplicate)
    with pytest.raises(LoadGenError, match="subscriber 1: "):
        check_delivery([_report(PAYLOAD), report], 1, 40)


def _frames_with_ids(ids: list[bytes]) -> bytes:
    return b"".join(b'id: %b\nevent: session_update\ndata: {"v":1}\n\n' % i for i in ids)


@given(cuts=st.lists(st.integers(1, 2000), max_size=8), swap=st.integers(0, 38))
def test_ids_out_of_order_are_caught_whatever_their_spelling_and_size(cuts: list[int],
                                                                       swap: int) -> None:
    # The counter confirms a read by its ids' spellings; every other read is judged as numbers,
    # so a swap is a gap, a leading zero is the same id, and ids too large to spell ahead work.
    for base in (0, 1 << 40):
        spelled = [b"%d" % (base + i) for i in range(1, 41)]
        frames = _frames_with_ids(spelled)
        report = _report(frames, [c for c in cuts if c < len(frames)])
        assert report["id_error"] is None and report["ids"] == 40
        assert (report["first_id"], report["last_id"]) == (base + 1, base + 40)
        swapped = list(spelled)
        swapped[swap], swapped[swap + 1] = swapped[swap + 1], swapped[swap]
        frames = _frames_with_ids(swapped)
        report = _report(frames, [c for c in cuts if c < len(frames)])
        assert report["id_error"] is not None and report["ids"] == 40
        padded = [b"00" + i if n == swap else i for n, i in enumerate(spelled)]
        frames = _frames_with_ids(padded)
        report = _report(frames, [c for c in cuts if c < len(frames)])
        assert report["id_error"] is None and report["last_id"] == base + 40


def test_a_missing_terminal_or_a_short_stream_is_a_delivery_error() -> None:
    no_terminal = _report(b"".join(FRAMES[:-1]))
    assert no_terminal["id_error"] is None and not no_terminal["done"]
    assert "the terminal never arrived" in delivery_problems(no_terminal, 1, 39)
    # Everything it got was in order, but the bus published one more event than it received.
    assert any("published" in p for p in delivery_problems(_report(PAYLOAD), 1, 41))
    # An evicted subscriber may stop early when the caller allows it, but never skip an id.
    evicted = dict(no_terminal, evicted=True)
    check_delivery([evicted], 1, 40, allow_evicted=True)
    with pytest.raises(LoadGenError):
        check_delivery([evicted], 1, 40)


def test_ids_are_checked_across_a_reconnect() -> None:
    counter = SSECounter(b"event: turn_complete\n")
    first, rest = b"".join(FRAMES[:21]), b"".join(FRAMES[21:])
    counter.feed(HEAD + _chunked(first + b'event: client_evicted\ndata: {"v":1}\n\n', []))
    assert counter.evicted and counter.last_id == 20
    counter.restart()
    counter.feed(HEAD + _chunked(b"retry: 3000\n\n" + rest, []))
    assert counter.reconnects == 1 and counter.done
    assert (counter.first_id, counter.last_id, counter.ids, counter.id_error) == (1, 40, 40, None)
    again = SSECounter(b"event: turn_complete\n")
    again.feed(HEAD + _chunked(first, []))
    again.restart()
    again.feed(HEAD + _chunked(b"".join(FRAMES[20:]), []))  # id 20 replayed twice
    assert again.id_error == "id 20 after id 20"



RESYNC_FRAME = (b'event: state_resync_required\ndata: {"v":1,"type":"state_resync_required",'
                b'"data":{"reason":"ring_evicted","lastDeliveredId":20}}\n\n')


@given(cuts=st.lists(st.integers(1, len(PAYLOAD) - 1), max_size=8))
def test_a_gap_the_daemon_announced_is_told_apart_from_one_it_did_not(cuts: list[int]) -> None:
    # Ids 1..20, then 31..40 (FRAMES[k] has id k): once with a state_resync_required between them, once without.
    announced = b"".join(FRAMES[:21]) + RESYNC_FRAME + b"".join(FRAMES[31:])
    silent = b"".join(FRAMES[:21]) + b"".join(FRAMES[31:])
    for payload, expected in ((announced, "id 31 after id 20 (announced by "
                                          "state_resync_required ring_evicted)"),
                              (silent, "id 31 after id 20")):
        counter = SSECounter(b"event: turn_complete\n")
        raw = HEAD + _chunked(payload, [c for c in cuts if c < len(payload)])
        _feed(counter, raw, [c for c in cuts if c < len(raw)])
        assert counter.id_error == expected
        assert (counter.first_id, counter.last_id, counter.ids) == (1, 40, 30)
        assert counter.done and counter.terminal_id == 40
    # A resync that a later gap does not follow directly announces nothing about that gap.
    late = b"".join(FRAMES[:11]) + RESYNC_FRAME + b"".join(FRAMES[11:21]) + b"".join(FRAMES[31:])
    # The reads end right after id 20, so the gap opens the next read's ids.
    cut = len(late) - len(b"".join(FRAMES[31:]))
    first_read = len(HEAD) + len(b"%x\r\n" % cut) + cut + 2
    counter = SSECounter(b"event: turn_complete\n")
    _feed(counter, HEAD + _chunked(late, [cut]), [first_read])
    assert counter.id_error == "id 31 after id 20"



def test_a_turn_whose_only_faults_are_announced_gaps_is_run_again_and_said_so(
        monkeypatch: pytest.MonkeyPatch) -> None:
    announced = {"id_error": "id 92003 after id 91368 (announced by state_resync_required "
                             "ring_evicted)"}
    silent = {"id_error": "id 31 after id 20"}
    assert evicted_past_ring([{"id_error": None}, announced]) is not None
    assert "1 of 2 subscriber(s)" in (evicted_past_ring([{"id_error": None}, announced]) or "")
    assert evicted_past_ring([announced, silent]) is None  # an unannounced gap: a real fault
    assert evicted_past_ring([{"id_error": None}]) is None

    import benchmarks.e2e as e2e
    ctx = Context(quick=True, progress=Progress(enabled=False))
    good = TurnRun(64, 100, 6400, 1.0, 0, CpuUse(1.0, 1.0, 1.0))
    outcomes: list[BaseException | TurnRun] = [EvictedPastRing("past the ring"), good]

    def fake_turn(*args: Any, **kwargs: Any) -> TurnRun:
        outcome = outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    monkeypatch.setattr(e2e, "measure_turn", fake_turn)
    repeats: dict[int, list[str]] = {}
    assert measure_turn_again(ctx, None, 100, 64, 2048, repeats) is good  # type: ignore[arg-type]
    assert repeats == {64: ["past the ring"]}
    rows = rows_for(ctx, 100, 2048, True, [RawRun(1.0, 1000, CpuUse())],
                    {1: [TurnRun(1, 100, 100, 1.0, 0, CpuUse())], 64: [good]})
    note_repeats(rows, repeats)
    (row,) = [r for r in rows if r.name == "throughput, 64 subscribers"]
    assert "1 turn(s) run again: past the ring" in row.notes
    # Past the last attempt, or on any other delivery fault, the error stands.
    outcomes[:] = [EvictedPastRing(f"try {i}") for i in range(e2e.TURN_ATTEMPTS)]
    with pytest.raises(EvictedPastRing, match=f"try {e2e.TURN_ATTEMPTS - 1}"):
        measure_turn_again(ctx, None, 100, 64, 2048, {})  # type: ignore[arg-type]
    outcomes[:] = [LoadGenError("id 31 after id 20")]
    with pytest.raises(LoadGenError, match="id 31 after id 20"):
        measure_turn_again(ctx, None, 100, 64, 2048, {})  # type: ignore[arg-type]


def test_a_count_evicted_past_the_ring_in_every_attempt_is_an_error_row_and_the_rest_run_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A subscriber count that gives no figure in TURN_ATTEMPTS attempts stops being measured:
    its row is an ERROR with the reason (earlier trials' rates only in a note), while the other
    counts keep all their trials and the rows computed from them; an unannounced gap still
    fails the whole benchmark."""
    import argparse
    import contextlib

    import benchmarks.e2e as e2e
    calls: list[tuple[int, int]] = []  # (subscribers, trial) of every measured turn
    trial = [-1]

    def fake_raw(chunks: int) -> RawRun:
        trial[0] += 1
        return RawRun(1.0, 10 * chunks, CpuUse(1.0, 1.0, 1.0))

    def fake_turn(daemon: Any, chunks: int, subscribers: int, max_queued: int = 2048,
                  timeout: float = 600.0) -> TurnRun:
        if trial[0] < 0:  # the warm-up turn
            return TurnRun(1, chunks, chunks, 1.0, 0, CpuUse())
        calls.append((subscribers, trial[0]))
        if subscribers == 64 and trial[0] == 1:
            raise EvictedPastRing(f"past the ring, trial {trial[0]}")
        return TurnRun(subscribers, chunks, chunks * subscribers, 1.0 + trial[0], 0,
                       CpuUse(1.0, 1.0, 1.0))

    monkeypatch.setattr(e2e, "start_daemon", lambda **kwargs: contextlib.nullcontext())
    monkeypatch.setattr(e2e, "agent_raw_emission", fake_raw)
    monkeypatch.setattr(e2e, "measure_turn", fake_turn)
    ctx = Context(quick=True, progress=Progress(enabled=False), trials_override=3)
    args = argparse.Namespace(chunks=100, subscribers="1,8,64", max_queued=2048,
                              no_persistence=False, no_ceiling=True)
    listed = e2e.run(ctx, args)
    rows = {row.name: row for row in listed}
    assert len(rows) == len(listed)  # one row each: no figure of the failed count beside its error
    # 64 was tried once in trial 0, TURN_ATTEMPTS times in trial 1, never in trial 2.
    assert [t for n, t in calls if n == 64] == [0] + [1] * e2e.TURN_ATTEMPTS
    assert [t for n, t in calls if n in (1, 8)] == [0, 0, 1, 1, 2, 2]
    failed = rows["throughput, 64 subscribers"]
    assert failed.verdict == "ERROR" and failed.value is None and failed.samples == []
    assert failed.error is not None and "past the ring, trial 1" in failed.error
    assert f"{e2e.TURN_ATTEMPTS} attempts in trial 2" in failed.error
    assert any("6,400 events/s" in note for note in failed.notes)  # trial 0, for information
    assert any(f"{e2e.TURN_ATTEMPTS - 1} turn(s) run again" in note for note in failed.notes)
    eight = rows["throughput, 8 subscribers"]
    assert eight.samples == [800.0, 400.0, 800 / 3] and eight.verdict != "ERROR"
    assert rows["throughput, 1 subscriber"].samples == [100.0, 50.0, 100 / 3]
    assert "fan-out the daemon's measured costs allow, 8 subscribers" in rows
    # An unannounced gap is a delivery fault: the benchmark fails as a whole.
    trial[0] = -1
    calls.clear()

    def broken_turn(daemon: Any, chunks: int, subscribers: int, max_queued: int = 2048,
                    timeout: float = 600.0) -> TurnRun:
        if trial[0] >= 0 and subscribers == 8:
            raise LoadGenError("id 31 after id 20")
        return fake_turn(daemon, chunks, subscribers, max_queued, timeout)

    monkeypatch.setattr(e2e, "measure_turn", broken_turn)
    with pytest.raises(LoadGenError, match="id 31 after id 20"):
        e2e.run(ctx, args)


# --- the journal benchmark's pipeline check and its ERROR rows ------------------------------------


def test_a_pipeline_that_did_not_run_is_an_error() -> None:
    bus = SessionBus("s", BusLimits(10_000, 8 * 1024 * 1024, 4 * 1024 * 1024, 8000), None)
    bus.publish(SessionUpdateData(session_id="s", update={
        "sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "x"}}))
    with pytest.raises(RuntimeError, match="ring last id 1, 3 events published"):
        check_pipeline_ran(bus, 3)
    with pytest.raises(RuntimeError, match="did not reset the live journal"):
        check_pipeline_ran(bus, 1)
    (row,) = journal_rows([{"benchmark": "pipeline: x", "events": 3, "events_per_s": None,
                            "targets": [], "error": "RuntimeError: boom"}], CpuUse(), True)
    assert row.verdict == "ERROR" and row.error == "RuntimeError: boom"


def _budget(agent_rate: float, ceiling8: list[float]) -> Any:
    ctx = Context(quick=True, progress=Progress(enabled=False))
    raw = [RawRun(1.0, round(agent_rate), CpuUse())]
    ceilings = {8: [TurnRun(8, 100, round(rate), 1.0, 0, CpuUse()) for rate in ceiling8]}
    return targets_budget_row(ctx, 100, raw, ceilings)


def test_targets_budget_row_computes_what_both_targets_need_against_the_ceiling() -> None:
    # 6 x 0.15 x 2,000,000 = 1,800,000 events/s to 8 subscribers.
    row = _budget(2_000_000, [1_500_000, 1_600_000, 1_700_000])
    assert row.value == pytest.approx(1_800_000)
    assert row.baseline == 1_600_000  # the median ceiling
    assert row.ratio == pytest.approx(1_800_000 / 1_600_000)
    assert row.ok is None and row.target == ""  # informational: no verdict
    assert "exceed" in row.notes[0] and "1,800,000" in row.notes[0]
    room = _budget(1_000_000, [1_600_000])
    assert room.value == pytest.approx(900_000) and room.ratio < 1
    assert "fit under" in room.notes[0]


def test_targets_budget_row_needs_an_8_subscriber_ceiling() -> None:
    ctx = Context(quick=True, progress=Progress(enabled=False))
    raw = [RawRun(1.0, 1000, CpuUse())]
    assert targets_budget_row(ctx, 100, raw, {1: [], 8: []}) is None


def _cores(agent_us: float, bare1_us: float, bare8_us: float, agent_rate: float) -> Any:
    """The CPU-budget row from one 1-subscriber daemon turn and one bare turn at 1 and at 8
    subscribers of 1,000,000 delivered events each, CPU given per event in microseconds."""
    ctx = Context(quick=True, progress=Progress(enabled=False))
    raw = [RawRun(1.0, round(agent_rate), CpuUse())]
    runs = {1: [TurnRun(1, 1_000_000, 1_000_000, 1.0, 0, CpuUse(1.0, agent_us * 1000, 1.0))]}
    ceilings = {
        1: [TurnRun(1, 1_000_000, 1_000_000, 1.0, 0, CpuUse(bare1_us * 1000, None, 1.0))],
        # Server and client CPU split evenly: the row adds them.
        8: [TurnRun(8, 125_000, 1_000_000, 1.0, 0,
                    CpuUse(bare8_us * 500, None, bare8_us * 500))]}
    return cpu_budget_row(ctx, 100, raw, runs, ceilings, cores=2)


def test_cpu_budget_row_adds_up_what_the_targets_ask_of_the_cores() -> None:
    # Agent raw 1,000,000/s: 900,000/s to 8 subscribers, 112,500/s taken in. Agent 0.5 us,
    # daemon at the 10x target 5 us less 0.5 us for one delivery: 112,500 x (4.5 + 0.5) us
    # = 0.5625 cores; deliveries 900,000 x 1 us = 0.9 cores; 1.4625 of 2.
    row = _cores(agent_us=0.5, bare1_us=0.5, bare8_us=1.0, agent_rate=1_000_000)
    assert row.value == pytest.approx(1.4625)
    assert row.baseline == 2 and row.ratio == pytest.approx(1.4625 / 2)
    assert row.ok is None and row.target == ""  # informational: no verdict
    # Fits at daemon CPU (2 - 0.9) / 112,500 - 0.5 + 0.5 = 9.78 us = 19.6x the agent.
    assert "<= 19.6x the agent's" in row.notes[0]
    # Deliveries that alone need more than the cores: no ratio can fit.
    full = _cores(agent_us=0.5, bare1_us=0.5, bare8_us=2.5, agent_rate=1_000_000)
    assert full.value == pytest.approx(0.5625 + 2.25) and full.ratio > 1
    assert "delivery alone fills the cores" in full.notes[0]


def test_cpu_budget_row_needs_both_ceilings_and_the_agents_cpu() -> None:
    ctx = Context(quick=True, progress=Progress(enabled=False))
    raw = [RawRun(1.0, 1000, CpuUse())]
    turn = TurnRun(1, 100, 100, 1.0, 0, CpuUse(1.0, 1.0, 1.0))
    assert cpu_budget_row(ctx, 100, raw, {1: [turn]}, {1: [turn], 8: []}) is None
    for agent_ms in (None, 0.0):  # not measured, or too small to register
        no_agent = TurnRun(1, 100, 100, 1.0, 0, CpuUse(1.0, agent_ms, 1.0))
        row = cpu_budget_row(ctx, 100, raw, {1: [no_agent]}, {1: [turn], 8: [turn]}, cores=2)
        assert row is not None and row.value is None and row.ok is None
        assert "too small to measure" in row.notes[0]


def _model(c1_us: float, c8_us: float, bare: tuple[float, float] | None = None,
           floor: tuple[float, float] | None = None) -> Any:
    """The fan-out model row from one daemon turn at 1 and at 8 subscribers of 1,000,000
    events taken in each (and optionally bare Hypercorn's, and the Trio socket floor's),
    server CPU given per event taken in, in microseconds."""
    ctx = Context(quick=True, progress=Progress(enabled=False))

    def turn(n: int, us: float) -> TurnRun:
        return TurnRun(n, 1_000_000, n * 1_000_000, 1.0, 0, CpuUse(us * 1000, 1.0, 1.0))

    def pair(costs: tuple[float, float] | None) -> dict[int, list[TurnRun]]:
        return {} if costs is None else {1: [turn(1, costs[0])], 8: [turn(8, costs[1])]}

    runs = {1: [turn(1, c1_us)], 8: [turn(8, c8_us)]}
    return fanout_model_row(ctx, 100, runs, pair(bare), pair(floor))


def test_fanout_model_row_derives_the_ratio_from_ingest_and_delivery_costs() -> None:
    # 4 us at 1 subscriber, 7.5 at 8: each delivery 0.5 us, ingest 3.5 us; 8 x 4 / (3.5 + 4).
    row = _model(4.0, 7.5, bare=(0.5, 3.5))
    assert row.value == pytest.approx(32 / 7.5)
    assert row.baseline == 6 and row.ratio == pytest.approx(32 / 7.5 / 6)
    assert row.ok is None and row.target == ""  # informational: no verdict
    note = row.notes[0]
    assert "ingest 3.50 us + 0.50 us per delivery (I/d = 7.0)" in note
    assert "7.21x at 64" in note  # 64 x 4 / (3.5 + 32)
    assert "needs I/d >= 20 and 16x at 64 >= 20" in note
    # 3.5 / 20 = 0.175 us against bare Hypercorn's (3.5 - 0.5) / 7 = 0.43 us: 0.41x of it.
    assert "at most 0.17 us" in note and "costs 0.43 us" in note and "0.41x of it" in note
    assert "no HTTP server" not in note  # no floor measured
    # The floor: 0.4 us at 1 subscriber, 2.5 at 8, so (2.5 - 0.4) / 7 = 0.30 us a delivery,
    # and the targets' 0.175 us is 0.58x of it.
    floored = _model(4.0, 7.5, bare=(0.5, 3.5), floor=(0.4, 2.5)).notes[0]
    assert "with no HTTP server (a Trio socket) it costs 0.30 us, so 0.58x of that" in floored
    # At I/d = 20 the model sits exactly on both targets.
    edge = _model(2.1, 2.8)
    assert edge.value == pytest.approx(6.0)
    assert "16.00x at 64" in edge.notes[0] and "bare Hypercorn" not in edge.notes[0]


def test_fanout_model_row_needs_both_turns_and_a_delivery_cost() -> None:
    ctx = Context(quick=True, progress=Progress(enabled=False))
    one = TurnRun(1, 100, 100, 1.0, 0, CpuUse(1.0, 1.0, 1.0))
    assert fanout_model_row(ctx, 100, {1: [one]}, {}) is None
    no_cpu = TurnRun(8, 100, 800, 1.0, 0, CpuUse(None, 1.0, 1.0))
    assert fanout_model_row(ctx, 100, {1: [one], 8: [no_cpu]}, {}) is None
    flat = _model(4.0, 3.9)  # deliveries too cheap to see against the noise
    assert flat.value is None and "too small to model" in flat.notes[0]


_BURN = """
import sys, threading, time
def burn():
    total = 0
    for i in range(2_000_000):
        total += i
worker = threading.Thread(target=burn)
worker.start()
worker.join()
burn()
print(time.process_time(), flush=True)
sys.stdin.read()
"""


def test_process_cpu_counts_every_thread_to_the_nanosecond() -> None:
    """The CPU figures of the daemon and the agents: a thread that has ended still counts, and
    the reading is the process's own CPU clock, not a count of 10 ms ticks."""
    child = subprocess.Popen([sys.executable, "-c", _BURN], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        own = float(child.stdout.readline())  # the child's CPU, both threads, by itself
        seen = process_cpu_seconds(child.pid)
        assert seen is not None
        # The child only prints and blocks after reading its clock: the two readings agree.
        assert own <= seen < own + 0.05
        assert seen * 100 != round(seen * 100)  # not a whole number of ticks
    finally:
        child.communicate("")
    assert process_cpu_seconds(child.pid) is None  # reaped: gone


def _dechunked(stream: bytes) -> bytes:
    """The body of an HTTP/1.1 response with chunked transfer encoding, up to its last chunk
    (asserted to be there)."""
    head, _, rest = stream.partition(b"\r\n\r\n")
    assert b"transfer-encoding: chunked" in head.lower(), head
    body = b""
    while True:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            return body
        body, rest = body + rest[:size], rest[size + 2:]


_UUID = re.compile(rb"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_TIMESTAMP = re.compile(rb'"serverTimestamp":[0-9]+')


def _masked(stream: bytes) -> bytes:
    return _TIMESTAMP.sub(b'"serverTimestamp":0', _UUID.sub(b"<uuid>", stream))


def _ceiling_stream(server_kind: str, chunks: int) -> bytes:
    """Everything one subscriber of ``benchmarks.ceiling --server server_kind`` reads of a
    ``chunks``-chunk turn: the GET opened first, then the turn started, read to the last
    chunk."""
    import socket

    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.ceiling", "--chunks", str(chunks),
                             "--server", server_kind], cwd=ROOT, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        assert line.startswith("listening on http://127.0.0.1:"), line
        port = int(line.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sub:
            sub.sendall(b"GET /events HTTP/1.1\r\nHost: x\r\n\r\n")
            received = b""
            while b"retry: 3000" not in received:  # the stream is open: start the turn
                more = sub.recv(65536)
                assert more, f"the stream closed before it opened: {received!r}"
                received += more
            with socket.create_connection(("127.0.0.1", port), timeout=30) as start:
                start.sendall(b"POST /start HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
                assert start.recv(4096).startswith(b"HTTP/1.1 204")
            while not received.endswith(b"\r\n0\r\n\r\n"):
                more = sub.recv(65536)
                assert more, "the stream closed before its last chunk"
                received += more
        return received
    finally:
        proc.kill()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


def test_the_trio_socket_floor_writes_what_bare_hypercorn_writes() -> None:
    # The floor is only a floor for the ceiling's write pattern if the client reads the same
    # SSE bytes from both: same frames, same order, the terminal last.
    chunks = 300
    hypercorn, trio_socket = (_dechunked(_ceiling_stream(kind, chunks))
                              for kind in ("hypercorn", "trio"))
    # Each server process makes its own session and prompt ids and timestamp: the same length
    # in every turn, so the bytes match once those are masked.
    assert len(trio_socket) == len(hypercorn)
    assert _masked(trio_socket) == _masked(hypercorn)
    ids = [int(line[4:]) for line in trio_socket.split(b"\n") if line.startswith(b"id: ")]
    assert ids == list(range(1, chunks + 2))
    assert b"event: turn_complete" in trio_socket.rsplit(b"\n\n", 2)[-2]
