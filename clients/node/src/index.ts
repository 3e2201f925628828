// @fencelock/client: leases with fencing tokens (exclusive, shared, or a
// semaphore's permits), routed to the right node, retried safely, and kept
// alive in the background — the same rules as the Rust client
// (docs/client.md); watches of a resource and leader elections.

export { Client } from "./client.js";
export type { CallOptions, ClientStats, LockOptions } from "./client.js";
export {
  DEFAULTS,
  MAX_CALL_TIMEOUT_MS,
  MAX_ENDPOINTS,
  MAX_PERMITS,
  MAX_RENEW_BATCH,
  MAX_REQUEST_ID_LEN,
  MAX_VALUE_LEN,
  MAX_STOP_BY_MARGIN_PERCENT,
  MAX_WAIT_TIMEOUT_MS,
  tlsFromFiles,
} from "./config.js";
export type { ClientOptions, ClientTls } from "./config.js";
export { FencelockError, LockLostError } from "./errors.js";
export type { ErrorCode, LostReason } from "./errors.js";
export { Lease } from "./lease.js";
export type {
  AcquireMode,
  ErrorDetail,
  Holding,
  HoldingMode,
  LeaderHint,
  LockState,
  Revision,
  WatchEvent,
  WatchEventKind,
} from "./proto.js";
export { compareRevisions, Election, formatRevision, parseRevision, Watch } from "./watch.js";
export type { CampaignOptions, Leader, WatchOptions } from "./watch.js";
export { MAX_IMMEDIATE_RETRIES } from "./retry.js";
export { MAX_CACHED_RESOURCES, MAX_CACHED_SHARDS, MAX_LEARNED_CONNECTIONS } from "./router.js";
