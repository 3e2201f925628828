// The client against a real 3-node fencelock cluster (separate processes).
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { Client, compareRevisions, FencelockError } from "../dist/index.js";
import { skipReason, startCluster } from "./cluster.mjs";
import { waitFor, within } from "./fake-server.mjs";

const skip = skipReason();
if (skip) console.log(`# SKIPPING the real-cluster tests: ${skip}`);

describe("against a real cluster", { skip, timeout: 120_000 }, () => {
  let cluster;
  const clients = [];
  const client = (endpoints = cluster.endpoints, options = {}) => {
    const c = new Client(endpoints, { callTimeoutMs: 8000, ...options });
    clients.push(c);
    return c;
  };
  let n = 0;
  const fresh = (what) => `acme/node-${what}-${process.pid}-${Date.now()}-${n++}`;

  before(async () => {
    cluster = await startCluster();
  });
  after(async () => {
    for (const c of clients) await c.close().catch(() => {});
    await cluster?.stop();
  });

  test("lock, contention, release: tokens are exact bigints and strictly increase", async () => {
    const a = client();
    const b = client();
    const resource = fresh("orders");
    const first = await within(a.lock(resource, { ttlMs: 30000 }), 15000, "first lock");
    assert.equal(typeof first.token, "bigint");
    assert.ok(first.token > 0n);
    assert.ok(first.isHeld);
    const state = await b.get(resource);
    assert.equal(state.held, true);
    assert.equal(state.fencingToken, first.token, "get reports the holder's exact token");
    assert.equal(state.shardId, first.shardId);

    const refused = await within(b.lock(resource, { waitMs: 0 }), 15000, "contended lock").catch((e) => e);
    assert.ok(refused instanceof FencelockError, String(refused));
    assert.equal(refused.reason, "LOCK_HELD");
    assert.equal(refused.isLockHeld, true);

    assert.equal(await first.release(), true);
    assert.equal(first.signal.aborted, true);
    const second = await within(b.lock(resource, { ttlMs: 30000 }), 15000, "second lock");
    assert.ok(second.token > first.token, `${second.token} > ${first.token}`);
    assert.equal(await second.release(), true);
    assert.equal(await second.release(), false, "a second release is a no-op");
  });

  test("a waiting acquire is granted in turn when the holder releases", async () => {
    const a = client();
    const b = client();
    const resource = fresh("queue");
    const held = await a.lock(resource, { ttlMs: 30000 });
    const waiting = b.lock(resource, { ttlMs: 30000, waitMs: 20000 });
    await waitFor(async () => (await a.get(resource)).queueLength === 1, 10000, "the waiter to queue");
    await held.release();
    const granted = await within(waiting, 15000, "queued lock");
    assert.ok(granted.token > held.token);
    await granted.release();
  });

  test("a waiting acquire that runs out of time fails with WAIT_TIMED_OUT and holds nothing", async () => {
    const a = client();
    const resource = fresh("timeout");
    const held = await a.lock(resource, { ttlMs: 30000 });
    const err = await within(client().lock(resource, { waitMs: 1000 }), 15000, "lock").catch((e) => e);
    assert.equal(err.reason, "WAIT_TIMED_OUT");
    assert.equal(err.isLockHeld, true);
    assert.equal((await a.get(resource)).queueLength, 0);
    await held.release();
  });

  test("aborting a waiting acquire takes it out of the server's queue", async () => {
    const a = client();
    const resource = fresh("abort");
    const held = await a.lock(resource, { ttlMs: 30000 });
    const ac = new AbortController();
    const waiting = client().lock(resource, { waitMs: 60000, signal: ac.signal }).catch((e) => e);
    await waitFor(async () => (await a.get(resource)).queueLength === 1, 10000, "the waiter to queue");
    ac.abort();
    const err = await within(waiting, 5000, "aborted lock");
    assert.equal(err.code, "ABORTED");
    await waitFor(async () => (await a.get(resource)).queueLength === 0, 10000, "the server to drop the waiter");
    // The next acquire after the release is not held up by a ghost waiter.
    await held.release();
    const next = await within(client().lock(resource, { waitMs: 0 }), 10000, "lock after release");
    assert.ok(next.token > held.token);
    await next.release();
  });

  test("background renewal keeps a short lease alive well past its TTL", async () => {
    const c = client();
    const resource = fresh("renew");
    const lease = await c.lock(resource, { ttlMs: 1500 });
    const firstStopBy = lease.stopBy;
    await new Promise((r) => setTimeout(r, 4000));
    assert.ok(lease.isHeld, `lost: ${lease.lostReason}`);
    assert.ok(lease.stopBy > firstStopBy + 2000, "renewals moved the deadline");
    assert.ok(c.stats.renewedItems >= 4, JSON.stringify(c.stats));
    const state = await c.get(resource);
    assert.equal(state.held, true);
    assert.equal(state.fencingToken, lease.token, "still the same grant");
    assert.equal(await lease.release(), true);
  });

  test("many leases of one client are renewed in few RenewBatch calls", async () => {
    const c = client();
    const leases = await Promise.all(Array.from({ length: 40 }, (_, i) => c.lock(fresh(`batch-${i}`), { ttlMs: 3000 })));
    await waitFor(() => c.stats.renewedItems >= 80, 10000, "two rounds of renewals");
    const { renewBatchCalls, renewedItems } = c.stats;
    assert.ok(renewBatchCalls * 4 <= renewedItems, `${renewBatchCalls} calls for ${renewedItems} renewals`);
    for (const l of leases) assert.ok(l.isHeld);
    await Promise.all(leases.map((l) => l.release()));
    assert.equal(c.heldLeases, 0);
  });

  test("a lease released behind the holder's back is lost (NOT_HELD) at the next renewal, and its signal aborts", async () => {
    const c = client();
    const other = client();
    const resource = fresh("stolen");
    const lease = await c.lock(resource, { ttlMs: 1500 });
    // Someone with the lease id (an operator's `fencelock release`) ends it.
    assert.equal(await other.releaseLease(resource, lease.leaseId), true);
    assert.equal(await within(lease.lost, 5000, "lost"), "NOT_HELD");
    assert.equal(lease.signal.aborted, true);
    assert.equal(lease.signal.reason.lostReason, "NOT_HELD");
    assert.equal(await lease.release(), false);
  });

  test("a stale lease id can neither renew nor release the new holder's lease", async () => {
    const c = client();
    const resource = fresh("stale");
    const old = await c.lock(resource, { ttlMs: 30000 });
    const oldId = old.leaseId;
    await old.release();
    const current = await c.lock(resource, { ttlMs: 30000 });
    assert.equal(await c.releaseLease(resource, oldId), false);
    const state = await c.get(resource);
    assert.equal(state.fencingToken, current.token);
    await current.release();
  });

  test("seeded with one node, the client follows leader hints to every shard", async () => {
    for (const seed of cluster.endpoints) {
      const c = client([seed]);
      const leases = [];
      for (let i = 0; i < 6; i++) leases.push(await within(c.lock(fresh(`route-${i}`), { ttlMs: 30000 }), 15000, "lock"));
      const shards = new Set(leases.map((l) => l.shardId));
      assert.ok(shards.size >= 2, `resources spread over shards: ${[...shards]}`);
      for (const l of leases) assert.equal(await l.release(), true);
    }
  });

  test("an explicit request id learns the original grant instead of a second lease", async () => {
    const c = client();
    const resource = fresh("dedup");
    const requestId = Buffer.from(`req-${resource}`);
    const first = await c.lock(resource, { ttlMs: 30000, requestId });
    // The same logical acquire again (as after a lost reply): same lease, deduplicated.
    const again = await c.lock(resource, { ttlMs: 30000, requestId });
    assert.equal(again.token, first.token);
    assert.equal(again.deduplicated, true);
    assert.ok(again.isHeld);
    await first.release();
    // Once ended, the id reports the ended lease and never takes a new one.
    const ended = await c.lock(resource, { ttlMs: 30000, requestId }).catch((e) => e);
    assert.equal(ended.code, "LEASE_ENDED");
    assert.equal(ended.leaseState, "RELEASED");
    assert.equal(await again.release(), false);
  });

  test("server-side refusals are typed: a bad name and a TTL out of range", async () => {
    const c = client();
    const bad = await c.lock("Acme/Bad Name").catch((e) => e);
    assert.equal(bad.code, "REJECTED");
    assert.equal(bad.reason, "INVALID_RESOURCE");
    assert.equal(bad.retryable, false);
    const ttl = await c.lock(fresh("ttl"), { ttlMs: 10 }).catch((e) => e);
    assert.equal(ttl.reason, "TTL_OUT_OF_RANGE");
    assert.ok(ttl.detail.minAllowed > 0);
  });

  test("await using releases at the end of the block", async () => {
    const c = client();
    const resource = fresh("using");
    let token;
    {
      const lease = await c.lock(resource, { ttlMs: 30000 });
      try {
        token = lease.token;
        assert.equal((await c.get(resource)).held, true);
      } finally {
        await lease[Symbol.asyncDispose]();
      }
    }
    const state = await c.get(resource);
    assert.equal(state.held, false);
    assert.equal(state.fencingToken, 0n);
    // last_token may be 0: an idle record can be dropped (lock.proto); never a different token.
    assert.ok(state.lastToken === token || state.lastToken === 0n, String(state.lastToken));
  });

  /** Values (an election's address) are refused with FEATURE_NOT_ENABLED until the controller has seen every member read them. */
  async function waitForValues(c) {
    const end = performance.now() + 60_000;
    for (;;) {
      const r = await c.lock(fresh("values-probe"), { ttlMs: 5000, value: "probe" }).catch((e) => e);
      if (!(r instanceof Error)) return r.release();
      if (r.reason !== "FEATURE_NOT_ENABLED" || performance.now() > end) throw r;
      await new Promise((res) => setTimeout(res, 500));
    }
  }
  const next = (w, what) => within(w.next(), 20000, what).then((r) => (assert.equal(r.done, false, what), r.value));

  test("a watcher sees the grant and the release with the holder's token; a resumed watch goes on from a revision", async () => {
    const watcher = client();
    const holder = client();
    const resource = fresh("watch");
    const w = await within(watcher.watch(resource), 15000, "watch");
    const state = await next(w, "the state now");
    assert.equal(state.kind, "STATE");
    assert.equal(state.held, false);
    assert.equal(state.fencingToken, 0n);
    const lease = await holder.lock(resource, { ttlMs: 30000 });
    const granted = await next(w, "GRANTED");
    assert.equal(granted.kind, "GRANTED");
    assert.equal(granted.held, true);
    assert.equal(granted.fencingToken, lease.token);
    assert.equal(await lease.release(), true);
    const rel = await next(w, "RELEASED");
    assert.equal(rel.kind, "RELEASED");
    assert.equal(rel.held, false);
    assert.equal(rel.fencingToken, lease.token);
    assert.ok(compareRevisions(state.revision, granted.revision) < 0 && compareRevisions(granted.revision, rel.revision) < 0);
    assert.deepEqual(w.after, rel.revision);
    w.close();

    // Resumed after the grant: the release follows, the grant is not repeated.
    const again = await within(watcher.watch(resource, { after: granted.revision, resume: true }), 15000, "watch again");
    const first = await next(again, "the change after the grant");
    assert.equal(first.kind, "RELEASED");
    assert.deepEqual(first.revision, rel.revision);
    const second = await holder.lock(resource, { ttlMs: 30000 });
    const regranted = await next(again, "the next grant");
    assert.equal(regranted.kind, "GRANTED");
    assert.equal(regranted.fencingToken, second.token);
    assert.ok(second.token > lease.token);
    await second.release();
    again.close();
  });

  test("an election hands over to the candidate queued behind a resigning leader, and observe() sees it", async () => {
    const a = client();
    const b = client();
    const watcher = client();
    await waitForValues(a);
    const name = fresh("election");
    const seen = await within(watcher.election(name).observe({ resume: true }), 15000, "observe");
    assert.equal((await next(seen, "the state now")).kind, "STATE");
    const leaderA = await within(a.election(name).campaign("10.0.0.1:5432", { ttlMs: 30000 }), 15000, "first campaign");
    assert.deepEqual(await b.election(name).leader(), { value: Buffer.from("10.0.0.1:5432"), fencingToken: leaderA.token });
    const campaigning = b.election(name).campaign("10.0.0.2:5432", { ttlMs: 30000 });
    let won = false;
    campaigning.then(() => (won = true), () => {});
    await waitFor(async () => (await a.get(name)).queueLength === 1, 15000, "the second candidate to queue");
    assert.equal(won, false);
    assert.equal(await leaderA.release(), true); // resign
    const leaderB = await within(campaigning, 15000, "second campaign");
    assert.ok(leaderB.token > leaderA.token);
    const changes = [];
    for (let i = 0; i < 3; i++) changes.push(await next(seen, `change ${i}`));
    assert.deepEqual(
      changes.map((e) => [e.kind, e.value.toString(), e.fencingToken]),
      [
        ["GRANTED", "10.0.0.1:5432", leaderA.token],
        ["RELEASED", "", leaderA.token],
        ["GRANTED", "10.0.0.2:5432", leaderB.token],
      ],
    );
    assert.deepEqual(await a.election(name).leader(), { value: Buffer.from("10.0.0.2:5432"), fencingToken: leaderB.token });
    await leaderB.release();
    seen.close();
  });

  /** Shared and semaphore acquires are refused with FEATURE_NOT_ENABLED until the controller has raised the cluster format to 5. */
  async function waitForModes(c) {
    const end = performance.now() + 60_000;
    for (;;) {
      const r = await c.lock(fresh("modes-probe"), { ttlMs: 5000, mode: "shared" }).catch((e) => e);
      if (!(r instanceof Error)) return r.release();
      if (r.reason !== "FEATURE_NOT_ENABLED" || performance.now() > end) throw r;
      await new Promise((res) => setTimeout(res, 500));
    }
  }

  test("two readers hold at once with rising tokens while a writer is refused; get and a watch's STATE list both", async () => {
    const a = client();
    const b = client();
    const writer = client();
    await waitForModes(a);
    const resource = fresh("readers");
    const r1 = await within(a.lock(resource, { ttlMs: 30000, mode: "shared" }), 15000, "first reader");
    const r2 = await within(b.lock(resource, { ttlMs: 30000, mode: "shared" }), 15000, "second reader");
    assert.ok(r1.isHeld && r2.isHeld);
    assert.ok(r2.token > r1.token && r1.token > 0n, "every grant mints its own, larger token");

    const refused = await within(writer.lock(resource, { waitMs: 0 }), 15000, "writer").catch((e) => e);
    assert.ok(refused instanceof FencelockError, String(refused));
    assert.equal(refused.reason, "LOCK_HELD");

    const state = await writer.get(resource);
    assert.equal(state.held, true);
    assert.equal(state.mode, "shared");
    assert.equal(state.permits, 0);
    assert.equal(state.fencingToken, r1.token);
    assert.deepEqual(state.holders.map((h) => [h.fencingToken, h.mode]), [[r1.token, "shared"], [r2.token, "shared"]]);
    const w = await within(writer.watch(resource), 15000, "watch");
    const first = await next(w, "the state now");
    w.close();
    assert.equal(first.kind, "STATE");
    assert.deepEqual(first.holders.map((h) => h.fencingToken), [r1.token, r2.token]);

    assert.equal(await r1.release(), true);
    assert.equal(await r2.release(), true);
    const exclusive = await within(writer.lock(resource, { waitMs: 0 }), 15000, "writer after the readers");
    assert.ok(exclusive.token > r2.token);
    assert.deepEqual((await writer.get(resource)).holders.map((h) => h.mode), ["exclusive"]);
    await exclusive.release();
  });

  test("a semaphore of 2 grants two permits and refuses a third", async () => {
    const [a, b, c] = [client(), client(), client()];
    await waitForModes(a);
    const resource = fresh("semaphore");
    const sem = { ttlMs: 30000, mode: "semaphore", permits: 2 };
    const p1 = await within(a.lock(resource, sem), 15000, "first permit");
    const p2 = await within(b.lock(resource, sem), 15000, "second permit");
    assert.ok(p2.token > p1.token);
    const third = await within(c.lock(resource, sem), 15000, "third permit").catch((e) => e);
    assert.equal(third.reason, "LOCK_HELD");
    const state = await c.get(resource);
    assert.equal(state.mode, "semaphore");
    assert.equal(state.permits, 2);
    assert.deepEqual(state.holders.map((h) => h.fencingToken), [p1.token, p2.token]);

    assert.equal(await p1.release(), true);
    const p3 = await within(c.lock(resource, sem), 15000, "a permit once one is free");
    assert.ok(p3.token > p2.token);
    assert.deepEqual((await c.get(resource)).holders.map((h) => h.fencingToken), [p2.token, p3.token]);
    await p2.release();
    await p3.release();
  });

  test("a resource in use as another kind is refused with MODE_MISMATCH, never retried", async () => {
    const a = client();
    const b = client();
    await waitForModes(a);
    const semaphore = fresh("mismatch-sem");
    const held = await a.lock(semaphore, { ttlMs: 30000, mode: "semaphore", permits: 2 });
    const count = await b.lock(semaphore, { ttlMs: 30000, mode: "semaphore", permits: 3 }).catch((e) => e);
    assert.ok(count instanceof FencelockError, String(count));
    assert.equal(count.code, "REJECTED");
    assert.equal(count.reason, "MODE_MISMATCH");
    assert.equal(count.isModeMismatch, true);
    assert.equal(count.retryable, false);
    assert.equal(count.detail.field, "permits");
    assert.equal(count.detail.minAllowed, 2);
    for (const mode of ["exclusive", "shared"]) {
      const e = await b.lock(semaphore, { ttlMs: 30000, mode }).catch((x) => x);
      assert.equal(e.reason, "MODE_MISMATCH", mode);
    }
    await held.release();

    const lock = fresh("mismatch-lock");
    const reader = await a.lock(lock, { ttlMs: 30000, mode: "shared" });
    const e = await b.lock(lock, { ttlMs: 30000, mode: "semaphore", permits: 2 }).catch((x) => x);
    assert.equal(e.isModeMismatch, true);
    await reader.release();
    // Free again: now it may be a semaphore.
    await (await b.lock(lock, { ttlMs: 30000, mode: "semaphore", permits: 2 })).release();
  });

  // Last: it kills a node.
  test("a killed node: locks and renewals carry on through the other two", async () => {
    const c = client(cluster.endpoints, { attemptTimeoutMs: 1000, connectTimeoutMs: 500 });
    const held = [];
    for (let i = 0; i < 4; i++) held.push(await c.lock(fresh(`kill-${i}`), { ttlMs: 3000 }));
    await cluster.kill(0);
    // New locks still work (elections for the shards node 1 led).
    const after = await within(c.lock(fresh("after-kill"), { ttlMs: 3000 }), 20000, "lock after kill");
    // The held leases were renewed across the failover.
    await new Promise((r) => setTimeout(r, 3500));
    for (const l of held) assert.ok(l.isHeld, `${l.resource} lost: ${l.lostReason}`);
    for (const l of [...held, after]) assert.equal(await l.release(), true);
  });
});
