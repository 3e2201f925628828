//! What one measured request was and how it ended.
//!
//! Every backend maps its own errors onto these five [`Outcome`]s, so the
//! systems are compared on the same terms.

use serde::Serialize;

/// The operations the harness times.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// Take a lease (for a waiting acquire: until granted).
    Acquire,
    /// Extend a held lease.
    Renew,
    /// End a held lease.
    Release,
    /// `contended` only: from a holder sending its release to the next
    /// waiter receiving its grant. Not a request of its own.
    Handoff,
    /// `watch` only: from a lock client's acquire or release answer
    /// arriving to one watcher receiving the matching event. One per
    /// watcher and change; not a request of its own.
    Delivery,
}

impl Op {
    pub const ALL: [Op; 5] = [
        Op::Acquire,
        Op::Renew,
        Op::Release,
        Op::Handoff,
        Op::Delivery,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Op::Acquire => "acquire",
            Op::Renew => "renew",
            Op::Release => "release",
            Op::Handoff => "handoff",
            Op::Delivery => "delivery",
        }
    }
}

/// How a request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Done as asked.
    Ok,
    /// The lock was not to be had or the lease not renewable: held by
    /// someone else, waited in vain, lease no longer held. In `seed` this
    /// means a lease was lost or leaked, since it only picks free resources.
    Conflict,
    /// The harness's deadline passed without an answer.
    Timeout,
    /// Refused for want of a leader, quorum or capacity, or unreachable:
    /// nothing was done.
    Unavailable,
    /// Ended without telling whether it took effect.
    Unknown,
}

impl Outcome {
    pub const ALL: [Outcome; 5] = [
        Outcome::Ok,
        Outcome::Conflict,
        Outcome::Timeout,
        Outcome::Unavailable,
        Outcome::Unknown,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Conflict => "conflict",
            Outcome::Timeout => "timeout",
            Outcome::Unavailable => "unavailable",
            Outcome::Unknown => "unknown",
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }
}

/// A failed request: its outcome class and the backend's own words.
#[derive(Clone, Debug)]
pub struct OpError {
    pub outcome: Outcome,
    pub message: String,
}

impl OpError {
    pub fn new(outcome: Outcome, message: impl Into<String>) -> OpError {
        debug_assert_ne!(outcome, Outcome::Ok, "an error is never Ok");
        OpError {
            outcome,
            message: message.into(),
        }
    }
}

impl std::fmt::Display for OpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.outcome.name(), self.message)
    }
}
