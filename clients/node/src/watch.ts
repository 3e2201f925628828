// Watching a resource (lock.proto `Watch`) and elections on a fenced lock,
// with the Rust client's rules: a watch starts on any node with a replica
// of the shard (routing and availability failures retried until the call
// deadline), streams typed events, and is resumed after the last revision
// received when it ends the way `FencelockError.resumesWatch` says a new
// watch resolves.

import type * as grpc from "@grpc/grpc-js";
import { status as GrpcStatus } from "@grpc/grpc-js";
import { MAX_WAIT_TIMEOUT_MS } from "./config.js";
import { FencelockError } from "./errors.js";
import type { Lease } from "./lease.js";
import { now } from "./lease.js";
import { type Revision, type WatchEvent, wire } from "./proto.js";
import { Backoff, classify, type Failure } from "./retry.js";

/** How a stream that ended without an error is reported when resuming (UNAVAILABLE: the Rust CLI's rule). */
const ENDED_BY_NODE = "the node ended the watch";

export interface WatchOptions {
  /** Resume after this revision (the last one received). Absent: start with the state now (a STATE event). */
  after?: Revision;
  /**
   * Watch again after the last revision received, by itself, when the stream
   * ends the way `FencelockError.resumesWatch` says a new watch resolves;
   * never yields an event twice. Other endings are thrown.
   */
  resume?: boolean;
  /** Aborting it ends the watch (iteration stops). */
  signal?: AbortSignal;
}

/** Orders revisions: negative if `a` comes first, 0 if equal, positive if after. */
export function compareRevisions(a: Revision, b: Revision): number {
  if (a.epoch !== b.epoch) return a.epoch < b.epoch ? -1 : 1;
  if (a.index !== b.index) return a.index < b.index ? -1 : 1;
  return a.seq - b.seq;
}

/** `EPOCH.INDEX.SEQ`, as `fencelock watch` prints a revision. */
export function formatRevision(r: Revision): string {
  return `${r.epoch}.${r.index}.${r.seq}`;
}

/** Reads `EPOCH.INDEX.SEQ` (as `formatRevision` and `fencelock watch` write it). */
export function parseRevision(text: string): Revision {
  const m = /^(\d+)\.(\d+)\.(\d+)$/.exec(text);
  if (!m) throw new FencelockError("INVALID_ARGUMENT", { message: `${JSON.stringify(text)} is not a revision: expected EPOCH.INDEX.SEQ, e.g. 3.1204.0` });
  return { epoch: BigInt(m[1]!), index: BigInt(m[2]!), seq: Number(m[3]!) };
}

/** What a watch needs from its client. */
export interface WatchHost {
  /** Opens a watch stream on a node that takes it, retrying per errors.proto until `deadline`. */
  openWatch(
    resource: string,
    after: Revision | undefined,
    deadline: number,
    signal: AbortSignal | undefined,
  ): Promise<{ stream: grpc.ClientReadableStream<Buffer>; url: string }>;
  /** Applies an ending's routing advice (a hinted node, another node, a stale shard). */
  watchEnded(failure: Failure, resource: string, shardId: number | undefined, url: string): void;
  readonly watchTiming: { callTimeoutMs: number; backoffBaseMs: number; backoffMaxMs: number };
}

function sleep(ms: number, signal?: AbortSignal): Promise<boolean> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve(false);
    const onAbort = () => {
      clearTimeout(timer);
      resolve(false);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve(true);
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/** The error a watch stream ended with. */
function endingError(failure: Failure): FencelockError {
  if (failure.detail) return FencelockError.rejected(failure.detail, failure.grpcCode);
  return new FencelockError("GRPC", { message: failure.summary, grpcCode: failure.grpcCode });
}

/**
 * The events of one resource (`client.watch`): `for await (const event of
 * watch)`; `close()` (or `await using`) stops it. `after` is the resume
 * point, the revision of the last event received.
 *
 * Without `resume`, iteration throws the error the stream ended with (a
 * `FencelockError`; watch again with `{ after: watch.after }` when its
 * `resumesWatch` is true) and ends quietly after `close()`. With `resume`,
 * such endings are resumed by themselves; only the others are thrown.
 */
export class Watch implements AsyncIterableIterator<WatchEvent>, AsyncDisposable {
  readonly resource: string;
  readonly #host: WatchHost;
  readonly #resume: boolean;
  readonly #signal: AbortSignal | undefined;
  #after: Revision | undefined;
  #stream: grpc.ClientReadableStream<Buffer> | undefined;
  #events: AsyncIterator<Buffer> | undefined;
  #url = "";
  #closed = false;
  #eventsSinceStart = 0;
  #shardId = 0;
  #startDeadline = 0;
  #backoff: Backoff;

  private constructor(host: WatchHost, resource: string, options: WatchOptions) {
    this.#host = host;
    this.resource = resource;
    this.#after = options.after;
    this.#resume = options.resume ?? false;
    this.#signal = options.signal;
    this.#backoff = this.#newBackoff();
    this.#signal?.addEventListener("abort", () => this.close(), { once: true });
  }

  /** @internal Starts a watch: resolves once a node has taken it. */
  static async start(host: WatchHost, resource: string, options: WatchOptions): Promise<Watch> {
    const w = new Watch(host, resource, options);
    await w.#start(undefined);
    return w;
  }

  /** The revision of the last event received (or the `after` the watch started with): watch again after it to resume. */
  get after(): Revision | undefined {
    return this.#after;
  }

  /** True once closed (by `close()`, the signal, or an ending that was thrown). */
  get closed(): boolean {
    return this.#closed;
  }

  #newBackoff(): Backoff {
    const t = this.#host.watchTiming;
    return new Backoff(t.backoffBaseMs, t.backoffMaxMs);
  }

  async #start(deadline: number | undefined): Promise<void> {
    if (deadline === undefined) deadline = this.#startDeadline = now() + this.#host.watchTiming.callTimeoutMs;
    let opened;
    try {
      opened = await this.#host.openWatch(this.resource, this.#after, deadline, this.#signal);
    } catch (e) {
      if (this.#closed) return;
      throw e;
    }
    if (this.#closed) {
      opened.stream.cancel();
      return;
    }
    this.#stream = opened.stream;
    this.#events = opened.stream[Symbol.asyncIterator]() as AsyncIterator<Buffer>;
    this.#url = opened.url;
  }

  /** Ends the watch: a waiting `next()` resolves done. */
  close(): void {
    this.#closed = true;
    const stream = this.#stream;
    this.#stream = undefined;
    this.#events = undefined;
    stream?.cancel();
  }

  async next(): Promise<IteratorResult<WatchEvent, undefined>> {
    const done = { done: true, value: undefined } as const;
    for (;;) {
      if (this.#closed) return done;
      const events = this.#events;
      if (!events) {
        await this.#start(undefined);
        continue;
      }
      let failure: Failure;
      try {
        const r = await events.next();
        if (this.#closed) return done;
        if (!r.done) {
          const event = this.#accept(r.value);
          if (event) return { done: false, value: event };
          continue;
        }
        if (!this.#resume) {
          this.close();
          return done;
        }
        failure = classify({ code: GrpcStatus.UNAVAILABLE, details: ENDED_BY_NODE });
      } catch (e) {
        if (this.#closed) return done;
        const err = e as Partial<grpc.ServiceError>;
        failure = classify(typeof err.code === "number" ? err : { code: GrpcStatus.UNAVAILABLE, details: String(e) });
      }
      this.#stream = undefined;
      this.#events = undefined;
      const error = endingError(failure);
      // An ending before any event, within the start's deadline, that is not
      // definitive is the start's: a refusal that raced the headers.
      const early = this.#eventsSinceStart === 0 && now() < this.#startDeadline;
      const delay = this.#eventsSinceStart > 0 ? 0 : this.#backoff.delay(failure.advice);
      this.#eventsSinceStart = 0;
      this.#host.watchEnded(failure, this.resource, failure.detail?.shardId || this.#shardId || undefined, this.#url);
      const restart = early && failure.advice.kind !== "fail";
      if (!restart && !(this.#resume && error.resumesWatch)) {
        this.close();
        throw error;
      }
      if (delay > 0 && !(await sleep(delay, this.#signal))) return done;
      await this.#start(restart ? this.#startDeadline : undefined);
    }
  }

  /** The event, or undefined for one at or before the resume point (a server never sends one; this makes sure). */
  #accept(bytes: Buffer): WatchEvent | undefined {
    const event = wire.watchEvent(bytes);
    if (event.revision) {
      if (this.#after && compareRevisions(event.revision, this.#after) <= 0) return undefined;
      this.#after = event.revision;
    }
    if (this.#eventsSinceStart === 0) this.#backoff = this.#newBackoff();
    this.#eventsSinceStart += 1;
    if (event.shardId) this.#shardId = event.shardId;
    return event;
  }

  async return(): Promise<IteratorResult<WatchEvent, undefined>> {
    this.close();
    return { done: true, value: undefined };
  }

  [Symbol.asyncIterator](): Watch {
    return this;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    this.close();
  }
}

/** Who leads an election: the value its lease publishes and its fencing token. */
export interface Leader {
  value: Buffer;
  fencingToken: bigint;
}

export interface CampaignOptions {
  /** The leader's lease TTL in ms; 0 or absent = the server's default (30000). */
  ttlMs?: number;
  /** Aborting it stops campaigning: the waiting acquire leaves the queue (rejects with code ABORTED). */
  signal?: AbortSignal;
}

/** What an election needs from its client. */
export interface ElectionHost {
  lock(resource: string, options: { ttlMs?: number; waitMs?: number; value?: Uint8Array | string; signal?: AbortSignal }): Promise<Lease>;
  get(resource: string, options?: { signal?: AbortSignal }): Promise<{ held: boolean; value: Buffer; fencingToken: bigint }>;
  watch(resource: string, options?: WatchOptions): Promise<Watch>;
}

/**
 * Leader election on the lock `name` (etcd's v3election): `campaign` waits
 * in the FIFO queue and returns the leader's `Lease` (`proclaim` replaces
 * its value, `release` resigns; `lease.token` goes with every write made as
 * leader), `leader()` says who leads, `observe()` watches the changes.
 */
export class Election {
  readonly name: string;
  readonly #client: ElectionHost;

  /** @internal Use `client.election(name)`. */
  constructor(client: ElectionHost, name: string) {
    this.#client = client;
    this.name = name;
  }

  /**
   * Waits in the resource's FIFO queue, for as long as it takes, until this
   * candidate leads; its lease publishes `value` from then on.
   */
  async campaign(value: Uint8Array | string = "", options: CampaignOptions = {}): Promise<Lease> {
    for (;;) {
      try {
        return await this.#client.lock(this.name, {
          ttlMs: options.ttlMs,
          waitMs: MAX_WAIT_TIMEOUT_MS,
          value,
          signal: options.signal,
        });
      } catch (e) {
        // Waited the longest one acquire may: queue again.
        if (e instanceof FencelockError && e.isLockHeld) continue;
        throw e;
      }
    }
  }

  /** Who leads now (a linearizable read), or undefined between leaders. */
  async leader(options: { signal?: AbortSignal } = {}): Promise<Leader | undefined> {
    const state = await this.#client.get(this.name, options);
    return state.held ? { value: state.value, fencingToken: state.fencingToken } : undefined;
  }

  /** Every change of leadership as it commits: a watch of the resource (`client.watch`). */
  observe(options: WatchOptions = {}): Promise<Watch> {
    return this.#client.watch(this.name, options);
  }
}
