// The sessions this browser remembers (daemon/ui/sidebar.js KnownSessions): a session closed
// here never comes back, not even from a list answer that was already on its way when it closed.
// Run: node --test tests/viewer_js/ (tests/viewer/test_viewer_modules.py does, in make test).
import assert from "node:assert/strict";
import { test } from "node:test";

import { KnownSessions } from "../../daemon/ui/sidebar.js";

class MemoryStorage {
  constructor() { this.map = new Map(); }
  getItem(key) { return this.map.has(key) ? this.map.get(key) : null; }
  setItem(key, value) { this.map.set(key, String(value)); }
}

test("a closed session is not noted again by a late list answer", () => {
  const storage = new MemoryStorage();
  const known = new KnownSessions(storage);
  known.note("s1", { cwd: "/w", seenAt: 1 });
  known.note("s2", { cwd: "/w", seenAt: 2 });
  known.closedForGood("s1");
  assert.equal(known.get("s1"), null);
  // The poll that left before the close answers now, still listing s1.
  assert.equal(known.note("s1", { cwd: "/w", seenAt: 3 }), null);
  assert.equal(known.get("s1"), null);
  assert.deepEqual(JSON.parse(storage.getItem("turnkeeper.viewer.sessions")).map((i) => i.id), ["s2"]);
});

test("forgetting a missing session still lets it be seen again", () => {
  const known = new KnownSessions(new MemoryStorage());
  known.note("s1", { seenAt: 1 });
  known.forget("s1");
  known.note("s1", { seenAt: 2 });
  assert.equal(known.get("s1").seenAt, 2);
});
