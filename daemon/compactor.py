"""Turn-boundary compaction (SPEC §3.1). Pure core: no trio, no clock, no I/O.

INTERFACE CONTRACT (the bus depends on these names):

    class TurnCompactor:
        def add(self, event: Event) -> None     # every non-transient event since the last terminal
        def finish(self, terminal: Event) -> list[JsonObject]
            # the compacted envelopes (dicts, in slot order, ending with the terminal's envelope);
            # resets the compactor for the next turn
        def reset(self) -> None
        pending_events: int                     # events added since the last finish/reset

    def stamp_record(env: JsonObject, record_id: str) -> JsonObject
        # a NEW envelope dict (input untouched) with, for session_update,
        # update._meta["qwen.session.recordId"] = record_id and
        # update._meta.qwenTranscript.sourceRecordIds = [record_id]; other types returned unchanged
        # in content (a shallow copy is fine).
"""
