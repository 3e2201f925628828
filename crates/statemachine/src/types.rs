//! The vocabulary of the state machine: ids, commands, the apply context,
//! replies and events.

use crate::error::LockError;
use crate::limits::{
    LEASE_ID_LEN, MAX_HOLDERS_PER_RESOURCE, MAX_HOLDER_VALUE_BYTES, MAX_OWNER_LEN,
    MAX_REQUEST_ID_LEN,
};
use crate::name::ResourceName;
use crate::slots::SlotSet;
use crate::token::FencingToken;

/// The id of one holding: 128 random bits chosen by the proposer (the shard
/// leader), never derived inside apply, so it cannot be guessed from the log
/// position or the resource.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LeaseId(pub [u8; LEASE_ID_LEN]);

impl LeaseId {
    /// Parses a lease id from wire bytes; `None` unless exactly 16 bytes.
    pub fn from_slice(bytes: &[u8]) -> Option<LeaseId> {
        Some(LeaseId(bytes.try_into().ok()?))
    }
}

impl std::fmt::Debug for LeaseId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LeaseId({self})")
    }
}

impl std::fmt::Display for LeaseId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

/// A caller's id for one logical acquire, stable across its retries.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RequestId(Vec<u8>);

impl RequestId {
    /// Validates the length (1..=MAX_REQUEST_ID_LEN bytes).
    pub fn new(bytes: impl Into<Vec<u8>>) -> Result<RequestId, LockError> {
        let bytes = bytes.into();
        if bytes.is_empty() || bytes.len() > MAX_REQUEST_ID_LEN {
            return Err(LockError::InvalidRequestId {
                len: bytes.len(),
                max: MAX_REQUEST_ID_LEN,
            });
        }
        Ok(RequestId(bytes))
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl std::fmt::Debug for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match std::str::from_utf8(&self.0) {
            Ok(s) => write!(f, "RequestId({s:?})"),
            Err(_) => write!(f, "RequestId({:?})", self.0),
        }
    }
}

/// The identity that acquired a lease: the caller's SPIFFE-style URI taken
/// from its TLS client certificate by the server (`spiffe://fencelock/tenant/
/// acme/worker-1`), or the anonymous owner (empty) when the server runs
/// without TLS. Only the owner of a lease may renew or release it, and
/// request ids are deduplicated per owner.
#[derive(Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Owner(String);

impl Owner {
    /// The owner of every lease on a server without TLS (dev mode).
    pub const fn anonymous() -> Owner {
        Owner(String::new())
    }

    /// Validates the length (at most MAX_OWNER_LEN bytes) and the bytes
    /// (printable ASCII, no spaces): an owner is an identifier, not text.
    pub fn new(identity: impl Into<String>) -> Result<Owner, LockError> {
        let identity = identity.into();
        if identity.len() > MAX_OWNER_LEN || !identity.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(LockError::InvalidOwner {
                len: identity.len(),
                max: MAX_OWNER_LEN,
            });
        }
        Ok(Owner(identity))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn is_anonymous(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::fmt::Debug for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_anonymous() {
            write!(f, "Owner(anonymous)")
        } else {
            write!(f, "Owner({:?})", self.0)
        }
    }
}

/// What a holder publishes with its lease: "who leads, and at what
/// address" for an election, any small descriptor for a lock. Opaque
/// bytes, at most [`MAX_HOLDER_VALUE_BYTES`]; empty means none (and is
/// what every lease acquired without one has).
#[derive(Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HolderValue(Vec<u8>);

impl HolderValue {
    /// No value.
    pub const fn none() -> HolderValue {
        HolderValue(Vec::new())
    }

    /// Validates the length (at most [`MAX_HOLDER_VALUE_BYTES`]).
    pub fn new(bytes: impl Into<Vec<u8>>) -> Result<HolderValue, LockError> {
        let bytes = bytes.into();
        if bytes.len() > MAX_HOLDER_VALUE_BYTES {
            return Err(LockError::ValueTooLarge {
                len: bytes.len(),
                max: MAX_HOLDER_VALUE_BYTES,
            });
        }
        Ok(HolderValue(bytes))
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Length in bytes (what the shard's value budget counts).
    pub fn len(&self) -> usize {
        self.0.len()
    }
}

impl std::fmt::Debug for HolderValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match std::str::from_utf8(&self.0) {
            Ok(s) => write!(f, "HolderValue({s:?})"),
            Err(_) => write!(f, "HolderValue({} bytes)", self.0.len()),
        }
    }
}

/// How an acquire wants to hold its resource.
///
/// A resource is either a **lock** (acquired `Exclusive` or `Shared`) or a
/// **semaphore** of `permits` holders, decided by the acquire that finds it
/// free of holders and waiters and fixed until it is free again; an acquire
/// of the other kind (or another permit count) is refused with
/// `ModeMismatch`. Grants follow the queue in order (FIFO across modes): an
/// acquire is granted at once only if nobody waits and it fits beside the
/// holders; otherwise it waits, and when holders leave, waiters are
/// granted from the head for as long as each fits. So a waiting exclusive
/// acquire is never overtaken by shared ones that came after it.
///
/// What fits: `Exclusive` beside nobody; `Shared` beside shared holders
/// only (at most `MAX_HOLDERS_PER_RESOURCE`); a semaphore's acquire while
/// fewer than `permits` hold it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AcquireMode {
    /// The only holder (the lock of every release before modes).
    #[default]
    Exclusive,
    /// One of any number of readers, none beside an exclusive holder.
    Shared,
    /// One of at most `permits` holders (`1..=MAX_HOLDERS_PER_RESOURCE`).
    Semaphore { permits: u32 },
}

impl AcquireMode {
    /// A semaphore's permit count; 0 for a lock (exclusive or shared).
    pub fn permits(&self) -> u32 {
        match *self {
            AcquireMode::Semaphore { permits } => permits,
            AcquireMode::Exclusive | AcquireMode::Shared => 0,
        }
    }

    /// Refuses a permit count out of range.
    pub fn validate(&self) -> Result<(), LockError> {
        let permits = self.permits();
        if matches!(self, AcquireMode::Semaphore { .. })
            && !(1..=MAX_HOLDERS_PER_RESOURCE).contains(&permits)
        {
            return Err(LockError::InvalidPermits {
                permits,
                max: MAX_HOLDERS_PER_RESOURCE,
            });
        }
        Ok(())
    }

    /// Whether a resource used in `self`'s kind may be acquired in
    /// `other`'s: both locks, or both semaphores of one permit count.
    pub fn same_kind(&self, other: &AcquireMode) -> bool {
        self.permits() == other.permits()
    }

    /// Whether an acquire in this mode fits beside `holders` (the modes of
    /// the resource's current holders, all of this mode's kind).
    pub fn fits_beside(&self, mut holders: impl Iterator<Item = AcquireMode>) -> bool {
        match *self {
            AcquireMode::Exclusive => holders.next().is_none(),
            AcquireMode::Shared => {
                let mut count = 0u32;
                for mode in holders {
                    if mode != AcquireMode::Shared {
                        return false;
                    }
                    count += 1;
                }
                count < MAX_HOLDERS_PER_RESOURCE
            }
            AcquireMode::Semaphore { permits } => holders.count() < permits as usize,
        }
    }
}

/// Everything apply needs to know about the log entry a command came in.
/// Identical on every replica for the same entry: that is what keeps apply
/// deterministic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ApplyContext {
    /// Raft log index of the entry. Never decreases from one apply to the
    /// next; commands coalesced into one entry share it.
    pub index: u64,
    /// Raft term of the entry.
    pub term: u64,
    /// The shard's epoch at this log position (1..=MAX_EPOCH). Changes only
    /// through log entries, so every replica sees the same value here.
    pub epoch: u64,
    /// Wall-clock time stamped into the entry by the leader that proposed
    /// it, in ms since the Unix epoch. The machine uses the highest stamp seen
    /// so far, so its notion of time never goes back.
    pub now_ms: u64,
}

/// One state-changing request, as it travels in a Raft entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// Take the lock, or queue for it for up to `wait_timeout_ms`.
    Acquire {
        resource: ResourceName,
        /// Who asks; the lease belongs to this identity.
        owner: Owner,
        request_id: RequestId,
        lease_id: LeaseId,
        lease_ttl_ms: u64,
        wait_timeout_ms: u64,
        /// Published while the lease is held (empty: none). A waiter
        /// keeps it until its grant.
        value: HolderValue,
        /// Exclusive, shared or a semaphore's permit ([`AcquireMode`]).
        mode: AcquireMode,
    },
    /// Replace the value a held lease publishes (an election's Proclaim).
    /// Only the lease's owner may, and only while the lease holds the
    /// resource; the token does not change.
    Proclaim {
        resource: ResourceName,
        owner: Owner,
        lease_id: LeaseId,
        value: HolderValue,
    },
    /// Extend a held lease to `now + lease_ttl_ms` (never shortening it).
    Renew {
        resource: ResourceName,
        /// Who asks: must be the lease's owner.
        owner: Owner,
        lease_id: LeaseId,
        lease_ttl_ms: u64,
    },
    /// Renew many leases of one caller in one entry; each gets its own
    /// result.
    RenewBatch { owner: Owner, items: Vec<RenewItem> },
    /// End a holding (or a wait). Idempotent. Only the owner may.
    Release {
        resource: ResourceName,
        owner: Owner,
        lease_id: LeaseId,
    },
    /// The caller of a waiting acquire went away: drop its wait, or, if it
    /// was granted meanwhile without the caller learning of it, release.
    /// Proposed by the server only (the store, for a waiting call whose
    /// caller disconnected), never built from a client request: it carries
    /// no owner and skips the owner check that `Release` makes.
    Cancel {
        resource: ResourceName,
        lease_id: LeaseId,
        /// The attempt whose caller went away ([`AcquireReply::attempt`]).
        /// Ignored if a later attempt attached since: that retry may have
        /// been told it holds the lease.
        attempt: u32,
    },
    /// Time moved on (the entry's `now_ms`): expire due leases, time out due
    /// waiters, forget old dedup entries. Bounded work per tick.
    Tick,
    /// The first entry a new leader commits in its term. Until it is
    /// applied, commands of that term are refused. Extends every live lease
    /// so that no lock is freed earlier than the old leader could have freed
    /// it, allowing `clock_offset_allowance_ms` for the new leader's clock
    /// being ahead; the extension is bounded per lease (see `apply`).
    LeaderChanged { clock_offset_allowance_ms: u64 },
    /// Resharding, step 1 on the source shard: stop serving `slots` and take
    /// their whole lock state (holders, waiters, dedup entries) out of the
    /// table into an export kept in the replicated state under
    /// `migration_id`, so any later leader can hand it over again.
    /// Repeating it for the same id answers with the same export.
    ExportSlots { migration_id: u64, slots: SlotSet },
    /// Resharding, step 2 on the target shard: take over `slots` with the
    /// state exported by the source, and move to `epoch` — a new epoch from
    /// the placement controller's counter, above every epoch any shard ever
    /// had — so every token minted here from now on is above every token
    /// the source minted. Held leases keep their lease ids and tokens.
    /// With `export_clock_ms` (the source's lease clock when it answered
    /// the export, [`Reply::Exported`]), every time in the export moves
    /// from the source's lease clock to this shard's: what was left of a
    /// lease at the export is left of it here from this entry on, whatever
    /// the two clocks read. Without it (an orchestrator or member of the
    /// previous release), times are taken as they are, which assumes the
    /// clocks agree to within the allowance. Imported leases get the same
    /// clock allowance as at a leader change either way. Repeating it for
    /// an already imported id changes nothing.
    ImportSlots {
        migration_id: u64,
        epoch: u64,
        slots: SlotSet,
        data: Vec<u8>,
        clock_offset_allowance_ms: u64,
        export_clock_ms: Option<u64>,
    },
    /// Resharding, step 3 on the source shard: the target has the state;
    /// forget the export. The migration is then settled here: no export or
    /// import of it (or of an older one) applies any more.
    DropExport { migration_id: u64 },
    /// Resharding, resolving a step whose outcome is unknown or refused:
    /// from this entry on, no `ExportSlots` or `ImportSlots` of
    /// `migration_id` (or of any lower id) changes this shard any more —
    /// except the source taking back its own kept export — and the reply
    /// says what the shard did for the migration before it (a pending
    /// export, whether it serves `slots`). A delayed or repeated proposal
    /// of a step can therefore never apply after the orchestrator decided
    /// from this answer.
    CloseMigration { migration_id: u64, slots: SlotSet },
}

/// One lease in a batch renew.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RenewItem {
    pub resource: ResourceName,
    pub lease_id: LeaseId,
    pub lease_ttl_ms: u64,
}

/// How a granted lease ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseEnd {
    Released,
    Expired,
    Cancelled,
}

/// How a wait ended without a grant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitEnd {
    TimedOut,
    Cancelled,
    /// The waiter's turn came but the shard could not mint a token.
    TokenSpaceExhausted,
}

/// Where one acquire stands (also what a retry by `requestId` reports).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AcquireStatus {
    /// Granted and still held.
    Held {
        token: FencingToken,
        expires_at_ms: u64,
        lease_ttl_ms: u64,
    },
    /// Granted, and the holding has ended since.
    Ended {
        token: FencingToken,
        ended: LeaseEnd,
    },
    /// Queued; `position` 1 is next in line.
    Queued {
        position: u32,
        wait_deadline_ms: u64,
    },
    /// The wait ended without a grant.
    WaitEnded(WaitEnd),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AcquireReply {
    pub lease_id: LeaseId,
    /// True when this answers a retry of an earlier acquire with the same
    /// `requestId` (the lease id is then the original one).
    pub deduplicated: bool,
    pub status: AcquireStatus,
    /// Which attempt of the acquire this answers: 1 for the original, more
    /// for retries by request id that attached to a waiting or held lease;
    /// 0 for a retry of an acquire that is over. The server names it in the
    /// `Cancel` it proposes if this caller goes away while waiting.
    pub attempt: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Renewed {
    pub expires_at_ms: u64,
    pub lease_ttl_ms: u64,
}

/// What the retire work of one `Tick` did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TickReport {
    pub leases_expired: u32,
    pub waiters_timed_out: u32,
    pub dedup_forgotten: u32,
    /// True when the per-tick limit stopped the work: tick again soon.
    pub more_due: bool,
}

/// The direct answer to a command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    Acquire(AcquireReply),
    Renewed(Renewed),
    RenewedBatch(Vec<Result<Renewed, LockError>>),
    Released {
        released: bool,
    },
    /// The holder's value was replaced; the lease's token, for the caller
    /// to check it still speaks for the grant it thinks.
    Proclaimed {
        token: FencingToken,
    },
    Cancelled {
        removed: bool,
    },
    LeaderChanged {
        leases_extended: u32,
    },
    Ticked(TickReport),
    /// The export of a migration: opaque bytes for `ImportSlots`, and the
    /// source's lease clock when this answer was applied (for
    /// `ImportSlots::export_clock_ms`; any reading taken after the export
    /// itself will do, since the source never serves the slots again).
    Exported {
        data: Vec<u8>,
        resources: u32,
        clock_ms: u64,
    },
    /// Slots taken over (`resources` moved in; 0 when repeated).
    Imported {
        resources: u32,
    },
    ExportDropped {
        existed: bool,
    },
    /// What the shard did for a migration, final from this entry on
    /// (`CloseMigration`).
    MigrationClosed {
        /// The slots of the migration's export this shard still keeps
        /// (it exported them and nobody dropped the export).
        pending_export: Option<SlotSet>,
        /// Whether the shard serves every slot the command named.
        owns_slots: bool,
        /// The shard's epoch.
        epoch: u64,
        /// The shard had already settled, or still keeps the export of, a
        /// later migration: this one has ended (only one runs at a time),
        /// whatever a stale map says.
        later_migration: bool,
    },
}

/// Something that happened to a lease or waiter as a side effect of a
/// command: the server uses these to answer waiting RPCs and to audit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    Granted {
        resource: ResourceName,
        lease_id: LeaseId,
        request_id: RequestId,
        token: FencingToken,
        expires_at_ms: u64,
        lease_ttl_ms: u64,
        /// True when the grant was a hand-off to a queued waiter.
        from_queue: bool,
    },
    LeaseEnded {
        resource: ResourceName,
        lease_id: LeaseId,
        token: FencingToken,
        ended: LeaseEnd,
    },
    WaitEnded {
        resource: ResourceName,
        lease_id: LeaseId,
        request_id: RequestId,
        ended: WaitEnd,
    },
    /// A holder replaced its value (`Proclaim`).
    ValueChanged {
        resource: ResourceName,
        lease_id: LeaseId,
        token: FencingToken,
    },
    /// A waiter's resource moved to another shard with `ExportSlots`: the
    /// wait continues there (a retry by `requestId` finds it).
    WaitMoved {
        resource: ResourceName,
        lease_id: LeaseId,
    },
}

/// The result of applying one command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub reply: Result<Reply, LockError>,
    pub events: Vec<Event>,
}

/// A read of one resource's lock state (for `Get`). The top-level fields
/// describe the oldest holding (the only one of an exclusive lock), so a
/// reader that knows nothing of modes reads what it always did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockView {
    pub lease_id: LeaseId,
    pub token: FencingToken,
    pub expires_at_ms: u64,
    pub granted_at_ms: u64,
    pub queue_len: u32,
    /// What the holder publishes (empty: none).
    pub value: HolderValue,
    /// The mode of the oldest holding; every holding's mode is of its kind.
    pub mode: AcquireMode,
    /// The highest token granted since the resource was last free (what
    /// `Get` reports as the last token): the holding granted last may have
    /// ended before older ones. For an exclusive lock, the holder's.
    pub last_token: FencingToken,
    /// Every holding, oldest grant first (tokens rising); the first is the
    /// one the fields above describe. One entry for an exclusive lock.
    pub holders: Vec<HolderView>,
}

/// One holding of a resource, in a [`LockView`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HolderView {
    pub lease_id: LeaseId,
    pub token: FencingToken,
    pub expires_at_ms: u64,
    pub granted_at_ms: u64,
    pub value: HolderValue,
    pub mode: AcquireMode,
}
