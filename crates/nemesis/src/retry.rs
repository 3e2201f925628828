//! Which refusals a recording client retries, and which of those say the
//! attempt changed nothing. One rule for the real-process lock client
//! ([`crate::harness`]) and the deterministic simulation's clients, so an
//! operation's recorded outcome means the same in both.

use fencelock_api::v1::Reason;

/// Refusals that say where or when to try again (routing, availability).
/// Only these are retried; every other refusal — the lock is held, the
/// wait ran out, a queue is full, the lease is gone — is the call's
/// definite answer, even where the error contract allows a later retry.
pub const RETRIED_REASONS: [Reason; 10] = [
    Reason::NotLeader,
    Reason::LeaderUnknown,
    Reason::NoQuorum,
    Reason::LeaderNotReady,
    Reason::TokenSpaceExhausted,
    Reason::ShuttingDown,
    Reason::ServerBusy,
    Reason::OutcomeUnknown,
    Reason::EpochNotMatch,
    Reason::LeaseIdCollision,
];

/// Retried refusals documented as "nothing was changed": an attempt ending
/// with one of them took no effect.
pub const NO_EFFECT_REASONS: [Reason; 6] = [
    Reason::NotLeader,
    Reason::EpochNotMatch,
    Reason::ServerBusy,
    Reason::LeaderNotReady,
    Reason::TokenSpaceExhausted,
    Reason::LeaseIdCollision,
];
