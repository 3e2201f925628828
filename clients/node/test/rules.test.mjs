// Pure rules: error classification, backoff, config, routing, wire decoding.
import assert from "node:assert/strict";
import { test } from "node:test";
import * as grpc from "@grpc/grpc-js";
import {
  Backoff,
  classify,
  classifyDetail,
  encodeStatusDetails,
  errorDetailFromStatusDetails,
  fakeWire,
  FencelockError,
  MAX_CACHED_RESOURCES,
  MAX_ENDPOINTS,
  MAX_IMMEDIATE_RETRIES,
  resolveOptions,
  Router,
  stopByMarginMs,
  wire,
} from "../dist/internal.js";
import { fail, reasonValue, transport } from "./fake-server.mjs";

test("NOT_LEADER with a hint goes to the leader at once, and the hint is decoded from the trailer", () => {
  const f = classify(fail("NOT_LEADER", { leader: { nodeId: 2, address: "10.0.0.2:7001" }, shardId: 3 }));
  assert.deepEqual(f.advice, { kind: "now" });
  assert.deepEqual(f.reroute, { kind: "to", address: "10.0.0.2:7001" });
  assert.equal(f.detail.shardId, 3);
  assert.equal(f.detail.leader.nodeId, 2);
});

test("NEVER is never retried, even for a reason retryable by default when the server says NEVER", () => {
  for (const reason of ["LEASE_NOT_HELD", "INVALID_RESOURCE", "REQUEST_ID_REUSED", "WAIT_CANCELLED", "HOLD_LIMIT_REACHED", "PERMISSION_DENIED"]) {
    assert.equal(classify(fail(reason)).advice.kind, "fail", reason);
  }
  assert.equal(classify(fail("NO_QUORUM", { retry: 1 })).advice.kind, "fail");
});

test("unavailability backs off elsewhere; busy keeps its first step; unknown outcome retries now; stale epoch refreshes", () => {
  for (const reason of ["LEADER_UNKNOWN", "NO_QUORUM"]) {
    const f = classify(fail(reason));
    assert.deepEqual(f.advice, { kind: "backoff", firstMs: undefined }, reason);
    assert.deepEqual(f.reroute, { kind: "elsewhere" }, reason);
  }
  const busy = classify(fail("SERVER_BUSY", { retryAfterMs: 30 }));
  assert.deepEqual(busy.advice, { kind: "backoff", firstMs: 30 });
  assert.deepEqual(busy.reroute, { kind: "stay" });
  assert.deepEqual(classify(fail("OUTCOME_UNKNOWN")).advice, { kind: "now" });
  assert.deepEqual(classify(fail("EPOCH_NOT_MATCH", {}, grpc.status.ABORTED)).reroute, { kind: "refresh" });
  assert.deepEqual(classify(fail("RATE_LIMITED", { retry: 3, retryAfterMs: 200 })).advice, { kind: "after", ms: 200 });
  // SHUTTING_DOWN naming another node: go there now.
  const sd = classify(fail("SHUTTING_DOWN", { leader: { nodeId: 3, address: "h:3" } }));
  assert.deepEqual(sd.advice, { kind: "now" });
  assert.deepEqual(sd.reroute, { kind: "to", address: "h:3" });
});

test("transport failures are retried elsewhere; other codes without a detail fail", () => {
  for (const code of [grpc.status.UNAVAILABLE, grpc.status.DEADLINE_EXCEEDED, grpc.status.CANCELLED, grpc.status.INTERNAL]) {
    const f = classify(transport(code));
    assert.equal(f.advice.kind, "backoff");
    assert.equal(f.reroute.kind, "elsewhere");
    assert.equal(f.detail, undefined);
  }
  assert.equal(classify(transport(grpc.status.UNIMPLEMENTED)).advice.kind, "fail");
});

test("a reason this client does not know falls back on the gRPC code", () => {
  assert.equal(classify(fail(9999, {}, grpc.status.UNAVAILABLE)).advice.kind, "backoff");
  assert.equal(classify(fail(9999, {}, grpc.status.FAILED_PRECONDITION)).advice.kind, "fail");
  // A RenewBatch item has no code of its own: an unknown reason is UNKNOWN, backed off.
  assert.equal(classifyDetail({ reason: 9999, retry: 0, retryAfterMs: 0 }, grpc.status.UNKNOWN).advice.kind, "backoff");
});

test("a garbled status trailer is no detail, not a crash", () => {
  assert.equal(errorDetailFromStatusDetails(Buffer.from([0xff, 0xff, 0xff])), undefined);
  const other = encodeStatusDetails(14, "x", { reason: 1 });
  assert.equal(errorDetailFromStatusDetails(other).reason, 1);
});

test("backoff doubles with jitter into the upper half, up to the maximum", () => {
  const b = new Backoff(100, 1000);
  for (let i = 0; i < 8; i++) {
    const full = Math.min(100 * 2 ** i, 1000);
    const d = b.delay({ kind: "backoff" });
    assert.ok(d >= full / 2 && d <= full, `step ${i}: ${d} not in upper half of ${full}`);
  }
});

test("immediate retries are bounded, then back off; AFTER is honoured with upward jitter", () => {
  const b = new Backoff(100, 1000);
  for (let i = 0; i < MAX_IMMEDIATE_RETRIES; i++) assert.equal(b.delay({ kind: "now" }), 0);
  assert.ok(b.delay({ kind: "now" }) >= 50);
  const d = new Backoff(10, 20).delay({ kind: "after", ms: 400 });
  assert.ok(d >= 400 && d <= 500, String(d));
});

test("config: defaults validate, each bad field is named, the margin is a percentage and never 0", () => {
  const o = resolveOptions();
  assert.equal(o.callTimeoutMs, 10000);
  for (const [field, bad] of [
    ["callTimeoutMs", { callTimeoutMs: 0 }],
    ["attemptTimeoutMs", { attemptTimeoutMs: 10001 }],
    ["connectTimeoutMs", { connectTimeoutMs: 0 }],
    ["backoffBaseMs", { backoffBaseMs: 2001 }],
    ["stopByMarginPercent", { stopByMarginPercent: 51 }],
    ["callTimeoutMs", { callTimeoutMs: 1.5 }],
  ]) {
    assert.throws(() => resolveOptions(bad), (e) => e instanceof FencelockError && e.code === "INVALID_CONFIG" && e.message.includes(field), field);
  }
  // A short call timeout alone is valid: the other defaults shrink to fit it.
  const short = resolveOptions({ callTimeoutMs: 1000 });
  assert.equal(short.connectTimeoutMs, 1000);
  assert.equal(short.attemptTimeoutMs, 1000);
  assert.equal(short.backoffMaxMs, 1000);
  assert.equal(stopByMarginMs(o, 30000), 1500);
  assert.equal(stopByMarginMs(o, 10), 1);
});

test("router: endpoints are validated and normalized", () => {
  const r = new Router(["127.0.0.1:7001", "http://127.0.0.1:7002", "127.0.0.1:7001"]);
  assert.deepEqual(r.seeds, ["http://127.0.0.1:7001", "http://127.0.0.1:7002"]);
  assert.throws(() => new Router([]), /at least one/);
  assert.throws(() => new Router([""]), /empty/);
  assert.throws(() => new Router(["http://"]), /invalid endpoint/);
  assert.throws(() => new Router(["ftp://a:1"]), /scheme/);
  assert.throws(() => new Router(Array.from({ length: MAX_ENDPOINTS + 1 }, (_, i) => `10.0.0.${i}:1`)), /at most/);
  const tls = new Router(["a:1"], { caPem: "x", certPem: "y", keyPem: "z" });
  assert.deepEqual(tls.seeds, ["https://a:1"]);
});

test("router: a leader hint is remembered per shard and resource; a failed node moves to the next seed", () => {
  const r = new Router(["a:1", "b:1", "c:1"]);
  assert.equal(r.target("t/x"), "http://a:1");
  assert.equal(r.reroute({ kind: "to", address: "d:1" }, "t/x", 7, "http://a:1"), "http://d:1");
  assert.equal(r.target("t/x"), "http://d:1");
  assert.equal(r.targetForShard(7), "http://d:1");
  assert.equal(r.target("t/y"), "http://a:1");
  // d fails: its route is forgotten, the seeds are tried in turn.
  assert.equal(r.reroute({ kind: "elsewhere" }, "t/x", 7, "http://d:1"), "http://a:1");
  assert.equal(r.reroute({ kind: "elsewhere" }, "t/x", 7, "http://a:1"), "http://b:1");
  assert.equal(r.reroute({ kind: "elsewhere" }, "t/x", 7, "http://b:1"), "http://c:1");
  assert.equal(r.reroute({ kind: "elsewhere" }, "t/x", 7, "http://c:1"), "http://a:1");
  // A stale shard mapping is dropped.
  r.learn("t/z", 2, "http://c:1");
  assert.equal(r.target("t/z"), "http://c:1");
  assert.equal(r.reroute({ kind: "refresh" }, "t/z", 2, "http://c:1"), "http://a:1");
});

test("router: caches stay bounded", () => {
  const r = new Router(["a:1"]);
  for (let i = 0; i <= MAX_CACHED_RESOURCES; i++) r.learn(`t/${i}`, 1, "http://a:1");
  assert.ok(r.target("t/0") === "http://a:1");
});

test("fencing tokens above 2^53 and u64 fields survive decoding exactly", () => {
  const token = (1n << 62n) + 12345n; // beyond any JS number's exact range
  const bytes = fakeWire.acquireResponse({
    leaseId: Buffer.alloc(16, 1),
    fencingToken: token,
    expiresAtMs: 1_700_000_000_000,
    leaseTtlMs: 30000,
    deduplicated: true,
    leaseState: 1,
    shardId: 9,
    epoch: 4,
  });
  const r = wire.acquireResponse(bytes);
  assert.equal(typeof r.fencingToken, "bigint");
  assert.equal(r.fencingToken, token);
  assert.equal(r.expiresAtMs, 1_700_000_000_000);
  assert.equal(r.deduplicated, true);
  assert.notEqual(Number(token).toString(), token.toString(), "the test token must not fit a double");
});

test("typed errors: code, reason, retryable, leaderHint", () => {
  const d = { reason: reasonValue("NOT_LEADER"), message: "m", retry: 0, retryAfterMs: 0, leader: { nodeId: 2, address: "h:2" } };
  const e = FencelockError.rejected(d, 14);
  assert.equal(e.code, "REJECTED");
  assert.equal(e.reason, "NOT_LEADER");
  assert.equal(e.retryable, true);
  assert.deepEqual(e.leaderHint, { nodeId: 2, address: "h:2" });
  const held = FencelockError.rejected({ reason: reasonValue("LOCK_HELD"), message: "", retry: 0, retryAfterMs: 0 });
  assert.equal(held.isLockHeld, true);
  assert.equal(held.retryable, true);
  const lost = FencelockError.rejected({ reason: reasonValue("LEASE_NOT_HELD"), message: "", retry: 0, retryAfterMs: 0 });
  assert.equal(lost.retryable, false);
  assert.equal(lost.leaderHint, undefined);
  assert.ok(e instanceof Error);
});
