"""The WebUI model's provider: the async shell (anyio: Trio or asyncio) around the pure store.

A :class:`WebUIProvider` is mounted with ``async with`` (that opens its task group) and owns one
session at a time:

    load → replay (one ``store.reset``) → subscribe → dispatch live events into the store

Everything the reducer asks for as a side effect is performed here: notices go to a
:class:`~webui_model.side_channels.NoticeBoard` (dedup by id, newest 50), everything else to
:class:`~webui_model.side_channels.SideChannels`. The provider talks to the daemon only through
the SDK (``DaemonClient``, ``SessionHandle``, ``RepairDriver``).

Lifetimes
=========

- Each session runs inside its own cancel scope with its own task group (the subscription reader,
  repair attempts and resync reloads live there). Navigation — :meth:`open_session` (switch),
  :meth:`clear`, :meth:`unmount` — aborts the repair episode, cancels that scope and every
  operation still in flight for the session (those raise :class:`SessionAbandonedError`), and
  detaches the session's daemon registration.
- :meth:`reload` is the *configured* reload (``historyPageSize`` = ``history_page_size``); it
  aborts any repair episode. ``state_resync_required`` on the stream triggers one.

Live-journal repair
===================

A snapshot whose live journal starts with a recoverable live marker starts an episode in the
session's :class:`~sdk._repair_driver.RepairDriver`; the provider keeps the episode's
:class:`~webui_model.repair_commit.Checkpoint` (the store just before the marker block) in the
episode's ``ui_state`` and mirrors loaded history pages and provider-local status blocks into
it. The driver arms on the target's terminal; the provider's guards hold the attempt back while
a load, resume, navigation, history-page request or local prompt is in flight, and
``driver.check()`` runs at every idle point (after each live event, when a prompt settles, when
a page request, load, resume or navigation ends). The driver's single memory-replay load hands a
candidate to :meth:`_commit_repair`, which builds the repaired state off-store
(:func:`~webui_model.repair_commit.build_repair`: checkpoint path, or the trimmed-marker
fallback), performs only the side effects of *new* events, and commits with **one**
``store.reset``. A fresh replay that ends with another recoverable live marker becomes the next
episode, with the checkpoint the commit computed for it. Each failed attempt adds exactly one
notice (the driver's).

An attempt ends in one step: ``episode`` (None, or the next episode), ``repair_attempts``,
``repair_outcomes``, the notice and ``connection`` change together, so a task woken by
:meth:`wait_for` sees them consistent. ``await provider.wait_repair()`` waits for the current
episode and returns the attempt's :class:`~sdk._repair_driver.RepairOutcome`, or None when there
is no episode or it ended without an attempt.

Layout
======

The class is composed by job, one module each, over shared state
(:class:`~webui_model.provider_core.ProviderCore`: the open session, connection state, notices,
the lifetime helpers):

- :mod:`webui_model.repair_glue` — repair guards, checkpoints, the repair commit;
- :mod:`webui_model.loading` — loads, the subscription and its live events, resync, resume;
- :mod:`webui_model.history` — :meth:`load_more` and page failures;
- :mod:`webui_model.prompts` — :meth:`prompt` and waiting for its terminal;
- :mod:`webui_model.navigation` — mounting, switching, reload, clear, unmount.

Example::

    async with DaemonClient(url) as client, WebUIProvider(client) as provider:
        await provider.open_session(session_id)
        await provider.prompt("hello")
        print([block.kind for block in provider.store.blocks])
"""

from __future__ import annotations

from webui_model.history import HistoryPaging
from webui_model.navigation import Navigation
from webui_model.prompts import Prompts
from webui_model.provider_core import ConnectionState, LoadWarnings, SessionAbandonedError

__all__ = [
    "ConnectionState",
    "LoadWarnings",
    "SessionAbandonedError",
    "WebUIProvider",
]


class WebUIProvider(Navigation, Prompts, HistoryPaging):
    """The headless WebUI's session provider (see the module docstring).

    ``max_blocks`` is the configured store cap; ``history_page_size`` the ``historyPageSize``
    of ordinary (configured) loads, ``None`` for memory replay; ``page_size`` the ``limit`` of
    :meth:`load_more`. ``load_warnings`` is called after every (re)load, including a repair
    commit. ``handle_options`` go to every :class:`~sdk._session.SessionHandle` (transport,
    reconnect policy, ...). ``detach_timeout`` bounds the courtesy detach of a dropped handle.
    """
