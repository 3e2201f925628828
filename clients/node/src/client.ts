// Client: routed, retried calls; `lock` turns a grant into a Lease kept
// alive by the keeper (one background timer per client that renews every
// held lease in RenewBatch calls, one per node).

import { randomBytes } from "node:crypto";
import * as grpc from "@grpc/grpc-js";
import {
  type ClientOptions,
  MAX_PERMITS,
  MAX_RENEW_BATCH,
  MAX_REQUEST_ID_LEN,
  MAX_VALUE_LEN,
  MAX_WAIT_TIMEOUT_MS,
  type ResolvedOptions,
  resolveOptions,
  stopByMarginMs,
} from "./config.js";
import { FencelockError, grpcCodeOfReason, type LostReason } from "./errors.js";
import {
  dueAt,
  eligibleAt,
  jitteredRenewIntervalMs,
  Lease,
  type LeaseOwner,
  now,
  renewIntervalMs,
} from "./lease.js";
import {
  type AcquireMode,
  type AcquireResponse,
  isAcquireMode,
  type LockState,
  leaseStateName,
  reasonName,
  type RenewResponse,
  type Revision,
  wire,
} from "./proto.js";
import { Backoff, classify, classifyDetail, type Failure } from "./retry.js";
import { Router } from "./router.js";
import { Election, Watch, type WatchHost, type WatchOptions } from "./watch.js";

/** Length of a generated request id: 128 random bits. */
const GENERATED_REQUEST_ID_LEN = 16;
/** Times one logical acquire may start over with a fresh request id after its id's acquire ended holding nothing. */
const MAX_ACQUIRE_RESTARTS = 3;
/** Answers that end an acquire although their advice is BACKOFF: they answer what was asked. */
const ACQUIRE_CONTENTION_REASONS = new Set([
  "LOCK_HELD",
  "WAIT_TIMED_OUT",
  "QUEUE_FULL",
  "TENANT_WAITERS_EXCEEDED",
  "TENANT_QUOTA_EXCEEDED",
]);
/** Slowest retry of a failed renewal, as a fraction of the TTL. */
const RENEW_RETRY_MAX_TTL_DIVISOR = 10;
/** Slowest attempt of a renewal, as a fraction of the shortest TTL in the batch. */
const RENEW_ATTEMPT_TTL_DIVISOR = 3;
/** Shortest pause between two keeper passes. */
const MIN_PASS_INTERVAL_MS = 5;
/** How long `close()` gives the releases of still-held leases. */
const CLOSE_RELEASE_TIMEOUT_MS = 2_000;

const SERVICE = "/fencelock.v1.LockService/";
const identity = (b: Buffer) => b;

export interface LockOptions {
  /** Lease TTL in ms; 0 or absent = the server's default (30000). */
  ttlMs?: number;
  /** How long to wait in the resource's FIFO queue if it is held, in ms; 0 or absent = fail at once with LOCK_HELD. */
  waitMs?: number;
  /**
   * The request id. Absent (the usual case) generates one. Set it only to
   * retry an acquire whose outcome is unknown (an UNAVAILABLE error carries
   * its `requestId`): the answer is then the original grant, never a second.
   */
  requestId?: Uint8Array | string;
  /**
   * What the lease publishes while it holds (`get` returns it; at most 4096
   * bytes): an elected leader's address, say. Refused with
   * FEATURE_NOT_ENABLED while a member of the cluster runs a build without
   * values.
   */
  value?: Uint8Array | string;
  /**
   * How to hold the resource: `"exclusive"` (absent: the only holder),
   * `"shared"` (one of any number of readers, never beside an exclusive
   * holder) or `"semaphore"` (one of at most `permits` holders). Every grant
   * has its own token. A resource in use in another kind (a lock as a
   * semaphore, a semaphore with another count) is refused with
   * MODE_MISMATCH. Shared and semaphore acquires are refused with
   * FEATURE_NOT_ENABLED while a member of the cluster runs a build without
   * them.
   */
  mode?: AcquireMode;
  /** A semaphore's permit count, 1..=1024 (the same for every acquire of it); only with `mode: "semaphore"`. */
  permits?: number;
  /** Aborting it ends the call; a waiting acquire leaves the server's queue. */
  signal?: AbortSignal;
}

export interface CallOptions {
  signal?: AbortSignal;
}

/** Counters of a client's activity. */
export interface ClientStats {
  retries: number;
  renewBatchCalls: number;
  renewedItems: number;
  renewFailures: number;
  leasesLost: number;
}

interface Answer<T> {
  value: T;
  /** Send time of the first attempt: a write may have taken effect from then on. */
  firstSentAt: number;
  /** Send time of the attempt that was answered. */
  lastSentAt: number;
  url: string;
}

type AttemptLimit = "bounded" | "untilDeadline";

function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal!.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

function aborted(signal: AbortSignal, requestId?: Buffer): FencelockError {
  return new FencelockError("ABORTED", {
    message: "the call was aborted by its signal",
    requestId,
    cause: signal.reason,
  });
}

/** A unary call on one connection: resolves with the reply bytes or rejects with the grpc-js error. */
function unary(
  client: grpc.Client,
  method: string,
  request: Buffer,
  timeoutMs: number,
  connectTimeoutMs: number,
  signal: AbortSignal | undefined,
  onSend: () => void,
): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const fail = (code: number, details: string) =>
      reject(Object.assign(new Error(details), { code, details, metadata: new grpc.Metadata() }));
    let call: grpc.ClientUnaryCall | undefined;
    let done = false;
    const onAbort = () => {
      if (done) return;
      done = true;
      call?.cancel();
      clearTimeout(connectTimer);
      reject(signal!.reason ?? new Error("aborted"));
    };
    signal?.addEventListener("abort", onAbort, { once: true });
    const finish = () => {
      done = true;
      signal?.removeEventListener("abort", onAbort);
    };
    let connectTimer: NodeJS.Timeout | undefined;
    const send = () => {
      if (done) return;
      onSend();
      call = client.makeUnaryRequest(
        method,
        identity,
        identity,
        request,
        new grpc.Metadata(),
        { deadline: Date.now() + timeoutMs },
        (error, reply) => {
          if (done) return;
          finish();
          if (error) reject(error);
          else resolve(reply ?? Buffer.alloc(0));
        },
      );
    };
    // Open the connection first, bounded by the connect timeout, so that a
    // black-holed node costs connectTimeoutMs rather than a waiting
    // acquire's whole deadline. A refused connection fails at once.
    const channel = client.getChannel();
    const connectDeadline = Date.now() + Math.min(connectTimeoutMs, timeoutMs);
    const waitConnected = () => {
      if (done) return;
      const state = channel.getConnectivityState(true);
      if (state === grpc.connectivityState.READY) return send();
      if (state === grpc.connectivityState.TRANSIENT_FAILURE || state === grpc.connectivityState.SHUTDOWN) {
        // Let the call fail (or succeed, if the channel just recovered) the gRPC way.
        return send();
      }
      channel.watchConnectivityState(state, connectDeadline, (err) => {
        if (done) return;
        if (err) {
          finish();
          return fail(grpc.status.UNAVAILABLE, `no connection within ${connectTimeoutMs} ms`);
        }
        waitConnected();
      });
    };
    waitConnected();
  });
}

/**
 * Opens a server stream (a watch) on one connection: resolves once the node
 * sent its response headers (it took the call), rejects with the grpc-js
 * error when it refused at once, or with UNAVAILABLE when neither came
 * within `timeoutMs`. The stream itself has no deadline.
 */
function openStream(
  client: grpc.Client,
  method: string,
  request: Buffer,
  timeoutMs: number,
  signal: AbortSignal | undefined,
  onSend: () => void,
): Promise<grpc.ClientReadableStream<Buffer>> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason ?? new Error("aborted"));
    onSend();
    const stream = client.makeServerStreamRequest(method, identity, identity, request, new grpc.Metadata(), {});
    // Its errors are read from the stream's iterator (or from 'status' below).
    stream.on("error", () => {});
    let settled = false;
    const settle = (then: () => void) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      signal?.removeEventListener("abort", onAbort);
      stream.removeListener("metadata", onMetadata);
      stream.removeListener("status", onStatus);
      then();
    };
    const onMetadata = () => settle(() => resolve(stream));
    const onStatus = (status: grpc.StatusObject) =>
      settle(() =>
        status.code === grpc.status.OK
          ? resolve(stream)
          : reject(Object.assign(new Error(status.details), { code: status.code, details: status.details, metadata: status.metadata })),
      );
    const onAbort = () =>
      settle(() => {
        stream.cancel();
        reject(signal!.reason ?? new Error("aborted"));
      });
    const timer = setTimeout(
      () =>
        settle(() => {
          stream.cancel();
          const details = `no answer to the watch within ${timeoutMs} ms`;
          reject(Object.assign(new Error(details), { code: grpc.status.UNAVAILABLE, details, metadata: new grpc.Metadata() }));
        }),
      timeoutMs,
    );
    stream.once("metadata", onMetadata);
    stream.once("status", onStatus);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/** The mode and permits of an acquire, checked as the server checks them (INVALID_PERMITS) before anything is sent. */
function checkMode(mode: unknown, permits: unknown): { mode: AcquireMode; permits: number } {
  const m = mode ?? "exclusive";
  if (!isAcquireMode(m))
    throw new FencelockError("INVALID_ARGUMENT", {
      message: `mode must be "exclusive", "shared" or "semaphore", got ${JSON.stringify(m)}`,
    });
  if (m === "semaphore") {
    if (typeof permits !== "number" || !Number.isInteger(permits) || permits < 1 || permits > MAX_PERMITS)
      throw new FencelockError("INVALID_ARGUMENT", {
        message: `a semaphore needs permits in 1..=${MAX_PERMITS}, got ${permits}`,
      });
    return { mode: m, permits };
  }
  if (permits !== undefined && permits !== 0)
    throw new FencelockError("INVALID_ARGUMENT", {
      message: `permits (${permits}) go only with mode "semaphore", not "${m}"`,
    });
  return { mode: m, permits: 0 };
}

function checkMs(name: string, v: unknown, max?: number): number {
  if (v === undefined) return 0;
  if (typeof v !== "number" || !Number.isInteger(v) || v < 0)
    throw new FencelockError("INVALID_ARGUMENT", { message: `${name} must be a non-negative integer (ms), got ${v}` });
  if (max !== undefined && v > max)
    throw new FencelockError("INVALID_ARGUMENT", { message: `${name} ${v} is over the maximum ${max}` });
  return v;
}

/**
 * A fencelock client. Give it any nodes of the cluster; it routes each call
 * to the shard's leader, retries as errors.proto says, and keeps every
 * lease it hands out renewed until released. `close()` it when done.
 */
export class Client implements LeaseOwner, WatchHost {
  readonly #options: ResolvedOptions;
  readonly #router: Router;
  readonly #leases = new Set<Lease>();
  #keeperTimer: NodeJS.Timeout | undefined;
  #keeperAt = Infinity;
  #closed = false;
  readonly #stats: ClientStats = { retries: 0, renewBatchCalls: 0, renewedItems: 0, renewFailures: 0, leasesLost: 0 };

  /**
   * A client for the cluster at `endpoints` (`host:port` or URLs, 1 to 16).
   * Connections open lazily, so this succeeds while nodes are starting.
   */
  constructor(endpoints: string[] | string, options: ClientOptions = {}) {
    this.#options = resolveOptions(options);
    const list = typeof endpoints === "string" ? endpoints.split(",").filter((e) => e.trim()) : endpoints;
    this.#router = new Router(list, this.#options.tls);
  }

  /** The client's counters so far. */
  get stats(): ClientStats {
    return { ...this.#stats };
  }

  /** How many leases the client is keeping alive. */
  get heldLeases(): number {
    return this.#leases.size;
  }

  /**
   * Takes a lease on `resource` (exclusive unless `mode` says otherwise),
   * waiting up to `waitMs` in its queue if it cannot be granted now. Retries routing and availability failures until the
   * call's deadline (callTimeoutMs + waitMs) with one request id, so retries
   * never make a second lease. Rejects with a FencelockError: `isLockHeld`
   * for LOCK_HELD / WAIT_TIMED_OUT, code UNAVAILABLE (with `requestId`) when
   * the outcome is unknown.
   */
  async lock(resource: string, options: LockOptions = {}): Promise<Lease> {
    this.#checkOpen();
    if (typeof resource !== "string")
      throw new FencelockError("INVALID_ARGUMENT", { message: "resource must be a string" });
    const ttlMs = checkMs("ttlMs", options.ttlMs);
    const waitMs = checkMs("waitMs", options.waitMs, MAX_WAIT_TIMEOUT_MS);
    let requestId: Buffer;
    const explicitId = options.requestId !== undefined;
    if (explicitId) {
      requestId = Buffer.from(options.requestId as Uint8Array | string);
      if (requestId.length === 0 || requestId.length > MAX_REQUEST_ID_LEN)
        throw new FencelockError("INVALID_ARGUMENT", {
          message: `request id must be 1..=${MAX_REQUEST_ID_LEN} bytes, got ${requestId.length}`,
        });
    } else {
      requestId = randomBytes(GENERATED_REQUEST_ID_LEN);
    }
    const value = Buffer.from(options.value ?? "");
    if (value.length > MAX_VALUE_LEN)
      throw new FencelockError("INVALID_ARGUMENT", {
        message: `value of ${value.length} bytes is over the maximum ${MAX_VALUE_LEN}`,
      });
    const { mode, permits } = checkMode(options.mode, options.permits);
    const signal = options.signal;
    const deadline = now() + this.#options.callTimeoutMs + waitMs;
    const limit: AttemptLimit = waitMs > 0 ? "untilDeadline" : "bounded";
    let restarts = 0;
    for (;;) {
      const request = wire.acquireRequest({
        resource,
        requestId,
        leaseTtlMs: ttlMs,
        waitTimeoutMs: waitMs,
        value,
        mode,
        permits,
      });
      let answer: Answer<AcquireResponse>;
      // Starting over with a new id is safe only when the old id's acquire
      // is known to hold nothing, and only for ids this client made up.
      const mayRestart = () => !explicitId && restarts < MAX_ACQUIRE_RESTARTS && now() < deadline;
      try {
        answer = await this.#call({
          resource,
          deadline,
          limit,
          finalReasons: ACQUIRE_CONTENTION_REASONS,
          method: "Acquire",
          request,
          decode: wire.acquireResponse,
          signal,
          requestId,
        });
      } catch (e) {
        if (e instanceof FencelockError && e.code === "REJECTED" && e.reason === "WAIT_CANCELLED" && mayRestart()) {
          restarts += 1;
          requestId = randomBytes(GENERATED_REQUEST_ID_LEN);
          continue;
        }
        throw e;
      }
      const response = answer.value;
      if (response.leaseState !== 1) {
        if (mayRestart()) {
          restarts += 1;
          requestId = randomBytes(GENERATED_REQUEST_ID_LEN);
          continue;
        }
        const state = leaseStateName(response.leaseState);
        throw new FencelockError("LEASE_ENDED", {
          message: `the lease granted to this request id has ended (${state}, fencing token ${response.fencingToken}); acquire again with a new request id`,
          leaseState: state,
          fencingToken: response.fencingToken,
        });
      }
      this.#router.learn(resource, response.shardId, answer.url);
      return this.#hold(resource, answer, deadline, requestId);
    }
  }

  /** A resource's lock state (linearizable read by the shard's leader). Never the holder's lease id. */
  async get(resource: string, options: CallOptions = {}): Promise<LockState> {
    this.#checkOpen();
    const answer = await this.#call({
      resource,
      deadline: now() + this.#options.callTimeoutMs,
      limit: "bounded",
      method: "Get",
      request: wire.getRequest({ resource }),
      decode: wire.getResponse,
      signal: options.signal,
    });
    this.#router.learn(resource, answer.value.shardId, answer.url);
    return answer.value;
  }

  /**
   * Watches `resource` (lock.proto `Watch`) on a node with a replica of its
   * shard: its state now (a STATE event; or, with `after`, the changes after
   * that revision), then every change as it commits (GRANTED, VALUE_CHANGED,
   * RELEASED, EXPIRED, CANCELLED). Resolves once a node has taken the watch
   * (routing and availability failures are retried until the call deadline;
   * refusals such as PERMISSION_DENIED reject); `for await` the events.
   *
   * The stream has no deadline. When it ends with an error, iteration throws
   * it; its `resumesWatch` says whether watching again with
   * `{ after: watch.after }` continues. `{ resume: true }` does that by
   * itself, skipping nothing and repeating nothing (a `gap` STATE event says
   * the node no longer had the changes).
   */
  async watch(resource: string, options: WatchOptions = {}): Promise<Watch> {
    this.#checkOpen();
    if (typeof resource !== "string")
      throw new FencelockError("INVALID_ARGUMENT", { message: "resource must be a string" });
    return Watch.start(this, resource, options);
  }

  /** The election on resource `name` (`tenant/path`): `campaign`, `leader`, `observe`. */
  election(name: string): Election {
    if (typeof name !== "string") throw new FencelockError("INVALID_ARGUMENT", { message: "name must be a string" });
    return new Election(this, name);
  }

  /**
   * Stops renewing, releases every lease still held (best effort, a couple
   * of seconds at most; leases not released expire) and closes the
   * connections.
   */
  async close(): Promise<void> {
    if (this.#closed) return;
    const leases = [...this.#leases];
    const releases = leases.map((lease) =>
      Promise.race([lease.release().catch(() => false), sleep(CLOSE_RELEASE_TIMEOUT_MS).then(() => false)]),
    );
    await Promise.all(releases);
    this.#closed = true;
    if (this.#keeperTimer) clearTimeout(this.#keeperTimer);
    this.#keeperTimer = undefined;
    this.#router.close();
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }

  #checkOpen(): void {
    if (this.#closed) throw new FencelockError("INVALID_ARGUMENT", { message: "the client is closed" });
  }

  // ---- LeaseOwner ----------------------------------------------------------

  /** @internal */
  forgetLease(lease: Lease): void {
    this.#leases.delete(lease);
    if (this.#leases.size === 0 && this.#keeperTimer) {
      clearTimeout(this.#keeperTimer);
      this.#keeperTimer = undefined;
      this.#keeperAt = Infinity;
    }
  }

  /** @internal Replaces a lease's value; answers its (unchanged) token. */
  async proclaimLease(resource: string, leaseId: Buffer, value: Uint8Array | string): Promise<bigint> {
    const bytes = Buffer.from(value);
    if (bytes.length > MAX_VALUE_LEN)
      throw new FencelockError("INVALID_ARGUMENT", {
        message: `value of ${bytes.length} bytes is over the maximum ${MAX_VALUE_LEN}`,
      });
    const answer = await this.#call({
      resource,
      deadline: now() + this.#options.callTimeoutMs,
      limit: "bounded",
      method: "Proclaim",
      request: wire.proclaimRequest({ resource, leaseId, value: bytes }),
      decode: wire.proclaimResponse,
    });
    return answer.value.fencingToken;
  }

  /** @internal Ends a holding, retrying until the call's deadline. */
  async releaseLease(resource: string, leaseId: Buffer): Promise<boolean> {
    const answer = await this.#call({
      resource,
      deadline: now() + this.#options.callTimeoutMs,
      limit: "bounded",
      method: "Release",
      request: wire.releaseRequest({ resource, leaseId }),
      decode: wire.releaseResponse,
    });
    return answer.value.released;
  }

  /** @internal Opens a watch stream for `Watch` (the start's routing and retries). */
  async openWatch(
    resource: string,
    after: Revision | undefined,
    deadline: number,
    signal: AbortSignal | undefined,
  ): Promise<{ stream: grpc.ClientReadableStream<Buffer>; url: string }> {
    this.#checkOpen();
    const request = wire.watchRequest({ resource, after });
    const answer = await this.#call({
      resource,
      deadline,
      limit: "bounded",
      method: "Watch",
      request,
      open: (channel, attemptMs, onSend) => openStream(channel, SERVICE + "Watch", request, attemptMs, signal, onSend),
      signal,
    });
    return { stream: answer.value, url: answer.url };
  }

  /** @internal */
  watchEnded(failure: Failure, resource: string, shardId: number | undefined, url: string): void {
    this.#router.reroute(failure.reroute, resource, shardId, url);
  }

  /** @internal */
  get watchTiming(): { callTimeoutMs: number; backoffBaseMs: number; backoffMaxMs: number } {
    const o = this.#options;
    return { callTimeoutMs: o.callTimeoutMs, backoffBaseMs: o.backoffBaseMs, backoffMaxMs: o.backoffMaxMs };
  }

  /** @internal */
  countLost(lease: Lease, _reason: LostReason): void {
    this.#stats.leasesLost += 1;
    this.forgetLease(lease);
  }

  // ---- Calls ---------------------------------------------------------------

  /**
   * One logical call: sends the request to the best known node for the
   * resource (or shard) and follows the error contract on failure (redirect,
   * back off, try another node) until it succeeds, fails definitively, or
   * the deadline passes. Answers whose reason is in `finalReasons` end the
   * call whatever their advice.
   */
  async #call<T>(c: {
    resource?: string;
    shardId?: number;
    deadline: number;
    limit: AttemptLimit;
    finalReasons?: Set<string>;
    method: string;
    request: Buffer;
    /** Decodes a unary call's reply ... */
    decode?: (b: Buffer) => T;
    /** ... or, instead of the unary call, makes one attempt itself (a watch's start). */
    open?: (channel: grpc.Client, attemptMs: number, onSend: () => void) => Promise<T>;
    signal?: AbortSignal;
    requestId?: Buffer;
  }): Promise<Answer<T>> {
    const started = now();
    let url =
      c.resource !== undefined
        ? this.#router.target(c.resource)
        : c.shardId
          ? this.#router.targetForShard(c.shardId)
          : this.#router.target("");
    const backoff = new Backoff(this.#options.backoffBaseMs, this.#options.backoffMaxMs);
    let firstSentAt: number | undefined;
    let attempts = 0;
    let last: Failure | undefined;
    /** The last failure that carried the server's reason (a final attempt cut short by the deadline carries none). */
    let lastDetailed: Failure | undefined;
    const unavailable = () =>
      new FencelockError("UNAVAILABLE", {
        message: `no definitive answer within ${Math.round(c.deadline - started)} ms after ${attempts} attempts; last error: ${
          last?.summary ?? "no attempt fitted"
        }`,
        attempts,
        requestId: c.requestId,
        detail: lastDetailed?.detail,
        grpcCode: (lastDetailed ?? last)?.grpcCode,
      });
    for (;;) {
      if (c.signal?.aborted) throw aborted(c.signal, c.requestId);
      const remaining = c.deadline - now();
      if (remaining <= 0) throw unavailable();
      const attemptMs = Math.max(
        1,
        Math.ceil(c.limit === "bounded" ? Math.min(remaining, this.#options.attemptTimeoutMs) : remaining),
      );
      let error: Partial<grpc.ServiceError>;
      let channel: grpc.Client | undefined;
      try {
        channel = this.#router.channel(url);
      } catch (e) {
        if (e instanceof FencelockError && e.code === "INVALID_ARGUMENT") throw e; // closed
        channel = undefined;
      }
      if (!channel) {
        error = { code: grpc.status.UNAVAILABLE, details: `bad address ${url}` };
      } else {
        let sentAt = now();
        const onSend = () => {
          sentAt = now();
          firstSentAt ??= sentAt;
          attempts += 1;
        };
        try {
          const value = c.open
            ? await c.open(channel, attemptMs, onSend)
            : c.decode!(
                await unary(channel, SERVICE + c.method, c.request, attemptMs, this.#options.connectTimeoutMs, c.signal, onSend),
              );
          return { value, firstSentAt: firstSentAt ?? sentAt, lastSentAt: sentAt, url };
        } catch (e) {
          if (c.signal?.aborted) throw aborted(c.signal, c.requestId);
          error = e as Partial<grpc.ServiceError>;
          if (typeof error.code !== "number") {
            // Not a gRPC failure: a bug in decoding, or something equally unexpected.
            throw e;
          }
        }
      }
      const failure = classify(error);
      const isFinal = failure.detail !== undefined && c.finalReasons?.has(reasonName(failure.detail.reason));
      if (failure.advice.kind === "fail" || isFinal) {
        if (failure.detail) throw FencelockError.rejected(failure.detail, failure.grpcCode);
        throw new FencelockError("GRPC", { message: failure.summary, grpcCode: failure.grpcCode });
      }
      const failedShard = failure.detail?.shardId || c.shardId;
      const next = this.#router.reroute(failure.reroute, c.resource, failedShard, url);
      const delay = backoff.delay(failure.advice);
      this.#stats.retries += 1;
      url = next;
      last = failure;
      if (failure.detail) lastDetailed = failure;
      if (now() + delay >= c.deadline) throw unavailable();
      if (delay > 0) {
        try {
          await sleep(delay, c.signal);
        } catch {
          throw aborted(c.signal!, c.requestId);
        }
      }
    }
  }

  #renewBackoff(leaseTtlMs: number): Backoff {
    const max = Math.max(1, Math.min(this.#options.backoffMaxMs, leaseTtlMs / RENEW_RETRY_MAX_TTL_DIVISOR));
    return new Backoff(Math.min(this.#options.backoffBaseMs, max), max);
  }

  #stopBy(sentAt: number, grantedMs: number): number {
    return sentAt + grantedMs - stopByMarginMs(this.#options, grantedMs);
  }

  /**
   * Turns a grant into a Lease kept alive by the keeper. The stop-by
   * deadline counts from the acquire's FIRST attempt: the grant may come
   * from it even when a later attempt brought the answer.
   */
  async #hold(
    resource: string,
    answer: Answer<AcquireResponse>,
    acquireDeadline: number,
    requestId: Buffer,
  ): Promise<Lease> {
    const response = answer.value;
    const ttlMs = response.leaseTtlMs;
    const sentAt = answer.firstSentAt;
    let stopBy = this.#stopBy(sentAt, ttlMs);
    let expiresAtMs = response.expiresAtMs;
    let nextRenewAt = sentAt + jitteredRenewIntervalMs(ttlMs);
    let renewedTtlMs = ttlMs;

    // A long wait (or a deduplicated answer, which grants only what is left
    // of the original grant) leaves a short deadline: renew at once.
    if (response.deduplicated || now() >= sentAt + renewIntervalMs(ttlMs)) {
      const deadline = Math.max(acquireDeadline, now() + this.#options.attemptTimeoutMs);
      try {
        const { sentAt: renewSentAt, value } = await this.#renewOne(
          resource,
          response.leaseId,
          response.shardId,
          deadline,
        );
        renewedTtlMs = value.leaseTtlMs;
        stopBy = Math.max(stopBy, this.#stopBy(renewSentAt, renewedTtlMs));
        expiresAtMs = Math.max(expiresAtMs, value.expiresAtMs);
        nextRenewAt = renewSentAt + jitteredRenewIntervalMs(renewedTtlMs);
      } catch (e) {
        if (e instanceof FencelockError && e.reason === "LEASE_NOT_HELD") throw e;
        if (now() >= stopBy) {
          // Granted, but not confirmable in time to be of use: give it back.
          this.releaseLease(resource, response.leaseId).catch(() => {});
          throw e;
        }
        // Otherwise the keeper keeps trying before the deadline.
      }
    }

    const lease = new Lease(
      {
        resource,
        leaseId: response.leaseId,
        fencingToken: response.fencingToken,
        shardId: response.shardId,
        epoch: response.epoch,
        deduplicated: response.deduplicated,
        requestId,
        timing: {
          leaseTtlMs: renewedTtlMs || ttlMs,
          expiresAtMs,
          stopBy,
          nextRenewAt,
          retryAt: undefined,
          backoff: this.#renewBackoff(renewedTtlMs || ttlMs),
          inFlight: false,
          renewable: true,
        },
      },
      this,
    );
    if (!lease.isHeld) {
      // Already past its deadline (a grant that took longer than its TTL to arrive).
      lease.markLost("UNCONFIRMED");
      this.releaseLease(resource, response.leaseId).catch(() => {});
      throw new FencelockError("UNAVAILABLE", {
        message: `${resource}: granted, but its stop-by deadline passed before it could be confirmed; released`,
      });
    }
    if (this.#closed) {
      // close() ran while this acquire was on the wire: nothing will renew it.
      lease.markLost("RELEASED");
      throw new FencelockError("INVALID_ARGUMENT", {
        message: `${resource}: the client was closed while acquiring; the lease expires unrenewed`,
      });
    }
    this.#leases.add(lease);
    this.#wakeKeeper();
    return lease;
  }

  /** One Renew with retries; returns the send time of the answered attempt. */
  async #renewOne(
    resource: string,
    leaseId: Buffer,
    shardId: number,
    deadline: number,
  ): Promise<{ sentAt: number; value: RenewResponse }> {
    const answer = await this.#call({
      resource,
      shardId,
      deadline,
      limit: "bounded",
      method: "Renew",
      request: wire.renewRequest({ resource, leaseId }),
      decode: wire.renewResponse,
    });
    return { sentAt: answer.lastSentAt, value: answer.value };
  }

  // ---- The keeper ----------------------------------------------------------

  #wakeKeeper(at = now()): void {
    if (this.#closed || this.#leases.size === 0) return;
    at = Math.max(at, now() + MIN_PASS_INTERVAL_MS);
    if (this.#keeperTimer && this.#keeperAt <= at) return;
    if (this.#keeperTimer) clearTimeout(this.#keeperTimer);
    this.#keeperAt = at;
    this.#keeperTimer = setTimeout(
      () => {
        this.#keeperTimer = undefined;
        this.#keeperAt = Infinity;
        this.#pass();
      },
      Math.max(0, Math.ceil(at - now())),
    );
  }

  /** Declares overdue leases lost, sends the renewals that are due, and schedules the next pass. */
  #pass(): void {
    const t = now();
    let next = Infinity;
    const due = new Map<string, Lease[]>();
    for (const lease of this.#leases) {
      if (lease.lostReason !== undefined) continue;
      const timing = lease.timing;
      if (t >= timing.stopBy) {
        lease.markLost("UNCONFIRMED");
        continue;
      }
      next = Math.min(next, timing.stopBy);
      if (timing.inFlight || !timing.renewable) continue;
      // Wake for the due time, but take along every lease already eligible.
      if (t < eligibleAt(timing)) {
        next = Math.min(next, dueAt(timing));
        continue;
      }
      timing.inFlight = true;
      const url = this.#router.targetForShard(lease.shardId);
      const list = due.get(url) ?? [];
      list.push(lease);
      due.set(url, list);
    }
    for (const [url, leases] of due) {
      for (let i = 0; i < leases.length; i += MAX_RENEW_BATCH) {
        void this.#renewBatch(url, leases.slice(i, i + MAX_RENEW_BATCH));
      }
    }
    if (next !== Infinity) this.#wakeKeeper(next);
  }

  /** Renews `leases` with one RenewBatch call to `url` and records each outcome. */
  async #renewBatch(url: string, leases: Lease[]): Promise<void> {
    const shortestTtl = Math.min(...leases.map((l) => l.timing.leaseTtlMs));
    const attemptMs = Math.max(1, Math.floor(Math.min(this.#options.attemptTimeoutMs, shortestTtl / RENEW_ATTEMPT_TTL_DIVISOR)));
    this.#stats.renewBatchCalls += 1;
    const request = wire.renewBatchRequest(leases.map((l) => ({ resource: l.resource, leaseId: l.rawLeaseId })));
    let sentAt = now();
    try {
      const channel = this.#router.channel(url);
      const bytes = await unary(
        channel,
        SERVICE + "RenewBatch",
        request,
        attemptMs,
        Math.min(this.#options.connectTimeoutMs, attemptMs),
        undefined,
        () => (sentAt = now()),
      );
      const results = wire.renewBatchResponse(bytes);
      if (results.length !== leases.length) {
        const failure = classify({ code: grpc.status.INTERNAL, details: `${results.length} renew results for ${leases.length} items` });
        for (const lease of leases) this.#renewFailed(lease, failure, url);
      } else {
        leases.forEach((lease, i) => {
          const r = results[i]!;
          if ("renewed" in r) this.#renewSucceeded(lease, sentAt, r.renewed, url);
          else if ("error" in r)
            this.#renewFailed(lease, classifyDetail(r.error, grpcCodeOfReason(reasonName(r.error.reason))), url);
          else this.#renewFailed(lease, classify({ code: grpc.status.INTERNAL, details: "renew result without an outcome" }), url);
        });
      }
    } catch (e) {
      const err = e as Partial<grpc.ServiceError>;
      const failure = classify(typeof err.code === "number" ? err : { code: grpc.status.UNAVAILABLE, details: String(e) });
      for (const lease of leases) this.#renewFailed(lease, failure, url);
    }
    this.#wakeKeeper();
  }

  /** A confirmed renewal: the deadline restarts from when it was sent, with the time it granted. */
  #renewSucceeded(lease: Lease, sentAt: number, renewed: RenewResponse, url: string): void {
    this.#stats.renewedItems += 1;
    this.#router.learn(lease.resource, lease.shardId, url);
    const timing = lease.timing;
    timing.inFlight = false;
    // Lost is final: a renewal answered after the deadline does not revive the lease.
    if (lease.lostReason !== undefined || now() >= timing.stopBy) return;
    timing.retryAt = undefined;
    const granted = renewed.leaseTtlMs;
    timing.stopBy = Math.max(timing.stopBy, this.#stopBy(sentAt, granted));
    if (granted > 0) timing.leaseTtlMs = granted;
    timing.backoff = this.#renewBackoff(timing.leaseTtlMs);
    timing.expiresAtMs = Math.max(timing.expiresAtMs, renewed.expiresAtMs);
    timing.nextRenewAt = sentAt + jitteredRenewIntervalMs(timing.leaseTtlMs);
    lease.deadlineMoved();
  }

  /** A failed renewal: lost on LEASE_NOT_HELD, no more tries on another definitive refusal, else a retry. */
  #renewFailed(lease: Lease, failure: Failure, url: string): void {
    this.#stats.renewFailures += 1;
    const timing = lease.timing;
    timing.inFlight = false;
    if (failure.detail && reasonName(failure.detail.reason) === "LEASE_NOT_HELD") {
      lease.markLost("NOT_HELD");
      return;
    }
    if (failure.advice.kind === "fail") {
      // HOLD_LIMIT_REACHED and the like: good until stopBy, cannot be extended.
      timing.renewable = false;
      return;
    }
    timing.retryAt = now() + timing.backoff.delay(failure.advice);
    const shard = failure.detail?.shardId || lease.shardId;
    this.#router.reroute(failure.reroute, lease.resource, shard, url);
  }
}
