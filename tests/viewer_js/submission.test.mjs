// daemon/ui/submission.js: which failed sends are resent, which prove nothing was admitted.
import assert from "node:assert/strict";
import { test } from "node:test";

import {
  Submission, isIdempotencyKey, newIdempotencyKey, refused, resendDelayMs, resendable,
} from "../../daemon/ui/submission.js";

test("a key is a UUID the daemon accepts, with or without randomUUID", () => {
  const own = newIdempotencyKey();
  const fallback = newIdempotencyKey({ getRandomValues: (a) => globalThis.crypto.getRandomValues(a) });
  for (const key of [own, fallback]) {
    assert.match(key, /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
    assert.ok(isIdempotencyKey(key));
  }
  assert.notEqual(newIdempotencyKey(), newIdempotencyKey());
  assert.ok(!isIdempotencyKey("has space"));
});

test("no answer, gateways and an unavailable owner are resent; refusals and 500 are not", () => {
  for (const status of [null, 408, 429, 502, 503, 504]) assert.ok(resendable(status), String(status));
  for (const status of [400, 401, 404, 409, 500]) assert.ok(!resendable(status), String(status));
  assert.ok(!resendable(503, { code: "prompt_queue_full" }));
  assert.ok(!resendable(503, { retryable: false }));
  assert.ok(resendable(500, { retryable: true }));
});

test("only a refusal proves nothing was admitted", () => {
  assert.ok(refused(404) && refused(409) && refused(503, { code: "prompt_queue_full" }));
  assert.ok(!refused(null) && !refused(500) && !refused(503));
  const s = new Submission("hi", newIdempotencyKey());
  assert.equal(s.failed(404, { body: { code: "session_not_found" } }), false);
  assert.equal(s.maybeAdmitted, false);
  assert.equal(s.failed(null, new Error("cut")), true);
  assert.equal(s.maybeAdmitted, true);
  assert.equal(s.failed(400, { body: {} }), false);
  assert.equal(s.maybeAdmitted, true, "a later refusal does not undo an earlier maybe");
  assert.equal(s.attempts, 3);
});

test("resend waits grow to a cap, with jitter", () => {
  assert.equal(resendDelayMs(1, () => 0.5), 250);
  assert.equal(resendDelayMs(2, () => 0.5), 500);
  assert.equal(resendDelayMs(20, () => 0.5), 4000);
  assert.equal(resendDelayMs(1, () => 0), 200);
  assert.ok(Math.abs(resendDelayMs(1, () => 1) - 300) < 1e-9);
});
