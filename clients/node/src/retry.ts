// Reading a failed attempt the way errors.proto asks: what to do next
// (Advice), where to send the retry (Reroute), and how long to wait
// (Backoff).

import { randomInt } from "node:crypto";
import { status as GrpcStatus, type ServiceError } from "@grpc/grpc-js";
import {
  defaultOrGivenRetry,
  RETRY_AFTER,
  RETRY_BACKOFF,
  RETRY_IMMEDIATELY,
  RETRY_NEVER,
} from "./errors.js";
import { type ErrorDetail, errorDetailFromStatusDetails, isKnownReason, reasonName } from "./proto.js";

/** Immediate retries (redirects included) one call may make before it backs off even when told to retry at once. */
export const MAX_IMMEDIATE_RETRIES = 5;

const MAX_BACKOFF_DOUBLINGS = 16;

export type Advice =
  | { kind: "fail" }
  | { kind: "now" }
  | { kind: "after"; ms: number }
  | { kind: "backoff"; firstMs?: number };

export type Reroute =
  /** The same node: it can serve the shard, only not right now. */
  | { kind: "stay" }
  /** The shard's leader, as hinted (`host:port`). */
  | { kind: "to"; address: string }
  /** Another node: the answering one cannot serve the shard; its route is forgotten. */
  | { kind: "elsewhere" }
  /** The client's idea of the resource's shard is stale: forget it. */
  | { kind: "refresh" };

export interface Failure {
  advice: Advice;
  reroute: Reroute;
  detail?: ErrorDetail;
  grpcCode: number;
  /** `REASON: message` or `CODE: message`. */
  summary: string;
}

/** The name of a gRPC status code (`UNAVAILABLE`). */
export function grpcCodeName(code: number): string {
  return (GrpcStatus as unknown as Record<number, string>)[code] ?? `CODE_${code}`;
}

/** The ErrorDetail a failed call carries in its `grpc-status-details-bin` trailer, if any. */
export function detailOf(error: Partial<ServiceError>): ErrorDetail | undefined {
  const values = error.metadata?.get("grpc-status-details-bin") ?? [];
  for (const v of values) {
    if (typeof v === "string") continue;
    const detail = errorDetailFromStatusDetails(v);
    if (detail) return detail;
  }
  return undefined;
}

/** Reads a failed attempt (a grpc-js error, or a synthetic one with a code). */
export function classify(error: Partial<ServiceError>): Failure {
  const code = typeof error.code === "number" ? error.code : GrpcStatus.UNKNOWN;
  const detail = detailOf(error);
  if (detail) return classifyDetail(detail, code);
  const { advice, reroute } = byCode(code);
  return { advice, reroute, grpcCode: code, summary: `${grpcCodeName(code)}: ${error.details ?? error.message ?? ""}` };
}

/** Reads an ErrorDetail that came with gRPC code `code`. */
export function classifyDetail(detail: ErrorDetail, code: number): Failure {
  const { advice, reroute } = isKnownReason(detail.reason) ? advise(detail) : byCode(code);
  return { advice, reroute, detail, grpcCode: code, summary: `${reasonName(detail.reason)}: ${detail.message}` };
}

/** Advice from the gRPC code alone, for failures without a known reason. */
function byCode(code: number): { advice: Advice; reroute: Reroute } {
  switch (code) {
    // No answer (or one this client cannot read): the node may be down or
    // the connection cut, and another node may serve the shard.
    case GrpcStatus.UNAVAILABLE:
    case GrpcStatus.DEADLINE_EXCEEDED:
    case GrpcStatus.CANCELLED:
    case GrpcStatus.UNKNOWN:
    case GrpcStatus.INTERNAL:
      return { advice: { kind: "backoff" }, reroute: { kind: "elsewhere" } };
    default:
      return { advice: { kind: "fail" }, reroute: { kind: "stay" } };
  }
}

/** A known reason: the retry policy decides whether and when; the reason decides where. */
function advise(detail: ErrorDetail): { advice: Advice; reroute: Reroute } {
  const hinted = detail.leader?.address ? detail.leader.address : undefined;
  const reason = reasonName(detail.reason);
  let reroute: Reroute;
  switch (reason) {
    case "NOT_LEADER":
    case "SHUTTING_DOWN":
      reroute = hinted ? { kind: "to", address: hinted } : { kind: "elsewhere" };
      break;
    case "LEADER_UNKNOWN":
    case "NO_QUORUM":
      reroute = { kind: "elsewhere" };
      break;
    case "EPOCH_NOT_MATCH":
    case "SHARD_NOT_FOUND":
      reroute = { kind: "refresh" };
      break;
    default:
      reroute = { kind: "stay" };
  }
  const policy = defaultOrGivenRetry(detail);
  let advice: Advice;
  if (policy === RETRY_NEVER) advice = { kind: "fail" };
  else if (policy === RETRY_IMMEDIATELY) advice = { kind: "now" };
  else if (policy === RETRY_AFTER) advice = { kind: "after", ms: detail.retryAfterMs };
  else if (policy === RETRY_BACKOFF && reroute.kind === "to") advice = { kind: "now" }; // the named leader can answer now
  else advice = { kind: "backoff", firstMs: detail.retryAfterMs > 0 ? detail.retryAfterMs : undefined };
  return { advice, reroute };
}

/** A uniformly random integer in 0..=limit (ms). */
export function jitterUpTo(limitMs: number): number {
  const limit = Math.max(0, Math.floor(limitMs));
  return limit === 0 ? 0 : randomInt(0, limit + 1);
}

/** The delays between the retries of one call. */
export class Backoff {
  private doublings = 0;
  private immediateLeft = MAX_IMMEDIATE_RETRIES;
  constructor(
    private readonly baseMs: number,
    private readonly maxMs: number,
  ) {}

  /** How long to wait before the next attempt (ms), jittered. */
  delay(advice: Advice): number {
    switch (advice.kind) {
      case "fail":
        return 0;
      case "now":
        if (this.immediateLeft > 0) {
          this.immediateLeft -= 1;
          return 0;
        }
        return this.exponential(undefined);
      case "after":
        // The server knows why it wants this long: honour it, jitter only upwards.
        return advice.ms + jitterUpTo(advice.ms / 4);
      case "backoff":
        return this.exponential(advice.firstMs);
    }
  }

  /** The next exponential step, jittered into its upper half. */
  private exponential(firstMs: number | undefined): number {
    const start = Math.min(firstMs ?? this.baseMs, this.maxMs);
    const step = Math.min(start * 2 ** Math.min(this.doublings, MAX_BACKOFF_DOUBLINGS), this.maxMs);
    this.doublings += 1;
    return Math.floor(step / 2) + jitterUpTo(step / 2);
  }
}
