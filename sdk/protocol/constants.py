"""Numbers and names the daemon and its clients must agree on (one definition each)."""

from __future__ import annotations

from typing import Final

#: Largest event id / cursor a JSON number carries exactly (JavaScript's Number.MAX_SAFE_INTEGER).
MAX_EVENT_ID: Final = 2**53 - 1

#: The envelope schema version every frame carries as ``v``.
ENVELOPE_VERSION: Final = 1

#: The two event types that end a prompt; every admitted prompt gets exactly one.
TERMINAL_TYPES: Final = frozenset({"turn_complete", "turn_error"})

#: ``state_resync_required.reason`` values. ``epoch_reset`` means a new bus numbers from 1 again.
RESYNC_EPOCH_RESET: Final = "epoch_reset"
RESYNC_RING_EVICTED: Final = "ring_evicted"
RESYNC_SEEDED_REPLAY_NOT_IN_RING: Final = "seeded_replay_not_in_ring"
RESYNC_REPLAY_BUDGET_EXCEEDED: Final = "replay_budget_exceeded"
#: ``state_resync_required.detail`` of an ``epoch_reset`` asked for by a cursor of another epoch.
RESYNC_EPOCH_MISMATCH: Final = "epoch_mismatch"

#: ``history_truncated``: its one ``reason`` and the scope of the live-turn marker.
REPLAY_WINDOW_EXCEEDED: Final = "replay_window_exceeded"
LIVE_JOURNAL_SCOPE: Final = "live_journal"

#: The ``_meta.source`` of the user echo the daemon publishes when a prompt starts running.
BRIDGE_ECHO: Final = "bridge-echo"

#: Where compacted turns carry their transcript record id (``update._meta[...]``).
RECORD_ID_META_KEY: Final = "qwen.session.recordId"

#: ``permission_resolved.reason``: why the daemon answered a permission request by itself
#: (a client's vote carries no reason). Each answers the agent ``{outcome: "cancelled"}`` but
#: the yolo approval, which selects the first allow option.
PERMISSION_TIMEOUT: Final = "timeout"
PERMISSION_PROMPT_CANCELLED: Final = "prompt_cancelled"
PERMISSION_TURN_ENDED: Final = "turn_ended"
PERMISSION_NO_RUNNING_PROMPT: Final = "no_running_prompt"
PERMISSION_APPROVAL_MODE: Final = "approval_mode"
PERMISSION_RESOLVED_REASONS: Final = frozenset({
    PERMISSION_TIMEOUT, PERMISSION_PROMPT_CANCELLED, PERMISSION_TURN_ENDED,
    PERMISSION_NO_RUNNING_PROMPT, PERMISSION_APPROVAL_MODE,
})

#: What a client says when a load answers ``agentSessionRestored: false``: the daemon restored
#: the session from its transcript, but the agent's own ``session/load`` failed (or the agent
#: has none) and it runs on a new agent session without the earlier turns.
AGENT_CONTEXT_LOST: Final = "the agent could not restore its own context; the transcript is intact"

__all__ = [
    "AGENT_CONTEXT_LOST",
    "BRIDGE_ECHO",
    "ENVELOPE_VERSION",
    "LIVE_JOURNAL_SCOPE",
    "MAX_EVENT_ID",
    "PERMISSION_APPROVAL_MODE",
    "PERMISSION_NO_RUNNING_PROMPT",
    "PERMISSION_PROMPT_CANCELLED",
    "PERMISSION_RESOLVED_REASONS",
    "PERMISSION_TIMEOUT",
    "PERMISSION_TURN_ENDED",
    "RECORD_ID_META_KEY",
    "REPLAY_WINDOW_EXCEEDED",
    "RESYNC_EPOCH_MISMATCH",
    "RESYNC_EPOCH_RESET",
    "RESYNC_REPLAY_BUDGET_EXCEEDED",
    "RESYNC_RING_EVICTED",
    "RESYNC_SEEDED_REPLAY_NOT_IN_RING",
    "TERMINAL_TYPES",
]
