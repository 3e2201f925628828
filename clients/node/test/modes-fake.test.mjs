// Shared locks and semaphores against scripted fake nodes: the mode and
// permits an acquire sends, the local check of permits (nothing sent),
// MODE_MISMATCH and INVALID_PERMITS as typed errors that are never retried,
// and Get and watch STATE holders decoded.
import assert from "node:assert/strict";
import { after, test } from "node:test";
import * as grpc from "@grpc/grpc-js";
import { Client, FencelockError, MAX_PERMITS } from "../dist/index.js";
import { fakeWire, grpcCodeOfReason } from "../dist/internal.js";
import { fail, grant, released, startFake, untilCancelled, watchEvent, within } from "./fake-server.mjs";

const nodes = [];
const clients = [];
async function fake(handlers) {
  const n = await startFake(handlers);
  nodes.push(n);
  return n;
}
function client(endpoints, options = {}) {
  const c = new Client(endpoints, { callTimeoutMs: 3000, attemptTimeoutMs: 1000, backoffBaseMs: 5, backoffMaxMs: 50, ...options });
  clients.push(c);
  return c;
}
after(async () => {
  for (const c of clients) await c.close().catch(() => {});
  for (const n of nodes) n.kill();
});

const acquires = (n) => n.calls.filter((c) => c.method === "Acquire");
const sent = (n) => acquires(n).map((c) => [c.request.mode, c.request.permits]);
const T1 = (3n << 40n) | 10n;
const T2 = (3n << 40n) | 12n;

test("lock sends the mode and the permits; elections stay exclusive", async () => {
  const node = await fake({ Acquire: () => grant(), Release: () => released() });
  const c = client([node.address]);
  for (const options of [
    {},
    { mode: "exclusive" },
    { mode: "shared" },
    { mode: "semaphore", permits: 3 },
    { mode: "semaphore", permits: MAX_PERMITS },
    { mode: "shared", permits: 0 },
  ]) {
    const lease = await within(c.lock("acme/m", { ttlMs: 5000, ...options }), 5000, JSON.stringify(options));
    await lease.release();
  }
  await (await within(c.election("acme/e").campaign("addr", { ttlMs: 5000 }), 5000, "campaign")).release();
  assert.equal(MAX_PERMITS, 1024);
  assert.deepEqual(sent(node), [
    [0, 0],
    [0, 0],
    [1, 0],
    [2, 3],
    [2, 1024],
    [1, 0],
    [0, 0],
  ]);
});

test("permits out of 1..=1024, permits without a semaphore, or an unknown mode are refused before any call", async () => {
  const node = await fake({ Acquire: () => grant(), Release: () => released() });
  const c = client([node.address]);
  for (const options of [
    { mode: "semaphore" },
    { mode: "semaphore", permits: 0 },
    { mode: "semaphore", permits: 1025 },
    { mode: "semaphore", permits: -1 },
    { mode: "semaphore", permits: 2.5 },
    { mode: "semaphore", permits: "3" },
    { permits: 3 },
    { mode: "exclusive", permits: 1 },
    { mode: "shared", permits: 2 },
    { mode: "reader" },
    { mode: "SHARED" },
    { mode: "unknown" },
  ]) {
    const e = await c.lock("acme/bad", options).catch((x) => x);
    assert.ok(e instanceof FencelockError, JSON.stringify(options));
    assert.equal(e.code, "INVALID_ARGUMENT", JSON.stringify(options));
  }
  assert.equal(acquires(node).length, 0, "nothing may be sent");
});

test("MODE_MISMATCH and INVALID_PERMITS are typed REJECTED errors, never retried", async () => {
  let answer = "MODE_MISMATCH";
  const node = await fake({
    Acquire: () => {
      if (answer === "MODE_MISMATCH")
        throw fail("MODE_MISMATCH", { field: "permits", minAllowed: 3, maxAllowed: 3 }, grpc.status.FAILED_PRECONDITION);
      throw fail("INVALID_PERMITS", { field: "permits", minAllowed: 1, maxAllowed: 1024 }, grpc.status.INVALID_ARGUMENT);
    },
  });
  const c = client([node.address]);
  const e = await within(c.lock("acme/sem", { mode: "semaphore", permits: 2 }), 5000, "lock").catch((x) => x);
  assert.ok(e instanceof FencelockError);
  assert.equal(e.code, "REJECTED");
  assert.equal(e.reason, "MODE_MISMATCH");
  assert.equal(e.isModeMismatch, true);
  assert.equal(e.isLockHeld, false);
  assert.equal(e.retryable, false);
  assert.equal(e.grpcCode, grpc.status.FAILED_PRECONDITION);
  assert.equal(e.detail.field, "permits");
  assert.equal(e.detail.minAllowed, 3);
  assert.equal(acquires(node).length, 1, "MODE_MISMATCH is not retried");

  answer = "INVALID_PERMITS";
  const p = await within(c.lock("acme/sem", { mode: "semaphore", permits: 5 }), 5000, "lock").catch((x) => x);
  assert.equal(p.code, "REJECTED");
  assert.equal(p.reason, "INVALID_PERMITS");
  assert.equal(p.isModeMismatch, false);
  assert.equal(p.retryable, false);
  assert.equal(p.detail.maxAllowed, 1024);
  assert.equal(acquires(node).length, 2, "INVALID_PERMITS is not retried");

  // A RenewBatch item carries no code of its own: the codes errors.proto names.
  assert.equal(grpcCodeOfReason("MODE_MISMATCH"), grpc.status.FAILED_PRECONDITION);
  assert.equal(grpcCodeOfReason("INVALID_PERMITS"), grpc.status.INVALID_ARGUMENT);
});

test("get decodes the mode, the permits and every holder, oldest first", async () => {
  let reply = fakeWire.getResponse({
    held: true,
    fencingToken: T1,
    expiresAtMs: 1000,
    queueLength: 1,
    lastToken: T2,
    shardId: 3,
    epoch: 3,
    value: Buffer.from("r1"),
    mode: "semaphore",
    permits: 2,
    holders: [
      { fencingToken: T1, expiresAtMs: 1000, value: Buffer.from("r1"), mode: "semaphore" },
      { fencingToken: T2, expiresAtMs: 2000, value: Buffer.alloc(0), mode: "semaphore" },
    ],
  });
  const node = await fake({ Get: () => reply });
  const c = client([node.address]);
  assert.deepEqual(await within(c.get("acme/sem"), 5000, "get"), {
    held: true,
    fencingToken: T1,
    expiresAtMs: 1000,
    queueLength: 1,
    lastToken: T2,
    shardId: 3,
    epoch: 3,
    value: Buffer.from("r1"),
    mode: "semaphore",
    permits: 2,
    holders: [
      { fencingToken: T1, expiresAtMs: 1000, value: Buffer.from("r1"), mode: "semaphore" },
      { fencingToken: T2, expiresAtMs: 2000, value: Buffer.alloc(0), mode: "semaphore" },
    ],
  });

  reply = fakeWire.getResponse({ shardId: 1, epoch: 1, lastToken: 5n });
  const free = await c.get("acme/free");
  assert.equal(free.held, false);
  assert.equal(free.mode, "exclusive");
  assert.equal(free.permits, 0);
  assert.deepEqual(free.holders, []);

  // A mode from a newer server is "unknown", not a crash.
  reply = fakeWire.getResponse({
    held: true,
    fencingToken: 9n,
    modeNumber: 7,
    holders: [{ fencingToken: 9n, expiresAtMs: 0, value: Buffer.alloc(0), mode: "unknown" }],
  });
  const newer = await c.get("acme/newer");
  assert.equal(newer.mode, "unknown");
  assert.equal(newer.holders[0].mode, "unknown");
});

test("a watch's STATE lists every holder; an end names its one lease", async () => {
  const node = await fake({
    Watch: (_req, ctx) =>
      (async function* () {
        yield watchEvent("STATE", [3, 12, 0], {
          held: true,
          fencingToken: T1,
          shardId: 3,
          holders: [
            { fencingToken: T1, expiresAtMs: 1000, value: Buffer.alloc(0), mode: "shared" },
            { fencingToken: T2, expiresAtMs: 2000, value: Buffer.from("x"), mode: "shared" },
          ],
        });
        // T1 released; T2 still holds.
        yield watchEvent("RELEASED", [3, 13, 0], { held: true, fencingToken: T1, shardId: 3 });
        yield* untilCancelled(ctx);
      })(),
  });
  const w = await within(client([node.address]).watch("acme/readers"), 5000, "watch");
  const events = [];
  for await (const e of w) {
    events.push(e);
    if (events.length === 2) break;
  }
  assert.deepEqual(events[0].holders, [
    { fencingToken: T1, expiresAtMs: 1000, value: Buffer.alloc(0), mode: "shared" },
    { fencingToken: T2, expiresAtMs: 2000, value: Buffer.from("x"), mode: "shared" },
  ]);
  assert.equal(events[1].kind, "RELEASED");
  assert.equal(events[1].held, true, "another holding still holds");
  assert.equal(events[1].fencingToken, T1);
  assert.deepEqual(events[1].holders, []);
});
