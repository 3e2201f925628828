// The wire contract: the fencelock protos (lock.proto, errors.proto) loaded
// with protobufjs at start, and plain-object views of the messages the
// client uses. 64-bit integers never pass through a JS number where they
// could exceed 2^53: fencing tokens become bigints; millisecond values,
// shard ids and epochs (far below 2^53) become numbers.

import { existsSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import protobuf from "protobufjs";

const here = dirname(fileURLToPath(import.meta.url));

/** Where lock.proto and errors.proto live: this package's copy, else the repository's. */
function protoRoot(): string {
  const candidates = [
    join(here, "..", "proto"), // the package (dist/ -> proto/)
    join(here, "..", "..", "..", "proto"), // the repository (clients/node/dist -> proto/)
  ];
  for (const dir of candidates) {
    if (existsSync(join(dir, "fencelock", "v1", "lock.proto"))) return dir;
  }
  throw new Error(
    `fencelock protos not found (looked in ${candidates.join(", ")}); run \`npm run build\` in clients/node`,
  );
}

const root = new protobuf.Root();
const base = protoRoot();
root.resolvePath = (_origin: string, target: string) =>
  target.startsWith("/") ? target : resolve(base, target);
root.loadSync(["fencelock/v1/lock.proto", "fencelock/v1/errors.proto"], { keepCase: true });

// google.rpc.Status and google.protobuf.Any, the envelope of the
// `grpc-status-details-bin` trailer, declared by hand (two small messages).
const rpc = new protobuf.Root();
const Any = new protobuf.Type("Any")
  .add(new protobuf.Field("type_url", 1, "string"))
  .add(new protobuf.Field("value", 2, "bytes"));
const RpcStatus = new protobuf.Type("Status")
  .add(new protobuf.Field("code", 1, "int32"))
  .add(new protobuf.Field("message", 2, "string"))
  .add(new protobuf.Field("details", 3, "Any", "repeated"));
rpc.define("google.protobuf").add(Any);
rpc.define("google.rpc").add(RpcStatus);
rpc.resolveAll();

export const ERROR_DETAIL_TYPE_URL = "type.googleapis.com/fencelock.v1.ErrorDetail";

function type(name: string): protobuf.Type {
  return root.lookupType(`fencelock.v1.${name}`);
}

export const types = {
  AcquireRequest: type("AcquireRequest"),
  AcquireResponse: type("AcquireResponse"),
  RenewRequest: type("RenewRequest"),
  RenewResponse: type("RenewResponse"),
  RenewBatchRequest: type("RenewBatchRequest"),
  RenewBatchResponse: type("RenewBatchResponse"),
  ReleaseRequest: type("ReleaseRequest"),
  ReleaseResponse: type("ReleaseResponse"),
  GetRequest: type("GetRequest"),
  GetResponse: type("GetResponse"),
  ProclaimRequest: type("ProclaimRequest"),
  ProclaimResponse: type("ProclaimResponse"),
  WatchRequest: type("WatchRequest"),
  WatchEvent: type("WatchEvent"),
  ErrorDetail: type("ErrorDetail"),
};

const reasonEnum = root.lookupEnum("fencelock.v1.Reason");
const retryEnum = root.lookupEnum("fencelock.v1.RetryPolicy");
const stateEnum = root.lookupEnum("fencelock.v1.LeaseState");
const watchKindEnum = root.lookupEnum("fencelock.v1.WatchEventKind");

/** `REASON_LOCK_HELD` (5) -> `LOCK_HELD`; an unknown number -> `UNKNOWN_<n>`. */
export function reasonName(value: number): string {
  const name = reasonEnum.valuesById[value];
  return name ? name.replace(/^REASON_/, "") : `UNKNOWN_${value}`;
}

/** True when this client's protos know the reason (a newer server may send others). */
export function isKnownReason(value: number): boolean {
  return value !== 0 && reasonEnum.valuesById[value] !== undefined;
}

export function retryPolicyName(value: number): string {
  const name = retryEnum.valuesById[value];
  return name ? name.replace(/^RETRY_POLICY_/, "") : `UNKNOWN_${value}`;
}

export function leaseStateName(value: number): string {
  const name = stateEnum.valuesById[value];
  return name ? name.replace(/^LEASE_STATE_/, "") : `UNKNOWN_${value}`;
}

/** What a watch event says happened; a kind this client does not know (a newer server) is `UNSPECIFIED`. */
export type WatchEventKind = "UNSPECIFIED" | "STATE" | "GRANTED" | "VALUE_CHANGED" | "RELEASED" | "EXPIRED" | "CANCELLED";

export function watchEventKindName(value: number): WatchEventKind {
  const name = value === 0 ? undefined : watchKindEnum.valuesById[value];
  return name ? (name.replace(/^WATCH_EVENT_KIND_/, "") as WatchEventKind) : "UNSPECIFIED";
}

/**
 * How an acquire holds its resource (`fencelock.v1.AcquireMode`):
 * `"exclusive"` (the only holder, the default), `"shared"` (one of any
 * number of readers, never beside an exclusive holder) or `"semaphore"`
 * (one of at most `permits` holders).
 */
export type AcquireMode = "exclusive" | "shared" | "semaphore";

/** A holding's mode as a server reports it; `"unknown"` for a mode this client does not know (a newer server). */
export type HoldingMode = AcquireMode | "unknown";

const MODE_TO_WIRE: Record<AcquireMode, number> = { exclusive: 0, shared: 1, semaphore: 2 };
const MODE_FROM_WIRE: readonly AcquireMode[] = ["exclusive", "shared", "semaphore"];

/** `AcquireMode` (enum number) -> its name; an unknown number -> `"unknown"`. */
export function modeName(value: number): HoldingMode {
  return MODE_FROM_WIRE[value] ?? "unknown";
}

/** The wire number of a mode (`AcquireRequest.mode`). */
export function modeValue(mode: AcquireMode): number {
  return MODE_TO_WIRE[mode];
}

/** True for the modes an acquire may ask for. */
export function isAcquireMode(v: unknown): v is AcquireMode {
  return typeof v === "string" && Object.prototype.hasOwnProperty.call(MODE_TO_WIRE, v);
}

/** One holding of a resource (`fencelock.v1.Holding`). */
export interface Holding {
  /** Its fencing token (tokens rise in grant order). */
  fencingToken: bigint;
  /** When it ends unless renewed (ms since the Unix epoch, the leader's clock); informational. */
  expiresAtMs: number;
  /** What it publishes (its acquire's value, or its last proclaim). */
  value: Buffer;
  mode: HoldingMode;
}

/**
 * A place in a resource's history (`fencelock.v1.Revision`): compare
 * (epoch, index, seq) in order (`compareRevisions`); the same on every node.
 * The u64 parts are bigints, so a revision passes through exactly.
 */
export interface Revision {
  epoch: bigint;
  index: bigint;
  seq: number;
}

/** One event of a watch (`fencelock.v1.WatchEvent`). */
export interface WatchEvent {
  kind: WatchEventKind;
  /** Where it happened; resume after it. Absent only from a server that sent none. */
  revision: Revision | undefined;
  /** Whether a lease holds the resource after this event (for a shared lock or a semaphore: any of its holdings). */
  held: boolean;
  /** The token of the lease the event is about (STATE: the holder's; 0n when free). */
  fencingToken: bigint;
  /** The holder's value (STATE, GRANTED, VALUE_CHANGED). */
  value: Buffer;
  /** When the lease ends unless renewed (STATE, GRANTED), ms since the Unix epoch on the shard's lease clock; informational. */
  expiresAtMs: number;
  /** STATE only: the changes between the `after` asked for and this state were not kept; this is the state now. */
  gap: boolean;
  /** The shard serving the resource. */
  shardId: number;
  /**
   * STATE only: every holding, oldest first (one for an exclusive lock;
   * `fencingToken` is the first's). Other events are about the one lease
   * `fencingToken` names: empty.
   */
  holders: Holding[];
}

/** Where a shard's leader is, as the answering node knows it. */
export interface LeaderHint {
  nodeId: number;
  /** `host:port`. */
  address: string;
}

/** `fencelock.v1.ErrorDetail` as a plain object. */
export interface ErrorDetail {
  /** The numeric reason (see `reasonName`). */
  reason: number;
  message: string;
  /** RetryPolicy: 0 unspecified, 1 never, 2 immediately, 3 after, 4 backoff. */
  retry: number;
  retryAfterMs: number;
  leader?: LeaderHint;
  shardId: number;
  currentEpoch: number;
  mapVersion: number;
  holderExpiresAtMs: number;
  queueLength: number;
  minAllowed: number;
  maxAllowed: number;
  field: string;
}

export interface AcquireResponse {
  leaseId: Buffer;
  fencingToken: bigint;
  expiresAtMs: number;
  leaseTtlMs: number;
  deduplicated: boolean;
  /** LeaseState: 1 held, 2 released, 3 expired, 4 cancelled. */
  leaseState: number;
  shardId: number;
  epoch: number;
}

export interface RenewResponse {
  expiresAtMs: number;
  leaseTtlMs: number;
}

export type RenewResult = { renewed: RenewResponse } | { error: ErrorDetail } | { none: true };

/**
 * A resource's lock state (`Client.get`). The holder's lease id is never
 * included. `fencingToken`, `expiresAtMs`, `value` and `mode` describe the
 * oldest holding; a shared lock or a semaphore may have more, all of them
 * in `holders`, oldest first.
 */
export interface LockState {
  held: boolean;
  fencingToken: bigint;
  expiresAtMs: number;
  queueLength: number;
  lastToken: bigint;
  shardId: number;
  epoch: number;
  /** What the holder publishes (empty when not held or none). */
  value: Buffer;
  /** The oldest holding's mode (`"exclusive"` when not held). */
  mode: HoldingMode;
  /** A semaphore's permit count; 0 for a lock. */
  permits: number;
  /** Every holding, oldest first; empty when not held. */
  holders: Holding[];
}

const TO_OBJECT: protobuf.IConversionOptions = {
  longs: String,
  enums: Number,
  defaults: true,
  oneofs: true,
};

type Obj = Record<string, unknown>;

function decode(t: protobuf.Type, bytes: Uint8Array): Obj {
  return t.toObject(t.decode(bytes), TO_OBJECT) as Obj;
}

function num(v: unknown): number {
  if (v === undefined || v === null || v === "") return 0;
  return Number(v);
}

function big(v: unknown): bigint {
  if (v === undefined || v === null || v === "") return 0n;
  return BigInt(v as string | number);
}

function buf(v: unknown): Buffer {
  if (v === undefined || v === null) return Buffer.alloc(0);
  return Buffer.from(v as Uint8Array);
}

export function holdingsFromObject(v: unknown): Holding[] {
  return ((v as Obj[] | undefined | null) ?? []).map((h) => ({
    fencingToken: big(h.fencing_token),
    expiresAtMs: num(h.expires_at_ms),
    value: buf(h.value),
    mode: modeName(num(h.mode)),
  }));
}

function holdingsToWire(hs: Holding[] | undefined): Obj[] {
  return (hs ?? []).map((h) => ({
    fencing_token: h.fencingToken.toString(),
    expires_at_ms: h.expiresAtMs,
    value: h.value,
    mode: h.mode === "unknown" ? 99 : modeValue(h.mode), // "unknown": a number no server sends (fakes only)
  }));
}

export function errorDetailFromObject(o: Obj): ErrorDetail {
  const leader = o.leader as Obj | undefined | null;
  return {
    reason: num(o.reason),
    message: String(o.message ?? ""),
    retry: num(o.retry),
    retryAfterMs: num(o.retry_after_ms),
    leader: leader ? { nodeId: num(leader.node_id), address: String(leader.address ?? "") } : undefined,
    shardId: num(o.shard_id),
    currentEpoch: num(o.current_epoch),
    mapVersion: num(o.map_version),
    holderExpiresAtMs: num(o.holder_expires_at_ms),
    queueLength: num(o.queue_length),
    minAllowed: num(o.min_allowed),
    maxAllowed: num(o.max_allowed),
    field: String(o.field ?? ""),
  };
}

/** Reads the ErrorDetail out of a `grpc-status-details-bin` value, if it has one. */
export function errorDetailFromStatusDetails(bytes: Uint8Array): ErrorDetail | undefined {
  let status: Obj;
  try {
    status = RpcStatus.toObject(RpcStatus.decode(bytes), { defaults: true }) as Obj;
  } catch {
    return undefined;
  }
  for (const any of (status.details as Obj[]) ?? []) {
    if (any.type_url === ERROR_DETAIL_TYPE_URL) {
      try {
        return errorDetailFromObject(decode(types.ErrorDetail, any.value as Uint8Array));
      } catch {
        return undefined;
      }
    }
  }
  return undefined;
}

function errorDetailToWire(d: Partial<ErrorDetail>): Obj {
  return {
    reason: d.reason ?? 0,
    message: d.message ?? "",
    retry: d.retry ?? 0,
    retry_after_ms: d.retryAfterMs ?? 0,
    leader: d.leader ? { node_id: d.leader.nodeId, address: d.leader.address } : undefined,
    shard_id: d.shardId ?? 0,
    current_epoch: d.currentEpoch ?? 0,
    map_version: d.mapVersion ?? 0,
    holder_expires_at_ms: d.holderExpiresAtMs ?? 0,
    queue_length: d.queueLength ?? 0,
    min_allowed: d.minAllowed ?? 0,
    max_allowed: d.maxAllowed ?? 0,
    field: d.field ?? "",
  };
}

/** The `grpc-status-details-bin` bytes a server sends with `detail` (for tests and fakes). */
export function encodeStatusDetails(code: number, message: string, detail: Partial<ErrorDetail>): Buffer {
  const value = types.ErrorDetail.encode(types.ErrorDetail.fromObject(errorDetailToWire(detail))).finish();
  const status = RpcStatus.fromObject({
    code,
    message,
    details: [{ type_url: ERROR_DETAIL_TYPE_URL, value }],
  });
  return Buffer.from(RpcStatus.encode(status).finish());
}

function encoder(t: protobuf.Type) {
  return (o: Obj): Buffer => Buffer.from(t.encode(t.fromObject(o)).finish());
}

export const wire = {
  acquireRequest: (r: {
    resource: string;
    requestId: Uint8Array;
    leaseTtlMs: number;
    waitTimeoutMs: number;
    value?: Uint8Array;
    mode?: AcquireMode;
    permits?: number;
  }) =>
    encoder(types.AcquireRequest)({
      resource: r.resource,
      request_id: r.requestId,
      lease_ttl_ms: r.leaseTtlMs,
      wait_timeout_ms: r.waitTimeoutMs,
      value: r.value ?? Buffer.alloc(0),
      mode: modeValue(r.mode ?? "exclusive"),
      permits: r.permits ?? 0,
    }),
  proclaimRequest: (r: { resource: string; leaseId: Uint8Array; value: Uint8Array }) =>
    encoder(types.ProclaimRequest)({ resource: r.resource, lease_id: r.leaseId, value: r.value }),
  proclaimResponse(bytes: Buffer): { fencingToken: bigint } {
    const o = decode(types.ProclaimResponse, bytes);
    return { fencingToken: big(o.fencing_token) };
  },
  renewRequest: (r: { resource: string; leaseId: Uint8Array; leaseTtlMs?: number }) =>
    encoder(types.RenewRequest)({ resource: r.resource, lease_id: r.leaseId, lease_ttl_ms: r.leaseTtlMs ?? 0 }),
  renewBatchRequest: (items: { resource: string; leaseId: Uint8Array }[]) =>
    encoder(types.RenewBatchRequest)({
      items: items.map((i) => ({ resource: i.resource, lease_id: i.leaseId, lease_ttl_ms: 0 })),
    }),
  releaseRequest: (r: { resource: string; leaseId: Uint8Array }) =>
    encoder(types.ReleaseRequest)({ resource: r.resource, lease_id: r.leaseId }),
  getRequest: (r: { resource: string }) => encoder(types.GetRequest)({ resource: r.resource }),
  watchRequest: (r: { resource: string; after?: Revision }) =>
    encoder(types.WatchRequest)({
      resource: r.resource,
      after: r.after
        ? { epoch: r.after.epoch.toString(), index: r.after.index.toString(), seq: r.after.seq }
        : undefined,
    }),
  watchEvent(bytes: Buffer): WatchEvent {
    const o = decode(types.WatchEvent, bytes);
    const r = o.revision as Obj | undefined | null;
    return {
      kind: watchEventKindName(num(o.kind)),
      revision: r ? { epoch: big(r.epoch), index: big(r.index), seq: num(r.seq) } : undefined,
      held: Boolean(o.held),
      fencingToken: big(o.fencing_token),
      value: buf(o.value),
      expiresAtMs: num(o.expires_at_ms),
      gap: Boolean(o.gap),
      shardId: num(o.shard_id),
      holders: holdingsFromObject(o.holders),
    };
  },

  acquireResponse(bytes: Buffer): AcquireResponse {
    const o = decode(types.AcquireResponse, bytes);
    return {
      leaseId: buf(o.lease_id),
      fencingToken: big(o.fencing_token),
      expiresAtMs: num(o.expires_at_ms),
      leaseTtlMs: num(o.lease_ttl_ms),
      deduplicated: Boolean(o.deduplicated),
      leaseState: num(o.lease_state),
      shardId: num(o.shard_id),
      epoch: num(o.epoch),
    };
  },
  renewResponse(bytes: Buffer): RenewResponse {
    const o = decode(types.RenewResponse, bytes);
    return { expiresAtMs: num(o.expires_at_ms), leaseTtlMs: num(o.lease_ttl_ms) };
  },
  renewBatchResponse(bytes: Buffer): RenewResult[] {
    const o = decode(types.RenewBatchResponse, bytes);
    return ((o.results as Obj[]) ?? []).map((r) => {
      if (r.outcome === "renewed" && r.renewed) {
        const rr = r.renewed as Obj;
        return { renewed: { expiresAtMs: num(rr.expires_at_ms), leaseTtlMs: num(rr.lease_ttl_ms) } };
      }
      if (r.outcome === "error" && r.error) return { error: errorDetailFromObject(r.error as Obj) };
      return { none: true };
    });
  },
  releaseResponse(bytes: Buffer): { released: boolean } {
    const o = decode(types.ReleaseResponse, bytes);
    return { released: Boolean(o.released) };
  },
  getResponse(bytes: Buffer): LockState {
    const o = decode(types.GetResponse, bytes);
    return {
      held: Boolean(o.held),
      fencingToken: big(o.fencing_token),
      expiresAtMs: num(o.expires_at_ms),
      queueLength: num(o.queue_length),
      lastToken: big(o.last_token),
      shardId: num(o.shard_id),
      epoch: num(o.epoch),
      value: buf(o.value),
      mode: modeName(num(o.mode)),
      permits: num(o.permits),
      holders: holdingsFromObject(o.holders),
    };
  },
};

/** Encoders of responses, for tests and fake servers. */
export const fakeWire = {
  acquireResponse: (r: AcquireResponse) =>
    encoder(types.AcquireResponse)({
      lease_id: r.leaseId,
      fencing_token: r.fencingToken.toString(),
      expires_at_ms: r.expiresAtMs,
      lease_ttl_ms: r.leaseTtlMs,
      deduplicated: r.deduplicated,
      lease_state: r.leaseState,
      shard_id: r.shardId,
      epoch: r.epoch,
    }),
  renewResponse: (r: RenewResponse) =>
    encoder(types.RenewResponse)({ expires_at_ms: r.expiresAtMs, lease_ttl_ms: r.leaseTtlMs }),
  renewBatchResponse: (results: RenewResult[]) =>
    encoder(types.RenewBatchResponse)({
      results: results.map((r) =>
        "renewed" in r
          ? { renewed: { expires_at_ms: r.renewed.expiresAtMs, lease_ttl_ms: r.renewed.leaseTtlMs } }
          : "error" in r
            ? { error: errorDetailToWire(r.error) }
            : {},
      ),
    }),
  releaseResponse: (r: { released: boolean }) => encoder(types.ReleaseResponse)({ released: r.released }),
  /** A GetResponse; `modeNumber` sends a raw enum number (a mode this client does not know). */
  getResponse: (r: Partial<LockState> & { modeNumber?: number }) =>
    encoder(types.GetResponse)({
      held: r.held ?? false,
      fencing_token: (r.fencingToken ?? 0n).toString(),
      expires_at_ms: r.expiresAtMs ?? 0,
      queue_length: r.queueLength ?? 0,
      last_token: (r.lastToken ?? 0n).toString(),
      shard_id: r.shardId ?? 0,
      epoch: r.epoch ?? 0,
      value: r.value ?? Buffer.alloc(0),
      mode: r.modeNumber ?? (r.mode === undefined || r.mode === "unknown" ? 0 : modeValue(r.mode)),
      permits: r.permits ?? 0,
      holders: holdingsToWire(r.holders),
    }),
  /** A WatchEvent; `kind` is the enum number (so tests can send kinds this client does not know). */
  watchEvent: (e: {
    kind: number;
    revision?: [number, number, number];
    held?: boolean;
    fencingToken?: bigint;
    value?: Uint8Array;
    expiresAtMs?: number;
    gap?: boolean;
    shardId?: number;
    holders?: Holding[];
  }) =>
    encoder(types.WatchEvent)({
      kind: e.kind,
      revision: e.revision ? { epoch: e.revision[0], index: e.revision[1], seq: e.revision[2] } : undefined,
      held: e.held ?? false,
      fencing_token: (e.fencingToken ?? 0n).toString(),
      value: e.value ?? Buffer.alloc(0),
      expires_at_ms: e.expiresAtMs ?? 0,
      gap: e.gap ?? false,
      shard_id: e.shardId ?? 1,
      holders: holdingsToWire(e.holders),
    }),
  decodeWatchRequest(bytes: Buffer) {
    const o = decode(types.WatchRequest, bytes);
    const r = o.after as Obj | undefined | null;
    return {
      resource: String(o.resource),
      after: r ? ([num(r.epoch), num(r.index), num(r.seq)] as [number, number, number]) : undefined,
    };
  },
  decodeAcquireRequest(bytes: Buffer) {
    const o = decode(types.AcquireRequest, bytes);
    return {
      resource: String(o.resource),
      requestId: buf(o.request_id),
      leaseTtlMs: num(o.lease_ttl_ms),
      waitTimeoutMs: num(o.wait_timeout_ms),
      value: buf(o.value),
      mode: num(o.mode),
      permits: num(o.permits),
    };
  },
  decodeRenewBatchRequest(bytes: Buffer) {
    const o = decode(types.RenewBatchRequest, bytes);
    return ((o.items as Obj[]) ?? []).map((i) => ({ resource: String(i.resource), leaseId: buf(i.lease_id) }));
  },
  decodeRenewRequest(bytes: Buffer) {
    const o = decode(types.RenewRequest, bytes);
    return { resource: String(o.resource), leaseId: buf(o.lease_id) };
  },
  decodeReleaseRequest(bytes: Buffer) {
    const o = decode(types.ReleaseRequest, bytes);
    return { resource: String(o.resource), leaseId: buf(o.lease_id) };
  },
};
