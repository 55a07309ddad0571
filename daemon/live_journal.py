"""Live journal of the unfinished turn (SPEC §2). Pure core: no trio, no clock, no I/O.

INTERFACE CONTRACT (implemented by the journal-core work; the bus depends on these names):

    DEFAULT_MAX_EVENTS = 10_000
    DEFAULT_MAX_BYTES = 8 * 1024 * 1024

    def in_summary(event: Event) -> bool
        SPEC §2.5 filter for the summary journal.

    class LiveJournal:
        def __init__(self, max_events: int = DEFAULT_MAX_EVENTS,
                     max_bytes: int = DEFAULT_MAX_BYTES) -> None
        def append(self, event: Event) -> None          # O(1) amortized, merge + evict
        def reset(self) -> None                         # turn boundary: entries, bytes, counters
        max_events: int; max_bytes: int
        entry_count: int                                # entries now (property or attribute)
        total_bytes: int                                # sum of entry bytes now
        truncated_events: int                           # source events evicted this turn
        retained_events: int                            # source events still held
        def entries(self) -> list[bytes]                # each entry's encoded JSON envelope
                                                        # (unmerged: event.raw reused as is)
        def snapshot(self, *, active_prompt_id: str | None,
                     full_transcript_available: bool,
                     record_id: str | None = None) -> list[bytes]
            # entries(), preceded by the encoded id-less marker of §2.3 when truncated_events > 0

    class LiveJournals:                                  # the full + summary pair (§2.5)
        def __init__(self, max_events: int, max_bytes: int) -> None
        full: LiveJournal; summary: LiveJournal
        def append(self, event: Event) -> None          # full always, summary if in_summary
        def reset(self) -> None
        def snapshot(self, mode: str, ...) -> list[bytes]   # mode "full" | "summary"
"""
