"""``python -m webui_model.demo`` (``make demo``): a truncated live turn and its repair, step by step.

It starts a daemon on a free loopback port with a temporary data directory and tiny live-journal
caps, runs one 20-chunk turn of the bundled mock agent that overflows the live journal and is held
open by the mock's gate file, shows the mid-turn load the WebUI model takes (the
``history_truncated`` marker and its status text), then releases the gate and shows the model's
repair after the terminal: one more load, no new agent prompt, every chunk shown once.

The daemon runs in its own process group and is stopped with SIGTERM at the end, on Ctrl-C and on
SIGTERM/SIGHUP to the demo; the temporary directory is removed in every case. ``--step`` waits
for Enter before releasing the gate.

The demo installs its own handlers for SIGINT, SIGTERM and SIGHUP before it creates anything and
keeps them until it has cleaned up, so a stop signal is never lost nor fatal half-way: not when
the demo was started with SIGINT ignored (a background job of a non-interactive shell inherits
that, and Trio then installs no Ctrl-C handler), not while Trio starts or ends, not a second
signal during the cleanup. The first one stops the demo, which exits with 128 + its number.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any, Final, TextIO

import anyio
from anyio.abc import Process

from sdk._client import DaemonClient
from sdk._lines import LineReader
from sdk._repair_driver import RepairOutcomeKind
from sdk._truncation import LIVE_JOURNAL_SCOPE, parse_truncation, status_text
from sdk.protocol.constants import TERMINAL_TYPES
from sdk.protocol.envelope import DaemonEvent, typed_data
from sdk.protocol.events import (
    AgentMessageChunk,
    AgentThoughtChunk,
    SessionUpdateData,
    UserMessageChunk,
)
from webui_model import Block, MessageBlock, TextBlock, WebUIProvider

__all__ = ["main"]

CAPS: Final = ("--max-journal-events", "3", "--max-journal-bytes", "300")
CHUNKS: Final = 20
# Padding each chunk keeps every chunk event over half the byte cap, so no two chunks merge into
# one journal entry (merged chunks would fit the caps and nothing would be dropped).
CHUNK_BYTES: Final = 120
GATE: Final = "demo"
PROMPT: Final = f"demo mock:chunks={CHUNKS} mock:bytes={CHUNK_BYTES} mock:gate={GATE}"
START_TIMEOUT_S: Final = 30.0
STEP_TIMEOUT_S: Final = 30.0
STOP_TIMEOUT_S: Final = 10.0
LISTEN_RE: Final = re.compile(rb"listening on (http://\S+)")
CHUNK_RE: Final = re.compile(r"chunk-(\d+)")


class DemoError(RuntimeError):
    """The demo could not run (the message says which step failed)."""


class Printer:
    """Numbered steps, continuation lines indented under them."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.step = 0

    def __call__(self, label: str, text: str) -> None:
        self.step += 1
        number = f"[{self.step}]"
        print(f"{number:<4} {label:<8} {text}", file=self.out, flush=True)

    def more(self, text: str) -> None:
        print(f"{'':14}{text}", file=self.out, flush=True)


def chunk_numbers(text: str) -> list[int]:
    return [int(n) for n in CHUNK_RE.findall(text)]


def describe_chunks(numbers: Sequence[int]) -> str:
    if not numbers:
        return "no chunks"
    if list(numbers) == list(range(numbers[0], numbers[-1] + 1)) and len(numbers) > 2:
        return f"chunk-{numbers[0]} … chunk-{numbers[-1]}"
    return ", ".join(f"chunk-{n}" for n in numbers)


def is_live_marker(block: Block) -> bool:
    if not isinstance(block, MessageBlock) or block.source != "history_truncated":
        return False
    marker = parse_truncation(block.data)  # the status block keeps the whole marker payload
    return marker is not None and marker.scope == LIVE_JOURNAL_SCOPE


def shown_chunks(blocks: Sequence[Block]) -> list[int]:
    """The chunk numbers the model's assistant text blocks show, in order."""
    numbers: list[int] = []
    for block in blocks:
        if isinstance(block, TextBlock) and block.kind == "assistant":
            numbers += chunk_numbers(block.text)
    return numbers


def describe_blocks(blocks: Sequence[Block]) -> str:
    parts: list[str] = []
    for block in blocks:
        if is_live_marker(block):
            parts.append("[truncation marker]")
        elif isinstance(block, TextBlock) and block.kind == "user":
            parts.append("user prompt")
        elif isinstance(block, TextBlock) and block.kind == "assistant":
            parts.append(describe_chunks(chunk_numbers(block.text)))
        else:
            parts.append(block.kind)
    return ", ".join(parts) or "nothing"


def marker_fields(data: dict[str, Any]) -> str:
    keys = ("scope", "truncatedEvents", "retainedEvents", "maxEvents", "maxBytes",
            "fullTranscriptAvailable")
    return " ".join(f"{k}={json.dumps(data[k])}" for k in keys if k in data)


class DaemonProcess:
    """The daemon subprocess: started in its own process group, stopped with SIGTERM."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.gate_dir = base / "gates"
        self.prompt_log = base / "prompts.log"
        self.stderr_path = base / "daemon-stderr.log"
        self.proc: Process | None = None
        self.url = ""
        self.agent_pids: list[int] = []

    async def start(self) -> None:
        self.gate_dir.mkdir()
        env = dict(os.environ)
        env.pop("QWEN_SERVER_TOKEN", None)
        env.update({"MOCK_ACP_GATE_DIR": str(self.gate_dir),
                    "MOCK_ACP_PROMPT_LOG": str(self.prompt_log), "PYTHONUNBUFFERED": "1"})
        argv = [sys.executable, "-m", "daemon", "--hostname", "127.0.0.1", "--port", "0",
                "--data-dir", str(self.base / "data"), "--workspace", str(self.base), *CAPS]
        with open(self.stderr_path, "wb") as err:
            # Its own session: a Ctrl-C in the terminal reaches the demo only, and the demo
            # stops the daemon (which stops its agent) in order.
            self.proc = await anyio.open_process(
                argv, stdout=subprocess.PIPE, stderr=err, env=env, cwd=str(self.base),
                start_new_session=True)
        assert self.proc.stdout is not None
        buf = b""
        with anyio.move_on_after(START_TIMEOUT_S):
            while (match := LISTEN_RE.search(buf)) is None:
                try:
                    chunk = await self.proc.stdout.receive(4096)
                except anyio.EndOfStream:
                    raise DemoError(
                        "the daemon exited before listening:\n" + self.stderr()) from None
                buf += chunk
            self.url = match.group(1).decode()
            return
        raise DemoError("the daemon did not report its URL in time:\n" + self.stderr())

    def stderr(self) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")
        except OSError:
            return ""

    def open_gate(self, name: str) -> None:
        (self.gate_dir / name).touch()

    def prompts(self) -> int:
        if not self.prompt_log.exists():
            return 0
        return sum(1 for line in self.prompt_log.read_text().splitlines() if line.strip())

    async def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after :data:`STOP_TIMEOUT_S`; returns the exit status."""
        proc = self.proc
        if proc is None:
            return None
        with anyio.CancelScope(shield=True):
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
                with anyio.move_on_after(STOP_TIMEOUT_S):
                    await proc.wait()
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
            if proc.stdout is not None:
                await proc.stdout.aclose()
        return proc.returncode


async def read_until(stream: Any, predicate: Callable[[DaemonEvent], bool]) -> list[DaemonEvent]:
    """Read ``stream`` until ``predicate`` holds for an event; returns the events read."""
    seen: list[DaemonEvent] = []
    async for event in stream:
        seen.append(event)
        if predicate(event):
            return seen
    raise DemoError("the event stream ended early")


def is_chunk(event: DaemonEvent, n: int) -> bool:
    payload = event.payload
    if not isinstance(payload, SessionUpdateData):
        return False
    update = payload.acp
    if not isinstance(update, UserMessageChunk | AgentMessageChunk | AgentThoughtChunk):
        return False
    if update.content is None:
        return False
    text = update.content.text
    return isinstance(text, str) and chunk_numbers(text) == [n]


async def still_running(pid: int, wait_s: float = 5.0) -> bool:
    """Whether ``pid`` still exists after up to ``wait_s`` (an exited agent is reaped by the
    daemon, or by init once the daemon is gone: poll, bounded, until it disappears)."""
    with anyio.move_on_after(wait_s):
        while True:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return False
            except PermissionError:
                return True
            await anyio.sleep(0.02)
    return True


async def read_line() -> None:
    await LineReader(sys.stdin.fileno()).readline()


async def run_demo(base: Path, say: Printer, *, step: bool = False) -> None:
    daemon = DaemonProcess(base)
    try:
        await daemon.start()
        assert daemon.proc is not None
        say("daemon", f"started on {daemon.url} (pid {daemon.proc.pid}), "
                      "data in a temporary directory")
        say.more(f"live-journal caps: {' '.join(CAPS)}; agent: the bundled mock agent")
        await scenario(daemon, say, step=step)
    finally:
        code = await daemon.stop()
        pids = [daemon.proc.pid] if daemon.proc is not None else []
        pids += daemon.agent_pids
        left = [pid for pid in pids if await still_running(pid)]
        gone = "left running: " + ", ".join(map(str, left)) if left else "no process left"
        say("daemon", f"stopped (exit status {code}); pids {', '.join(map(str, pids))}: {gone}")


async def scenario(daemon: DaemonProcess, say: Printer, *, step: bool) -> None:
    async with (
        DaemonClient(daemon.url) as direct,
        DaemonClient(daemon.url) as ui_client,
        WebUIProvider(ui_client) as provider,
    ):

        def loads() -> int:
            """Loads the model's client sent (the SDK counts its requests by route)."""
            return ui_client.statistics().count("load")

        created = await direct.create_session(scope="thread")
        sid = created.session_id
        say("session", f"{sid} created")
        status = await direct.daemon_status()
        daemon.agent_pids = [a.pid for a in status.agents if a.pid is not None]
        say.more(f"agent pid {', '.join(map(str, daemon.agent_pids)) or '?'}")
        accepted = await direct.send_prompt(sid, PROMPT)
        say("prompt", f"{PROMPT!r} accepted as {accepted.prompt_id}")
        say.more(f"the mock agent streams {CHUNKS} chunks of {CHUNK_BYTES} bytes, "
                 f"then holds the turn open until the gate file {GATE!r} exists")
        with anyio.fail_after(STEP_TIMEOUT_S):
            async with direct.events(sid, 0) as stream:
                seen = await read_until(stream, lambda e: is_chunk(e, CHUNKS - 1))
        last_id = max(e.id or 0 for e in seen)
        say("stream", f"{len(seen)} events arrived live (the user echo, then chunk-0 … "
                      f"chunk-{CHUNKS - 1}); the turn is still running")

        with anyio.fail_after(STEP_TIMEOUT_S):
            await provider.open_session(sid)
        blocks = provider.store.blocks
        markers = [b for b in blocks if is_live_marker(b)]
        if len(markers) != 1 or not isinstance(markers[0], MessageBlock):
            raise DemoError(f"expected one live marker mid-turn, the model shows: "
                            f"{describe_blocks(blocks)}")
        data = markers[0].data
        parsed = parse_truncation(data)
        if parsed is None:
            raise DemoError(f"malformed marker: {data!r}")
        say("load", f"the WebUI model loads the session mid-turn (load {loads()})")
        say.more(f"marker: history_truncated {marker_fields(data)}")
        say.more(f"status: {status_text(parsed)}")
        say.more(f"the model shows: {describe_blocks(blocks)}")
        missing = sorted(set(range(CHUNKS)) - set(shown_chunks(blocks)))
        say.more(f"dropped from the live journal: the user echo and {describe_chunks(missing)}")

        if step:
            print("press Enter to release the gate", flush=True)
            await read_line()
        daemon.open_gate(GATE)
        with anyio.fail_after(STEP_TIMEOUT_S):
            async with direct.events(sid, last_id) as stream:
                after = await read_until(
                    stream, lambda e: e.type in TERMINAL_TYPES)
        end = after[-1]
        ended = typed_data(end)
        reason = getattr(ended, "stop_reason", None) or getattr(ended, "code", "")
        say("release", f"gate opened: the agent ends the turn -> {end.type} ({reason})")

        with anyio.fail_after(STEP_TIMEOUT_S):
            await provider.wait_for(lambda: provider.repair_attempts >= 1)
        outcome = provider.repair_outcomes[-1]
        blocks = provider.store.blocks
        chunks = shown_chunks(blocks)
        whole = chunks == list(range(CHUNKS))
        marker_left = any(is_live_marker(b) for b in blocks)
        if outcome.kind is not RepairOutcomeKind.REPAIRED or not whole or marker_left:
            raise DemoError(f"repair did not happen: outcome {outcome.kind.value}, "
                            f"the model shows {describe_blocks(blocks)}")
        say("repair", f"after the terminal the model loads once more (load {loads()}): "
                      f"{outcome.kind.value}")
        say.more(f"the model shows: {describe_blocks(blocks)}: every chunk once, no marker")
        say("counts", f"agent prompts: {daemon.prompts()}, loads: {loads()}")


STOP_SIGNALS: Final = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class StopSignals:
    """Records the first stop signal, from before the loop runs until the demo has cleaned up.

    Installed as the process's handler of :data:`STOP_SIGNALS` (whatever disposition the demo
    inherited, SIG_IGN included); inside the loop, :func:`amain`'s signal receiver takes
    over and hands the signal back here. A signal caught outside the loop is only recorded:
    ``amain`` does not start if one came first, and one during the final cleanup changes the
    exit status without interrupting the cleanup.
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def note(self, signum: int) -> None:
        if self.signum is None:
            self.signum = signum

    def _handler(self, signum: int, frame: object) -> None:
        self.note(signum)

    def install(self) -> None:
        for signum in STOP_SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handler)

    def restore(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()


async def amain(base: Path, say: Printer, *, step: bool, stop: StopSignals) -> int:
    """Run the demo; a stop signal cancels it (the daemon is still stopped in order)."""
    failure: list[str] = []
    # Installed before the first checkpoint and kept through run_demo's cleanup: a signal
    # arriving at any moment of the run is read here, never handled by a default disposition.
    with anyio.open_signal_receiver(*STOP_SIGNALS) as signals:
        if stop.signum is not None:
            return 128 + stop.signum  # arrived before Trio ran: nothing started yet
        async with anyio.create_task_group() as nursery:
            demo = anyio.CancelScope()

            async def watch_signals() -> None:
                async for signum in signals:
                    stop.note(signum)  # later signals (during the cleanup) are only recorded
                    demo.cancel()

            nursery.start_soon(watch_signals)
            with demo:
                try:
                    await run_demo(base, say, step=step)
                except DemoError as exc:
                    failure.append(str(exc))
            nursery.cancel_scope.cancel()
    if stop.signum is not None:
        print(f"demo: stopped by {signal.Signals(stop.signum).name}", file=sys.stderr)
        return 128 + stop.signum
    if failure:
        print(f"demo: {failure[0]}", file=sys.stderr)
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m webui_model.demo",
        description="Show a truncated live turn and its repair on a throw-away daemon.")
    parser.add_argument("--step", action="store_true",
                        help="wait for Enter before releasing the held-open turn")
    args = parser.parse_args(argv)
    stop = StopSignals()
    stop.install()
    try:
        print("turnkeeper demo: a live turn overflows the daemon's live journal; "
              "the WebUI model repairs it", flush=True)
        base = Path(tempfile.mkdtemp(prefix="turnkeeper-demo-"))
        say = Printer(sys.stdout)
        code = 1
        try:
            # On Trio (the daemon the demo starts needs it anyway): its signal receiver hands
            # the handlers it replaced back on exit, which the cleanup's recording relies on.
            code = anyio.run(partial(amain, base, say, step=args.step, stop=stop),
                             backend="trio")
        finally:
            shutil.rmtree(base, ignore_errors=True)
            state = "still there" if base.exists() else "removed"
            say("cleanup", f"temporary directory {state}")
    finally:
        stop.restore()
    # A signal that came during the cleanup, after amain had returned, still counts.
    return code if stop.signum is None else 128 + stop.signum


if __name__ == "__main__":
    sys.exit(main())
