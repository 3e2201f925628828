// Watches and elections against scripted fake nodes: event decoding, the
// start's routing, resuming after the last revision without a duplicate,
// which endings resume, close and abort, and campaign/leader/observe.
import assert from "node:assert/strict";
import { after, test } from "node:test";
import * as grpc from "@grpc/grpc-js";
import { Client, compareRevisions, FencelockError, formatRevision, MAX_WAIT_TIMEOUT_MS, parseRevision } from "../dist/index.js";
import { fakeWire } from "../dist/internal.js";
import { batchReply, fail, grant, reasonValue, released, startFake, transport, untilCancelled, watchEvent, within } from "./fake-server.mjs";

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

const watches = (n) => n.calls.filter((c) => c.method === "Watch");
const rev = (e) => [Number(e.revision.epoch), Number(e.revision.index), e.revision.seq];
async function take(watch, n) {
  const out = [];
  for await (const e of watch) {
    out.push(e);
    if (out.length === n) break;
  }
  return out;
}

test("events are decoded into typed values; tokens are exact bigints", async () => {
  const big = (3n << 40n) | 10n;
  const node = await fake({
    Watch: (_req, ctx) =>
      (async function* () {
        yield watchEvent("STATE", [3, 10, 0], { held: true, fencingToken: big, value: Buffer.from("10.0.0.7:8443"), expiresAtMs: 1234, shardId: 5 });
        yield watchEvent("VALUE_CHANGED", [3, 11, 0], { held: true, fencingToken: big, value: Buffer.from("10.0.0.7:9443"), shardId: 5 });
        yield watchEvent("RELEASED", [3, 12, 0], { fencingToken: big, shardId: 5 });
        yield watchEvent("GRANTED", [3, 13, 0], { held: true, fencingToken: big + 3n, shardId: 5 });
        yield watchEvent("EXPIRED", [3, 14, 0], { fencingToken: big + 3n, shardId: 5 });
        yield watchEvent("CANCELLED", [3, 14, 1], { fencingToken: big + 4n, shardId: 5 });
        yield watchEvent(99, [4, 1, 0]); // a kind from a newer server
        yield* untilCancelled(ctx);
      })(),
  });
  const w = await within(client([node.address]).watch("acme/db"), 5000, "watch");
  const events = await within(take(w, 7), 5000, "events");
  assert.deepEqual(events[0], {
    kind: "STATE",
    revision: { epoch: 3n, index: 10n, seq: 0 },
    held: true,
    fencingToken: big,
    value: Buffer.from("10.0.0.7:8443"),
    expiresAtMs: 1234,
    gap: false,
    shardId: 5,
    holders: [],
  });
  assert.deepEqual(
    events.map((e) => e.kind),
    ["STATE", "VALUE_CHANGED", "RELEASED", "GRANTED", "EXPIRED", "CANCELLED", "UNSPECIFIED"],
  );
  assert.equal(events[1].value.toString(), "10.0.0.7:9443");
  assert.equal(events[2].held, false);
  assert.equal(events[3].fencingToken, big + 3n);
  assert.equal(w.closed, true, "breaking out of for-await closes the watch");
  assert.equal(watches(node)[0].request.resource, "acme/db");
  assert.equal(watches(node)[0].request.after, undefined, "no after: start with the state now");
});

test("revisions compare, print and parse", () => {
  const r = (e, i, s) => ({ epoch: e, index: i, seq: s });
  assert.ok(compareRevisions(r(3n, 9n, 5), r(3n, 10n, 0)) < 0);
  assert.ok(compareRevisions(r(3n, 10n, 1), r(3n, 10n, 0)) > 0);
  assert.ok(compareRevisions(r(4n, 0n, 0), r(3n, 99n, 9)) > 0);
  assert.equal(compareRevisions(r(3n, 10n, 0), r(3n, 10n, 0)), 0);
  assert.equal(formatRevision(r(3n, 1204n, 0)), "3.1204.0");
  assert.deepEqual(parseRevision("3.1204.0"), r(3n, 1204n, 0));
  assert.throws(() => parseRevision("3.1204"), FencelockError);
});

test("the start follows a leader hint and sends after", async () => {
  const replica = await fake({
    Watch: (_req, ctx) =>
      (async function* () {
        yield watchEvent("GRANTED", [1, 8, 0], { held: true, fencingToken: 8n });
        yield* untilCancelled(ctx);
      })(),
  });
  const other = await fake({
    Watch: () => {
      throw fail("NOT_LEADER", { leader: { nodeId: 2, address: replica.address }, shardId: 2 });
    },
  });
  const c = client([other.address]);
  const w = await within(c.watch("acme/db", { after: { epoch: 1n, index: 7n, seq: 2 } }), 5000, "watch");
  const [e] = await within(take(w, 1), 5000, "event");
  assert.equal(e.fencingToken, 8n);
  assert.deepEqual(w.after, { epoch: 1n, index: 8n, seq: 0 });
  assert.equal(watches(other).length, 1);
  assert.deepEqual(watches(replica)[0].request.after, [1, 7, 2]);
});

test("a refused start rejects watch() and is not retried", async () => {
  const node = await fake({
    Watch: () => {
      throw fail("PERMISSION_DENIED", {}, grpc.status.PERMISSION_DENIED);
    },
  });
  const err = await within(client([node.address]).watch("beta/db", { resume: true }), 5000, "watch").catch((e) => e);
  assert.ok(err instanceof FencelockError, String(err));
  assert.equal(err.reason, "PERMISSION_DENIED");
  assert.equal(err.resumesWatch, false);
  assert.equal(watches(node).length, 1);
});

test("a node that never answers the start is given up on at the deadline", async () => {
  const node = await fake({ Watch: () => new Promise(() => {}) }); // no headers, ever
  const c = client([node.address], { callTimeoutMs: 1200, attemptTimeoutMs: 300, connectTimeoutMs: 300 });
  const started = performance.now();
  const err = await within(c.watch("acme/db"), 5000, "watch").catch((e) => e);
  assert.equal(err.code, "UNAVAILABLE");
  assert.match(err.message, /no answer to the watch within/);
  assert.ok(performance.now() - started < 3000);
  assert.ok(watches(node).length >= 2);
});

/** The first stream sends 1.1-1.3 then ends with `ending` (undefined: a clean end); later ones replay from before the resume point and go on with 1.4, 1.5. */
function threeThen(ending) {
  return (req, ctx) =>
    (async function* () {
      if (!req.after) {
        yield watchEvent("STATE", [1, 1, 0]);
        yield watchEvent("GRANTED", [1, 2, 0], { held: true, fencingToken: 2n, value: Buffer.from("a") });
        yield watchEvent("RELEASED", [1, 3, 0], { fencingToken: 2n });
        if (ending) throw ending();
        return;
      }
      yield watchEvent("GRANTED", [1, 2, 0], { held: true, fencingToken: 2n, value: Buffer.from("a") });
      yield watchEvent("RELEASED", [1, 3, 0], { fencingToken: 2n });
      yield watchEvent("GRANTED", [1, 4, 0], { held: true, fencingToken: 4n });
      yield watchEvent("RELEASED", [1, 5, 0], { fencingToken: 4n });
      yield* untilCancelled(ctx);
    })();
}

const RESUMED = {
  SERVER_BUSY: () => fail("SERVER_BUSY", {}, grpc.status.RESOURCE_EXHAUSTED),
  EPOCH_NOT_MATCH: () => fail("EPOCH_NOT_MATCH", {}, grpc.status.FAILED_PRECONDITION),
  SHUTTING_DOWN: () => fail("SHUTTING_DOWN"),
  "transport UNAVAILABLE": () => transport(grpc.status.UNAVAILABLE, "connection reset"),
  "transport INTERNAL": () => transport(grpc.status.INTERNAL, "h2 protocol error"),
  "a clean end": undefined,
};

for (const [name, ending] of Object.entries(RESUMED)) {
  test(`resume after ${name}: watches again after the last revision, no event twice`, async () => {
    const node = await fake({ Watch: threeThen(ending) });
    const w = await within(client([node.address]).watch("acme/db", { resume: true }), 5000, "watch");
    const events = await within(take(w, 5), 5000, "events");
    assert.deepEqual(events.map(rev), [[1, 1, 0], [1, 2, 0], [1, 3, 0], [1, 4, 0], [1, 5, 0]]);
    assert.deepEqual(events.map((e) => e.kind), ["STATE", "GRANTED", "RELEASED", "GRANTED", "RELEASED"]);
    assert.deepEqual(watches(node).map((c) => c.request.after), [undefined, [1, 3, 0]]);
  });
}

test("without resume the ending is thrown, with its resume point; watching again from it goes on", async () => {
  const node = await fake({ Watch: threeThen(RESUMED.SHUTTING_DOWN) });
  const c = client([node.address]);
  const w = await c.watch("acme/db");
  const got = [];
  const err = await within(
    (async () => {
      for await (const e of w) got.push(rev(e));
    })(),
    5000,
    "iteration",
  ).catch((e) => e);
  assert.deepEqual(got, [[1, 1, 0], [1, 2, 0], [1, 3, 0]]);
  assert.ok(err instanceof FencelockError, String(err));
  assert.equal(err.reason, "SHUTTING_DOWN");
  assert.equal(err.resumesWatch, true);
  assert.deepEqual(w.after, { epoch: 1n, index: 3n, seq: 0 });
  assert.deepEqual(await w.next(), { done: true, value: undefined });
  const again = await c.watch("acme/db", { after: w.after });
  assert.deepEqual((await take(again, 2)).map(rev), [[1, 4, 0], [1, 5, 0]]);
});

test("a clean end without resume ends the iteration", async () => {
  const node = await fake({ Watch: threeThen(undefined) });
  const w = await client([node.address]).watch("acme/db");
  const got = [];
  for await (const e of w) got.push(rev(e));
  assert.deepEqual(got, [[1, 1, 0], [1, 2, 0], [1, 3, 0]]);
});

test("an ending a new watch cannot resolve is thrown even when resuming", async () => {
  const node = await fake({ Watch: threeThen(() => fail("PERMISSION_DENIED", {}, grpc.status.PERMISSION_DENIED)) });
  const w2 = await client([node.address]).watch("acme/db", { resume: true });
  let n = 0;
  const err = await within(
    (async () => {
      for await (const _ of w2) n += 1;
    })(),
    5000,
    "iteration",
  ).catch((e) => e);
  assert.equal(n, 3);
  assert.equal(err.reason, "PERMISSION_DENIED");
  assert.equal(err.resumesWatch, false);
  assert.equal(watches(node).length, 1, "never resumed");
});

test("resumesWatch names the endings a new watch resolves", () => {
  const rejected = (reason) => FencelockError.rejected(detailFor(reason), grpc.status.UNAVAILABLE);
  for (const r of ["SERVER_BUSY", "EPOCH_NOT_MATCH", "SHUTTING_DOWN"]) assert.equal(rejected(r).resumesWatch, true, r);
  for (const r of ["PERMISSION_DENIED", "INVALID_RESOURCE", "NOT_LEADER"]) assert.equal(rejected(r).resumesWatch, false, r);
  for (const code of [grpc.status.UNAVAILABLE, grpc.status.UNKNOWN, grpc.status.INTERNAL])
    assert.equal(new FencelockError("GRPC", { message: "x", grpcCode: code }).resumesWatch, true);
  assert.equal(new FencelockError("GRPC", { message: "x", grpcCode: grpc.status.UNIMPLEMENTED }).resumesWatch, false);
  assert.equal(new FencelockError("UNAVAILABLE", { message: "x" }).resumesWatch, false);
});

function detailFor(reason) {
  return { reason: reasonValue(reason), message: "", retry: 0, retryAfterMs: 0, shardId: 0, currentEpoch: 0, mapVersion: 0, holderExpiresAtMs: 0, queueLength: 0, minAllowed: 0, maxAllowed: 0, field: "" };
}

test("close() and the signal end a waiting iteration", async () => {
  const node = await fake({ Watch: (_req, ctx) => untilCancelled(ctx) });
  const c = client([node.address]);
  const w = await c.watch("acme/db", { resume: true });
  const pending = w.next();
  setTimeout(() => w.close(), 100);
  assert.deepEqual(await within(pending, 5000, "next after close"), { done: true, value: undefined });

  const ac = new AbortController();
  const w2 = await c.watch("acme/db", { resume: true, signal: ac.signal });
  const pending2 = w2.next();
  setTimeout(() => ac.abort(), 100);
  assert.deepEqual(await within(pending2, 5000, "next after abort"), { done: true, value: undefined });
  assert.equal(watches(node).length, 2, "no resume after a close");
});

test("a gap STATE is passed on", async () => {
  const node = await fake({
    Watch: (_req, ctx) =>
      (async function* () {
        yield watchEvent("STATE", [2, 90, 0], { held: true, fencingToken: 77n, gap: true });
        yield* untilCancelled(ctx);
      })(),
  });
  const w = await client([node.address]).watch("acme/db", { after: { epoch: 1n, index: 3n, seq: 0 } });
  const [e] = await take(w, 1);
  assert.equal(e.kind, "STATE");
  assert.equal(e.gap, true);
  assert.equal(e.fencingToken, 77n);
});

function campaignFake(refusals) {
  const seen = [];
  return {
    seen,
    handlers: {
      Acquire: (req) => {
        seen.push(req);
        if (seen.length <= refusals) throw fail("WAIT_TIMED_OUT", {}, grpc.status.ABORTED);
        return grant({ fencingToken: (1n << 40n) | 9n });
      },
      RenewBatch: (items) => batchReply(items.map(() => ({ renewed: { expiresAtMs: 0, leaseTtlMs: 30000 } }))),
      Release: () => released(),
    },
  };
}

test("a campaign queues again until it leads, publishing its value", async () => {
  const { seen, handlers } = campaignFake(2);
  const node = await fake(handlers);
  const election = client([node.address]).election("acme/election/db");
  const lease = await within(election.campaign("10.0.0.7:5432", { ttlMs: 5000 }), 5000, "campaign");
  assert.equal(lease.token, (1n << 40n) | 9n);
  await lease.release();
  assert.equal(seen.length, 3);
  for (const r of seen) {
    assert.equal(r.value.toString(), "10.0.0.7:5432");
    assert.equal(r.waitTimeoutMs, MAX_WAIT_TIMEOUT_MS);
    assert.equal(r.leaseTtlMs, 5000);
  }
  assert.equal(new Set(seen.map((r) => r.requestId.toString("hex"))).size, 3, "each wait is its own logical acquire");
});

test("a campaign ends on any other refusal, and on its signal", async () => {
  const node = await fake({
    Acquire: () => {
      throw fail("PERMISSION_DENIED", {}, grpc.status.PERMISSION_DENIED);
    },
  });
  const err = await client([node.address]).election("beta/election/db").campaign("x").catch((e) => e);
  assert.equal(err.reason, "PERMISSION_DENIED");

  const waiting = await fake({ Acquire: () => new Promise(() => {}) });
  const ac = new AbortController();
  const p = client([waiting.address]).election("acme/election/db").campaign("x", { signal: ac.signal });
  setTimeout(() => ac.abort(), 100);
  const aborted = await within(p.catch((e) => e), 5000, "aborted campaign");
  assert.equal(aborted.code, "ABORTED");
});

test("leader() and observe()", async () => {
  const states = [
    fakeWire.getResponse({ held: true, fencingToken: 41n, value: Buffer.from("10.0.0.7:5432"), shardId: 1 }),
    fakeWire.getResponse({ held: false, shardId: 1 }),
  ];
  const node = await fake({
    Get: () => states.shift(),
    Watch: (_req, ctx) =>
      (async function* () {
        yield watchEvent("GRANTED", [1, 9, 0], { held: true, fencingToken: 41n, value: Buffer.from("10.0.0.7:5432") });
        yield* untilCancelled(ctx);
      })(),
  });
  const election = client([node.address]).election("acme/election/db");
  assert.deepEqual(await election.leader(), { value: Buffer.from("10.0.0.7:5432"), fencingToken: 41n });
  assert.equal(await election.leader(), undefined);
  const w = await election.observe({ after: { epoch: 1n, index: 8n, seq: 0 } });
  const [e] = await take(w, 1);
  assert.deepEqual([e.kind, e.value.toString(), e.fencingToken], ["GRANTED", "10.0.0.7:5432", 41n]);
  assert.deepEqual(watches(node)[0].request, { resource: "acme/election/db", after: [1, 8, 0] });
});
