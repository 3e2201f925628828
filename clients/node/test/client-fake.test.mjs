// The client against scripted fake nodes: retries, routing, request ids,
// stop-by, renewals and the lost signal.
import assert from "node:assert/strict";
import { after, test } from "node:test";
import * as grpc from "@grpc/grpc-js";
import { Client, FencelockError, LockLostError } from "../dist/index.js";
import { batchReply, fail, grant, released, renewed, startFake, transport, waitFor, within } from "./fake-server.mjs";

const nodes = [];
const clients = [];
async function fake(handlers) {
  const n = await startFake(handlers);
  nodes.push(n);
  return n;
}
function client(endpoints, options = {}) {
  const c = new Client(endpoints, { callTimeoutMs: 5000, backoffBaseMs: 5, backoffMaxMs: 50, ...options });
  clients.push(c);
  return c;
}
after(async () => {
  for (const c of clients) await c.close().catch(() => {});
  for (const n of nodes) n.kill();
});

const acquires = (n) => n.calls.filter((c) => c.method === "Acquire");

test("NOT_LEADER with a hint: the retry goes to the leader with the same request id, and later calls go there directly", async () => {
  const leader = await fake({
    Acquire: () => grant({ shardId: 3 }),
    Release: () => released(),
    RenewBatch: (items) => batchReply(items.map(() => ({ renewed: { expiresAtMs: 0, leaseTtlMs: 30000 } }))),
  });
  const follower = await fake({
    Acquire: () => {
      throw fail("NOT_LEADER", { leader: { nodeId: 2, address: leader.address }, shardId: 3 });
    },
  });
  const c = client([follower.address]);
  const lease = await within(c.lock("acme/a", { ttlMs: 30000 }), 5000, "lock");
  assert.equal(lease.token, 42n);
  assert.equal(acquires(follower).length, 1);
  assert.equal(acquires(leader).length, 1);
  assert.deepEqual(acquires(follower)[0].request.requestId, acquires(leader)[0].request.requestId);
  assert.equal(acquires(leader)[0].request.leaseTtlMs, 30000);
  assert.equal(await lease.release(), true);
  // The route was learned: the release and the next acquire go to the leader only.
  const again = await within(c.lock("acme/a"), 5000, "second lock");
  assert.equal(acquires(follower).length, 1);
  assert.equal(acquires(leader).length, 2);
  assert.notDeepEqual(acquires(leader)[0].request.requestId, acquires(leader)[1].request.requestId, "a new logical acquire gets a new id");
  await again.release();
});

test("an unknown outcome is retried with the same request id; a deduplicated grant is renewed at once and keeps the first send time", async () => {
  let n = 0;
  const node = await fake({
    Acquire: async () => {
      n += 1;
      if (n === 1) {
        await new Promise((r) => setTimeout(r, 300));
        throw fail("OUTCOME_UNKNOWN");
      }
      // The retry learns the original grant, with only what was left of its time.
      return grant({ deduplicated: true, leaseTtlMs: 100, fencingToken: 77n });
    },
    Renew: () => renewed(3000),
    Release: () => released(),
  });
  const c = client([node.address]);
  const before = performance.now();
  const lease = await within(c.lock("acme/dedup", { ttlMs: 3000 }), 5000, "lock");
  const calls = acquires(node);
  assert.equal(calls.length, 2);
  assert.deepEqual(calls[0].request.requestId, calls[1].request.requestId, "one request id across retries");
  assert.equal(lease.deduplicated, true);
  assert.equal(lease.token, 77n);
  const renew = node.calls.find((x) => x.method === "Renew");
  assert.ok(renew, "a deduplicated grant is renewed before lock() returns");
  // The deadline comes from the renewal's send time (after the retry), never from a reply time.
  assert.ok(lease.stopBy <= renew.at + 3000 - 150 + 5, `stopBy ${lease.stopBy - before} too late`);
  assert.ok(lease.stopBy > before + 3000 - 150, "the renewal moved the deadline");
  await lease.release();
});

test("stop-by counts from when the acquire was SENT, minus the margin, not from when the reply came", async () => {
  const node = await fake({
    Acquire: async () => {
      await new Promise((r) => setTimeout(r, 400));
      return grant({ leaseTtlMs: 3000 });
    },
    Release: () => released(),
  });
  const c = client([node.address]);
  const before = performance.now();
  const lease = await within(c.lock("acme/slow", { ttlMs: 3000 }), 5000, "lock");
  const replyAt = performance.now();
  assert.ok(replyAt - before >= 390);
  // sentAt >= before; stopBy = sentAt + 3000 - 150 (5%). From the reply it would be >= before + 3240.
  assert.ok(lease.stopBy <= before + 2850 + 100, `stopBy is ${lease.stopBy - before} ms after the send`);
  assert.ok(lease.stopBy >= before + 2850 - 1);
  assert.ok(lease.isHeld);
  await lease.release();
});

test("LOCK_HELD ends the acquire at once (no retry), as a typed error", async () => {
  const node = await fake({
    Acquire: () => {
      throw fail("LOCK_HELD", { holderExpiresAtMs: 123, queueLength: 2 }, grpc.status.ABORTED);
    },
  });
  const c = client([node.address]);
  const err = await within(c.lock("acme/held"), 5000, "lock").catch((e) => e);
  assert.ok(err instanceof FencelockError);
  assert.equal(err.code, "REJECTED");
  assert.equal(err.reason, "LOCK_HELD");
  assert.equal(err.isLockHeld, true);
  assert.equal(err.retryable, true);
  assert.equal(err.detail.queueLength, 2);
  assert.equal(acquires(node).length, 1);
});

test("NEVER answers fail at once; backoff answers are retried until the deadline, then UNAVAILABLE with the request id", async () => {
  const bad = await fake({
    Acquire: () => {
      throw fail("INVALID_RESOURCE", {}, grpc.status.INVALID_ARGUMENT);
    },
  });
  const err = await within(client([bad.address]).lock("Bad/x"), 5000, "lock").catch((e) => e);
  assert.equal(err.reason, "INVALID_RESOURCE");
  assert.equal(err.retryable, false);
  assert.equal(acquires(bad).length, 1);

  const down = await fake({
    Acquire: () => {
      throw fail("NO_QUORUM");
    },
  });
  const c = client([down.address], { callTimeoutMs: 400, attemptTimeoutMs: 100, connectTimeoutMs: 100 });
  const e2 = await within(c.lock("acme/nq"), 5000, "lock").catch((e) => e);
  assert.equal(e2.code, "UNAVAILABLE");
  assert.equal(e2.outcomeUnknown, true);
  assert.equal(e2.reason, "NO_QUORUM");
  assert.ok(acquires(down).length >= 2, "retried");
  const ids = new Set(acquires(down).map((x) => x.request.requestId.toString("hex")));
  assert.equal(ids.size, 1, "one request id across all retries");
  assert.equal(e2.requestId.toString("hex"), [...ids][0]);
});

test("an explicit request id asks about that acquire only: an ended grant is LEASE_ENDED, not a new lock", async () => {
  const node = await fake({ Acquire: () => grant({ leaseState: 3, leaseTtlMs: 0 }) });
  const c = client([node.address]);
  const err = await within(c.lock("acme/x", { requestId: "my-id-1" }), 5000, "lock").catch((e) => e);
  assert.equal(err.code, "LEASE_ENDED");
  assert.equal(err.leaseState, "EXPIRED");
  assert.equal(acquires(node)[0].request.requestId.toString(), "my-id-1");
  assert.equal(acquires(node).length, 1);
});

test("WAIT_CANCELLED by the server starts over with a fresh request id (bounded)", async () => {
  let n = 0;
  const node = await fake({
    Acquire: () => {
      n += 1;
      if (n === 1) throw fail("WAIT_CANCELLED", {}, grpc.status.CANCELLED);
      return grant();
    },
    Release: () => released(),
  });
  const c = client([node.address]);
  const lease = await within(c.lock("acme/wc", { waitMs: 1000 }), 5000, "lock");
  const [a, b] = acquires(node);
  assert.notDeepEqual(a.request.requestId, b.request.requestId);
  await lease.release();
});

test("a node that is down is skipped for the next seed", async () => {
  const dead = await fake({});
  const deadAddress = dead.address;
  dead.kill();
  const live = await fake({ Acquire: () => grant(), Release: () => released() });
  const c = client([deadAddress, live.address]);
  const lease = await within(c.lock("acme/failover"), 5000, "lock");
  assert.equal(lease.token, 42n);
  assert.ok(c.stats.retries >= 1);
  await lease.release();
});

test("aborting a waiting acquire cancels its call (the server drops the waiter)", async () => {
  const node = await fake({ Acquire: () => new Promise(() => {}) });
  const c = client([node.address]);
  const ac = new AbortController();
  const pending = c.lock("acme/wait", { waitMs: 60000, signal: ac.signal }).catch((e) => e);
  await waitFor(() => acquires(node).length === 1, 3000, "the acquire to arrive");
  ac.abort(new Error("no longer wanted"));
  const err = await within(pending, 3000, "aborted lock");
  assert.equal(err.code, "ABORTED");
  assert.ok(err.requestId);
  await waitFor(() => acquires(node)[0].cancelled, 3000, "the server to see the cancel");
});

test("renewals go out batched at about a third of the TTL and move the deadline", async () => {
  const batches = [];
  const node = await fake({
    Acquire: (req) => grant({ leaseTtlMs: 1500, leaseId: Buffer.alloc(16, req.resource.length) }),
    RenewBatch: (items) => {
      batches.push(items.map((i) => i.resource));
      return batchReply(items.map(() => ({ renewed: { expiresAtMs: Date.now() + 1500, leaseTtlMs: 1500 } })));
    },
    Release: () => released(),
  });
  const c = client([node.address]);
  const a = await c.lock("acme/r1", { ttlMs: 1500 });
  const b = await c.lock("acme/r22", { ttlMs: 1500 });
  const firstStopBy = a.stopBy;
  await waitFor(() => batches.length >= 2, 5000, "two renew passes");
  assert.deepEqual([...batches[0]].sort(), ["acme/r1", "acme/r22"], "leases due together share one RenewBatch");
  assert.ok(a.stopBy > firstStopBy, "a renewal moved the deadline");
  assert.ok(a.isHeld && b.isHeld);
  assert.ok(c.stats.renewedItems >= 2);
  await a.release();
  await b.release();
  assert.equal(c.heldLeases, 0);
});

test("LEASE_NOT_HELD on renewal: the signal aborts with a LockLostError, lost resolves, onLost runs", async () => {
  const node = await fake({
    Acquire: () => grant({ leaseTtlMs: 1200 }),
    RenewBatch: (items) => batchReply(items.map(() => ({ error: { reason: 15, message: "gone", retry: 1 } }))),
    Release: () => released(false),
  });
  const c = client([node.address]);
  const lease = await c.lock("acme/lost", { ttlMs: 1200 });
  let called;
  lease.onLost((r) => (called = r));
  const reason = await within(lease.lost, 3000, "lost");
  assert.equal(reason, "NOT_HELD");
  assert.equal(called, "NOT_HELD");
  assert.ok(lease.signal.aborted);
  assert.ok(lease.signal.reason instanceof LockLostError);
  assert.equal(lease.signal.reason.lostReason, "NOT_HELD");
  assert.equal(lease.isHeld, false);
  assert.equal(c.stats.leasesLost, 1);
  // Releasing a lease the server already disowned sends nothing.
  const releasesBefore = node.calls.filter((x) => x.method === "Release").length;
  assert.equal(await lease.release(), false);
  assert.equal(node.calls.filter((x) => x.method === "Release").length, releasesBefore);
});

test("renewals that keep failing: the lease is lost (UNCONFIRMED) at its stop-by deadline, not before", async () => {
  const node = await fake({
    Acquire: () => grant({ leaseTtlMs: 1000 }),
    RenewBatch: () => {
      throw fail("NO_QUORUM");
    },
    Release: () => released(),
  });
  const c = client([node.address]);
  const lease = await c.lock("acme/nq-renew", { ttlMs: 1000 });
  const stopBy = lease.stopBy;
  const reason = await within(lease.lost, 3000, "lost");
  const at = performance.now();
  assert.equal(reason, "UNCONFIRMED");
  assert.ok(at >= stopBy - 1, `lost ${stopBy - at} ms before stopBy`);
  assert.equal(lease.signal.reason.lostReason, "UNCONFIRMED");
  assert.ok(node.calls.filter((x) => x.method === "RenewBatch").length >= 2, "renewals were retried");
});

test("HOLD_LIMIT_REACHED: no more renewals, held until stop-by, then lost", async () => {
  const node = await fake({
    Acquire: () => grant({ leaseTtlMs: 1000 }),
    RenewBatch: (items) => batchReply(items.map(() => ({ error: { reason: 16, message: "cap", retry: 1 } }))),
    Release: () => released(),
  });
  const c = client([node.address]);
  const lease = await c.lock("acme/cap", { ttlMs: 1000 });
  assert.equal(await within(lease.lost, 3000, "lost"), "UNCONFIRMED");
  assert.equal(node.calls.filter((x) => x.method === "RenewBatch").length, 1);
});

test("await using releases the lease; release aborts the signal with RELEASED and onLost does not run", async () => {
  const node = await fake({ Acquire: () => grant(), Release: () => released() });
  const c = client([node.address]);
  let signal;
  let onLostCalled = false;
  {
    const lease = await c.lock("acme/using");
    lease.onLost(() => (onLostCalled = true));
    signal = lease.signal;
    await lease[Symbol.asyncDispose]();
  }
  assert.equal(node.calls.filter((x) => x.method === "Release").length, 1);
  assert.ok(signal.aborted);
  assert.equal(signal.reason.lostReason, "RELEASED");
  await new Promise((r) => setTimeout(r, 10));
  assert.equal(onLostCalled, false);
});

test("the lease id never shows in logs or JSON", async () => {
  const node = await fake({ Acquire: () => grant({ leaseId: Buffer.from("SECRETSECRET1234") }), Release: () => released() });
  const c = client([node.address]);
  const lease = await c.lock("acme/secret");
  const { inspect } = await import("node:util");
  assert.ok(!inspect(lease).includes("SECRET"));
  assert.ok(!JSON.stringify(lease).includes("SECRET"));
  assert.ok(!inspect(lease).includes(Buffer.from("SECRETSECRET1234").toString("hex")));
  assert.equal(lease.leaseId.toString(), "SECRETSECRET1234");
  await lease.release();
});

test("bad arguments are refused before any call", async () => {
  const node = await fake({});
  const c = client([node.address]);
  for (const [opts, what] of [
    [{ waitMs: 300001 }, "waitMs"],
    [{ ttlMs: -1 }, "ttlMs"],
    [{ requestId: "" }, "request id"],
    [{ requestId: "x".repeat(65) }, "request id"],
  ]) {
    const e = await c.lock("acme/x", opts).catch((x) => x);
    assert.equal(e.code, "INVALID_ARGUMENT", what);
  }
  assert.equal(node.calls.length, 0);
  assert.throws(() => new Client([]), (e) => e.code === "INVALID_ENDPOINT");
});

test("transport errors without a detail are UNAVAILABLE after retries; UNIMPLEMENTED is a GRPC error at once", async () => {
  const node = await fake({
    Get: () => {
      throw transport(grpc.status.UNIMPLEMENTED, "no such method");
    },
  });
  const c = client([node.address]);
  const e = await within(c.get("acme/x"), 5000, "get").catch((x) => x);
  assert.equal(e.code, "GRPC");
  assert.equal(e.grpcCode, grpc.status.UNIMPLEMENTED);
});
