"""Event ring and the resume decision (SPEC §4.1–§4.2). Pure core.

INTERFACE CONTRACT (the bus and the SSE/WS shells depend on these names):

    DEFAULT_RING_SIZE = 8000
    REPLAY_BUDGET_BYTES = 8 * 1024 * 1024

    class EventRing:
        def __init__(self, capacity: int = DEFAULT_RING_SIZE, next_id: int = 1) -> None
        def append(self, event: Event) -> None      # event.id == next_id; drops head past capacity
        capacity: int
        next_id: int                  # id the next published event gets
        first_id: int | None          # oldest id still held (None when empty)
        last_id: int                  # next_id - 1
        def __len__(self) -> int
        def since(self, after_id: int) -> list[Event]          # held events with id > after_id
        def bytes_since(self, after_id: int) -> int            # their total size, O(1)
        def get(self, event_id: int) -> Event | None

    class ResumePlan:                 # frozen
        before: list[Event]           # synthetic frames sent before the replay (state_resync_required)
        replay: list[Event]           # ring events to replay, ascending ids
        after: list[Event]            # budget resync (if any), then replay_complete
        cursor: int                   # after sending the plan, live delivery continues with id > cursor

    def decide_resume(ring: EventRing, cursor: int | None, client_epoch: str | None,
                      bus_epoch: str, *, now_ms: int | None = None,
                      budget_bytes: int = REPLAY_BUDGET_BYTES) -> ResumePlan
        # cursor None -> live only: empty before/replay/after, cursor = ring.last_id
"""
