// The wire protocol's names and numbers the viewer uses, in one place: headers, routes, event
// types, status words, error codes and the texts clients must say the same way. Each value is
// the Python protocol package's (sdk/protocol); tests/test_viewer_protocol.py holds them equal,
// so this module can later be generated from that package. Pure: no DOM, no network.

// --- envelopes ---------------------------------------------------------------------------------

export const ENVELOPE_VERSION = 1;
export const MAX_EVENT_ID = 2 ** 53 - 1;

// --- headers -----------------------------------------------------------------------------------

export const HEADER_AUTHORIZATION = "Authorization";
export const HEADER_CLIENT_ID = "X-Qwen-Client-Id";
export const HEADER_LAST_EVENT_ID = "Last-Event-ID";
export const HEADER_EVENT_EPOCH = "X-Qwen-Event-Epoch";
export const HEADER_IDEMPOTENCY_KEY = "Idempotency-Key";
export const EVENT_STREAM_TYPE = "text/event-stream";

// --- routes ------------------------------------------------------------------------------------

export const ROUTES = Object.freeze({
  capabilities: () => "/capabilities",
  daemonStatus: () => "/daemon/status",
  create: () => "/session",
  load: (sid) => `/session/${enc(sid)}/load`,
  events: (sid) => `/session/${enc(sid)}/events`,
  prompt: (sid) => `/session/${enc(sid)}/prompt`,
  cancel: (sid) => `/session/${enc(sid)}/cancel`,
  detach: (sid) => `/session/${enc(sid)}/detach`,
  status: (sid) => `/session/${enc(sid)}/status`,
  transcript: (sid) => `/session/${enc(sid)}/transcript`,
  close: (sid) => `/session/${enc(sid)}`,
  permission: (sid, requestId) => `/session/${enc(sid)}/permission/${enc(requestId)}`,
});

function enc(value) {
  return encodeURIComponent(value);
}

// --- event types -------------------------------------------------------------------------------

export const EVENT = Object.freeze({
  sessionUpdate: "session_update",
  historyTruncated: "history_truncated",
  turnComplete: "turn_complete",
  turnError: "turn_error",
  permissionRequest: "permission_request",
  permissionResolved: "permission_resolved",
  promptCancelled: "prompt_cancelled",
  sessionClosed: "session_closed",
  sessionDied: "session_died",
  slowClientWarning: "slow_client_warning",
  clientEvicted: "client_evicted",
  streamError: "stream_error",
  stateResyncRequired: "state_resync_required",
  replayComplete: "replay_complete",
  sessionSnapshot: "session_snapshot",
  pendingPromptAdded: "pending_prompt_added",
  pendingPromptStarted: "pending_prompt_started",
  pendingPromptCompleted: "pending_prompt_completed",
});

export const TERMINAL_TYPES = new Set([EVENT.turnComplete, EVENT.turnError]);
export const HISTORY_TRUNCATED = EVENT.historyTruncated;

// --- status words and meta keys ----------------------------------------------------------------

export const REPLAY_WINDOW_EXCEEDED = "replay_window_exceeded";
export const LIVE_JOURNAL_SCOPE = "live_journal";
export const BRIDGE_ECHO = "bridge-echo";
export const RECORD_ID_META_KEY = "qwen.session.recordId";
export const FOLLOWUP_META_KEY = "followupSuggestion";
export const PAGINATION_CAPABILITY = "session_transcript_pagination";
export const SESSION_SCOPE_THREAD = "thread";
export const TOOL_STATUSES = Object.freeze(["pending", "in_progress", "completed", "failed",
  "cancelled"]);

// Why the daemon answered a permission request by itself (permission_resolved.reason).
export const PERMISSION_REASONS = Object.freeze({
  timeout: "timed out: nobody answered in time",
  prompt_cancelled: "the prompt was cancelled",
  turn_ended: "the turn ended first",
  no_running_prompt: "no prompt was running",
  approval_mode: "approved by the daemon's approval mode",
});

// --- error codes and texts every client says the same way --------------------------------------

export const CODE_SESSION_NOT_FOUND = "session_not_found";
export const AGENT_CONTEXT_LOST_CODE = "daemon.agent_context_lost";
export const AGENT_CONTEXT_LOST =
  "the agent could not restore its own context; the transcript is intact";
export const HISTORY_FAILED_CODE = "daemon.transcript_history.failed";
