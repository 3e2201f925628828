//! The store loop's error type: every way a command handed to the store can
//! fail. The server maps each variant onto its own error (and from there
//! onto the wire error model) one to one.

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
    /// A bug: something that should not happen did.
    #[error("internal error: {0}")]
    Internal(String),
    /// This node has no replica of the shard.
    #[error("this node has no replica of shard {shard_id}")]
    ShardNotHere { shard_id: u64 },
    /// The placement map refused a placement command; nothing changed.
    #[error("placement refused: {0}")]
    Placement(fencelock_placement::PlacementError),
}

fn leader_note(leader: &Option<LeaderInfo>) -> String {
    match leader {
        Some(l) => format!("; its leader is node {} at {}", l.node_id, l.addr),
        None => "; its leader is unknown".to_owned(),
    }
}
