//! The one error type of the state machine.
//!
//! Every refusal is a value: typed, with the numbers a caller needs to decide
//! what to do next ([`LockError::retry`]). The gRPC layer maps each variant to
//! a status code and a machine-readable reason (see `fencelock-api`).

use crate::name::NameError;

/// What a caller should do after an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retry {
    /// The request is wrong or the lease is gone; retrying it unchanged cannot
    /// succeed.
    Never,
    /// Retry now (with a fresh lease id, or after the routing layer caught up).
    Immediately,
    /// Retry after about this many milliseconds (with jitter).
    AfterMs(u64),
    /// Retry with exponential backoff and jitter.
    Backoff,
}

/// Why a command was refused. Nothing in the table changed when this is
/// returned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LockError {
    /// The resource name is not a valid normalized name.
    InvalidResource(NameError),
    /// The request id is empty or too long.
    InvalidRequestId { len: usize, max: usize },
    /// The requested lease TTL is outside the shard's range.
    TtlOutOfRange {
        ttl_ms: u64,
        min_ms: u64,
        max_ms: u64,
    },
    /// The requested wait timeout is longer than the shard allows.
    WaitTimeoutOutOfRange { wait_timeout_ms: u64, max_ms: u64 },
    /// A renew batch carries more leases than allowed.
    BatchTooLarge { len: usize, max: usize },
    /// The resource is held and the caller did not want to wait.
    LockHeld {
        holder_expires_at_ms: u64,
        queue_len: u32,
    },
    /// The resource already has the maximum number of waiters.
    QueueFull { limit: u32 },
    /// The tenant already has the maximum number of waiters in this shard.
    TenantWaitersExceeded { limit: u32 },
    /// The shard keeps as many dedup entries as it may.
    DedupTableFull { limit: u32 },
    /// The shard keeps as many resource records as it may.
    TableFull { limit: u32 },
    /// The same request id was used before with a different lease TTL: it
    /// names another logical acquire, which is a caller bug.
    RequestIdReused { original_ttl_ms: u64 },
    /// The lease id does not hold this resource (never did, released, expired,
    /// or superseded). The caller has lost the lock and must stop work.
    LeaseNotHeld,
    /// The proposer's random lease id is already in use on this resource.
    LeaseIdCollision,
    /// The lease has been held for the maximum time; it cannot be renewed.
    HoldLimitReached {
        max_hold_ms: u64,
        granted_at_ms: u64,
    },
    /// The shard's epoch has no room for more tokens; the shard needs a new
    /// epoch before it grants again.
    TokenSpaceExhausted { epoch: u64 },
    /// The entry was proposed in a term whose leader has not yet committed
    /// its `LeaderChanged` entry: the leader is not ready to grant.
    LeaderNotReady { entry_term: u64, leader_term: u64 },
    /// The entry carries an older epoch than the shard already has.
    StaleEpoch {
        entry_epoch: u64,
        current_epoch: u64,
    },
    /// A parameter of an internal command is out of range.
    InvalidCommand { reason: &'static str },
    /// This shard does not own the resource's slot (it moved away, or has
    /// not arrived yet): the request was routed by a stale map. Nothing was
    /// applied; refresh the map and retry at the owner.
    WrongShard { slot: u32, epoch: u64 },
    /// A migration cannot proceed as asked (too large, too many exports
    /// outstanding, slots not owned by this shard).
    MigrationRefused { reason: String },
    /// The lease (holding or wait) named by the lease id was acquired by
    /// another identity: only its owner may renew or release it. Says
    /// nothing else about the resource.
    PermissionDenied,
    /// The tenant already holds the maximum number of locks in this shard.
    TenantQuotaExceeded { limit: u32 },
    /// The owner identity in a command is too long or has bytes outside
    /// printable ASCII (a server bug: the server derives it from the
    /// caller's certificate).
    InvalidOwner { len: usize, max: usize },
    /// A holder value is longer than allowed.
    ValueTooLarge { len: usize, max: usize },
    /// The shard keeps as many value bytes as it may
    /// (`MAX_VALUE_BYTES_PER_SHARD`); acquires without a value go on.
    ValuesFull { limit_bytes: u64 },
    /// The resource is in use in another kind: a semaphore with another
    /// permit count, or a lock (exclusive or shared) asked for as a
    /// semaphore, or the reverse. `permits` is the count in force (0: a
    /// lock). Fixed while the resource has holders or waiters.
    ModeMismatch { permits: u32 },
    /// A semaphore's permit count is 0 or above the maximum.
    InvalidPermits { permits: u32, max: u32 },
}

impl LockError {
    /// The retry hint for this error.
    pub fn retry(&self) -> Retry {
        use LockError::*;
        match self {
            InvalidResource(_)
            | InvalidRequestId { .. }
            | TtlOutOfRange { .. }
            | WaitTimeoutOutOfRange { .. }
            | BatchTooLarge { .. }
            | RequestIdReused { .. }
            | LeaseNotHeld
            | HoldLimitReached { .. }
            | InvalidCommand { .. }
            | MigrationRefused { .. }
            | PermissionDenied
            | InvalidOwner { .. }
            | ValueTooLarge { .. }
            | ModeMismatch { .. }
            | InvalidPermits { .. } => Retry::Never,
            LockHeld { .. }
            | QueueFull { .. }
            | TenantWaitersExceeded { .. }
            | DedupTableFull { .. }
            | TableFull { .. }
            | TenantQuotaExceeded { .. }
            | ValuesFull { .. }
            | TokenSpaceExhausted { .. } => Retry::Backoff,
            LeaseIdCollision | LeaderNotReady { .. } | StaleEpoch { .. } => Retry::Immediately,
            // The map catches up within a migration step: back off, refresh.
            WrongShard { .. } => Retry::Backoff,
        }
    }

    /// A stable, machine-readable name for logs and metrics labels.
    pub fn code(&self) -> &'static str {
        use LockError::*;
        match self {
            InvalidResource(_) => "invalid_resource",
            InvalidRequestId { .. } => "invalid_request_id",
            TtlOutOfRange { .. } => "ttl_out_of_range",
            WaitTimeoutOutOfRange { .. } => "wait_timeout_out_of_range",
            BatchTooLarge { .. } => "batch_too_large",
            LockHeld { .. } => "lock_held",
            QueueFull { .. } => "queue_full",
            TenantWaitersExceeded { .. } => "tenant_waiters_exceeded",
            DedupTableFull { .. } => "dedup_table_full",
            TableFull { .. } => "table_full",
            RequestIdReused { .. } => "request_id_reused",
            LeaseNotHeld => "lease_not_held",
            LeaseIdCollision => "lease_id_collision",
            HoldLimitReached { .. } => "hold_limit_reached",
            TokenSpaceExhausted { .. } => "token_space_exhausted",
            LeaderNotReady { .. } => "leader_not_ready",
            StaleEpoch { .. } => "stale_epoch",
            InvalidCommand { .. } => "invalid_command",
            WrongShard { .. } => "wrong_shard",
            MigrationRefused { .. } => "migration_refused",
            PermissionDenied => "permission_denied",
            TenantQuotaExceeded { .. } => "tenant_quota_exceeded",
            InvalidOwner { .. } => "invalid_owner",
            ValueTooLarge { .. } => "value_too_large",
            ValuesFull { .. } => "values_full",
            ModeMismatch { .. } => "mode_mismatch",
            InvalidPermits { .. } => "invalid_permits",
        }
    }
}

impl std::fmt::Display for LockError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use LockError::*;
        match self {
            InvalidResource(e) => write!(f, "invalid resource name: {e}"),
            InvalidRequestId { len, max } => {
                write!(f, "request id must be 1..={max} bytes, got {len}")
            }
            TtlOutOfRange {
                ttl_ms,
                min_ms,
                max_ms,
            } => write!(
                f,
                "lease ttl {ttl_ms} ms is outside the allowed range {min_ms}..={max_ms} ms"
            ),
            WaitTimeoutOutOfRange {
                wait_timeout_ms,
                max_ms,
            } => write!(
                f,
                "wait timeout {wait_timeout_ms} ms is longer than the maximum {max_ms} ms"
            ),
            BatchTooLarge { len, max } => {
                write!(f, "batch of {len} items exceeds the maximum of {max}")
            }
            LockHeld {
                holder_expires_at_ms,
                queue_len,
            } => write!(
                f,
                "resource is held (lease expires at {holder_expires_at_ms} ms unless renewed; {queue_len} waiting)"
            ),
            QueueFull { limit } => write!(f, "resource already has {limit} waiters"),
            TenantWaitersExceeded { limit } => {
                write!(f, "tenant already has {limit} waiters in this shard")
            }
            DedupTableFull { limit } => write!(f, "shard keeps {limit} dedup entries already"),
            TableFull { limit } => write!(f, "shard keeps {limit} resource records already"),
            RequestIdReused { original_ttl_ms } => write!(
                f,
                "request id was already used for an acquire with lease ttl {original_ttl_ms} ms"
            ),
            LeaseNotHeld => write!(f, "lease does not hold this resource"),
            LeaseIdCollision => write!(f, "lease id already in use on this resource"),
            HoldLimitReached {
                max_hold_ms,
                granted_at_ms,
            } => write!(
                f,
                "lease granted at {granted_at_ms} ms reached the maximum hold time of {max_hold_ms} ms"
            ),
            TokenSpaceExhausted { epoch } => {
                write!(f, "epoch {epoch} has no fencing tokens left; shard needs a new epoch")
            }
            LeaderNotReady {
                entry_term,
                leader_term,
            } => write!(
                f,
                "entry from term {entry_term} applied before that term's leader-changed entry (current {leader_term})"
            ),
            StaleEpoch {
                entry_epoch,
                current_epoch,
            } => write!(
                f,
                "entry epoch {entry_epoch} is older than the shard epoch {current_epoch}"
            ),
            InvalidCommand { reason } => write!(f, "invalid command: {reason}"),
            WrongShard { slot, epoch } => write!(
                f,
                "slot {slot} is not served by this shard (epoch {epoch}); the request was routed by a stale map"
            ),
            MigrationRefused { reason } => write!(f, "migration refused: {reason}"),
            PermissionDenied => write!(f, "permission denied"),
            TenantQuotaExceeded { limit } => {
                write!(f, "tenant already holds {limit} locks in this shard")
            }
            InvalidOwner { len, max } => write!(
                f,
                "owner identity must be at most {max} bytes of printable ASCII, got {len} bytes"
            ),
            ValueTooLarge { len, max } => {
                write!(f, "holder value of {len} bytes exceeds the maximum of {max}")
            }
            ValuesFull { limit_bytes } => write!(
                f,
                "shard keeps {limit_bytes} bytes of holder values already; acquire without a value or retry later"
            ),
            ModeMismatch { permits: 0 } => write!(
                f,
                "resource is in use as a lock (exclusive or shared), not as a semaphore"
            ),
            ModeMismatch { permits } => write!(
                f,
                "resource is in use as a semaphore of {permits} permits; acquire it with that count"
            ),
            InvalidPermits { permits, max } => {
                write!(f, "a semaphore needs 1..={max} permits, got {permits}")
            }
        }
    }
}

impl std::error::Error for LockError {}
