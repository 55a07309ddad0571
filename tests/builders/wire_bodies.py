"""Whole answer bodies for fake daemons (httpx.MockTransport): every member the protocol's
response types require, with plain values a test overrides where it cares. The SDK reads
answers with those types (sdk.protocol.http), so a fake answer has to be a real one."""

from __future__ import annotations

from typing import Any

LIMITS: dict[str, int] = {
    "maxJournalEvents": 10_000, "maxJournalBytes": 4_194_304,
    "compactedReplayMaxBytes": 4_194_304, "eventRingSize": 8_000,
    "eventRingBytes": 16_777_216, "agentIdleMs": 0, "sessionRestoreTimeoutMs": 30_000,
    "maxPendingPrompts": 16, "maxSubscribersPerSession": 64,
    "maxRequestBodyBytes": 10_485_760, "maxSessions": 0, "maxConnections": 0,
}


def capabilities(*features: str) -> dict[str, Any]:
    return {"v": 1, "mode": "serve", "features": list(features), "limits": dict(LIMITS)}


def attachment(session_id: str, **extra: Any) -> dict[str, Any]:
    """The members a resume and a load answer share, first (as the reference daemon sends
    them)."""
    return {
        "sessionId": session_id, "workspaceCwd": "/srv/workspace", "attached": True,
        "clientId": "client_x", "createdAt": "2026-12-02T09:43:34.405Z", "state": {},
        "hasRunningBackgroundTasks": False, "hasActivePrompt": False, **extra,
    }


def resume(session_id: str, *, last_event_id: int = 0, epoch: str = "E1",
           **extra: Any) -> dict[str, Any]:
    return attachment(session_id, lastEventId=last_event_id, eventEpoch=epoch, **extra)


def session_status(session_id: str, **extra: Any) -> dict[str, Any]:
    return {
        "sessionId": session_id, "workspaceCwd": "/w", "hasActivePrompt": False,
        "activePromptId": None, "pendingPrompts": 0, "lastEventId": 0, "durableEventId": 0,
        "eventEpoch": "E1", "transcriptDegraded": False, "fullTranscriptAvailable": True,
        "replayDegraded": False, "subscribers": 0, "slowClientWarnings": 0,
        "clientsEvicted": 0,
        "journal": {"entries": 0, "bytes": 0, "truncatedEvents": 0, "retainedEvents": 0},
        "serverTime": 1, **extra,
    }
