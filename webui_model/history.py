"""History paging: :meth:`load_more` fetches the page before the anchor and prepends it
(older transcript records before the anchor record id); failures become notices or a latched error."""

from __future__ import annotations

from sdk._errors import DaemonError
from webui_model.pagination import (
    PageError,
    PaginationState,
    after_page_error,
    load_more,
)
from webui_model.provider_core import OpenSession, log
from webui_model.repair_commit import mirror_page
from webui_model.repair_glue import RepairGlue
from webui_model.replay import PageOutcome, apply_history_page

__all__ = ["HistoryPaging"]


class HistoryPaging(RepairGlue):
    """Older history pages, one request at a time."""

    async def load_more(self, *, force: bool = False) -> PageOutcome | None:
        """Fetch and prepend the next older history page.

        Returns the applied (or capacity-rejected) page, or None when no request was made (no
        more history, a latched error without ``force``, a request already in flight) or it
        failed: transient failures add a ``daemon.transcript_history.failed`` notice and keep
        ``has_more``; other failures latch ``pagination_error``.
        """
        session = self._require_session()
        if session.page_requests:
            return None
        pagination, request = load_more(self.store.pagination, force=force)
        if pagination != self.store.pagination:
            self._set_pagination(session, pagination)
        owner = session.owner
        if request is None or owner is None:
            return None
        generation = session.generation
        session.page_requests += 1
        try:
            with self._operation(session):
                try:
                    page = await owner.client.transcript_page(
                        session.session_id,
                        limit=request.limit,
                        cursor=request.cursor,
                        before_record_id=request.before_record_id,
                    )
                except DaemonError as exc:
                    self._page_failed(session, exc)
                    return None
            self._require_current(session)
            if session.generation != generation:
                log.info("event=history_page_dropped session=%s", session.session_id)
                return None
            outcome = apply_history_page(
                self.store.snapshot_state(),
                page,
                configured_max_blocks=self.store.configured_max_blocks,
            )
            self.store.reset(outcome.state)
            blocks, after = outcome.page_blocks, outcome.state.pagination
            self._mirror(session, lambda cp: mirror_page(cp, blocks, pagination=after))
            return outcome
        finally:
            session.page_requests -= 1
            self._idle_point(session)

    def _set_pagination(self, session: OpenSession, pagination: PaginationState) -> None:
        self.store.set_pagination(pagination)
        self._mirror(session, lambda cp: mirror_page(cp, (), pagination=pagination))

    def _page_failed(self, session: OpenSession, exc: DaemonError) -> None:
        status = getattr(exc, "status", None)
        code = getattr(exc, "code", None)
        error = PageError(
            message=str(exc) or type(exc).__name__,
            status=status if isinstance(status, int) else None,
            code=code if isinstance(code, str) else None,
        )
        log.info(
            "event=history_page_failed session=%s status=%s error=%r",
            session.session_id,
            error.status,
            error.message,
        )
        if session.closed:
            return
        pagination, notice = after_page_error(self.store.pagination, error)
        if pagination != self.store.pagination:
            self._set_pagination(session, pagination)
        if notice is not None:
            self.add_notice(notice)
