//! [`ClientError`], the one error type of the crate, and [`LostReason`].

use fencelock_api::v1::{ErrorDetail, LeaseState, Reason};

use crate::client::RequestId;

/// Why a client call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// A [`ClientConfig`](crate::ClientConfig) field is out of range.
    #[error("invalid client configuration: {0}")]
    InvalidConfig(String),

    /// An endpoint is not a usable URI, or the list is empty or too long.
    #[error("invalid endpoint {endpoint:?}: {reason}")]
    InvalidEndpoint { endpoint: String, reason: String },

    /// An argument was refused by the client before any call (for example a
    /// wait timeout over [`MAX_WAIT_TIMEOUT_MS`](crate::MAX_WAIT_TIMEOUT_MS)).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// The server answered definitively with this error (see `reason`):
    /// retrying the same call cannot help, or the client's retry budget for
    /// it was spent on answers that were themselves definitive, such as
    /// LOCK_HELD or WAIT_TIMED_OUT.
    #[error("{0}")]
    Rejected(Box<ErrorDetail>),

    /// No definitive answer before the call's deadline: the service was
    /// unreachable, had no leader or no quorum, or every answer was an
    /// unknown outcome. A write may or may not have taken effect. For an
    /// acquire, `request_id` is the id it used: retrying with it
    /// ([`AcquireOptions::request_id`](crate::AcquireOptions)) learns the
    /// outcome without a second grant. `sent` is false when no attempt got
    /// as far as an open connection (every node refused or could not be
    /// reached at the TCP level): then nothing can have taken effect.
    #[error("no definitive answer within {timeout_ms} ms after {attempts} attempts; last error: {last_error}")]
    Unavailable {
        timeout_ms: u64,
        attempts: u32,
        last_error: String,
        request_id: Option<RequestId>,
        sent: bool,
    },

    /// An acquire retried with an explicit request id found that id's
    /// original grant, but that lease has already ended (`state`): the
    /// caller does not hold the lock. Acquire again with a new request id.
    #[error("the lease granted to this request id has ended ({state:?}, fencing token {fencing_token}); acquire again with a new request id")]
    LeaseEnded {
        state: LeaseState,
        fencing_token: i64,
    },

    /// A gRPC failure that carries no fencelock error detail and is not a
    /// transport failure (for example UNIMPLEMENTED from something that is
    /// not a fencelock node).
    #[error("gRPC error: {0}")]
    Grpc(Box<tonic::Status>),
}

impl ClientError {
    /// The server's reason, when the server refused the call.
    pub fn reason(&self) -> Option<Reason> {
        self.detail().map(ErrorDetail::reason)
    }

    /// The server's full error detail, when the server refused the call.
    pub fn detail(&self) -> Option<&ErrorDetail> {
        match self {
            ClientError::Rejected(detail) => Some(detail.as_ref()),
            _ => None,
        }
    }

    /// True when someone else holds the lock: LOCK_HELD (no wait asked) or
    /// WAIT_TIMED_OUT (waited in vain). Nothing is held.
    pub fn is_lock_held(&self) -> bool {
        matches!(self.reason(), Some(Reason::LockHeld | Reason::WaitTimedOut))
    }

    /// True when the call may or may not have taken effect.
    pub fn outcome_unknown(&self) -> bool {
        matches!(self, ClientError::Unavailable { .. })
    }

    /// The error a server's status stands for: its detail when it sent
    /// one, else the bare status (a transport failure).
    pub fn from_status(status: tonic::Status) -> ClientError {
        match ErrorDetail::from_status(&status) {
            Some(detail) => ClientError::Rejected(Box::new(detail)),
            None => ClientError::Grpc(Box::new(status)),
        }
    }

    /// True when a watch ([`Client::watch`](crate::Client::watch)) that
    /// ended with this error is resumed by watching again with the last
    /// revision received (lock.proto `Watch`): the watcher fell behind, the
    /// resource moved, the replica stopped serving it, or the connection
    /// broke.
    pub fn resumes_watch(&self) -> bool {
        match self {
            ClientError::Rejected(detail) => matches!(
                detail.reason(),
                Reason::ServerBusy | Reason::EpochNotMatch | Reason::ShuttingDown
            ),
            ClientError::Grpc(status) => matches!(
                status.code(),
                tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Internal
            ),
            _ => false,
        }
    }
}

/// Why a [`LockGuard`](crate::LockGuard) no longer protects anything. Every
/// value means the same for the application: stop the protected work now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LostReason {
    /// The server answered a renewal with LEASE_NOT_HELD: the lease was
    /// released with its id by someone else, expired, or was superseded.
    NotHeld,
    /// The stop-by deadline passed without a confirmed renewal: the
    /// renewals failed, had unknown outcomes, or could not be sent (no
    /// quorum, nodes down, the hold limit reached, a partition). The lease
    /// may still be held on the servers, but the client can no longer be
    /// sure that it is.
    Unconfirmed,
    /// The guard was released or dropped by the application.
    Released,
}

impl std::fmt::Display for LostReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LostReason::NotHeld => "the server no longer holds the lease (LEASE_NOT_HELD)",
            LostReason::Unconfirmed => "no renewal was confirmed before the stop-by deadline",
            LostReason::Released => "the lease was released by this client",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ended(reason: Reason) -> ClientError {
        ClientError::from_status(ErrorDetail::new(reason, "ended").to_status())
    }

    #[test]
    fn a_watch_resumes_after_falling_behind_a_move_a_stop_or_a_broken_connection_only() {
        for reason in [
            Reason::ServerBusy,
            Reason::EpochNotMatch,
            Reason::ShuttingDown,
        ] {
            assert!(ended(reason).resumes_watch(), "{reason:?}");
        }
        for reason in [Reason::PermissionDenied, Reason::InvalidResource] {
            assert!(!ended(reason).resumes_watch(), "{reason:?}");
        }
        let broken = ClientError::from_status(tonic::Status::unavailable("h2 error"));
        assert!(matches!(broken, ClientError::Grpc(_)));
        assert!(broken.resumes_watch());
    }
}
