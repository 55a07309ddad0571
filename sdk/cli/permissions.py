"""Permission requests during ``turnkeeper prompt``: shown on stderr, answered by ``--approve``,
by the user on the terminal, or cancelled (with the prompt) when nobody can answer.

A script cannot give consent: without a terminal and without ``--approve`` the request and the
prompt are cancelled and the command exits 7, rather than hang or grant anything.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Final, TextIO

import anyio
import msgspec
from anyio.abc import TaskGroup

from sdk._client import DaemonClient
from sdk._errors import DaemonError, SessionNotFoundError
from sdk._lines import LineReader
from sdk.cli.output import Output
from sdk.cli.parser import APPROVE_KINDS
from sdk.protocol.constants import PERMISSION_TIMEOUT
from sdk.protocol.envelope import DaemonEvent
from sdk.protocol.events import PermissionOption, PermissionRequestData, PermissionResolvedData

# Bounds the courtesy calls made while giving up (cancel on timeout, cancel on a refused
# permission): the command must end even when the daemon does not answer.
CLEANUP_S: Final = 5.0

_encode = msgspec.json.Encoder().encode


def stdin_is_tty() -> bool:
    try:
        return sys.stdin is not None and sys.stdin.isatty()
    except (AttributeError, ValueError):
        return False


def pick_option(options: Sequence[PermissionOption], approve: str) -> PermissionOption | None:
    """The option ``--approve approve`` answers with: the first of that kind, else None."""
    kind = APPROVE_KINDS.get(approve)
    if kind is None:
        return None
    return next((option for option in options if option.kind == kind), None)


def describe_permission(request: PermissionRequestData) -> str:
    """One line naming what the agent wants to do."""
    tool = request.tool
    what = tool.title if tool.title else "(untitled tool call)"
    details = []
    if tool.tool_call_id is not None:
        details.append(f"tool call {tool.tool_call_id}")
    if tool.kind is not None:
        details.append(f"kind {tool.kind}")
    return what + (f" ({', '.join(details)})" if details else "")


class _Answer:
    """One decision on a permission request: an option, or cancel (``option is None``)."""

    __slots__ = ("option", "why")

    def __init__(self, option: PermissionOption | None, why: str) -> None:
        self.option = option
        self.why = why


def describe_resolution(resolved: PermissionResolvedData) -> str:
    """One line for a permission request answered while we were asking about it."""
    outcome = _encode(resolved.outcome).decode()
    request = f"permission request {resolved.request_id[:8]}"
    if resolved.reason == PERMISSION_TIMEOUT:
        return (f"{request} timed out: nobody answered within the daemon's permission "
                f"timeout, so the agent was answered {outcome}")
    if isinstance(resolved.reason, str):
        return f"{request} was answered by the daemon ({resolved.reason}): {outcome}"
    return f"{request} was answered elsewhere: {outcome}"


class Permissions:
    """Answers the permission requests of one prompt.

    Each request is shown on stderr. ``approve`` answers it at once; otherwise, with a terminal
    on stdin, the user picks an option there; with neither the request is cancelled, the
    prompt is cancelled and ``refused`` says why (the command exits 7). A request answered by
    another client first (``permission_resolved``) stops the question.
    """

    def __init__(
        self,
        client: DaemonClient,
        session_id: str,
        out: Output,
        nursery: TaskGroup,
        *,
        approve: str | None,
        interactive: bool,
        stdin: TextIO | None = None,
    ) -> None:
        self.client = client
        self.session_id = session_id
        self.out = out
        self.approve = approve
        self.interactive = interactive
        self.refused: str | None = None
        self.error: DaemonError | None = None
        self.answered = 0
        self._nursery = nursery
        self._stdin = stdin if stdin is not None else sys.stdin
        self._asking: dict[str, anyio.CancelScope] = {}
        self._lines: LineReader | None = None

    def on_event(self, event: DaemonEvent) -> None:
        payload = event.payload
        if isinstance(payload, PermissionRequestData) and payload.request_id:
            scope = anyio.CancelScope()
            self._asking[payload.request_id] = scope
            self._nursery.start_soon(self._answer, payload.request_id, payload, scope)
        elif isinstance(payload, PermissionResolvedData):
            asking = self._asking.pop(payload.request_id, None)
            if asking is not None:
                asking.cancel()
                self.out.error(describe_resolution(payload))

    async def _answer(
        self, request_id: str, request: PermissionRequestData, scope: anyio.CancelScope
    ) -> None:
        options = request.answers
        self.out.error(f"permission requested: {describe_permission(request)}")
        answer: _Answer | None = None
        with scope:
            if self.approve is not None:
                option = pick_option(options, self.approve)
                if option is None and self.approve != "cancel":
                    why = f"--approve {self.approve}: no option of that kind, cancelled"
                else:
                    why = f"--approve {self.approve}"
                answer = _Answer(option, why)
            elif self.interactive:
                answer = await self._ask(options)
        if answer is None and scope.cancelled_caught:
            return  # answered by another client meanwhile
        # Past this point a permission_resolved is our own vote's echo: nothing to cancel.
        if request_id in self._asking:
            del self._asking[request_id]
        try:
            if answer is None:
                await self._refuse(request_id)
                return
            await self._vote(request_id, answer)
        except DaemonError as exc:
            self.error = exc
            self._nursery.cancel_scope.cancel()

    async def _vote(self, request_id: str, answer: _Answer) -> None:
        option = answer.option
        try:
            if option is None:
                await self.client.vote_permission(self.session_id, request_id, cancelled=True)
                chosen = "cancelled"
            else:
                await self.client.vote_permission(
                    self.session_id, request_id, option_id=option.option_id
                )
                chosen = option.label
        except SessionNotFoundError as exc:
            if exc.code != "permission_not_found":
                raise
            self.out.error(f"permission request {request_id[:8]} was already answered")
            return
        self.answered += 1
        self.out.error(f"answered: {chosen} ({answer.why})")

    async def _refuse(self, request_id: str) -> None:
        self.refused = (
            "the agent asked for permission and stdin is not a terminal: nobody can answer, so "
            "the request and the prompt were cancelled (use --approve to answer without asking)"
        )
        with anyio.move_on_after(CLEANUP_S):
            try:
                await self.client.vote_permission(self.session_id, request_id, cancelled=True)
            except SessionNotFoundError:
                pass  # answered meanwhile: the prompt is cancelled all the same
            await self.client.cancel(self.session_id)

    async def _ask(self, options: list[PermissionOption]) -> _Answer:
        valid = options
        for number, option in enumerate(valid, 1):
            self.out.error_raw(f"  {number}) {option.label}\n")
        self.out.error_raw("  c) cancel the request\n")
        choices = f"1-{len(valid)}, c" if valid else "c"
        while True:
            self.out.error_raw(f"answer ({choices}): ")
            line = await self._next_line()
            if line is None:
                self.out.error_raw("\n")
                return _Answer(None, "end of input")
            text = line.strip().lower()
            if text in ("c", "cancel"):
                return _Answer(None, "your answer")
            if text.isdigit() and 1 <= int(text) <= len(valid):
                return _Answer(valid[int(text) - 1], "your answer")
            self.out.error_raw(f"please answer {choices}\n")

    async def _next_line(self) -> str | None:
        # One reader for the whole prompt: what a question cancelled mid-read had read stays
        # buffered for the next question, and no thread is left behind blocked on the terminal.
        if self._lines is None:
            self._lines = LineReader(self._stdin.fileno())
        return await self._lines.readline()
