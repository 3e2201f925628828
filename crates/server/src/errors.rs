//! The server's error type and its mapping onto the wire error model.
//!
//! Every failure a request can meet is a [`ServerError`]. The gRPC layer
//! turns it into a [`tonic::Status`] (`From<ServerError>`) carrying an
//! [`ErrorDetail`] with the reason, the retry advice and every
//! machine-readable field that applies (leader hint, shard, epoch, bounds,
//! holder expiry), so clients in any language can act on it without parsing
//! the message. A failed `RenewBatch` item carries the same detail directly
//! ([`ServerError::to_detail`]).
//!
//! The code and default retry of each reason come from
//! `fencelock_api::status`; this module only decides which reason and which
//! fields. Messages never contain lease ids.

use fencelock_api::v1::{ErrorDetail, LeaderHint, Reason, RetryPolicy};
use fencelock_statemachine::LockError;

use crate::config::ConfigError;

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

/// The leader of a shard as this node knows it (the router's).
pub use fencelock_router::LeaderInfo;

/// Why a request failed.
#[derive(Clone, Debug, thiserror::Error)]
pub enum ServerError {
    /// The state machine refused the command; nothing changed.
    #[error("{0}")]
    Lock(#[from] LockError),
    /// This node does not lead the shard; `leader` names the one that does
    /// when known.
    #[error("this node does not lead shard {shard_id}{}", leader_note(.leader))]
    NotLeader {
        shard_id: u64,
        leader: Option<LeaderInfo>,
    },
    /// The shard has no known leader (an election is running).
    #[error("shard {shard_id} has no known leader")]
    LeaderUnknown { shard_id: u64 },
    /// This node leads the shard but has not committed its leader-changed
    /// entry yet.
    #[error("the new leader of shard {shard_id} is not ready to serve yet")]
    LeaderNotReady { shard_id: u64 },
    /// The request was proposed, but whether it was committed is unknown.
    #[error("the outcome of the request on shard {shard_id} is unknown")]
    OutcomeUnknown { shard_id: u64 },
    /// The shard cannot reach a majority of its replicas.
    #[error("shard {shard_id} cannot reach a majority of its replicas")]
    NoQuorum { shard_id: u64 },
    /// The node's request queue is full.
    #[error("the node's request queue is full")]
    ServerBusy,
    /// The node is shutting down.
    #[error("the node is shutting down")]
    ShuttingDown,
    /// A request field is malformed. `field` is the request field's name
    /// (`resource`, `request_id`, `lease_id`, `lease_ttl_ms`,
    /// `wait_timeout_ms`, `items`, or an admin field); it picks the reason.
    #[error("invalid `{field}`: {reason}")]
    InvalidArgument { field: &'static str, reason: String },
    /// The acquire waited its whole wait timeout without a grant.
    #[error("the acquire was not granted within its wait timeout")]
    WaitTimedOut,
    /// The acquire's wait was cancelled before a grant.
    #[error("the acquire's wait was cancelled")]
    WaitCancelled,
    /// The store failed to read or write.
    #[error("storage error: {0}")]
    Storage(String),
    /// The node's configuration is invalid.
    #[error("configuration error: {0}")]
    Config(#[from] ConfigError),
    /// A bug: something that should not happen did.
    #[error("internal error: {0}")]
    Internal(String),
    /// This node has no replica of the shard (it moved, or the node's map
    /// is stale).
    #[error("this node has no replica of shard {shard_id}")]
    ShardNotHere { shard_id: u64 },
    /// The placement map refused an operator's change; nothing changed.
    #[error("placement refused: {0}")]
    Placement(fencelock_placement::PlacementError),
    /// A routed request still found no owner after following the map: a
    /// migration is between its steps. Retry after a short backoff.
    #[error("{0}")]
    Routing(String),
    /// The caller's identity may not do this (another tenant's resource, or
    /// a call that needs another kind of identity). The message says what
    /// the caller lacks and nothing about the resource.
    #[error("permission denied: {0}")]
    PermissionDenied(&'static str),
    /// The caller's tenant is over its request rate on this node.
    #[error("tenant is over its rate of {limit_per_sec} requests per second on this node")]
    RateLimited {
        limit_per_sec: u64,
        retry_after_ms: u64,
    },
    /// TLS material or the data directory's permissions are unusable: the
    /// node does not start.
    #[error("security: {0}")]
    Security(String),
    /// The node cannot listen on an address of its configuration (the port
    /// is taken, or the address is not this machine's): it does not start.
    #[error("cannot listen: {0}")]
    Listen(String),
}

impl From<fencelock_router::RouteError> for ServerError {
    fn from(e: fencelock_router::RouteError) -> ServerError {
        match e {
            // Answered as an election would be: retry shortly, the node
            // fetches the map on its own.
            fencelock_router::RouteError::MapUnknown => ServerError::LeaderUnknown { shard_id: 0 },
        }
    }
}

impl From<crate::store::StoreError> for ServerError {
    /// One to one: the store's variants are the server's of the same name.
    fn from(e: crate::store::StoreError) -> ServerError {
        use crate::store::StoreError as S;
        match e {
            S::Lock(e) => ServerError::Lock(e),
            S::NotLeader { shard_id, leader } => ServerError::NotLeader { shard_id, leader },
            S::LeaderUnknown { shard_id } => ServerError::LeaderUnknown { shard_id },
            S::LeaderNotReady { shard_id } => ServerError::LeaderNotReady { shard_id },
            S::OutcomeUnknown { shard_id } => ServerError::OutcomeUnknown { shard_id },
            S::NoQuorum { shard_id } => ServerError::NoQuorum { shard_id },
            S::ShuttingDown => ServerError::ShuttingDown,
            S::InvalidArgument { field, reason } => ServerError::InvalidArgument { field, reason },
            S::WaitTimedOut => ServerError::WaitTimedOut,
            S::WaitCancelled => ServerError::WaitCancelled,
            S::Storage(e) => ServerError::Storage(e),
            S::Internal(e) => ServerError::Internal(e),
            S::ShardNotHere { shard_id } => ServerError::ShardNotHere { shard_id },
            S::Placement(e) => ServerError::Placement(e),
        }
    }
}

fn leader_note(leader: &Option<LeaderInfo>) -> String {
    match leader {
        Some(l) => format!("; its leader is node {} at {}", l.node_id, l.addr),
        None => "; its leader is unknown".to_owned(),
    }
}

impl ServerError {
    /// The wire reason of this error.
    pub fn reason(&self) -> Reason {
        match self {
            ServerError::Lock(e) => lock_reason(e),
            ServerError::NotLeader { .. } => Reason::NotLeader,
            ServerError::LeaderUnknown { .. } => Reason::LeaderUnknown,
            ServerError::LeaderNotReady { .. } => Reason::LeaderNotReady,
            ServerError::OutcomeUnknown { .. } => Reason::OutcomeUnknown,
            ServerError::NoQuorum { .. } => Reason::NoQuorum,
            ServerError::ServerBusy => Reason::ServerBusy,
            ServerError::ShuttingDown => Reason::ShuttingDown,
            ServerError::InvalidArgument { field, .. } => invalid_argument_reason(field),
            ServerError::WaitTimedOut => Reason::WaitTimedOut,
            ServerError::WaitCancelled => Reason::WaitCancelled,
            ServerError::Storage(_)
            | ServerError::Config(_)
            | ServerError::Internal(_)
            | ServerError::Security(_)
            | ServerError::Listen(_) => Reason::Internal,
            ServerError::PermissionDenied(_) => Reason::PermissionDenied,
            ServerError::RateLimited { .. } => Reason::RateLimited,
            ServerError::ShardNotHere { .. } => Reason::ShardNotFound,
            ServerError::Routing(_) => Reason::EpochNotMatch,
            // One mapping for every placement refusal: the controller's.
            ServerError::Placement(e) => fencelock_controller::error::placement_reason(e),
        }
    }

    /// The machine-readable error: reason, retry advice and every field that
    /// applies. Errors that know their shard fill `shard_id`; for
    /// [`ServerError::Lock`] the caller may add it:
    /// `ErrorDetail { shard_id, ..err.to_detail() }`.
    pub fn to_detail(&self) -> ErrorDetail {
        let base = ErrorDetail::new(self.reason(), self.to_string());
        match self {
            ServerError::Lock(e) => lock_detail(e, base),
            ServerError::NotLeader { shard_id, leader } => match leader {
                Some(leader) => ErrorDetail {
                    shard_id: *shard_id,
                    leader: Some(LeaderHint {
                        node_id: leader.node_id,
                        address: leader.addr.clone(),
                    }),
                    ..base
                },
                // Without a hint, retrying at once would only ask the same
                // node again: back off until an election settles.
                None => ErrorDetail {
                    shard_id: *shard_id,
                    retry: RetryPolicy::Backoff as i32,
                    retry_after_ms: LEADER_UNKNOWN_RETRY_AFTER_MS,
                    ..base
                },
            },
            ServerError::LeaderUnknown { shard_id } => ErrorDetail {
                shard_id: *shard_id,
                retry_after_ms: LEADER_UNKNOWN_RETRY_AFTER_MS,
                ..base
            },
            ServerError::LeaderNotReady { shard_id } => ErrorDetail {
                shard_id: *shard_id,
                retry_after_ms: LEADER_NOT_READY_RETRY_AFTER_MS,
                ..base
            },
            ServerError::OutcomeUnknown { shard_id } => ErrorDetail {
                shard_id: *shard_id,
                ..base
            },
            ServerError::NoQuorum { shard_id } => ErrorDetail {
                shard_id: *shard_id,
                retry_after_ms: NO_QUORUM_RETRY_AFTER_MS,
                ..base
            },
            ServerError::ServerBusy => ErrorDetail {
                retry_after_ms: SERVER_BUSY_RETRY_AFTER_MS,
                ..base
            },
            ServerError::InvalidArgument { field, .. } => ErrorDetail {
                field: (*field).to_owned(),
                ..base
            },
            ServerError::Storage(_)
            | ServerError::Config(_)
            | ServerError::Internal(_)
            | ServerError::Listen(_) => ErrorDetail {
                retry_after_ms: INTERNAL_RETRY_AFTER_MS,
                ..base
            },
            ServerError::ShardNotHere { shard_id } => ErrorDetail {
                shard_id: *shard_id,
                ..base
            },
            ServerError::Routing(_) => ErrorDetail {
                retry: RetryPolicy::Backoff as i32,
                retry_after_ms: LEADER_UNKNOWN_RETRY_AFTER_MS,
                ..base
            },
            ServerError::Placement(_) => base,
            ServerError::RateLimited {
                limit_per_sec,
                retry_after_ms,
            } => ErrorDetail {
                max_allowed: *limit_per_sec,
                retry_after_ms: *retry_after_ms,
                ..base
            },
            ServerError::Security(_) => ErrorDetail {
                retry_after_ms: INTERNAL_RETRY_AFTER_MS,
                ..base
            },
            ServerError::ShuttingDown
            | ServerError::WaitTimedOut
            | ServerError::WaitCancelled
            | ServerError::PermissionDenied(_) => base,
        }
    }
}

impl From<ServerError> for tonic::Status {
    fn from(error: ServerError) -> tonic::Status {
        error.to_detail().to_status()
    }
}

/// The reason for a malformed field, by the field's last path segment
/// (`items[3].lease_id` reads as `lease_id`). Fields of the lock API have
/// their own reasons; any other field is an admin request's.
fn invalid_argument_reason(field: &str) -> Reason {
    let leaf = field.rsplit('.').next().unwrap_or(field);
    let leaf = leaf.split('[').next().unwrap_or(leaf);
    match leaf {
        "resource" => Reason::InvalidResource,
        "request_id" => Reason::InvalidRequestId,
        "lease_id" => Reason::InvalidLeaseId,
        "lease_ttl_ms" => Reason::TtlOutOfRange,
        "wait_timeout_ms" => Reason::WaitTimeoutOutOfRange,
        "items" => Reason::BatchTooLarge,
        _ => Reason::InvalidAdminRequest,
    }
}

fn lock_reason(error: &LockError) -> Reason {
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
    }
}

/// Fills the fields a refusal of the state machine carries into `base`
/// (which already has the reason, message and default retry).
fn lock_detail(error: &LockError, base: ErrorDetail) -> ErrorDetail {
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
        E::LeaseNotHeld
        | E::LeaseIdCollision
        | E::MigrationRefused { .. }
        | E::PermissionDenied
        | E::InvalidOwner { .. } => base,
    }
}
