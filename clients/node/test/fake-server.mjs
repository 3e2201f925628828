// A scripted fake of fencelock's LockService on loopback, for unit tests of
// the client's retry, routing and renewal rules. Each handler gets the
// decoded request and returns a reply (bytes from fakeWire) or throws
// `fail(reason, {...detail})` / `transport(code)`.
import * as grpc from "@grpc/grpc-js";
import { encodeStatusDetails, fakeWire, types } from "../dist/internal.js";

const REASONS = types.ErrorDetail.root.lookupEnum("fencelock.v1.Reason").values;

/** A fencelock error reply: reason name without REASON_, extra ErrorDetail fields. */
export function fail(reason, extra = {}, code = grpc.status.UNAVAILABLE) {
  const value = REASONS[`REASON_${reason}`] ?? reason;
  const metadata = new grpc.Metadata();
  metadata.set("grpc-status-details-bin", encodeStatusDetails(code, reason, { reason: value, ...extra }));
  return Object.assign(new Error(reason), { code, details: reason, metadata });
}

/** A reply without an ErrorDetail (a transport-level failure). */
export function transport(code = grpc.status.UNAVAILABLE, details = "boom") {
  return Object.assign(new Error(details), { code, details });
}

export function reasonValue(name) {
  return REASONS[`REASON_${name}`];
}

const id = (b) => b;
const method = (name) => ({
  path: `/fencelock.v1.LockService/${name}`,
  requestStream: false,
  responseStream: false,
  requestSerialize: id,
  requestDeserialize: id,
  responseSerialize: id,
  responseDeserialize: id,
});
const SERVICE = Object.fromEntries(["Acquire", "Renew", "RenewBatch", "Release", "Get"].map((n) => [n, method(n)]));
const WATCH = {
  path: "/fencelock.v1.LockService/Watch",
  requestStream: false,
  responseStream: true,
  requestSerialize: id,
  requestDeserialize: id,
  responseSerialize: id,
  responseDeserialize: id,
};
const DECODE = {
  Acquire: fakeWire.decodeAcquireRequest,
  Renew: fakeWire.decodeRenewRequest,
  RenewBatch: fakeWire.decodeRenewBatchRequest,
  Release: fakeWire.decodeReleaseRequest,
  Get: (b) => b,
};

/**
 * Starts a fake node. `handlers[Method](request, ctx)` may be async; ctx has
 * `call` (for cancellation) and `node`. Every call is logged in `node.calls`.
 */
export async function startFake(handlers) {
  const server = new grpc.Server();
  const node = { calls: [], address: "", url: "", server, handlers };
  const impl = {};
  for (const name of Object.keys(SERVICE)) {
    impl[name] = async (call, callback) => {
      const request = DECODE[name](call.request);
      const entry = { method: name, request, at: performance.now(), cancelled: false };
      call.on("cancelled", () => (entry.cancelled = true));
      node.calls.push(entry);
      const h = node.handlers[name];
      if (!h) return callback({ code: grpc.status.UNIMPLEMENTED, details: "not scripted" });
      try {
        const reply = await h(request, { call, node, entry });
        callback(null, reply);
      } catch (e) {
        callback(e);
      }
    };
  }
  // Watch: `handlers.Watch(request, ctx)` throws (or rejects) to refuse the
  // call before any header, as fencelock does, or returns an (async)
  // iterable of event bytes, which may itself throw to end the stream with
  // that error after its events.
  impl.Watch = async (call) => {
    const request = fakeWire.decodeWatchRequest(call.request);
    const entry = { method: "Watch", request, at: performance.now(), cancelled: false };
    call.on("cancelled", () => (entry.cancelled = true));
    node.calls.push(entry);
    const h = node.handlers.Watch;
    if (!h) return call.emit("error", { code: grpc.status.UNIMPLEMENTED, details: "not scripted" });
    let events;
    try {
      events = await h(request, { call, node, entry });
    } catch (e) {
      return call.emit("error", e);
    }
    call.sendMetadata(new grpc.Metadata()); // the node took the watch: headers now, as tonic sends them
    try {
      for await (const e of events) {
        if (entry.cancelled) return;
        call.write(e);
      }
      call.end();
    } catch (e) {
      call.emit("error", e);
    }
  };
  server.addService({ ...SERVICE, Watch: WATCH }, impl);
  const port = await new Promise((resolve, reject) =>
    server.bindAsync("127.0.0.1:0", grpc.ServerCredentials.createInsecure(), (err, p) => (err ? reject(err) : resolve(p))),
  );
  node.address = `127.0.0.1:${port}`;
  node.url = `http://${node.address}`;
  node.stop = () => new Promise((resolve) => server.tryShutdown(() => resolve()));
  node.kill = () => server.forceShutdown();
  return node;
}

/** An AcquireResponse with sensible defaults. */
export function grant(over = {}) {
  return fakeWire.acquireResponse({
    leaseId: Buffer.alloc(16, 7),
    fencingToken: 42n,
    expiresAtMs: Date.now() + 30000,
    leaseTtlMs: 30000,
    deduplicated: false,
    leaseState: 1,
    shardId: 1,
    epoch: 1,
    ...over,
  });
}

export const renewed = (ttl = 30000) => fakeWire.renewResponse({ expiresAtMs: Date.now() + ttl, leaseTtlMs: ttl });

export function batchReply(results) {
  return fakeWire.renewBatchResponse(results);
}

export const released = (r = true) => fakeWire.releaseResponse({ released: r });

/** Waits for `cond()` to be true, polling; fails after `ms`. */
export async function waitFor(cond, ms = 5000, what = "condition") {
  const end = performance.now() + ms;
  while (!(await cond())) {
    if (performance.now() > end) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

/** A promise with a timeout, so no test can hang. */
export function within(promise, ms, what = "promise") {
  let timer;
  return Promise.race([
    promise.finally(() => clearTimeout(timer)),
    new Promise((_, reject) => (timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms: ${what}`)), ms))),
  ]);
}

/** A WatchEvent: kind by name (STATE, GRANTED, ...) or number, revision [epoch, index, seq]. */
export function watchEvent(kind, revision, over = {}) {
  const KINDS = { STATE: 1, GRANTED: 2, VALUE_CHANGED: 3, RELEASED: 4, EXPIRED: 5, CANCELLED: 6 };
  return fakeWire.watchEvent({ kind: KINDS[kind] ?? kind, revision, ...over });
}

/** Streams nothing until the client goes away (a quiet watch). */
export async function* untilCancelled(ctx) {
  if (ctx.entry.cancelled) return;
  await new Promise((resolve) => ctx.call.once("cancelled", resolve));
}
