"""One daemon session: the prompt queue, the prompt runner and the permission flow.

The runner runs prompts FIFO inside the session's cancel scope; every admitted prompt ends
with exactly one terminal (``turn_complete`` or ``turn_error``): the prompt's state and the
terminal each way of ending gets are the pure :mod:`daemon.core.prompt_lifecycle`; this shell
owns the cancel scope, the clock and the agent call.
The session is also the agent channel's sink for its ACP session: agent updates are published
on the bus as they are read, and the bus is flushed once per stdout batch.

Permission requests: each is published as ``permission_request`` and waits for a client's vote
(one of the options the agent offered, or ``cancelled``), for ``--permission-response-timeout-ms``
if set, or for the end of its prompt. Whoever decides, ``permission_resolved`` is published at
that moment (with a ``reason`` when the daemon decided), so the resolutions of a turn always come
before its terminal; the agent then gets the answer.
"""

from __future__ import annotations

import enum
import logging
import math
import uuid
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from typing import Any, Final

import msgspec
import trio

from sdk.protocol.acp import (
    EchoMeta,
    PermissionAnswer,
    PermissionOptionView,
    PermissionParamsView,
    PromptResultView,
    TextBlockView,
    UpdateView,
    UserEcho,
    view,
)
from sdk.protocol.constants import (
    PERMISSION_APPROVAL_MODE,
    PERMISSION_NO_RUNNING_PROMPT,
    PERMISSION_PROMPT_CANCELLED,
    PERMISSION_TIMEOUT,
    PERMISSION_TURN_ENDED,
)
from sdk.protocol.events import (
    PendingPromptAddedData,
    PendingPromptCompletedData,
    PendingPromptStartedData,
    PermissionRequestData,
    PermissionResolvedData,
    PromptCancelledData,
    SessionClosedData,
    SessionDiedData,
    SessionUpdateData,
)
from sdk.protocol.http import PermissionOutcome, PromptAccepted, PromptTerminal
from sdk.protocol.terminals import CHANNEL_CLOSED

from .agent import AgentChannel, AgentRpcError, ChannelClosed, Flow
from .bus import SessionBus
from .clock import now_ms
from .config import MAX_PENDING_PROMPTS
from .core.idempotency import AdmissionKeys, KeyedAdmission
from .core.prompt_echo import USER_CHUNK, PromptEcho
from .core.prompt_lifecycle import (
    NOT_ACKNOWLEDGED,
    AgentAnswered,
    AgentFailed,
    CallCut,
    ChannelLost,
    EndCause,
    PromptState,
    SessionEnded,
    TerminalDecision,
    after_cancel,
    after_close,
    terminal_for,
)
from .core.updates import UpdateBatch
from .transcript_store import AdmitPrompt

log = logging.getLogger("daemon.session")

MAX_LEDGER_TERMINALS = 64
MAX_ECHO_BLOCKS = 256
# How long a terminal waits for the transcript before the session is marked degraded.
DURABLE_WAIT_S = 10.0
# How long a load waits for a terminal Redis holds to be shown here (Session.terminal_settled);
# past it the load answers as it stands (the turn still running).
SETTLE_WAIT_S = 5.0


class PromptQueueFull(Exception):
    def __init__(self, pending: int) -> None:
        super().__init__(f"prompt queue full ({pending} pending)")
        self.pending = pending


class PendingPrompt(msgspec.Struct):
    prompt_id: str
    blocks: list[Any]
    client_id: str | None
    deadline_ms: int | None
    queued: bool
    text: str
    keyed: bool = False
    state: PromptState = PromptState.QUEUED
    scope: trio.CancelScope | None = None
    done: trio.Event = msgspec.field(default_factory=trio.Event)
    key: str | None = None  # its Idempotency-Key
    # Cluster mode: the prompt runs only once its 202 was given, i.e. its admission reached
    # Redis in time (Session.wait_admitted decides; None until then). A prompt answered 503
    # never runs, even when its admission lands later.
    admission_seq: int = 0
    acknowledged: bool | None = None
    decided: trio.Event = msgspec.field(default_factory=trio.Event)


class PermissionWaiter(msgspec.Struct):
    request_id: str
    prompt_id: str | None
    # The optionIds the agent offered: a vote must name one of them.
    option_ids: frozenset[str] = frozenset()
    event: trio.Event = msgspec.field(default_factory=trio.Event)
    outcome: PermissionOutcome | None = None


class VoteResult(enum.Enum):
    """What :meth:`Session.vote` did with a vote."""

    ACCEPTED = "accepted"
    NOT_FOUND = "not_found"  # no pending request with that id (unknown, or answered)
    UNKNOWN_OPTION = "unknown_option"  # an optionId the agent did not offer


_CANCELLED: Final = PermissionOutcome(outcome="cancelled")


async def _answered(outcome: PermissionOutcome) -> PermissionAnswer:
    """The agent's answer to a permission request decided on the spot."""
    return PermissionAnswer(outcome=outcome)


_decode_update = msgspec.json.Decoder(UpdateView).decode


def prompt_text(blocks: list[Any]) -> str:
    texts = []
    for block in blocks:
        found = view(block, TextBlockView)
        if found is not None and found.type == "text" and isinstance(found.text, str):
            texts.append(found.text)
    return "".join(texts)


class Session:
    def __init__(
        self,
        session_id: str,
        workspace_cwd: str,
        created_at: str,
        agent: AgentChannel,
        acp_session_id: str,
        bus: SessionBus,
        *,
        approval_mode: str = "default",
        cancel_grace_s: float = 10.0,
        permission_timeout_s: float | None = None,
        on_ended: Callable[[Session], None] | None = None,
        on_admitted: Callable[[Session], None] | None = None,
        keys_complete: bool = True,
        created_ms: int = 0,
        may_act: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        self.id = session_id
        self.workspace_cwd = workspace_cwd
        self.created_at = created_at
        self.created_ms = created_ms  # the same instant in ms (GET /sessions orders by it)
        self.agent = agent
        self.acp_session_id = acp_session_id
        self.bus = bus
        bus.on_subscribers_changed.append(agent.group_lines_changed)  # see dispatch_group_lines
        self.approval_mode = approval_mode
        self.cancel_grace_s = cancel_grace_s
        self.permission_timeout_s = permission_timeout_s  # None: wait for a vote
        self.on_ended = on_ended
        # Told when a prompt is queued (the manager's index of the sessions with work).
        self.on_admitted = on_admitted
        # The ledger's newest terminals, served by load without a database read.
        self.terminals: deque[PromptTerminal] = deque(maxlen=MAX_LEDGER_TERMINALS)
        self.queue: deque[PendingPrompt] = deque()
        # Prompts admitted with an idempotency key: the newest ones in memory (all of them for
        # a session made on this bus, until the first is forgotten), the rest in the ledger.
        self.keys = AdmissionKeys(complete=keys_complete)
        # How the keyed prompts of this bus ended (for a daemon without a transcript, whose
        # ledger is this): prompt id -> (ledger terminal, stop reason, ended at).
        self.keyed_ends: OrderedDict[str, tuple[str, str | None, int]] = OrderedDict()
        self.active: PendingPrompt | None = None
        self.permissions: dict[str, PermissionWaiter] = {}
        self.closing: str | None = None  # close reason once closing started
        # Unloaded when idle (SessionManager): it ends without a frame or a transcript write,
        # and its next request restores it from the transcript.
        self.unloading = False
        # When a request last named this session, or the manager last saw it busy
        # (trio.current_time()): what its idle unload counts from.
        self.touched_at = trio.current_time()
        self.agent_exit: tuple[int | None, str | None] | None = None
        # False when the session was restored on a new agent session (the agent's own
        # session/load failed, or it has none): the agent lost its context of the earlier turns.
        self.agent_session_restored = True
        self.ended = trio.Event()
        self._close_started = trio.Event()  # set by close()
        self._closed_in_batch = False  # see close_idle_now
        self.parked = False  # closed at shutdown, its task left to the process's exit
        self._wake = trio.Event()
        # Cluster mode: set while a turn's terminal waits for Redis before it is shown (see
        # terminal_settled); None otherwise.
        self._terminal_settling: trio.Event | None = None
        # The agent channel's reader asks the bus directly how to pace itself (SessionSink).
        self.flow: Flow = bus
        # Updates handed one at a time (on_update), published at the next flush.
        self._updates: list[bytes] = []
        # The running prompt as the agent may echo it back (only while a prompt runs).
        self._echo: PromptEcho | None = None
        # Cluster mode: asked before a prompt is handed to the agent; True once this node is
        # sure it owns the session (a lease in doubt is settled with Redis first), False once
        # it lost it. None on a single node: the runner hands prompts over at once.
        self.may_act = may_act
        self._gate_scope: trio.CancelScope | None = None  # while the runner asks may_act

    # -- admission ----------------------------------------------------------------------------

    @property
    def live(self) -> bool:
        return (self.closing is None and self.agent_exit is None and not self.agent.closed
                and not self.ended.is_set())

    def pending_count(self) -> int:
        return len(self.queue) + (1 if self.active is not None else 0)

    def admit(self, blocks: list[Any], client_id: str | None,
              deadline_ms: int | None, *, key: str | None = None,
              digest: str | None = None) -> PromptAccepted:
        """Queue a prompt; returns the 202 body. Cursor and epoch are read before admission so a
        subscriber starting from them sees every frame of the turn. With an idempotency
        ``key`` (and the ``digest`` of its request), the key, digest and 202 body are stored
        with the admission and remembered (see :meth:`find_keyed`); the caller has made sure
        no prompt of the session was admitted with it."""
        pending = self.pending_count()
        if pending >= MAX_PENDING_PROMPTS:
            raise PromptQueueFull(pending)
        last_event_id, epoch = self.bus.ring.last_id, self.bus.epoch
        prompt = PendingPrompt(
            prompt_id=str(uuid.uuid4()), blocks=blocks, client_id=client_id,
            deadline_ms=deadline_ms, queued=pending > 0, text=prompt_text(blocks),
            keyed=key is not None, key=key,
        )
        accepted = PromptAccepted(prompt_id=prompt.prompt_id, last_event_id=last_event_id,
                                  event_epoch=epoch)
        at = now_ms()
        if key is not None:
            self.keys.remember(KeyedAdmission(key, digest or "", accepted, at))
        writer = self.bus.writer
        if writer is not None:
            self.bus.last_write_seq = prompt.admission_seq = writer.submit(
                AdmitPrompt(self.id, prompt.prompt_id, at)
                if key is None else
                AdmitPrompt(self.id, prompt.prompt_id, at, key, digest, last_event_id, epoch)
            )
        if writer is None or writer.admission_bound_s is None:
            self._decide(prompt, True)  # a single node runs what it admitted
        if prompt.queued:
            self.bus.publish(
                PendingPromptAddedData(session_id=self.id, prompt_id=prompt.prompt_id,
                                       text=prompt.text, queued_at=now_ms()),
                prompt_id=prompt.prompt_id, originator_client_id=client_id,
            )
        self.queue.append(prompt)
        if self.on_admitted is not None:
            self.on_admitted(self)
        self._notify()
        return accepted

    async def find_keyed(self, key: str) -> KeyedAdmission | None:
        """The prompt of this session admitted with idempotency ``key``, or ``None``: from
        memory, else (a restored session, or one that forgot it) from the ledger, which may
        raise :class:`~daemon.transcript_store.TranscriptDamaged`. Whatever was found is
        remembered, and memory is looked at again after the read: a request with the same key
        admitted meanwhile is found, so that an admission that follows this call without a
        checkpoint cannot make a second one."""
        found = self.keys.get(key)
        writer = self.bus.writer
        if found is not None or self.keys.complete or writer is None \
                or self.keys.withdrawn(key):
            return found
        row = await writer.read(lambda store: store.find_keyed_prompt(self.id, key),
                                session_id=self.id)
        found = self.keys.get(key)
        if found is None and row is not None:
            found = KeyedAdmission(
                key, row.request_digest,
                PromptAccepted(prompt_id=row.prompt_id, last_event_id=row.accepted_event_id,
                               event_epoch=row.accepted_epoch),
                row.admitted_at_ms)
            self.keys.remember(found)
        return found

    def prompt_state(self, prompt_id: str) -> str | None:
        """``running`` or ``queued`` for a prompt of this bus still in flight; else None."""
        if self.active is not None and self.active.prompt_id == prompt_id:
            return "running"
        if any(prompt.prompt_id == prompt_id for prompt in self.queue):
            return "queued"
        return None

    def _notify(self) -> None:
        self._wake.set()

    # -- the runner ---------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        # Also hands over what the agent sent since its session/new (or load) reply.
        self.agent.attach(self.acp_session_id, self)
        task_status.started()
        try:
            while True:
                if self.agent_exit is not None or self.agent.closed or self.closing is not None:
                    break
                if not self.queue:
                    self._wake = trio.Event()
                    await self._wake.wait()
                    continue
                if not self.queue[0].decided.is_set():
                    # Cluster mode: not before its 202 (within the admission bound).
                    await self.queue[0].decided.wait()
                    continue
                if self.may_act is not None and self.queue[0].acknowledged:
                    allowed = await self._may_dispatch(self.may_act)
                    if allowed is False:
                        # This node lost the session (the new owner ended the prompt): it
                        # stays queued and ends with the session here, never reaching the agent.
                        self.begin_close("lease_lost")
                    if not allowed:
                        continue
                await self._run_prompt(self.queue.popleft())
            await self._drain_and_end()
        finally:
            self.agent.detach(self.acp_session_id, self)
            self.bus.close()
            self.ended.set()
            if self.on_ended is not None:
                self.on_ended(self)

    async def _may_dispatch(self, may_act: Callable[[], Awaitable[bool]]) -> bool | None:
        """Cluster mode: may the prompt at the head of the queue be handed to the agent now?
        Waits as long as ``may_act`` does (Redis silent: until it answers), unless the session
        closes or its agent dies meanwhile: ``None`` then (the runner ends the session)."""
        with trio.CancelScope() as scope:
            self._gate_scope = scope
            try:
                return await may_act()
            finally:
                self._gate_scope = None
        return None

    def _stop_gate(self) -> None:
        if self._gate_scope is not None:
            self._gate_scope.cancel()

    async def _run_prompt(self, prompt: PendingPrompt) -> None:
        self.active = prompt
        if not prompt.acknowledged:
            # Answered 503 (its admission did not reach Redis in time): it never runs, and
            # ends as a takeover would end it. The client sends it again.
            await self._finish(prompt, NOT_ACKNOWLEDGED, completion="removed")
            return
        prompt.state = PromptState.RUNNING
        self.bus.active_prompt_id = prompt.prompt_id
        bus = self.bus
        if prompt.queued:
            bus.publish(
                PendingPromptStartedData(session_id=self.id, prompt_id=prompt.prompt_id,
                                         text=prompt.text),
                prompt_id=prompt.prompt_id, originator_client_id=prompt.client_id,
            )
        ts = now_ms()
        for block in prompt.blocks[:MAX_ECHO_BLOCKS]:
            # The echo's update is ACP content (the client's block as sent), kept as plain
            # values inside the typed payload.
            bus.publish(
                SessionUpdateData(session_id=self.id, update=msgspec.to_builtins(
                    UserEcho(content=block, meta=EchoMeta(server_timestamp=ts)))),
                prompt_id=prompt.prompt_id, originator_client_id=prompt.client_id, flush=False,
            )
        bus.flush()
        # The agent may echo the prompt too (Mistral Vibe does): that copy is not published.
        self._echo = PromptEcho(prompt.blocks[:MAX_ECHO_BLOCKS])
        cause = await self._drive(prompt)
        if self._echo.taken:
            log.info("event=agent_prompt_echo_dropped session=%s prompt=%s updates=%d",
                     self.id, prompt.prompt_id, self._echo.taken)
        self._echo = None
        # The state is read after the call: a cancel or a close may have come meanwhile.
        decision = terminal_for(prompt.state, cause)
        if decision is None:
            return
        if decision.cancel_agent:
            await self._send_cancel()
        await self._finish(prompt, decision)

    async def _drive(self, prompt: PendingPrompt) -> EndCause:
        """Run the agent call in the prompt's own cancel scope; say how it ended."""
        with trio.CancelScope() as scope:
            prompt.scope = scope
            deadline_at = float("inf")
            if prompt.deadline_ms is not None:
                deadline_at = trio.current_time() + prompt.deadline_ms / 1000
                scope.deadline = deadline_at
            if prompt.state is PromptState.CLOSING:
                scope.cancel()
            try:
                result = await self.agent.prompt(self.acp_session_id, prompt.blocks)
            except AgentRpcError as exc:
                return AgentFailed(exc.code, exc.message)
            except ChannelClosed:
                return ChannelLost()
            answered = view(result, PromptResultView)
            return AgentAnswered(None if answered is None else answered.stop_reason)
        # The scope was cancelled: session closing, the cancel grace ran out, or the deadline.
        return CallCut(deadline_passed=trio.current_time() >= deadline_at)

    async def _finish(
        self, prompt: PendingPrompt, decision: TerminalDecision, completion: str = "completed",
    ) -> None:
        if prompt.state is PromptState.ENDED:
            return
        prompt.state = PromptState.ENDED
        ledger, stop_reason = decision.ledger, decision.stop_reason
        bus = self.bus
        # Durability before the terminal: everything published so far must be committed. A
        # degraded transcript is skipped so a failed store never stalls a turn; a store that
        # does not commit within the bound degrades the session (its transcript stays a true
        # prefix and stops claiming to be full) rather than publish a terminal over a hole.
        # The turn's unanswered permission requests are resolved (and published) first, so
        # their permission_resolved frames are durable and precede the terminal.
        self._resolve_permissions(prompt.prompt_id, PERMISSION_TURN_ENDED)
        # Cluster mode: the terminal is shown only once Redis holds it and everything before
        # it, under this node's lease (the bus's guard), so every client sees the turn end
        # as the cluster's transcript ends it, whichever node it reads, whatever happens to
        # this node next.
        replicated = self._replicated
        if replicated:
            await self._wait_replicated()
        else:
            await self._wait_durable()
        settling = self._terminal_settling = trio.Event() if replicated else None
        try:
            published = bus.publish_terminal(
                decision.data(self.id, prompt.prompt_id),
                prompt_id=prompt.prompt_id,
                originator_client_id=prompt.client_id, ledger_terminal=ledger,
                stop_reason=stop_reason, hold=replicated,
            )
            # The ledger's instant (the transcript keeps it), not the one after the waits below.
            ended_at = bus.terminal_ms if published is not None and bus.terminal_ms else now_ms()
            if published is not None and replicated:
                bus.show_terminal(visible=await self._wait_replicated())
            self.terminals.append(PromptTerminal(
                prompt_id=prompt.prompt_id, terminal=ledger,
                stop_reason=stop_reason if stop_reason is not None else msgspec.UNSET,
                at=ended_at))
            if prompt.keyed:
                self.keyed_ends[prompt.prompt_id] = (ledger, stop_reason, ended_at)
                if len(self.keyed_ends) > self.keys.capacity:
                    self.keyed_ends.popitem(last=False)
            self.active = None
            bus.active_prompt_id = None
        finally:
            if settling is not None:
                self._terminal_settling = None
                settling.set()
        if prompt.queued:
            bus.publish(
                PendingPromptCompletedData(session_id=self.id, prompt_id=prompt.prompt_id,
                                           state=completion),
                prompt_id=prompt.prompt_id, originator_client_id=prompt.client_id,
            )
        prompt.done.set()

    async def _drain_and_end(self) -> None:
        """The session is ending (closed or its agent died): end every queued prompt, then
        publish the terminal session frame."""
        if self._closed_in_batch:
            return  # its frame is published, and its closer waits for the transcript
        with trio.CancelScope(shield=True):
            died = self.agent_exit is not None or self.agent.closed
            while self.queue:
                prompt = self.queue.popleft()
                decision = terminal_for(prompt.state, SessionEnded(agent_died=died))
                if decision is not None:
                    await self._finish(prompt, decision, completion="removed")
            if died:
                exit_code, signal_code = self.agent_exit or (self.agent.exit_code,
                                                                 self.agent.signal_name)
                self.bus.publish(SessionDiedData(
                    session_id=self.id, reason=CHANNEL_CLOSED, exit_code=exit_code,
                    signal_code=signal_code))
            elif self.unloading:
                return  # nobody to tell (no subscriber), nothing to store
            else:
                self.bus.publish(SessionClosedData(session_id=self.id,
                                                   reason=self.closing or "closed"))
            await self._wait_durable()

    async def _wait_durable(self) -> None:
        """Wait (bounded, shielded) until everything this session published is committed."""
        with trio.CancelScope(shield=True):
            await self.wait_durable()

    async def terminal_settled(self) -> None:
        """Cluster mode: wait (at most ``SETTLE_WAIT_S``) while a turn's terminal is in Redis
        but not yet shown here. Another node's reader gets the terminal from Redis as soon as
        Redis holds it, before this owner has seen Redis's answer; a load it then makes here
        must not find the turn still running (a repair would find the turn incomplete)."""
        settling = self._terminal_settling
        if settling is not None:
            with trio.move_on_after(SETTLE_WAIT_S):
                await settling.wait()

    async def wait_durable(self) -> bool:
        """Wait until everything this session has handed to the transcript so far (its
        creation, an admission, events) is committed: at most ``DURABLE_WAIT_S``, after which
        the session is marked degraded (a store that cannot commit never stalls it for
        longer; the writer may set another bound). Returns at once without a transcript, or
        once the session is degraded. True when it is all committed; False when a write failed or did not finish in time,
        or the session was degraded already."""
        bus = self.bus
        writer = bus.writer
        if writer is None:
            return True
        if bus.transcript_degraded:
            return False
        limit = writer.durable_bound_s or DURABLE_WAIT_S
        with trio.move_on_after(limit) as bound:
            committed = await writer.wait_committed(bus.last_write_seq)
        if bound.cancelled_caught:
            writer.mark_failed(self.id, TimeoutError(
                f"transcript commit did not finish within {limit:g} s"))
            return False
        return committed

    async def wait_admitted(self, prompt_id: str | None = None) -> bool:
        """The prompt route's wait before its 202: may the admission just made (of
        ``prompt_id``, or a repeat of it) be acknowledged? A single node waits as
        :meth:`wait_durable` and answers True whatever the store did (a failing store
        degrades the session, it does not refuse prompts). A writer with an
        ``admission_bound_s`` (cluster mode) answers within it whether the admission is
        durable there (in Redis, under this node's lease): False, and the prompt must not be
        acknowledged, when it is not, even on a degraded session. That answer is the
        prompt's fate: it runs only once acknowledged, and one refused never runs (its
        idempotency key is free again), even if its admission reaches Redis later."""
        bus = self.bus
        writer = bus.writer
        if writer is None or writer.admission_bound_s is None:
            await self.wait_durable()
            return True
        prompt = self._in_flight(prompt_id)
        admitted = False
        try:
            with trio.move_on_after(writer.admission_bound_s):
                admitted = await writer.wait_admitted(
                    prompt.admission_seq if prompt is not None else bus.last_write_seq)
        finally:  # also when the request is cancelled: no 202 was given
            if prompt is not None:
                self._decide(prompt, admitted)
        return admitted if prompt is None else bool(prompt.acknowledged)

    def _in_flight(self, prompt_id: str | None) -> PendingPrompt | None:
        if prompt_id is None:
            return None
        if self.active is not None and self.active.prompt_id == prompt_id:
            return self.active
        return next((p for p in self.queue if p.prompt_id == prompt_id), None)

    def _decide(self, prompt: PendingPrompt, acknowledged: bool) -> None:
        """Settle whether ``prompt`` was acknowledged (202) and so may run; once."""
        if prompt.decided.is_set():
            return
        prompt.acknowledged = acknowledged
        prompt.decided.set()
        if not acknowledged:
            log.warning("event=prompt_withdrawn session=%s prompt=%s "
                        "reason=admission_not_in_cluster_in_time", self.id, prompt.prompt_id)
            if prompt.key is not None:
                self.keys.withdraw(prompt.key)

    @property
    def _replicated(self) -> bool:
        """Cluster mode: the transcript that counts is Redis (the writer bounds admissions)."""
        writer = self.bus.writer
        return writer is not None and writer.admission_bound_s is not None

    async def _wait_replicated(self) -> bool:
        """Cluster mode: wait (shielded) until Redis holds everything this session wrote so
        far (and the local store has committed it, within the durability bound). No bound
        while the session lives: Redis away keeps a turn's end waiting, and past the
        durability bound the session is ``transcriptDegraded`` until Redis has caught up.
        Once the session is closing, at most the bound more. True when Redis has it all;
        False when it never will (this node lost the session, whose bus is closed then) or
        the closing session could not wait longer."""
        writer = self.bus.writer
        assert writer is not None
        seq = self.bus.last_write_seq
        bound = writer.durable_bound_s or DURABLE_WAIT_S
        replicated = False
        with trio.CancelScope(shield=True):
            async with trio.open_nursery() as race:
                async def acknowledged() -> None:
                    nonlocal replicated
                    replicated = await writer.wait_admitted(seq)
                    race.cancel_scope.cancel()

                async def lagging() -> None:
                    await trio.sleep(bound)
                    writer.mark_failed(self.id, TimeoutError(
                        f"Redis did not acknowledge within {bound:g} s"))

                async def closing() -> None:
                    await self._close_started.wait()
                    await trio.sleep(bound)
                    race.cancel_scope.cancel()

                race.start_soon(acknowledged)
                race.start_soon(lagging)
                race.start_soon(closing)
            if replicated:
                await self.wait_durable()  # the local store, as on a single node
        return replicated

    # -- commands -----------------------------------------------------------------------------

    async def cancel(self, client_id: str | None) -> None:
        prompt = self.active
        state = None if prompt is None else after_cancel(prompt.state)
        if prompt is None or state is None:
            return
        prompt.state = state
        self.bus.publish(PromptCancelledData(session_id=self.id),
                         prompt_id=prompt.prompt_id, originator_client_id=client_id)
        self._resolve_permissions(prompt.prompt_id, PERMISSION_PROMPT_CANCELLED)
        if prompt.scope is not None:
            grace = trio.current_time() + self.cancel_grace_s
            if grace < prompt.scope.deadline:
                prompt.scope.deadline = grace
        await self._send_cancel()

    async def _send_cancel(self) -> None:
        try:
            await self.agent.cancel(self.acp_session_id)
        except (ChannelClosed, trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            log.info("event=cancel_not_sent session=%s reason=agent_gone", self.id)

    def busy(self) -> bool:
        """A subscriber, a prompt running or queued, or a permission request waiting: the
        session must stay loaded."""
        return bool(self.bus.subscribers or self.active is not None or self.queue
                    or self.permissions)

    def unload(self) -> None:
        """End the session quietly (it is idle, see :meth:`busy`): no ``session_closed``
        frame and nothing written, so its stored history stays exactly as it is for the
        restore that brings it back. Its ``run`` ends (and ``on_ended`` is called) soon after."""
        if self.closing is None:
            self.unloading = True
            self.closing = "idle_unload"
            self._notify()

    async def close(self, reason: str) -> None:
        """End the session: a running prompt gets ``turn_error session_closed``."""
        self.begin_close(reason)
        await self.ended.wait()

    def begin_close(self, reason: str) -> None:
        """:meth:`close` without waiting for the end (:attr:`ended` says when)."""
        if self.closing is None:
            self.closing = reason
            self._close_started.set()
            prompt = self.active
            if prompt is not None:
                prompt.state = after_close(prompt.state)
                if prompt.scope is not None:
                    prompt.scope.cancel()
            self._stop_gate()
            self._notify()

    def close_idle_now(self, reason: str, *, park: bool = False) -> bool:
        """Close an idle session (no prompt running or queued) at once, as one of many closed
        together: its ``session_closed`` frame is published here and its task only ends;
        the caller waits for the transcript once for all of them (see
        :meth:`SessionManager.shutdown`), instead of every session waiting on its own.
        With ``park`` (the process exits once the transcript has it) a session without a
        subscriber leaves its task parked: nothing is left for it to do, and waking it would
        only cost the stop a scheduler pass per session (:attr:`parked` says so). False, with
        nothing done, when the session is not live and idle: close it with
        :meth:`begin_close`."""
        if self.closing is not None or self.active is not None or self.queue \
                or not self.live:
            return False
        self.closing = reason
        self._closed_in_batch = True
        self._close_started.set()
        self.bus.publish(SessionClosedData(session_id=self.id, reason=reason))
        if park and not self.bus.subscribers:
            self.parked = True
        else:
            self._notify()
        return True

    def agent_died(self, exit_code: int | None, signal_code: str | None) -> None:
        if self.agent_exit is None:
            self.agent_exit = (exit_code, signal_code)
            self._stop_gate()
            self._notify()

    # -- permission flow ---------------------------------------------------------------------

    def vote(self, request_id: str, outcome: PermissionOutcome) -> VoteResult:
        """A client's vote: one of the offered options selected, or cancelled."""
        waiter = self.permissions.get(request_id)
        if waiter is None:
            return VoteResult.NOT_FOUND
        option_id = outcome.option_id
        if isinstance(option_id, str) and option_id not in waiter.option_ids:
            return VoteResult.UNKNOWN_OPTION
        self._resolve(waiter, outcome, None)
        return VoteResult.ACCEPTED

    def _resolve(self, waiter: PermissionWaiter, outcome: PermissionOutcome,
                 reason: str | None) -> None:
        """Decide a pending request: publish ``permission_resolved`` now, wake its task (which
        answers the agent)."""
        if self.permissions.pop(waiter.request_id, None) is None:
            return  # decided already
        waiter.outcome = outcome
        self._publish_resolved(waiter.request_id, outcome, reason, waiter.prompt_id)
        waiter.event.set()

    def _publish_resolved(self, request_id: str, outcome: PermissionOutcome, reason: str | None,
                          prompt_id: str | None) -> None:
        data = (PermissionResolvedData(request_id=request_id, outcome=outcome) if reason is None
                else PermissionResolvedData(request_id=request_id, outcome=outcome,
                                            reason=reason))
        self.bus.publish(data, prompt_id=prompt_id)

    def _resolve_permissions(self, prompt_id: str, reason: str) -> None:
        for waiter in list(self.permissions.values()):
            if waiter.prompt_id in (prompt_id, None):
                self._resolve(waiter, _CANCELLED, reason)

    # -- SessionSink (the agent channel calls these) -------------------------------------------

    def publish(self, batch: UpdateBatch) -> None:
        """Publish one read's updates (the agent's own echo of the running prompt left out:
        the daemon published the prompt itself) and wake the subscribers."""
        echo = self._echo
        if echo is not None and echo.open:
            batch = self._without_echo(echo, batch)
        if batch.updates:
            prompt = self.active
            self.bus.publish_updates(
                batch, prompt_id=prompt.prompt_id if prompt is not None else None,
                originator_client_id=prompt.client_id if prompt is not None else None)
        else:
            self.bus.flush()

    @staticmethod
    def _without_echo(echo: PromptEcho, batch: UpdateBatch) -> UpdateBatch:
        """The batch without the agent's own echo of the running prompt."""
        if batch.run is not None:  # one kind of text chunks, already read
            kind, texts = batch.run
            if kind != USER_CHUNK:
                echo.take(kind, None)
                return batch
            echoed = echo.take_texts(kind, texts)
            if not any(echoed):
                return batch
            return batch.keep([i for i, dropped in enumerate(echoed) if not dropped])
        kept = []
        for i, raw in enumerate(batch.updates):
            if echo.open:
                try:
                    found = _decode_update(raw)
                except msgspec.DecodeError:
                    found = None
                if found is not None and echo.take(found.session_update, found.content):
                    continue
            kept.append(i)
        return batch if len(kept) == len(batch.updates) else batch.keep(kept)

    def on_update(self, update: bytes) -> None:
        """One update, for callers that have them one at a time (a scripted agent in a test):
        gathered with the updates before it, and published as one batch at :meth:`flush`."""
        self._updates.append(update)

    def flush(self) -> None:
        """Publish the updates gathered by :meth:`on_update`, and wake the subscribers."""
        updates, self._updates = self._updates, []
        self.publish(UpdateBatch.of(updates))

    def permission_asked(self, params: dict[str, Any]) -> Awaitable[PermissionAnswer]:
        # Synchronous, in stdout order: the request is published, and registered for a vote,
        # before the prompt's reply (read after it) can end the turn.
        prompt = self.active
        prompt_id = prompt.prompt_id if prompt is not None else None
        request_id = str(uuid.uuid4())
        found = view(params, PermissionParamsView)
        options = None if found is None else found.options
        options = options if isinstance(options, list) else []
        self.bus.publish(
            PermissionRequestData(request_id=request_id, session_id=self.id,
                                  tool_call=None if found is None else found.tool_call,
                                  options=options),
            prompt_id=prompt_id,
        )
        auto = self._auto_option(options) if self.approval_mode == "yolo" else None
        if auto is not None:
            outcome = PermissionOutcome(outcome="selected", option_id=auto)
            self._publish_resolved(request_id, outcome, PERMISSION_APPROVAL_MODE, prompt_id)
            return _answered(outcome)
        if prompt is None or prompt.state is not PromptState.RUNNING:
            self._publish_resolved(request_id, _CANCELLED, PERMISSION_NO_RUNNING_PROMPT,
                                   prompt_id)
            return _answered(_CANCELLED)
        waiter = PermissionWaiter(request_id, prompt_id, self._option_ids(options))
        self.permissions[request_id] = waiter
        return self._wait_for_vote(waiter)

    async def _wait_for_vote(self, waiter: PermissionWaiter) -> PermissionAnswer:
        try:
            timeout = self.permission_timeout_s
            with trio.move_on_after(math.inf if timeout is None else timeout):
                await waiter.event.wait()
            if waiter.outcome is None:
                log.info("event=permission_timeout session=%s request=%s timeout_ms=%d",
                         self.id, waiter.request_id, round((timeout or 0) * 1000))
                self._resolve(waiter, _CANCELLED, PERMISSION_TIMEOUT)
        finally:
            # Cancelled meanwhile (the agent died, the daemon stops): nobody can vote on it.
            self.permissions.pop(waiter.request_id, None)
        return PermissionAnswer(outcome=waiter.outcome or _CANCELLED)

    @staticmethod
    def _option_ids(options: list[Any]) -> frozenset[str]:
        ids = set()
        for option in options:
            found = view(option, PermissionOptionView)
            if found is not None and isinstance(found.option_id, str):
                ids.add(found.option_id)
        return frozenset(ids)

    @staticmethod
    def _auto_option(options: list[Any]) -> str | None:
        for option in options:
            found = view(option, PermissionOptionView)
            if found is not None and str(found.kind or "").startswith("allow"):
                option_id = found.option_id
                if isinstance(option_id, str):
                    return option_id
        return None
