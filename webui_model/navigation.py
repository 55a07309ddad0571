"""Navigation and mounting: open (switch), reload, clear, unmount; each session in its own
cancel scope and task group, torn down as one."""

from __future__ import annotations

from contextlib import AsyncExitStack
from types import TracebackType
from typing import Self

import anyio
from anyio.abc import TaskStatus

from sdk._client import LoadResult
from webui_model.loading import Loading
from webui_model.provider_core import ConnectionState, OpenSession, log

__all__ = ["Navigation"]


class Navigation(Loading):
    """Mounting and moving between sessions."""

    # -- mounting --------------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        if self._stack is not None or self._unmounted:
            raise RuntimeError("a WebUIProvider is mounted once")
        stack = AsyncExitStack()
        self._root = await stack.enter_async_context(anyio.create_task_group())
        self._stack = stack
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        assert self._stack is not None
        try:
            await self.unmount()
        finally:
            suppressed = await self._stack.__aexit__(exc_type, exc, tb)
        return bool(suppressed)

    # -- navigation --------------------------------------------------------------------------------

    async def open_session(self, session_id: str) -> LoadResult:
        """Switch to ``session_id``: drop the current session, then load, replay, subscribe."""
        root = self._require_mounted()
        if not session_id:
            raise ValueError("session_id must be a non-empty string")
        self._navigating += 1
        try:
            await self._teardown(clear_store=True)
            session = OpenSession(session_id)
            self._session = session
            await root.start(self._host, session)
        finally:
            self._navigating -= 1
        log.info("event=provider_open session=%s", session_id)
        return await self._load(session, self.history_page_size, initial=True)

    async def reload(self) -> LoadResult:
        """The configured reload of the current session; aborts any repair episode."""
        session = self._require_session()
        if session.driver is not None:
            session.driver.abort()
        return await self._load(session, self.history_page_size, initial=False)

    async def clear(self) -> None:
        """Close the current session and empty the transcript."""
        self._require_mounted()
        self._navigating += 1
        try:
            await self._teardown(clear_store=True)
        finally:
            self._navigating -= 1

    async def unmount(self) -> None:
        """Drop the session (the transcript stays readable) and stop every provider task."""
        if self._unmounted:
            return
        self._navigating += 1
        try:
            await self._teardown(clear_store=False)
        finally:
            self._navigating -= 1
            self._unmounted = True
            if self._root is not None:
                self._root.cancel_scope.cancel()
            self._touch()

    # -- lifetimes ---------------------------------------------------------------------------------
    async def _host(
        self, session: OpenSession, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        with anyio.CancelScope() as scope:
            session.scope = scope
            if session.cancelled:
                scope.cancel()
            async with anyio.create_task_group() as nursery:
                session.nursery = nursery
                task_status.started()
                await anyio.sleep_forever()

    async def _teardown(self, *, clear_store: bool) -> None:
        session, self._session = self._session, None
        if session is not None:
            session.closed = True
            if session.driver is not None:
                session.driver.abort()
            for scope in tuple(session.op_scopes):
                scope.cancel()
            session.cancel()
            session.notify()
            owner = session.owner
            if owner is not None:
                await self._close_quietly(owner)
            log.info("event=provider_session_closed session=%s", session.session_id)
        if clear_store:
            self.store.clear()
        self._set_connection(ConnectionState.IDLE)
