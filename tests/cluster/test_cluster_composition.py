"""Cluster mode meets the single-node code through small interfaces, and those interfaces hold.

``daemon/cluster/`` composes with the bus and the transcript writer instead of subclassing them:
a mirror feeds an ordinary bus through its public methods (:meth:`SessionBus.append_numbered`,
:meth:`SessionBus.move_to_epoch`), the Redis shipping is one of the writer's replicas
(:class:`daemon.transcript_writer.Replica`). The structure is checked on the syntax tree (no
class derives from the bus or the writer, no attribute of another object is read or written by
a private name); the interfaces on a real bus and a real writer over a real SQLite file.
"""

from __future__ import annotations

import ast
from pathlib import Path

import msgspec
import trio
import trio.testing

import daemon
from daemon.bus import BusLimits, SessionBus
from daemon.core.envelope import Event, make_event
from daemon.core.subscriber import SubscriberState
from daemon.streams import EventPump, Subscription
from daemon.transcript_store import AppendEvent, Op, TranscriptDatabase, UpsertSession
from daemon.transcript_writer import TranscriptWriter

CLUSTER = Path(daemon.__file__).parent / "cluster"
SID = "11111111-1111-4111-8111-111111111111"


def _modules() -> list[Path]:
    return sorted(CLUSTER.glob("*.py"))


def test_the_cluster_package_subclasses_neither_the_bus_nor_the_writer() -> None:
    bases = [(path.name, ast.unparse(base)) for path in _modules()
             for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.ClassDef) for base in node.bases]
    assert bases, "no class found: the walk is broken"
    assert [b for b in bases if b[1].split(".")[-1] in {"SessionBus", "TranscriptWriter"}] == []


def _foreign_private(source: str) -> list[str]:
    """``x._name`` where ``x`` is not ``self``, ``cls`` or a module's own name."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and not (isinstance(node.value, ast.Name) and node.value.id in {"self", "cls"})):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_cluster_package_touches_no_other_objects_private_names() -> None:
    found = {path.name: _foreign_private(path.read_text()) for path in _modules()}
    assert {name: hits for name, hits in found.items() if hits} == {}
    # The check sees what the old mirror did to its bus.
    assert _foreign_private("mirror.bus._dirty = True\n") == ["1: mirror.bus._dirty"]


# --- the bus fed by events numbered elsewhere ------------------------------------------------

def _bus(first_id: int = 1) -> SessionBus:
    return SessionBus(SID, BusLimits(1000, 8 << 20, 4 << 20, 100), None, first_id=first_id,
                      epoch="epoch-a")


def _event(event_id: int, text: str = "x") -> Event:
    event = make_event(event_id, "session_update", {
        "sessionId": SID, "update": {"sessionUpdate": "agent_message_chunk",
                                     "content": {"type": "text", "text": text}}}, now_ms=1)
    event.release()
    return event


def test_numbered_events_keep_their_ids_skip_what_is_held_and_restart_after_a_gap() -> None:
    bus = _bus(first_id=5)
    changed: list[int] = []
    bus.on_subscribers_changed.append(lambda: changed.append(len(bus.subscribers)))
    sub = Subscription(SubscriberState(4, 256))
    bus.add_subscriber(sub)
    assert [bus.append_numbered(_event(i)) for i in (5, 6, 6, 4)] == [True, True, False, False]
    assert bus.append_numbered(_event(9))  # 7 and 8 never came: the ring starts again at 9
    bus.flush()
    assert bus.ring.first_id == 9 and bus.ring.last_id == 9
    bus.remove_subscriber(sub)
    assert changed == [1, 0]


def test_moving_to_a_new_epoch_resyncs_every_subscriber_once_then_reads_on() -> None:
    bus = _bus()
    for i in (1, 2, 3):
        bus.append_numbered(_event(i))
    bus.flush()
    sub = Subscription(SubscriberState(2, 256))
    bus.add_subscriber(sub)
    pump = EventPump(bus, sub, 10.0)
    bus.move_to_epoch("epoch-b", 40)
    bus.append_numbered(_event(40))
    bus.flush()
    batch = pump.next_batch()
    assert batch is not None
    resync, *rest = batch
    assert resync.type == "state_resync_required"
    assert msgspec.json.decode(resync.raw)["data"] == {"reason": "epoch_reset", "detail": "epoch_mismatch",
                                  "lastDeliveredId": 2, "earliestAvailableId": 40}
    assert [e.id for e in rest] == [40] and bus.epoch == "epoch-b"
    bus.append_numbered(_event(41))
    bus.flush()
    assert [e.id for e in pump.next_batch() or []] == [41]  # the resync went once


# --- the writer and its replicas -------------------------------------------------------------

class FakeReplica:
    """A replica whose acknowledgements the test gives by hand."""

    admission_bound_s: float | None = 0.5
    durable_bound_s: float | None = 2.0

    def __init__(self) -> None:
        self.accepted: list[tuple[int, str, bool]] = []
        self.acked: dict[int, bool] = {}
        self.durable: dict[str, int] = {}
        self.lagging: set[str] = set()
        self._changed = trio.Event()

    def accept(self, seq: int, op: Op, *, local_only: bool = False) -> None:
        self.accepted.append((seq, type(op).__name__, local_only))

    def ack(self, seq: int, ok: bool = True) -> None:
        self.acked[seq] = ok
        self._changed.set()
        self._changed = trio.Event()

    async def wait_acked(self, seq: int) -> bool:
        while seq not in self.acked:
            await self._changed.wait()
        return self.acked[seq]

    def durable_event_id(self, session_id: str) -> int:
        return self.durable.get(session_id, 0)

    def reset_durable(self, session_id: str) -> None:
        self.durable.pop(session_id, None)

    def is_lagging(self, session_id: str) -> bool:
        return session_id in self.lagging

    def hold_back(self, session_id: str, seq: int, why: str) -> bool:
        if seq in self.acked:
            return False
        self.lagging.add(session_id)
        return True


async def test_an_op_is_committed_once_the_store_and_the_replica_have_it(
        tmp_path: Path) -> None:
    store = TranscriptDatabase(tmp_path / "t.sqlite3")
    replica = FakeReplica()
    writer = TranscriptWriter(store, replicas=[replica])
    assert writer.admission_bound_s == 0.5 and writer.durable_bound_s == 2.0
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        upsert = writer.submit(UpsertSession(SID, "/w", 1, "acp"))
        event = writer.submit(AppendEvent(SID, 1, None, b'{"id":1}'))
        local = writer.submit_local(AppendEvent(SID, 2, None, b'{"id":2}'))
        assert replica.accepted == [(upsert, "UpsertSession", False),
                                    (event, "AppendEvent", False), (local, "AppendEvent", True)]
        done: list[bool] = []
        answered = trio.Event()

        async def wait() -> None:
            done.append(await writer.wait_committed(event))
            answered.set()

        nursery.start_soon(wait)
        await writer.read(lambda store: None)  # every op so far is in the store
        await trio.testing.wait_all_tasks_blocked()
        assert done == []  # the store has it, the replica not yet
        replica.ack(upsert)
        replica.ack(event, ok=False)
        with trio.fail_after(10):
            await answered.wait()
        assert done == [False]  # refused by the replica: not committed
        replica.durable[SID] = 7
        assert writer.durable_event_id(SID) == 7  # what the replica acknowledged
        writer.mark_failed(SID, TimeoutError("slow"))
        assert writer.is_degraded(SID) and SID not in writer.failed_sessions  # lagging only
        replica.ack(local)
        await writer.aclose()
        nursery.cancel_scope.cancel()
    store.close()
