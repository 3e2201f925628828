// Compiled (never run) by test.sh: the public API, as a TypeScript user
// writes it, type-checks against the emitted declarations.
import {
  type AcquireMode,
  Client,
  compareRevisions,
  type Election,
  FencelockError,
  type Holding,
  type HoldingMode,
  formatRevision,
  type Leader,
  type Lease,
  type LockState,
  type LostReason,
  MAX_PERMITS,
  parseRevision,
  type Revision,
  type Watch,
  type WatchEvent,
  type WatchEventKind,
} from "../dist/index.js";

export async function example(): Promise<bigint> {
  const client = new Client(["127.0.0.1:7001"], { callTimeoutMs: 5000, stopByMarginPercent: 5 });
  try {
    await using lease = await client.lock("acme/orders/42", { ttlMs: 30000, waitMs: 5000 });
    const token: bigint = lease.token;
    const stopBy: number = lease.stopBy;
    const signal: AbortSignal = lease.signal;
    const reason: Promise<LostReason> = lease.lost;
    void stopBy, signal, reason;
    const state: LockState = await client.get("acme/orders/42");
    return state.fencingToken > token ? state.fencingToken : token;
  } catch (e) {
    if (e instanceof FencelockError && e.isLockHeld) return 0n;
    if (e instanceof FencelockError) {
      const r: string | undefined = e.reason;
      const hint = e.leaderHint?.address;
      void r, hint, e.retryable;
    }
    throw e;
  } finally {
    await client.close();
  }
}

export async function explicit(client: Client): Promise<boolean> {
  const lease: Lease = await client.lock("acme/x");
  try {
    return lease.isHeld;
  } finally {
    await lease.release();
  }
}

export async function watching(client: Client): Promise<Revision | undefined> {
  const watch: Watch = await client.watch("acme/orders/42", { after: parseRevision("3.1204.0"), resume: true });
  for await (const event of watch) {
    const e: WatchEvent = event;
    const kind: WatchEventKind = e.kind;
    const token: bigint = e.fencingToken;
    const value: Buffer = e.value;
    void kind, token, value, e.held, e.gap, e.expiresAtMs, e.shardId;
    if (e.revision && compareRevisions(e.revision, { epoch: 3n, index: 1n, seq: 0 }) > 0) break;
  }
  await using again = await client.watch("acme/orders/42", { after: watch.after });
  const next: IteratorResult<WatchEvent, undefined> = await again.next();
  if (!next.done) void formatRevision(next.value.revision!);
  return watch.after;
}

export async function electing(client: Client): Promise<bigint> {
  const election: Election = client.election("acme/election/db");
  const ac = new AbortController();
  const lease: Lease = await election.campaign("10.0.0.7:5432", { ttlMs: 10000, signal: ac.signal });
  const leader: Leader | undefined = await election.leader();
  const observed: Watch = await election.observe({ after: undefined });
  observed.close();
  await lease.proclaim("10.0.0.7:9443");
  await lease.release();
  return leader?.fencingToken ?? 0n;
}

export async function modes(client: Client, mode: AcquireMode): Promise<bigint[]> {
  const reader: Lease = await client.lock("acme/report", { mode: "shared", waitMs: 1000 });
  const permit: Lease = await client.lock("acme/gpu", { mode: "semaphore", permits: Math.min(4, MAX_PERMITS) });
  const other: Lease = await client.lock("acme/any", { mode });
  const state: LockState = await client.get("acme/gpu");
  const holders: Holding[] = state.holders;
  const kind: HoldingMode = state.mode;
  const permits: number = state.permits;
  void kind, permits;
  try {
    await client.lock("acme/gpu", { mode: "semaphore", permits: 2 });
  } catch (e) {
    if (e instanceof FencelockError && e.isModeMismatch) void e.detail?.minAllowed;
  }
  for (const l of [reader, permit, other]) await l.release();
  return holders.map((h) => h.fencingToken);
}
