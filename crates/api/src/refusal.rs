//! The pure core's refusals in the contract's words: which [`Reason`] a
//! [`LockError`] or a [`PlacementError`] is answered with, which fields of
//! [`ErrorDetail`] it fills, and the first backoff step a node suggests for
//! each transient condition.
//!
//! One copy for every layer that answers them: the store loop (its own
//! errors), the controller (placement refusals) and the server (everything
//! at the gRPC edge). The code and default retry of each reason come from
//! [`crate::status`]; this module only picks the reason and the fields.

use fencelock_placement::PlacementError;
use fencelock_statemachine::LockError;

use crate::v1::{ErrorDetail, Reason};

/// First backoff step suggested while a shard elects a leader (elections take
/// a few hundred milliseconds at the default timings).
pub const LEADER_UNKNOWN_RETRY_AFTER_MS: u64 = 100;
/// First backoff step suggested while a new leader commits its
/// leader-changed entry (one round trip).
pub const LEADER_NOT_READY_RETRY_AFTER_MS: u64 = 20;
/// First backoff step suggested when a shard has no majority.
pub const NO_QUORUM_RETRY_AFTER_MS: u64 = 200;
/// First backoff step suggested when the node's request queue is full.
pub const SERVER_BUSY_RETRY_AFTER_MS: u64 = 50;
/// First backoff step suggested when a shard waits for a new epoch.
pub const TOKEN_SPACE_RETRY_AFTER_MS: u64 = 1_000;
/// First backoff step suggested after an internal or storage error.
pub const INTERNAL_RETRY_AFTER_MS: u64 = 100;

/// The reason for a malformed field, by the field's last path segment
/// (`items[3].lease_id` reads as `lease_id`). Fields of the lock API have
/// their own reasons; any other field is an admin request's.
pub fn invalid_argument_reason(field: &str) -> Reason {
    let leaf = field.rsplit('.').next().unwrap_or(field);
    let leaf = leaf.split('[').next().unwrap_or(leaf);
    match leaf {
        "resource" => Reason::InvalidResource,
        "request_id" => Reason::InvalidRequestId,
        "lease_id" => Reason::InvalidLeaseId,
        "lease_ttl_ms" => Reason::TtlOutOfRange,
        "wait_timeout_ms" => Reason::WaitTimeoutOutOfRange,
        "items" => Reason::BatchTooLarge,
        "value" => Reason::ValueTooLarge,
        "permits" => Reason::InvalidPermits,
        _ => Reason::InvalidAdminRequest,
    }
}

/// The reason a refusal of the placement map is answered with, by whoever
/// meets it (the meta shard's apply, the controller's planning): an
/// argument that names nothing is NOT_FOUND, one that can never be valid is
/// INVALID_ADMIN_REQUEST, and one the current map refuses is a
/// PLACEMENT_CONFLICT.
pub fn placement_reason(error: &PlacementError) -> Reason {
    use PlacementError as E;
    match error {
        E::UnknownNode { .. } => Reason::NodeNotFound,
        E::UnknownShard { .. } => Reason::ShardNotFound,
        E::InvalidNodeId { .. }
        | E::InvalidAddr { .. }
        | E::InvalidSlotCount { .. }
        | E::SlotOutOfRange { .. }
        | E::SlotsNotSorted { .. }
        | E::SameShard { .. }
        | E::NotADataShard { .. }
        | E::NoReplicas
        | E::InvalidShardCount { .. }
        | E::InvalidReplicationFactor { .. } => Reason::InvalidAdminRequest,
        _ => Reason::PlacementConflict,
    }
}

/// The reason a refusal of the lock state machine is answered with.
pub fn lock_reason(error: &LockError) -> Reason {
    use LockError as E;
    match error {
        E::InvalidResource(_) => Reason::InvalidResource,
        E::InvalidRequestId { .. } => Reason::InvalidRequestId,
        E::TtlOutOfRange { .. } => Reason::TtlOutOfRange,
        E::WaitTimeoutOutOfRange { .. } => Reason::WaitTimeoutOutOfRange,
        E::BatchTooLarge { .. } => Reason::BatchTooLarge,
        E::LockHeld { .. } => Reason::LockHeld,
        E::QueueFull { .. } => Reason::QueueFull,
        E::TenantWaitersExceeded { .. } => Reason::TenantWaitersExceeded,
        E::DedupTableFull { .. } => Reason::DedupTableFull,
        E::TableFull { .. } => Reason::TableFull,
        E::RequestIdReused { .. } => Reason::RequestIdReused,
        E::LeaseNotHeld => Reason::LeaseNotHeld,
        E::LeaseIdCollision => Reason::LeaseIdCollision,
        E::HoldLimitReached { .. } => Reason::HoldLimitReached,
        E::TokenSpaceExhausted { .. } => Reason::TokenSpaceExhausted,
        E::LeaderNotReady { .. } => Reason::LeaderNotReady,
        E::StaleEpoch { .. } => Reason::EpochNotMatch,
        // Internal commands are built by the server, never by a caller: a
        // refusal is a server bug.
        E::InvalidCommand { .. } => Reason::Internal,
        // Routed by a stale map: refresh it and retry at the owner.
        E::WrongShard { .. } => Reason::EpochNotMatch,
        E::MigrationRefused { .. } => Reason::PlacementConflict,
        E::PermissionDenied => Reason::PermissionDenied,
        E::TenantQuotaExceeded { .. } => Reason::TenantQuotaExceeded,
        // The server builds owners from verified certificates.
        E::InvalidOwner { .. } => Reason::Internal,
        E::ValueTooLarge { .. } => Reason::ValueTooLarge,
        E::ValuesFull { .. } => Reason::ValuesFull,
        E::ModeMismatch { .. } => Reason::ModeMismatch,
        E::InvalidPermits { .. } => Reason::InvalidPermits,
    }
}

/// Fills the fields a refusal of the state machine carries into `base`
/// (which already has the reason, message and default retry).
pub fn lock_detail(error: &LockError, base: ErrorDetail) -> ErrorDetail {
    use LockError as E;
    let field = |name: &str| name.to_owned();
    match *error {
        E::InvalidResource(_) => ErrorDetail {
            field: field("resource"),
            ..base
        },
        E::InvalidRequestId { max, .. } => ErrorDetail {
            field: field("request_id"),
            min_allowed: 1,
            max_allowed: max as u64,
            ..base
        },
        E::TtlOutOfRange { min_ms, max_ms, .. } => ErrorDetail {
            field: field("lease_ttl_ms"),
            min_allowed: min_ms,
            max_allowed: max_ms,
            ..base
        },
        E::WaitTimeoutOutOfRange { max_ms, .. } => ErrorDetail {
            field: field("wait_timeout_ms"),
            max_allowed: max_ms,
            ..base
        },
        E::BatchTooLarge { max, .. } => ErrorDetail {
            field: field("items"),
            max_allowed: max as u64,
            ..base
        },
        E::LockHeld {
            holder_expires_at_ms,
            queue_len,
        } => ErrorDetail {
            holder_expires_at_ms,
            queue_length: queue_len,
            ..base
        },
        E::QueueFull { limit }
        | E::TenantWaitersExceeded { limit }
        | E::DedupTableFull { limit }
        | E::TableFull { limit }
        | E::TenantQuotaExceeded { limit } => ErrorDetail {
            max_allowed: u64::from(limit),
            ..base
        },
        E::RequestIdReused { .. } => ErrorDetail {
            field: field("request_id"),
            ..base
        },
        E::HoldLimitReached { max_hold_ms, .. } => ErrorDetail {
            max_allowed: max_hold_ms,
            ..base
        },
        E::TokenSpaceExhausted { epoch } => ErrorDetail {
            current_epoch: epoch,
            retry_after_ms: TOKEN_SPACE_RETRY_AFTER_MS,
            ..base
        },
        E::LeaderNotReady { .. } => ErrorDetail {
            retry_after_ms: LEADER_NOT_READY_RETRY_AFTER_MS,
            ..base
        },
        E::StaleEpoch { current_epoch, .. } => ErrorDetail {
            current_epoch,
            ..base
        },
        E::InvalidCommand { .. } => ErrorDetail {
            retry_after_ms: INTERNAL_RETRY_AFTER_MS,
            ..base
        },
        E::WrongShard { epoch, .. } => ErrorDetail {
            current_epoch: epoch,
            retry_after_ms: LEADER_UNKNOWN_RETRY_AFTER_MS,
            ..base
        },
        E::ValueTooLarge { max, .. } => ErrorDetail {
            field: field("value"),
            max_allowed: max as u64,
            ..base
        },
        E::ValuesFull { limit_bytes } => ErrorDetail {
            max_allowed: limit_bytes,
            ..base
        },
        E::ModeMismatch { permits: 0 } => ErrorDetail {
            field: field("mode"),
            ..base
        },
        // The one count this semaphore takes.
        E::ModeMismatch { permits } => ErrorDetail {
            field: field("permits"),
            min_allowed: permits.into(),
            max_allowed: permits.into(),
            ..base
        },
        E::InvalidPermits { max, .. } => ErrorDetail {
            field: field("permits"),
            min_allowed: 1,
            max_allowed: max.into(),
            ..base
        },
        E::LeaseNotHeld
        | E::LeaseIdCollision
        | E::MigrationRefused { .. }
        | E::PermissionDenied
        | E::InvalidOwner { .. } => base,
    }
}
