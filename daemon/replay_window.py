"""Replay window of compacted completed turns (SPEC §3.2). Pure core.

INTERFACE CONTRACT (the bus depends on these names):

    DEFAULT_MAX_BYTES = 4 * 1024 * 1024

    class Record:                       # one compacted event and its transcript record id
        event: Event; record_id: str | None

    class ReplayWindow:
        def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None
        def add_segment(self, records: Sequence[Record]) -> None    # one completed turn
        def seed(self, segments: Sequence[Sequence[Record]], *, truncated_events: int,
                 truncated_turns: int) -> None                      # cold restore (SPEC §6.2)
        def snapshot(self, *, full_transcript_available: bool) -> list[bytes]
            # retained segments flattened (event.raw reused), marker first if anything dropped
        max_bytes: int; total_bytes: int; segment_count: int; event_count: int
        truncated_events: int; truncated_turns: int
        oldest_record_id: str | None     # the marker's recordId anchor
"""
