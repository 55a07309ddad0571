"""Live-journal benchmark: append throughput empty vs at the caps, and the publish pipeline.

Run ``python -m benchmarks.journal [--quick]``; a harness calls :func:`run`. Each figure is the
median of several trials timed with ``time.perf_counter``; baselines are measured in the same
run so the ratios survive a slow or busy machine better than the absolute rates do.

Targets:

* ``LiveJournal.append`` at the caps (10,000 entries / 8 MiB prefilled) >= 300,000 events/s;
* at-cap cost within 1.3x of the cost on an empty journal;
* the publish pipeline, the daemon's own ``SessionBus.publish_updates`` (the path of agent
  updates: envelope + event ring + both live journals + compactor, no transcript writer, no
  subscriber) >= 100,000 events/s.

"Empty" appends go into fresh journals in batches of at most ``maxEvents`` events, so nothing is
ever evicted; "at caps" starts from a journal holding 10,000 unmergeable entries that add up to
just under 8 MiB, so every append pays for eviction. "cost vs deque" is the time per event over
that of ``collections.deque(maxlen=10000).append`` of the same pre-encoded events. The pipeline
rows build a ``SessionBus`` with the daemon's default limits and a fixed clock, publish the turn
as the agent reader does and end it with ``publish_terminal`` (compaction into the replay window,
journal reset); afterwards each trial's bus is checked to have gone through the whole turn. The
transcript's cost is measured out of process by ``transcript_cost``.

Nothing is ever replaced by a stand-in: if the daemon's code cannot be imported the benchmark
fails, and a pipeline that cannot run or fails its check is an ERROR row (``error`` set, no
figure), so no row can pass under the name of code that did not run.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from daemon.bus import BusLimits, SessionBus
from daemon.core.envelope import Event, encode_json, typed_event
from daemon.core.live_journal import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_EVENTS,
    LiveJournal,
    LiveJournals,
)
from daemon.core.updates import UpdateBatch
from sdk.protocol.events import SessionUpdateData, TurnCompleteData

SESSION = "6f1d2c3b-4a59-4e68-8f7a-0b1c2d3e4f50"
PROMPT = "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d"
CLIENT = "client_3c4d5e6f-7a8b-4c9d-8e0f-1a2b3c4d5e6f"
NOW_MS = 1_796_204_622_728

APPEND_TARGET = 300_000.0
CAP_RATIO_TARGET = 1.3
PIPELINE_TARGET = 100_000.0

Row = dict[str, Any]
# A trial: build the state (untimed), return the timed loop.
Trial = Callable[[], Callable[[], None]]


class _Appender(Protocol):
    def append(self, event: Event, /) -> None: ...


# --- workloads ---------------------------------------------------------------------------------


def _chunk_data(kind: str, text: str) -> SessionUpdateData:
    return SessionUpdateData(
        session_id=SESSION,
        update={"sessionUpdate": kind, "content": {"type": "text", "text": text}},
    )


def _event(event_id: int, payload: SessionUpdateData) -> Event:
    event = typed_event(
        event_id,
        payload,
        now_ms=NOW_MS + event_id,
        prompt_id=PROMPT,
        originator_client_id=CLIENT,
    )
    if event is None:  # pragma: no cover - the workloads are plain JSON
        raise RuntimeError(f"benchmark event {event_id} could not be encoded")
    return event


def merged_stream(n: int) -> list[Event]:
    """Mergeable ``agent_message_chunk`` events, about 350 bytes each like the mock agent's."""
    return [_event(i, _chunk_data("agent_message_chunk", f"chunk-{i}")) for i in
            range(1, n + 1)]


def alternating_stream(n: int) -> list[Event]:
    """Chunk kinds alternate, so every event is fully inspected and none merges."""
    kinds = ("agent_message_chunk", "agent_thought_chunk")
    return [_event(i, _chunk_data(kinds[i % 2], f"chunk-{i}")) for i in
            range(1, n + 1)]


def user_stream(n: int) -> list[Event]:
    """``user_message_chunk`` events: rejected for merging at the first look."""
    return [_event(i, _chunk_data("user_message_chunk", f"chunk-{i}")) for i in
            range(1, n + 1)]


def prefill_events(max_events: int, max_bytes: int) -> list[Event]:
    """``max_events`` unmergeable events whose sizes add up to just under ``max_bytes``, so a
    journal fed them sits at both caps at once."""
    target = max_bytes // max_events
    probe = _event(1, _chunk_data("user_message_chunk", ""))
    pad = "p" * max(0, target - probe.size - 4)  # room for ids up to 5 digits
    events = [
        _event(i, _chunk_data("user_message_chunk", pad))
        for i in range(1, max_events + 1)
    ]
    if sum(e.size for e in events) > max_bytes:  # pragma: no cover - arithmetic guard
        raise RuntimeError("prefill overshoots the byte cap")
    return events


def mixed_turn_data(n: int) -> list[SessionUpdateData]:
    """A realistic turn: user echo, then repeating blocks of thought, tool and message frames."""
    items: list[SessionUpdateData] = [
        _chunk_data("user_message_chunk", "please refactor the parser"),
    ]
    block = 0
    while len(items) < n:
        tool = f"call_{block}"
        items.extend(
            _chunk_data("agent_thought_chunk", f"thinking {block}.{k} ")
            for k in range(4)
        )
        items.append(SessionUpdateData(session_id=SESSION, update={
            "sessionUpdate": "tool_call", "toolCallId": tool, "title": "Read parser.py",
            "kind": "read", "status": "pending"}))
        items.append(SessionUpdateData(session_id=SESSION, update={
            "sessionUpdate": "tool_call_update", "toolCallId": tool, "status": "completed",
            "content": [{"type": "content", "content": {"type": "text", "text": "ok"}}]}))
        items.extend(
            _chunk_data("agent_message_chunk", f"word{block}.{k} ")
            for k in range(14)
        )
        block += 1
    return items[:n]


# --- timing ------------------------------------------------------------------------------------


Report = Callable[[str], None]


def _quiet(message: str) -> None:
    del message


def _timed(trial: Trial) -> float:
    loop = trial()
    gc.collect()
    start = time.perf_counter()
    loop()
    return time.perf_counter() - start


def _median_seconds(trial: Trial, trials: int, report: Report = _quiet,
                    label: str = "") -> float:
    times: list[float] = []
    for i in range(trials):
        times.append(_timed(trial))
        report(f"{label}: trial {i + 1}/{trials} {times[-1] * 1000:.0f} ms")
    return statistics.median(times)


def _paired_medians(a: Trial, b: Trial, trials: int, report: Report = _quiet,
                    label: str = "") -> tuple[float, float]:
    """Interleave the trials of two variants so machine noise hits both alike."""
    times_a: list[float] = []
    times_b: list[float] = []
    for i in range(trials):
        times_a.append(_timed(a))
        times_b.append(_timed(b))
        report(f"{label}: trial {i + 1}/{trials} empty {times_a[-1] * 1000:.0f} ms, "
               f"at caps {times_b[-1] * 1000:.0f} ms")
    return statistics.median(times_a), statistics.median(times_b)


def _append_loop(target: _Appender, events: Sequence[Event]) -> Callable[[], None]:
    append = target.append

    def loop() -> None:
        for event in events:
            append(event)

    return loop


def _empty_trial(events: Sequence[Event], pair: bool = False) -> Trial:
    """Append into a fresh journal in batches of at most ``maxEvents`` so nothing is evicted."""
    batch = DEFAULT_MAX_EVENTS
    batches = [events[i : i + batch] for i in range(0, len(events), batch)]

    def setup() -> Callable[[], None]:
        journals = [LiveJournals() if pair else LiveJournal() for _ in batches]
        loops = [_append_loop(j, b) for j, b in zip(journals, batches, strict=True)]

        def loop() -> None:
            for each in loops:
                each()

        return loop

    return setup


def _at_cap_trial(events: Sequence[Event], prefill: Sequence[Event], pair: bool = False) -> Trial:
    def setup() -> Callable[[], None]:
        journal: LiveJournal | LiveJournals = LiveJournals() if pair else LiveJournal()
        for event in prefill:
            journal.append(event)
        full = journal.full if isinstance(journal, LiveJournals) else journal
        if full.entry_count != DEFAULT_MAX_EVENTS:  # pragma: no cover - setup guard
            raise RuntimeError("prefill did not reach the entry cap")
        return _append_loop(journal, events)

    return setup


# --- the publish pipeline ----------------------------------------------------------------------


def _bus_limits() -> BusLimits:
    """The daemon's default limits."""
    return BusLimits(DEFAULT_MAX_EVENTS, DEFAULT_MAX_BYTES, 4 * 1024 * 1024, 8000)


def _pipeline_trial(items: Sequence[SessionUpdateData],
                    buses: list[SessionBus] | None = None) -> Trial:
    """One turn through the daemon's own publish path for agent updates,
    ``SessionBus.publish_updates`` (plain text chunks spliced into an envelope template, every
    other update decoded and published like ``SessionBus.publish``; the event ring, both live
    journals, the compactor; no transcript writer and no subscriber), ending with
    ``publish_terminal`` (compaction into the replay window, journal reset). The updates are
    handed over as the agent channel does, as the agent's JSON bytes in batches (of 256 here),
    each batch followed by a flush."""
    terminal = TurnCompleteData(session_id=SESSION, stop_reason="end_turn", prompt_id=PROMPT)
    # The agent's bytes of each update, encoded once outside the timed loop (the agent wrote
    # them; the daemon receives them).
    updates = [encode_json(item.update) for item in items]
    batches = [updates[i:i + 256] for i in range(0, len(updates), 256)]

    def setup() -> Callable[[], None]:
        bus = SessionBus(SESSION, _bus_limits(), None, clock_ms=lambda: NOW_MS)
        if buses is not None:
            buses.append(bus)

        def loop() -> None:
            publish_updates = bus.publish_updates
            of = UpdateBatch.of  # what the agent channel's read finds (here: not timed apart)
            for batch in batches:
                publish_updates(of(batch), prompt_id=PROMPT, originator_client_id=CLIENT)
            bus.publish_terminal(terminal, prompt_id=PROMPT,
                                 originator_client_id=CLIENT, ledger_terminal="completed",
                                 stop_reason="end_turn")

        return loop

    return setup


def check_pipeline_ran(bus: SessionBus, published: int) -> None:
    """Raise unless ``bus`` went through a whole turn of ``published`` events (terminal
    included) with the real components: every id in order, the live journals reset by the
    terminal, one compacted segment in the replay window. A benchmark of a pipeline that did
    not run is an error, never a figure."""
    problems: list[str] = []
    if bus.ring.last_id != published:
        problems.append(f"ring last id {bus.ring.last_id}, {published} events published")
    if bus.degraded:
        problems.append("the compactor failed (replay degraded)")
    if bus.journals.full.entry_count != 0:
        problems.append("the terminal did not reset the live journal")
    if not bus.window.snapshot(full_transcript_available=False):
        problems.append("the replay window holds no compacted turn")
    if problems:
        raise RuntimeError("publish pipeline check failed: " + "; ".join(problems))


# --- report ------------------------------------------------------------------------------------


def _row(
    name: str,
    n: int,
    seconds: float,
    baseline_seconds: float | None = None,
    empty_seconds: float | None = None,
    targets: Sequence[tuple[str, bool]] = (),
    note: str = "",
) -> Row:
    return {
        "benchmark": name,
        "events": n,
        "events_per_s": n / seconds,
        "cost_vs_deque": seconds / baseline_seconds if baseline_seconds else None,
        "cap_vs_empty": seconds / empty_seconds if empty_seconds else None,
        "targets": [{"target": t, "ok": ok} for t, ok in targets],
        "note": note,
        "error": None,
    }


def _error_row(name: str, n: int, exc: BaseException) -> Row:
    return {"benchmark": name, "events": n, "events_per_s": None, "cost_vs_deque": None,
            "cap_vs_empty": None, "targets": [], "note": "",
            "error": f"{type(exc).__name__}: {exc}"}


def run(quick: bool, report: Report = _quiet) -> list[Row]:
    """Measure everything and return one row per benchmark; ``report`` gets a progress line
    per step and per trial (``python -m benchmarks`` prints them with the elapsed time).

    Row keys: ``benchmark`` (name), ``events`` (per trial), ``events_per_s`` (median trial),
    ``cost_vs_deque`` and ``cap_vs_empty`` (time ratios, ``None`` where not applicable),
    ``targets`` (list of ``{"target": str, "ok": bool}``), ``note`` and ``error`` (``None``, or
    why the row's real code could not run; ``events_per_s`` is then ``None``).
    """
    n = 10_000 if quick else 100_000
    trials = 3 if quick else 5
    report(f"building {n:,}-event inputs and the {DEFAULT_MAX_EVENTS:,}-event prefill")
    merged = merged_stream(n)
    alternating = alternating_stream(n)
    users = user_stream(n)
    prefill = prefill_events(DEFAULT_MAX_EVENTS, DEFAULT_MAX_BYTES)
    chunk_items = [_chunk_data("agent_message_chunk", f"chunk-{i}") for i in range(1, n + 1)]
    mixed_items = mixed_turn_data(n)
    # The pre-built inputs are several hundred thousand dicts a real daemon never holds at once;
    # freezing them keeps the cyclic GC from rescanning them and billing that to the code
    # under test. Everything the measured code allocates is still collected normally.
    gc.collect()
    gc.freeze()
    try:
        return _measure(n, trials, merged, alternating, users, prefill, chunk_items, mixed_items,
                        report)
    finally:
        gc.unfreeze()


def _measure(
    n: int,
    trials: int,
    merged: list[Event],
    alternating: list[Event],
    users: list[Event],
    prefill: list[Event],
    chunk_items: list[SessionUpdateData],
    mixed_items: list[SessionUpdateData],
    report: Report = _quiet,
) -> list[Row]:
    rows: list[Row] = []
    steps = 8
    step = iter(range(1, steps + 1))

    def label(name: str) -> str:
        return f"step {next(step)}/{steps} {name}"

    def deque_trial() -> Callable[[], None]:
        return _append_loop(deque(maxlen=DEFAULT_MAX_EVENTS), merged)

    envs = [event.env for event in merged]

    def encode_trial() -> Callable[[], None]:
        sink: deque[bytes] = deque(maxlen=DEFAULT_MAX_EVENTS)
        append = sink.append
        encode = encode_json

        def loop() -> None:
            for env in envs:
                append(encode(env))

        return loop

    base = _median_seconds(deque_trial, trials, report, label("deque.append baseline"))
    rows.append(_row("baseline: deque(maxlen=10000).append", n, base, base))
    rows.append(_row("baseline: msgspec encode + deque append", n,
                     _median_seconds(encode_trial, trials, report,
                                     label("msgspec encode baseline")), base))

    for variant, events in (
        ("merged chunks", merged),
        ("unmerged, alternating kinds", alternating),
        ("unmerged, user_message_chunk", users),
    ):
        empty, at_cap = _paired_medians(
            _empty_trial(events), _at_cap_trial(events, prefill), trials, report,
            label(f"LiveJournal.append, {variant}"),
        )
        ratio = at_cap / empty
        rows.append(_row(f"LiveJournal.append empty, {variant}", n, empty, base))
        rows.append(_row(
            f"LiveJournal.append at caps, {variant}", n, at_cap, base, empty,
            targets=[
                (">= 300,000/s at caps", n / at_cap >= APPEND_TARGET),
                ("at-cap <= 1.3x empty", ratio <= CAP_RATIO_TARGET),
            ],
        ))

    empty, at_cap = _paired_medians(
        _empty_trial(merged, pair=True), _at_cap_trial(merged, prefill, pair=True), trials,
        report, label("LiveJournals.append (full+summary)"),
    )
    rows.append(_row("LiveJournals.append (full+summary) empty, merged", n, empty, base))
    rows.append(_row("LiveJournals.append (full+summary) at caps, merged", n, at_cap, base,
                     empty))

    for kind, items in (("chunk stream", chunk_items), ("mixed turn", mixed_items)):
        name = f"pipeline: SessionBus.publish_updates (ring+journals+compactor), {kind}"
        buses: list[SessionBus] = []
        try:
            seconds = _median_seconds(_pipeline_trial(items, buses), trials, report,
                                      label(f"pipeline, {kind}"))
            for bus in buses:
                check_pipeline_ran(bus, n + 1)
        except Exception as exc:  # the real pipeline did not run: an ERROR row, no figure
            rows.append(_error_row(name, n + 1, exc))
            continue
        rows.append(_row(
            name, n + 1, seconds, base,
            targets=[(">= 100,000/s pipeline", (n + 1) / seconds >= PIPELINE_TARGET)],
            note="daemon.bus.SessionBus, default limits, no transcript writer, no subscriber",
        ))
    return rows


def format_table(rows: Sequence[Row]) -> str:
    """A fixed-width table: benchmark, events/s, cost vs deque, at-cap/empty, targets."""
    header = ("benchmark", "events/s", "cost vs deque", "cap/empty", "targets")
    lines: list[tuple[str, ...]] = [header]
    for row in rows:
        if row["error"] is not None:
            lines.append((row["benchmark"], "-", "", "", f"ERROR: {row['error']}"))
            continue
        cost = row["cost_vs_deque"]
        cap = row["cap_vs_empty"]
        targets = "; ".join(
            f"{t['target']}: {'PASS' if t['ok'] else 'MISS'}" for t in row["targets"]
        )
        lines.append((
            row["benchmark"],
            f"{row['events_per_s']:,.0f}",
            f"{cost:.1f}x" if cost is not None else "",
            f"{cap:.2f}x" if cap is not None else "",
            targets,
        ))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header) - 1)]
    out = []
    for index, line in enumerate(lines):
        cells = [
            line[0].ljust(widths[0]),
            *(cell.rjust(width) for cell, width in zip(line[1:-1], widths[1:], strict=True)),
            line[-1],
        ]
        out.append("  ".join(cells).rstrip())
        if index == 0:
            out.append("-" * len(out[0]))
    notes = sorted({row["note"] for row in rows if row["note"]})
    out.extend(f"note: {note}" for note in notes)
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.journal", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer events, 3 trials (< 5 s)")
    args = parser.parse_args(argv)
    rows = run(args.quick)
    print(format_table(rows))
    missed = [t for row in rows for t in row["targets"] if not t["ok"]]
    errors = [row for row in rows if row["error"] is not None]
    return 1 if missed or errors else 0


if __name__ == "__main__":
    sys.exit(main())
