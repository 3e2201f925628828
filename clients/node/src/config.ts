// ClientOptions: timeouts, backoff, the stop-by margin and TLS, with the
// limits that bound them (the same defaults and ranges as the Rust client).

import { readFileSync } from "node:fs";
import { FencelockError } from "./errors.js";

/** Most seed endpoints a client accepts. */
export const MAX_ENDPOINTS = 16;
/** Most items in one RenewBatch call (the server's default limit). */
export const MAX_RENEW_BATCH = 1024;
/** Longest `waitMs` the client sends (the server's default maximum). */
export const MAX_WAIT_TIMEOUT_MS = 300_000;
/** Longest acceptable per-call deadline. */
export const MAX_CALL_TIMEOUT_MS = 600_000;
/** Largest stop-by margin, in percent of the TTL. */
export const MAX_STOP_BY_MARGIN_PERCENT = 50;
/** Longest request id the server accepts, in bytes. */
export const MAX_REQUEST_ID_LEN = 64;
/** Largest value a lease may publish (lock.proto `AcquireRequest.value`), in bytes. */
export const MAX_VALUE_LEN = 4096;
/** Most permits of a semaphore (lock.proto `AcquireRequest.permits`). */
export const MAX_PERMITS = 1024;

export const DEFAULTS = {
  callTimeoutMs: 10_000,
  attemptTimeoutMs: 3_000,
  connectTimeoutMs: 2_000,
  backoffBaseMs: 50,
  backoffMaxMs: 2_000,
  stopByMarginPercent: 5,
} as const;

/** PEM texts for mutual TLS (docs/security.md). The certificate's URI SAN is the caller's identity. */
export interface ClientTls {
  caPem: Buffer | string;
  certPem: Buffer | string;
  keyPem: Buffer | string;
}

/** Reads the three PEM files of a TLS identity. */
export function tlsFromFiles(caFile: string, certFile: string, keyFile: string): ClientTls {
  const read = (what: string, path: string) => {
    try {
      return readFileSync(path);
    } catch (e) {
      throw new FencelockError("INVALID_CONFIG", { message: `tls ${what} ${path}: ${(e as Error).message}` });
    }
  };
  return { caPem: read("CA file", caFile), certPem: read("certificate file", certFile), keyPem: read("key file", keyFile) };
}

export interface ClientOptions {
  /** Deadline of one logical call, retries included (a waiting acquire gets its wait on top). Default 10000. */
  callTimeoutMs?: number;
  /** Deadline of one attempt of a call that does not wait. Default 3000. */
  attemptTimeoutMs?: number;
  /** Opening a connection. Default 2000. */
  connectTimeoutMs?: number;
  /** First backoff step when the server suggests none. Default 50. */
  backoffBaseMs?: number;
  /** Largest backoff step. Default 2000. */
  backoffMaxMs?: number;
  /** The stop-by margin in percent of the granted TTL (clock-rate drift). Default 5. */
  stopByMarginPercent?: number;
  /** Mutual TLS; endpoints without a scheme are then dialed with https. Default: plaintext (insecure dev clusters). */
  tls?: ClientTls;
}

export type ResolvedOptions = Required<Omit<ClientOptions, "tls">> & { tls?: ClientTls };

function bad(field: string, rule: string): never {
  throw new FencelockError("INVALID_CONFIG", { message: `invalid client configuration: ${field}: ${rule}` });
}

function isInt(v: unknown): v is number {
  return typeof v === "number" && Number.isInteger(v);
}

/** Fills defaults and checks every field against its range; names the first bad one. */
export function resolveOptions(options: ClientOptions = {}): ResolvedOptions {
  // Defaults never exceed the call timeout the caller chose (a short call
  // timeout alone is a valid configuration).
  const callTimeoutMs = options.callTimeoutMs ?? DEFAULTS.callTimeoutMs;
  const capped = (d: number) => (isInt(callTimeoutMs) && callTimeoutMs > 0 ? Math.min(d, callTimeoutMs) : d);
  const backoffMaxMs = options.backoffMaxMs ?? capped(DEFAULTS.backoffMaxMs);
  const o: ResolvedOptions = {
    callTimeoutMs,
    attemptTimeoutMs: options.attemptTimeoutMs ?? capped(DEFAULTS.attemptTimeoutMs),
    connectTimeoutMs: options.connectTimeoutMs ?? capped(DEFAULTS.connectTimeoutMs),
    backoffBaseMs: options.backoffBaseMs ?? (isInt(backoffMaxMs) ? Math.min(DEFAULTS.backoffBaseMs, Math.max(1, backoffMaxMs)) : DEFAULTS.backoffBaseMs),
    backoffMaxMs,
    stopByMarginPercent: options.stopByMarginPercent ?? DEFAULTS.stopByMarginPercent,
    tls: options.tls,
  };
  if (!isInt(o.callTimeoutMs) || o.callTimeoutMs < 1 || o.callTimeoutMs > MAX_CALL_TIMEOUT_MS)
    bad("callTimeoutMs", `must be an integer in 1..=${MAX_CALL_TIMEOUT_MS}`);
  if (!isInt(o.attemptTimeoutMs) || o.attemptTimeoutMs < 1 || o.attemptTimeoutMs > o.callTimeoutMs)
    bad("attemptTimeoutMs", "must be an integer in 1..=callTimeoutMs");
  if (!isInt(o.connectTimeoutMs) || o.connectTimeoutMs < 1 || o.connectTimeoutMs > o.callTimeoutMs)
    bad("connectTimeoutMs", "must be an integer in 1..=callTimeoutMs");
  if (!isInt(o.backoffMaxMs) || o.backoffMaxMs > o.callTimeoutMs) bad("backoffMaxMs", "must be at most callTimeoutMs");
  if (!isInt(o.backoffBaseMs) || o.backoffBaseMs < 1 || o.backoffBaseMs > o.backoffMaxMs)
    bad("backoffBaseMs", "must be an integer in 1..=backoffMaxMs");
  if (!isInt(o.stopByMarginPercent) || o.stopByMarginPercent < 1 || o.stopByMarginPercent > MAX_STOP_BY_MARGIN_PERCENT)
    bad("stopByMarginPercent", `must be an integer in 1..=${MAX_STOP_BY_MARGIN_PERCENT}`);
  if (o.tls && (!o.tls.caPem || !o.tls.certPem || !o.tls.keyPem))
    bad("tls", "needs caPem, certPem and keyPem (all three)");
  return o;
}

/** How much earlier than `sentAt + ttl` the application must stop (ms); never 0. */
export function stopByMarginMs(options: ResolvedOptions, leaseTtlMs: number): number {
  return Math.max(1, Math.floor((leaseTtlMs * options.stopByMarginPercent) / 100));
}
