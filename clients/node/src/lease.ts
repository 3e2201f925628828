// Lease: one held lock, kept alive by its client's keeper, with its stop-by
// deadline, lost signal and release.

import { inspect } from "node:util";
import { LockLostError, type LostReason } from "./errors.js";
import type { Backoff } from "./retry.js";
import { jitterUpTo } from "./retry.js";

/** Renew when a third of the TTL has passed since the last renewal was sent. */
const RENEW_AT_TTL_DIVISOR = 3;
/** Jitter of the renew time, in percent of the interval either way. */
const RENEW_JITTER_PERCENT = 10;
/** A lease may go out this fraction of its renew interval early, to share a RenewBatch with others due. */
const RENEW_COALESCE_DIVISOR = 4;

/** The monotonic clock, in ms (`performance.now()`): the only clock that decides anything. */
export function now(): number {
  return performance.now();
}

export function renewIntervalMs(leaseTtlMs: number): number {
  return leaseTtlMs / RENEW_AT_TTL_DIVISOR;
}

/** The renew interval with ±10% jitter, so many leases taken together do not renew in lockstep. */
export function jitteredRenewIntervalMs(leaseTtlMs: number): number {
  const interval = renewIntervalMs(leaseTtlMs);
  const spread = (interval * RENEW_JITTER_PERCENT) / 100;
  return interval - spread + jitterUpTo(spread * 2);
}

/** The renewal bookkeeping of one lease. */
export interface Timing {
  leaseTtlMs: number;
  expiresAtMs: number;
  stopBy: number;
  nextRenewAt: number;
  /** After a failed renewal: when to try again (overrides nextRenewAt). */
  retryAt: number | undefined;
  backoff: Backoff;
  inFlight: boolean;
  /** False once the server refused a renewal for good (HOLD_LIMIT_REACHED): it runs out at stopBy. */
  renewable: boolean;
}

export function dueAt(t: Timing): number {
  return t.retryAt ?? t.nextRenewAt;
}

export function eligibleAt(t: Timing): number {
  if (t.retryAt !== undefined) return t.retryAt;
  return t.nextRenewAt - renewIntervalMs(t.leaseTtlMs) / RENEW_COALESCE_DIVISOR;
}

/** What the lease needs from its client. */
export interface LeaseOwner {
  forgetLease(lease: Lease): void;
  releaseLease(resource: string, leaseId: Buffer): Promise<boolean>;
  proclaimLease(resource: string, leaseId: Buffer, value: Uint8Array | string): Promise<bigint>;
  countLost(lease: Lease, reason: LostReason): void;
}

export interface LeaseInit {
  resource: string;
  leaseId: Buffer;
  fencingToken: bigint;
  shardId: number;
  epoch: number;
  deduplicated: boolean;
  requestId: Buffer;
  timing: Timing;
}

/**
 * An exclusive lease on one resource, renewed in the background.
 *
 * Pass `token` with every write to the protected system, which must reject
 * tokens lower than the highest it accepted for the resource. Do protected
 * work only while `signal` is not aborted: it aborts when the lease is lost
 * (a renewal answered LEASE_NOT_HELD, or `stopBy` passed without a confirmed
 * renewal) and when it is released. Call `release()` when done (or use
 * `await using`).
 */
export class Lease {
  /** The resource this lease holds. */
  readonly resource: string;
  /** The fencing token of the grant, exact (a u64 never passes through a JS number). */
  readonly token: bigint;
  /** The shard that granted the lease. */
  readonly shardId: number;
  /** The shard's epoch at the grant (the high bits of the token). */
  readonly epoch: number;
  /** True when the grant was learned by a retry of the acquire (its first reply was lost). */
  readonly deduplicated: boolean;
  /** The request id of the acquire that was granted (not a secret: it cannot renew or release). */
  readonly requestId: Buffer;

  /** @internal */ readonly timing: Timing;
  readonly #leaseId: Buffer;
  readonly #owner: LeaseOwner;
  readonly #controller = new AbortController();
  #lostReason: LostReason | undefined;
  #resolveLost!: (reason: LostReason) => void;
  readonly #lost: Promise<LostReason>;
  #stopTimer: NodeJS.Timeout | undefined;
  readonly #onLost: ((reason: LostReason) => void)[] = [];
  #released = false;

  /** @internal */
  constructor(init: LeaseInit, owner: LeaseOwner) {
    this.resource = init.resource;
    this.token = init.fencingToken;
    this.shardId = init.shardId;
    this.epoch = init.epoch;
    this.deduplicated = init.deduplicated;
    this.requestId = init.requestId;
    this.timing = init.timing;
    this.#leaseId = init.leaseId;
    this.#owner = owner;
    this.#lost = new Promise((resolve) => (this.#resolveLost = resolve));
    this.#armStopTimer();
  }

  /** The lease id (16 bytes): the credential for renew and release. Keep it secret; never log it. */
  get leaseId(): Buffer {
    return Buffer.from(this.#leaseId);
  }

  /** @internal */
  get rawLeaseId(): Buffer {
    return this.#leaseId;
  }

  /**
   * The stop-by deadline on the monotonic clock (`performance.now()` ms):
   * the send time of the acquire or renewal that was last answered, plus
   * the TTL that answer granted, minus the drift margin. Protected work must
   * be done (or abandoned) by then unless a renewal moves it later.
   */
  get stopBy(): number {
    return this.timing.stopBy;
  }

  /** Milliseconds left until `stopBy` (0 when passed or lost). */
  get remainingMs(): number {
    return this.isHeld ? Math.max(0, this.timing.stopBy - now()) : 0;
  }

  /** The TTL the server last granted, in ms. */
  get leaseTtlMs(): number {
    return this.timing.leaseTtlMs;
  }

  /** The server's expiry after the last confirmed renewal (its wall clock, ms since the Unix epoch). Informational. */
  get expiresAtMs(): number {
    return this.timing.expiresAtMs;
  }

  /** True while the lease is held as far as the client knows and `stopBy` has not passed. */
  get isHeld(): boolean {
    return this.#lostReason === undefined && now() < this.timing.stopBy;
  }

  /** Why the lease was lost, or undefined while held. */
  get lostReason(): LostReason | undefined {
    return this.#lostReason;
  }

  /** Aborted when the lease is lost or released; its `reason` is a `LockLostError`. Pass it to the protected work. */
  get signal(): AbortSignal {
    return this.#controller.signal;
  }

  /** Resolves (never rejects) with the reason when the lease is lost or released; at `stopBy` at the latest. */
  get lost(): Promise<LostReason> {
    return this.#lost;
  }

  /** Calls `callback` once when the lease is lost (NOT_HELD or UNCONFIRMED); not when it is released. */
  onLost(callback: (reason: LostReason) => void): void {
    if (this.#lostReason !== undefined) {
      if (this.#lostReason !== "RELEASED") queueMicrotask(() => callback(this.#lostReason!));
      return;
    }
    this.#onLost.push(callback);
  }

  /**
   * Replaces the value this lease publishes (`client.get` returns it): an
   * election's Proclaim. The fencing token does not change; it is returned.
   * Rejects with LEASE_NOT_HELD when the lock is lost.
   */
  proclaim(value: Uint8Array | string): Promise<bigint> {
    return this.#owner.proclaimLease(this.resource, this.#leaseId, value);
  }

  /**
   * Stops renewing and ends the lease: true if this call ended the holding,
   * false if the lease no longer held the resource (nothing was changed).
   * Throws a FencelockError if no node answered in time (the lease then
   * expires by itself).
   */
  async release(): Promise<boolean> {
    if (this.#released) return false;
    this.#released = true;
    this.#owner.forgetLease(this);
    const previous = this.#lostReason;
    this.markLost("RELEASED");
    if (previous === "NOT_HELD") return false;
    return this.#owner.releaseLease(this.resource, this.#leaseId);
  }

  /** `await using lease = await client.lock(...)`: releases, best effort (a failed release leaves the lease to expire). */
  async [Symbol.asyncDispose](): Promise<void> {
    try {
      await this.release();
    } catch {
      // The lease expires at its TTL; the caller's work is already over.
    }
  }

  /** @internal Moves the lease to lost, unless it already is; returns whether it was held. */
  markLost(reason: LostReason): boolean {
    if (this.#lostReason !== undefined) return false;
    this.#lostReason = reason;
    if (this.#stopTimer) clearTimeout(this.#stopTimer);
    this.#stopTimer = undefined;
    if (reason !== "RELEASED") this.#owner.countLost(this, reason);
    this.#controller.abort(new LockLostError(this.resource, reason));
    this.#resolveLost(reason);
    if (reason !== "RELEASED") {
      for (const cb of this.#onLost.splice(0)) {
        try {
          cb(reason);
        } catch (e) {
          queueMicrotask(() => {
            throw e;
          });
        }
      }
    } else {
      this.#onLost.length = 0;
    }
    return true;
  }

  /** @internal A confirmed renewal moved the deadline: re-arm the exact timer. */
  deadlineMoved(): void {
    if (this.#lostReason === undefined) this.#armStopTimer();
  }

  /** Fires exactly at stopBy, even if the keeper is late. */
  #armStopTimer(): void {
    if (this.#stopTimer) clearTimeout(this.#stopTimer);
    const fire = () => {
      this.#stopTimer = undefined;
      if (this.#lostReason !== undefined) return;
      const left = this.timing.stopBy - now();
      if (left > 0) {
        this.#stopTimer = setTimeout(fire, Math.ceil(left));
        return;
      }
      this.markLost("UNCONFIRMED");
    };
    this.#stopTimer = setTimeout(fire, Math.max(0, Math.ceil(this.timing.stopBy - now())));
  }

  /** Never shows the lease id. */
  [inspect.custom](): string {
    return `Lease { resource: ${JSON.stringify(this.resource)}, token: ${this.token}n, shardId: ${this.shardId}, ${
      this.#lostReason ? `lost: ${this.#lostReason}` : `held, remainingMs: ${Math.round(this.remainingMs)}`
    } }`;
  }

  toJSON(): Record<string, unknown> {
    return {
      resource: this.resource,
      token: this.token.toString(),
      shardId: this.shardId,
      held: this.isHeld,
      lostReason: this.#lostReason,
    };
  }
}
