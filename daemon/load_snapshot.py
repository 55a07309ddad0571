"""What a load answers from a session's memory, and the over-cap turns read back for it. Trio
shell.

:meth:`daemon.bus.SessionBus.load_snapshot` takes the replay window, the live journal and the
cursor at one instant (a :class:`LoadSnapshot`); a turn bigger than the whole window has left
memory once the transcript held it and stands in the snapshot as a
:class:`~daemon.core.replay_window.SpilledTurn`. :func:`resolve_compacted` reads those turns
back from the transcript, after the snapshot and outside the bus.
"""

from __future__ import annotations

import logging
from functools import partial

import msgspec

from .core.replay_window import SpilledTurn
from .transcript_store import TranscriptDatabase
from .transcript_writer import TranscriptWriter

__all__ = ["LoadSnapshot", "resolve_compacted"]

log = logging.getLogger("daemon.bus")


class LoadSnapshot(msgspec.Struct, frozen=True):
    # A SpilledTurn stands for an over-cap turn the window serves from the transcript; the
    # route replaces it with the records (resolve_compacted) after the snapshot is taken.
    compacted: list[bytes | SpilledTurn]
    live: list[bytes]
    last_event_id: int
    epoch: str
    # The compacted list should the transcript not give the spilled turns back: they count as
    # dropped in the marker (taken with the snapshot, so it matches the cursor).
    compacted_if_lost: list[bytes] | None = None


def _records_by_id(
    session_id: str, ids: tuple[str, ...], store: TranscriptDatabase
) -> list[bytes] | None:
    return store.records_by_id(session_id, ids)


async def resolve_compacted(snap: LoadSnapshot, writer: TranscriptWriter | None,
                            session_id: str) -> list[bytes]:
    """``snap.compacted`` with every spilled turn replaced by its records, read back from the
    transcript (``writer``'s). A turn the transcript cannot give back (the session was deleted
    meanwhile, or the read failed) is reported by the marker as dropped instead."""
    spilled = [item for item in snap.compacted if isinstance(item, SpilledTurn)]
    if not spilled:
        return [item for item in snap.compacted if isinstance(item, bytes)]
    found: dict[tuple[str, ...], list[bytes]] = {}
    if writer is not None:
        for turn in spilled:
            ids = turn.record_ids
            try:
                got = await writer.read(partial(_records_by_id, session_id, ids),
                                        session_id=session_id)
            except Exception as exc:
                log.warning("event=spilled_turn_unreadable session=%s error=%r",
                            session_id, exc)
                got = None
            if got is None:
                break
            found[ids] = got
    if len(found) < len(spilled) and snap.compacted_if_lost is not None:
        return snap.compacted_if_lost
    out: list[bytes] = []
    for item in snap.compacted:
        if isinstance(item, SpilledTurn):
            out.extend(found.get(item.record_ids, ()))
        else:
            out.append(item)
    return out
