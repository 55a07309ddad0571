"""What the cluster fault tests share: real nodes on a real Redis, clients that read a session
the way the SDK does, and the checker of the cluster's promises.

- :func:`nodes` starts daemon processes (the tests' harness) joined to one redis-server, with
  a short lease, the cluster secret and a prompt log of their own each.
- :class:`Follower` follows one session through one node as a client does: from id 0, resumed
  with ``Last-Event-ID`` + epoch whenever its stream ends, and on ``state_resync_required`` it
  loads the session (the terminals it learns there count as seen) and goes on from the load's
  cursor. Every frame is recorded with the epoch of the connection that carried it.
- :class:`Prompter` sends prompts through chosen nodes and records every answer;
  :class:`DurableWatch` records the ``durableEventId`` of each epoch that any status showed.
- :func:`check` judges it all against the final transcript (the Redis op log and what the
  owner serves): every 202 has exactly one terminal, the same on every follower and in the
  transcript; no chunk at or below a ``durableEventId`` seen is missing from the transcript;
  no id twice on one follower's stream of one epoch.

Nothing here sleeps in place of a condition: waits are on the cluster's own answers, polled
under a deadline; the pauses between a client's reconnects are the client's own pace.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import trio

from daemon.core.cluster import decode_op, session_keys
from daemon.core.transcript_ops import FinishTurn
from sdk.protocol.sse import SSEParser
from tests.harness import RunningDaemon, start_daemon

LEASE_MS = 1200
SECRET = "fault-tests-cluster-secret-0123456789"
TIMEOUT = httpx.Timeout(30)
TERMINALS = ("turn_complete", "turn_error")
RECONNECT_PAUSE_S = 0.05  # a client's pace between attempts (the SDK backs off too)


def node_env(base: Path, name: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    return {"TURNKEEPER_CLUSTER_SECRET": SECRET,
            "MOCK_ACP_PROMPT_LOG": str(base / f"prompts-{name}.log"),
            "MOCK_ACP_END_LOG": str(base / f"ended-{name}.log"), **(extra or {})}


def start_node(base: Path, redis_url: str, name: str, *extra: str,
               env: dict[str, str] | None = None, lease_ms: int = LEASE_MS,
               tag: str | None = None) -> RunningDaemon:
    """A node with id ``name``; ``tag`` names its data directory (default: the id)."""
    return start_daemon(base, ["--cluster-redis", redis_url, "--node-id", name,
                               "--lease-ms", str(lease_ms), *extra],
                        node_env(base, name, env), tag=tag or name)


def resume(daemon: RunningDaemon) -> None:
    if daemon.proc.poll() is None:
        daemon.proc.send_signal(signal.SIGCONT)


@contextmanager
def nodes(base: Path, redis_url: str, names: str, *extra: str,
          env: dict[str, str] | None = None, lease_ms: int = LEASE_MS
          ) -> Iterator[list[RunningDaemon]]:
    with ExitStack() as stack:
        out = []
        for name in names:
            daemon = start_node(base, redis_url, name, *extra, env=env, lease_ms=lease_ms)
            stack.callback(daemon.kill)
            stack.callback(resume, daemon)  # a SIGSTOPped node must be able to die
            out.append(daemon)
        yield out


def prompts_run(base: Path, name: str) -> list[str]:
    """The prompts node ``name``'s agents received (JSON lines)."""
    return _lines(base / f"prompts-{name}.log")


def prompts_ended(base: Path, name: str) -> list[str]:
    """The prompts node ``name``'s agents answered, once the answer was written (JSON lines)."""
    return _lines(base / f"ended-{name}.log")


def _lines(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if line.strip()] \
        if path.exists() else []


# --- what clients saw -------------------------------------------------------------------------


@dataclass(frozen=True)
class Seen:
    """One frame with an id as a follower received it."""

    conn: int
    epoch: str
    id: int
    type: str
    prompt_id: str | None
    chunk: str | None  # an agent_message_chunk's text
    terminal: tuple[str, str | None] | None  # (type, code or stopReason) of a terminal


def terminal_key(kind: str, data: Any) -> tuple[str, str | None]:
    data = data if isinstance(data, dict) else {}
    return (kind, data.get("code") if kind == "turn_error" else data.get("stopReason"))


def _seen(conn: int, epoch: str, event: Any) -> Seen:
    data = event.data if isinstance(event.data, dict) else {}
    chunk = None
    update = data.get("update") if event.type == "session_update" else None
    if isinstance(update, dict) and update.get("sessionUpdate") == "agent_message_chunk":
        content = update.get("content") or {}
        chunk = content.get("text") if isinstance(content.get("text"), str) else None
    terminal = terminal_key(event.type, data) if event.type in TERMINALS else None
    prompt_id = event.prompt_id if event.prompt_id is not None else data.get("promptId")
    return Seen(conn, epoch, int(event.id), event.type, prompt_id, chunk, terminal)


# A load's promptTerminals say "completed", "cancelled", "error" or "interrupted"; the same
# terminal as a frame is matched by these rules.
_LEDGER = {"completed": "turn_complete", "cancelled": "turn_complete"}


def ledger_matches(ledger: dict[str, Any], terminal: tuple[str, str | None]) -> bool:
    kind = _LEDGER.get(str(ledger.get("terminal")), "turn_error")
    if kind != terminal[0]:
        return False
    if kind == "turn_complete":
        return ledger.get("stopReason", terminal[1]) == terminal[1]
    return (ledger.get("terminal") == "interrupted") == (terminal[1] == "interrupted")


@dataclass
class Follower:
    """One client following one session through one node (see the module docstring)."""

    client: httpx.AsyncClient
    session_id: str
    name: str
    seen: list[Seen] = field(default_factory=list)
    loaded_terminals: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    resyncs: list[dict[str, Any]] = field(default_factory=list)
    connections: int = 0
    refused: dict[int, int] = field(default_factory=dict)  # status -> count of refusals
    cursor: int = 0  # where the next connection resumes (Last-Event-ID), with its epoch
    epoch: str | None = None
    _changed: trio.Event = field(default_factory=trio.Event)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def run(self) -> None:
        while True:
            headers = {"Last-Event-ID": str(self.cursor)}
            if self.epoch is not None:
                headers["X-Qwen-Event-Epoch"] = self.epoch
            try:
                await self._one_connection(headers)
            except (httpx.HTTPError, OSError):
                pass  # the node went away or cut us: resume like the SDK
            await trio.sleep(RECONNECT_PAUSE_S)

    async def _one_connection(self, headers: dict[str, str]) -> None:
        async with self.client.stream("GET", f"/session/{self.session_id}/events",
                                      headers=headers,
                                      timeout=httpx.Timeout(10, read=None)) as resp:
            if resp.status_code != 200:
                self.refused[resp.status_code] = self.refused.get(resp.status_code, 0) + 1
                await resp.aread()
                return
            self.connections += 1
            conn, conn_epoch = self.connections, resp.headers["x-qwen-event-epoch"]
            parser = SSEParser()
            async for raw in resp.aiter_raw():
                for event in parser.feed(raw):
                    if event.type == "state_resync_required":
                        self.resyncs.append(dict(event.data) if isinstance(event.data, dict)
                                            else {})
                        await self._load()
                        return
                    if event.id is None:
                        continue
                    self.seen.append(_seen(conn, conn_epoch, event))
                    self.cursor, self.epoch = int(event.id), conn_epoch
                self._notify()

    async def _load(self) -> None:
        """What a client does on a resync: load the session, take its terminals, go on from
        its cursor and epoch."""
        while True:
            try:
                resp = await self.client.post(f"/session/{self.session_id}/load", json={})
                if resp.status_code == 200:
                    body = resp.json()
                    for terminal in body.get("promptTerminals", []):
                        self.loaded_terminals.setdefault(terminal["promptId"], []).append(
                            terminal)
                    self._notify()
                    self.cursor, self.epoch = int(body["lastEventId"]), str(body["eventEpoch"])
                    return
                self.refused[resp.status_code] = self.refused.get(resp.status_code, 0) + 1
            except (httpx.HTTPError, OSError):
                pass
            await trio.sleep(RECONNECT_PAUSE_S)

    def terminals_of(self, prompt_id: str) -> list[tuple[str, str | None]]:
        return [s.terminal for s in self.seen if s.prompt_id == prompt_id and s.terminal]

    def knows_end_of(self, prompt_id: str) -> bool:
        return bool(self.terminals_of(prompt_id)) or prompt_id in self.loaded_terminals

    async def wait_for_ends(self, prompt_ids: Sequence[str], timeout: float = 30) -> None:
        with trio.move_on_after(timeout):
            while not all(self.knows_end_of(p) for p in prompt_ids):
                await self._changed.wait()
            return
        missing = [p for p in prompt_ids if not self.knows_end_of(p)]
        raise AssertionError(
            f"{self.name} never learnt how {missing} ended (a 202 without a terminal?); it "
            f"saw {len(self.seen)} frames over {self.connections} connections, resyncs "
            f"{self.resyncs}, refusals {self.refused}, terminals "
            f"{[(s.prompt_id, s.terminal) for s in self.seen if s.terminal]}")

    async def wait_for(self, pred: Any, timeout: float = 20) -> Seen:
        with trio.fail_after(timeout):
            start = 0
            while True:
                for seen in self.seen[start:]:
                    if pred(seen):
                        return seen
                start = len(self.seen)
                await self._changed.wait()


@dataclass
class Answer:
    node: str
    status: int
    body: dict[str, Any]
    headers: dict[str, str]
    seconds: float


@dataclass
class Prompter:
    """Sends prompts and keeps every answer; ``accepted`` are the 202s' prompt ids."""

    session_id: str
    answers: list[Answer] = field(default_factory=list)

    @property
    def accepted(self) -> list[str]:
        return [a.body["promptId"] for a in self.answers if a.status == 202]

    async def send(self, client: httpx.AsyncClient, node: str, text: str,
                   timeout: float = 30) -> Answer:
        started = trio.current_time()
        try:
            resp = await client.post(f"/session/{self.session_id}/prompt",
                                     json={"prompt": [{"type": "text", "text": text}]},
                                     timeout=timeout)
            body = resp.json() if resp.content else {}
            answer = Answer(node, resp.status_code, body, dict(resp.headers),
                            trio.current_time() - started)
        except (httpx.HTTPError, OSError) as exc:
            answer = Answer(node, 0, {"error": repr(exc)}, {}, trio.current_time() - started)
        self.answers.append(answer)
        return answer


@dataclass
class DurableWatch:
    """Polls a session's status through some nodes; keeps the highest ``durableEventId``
    any answer showed for each epoch (what a client may take as never lost)."""

    session_id: str
    clients: list[httpx.AsyncClient]
    durable: dict[str, int] = field(default_factory=dict)
    answers: dict[int, int] = field(default_factory=dict)  # status -> count

    async def run(self) -> None:
        while True:
            for client in self.clients:
                try:
                    resp = await client.get(f"/session/{self.session_id}/status", timeout=5)
                except (httpx.HTTPError, OSError):
                    continue
                self.answers[resp.status_code] = self.answers.get(resp.status_code, 0) + 1
                if resp.status_code == 200:
                    body = resp.json()
                    epoch = body["eventEpoch"]
                    self.durable[epoch] = max(self.durable.get(epoch, 0),
                                              int(body["durableEventId"]))
            await trio.sleep(0.1)  # a status poller's pace


# --- the final transcript -----------------------------------------------------------------------


@dataclass
class Transcript:
    """What the cluster finally says about a session: the terminal records (by prompt), the
    agent text of each prompt, the ledger (load's promptTerminals) and the FinishTurns of the
    Redis op log."""

    records: list[dict[str, Any]]
    ledger: dict[str, list[dict[str, Any]]]
    finishes: dict[str, list[str]]

    def terminals(self, prompt_id: str) -> list[tuple[str, str | None]]:
        return [terminal_key(e["type"], e.get("data")) for e in self.records
                if e["type"] in TERMINALS and e.get("promptId") == prompt_id]

    def text(self, prompt_id: str) -> str:
        out = []
        for e in self.records:
            update = (e.get("data") or {}).get("update") if e["type"] == "session_update" \
                else None
            if e.get("promptId") == prompt_id and isinstance(update, dict) \
                    and update.get("sessionUpdate") == "agent_message_chunk":
                out.append(str((update.get("content") or {}).get("text", "")))
        return "".join(out)


async def final_transcript(client: httpx.AsyncClient, redis_port: int, session_id: str,
                           timeout: float = 30) -> Transcript:
    import coredis

    with trio.fail_after(timeout):
        while True:
            load = await client.post(f"/session/{session_id}/load", json={})
            page = await client.get(f"/session/{session_id}/transcript",
                                    params={"limit": 500})
            if load.status_code == 200 and page.status_code == 200:
                break
            await trio.sleep(0.1)  # a takeover is under way: ask again
    ledger: dict[str, list[dict[str, Any]]] = {}
    for terminal in load.json().get("promptTerminals", []):
        ledger.setdefault(terminal["promptId"], []).append(terminal)
    redis = coredis.Redis(host="127.0.0.1", port=redis_port)
    async with redis:
        ops = [decode_op(raw) for raw in await redis.lrange(session_keys(session_id).ops, 0, -1)]
    finishes: dict[str, list[str]] = {}
    for op in ops:
        if isinstance(op, FinishTurn) and op.prompt_id is not None:
            finishes.setdefault(op.prompt_id, []).append(op.terminal)
    return Transcript(page.json()["events"], ledger, finishes)


# --- the checker ----------------------------------------------------------------------------


def phantoms(transcript: Transcript, followers: Sequence[Follower],
             prompt_ids: Sequence[str]) -> list[str]:
    """Chunks of ``prompt_ids`` a follower received that the final transcript does not hold.
    After a crash a client may have seen such chunks (published, not yet durable: above any
    ``durableEventId``); an owner that lost its lease must publish none."""
    out = []
    for follower in followers:
        for seen in follower.seen:
            if seen.prompt_id in prompt_ids and seen.chunk is not None \
                    and seen.chunk not in transcript.text(seen.prompt_id):
                out.append(f"{follower.name}: {seen.chunk} of {seen.prompt_id} (id {seen.id}, "
                           f"epoch {seen.epoch}) is in no transcript")
    return out


def _chunk_index(text: str) -> int | None:
    return int(text[6:]) if text.startswith("chunk-") and text[6:].isdigit() else None


def check(transcript: Transcript, accepted: Sequence[str], followers: Sequence[Follower],
          durable: dict[str, int], *, all_admitted: Sequence[str] = ()) -> None:
    """Every promise at once; an AssertionError names the first one broken.

    ``accepted``: the prompt ids answered 202. ``all_admitted``: other prompt ids known to be
    in the transcript (they too need exactly one terminal)."""
    problems: list[str] = []
    for prompt_id in {*accepted, *all_admitted}:
        ends = transcript.terminals(prompt_id)
        finishes = transcript.finishes.get(prompt_id, [])
        if len(ends) != 1 or len(finishes) != 1:
            problems.append(f"prompt {prompt_id}: {len(ends)} terminal records {ends} and "
                            f"FinishTurns {finishes} in the transcript (want exactly one)")
            continue
        final = ends[0]
        for follower in followers:
            streamed = follower.terminals_of(prompt_id)
            if len(streamed) > 1:
                problems.append(f"{follower.name}: prompt {prompt_id} got {streamed} on its "
                                "stream (more than one terminal)")
            if streamed and streamed[0] != final:
                problems.append(f"{follower.name}: prompt {prompt_id} ended {streamed[0]} on "
                                f"its stream, {final} in the transcript")
            for ledger in follower.loaded_terminals.get(prompt_id, []):
                if not ledger_matches(ledger, final):
                    problems.append(f"{follower.name}: a load said {ledger} for {prompt_id}, "
                                    f"the transcript {final}")
            if prompt_id in accepted and not follower.knows_end_of(prompt_id):
                problems.append(f"{follower.name}: never learnt how {prompt_id} ended")
    for follower in followers:
        last: dict[tuple[int, str], int] = {}
        for seen in follower.seen:
            key = (seen.conn, seen.epoch)
            if seen.id <= last.get(key, 0):
                problems.append(f"{follower.name}: id {seen.id} after {last[key]} on one "
                                f"connection (epoch {seen.epoch})")
            last[key] = seen.id
        ids_by_epoch: dict[str, list[int]] = {}
        for seen in follower.seen:
            ids_by_epoch.setdefault(seen.epoch, []).append(seen.id)
        for epoch, ids in ids_by_epoch.items():
            if len(ids) != len(set(ids)):
                dup = sorted({i for i in ids if ids.count(i) > 1})[:5]
                problems.append(f"{follower.name}: ids {dup} delivered twice in epoch {epoch}")
        for seen in follower.seen:
            if seen.chunk is None or seen.prompt_id is None:
                continue
            if seen.id > durable.get(seen.epoch, 0):
                continue
            index = _chunk_index(seen.chunk)
            if index is None:
                continue
            want = "".join(f"chunk-{n}" for n in range(index + 1))
            if not transcript.text(seen.prompt_id).startswith(want):
                problems.append(f"{follower.name}: chunk {seen.chunk} (id {seen.id}, at or "
                                f"below durableEventId {durable[seen.epoch]}) of "
                                f"{seen.prompt_id} is missing from the transcript")
    assert not problems, "the cluster broke its promises:\n" + "\n".join(problems[:20])


@dataclass
class Exited:
    returncode: int | None  # None: still running when the deadline came (then killed)
    stdout: str
    stderr: str

    @property
    def daemon_lines(self) -> list[str]:
        """The ``python -m daemon: ...`` lines a refusal prints (one, for a clean refusal)."""
        return [line for line in self.stderr.splitlines()
                if line.startswith("python -m daemon:")]


def run_until_exit(base: Path, redis_url: str, name: str, *extra: str,
                   timeout: float = 30) -> Exited:
    """Start a node that is expected to refuse to start; what it said and how it ended."""
    import os
    import subprocess
    import sys

    data = base / f"{name}-refused-{len(list(base.glob('*-refused-*')))}"
    argv = [sys.executable, "-m", "daemon", "--port", "0", "--data-dir", str(data),
            "--workspace", str(base), "--cluster-redis", redis_url, "--node-id", name,
            "--lease-ms", str(LEASE_MS), *extra]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, **node_env(base, name)}, cwd=str(base))
    try:
        out, err = proc.communicate(timeout=timeout)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        code = None
    return Exited(code, out.decode(errors="replace"), err.decode(errors="replace"))
