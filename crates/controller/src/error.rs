//! The controller's one error type. It never carries a gRPC status: the
//! server's edge turns it into one ([`ControllerError::to_detail`] is the
//! machine-readable part), and the node calls below arrive here already
//! decoded (see [`crate::nodes::NodeApi`]).

use std::time::Duration;

use fencelock_api::refusal::placement_reason;
use fencelock_api::v1::{ErrorDetail, Reason, RetryPolicy};
use fencelock_placement::PlacementError;

/// How long a client waits before retrying an action that found no leader,
/// a step that ran out of time or an internal failure: the same 100 ms the
/// server's own LEADER_UNKNOWN and INTERNAL answers advise.
pub const CONTROLLER_RETRY_AFTER_MS: u64 = 100;

/// Why an operator action or a migration step did not complete.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ControllerError {
    /// The placement map refuses the action or its arguments; nothing
    /// changed.
    #[error("placement refused: {0}")]
    Placement(#[from] PlacementError),
    /// An argument is out of range; nothing changed.
    #[error("invalid `{field}`: {reason}")]
    InvalidArgument { field: &'static str, reason: String },
    /// A step waited its whole time for the cluster (a leader, a catch-up,
    /// a leadership transfer); what was done before it stays done.
    #[error("{what} did not complete within {within:?}")]
    StepTimedOut { what: String, within: Duration },
    /// No node serves as the shard's leader.
    #[error("shard {shard_id} has no known leader")]
    LeaderUnknown { shard_id: u64 },
    /// A typed answer in its wire form: a node's refusal passed on as it
    /// said it (NOT_LEADER with its hint, EPOCH_NOT_MATCH, ...) or a
    /// migration's verdict. (Boxed: the detail is large, the error is
    /// returned often.)
    #[error("{}", .0.message)]
    Detailed(Box<ErrorDetail>),
    /// A call to a node broke off without an answer (connection refused or
    /// dropped, deadline). `retriable` when the transport says trying again
    /// may reach it (unavailable, deadline exceeded, cancelled).
    #[error("node {node_id} did not answer: {message}")]
    Unanswered {
        node_id: u64,
        message: String,
        retriable: bool,
    },
    /// A placement command of a newer format than a member reads: nothing
    /// was proposed ([`crate::formats`]).
    #[error(
        "{command} needs placement format {needs}, and node {node_id} reads format {reads} \
         (an older build, or max_placement_format = {reads}): upgrade node {node_id} \
         (or remove its max_placement_format) first; nothing changed"
    )]
    FormatNotRead {
        node_id: u64,
        reads: u32,
        needs: u32,
        command: &'static str,
    },
    /// A bug or a corrupt answer: something that should not happen did.
    #[error("internal error: {0}")]
    Internal(String),
}

/// A controller result.
pub type Result<T, E = ControllerError> = std::result::Result<T, E>;

impl ControllerError {
    /// The wire reason of this error.
    pub fn reason(&self) -> Reason {
        match self {
            ControllerError::Placement(e) => placement_reason(e),
            ControllerError::InvalidArgument { .. } => Reason::InvalidAdminRequest,
            // The routing is moving under the action: the same reason a
            // routed request gets between a migration's steps.
            ControllerError::StepTimedOut { .. } => Reason::EpochNotMatch,
            ControllerError::LeaderUnknown { .. } => Reason::LeaderUnknown,
            ControllerError::Detailed(d) => d.reason(),
            ControllerError::Unanswered { .. } => Reason::OutcomeUnknown,
            ControllerError::Internal(_) => Reason::Internal,
            // The map cannot take the command now, as for a refused
            // placement change.
            ControllerError::FormatNotRead { .. } => Reason::PlacementConflict,
        }
    }

    /// The machine-readable error: reason, retry advice and the fields
    /// that apply.
    pub fn to_detail(&self) -> ErrorDetail {
        let base = ErrorDetail::new(self.reason(), self.to_string());
        match self {
            ControllerError::Detailed(d) => (**d).clone(),
            ControllerError::InvalidArgument { field, .. } => ErrorDetail {
                field: (*field).to_owned(),
                ..base
            },
            ControllerError::StepTimedOut { .. } => ErrorDetail {
                retry: RetryPolicy::Backoff as i32,
                retry_after_ms: CONTROLLER_RETRY_AFTER_MS,
                ..base
            },
            ControllerError::LeaderUnknown { shard_id } => ErrorDetail {
                shard_id: *shard_id,
                retry_after_ms: CONTROLLER_RETRY_AFTER_MS,
                ..base
            },
            ControllerError::Internal(_) => ErrorDetail {
                retry_after_ms: CONTROLLER_RETRY_AFTER_MS,
                ..base
            },
            ControllerError::Placement(_)
            | ControllerError::Unanswered { .. }
            | ControllerError::FormatNotRead { .. } => base,
        }
    }

    /// The detail a node's typed answer carried, if this is one.
    pub fn detail(&self) -> Option<&ErrorDetail> {
        match self {
            ControllerError::Detailed(d) => Some(d),
            _ => None,
        }
    }

    /// Whether the step that failed may simply be tried again: leadership
    /// moving, a node restarting, a queue full, a shard not started yet.
    pub fn is_retriable(&self) -> bool {
        match self {
            ControllerError::Unanswered { retriable, .. } => *retriable,
            // By reason, whoever said it: a node's LEADER_UNKNOWN and the
            // controller's own are the same answer.
            typed => {
                matches!(
                    typed.reason(),
                    Reason::NotLeader
                        | Reason::LeaderUnknown
                        | Reason::LeaderNotReady
                        | Reason::NoQuorum
                        | Reason::ServerBusy
                        | Reason::ShuttingDown
                        | Reason::ShardNotFound
                ) && !matches!(typed, ControllerError::Placement(_))
            }
        }
    }

    /// This error as a node's typed answer would say it, with an unanswered
    /// call read as what it is for a write: its outcome is unknown (the
    /// node may have applied it before the connection broke). `context`
    /// says what was asked.
    pub fn or_outcome_unknown(self, shard_id: u64, context: &str) -> ControllerError {
        match self {
            ControllerError::Unanswered { message, .. } => ErrorDetail {
                shard_id,
                ..ErrorDetail::new(
                    Reason::OutcomeUnknown,
                    format!("{context} (the call broke off without an answer: {message})"),
                )
            }
            .into(),
            other => other,
        }
    }
}

impl From<ErrorDetail> for ControllerError {
    fn from(detail: ErrorDetail) -> ControllerError {
        ControllerError::Detailed(Box::new(detail))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nodes_typed_answer_passes_through_unchanged() {
        let detail = ErrorDetail {
            shard_id: 3,
            ..ErrorDetail::new(Reason::NotLeader, "not me")
        };
        let e = ControllerError::from(detail.clone());
        assert_eq!(e.to_detail(), detail);
        assert!(e.is_retriable());
    }

    #[test]
    fn an_unanswered_write_becomes_outcome_unknown_and_a_refusal_stays() {
        let broke = ControllerError::Unanswered {
            node_id: 2,
            message: "connection refused".into(),
            retriable: true,
        };
        assert!(broke.is_retriable());
        let unknown = broke.or_outcome_unknown(7, "moving a replica");
        assert_eq!(unknown.reason(), Reason::OutcomeUnknown);
        assert_eq!(unknown.to_detail().shard_id, 7);
        assert!(unknown.to_string().starts_with("moving a replica"));
        assert!(!unknown.is_retriable());
        let refused = ControllerError::Placement(PlacementError::UnknownShard { shard_id: 9 });
        assert_eq!(
            refused.clone().or_outcome_unknown(9, "x"),
            refused,
            "a typed refusal is kept"
        );
        assert_eq!(refused.reason(), Reason::ShardNotFound);
    }

    #[test]
    fn retrying_depends_on_the_reason_not_on_who_said_it() {
        let node_said = ControllerError::from(ErrorDetail::new(Reason::LeaderUnknown, "election"));
        let we_found = ControllerError::LeaderUnknown { shard_id: 2 };
        assert!(node_said.is_retriable());
        assert!(we_found.is_retriable());
        assert_eq!(
            we_found.to_detail().retry_after_ms,
            CONTROLLER_RETRY_AFTER_MS
        );
        // The map naming no such shard is final; a node not having started
        // its replica yet is not.
        let no_shard = ControllerError::Placement(PlacementError::UnknownShard { shard_id: 9 });
        assert!(!no_shard.is_retriable());
        let not_started = ControllerError::from(ErrorDetail::new(Reason::ShardNotFound, "later"));
        assert!(not_started.is_retriable());
    }

    #[test]
    fn a_timed_out_step_says_back_off_and_retry() {
        let e = ControllerError::StepTimedOut {
            what: "finding the leader of shard 4".into(),
            within: Duration::from_secs(30),
        };
        let d = e.to_detail();
        assert_eq!(d.retry, RetryPolicy::Backoff as i32);
        assert!(d.message.contains("finding the leader of shard 4"));
    }
}
