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
//! fields. The variants the server shares with the store loop's
//! `StoreError` are answered by the store's own mapping
//! (`StoreError::to_detail`), so the deterministic simulation, which runs
//! the store without this crate, sees exactly what a client would. Messages
//! never contain lease ids.

use fencelock_api::v1::{ErrorDetail, Reason, RetryPolicy};
use fencelock_statemachine::LockError;

use crate::store::StoreError;

use crate::config::ConfigError;

/// The retry advice nodes give (one copy, shared with the store's errors).
pub use fencelock_api::refusal::{
    INTERNAL_RETRY_AFTER_MS, LEADER_NOT_READY_RETRY_AFTER_MS, LEADER_UNKNOWN_RETRY_AFTER_MS,
    NO_QUORUM_RETRY_AFTER_MS, SERVER_BUSY_RETRY_AFTER_MS, TOKEN_SPACE_RETRY_AFTER_MS,
};

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
    /// The data directory's disk has less free space than
    /// `edge.min_free_disk_bytes`: new acquires are refused (as
    /// `SERVER_BUSY`) until space returns.
    #[error(
        "the leader's disk is low ({free_bytes} bytes free, below edge.min_free_disk_bytes = \
         {min_free_bytes}): new acquires are refused until space returns; renewals and \
         releases go on"
    )]
    DiskLow {
        free_bytes: u64,
        min_free_bytes: u64,
    },
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
    /// The data directory is damaged: the node must not run on it. The text
    /// names the file and the recovery.
    #[error("{0}")]
    Damaged(String),
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
    /// The request needs a placement format the cluster has not reached:
    /// a member still runs a build that cannot read it.
    #[error(
        "{feature} need cluster format {needs}, and this cluster is at {current}: a member still \
         runs an older build, is pinned by max_placement_format, or does not answer; the \
         controller raises the cluster format by itself once every member reads it"
    )]
    FeatureNotEnabled {
        feature: &'static str,
        needs: u32,
        current: u32,
    },
    /// This node serves as many watchers as it may.
    #[error("this node serves {limit} watchers already; watch on another node or later")]
    TooManyWatchers { limit: usize },
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

impl From<StoreError> for ServerError {
    /// One to one: the store's variants are the server's of the same name.
    fn from(e: StoreError) -> ServerError {
        use StoreError as S;
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
            S::Damaged(e) => ServerError::Damaged(e),
            S::Internal(e) => ServerError::Internal(e),
            S::ShardNotHere { shard_id } => ServerError::ShardNotHere { shard_id },
            S::Placement(e) => ServerError::Placement(e),
            S::TooManyWatchers { limit } => ServerError::TooManyWatchers { limit },
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
    /// The store's error of the same name, for the variants the two share
    /// (`None` for the edge's own).
    fn as_store_error(&self) -> Option<StoreError> {
        use StoreError as S;
        Some(match self {
            ServerError::Lock(e) => S::Lock(e.clone()),
            ServerError::NotLeader { shard_id, leader } => S::NotLeader {
                shard_id: *shard_id,
                leader: leader.clone(),
            },
            ServerError::LeaderUnknown { shard_id } => S::LeaderUnknown {
                shard_id: *shard_id,
            },
            ServerError::LeaderNotReady { shard_id } => S::LeaderNotReady {
                shard_id: *shard_id,
            },
            ServerError::OutcomeUnknown { shard_id } => S::OutcomeUnknown {
                shard_id: *shard_id,
            },
            ServerError::NoQuorum { shard_id } => S::NoQuorum {
                shard_id: *shard_id,
            },
            ServerError::ShuttingDown => S::ShuttingDown,
            ServerError::InvalidArgument { field, reason } => S::InvalidArgument {
                field,
                reason: reason.clone(),
            },
            ServerError::WaitTimedOut => S::WaitTimedOut,
            ServerError::WaitCancelled => S::WaitCancelled,
            ServerError::Storage(e) => S::Storage(e.clone()),
            ServerError::Damaged(e) => S::Damaged(e.clone()),
            ServerError::Internal(e) => S::Internal(e.clone()),
            ServerError::ShardNotHere { shard_id } => S::ShardNotHere {
                shard_id: *shard_id,
            },
            ServerError::Placement(e) => S::Placement(e.clone()),
            ServerError::TooManyWatchers { limit } => S::TooManyWatchers { limit: *limit },
            ServerError::ServerBusy
            | ServerError::DiskLow { .. }
            | ServerError::Config(_)
            | ServerError::Routing(_)
            | ServerError::PermissionDenied(_)
            | ServerError::RateLimited { .. }
            | ServerError::Security(_)
            | ServerError::Listen(_)
            | ServerError::FeatureNotEnabled { .. } => return None,
        })
    }

    /// The wire reason of this error.
    pub fn reason(&self) -> Reason {
        if let Some(store) = self.as_store_error() {
            return store.reason();
        }
        match self {
            ServerError::ServerBusy | ServerError::DiskLow { .. } => Reason::ServerBusy,
            ServerError::PermissionDenied(_) => Reason::PermissionDenied,
            ServerError::RateLimited { .. } => Reason::RateLimited,
            ServerError::Routing(_) => Reason::EpochNotMatch,
            ServerError::FeatureNotEnabled { .. } => Reason::FeatureNotEnabled,
            // Config, Security, Listen: the node's own trouble.
            _ => Reason::Internal,
        }
    }

    /// The machine-readable error: reason, retry advice and every field that
    /// applies. Errors that know their shard fill `shard_id`; for
    /// [`ServerError::Lock`] the caller may add it:
    /// `ErrorDetail { shard_id, ..err.to_detail() }`.
    pub fn to_detail(&self) -> ErrorDetail {
        if let Some(store) = self.as_store_error() {
            return store.to_detail();
        }
        let base = ErrorDetail::new(self.reason(), self.to_string());
        match self {
            ServerError::ServerBusy => ErrorDetail {
                retry_after_ms: SERVER_BUSY_RETRY_AFTER_MS,
                ..base
            },
            ServerError::DiskLow { .. } => ErrorDetail {
                retry_after_ms: crate::disk_space::DISK_LOW_RETRY_AFTER_MS,
                ..base
            },
            ServerError::Routing(_) => ErrorDetail {
                retry: RetryPolicy::Backoff as i32,
                retry_after_ms: LEADER_UNKNOWN_RETRY_AFTER_MS,
                ..base
            },
            ServerError::RateLimited {
                limit_per_sec,
                retry_after_ms,
            } => ErrorDetail {
                max_allowed: *limit_per_sec,
                retry_after_ms: *retry_after_ms,
                ..base
            },
            ServerError::Config(_) | ServerError::Security(_) | ServerError::Listen(_) => {
                ErrorDetail {
                    retry_after_ms: INTERNAL_RETRY_AFTER_MS,
                    ..base
                }
            }
            // PermissionDenied; the shared variants returned above.
            _ => base,
        }
    }
}

impl From<ServerError> for tonic::Status {
    fn from(error: ServerError) -> tonic::Status {
        error.to_detail().to_status()
    }
}
