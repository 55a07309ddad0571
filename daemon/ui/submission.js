// Sending a prompt exactly once: the rules of the viewer's resend loop, as the SDK's
// (sdk/submission.py). Every prompt typed here gets one Idempotency-Key for all its sends, so
// the daemon admits it at most once however often it is sent. What a failed send proves:
// - a refusal (a 4xx, a full prompt queue) admitted nothing;
// - anything else (no answer, a cut connection, a 5xx) may have been admitted, so once such a
//   send happened only a 202 settles it: giving up leaves the prompt "unknown", and it is sent
//   again with the same key when the connection is back (never with a new one).
// Pure: no DOM, no network, no clock of its own.

export const PROMPT_QUEUE_FULL = "prompt_queue_full";
export const RESEND_BASE_MS = 250;
export const RESEND_CAP_MS = 4000;
export const RESEND_BUDGET_MS = 20000;   // the sends of one prompt before it counts as unknown
export const SEND_TIMEOUT_MS = 10000;    // one send without an answer is given up (and resent)
const RESENT_STATUSES = new Set([408, 429, 502, 503, 504]);
const KEY_RE = /^[A-Za-z0-9_.:~-]{1,128}$/;

// A fresh key: a random UUID (crypto.randomUUID needs a secure context; a page served over
// plain http to another machine has only getRandomValues).
export function newIdempotencyKey(cryptoApi = globalThis.crypto) {
  if (typeof cryptoApi.randomUUID === "function") return cryptoApi.randomUUID();
  const b = cryptoApi.getRandomValues(new Uint8Array(16));
  b[6] = (b[6] & 0x0f) | 0x40;
  b[8] = (b[8] & 0x3f) | 0x80;
  const hex = [...b].map((x) => x.toString(16).padStart(2, "0")).join("");
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}

export const isIdempotencyKey = (key) => typeof key === "string" && KEY_RE.test(key);

// What one failed send was: {status} for an answer (and its {code, retryable}), or
// {status: null} when no answer came.
function bodyOf(error) {
  return error && error.body && typeof error.body === "object" ? error.body : {};
}

// The daemon answered this very send with a refusal: that send admitted nothing.
export function refused(status, body = {}) {
  if (status === null) return false;
  if (status === 503 && body.code === PROMPT_QUEUE_FULL) return true;
  return status >= 400 && status < 500;
}

// Sending the same request again, with the same key, may succeed.
export function resendable(status, body = {}) {
  if (body.retryable === false || body.code === PROMPT_QUEUE_FULL) return false;
  if (body.retryable === true) return true;
  return status === null || RESENT_STATUSES.has(status);
}

export function resendDelayMs(failures, uniform = Math.random) {
  const backoff = Math.min(RESEND_BASE_MS * 2 ** Math.min(failures - 1, 30), RESEND_CAP_MS);
  return backoff * (0.8 + uniform() * 0.4);
}

// The sends of one prompt: its text, its key, and what the failures so far prove.
export class Submission {
  constructor(text, key) {
    this.text = text;
    this.key = key;
    this.attempts = 0;
    this.maybeAdmitted = false;
    this.lastError = null;
    this.state = "sending";   // sending | resending | unknown
  }

  // Record a failed send ({status, body} as above); returns whether to send again.
  failed(status, error) {
    const body = bodyOf(error);
    this.attempts += 1;
    this.lastError = error;
    if (!refused(status, body)) this.maybeAdmitted = true;
    return resendable(status, body);
  }
}
