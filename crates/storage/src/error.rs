//! The crate's one error type, and its mapping onto `raft::Error`.
//!
//! raft-rs reacts to a handful of storage errors specifically (`Compacted`,
//! `Unavailable`, `SnapshotTemporarilyUnavailable`, `SnapshotOutOfDate`), so
//! those have their own variants here and map 1:1; everything else becomes
//! `StorageError::Other`, which raft-rs treats as fatal for the group.

use crate::engine::Cf;

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Every failure of the storage layer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// RocksDB reported an error (I/O, corruption it detected itself, ...).
    #[error("rocksdb: {0}")]
    Rocks(#[from] rocksdb::Error),

    /// Bytes on disk do not decode into what the layout says must be there.
    /// Never a panic: a node with a damaged store must be able to report it.
    #[error("corrupt data in cf {cf} at key {}: {reason}", hex(key))]
    Corruption {
        /// Column family of the bad record.
        cf: Cf,
        /// Key of the bad record.
        key: Vec<u8>,
        /// What was wrong with it.
        reason: String,
    },

    /// raft-rs reported an error (for callers that drive a `RawNode` over
    /// this storage and want one error type).
    #[error("raft: {0}")]
    Raft(#[from] raft::Error),

    /// A protobuf message could not be encoded.
    #[error("protobuf encode: {0}")]
    Encode(#[from] protobuf::ProtobufError),

    /// A write batch exceeded [`crate::engine::MAX_WRITE_BATCH_BYTES`].
    #[error("write batch is {size_bytes} bytes, limit is {limit_bytes}")]
    BatchTooLarge {
        /// Approximate size of the rejected batch.
        size_bytes: usize,
        /// The limit it exceeded.
        limit_bytes: usize,
    },

    /// A value exceeded a per-record size limit.
    #[error("{what} is {size_bytes} bytes, limit is {limit_bytes}")]
    ValueTooLarge {
        /// Which kind of record.
        what: &'static str,
        /// Its size.
        size_bytes: usize,
        /// The limit it exceeded.
        limit_bytes: usize,
    },

    /// A read asked for a range that is not a valid `[low, high)` range.
    #[error("invalid range: {0}")]
    InvalidRange(String),

    /// The engine's in-memory state was poisoned by a panic in another thread.
    #[error("engine state poisoned by a panic in another thread")]
    Poisoned,

    /// The requested log index has been compacted away.
    #[error("shard {shard_id}: index {index} is compacted (first index {first_index})")]
    Compacted {
        /// Shard.
        shard_id: u64,
        /// Requested index.
        index: u64,
        /// First index still in the log.
        first_index: u64,
    },

    /// The requested log index is past the end of the (durable) log.
    #[error("shard {shard_id}: index {index} is unavailable (last index {last_index})")]
    Unavailable {
        /// Shard.
        shard_id: u64,
        /// Requested index.
        index: u64,
        /// Last index in the log.
        last_index: u64,
    },

    /// An append that would leave a gap or rewrite compacted entries, or whose
    /// entries are not consecutive.
    #[error("shard {shard_id}: invalid append: {reason}")]
    InvalidAppend {
        /// Shard.
        shard_id: u64,
        /// Why it was refused.
        reason: String,
    },

    /// A compaction that would discard entries that are not durable yet or
    /// not covered by a state-machine snapshot.
    #[error("shard {shard_id}: invalid compaction: {reason}")]
    InvalidCompaction {
        /// Shard.
        shard_id: u64,
        /// Why it was refused.
        reason: String,
    },

    /// A snapshot older than what the storage already holds.
    #[error("shard {shard_id}: snapshot at index {snapshot_index} is out of date: {reason}")]
    SnapshotOutOfDate {
        /// Shard.
        shard_id: u64,
        /// Index of the refused snapshot.
        snapshot_index: u64,
        /// What it is older than.
        reason: String,
    },

    /// No state-machine snapshot at or after the requested index has been
    /// saved yet. raft-rs retries later; the node should save one.
    #[error(
        "shard {shard_id}: no snapshot at index >= {request_index} yet (latest {latest_index:?})"
    )]
    SnapshotTemporarilyUnavailable {
        /// Shard.
        shard_id: u64,
        /// Index the snapshot must reach.
        request_index: u64,
        /// Index of the latest saved snapshot, if any.
        latest_index: Option<u64>,
    },

    /// A snapshot whose metadata contradicts the log (e.g. a term mismatch).
    #[error("shard {shard_id}: invalid snapshot: {reason}")]
    InvalidSnapshot {
        /// Shard.
        shard_id: u64,
        /// What is wrong with it.
        reason: String,
    },

    /// A hard-state or applied-index update that would move state backwards
    /// or past the log (a bug in the caller, refused before it reaches disk).
    #[error("shard {shard_id}: invalid state update: {reason}")]
    InvalidState {
        /// Shard.
        shard_id: u64,
        /// What is wrong with it.
        reason: String,
    },

    /// The node's stored identity or layout version does not match.
    #[error("store metadata mismatch: {0}")]
    MetaMismatch(String),
}

impl Error {
    /// Builds a [`Error::Corruption`].
    pub fn corruption(cf: Cf, key: &[u8], reason: impl Into<String>) -> Self {
        Error::Corruption {
            cf,
            key: key.to_vec(),
            reason: reason.into(),
        }
    }
}

impl From<Error> for raft::Error {
    fn from(e: Error) -> Self {
        use raft::StorageError as S;
        let storage = match e {
            Error::Raft(inner) => return inner,
            Error::Compacted { .. } => S::Compacted,
            Error::Unavailable { .. } => S::Unavailable,
            Error::SnapshotTemporarilyUnavailable { .. } => S::SnapshotTemporarilyUnavailable,
            Error::SnapshotOutOfDate { .. } => S::SnapshotOutOfDate,
            other => S::Other(Box::new(other)),
        };
        raft::Error::Store(storage)
    }
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        // Writing into a String cannot fail.
        let _ = write!(out, "{b:02x}");
    }
    out
}
