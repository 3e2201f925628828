//! The one error type of this crate.

/// Why a fenced write or check was not applied.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FenceError {
    /// The token is lower than the highest one already accepted for the
    /// resource: the writer's lock was superseded (it was paused or cut off
    /// past its lease). Nothing was changed. The writer must stop; retrying
    /// with the same token can never succeed.
    ///
    /// `highest` is read when the rejection is reported; tokens only rise,
    /// so it is at least the token that caused the rejection.
    #[error(
        "stale fencing token for {resource:?}: presented {presented}, highest accepted {highest}"
    )]
    StaleToken {
        resource: String,
        presented: i64,
        highest: i64,
    },

    /// Tokens are positive; 0 or less is never a grant's token.
    #[error("invalid fencing token {presented}: tokens are positive")]
    InvalidToken { presented: i64 },

    /// The resource key is empty, too long or has a NUL byte.
    #[error("invalid resource key: {reason}")]
    InvalidResource { reason: String },

    /// The value is larger than the store takes in one write.
    #[error("value of {len} bytes is larger than the limit of {max}")]
    ValueTooLarge { len: usize, max: usize },

    /// The in-memory store holds as many resources as it may. It refuses new
    /// resources rather than forget old ones, because forgetting a record
    /// would let a stale token through.
    #[error("fence store is full: {max} resources")]
    CapacityExceeded { max: usize },

    /// A PostgreSQL table name must be a plain lower-case identifier (it is
    /// spliced into SQL, so nothing that needs quoting is accepted).
    #[error("invalid table name {name:?}: use 1 to 63 of [a-z0-9_], not starting with a digit")]
    InvalidTableName { name: String },

    /// The PostgreSQL server refused or the connection failed. The write's
    /// outcome is unknown only if the failure came after the statement was
    /// sent; a retry with the same token is safe either way, because equal
    /// tokens are accepted.
    #[cfg(feature = "postgres")]
    #[error("postgres: {0}")]
    Postgres(#[from] tokio_postgres::Error),

    /// The throwaway test server could not be set up or started.
    #[cfg(feature = "testing")]
    #[error("test PostgreSQL server: {0}")]
    TestServer(String),
}
