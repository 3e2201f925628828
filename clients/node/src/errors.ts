// FencelockError, the one error class of the package, and LockLostError,
// the reason of a lease's AbortSignal.

import { status as GrpcStatus } from "@grpc/grpc-js";
import { type ErrorDetail, type LeaderHint, reasonName, retryPolicyName } from "./proto.js";

/** What kind of failure a `FencelockError` is (mirrors the Rust client's `ClientError`). */
export type ErrorCode =
  /** A `ClientOptions` field is out of range. Nothing was sent. */
  | "INVALID_CONFIG"
  /** An endpoint is not usable, or the list is empty or too long. Nothing was sent. */
  | "INVALID_ENDPOINT"
  /** An argument was refused by the client before any call. Nothing was sent. */
  | "INVALID_ARGUMENT"
  /** The server answered definitively with an `ErrorDetail` (see `reason`). */
  | "REJECTED"
  /** No definitive answer before the call's deadline: the outcome of a write is unknown. */
  | "UNAVAILABLE"
  /** An acquire with an explicit request id found that id's grant, but it has ended. */
  | "LEASE_ENDED"
  /** A gRPC failure without a fencelock detail that is not a transport failure. */
  | "GRPC"
  /** The caller's AbortSignal ended the call. For an acquire the server removes the waiter. */
  | "ABORTED"
  /** A lease was lost (the reason of `lease.signal`). */
  | "LOCK_LOST";

/** The reasons a watch ends with that a new watch after the last revision received resolves (lock.proto `Watch`). */
const WATCH_RESUME_REASONS = new Set(["SERVER_BUSY", "EPOCH_NOT_MATCH", "SHUTTING_DOWN"]);
/** gRPC codes of a broken watch stream (no ErrorDetail): resumed too. */
const WATCH_RESUME_CODES = new Set<number>([GrpcStatus.UNAVAILABLE, GrpcStatus.UNKNOWN, GrpcStatus.INTERNAL]);

/** Reasons that mean "someone else holds the lock" on an acquire. */
const LOCK_HELD_REASONS = new Set(["LOCK_HELD", "WAIT_TIMED_OUT"]);

export interface FencelockErrorInit {
  message: string;
  detail?: ErrorDetail;
  grpcCode?: number;
  requestId?: Buffer;
  attempts?: number;
  timeoutMs?: number;
  leaseState?: string;
  fencingToken?: bigint;
  cause?: unknown;
}

/** Why a client call failed. */
export class FencelockError extends Error {
  /** The kind of failure. */
  readonly code: ErrorCode;
  /** The server's reason without the `REASON_` prefix (`LOCK_HELD`, `NOT_LEADER`, ...), when it sent one. */
  readonly reason: string | undefined;
  /**
   * Whether trying the same thing again later may succeed: the server's
   * retry advice was not NEVER (LOCK_HELD and WAIT_TIMED_OUT are retryable:
   * the lock may be free later), or no definitive answer came (UNAVAILABLE).
   */
  readonly retryable: boolean;
  /** The shard leader named by the server (NOT_LEADER, SHUTTING_DOWN), if any. */
  readonly leaderHint: LeaderHint | undefined;
  /** The server's full `ErrorDetail`, when it sent one. */
  readonly detail: ErrorDetail | undefined;
  /** The gRPC status code of the (last) failed attempt, when there was one. */
  readonly grpcCode: number | undefined;
  /** UNAVAILABLE acquire: the request id it used; retry with it to learn the outcome. */
  readonly requestId: Buffer | undefined;
  /** UNAVAILABLE: attempts made. */
  readonly attempts: number | undefined;
  /** LEASE_ENDED: the ended lease's state (RELEASED, EXPIRED, CANCELLED). */
  readonly leaseState: string | undefined;
  /** LEASE_ENDED: the ended lease's fencing token. */
  readonly fencingToken: bigint | undefined;

  constructor(code: ErrorCode, init: FencelockErrorInit) {
    super(init.message, init.cause === undefined ? undefined : { cause: init.cause });
    this.name = "FencelockError";
    this.code = code;
    this.detail = init.detail;
    this.reason = init.detail ? reasonName(init.detail.reason) : undefined;
    this.leaderHint = init.detail?.leader && init.detail.leader.address ? init.detail.leader : undefined;
    this.grpcCode = init.grpcCode;
    this.requestId = init.requestId;
    this.attempts = init.attempts;
    this.leaseState = init.leaseState;
    this.fencingToken = init.fencingToken;
    if (code === "UNAVAILABLE") this.retryable = true;
    else if (code === "REJECTED" && init.detail) this.retryable = defaultOrGivenRetry(init.detail) !== RETRY_NEVER;
    else this.retryable = false;
  }

  /** True when someone else holds the lock: LOCK_HELD (no wait asked) or WAIT_TIMED_OUT. Nothing is held. */
  get isLockHeld(): boolean {
    return this.reason !== undefined && LOCK_HELD_REASONS.has(this.reason);
  }

  /**
   * True for MODE_MISMATCH: the resource is in use in another kind (a lock
   * while this acquire asked for a semaphore, or the reverse, or a semaphore
   * of another count; `detail.field` is `mode` or `permits`, whose
   * `detail.minAllowed` is the count in force). Never retried.
   */
  get isModeMismatch(): boolean {
    return this.reason === "MODE_MISMATCH";
  }

  /** True when the call may or may not have taken effect. */
  get outcomeUnknown(): boolean {
    return this.code === "UNAVAILABLE";
  }

  /**
   * True when a watch that ended with this error is resumed by watching
   * again after the last revision received: the watcher fell behind
   * (SERVER_BUSY), the resource moved (EPOCH_NOT_MATCH), the replica stopped
   * serving it (SHUTTING_DOWN), or the connection broke (code GRPC with
   * gRPC status UNAVAILABLE, UNKNOWN or INTERNAL). `watch(.., { resume: true })`
   * does that by itself.
   */
  get resumesWatch(): boolean {
    if (this.code === "REJECTED") return this.reason !== undefined && WATCH_RESUME_REASONS.has(this.reason);
    if (this.code === "GRPC") return this.grpcCode !== undefined && WATCH_RESUME_CODES.has(this.grpcCode);
    return false;
  }

  static rejected(detail: ErrorDetail, grpcCode?: number): FencelockError {
    return new FencelockError("REJECTED", {
      message: `${reasonName(detail.reason)}: ${detail.message}`,
      detail,
      grpcCode,
    });
  }
}

/** Why a lease no longer protects anything. Every value means: stop the protected work now. */
export type LostReason =
  /** A renewal was answered LEASE_NOT_HELD: released with its id elsewhere, expired, or superseded. */
  | "NOT_HELD"
  /** The stop-by deadline passed without a confirmed renewal (no quorum, nodes down, hold limit, ...). */
  | "UNCONFIRMED"
  /** The application released the lease (or closed the client). */
  | "RELEASED";

const LOST_MESSAGES: Record<LostReason, string> = {
  NOT_HELD: "lock lost: the server no longer holds the lease (LEASE_NOT_HELD)",
  UNCONFIRMED: "lock lost: no renewal was confirmed before the stop-by deadline",
  RELEASED: "the lease was released by this client",
};

/** The reason of a lost lease's `signal` (and of `lease.lost`). */
export class LockLostError extends FencelockError {
  readonly lostReason: LostReason;
  readonly resource: string;
  constructor(resource: string, lostReason: LostReason) {
    super("LOCK_LOST", { message: `${resource}: ${LOST_MESSAGES[lostReason]}` });
    this.name = "LockLostError";
    this.lostReason = lostReason;
    this.resource = resource;
  }
}

// ---- The retry contract of errors.proto ----------------------------------

export const RETRY_UNSPECIFIED = 0;
export const RETRY_NEVER = 1;
export const RETRY_IMMEDIATELY = 2;
export const RETRY_AFTER = 3;
export const RETRY_BACKOFF = 4;

/** The retry advice documented on each reason, for RETRY_POLICY_UNSPECIFIED. */
const DEFAULT_RETRY: Record<string, number> = {
  LOCK_HELD: RETRY_BACKOFF,
  WAIT_TIMED_OUT: RETRY_BACKOFF,
  LEASE_ID_COLLISION: RETRY_IMMEDIATELY,
  QUEUE_FULL: RETRY_BACKOFF,
  TENANT_WAITERS_EXCEEDED: RETRY_BACKOFF,
  DEDUP_TABLE_FULL: RETRY_BACKOFF,
  TABLE_FULL: RETRY_BACKOFF,
  NOT_LEADER: RETRY_IMMEDIATELY,
  LEADER_UNKNOWN: RETRY_BACKOFF,
  NO_QUORUM: RETRY_BACKOFF,
  LEADER_NOT_READY: RETRY_BACKOFF,
  TOKEN_SPACE_EXHAUSTED: RETRY_BACKOFF,
  SHUTTING_DOWN: RETRY_BACKOFF,
  SERVER_BUSY: RETRY_BACKOFF,
  OUTCOME_UNKNOWN: RETRY_IMMEDIATELY,
  EPOCH_NOT_MATCH: RETRY_IMMEDIATELY,
  TENANT_QUOTA_EXCEEDED: RETRY_BACKOFF,
  RATE_LIMITED: RETRY_BACKOFF,
  VALUES_FULL: RETRY_BACKOFF,
  INTERNAL: RETRY_BACKOFF,
  // Everything else (malformed requests, LEASE_NOT_HELD, HOLD_LIMIT_REACHED,
  // WAIT_CANCELLED, SHARD_NOT_FOUND, PERMISSION_DENIED, FEATURE_NOT_ENABLED,
  // MODE_MISMATCH, INVALID_PERMITS, admin reasons, REASON_UNSPECIFIED and
  // unknown reasons): NEVER.
};

/** The server's retry policy, or the reason's documented default when it sent none (or one unknown here). */
export function defaultOrGivenRetry(detail: ErrorDetail): number {
  if (detail.retry >= RETRY_NEVER && detail.retry <= RETRY_BACKOFF) return detail.retry;
  return DEFAULT_RETRY[reasonName(detail.reason)] ?? RETRY_NEVER;
}

/** The gRPC code errors.proto assigns to a reason (for a failed RenewBatch item, which has none of its own). */
export function grpcCodeOfReason(reason: string): number {
  switch (reason) {
    case "INVALID_RESOURCE":
    case "INVALID_REQUEST_ID":
    case "INVALID_LEASE_ID":
    case "TTL_OUT_OF_RANGE":
    case "WAIT_TIMEOUT_OUT_OF_RANGE":
    case "BATCH_TOO_LARGE":
    case "REQUEST_ID_REUSED":
    case "INVALID_ADMIN_REQUEST":
    case "MALFORMED_REQUEST":
    case "VALUE_TOO_LARGE":
    case "INVALID_PERMITS":
      return GrpcStatus.INVALID_ARGUMENT;
    case "LOCK_HELD":
    case "WAIT_TIMED_OUT":
    case "LEASE_ID_COLLISION":
    case "EPOCH_NOT_MATCH":
      return GrpcStatus.ABORTED;
    case "QUEUE_FULL":
    case "TENANT_WAITERS_EXCEEDED":
    case "DEDUP_TABLE_FULL":
    case "TABLE_FULL":
    case "TENANT_QUOTA_EXCEEDED":
    case "RATE_LIMITED":
    case "MESSAGE_TOO_LARGE":
    case "VALUES_FULL":
      return GrpcStatus.RESOURCE_EXHAUSTED;
    case "LEASE_NOT_HELD":
    case "HOLD_LIMIT_REACHED":
    case "PLACEMENT_CONFLICT":
    case "FEATURE_NOT_ENABLED":
    case "MODE_MISMATCH":
      return GrpcStatus.FAILED_PRECONDITION;
    case "WAIT_CANCELLED":
      return GrpcStatus.CANCELLED;
    case "NOT_LEADER":
    case "LEADER_UNKNOWN":
    case "NO_QUORUM":
    case "LEADER_NOT_READY":
    case "TOKEN_SPACE_EXHAUSTED":
    case "SHUTTING_DOWN":
    case "SERVER_BUSY":
    case "OUTCOME_UNKNOWN":
      return GrpcStatus.UNAVAILABLE;
    case "SHARD_NOT_FOUND":
    case "NODE_NOT_FOUND":
      return GrpcStatus.NOT_FOUND;
    case "PERMISSION_DENIED":
      return GrpcStatus.PERMISSION_DENIED;
    case "INTERNAL":
      return GrpcStatus.INTERNAL;
    default:
      return GrpcStatus.UNKNOWN;
  }
}

export { retryPolicyName };
