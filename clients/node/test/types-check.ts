// Compiled (never run) by test.sh: the public API, as a TypeScript user
// writes it, type-checks against the emitted declarations.
import { Client, FencelockError, type Lease, type LockState, type LostReason } from "../dist/index.js";

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
