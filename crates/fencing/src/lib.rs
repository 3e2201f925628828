//! Fencing on the protected side: accept a write for a resource only if its
//! fencing token is at least the highest token already accepted for that
//! resource, and record it, in one atomic step.
//!
//! A lock alone cannot stop a holder that was paused (GC, SIGSTOP, a slow
//! disk, a partition) from writing after its lease ended and the lock went
//! to someone else: the paused holder cannot know it was paused. The
//! protected system can, if every write carries the grant's fencing token
//! (strictly greater for every new grant of a resource): once it accepted
//! token 42 it refuses 41 forever. Equal tokens are accepted, so one holder
//! may write many times under one grant.
//!
//! [`FenceStore`] is that primitive. Two implementations pass one shared
//! conformance suite (`testing::conformance`, feature `testing`):
//! - [`MemoryFenceStore`]: a mutex-guarded map, for a service that is itself
//!   the single writer of the protected state (a token-checking proxy in
//!   front of something that cannot check tokens).
//! - `PgFenceStore` (feature `postgres`): the check and the write are one
//!   conditional SQL statement, so PostgreSQL's row lock makes them atomic
//!   across any number of connections and processes.
//!
//! `docs/fencing.md` explains the pattern for databases and object stores,
//! and what a lock can promise when the protected system checks nothing.

mod error;
mod memory;
#[cfg(feature = "prometheus")]
mod metered;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "testing")]
pub mod testing;

use std::future::Future;

pub use error::FenceError;
pub use memory::{MemoryFenceStore, DEFAULT_MAX_RESOURCES};
#[cfg(feature = "prometheus")]
pub use metered::{FenceMetrics, Metered, CALLS_METRIC, REJECTIONS_METRIC};
#[cfg(feature = "postgres")]
pub use postgres::PgFenceStore;

/// Longest resource key, in bytes. Matches fencelock's resource names
/// (`tenant/path`, at most 256 bytes), so every lock name fits; a bound keeps
/// one caller from filling the store with huge keys.
pub const MAX_RESOURCE_LEN: usize = 256;

/// Largest value one fenced write may carry, in bytes. The store holds the
/// protected state inline with its token; bulk data belongs in a system with
/// its own conditional writes (see `docs/fencing.md`, object stores).
pub const MAX_VALUE_LEN: usize = 1 << 20;

/// What a resource's record holds: the highest token accepted so far and the
/// value written with the write that carried it (or with an earlier equal
/// token).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FencedValue {
    /// The highest fencing token accepted for the resource.
    pub token: i64,
    /// The last accepted value; `None` if the fence was only raised with
    /// [`FenceStore::check_and_record`] and never written.
    pub value: Option<Vec<u8>>,
}

/// The check-and-record primitive of the protected side.
///
/// Every method that takes a token validates it first: tokens are positive
/// (fencelock's tokens are `epoch << 40 | position` with epoch ≥ 1), and a
/// refused argument is an [`FenceError::InvalidToken`] or
/// [`FenceError::InvalidResource`], never counted as a stale rejection.
///
/// Records are never forgotten: forgetting the highest token of a resource
/// would let a stale holder's token pass again.
pub trait FenceStore: Send + Sync {
    /// Stores `value` for `resource` if `token` is at least the highest token
    /// accepted for it, and makes `token` the highest, atomically. A lower
    /// token fails with [`FenceError::StaleToken`] and changes nothing.
    fn write(
        &self,
        resource: &str,
        token: i64,
        value: &[u8],
    ) -> impl Future<Output = Result<(), FenceError>> + Send;

    /// The bare fence: raises `resource`'s highest token to `token` if
    /// `token` is at least the current highest, without touching the stored
    /// value. For guarding a side effect that lives elsewhere, called in the
    /// same serialised step that performs it.
    fn check_and_record(
        &self,
        resource: &str,
        token: i64,
    ) -> impl Future<Output = Result<(), FenceError>> + Send;

    /// The record of `resource`, or `None` if no token was ever accepted.
    fn read(
        &self,
        resource: &str,
    ) -> impl Future<Output = Result<Option<FencedValue>, FenceError>> + Send;

    /// How many writes and checks this handle refused as stale since it was
    /// created (the "token rejections" metric). Invalid arguments and
    /// backend failures are not counted.
    fn rejections(&self) -> u64;
}

/// Checks the arguments every store takes, before any state is touched.
pub(crate) fn validate(resource: &str, token: i64, value_len: usize) -> Result<(), FenceError> {
    validate_resource(resource)?;
    if token <= 0 {
        return Err(FenceError::InvalidToken { presented: token });
    }
    if value_len > MAX_VALUE_LEN {
        return Err(FenceError::ValueTooLarge {
            len: value_len,
            max: MAX_VALUE_LEN,
        });
    }
    Ok(())
}

pub(crate) fn validate_resource(resource: &str) -> Result<(), FenceError> {
    if resource.is_empty() {
        return Err(FenceError::InvalidResource {
            reason: "empty".into(),
        });
    }
    if resource.len() > MAX_RESOURCE_LEN {
        return Err(FenceError::InvalidResource {
            reason: format!("{} bytes, at most {MAX_RESOURCE_LEN}", resource.len()),
        });
    }
    // PostgreSQL `text` cannot hold NUL; refusing it everywhere keeps both
    // stores answering the same way.
    if resource.contains('\0') {
        return Err(FenceError::InvalidResource {
            reason: "contains a NUL byte".into(),
        });
    }
    Ok(())
}
