//! Every bound the state machine enforces, in one place.
//!
//! The limits are part of the replicated state (they travel in snapshots) so
//! that every replica applies the same rules to the same log. They are checked
//! when a command is applied, each with its own typed error, and re-asserted
//! where the state relies on them.

/// Maximum length of a whole resource name (`tenant/path`), in bytes.
pub const MAX_RESOURCE_NAME_LEN: usize = 256;
/// Maximum length of the tenant prefix, in bytes.
pub const MAX_TENANT_LEN: usize = 63;
/// Maximum length of a client-chosen request id, in bytes.
pub const MAX_REQUEST_ID_LEN: usize = 64;
/// Length of a lease id: 128 random bits chosen by the proposer.
pub const LEASE_ID_LEN: usize = 16;
/// Maximum length of a lease owner's identity (a SPIFFE-style URI from the
/// caller's certificate), in bytes.
pub const MAX_OWNER_LEN: usize = 255;
/// Maximum number of leases one batch renew may carry.
pub const MAX_RENEW_BATCH: usize = 1024;
/// Largest clock-offset allowance a `LeaderChanged` command may carry (1 min).
/// Anything larger is a misconfiguration, not a clock assumption.
pub const MAX_CLOCK_OFFSET_ALLOWANCE_MS: u64 = 60_000;
/// Latest leader time stamp apply accepts, in ms since the Unix epoch
/// (2^48 ms: past the year 10000). Entries stamped later are refused, so
/// the machine's clock stays far from `u64` overflow when a TTL, wait, hold
/// or retention (all bounded by [`Limits::validate`]) is added to it.
pub const MAX_CLOCK_MS: u64 = 1 << 48;
/// Largest time or duration a snapshot or migration export may carry in
/// any `_ms` field; decoding refuses larger ones. Every stored time is the
/// clock plus at most a few bounded limits, far below this; and a sum of
/// such values cannot overflow `u64`.
pub const MAX_STORED_MS: u64 = 1 << 50;
/// Largest export one migration may carry. It travels as one Raft entry on
/// both shards and one gRPC message, so it stays well under the transport's
/// message limit; an operator moves fewer slots at a time instead.
pub const MAX_MIGRATION_DATA_BYTES: usize = 2 << 20;
/// Exports a shard keeps at once (each until its target confirmed).
pub const MAX_PENDING_EXPORTS: usize = 4;
/// Largest value a holder may publish with its lease (an acquire's
/// `value`, or a `Proclaim`): an address or a small descriptor, not data.
pub const MAX_HOLDER_VALUE_BYTES: usize = 4096;
/// Value bytes one shard keeps across all its holders and waiters; beyond
/// it, acquires and proclaims that carry a value are refused
/// (`ValuesFull`) while those without go on. Bounds what values add to a
/// shard's memory and snapshot whatever the record limits allow.
pub const MAX_VALUE_BYTES_PER_SHARD: u64 = 64 << 20;
/// Most holders one resource has at once: a semaphore's permit count is at
/// most this, and a shared acquire beyond it waits like any other. Bounds
/// the work of one grant, release or expiry on a resource.
pub const MAX_HOLDERS_PER_RESOURCE: u32 = 1_024;

/// Per-shard limits. Identical on every replica of a shard (they are part of
/// the snapshot); validated by [`Limits::validate`] before use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Shortest lease a caller may ask for.
    pub min_lease_ttl_ms: u64,
    /// Longest lease a caller may ask for (per grant or renewal).
    pub max_lease_ttl_ms: u64,
    /// Longest a caller may wait in a queue for one acquire.
    pub max_wait_timeout_ms: u64,
    /// Longest one lease may be held in total, renewals included: renewals
    /// cannot keep a lock forever.
    pub max_hold_ms: u64,
    /// Waiters queued on one resource.
    pub max_waiters_per_resource: u32,
    /// Waiters queued by one tenant across the shard.
    pub max_waiters_per_tenant: u32,
    /// Locks held by one tenant across the shard (a per-shard quota: the
    /// state machine only sees its own shard, which keeps the check
    /// deterministic on every replica).
    pub max_held_per_tenant: u32,
    /// How long a finished acquire's outcome is kept for retries by
    /// `requestId`, counted from when the lease or wait ended. While the
    /// lease or wait lives its entry is always kept, so this never lets one
    /// request id hold two live leases: a retry arriving later than this
    /// after the end is a new acquire. The default (1 minute) is six times
    /// the client's default call timeout; the memory it costs is up to about
    /// 255 bytes per acquire in the window (see `docs/operations.md`).
    pub dedup_retention_ms: u64,
    /// Dedup entries kept by one shard; beyond it new acquires are refused.
    pub max_dedup_entries: u32,
    /// Resource records (held or with waiters) kept by one shard.
    pub max_records: u32,
    /// Leases, waiters and dedup entries a single `Tick` may retire; the rest
    /// wait for the next tick so one command's work stays bounded.
    pub max_retired_per_tick: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            min_lease_ttl_ms: 1_000,
            max_lease_ttl_ms: 600_000,
            max_wait_timeout_ms: 300_000,
            max_hold_ms: 24 * 3_600_000,
            max_waiters_per_resource: 1_024,
            max_waiters_per_tenant: 10_000,
            max_held_per_tenant: 100_000,
            dedup_retention_ms: 60_000,
            max_dedup_entries: 1_000_000,
            max_records: 1_000_000,
            max_retired_per_tick: 4_096,
        }
    }
}

/// A limit that does not make sense, named by its field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidLimits {
    pub field: &'static str,
    pub reason: &'static str,
}

impl std::fmt::Display for InvalidLimits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "invalid limit `{}`: {}", self.field, self.reason)
    }
}

impl std::error::Error for InvalidLimits {}

impl Limits {
    /// Checks that the limits are coherent. Called by the state machine
    /// constructor and on snapshot restore.
    pub fn validate(&self) -> Result<(), InvalidLimits> {
        let bad = |field, reason| Err(InvalidLimits { field, reason });
        if self.min_lease_ttl_ms == 0 {
            return bad("min_lease_ttl_ms", "must be at least 1");
        }
        if self.max_lease_ttl_ms < self.min_lease_ttl_ms {
            return bad("max_lease_ttl_ms", "must be >= min_lease_ttl_ms");
        }
        // Keeps `now + ttl` far from u64 overflow for any plausible clock.
        if self.max_lease_ttl_ms > 7 * 24 * 3_600_000 {
            return bad("max_lease_ttl_ms", "must be at most 7 days");
        }
        if self.max_wait_timeout_ms > 24 * 3_600_000 {
            return bad("max_wait_timeout_ms", "must be at most 1 day");
        }
        if self.max_hold_ms < self.max_lease_ttl_ms {
            return bad("max_hold_ms", "must be >= max_lease_ttl_ms");
        }
        if self.max_hold_ms > 30 * 24 * 3_600_000 {
            return bad("max_hold_ms", "must be at most 30 days");
        }
        if self.max_waiters_per_resource == 0 {
            return bad("max_waiters_per_resource", "must be at least 1");
        }
        if self.max_waiters_per_tenant == 0 {
            return bad("max_waiters_per_tenant", "must be at least 1");
        }
        if self.max_held_per_tenant == 0 {
            return bad("max_held_per_tenant", "must be at least 1");
        }
        if self.dedup_retention_ms > 24 * 3_600_000 {
            return bad("dedup_retention_ms", "must be at most 1 day");
        }
        if self.max_dedup_entries == 0 {
            return bad("max_dedup_entries", "must be at least 1");
        }
        if self.max_records == 0 {
            return bad("max_records", "must be at least 1");
        }
        if self.max_retired_per_tick == 0 {
            return bad("max_retired_per_tick", "must be at least 1");
        }
        Ok(())
    }
}
