//! The store loop's error type: every way a command handed to the store can
//! fail, and its form on the wire ([`StoreError::to_detail`]): the reason,
//! the retry advice and the machine-readable fields. The server's error
//! keeps a variant of the same name for each and answers it through this
//! mapping, so a simulated node and a real one say the same thing.

use fencelock_api::refusal::{
    invalid_argument_reason, lock_detail, lock_reason, placement_reason, INTERNAL_RETRY_AFTER_MS,
    LEADER_NOT_READY_RETRY_AFTER_MS, LEADER_UNKNOWN_RETRY_AFTER_MS, NO_QUORUM_RETRY_AFTER_MS,
    SERVER_BUSY_RETRY_AFTER_MS,
};
use fencelock_api::v1::{ErrorDetail, LeaderHint, Reason, RetryPolicy};
use fencelock_router::LeaderInfo;
use fencelock_statemachine::LockError;

/// Why a command handed to the store failed.
#[derive(Clone, Debug, thiserror::Error)]
pub enum StoreError {
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
    /// The command was proposed, but whether it was committed is unknown.
    #[error("the outcome of the request on shard {shard_id} is unknown")]
    OutcomeUnknown { shard_id: u64 },
    /// The shard cannot reach a majority of its replicas.
    #[error("shard {shard_id} cannot reach a majority of its replicas")]
    NoQuorum { shard_id: u64 },
    /// The store is shutting down.
    #[error("the node is shutting down")]
    ShuttingDown,
    /// A field of a node-local request is not acceptable here (`field` names
    /// it).
    #[error("invalid `{field}`: {reason}")]
    InvalidArgument { field: &'static str, reason: String },
    /// The acquire waited its whole wait timeout without a grant.
    #[error("the acquire was not granted within its wait timeout")]
    WaitTimedOut,
    /// The acquire's wait was cancelled before a grant.
    #[error("the acquire's wait was cancelled")]
    WaitCancelled,
    /// The engine failed to read or write.
    #[error("storage error: {0}")]
    Storage(String),
    /// The data directory is damaged (`fencelock_storage::Error::is_damage`):
    /// the node must not run on it. The text says the recovery.
    #[error("{0}")]
    Damaged(String),
    /// A bug: something that should not happen did.
    #[error("internal error: {0}")]
    Internal(String),
    /// This node has no replica of the shard.
    #[error("this node has no replica of shard {shard_id}")]
    ShardNotHere { shard_id: u64 },
    /// The placement map refused a placement command; nothing changed.
    #[error("placement refused: {0}")]
    Placement(fencelock_placement::PlacementError),
    /// This node serves as many watchers as it may.
    #[error("this node serves {limit} watchers already; watch on another node or later")]
    TooManyWatchers { limit: usize },
}

fn leader_note(leader: &Option<LeaderInfo>) -> String {
    match leader {
        Some(l) => format!("; its leader is node {} at {}", l.node_id, l.addr),
        None => "; its leader is unknown".to_owned(),
    }
}

impl StoreError {
    /// A storage error as a store error: damage keeps its own variant, so a
    /// node that finds it at start can say so (and exit as damaged).
    pub fn from_storage(e: fencelock_storage::Error) -> Self {
        if e.is_damage() {
            StoreError::Damaged(e.to_string())
        } else {
            StoreError::Storage(e.to_string())
        }
    }

    /// The wire reason of this error.
    pub fn reason(&self) -> Reason {
        match self {
            StoreError::Lock(e) => lock_reason(e),
            StoreError::NotLeader { .. } => Reason::NotLeader,
            StoreError::LeaderUnknown { .. } => Reason::LeaderUnknown,
            StoreError::LeaderNotReady { .. } => Reason::LeaderNotReady,
            StoreError::OutcomeUnknown { .. } => Reason::OutcomeUnknown,
            StoreError::NoQuorum { .. } => Reason::NoQuorum,
            StoreError::ShuttingDown => Reason::ShuttingDown,
            StoreError::InvalidArgument { field, .. } => invalid_argument_reason(field),
            StoreError::WaitTimedOut => Reason::WaitTimedOut,
            StoreError::WaitCancelled => Reason::WaitCancelled,
            StoreError::Storage(_) | StoreError::Damaged(_) | StoreError::Internal(_) => {
                Reason::Internal
            }
            StoreError::ShardNotHere { .. } => Reason::ShardNotFound,
            StoreError::Placement(e) => placement_reason(e),
            StoreError::TooManyWatchers { .. } => Reason::ServerBusy,
        }
    }

    /// The machine-readable error: reason, retry advice and every field that
    /// applies. Errors that know their shard fill `shard_id`; for
    /// [`StoreError::Lock`] the caller may add it:
    /// `ErrorDetail { shard_id, ..err.to_detail() }`.
    pub fn to_detail(&self) -> ErrorDetail {
        let base = ErrorDetail::new(self.reason(), self.to_string());
        match self {
            StoreError::Lock(e) => lock_detail(e, base),
            StoreError::NotLeader { shard_id, leader } => match leader {
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
            StoreError::LeaderUnknown { shard_id } => ErrorDetail {
                shard_id: *shard_id,
                retry_after_ms: LEADER_UNKNOWN_RETRY_AFTER_MS,
                ..base
            },
            StoreError::LeaderNotReady { shard_id } => ErrorDetail {
                shard_id: *shard_id,
                retry_after_ms: LEADER_NOT_READY_RETRY_AFTER_MS,
                ..base
            },
            StoreError::NoQuorum { shard_id } => ErrorDetail {
                shard_id: *shard_id,
                retry_after_ms: NO_QUORUM_RETRY_AFTER_MS,
                ..base
            },
            StoreError::OutcomeUnknown { shard_id } | StoreError::ShardNotHere { shard_id } => {
                ErrorDetail {
                    shard_id: *shard_id,
                    ..base
                }
            }
            StoreError::InvalidArgument { field, .. } => ErrorDetail {
                field: (*field).to_owned(),
                ..base
            },
            StoreError::Storage(_) | StoreError::Damaged(_) | StoreError::Internal(_) => {
                ErrorDetail {
                    retry_after_ms: INTERNAL_RETRY_AFTER_MS,
                    ..base
                }
            }
            StoreError::TooManyWatchers { limit } => ErrorDetail {
                max_allowed: *limit as u64,
                retry_after_ms: SERVER_BUSY_RETRY_AFTER_MS,
                ..base
            },
            StoreError::ShuttingDown
            | StoreError::WaitTimedOut
            | StoreError::WaitCancelled
            | StoreError::Placement(_) => base,
        }
    }
}
