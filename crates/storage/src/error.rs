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
    /// RocksDB reported an error other than damage (I/O, a full disk, ...).
    #[error("rocksdb: {0}")]
    Rocks(rocksdb::Error),

    /// RocksDB found the data directory damaged: a checksum that does not
    /// match, a file shorter than the manifest says, a log record broken
    /// before the log's end. What it held cannot be trusted, so the node
    /// must not run on it (see [`DAMAGE_RECOVERY`]).
    #[error("the data directory is damaged{}: {detail}. {DAMAGE_RECOVERY}", file_note(.file))]
    Damaged {
        /// The damaged file, when RocksDB's message names one.
        file: Option<String>,
        /// RocksDB's own description.
        detail: String,
    },

    /// Bytes on disk do not decode into what the layout says must be there.
    /// Never a panic: a node with a damaged store must be able to report it.
    #[error(
        "corrupt data in cf {cf} at key {}: {reason}. {DAMAGE_RECOVERY}",
        hex(key)
    )]
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

/// What to do about a damaged data directory, said wherever one is found.
/// A replica that lost or garbled part of what it acknowledged may vote as
/// if it remembered entries it does not have, so repairing the files in
/// place (or deleting the bad one to make RocksDB start) is never the fix.
pub const DAMAGE_RECOVERY: &str = "Do not edit or delete files to make the node start: \
     keep the directory for forensics and replace this node's replicas from their peers \
     (docs/operations.md, \"Replace a node whose disk was lost\")";

impl From<rocksdb::Error> for Error {
    fn from(e: rocksdb::Error) -> Self {
        if e.kind() != rocksdb::ErrorKind::Corruption {
            return Error::Rocks(e);
        }
        let detail = e.into_string();
        Error::Damaged {
            file: damaged_file(&detail),
            detail,
        }
    }
}

/// The RocksDB file a corruption message names: the first word that is a
/// table (`NNNNNN.sst`), a log (`NNNNNN.log`), a `MANIFEST-NNNNNN`, or
/// `CURRENT`/`OPTIONS-NNNNNN`, with whatever directory RocksDB put before it.
pub fn damaged_file(message: &str) -> Option<String> {
    message
        .split(|c: char| c.is_whitespace() || c == ',' || c == ';' || c == '\'' || c == '"')
        .map(|word| word.trim_end_matches([':', '.', ')']))
        .find(|word| {
            let name = word.rsplit('/').next().unwrap_or(word);
            let numbered =
                |stem: &str| !stem.is_empty() && stem.bytes().all(|b| b.is_ascii_digit());
            name.strip_suffix(".sst").is_some_and(numbered)
                || name.strip_suffix(".log").is_some_and(numbered)
                || name.strip_prefix("MANIFEST-").is_some_and(numbered)
                || name.strip_prefix("OPTIONS-").is_some_and(numbered)
                || name == "CURRENT"
        })
        .map(str::to_string)
}

impl Error {
    /// Whether this error means the data directory itself is damaged (as
    /// opposed to an I/O failure now, or a bug): a node must refuse to start
    /// on it, and say [`DAMAGE_RECOVERY`].
    pub fn is_damage(&self) -> bool {
        matches!(self, Error::Damaged { .. } | Error::Corruption { .. })
    }

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

fn file_note(file: &Option<String>) -> String {
    match file {
        Some(f) => format!(" ({f})"),
        None => String::new(),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_damaged_file_is_found_in_rocksdbs_messages() {
        let cases = [
            (
                "Corruption: block checksum mismatch: stored = 1, computed = 2, type = 1 \
                 in /var/lib/fencelock/db/000011.sst offset 0 size 4096",
                Some("/var/lib/fencelock/db/000011.sst"),
            ),
            (
                "Corruption: Sst file size mismatch: /d/db/000024.sst. Size recorded in \
                 manifest 100, actual size 50",
                Some("/d/db/000024.sst"),
            ),
            (
                "Corruption: checksum mismatch in file /d/db/000004.log",
                Some("/d/db/000004.log"),
            ),
            (
                "Corruption: bad record in MANIFEST-000005",
                Some("MANIFEST-000005"),
            ),
            ("Corruption: CURRENT file corrupted", Some("CURRENT")),
            ("Corruption: something else entirely", None),
            // A word that only looks like a file is not one.
            ("Corruption: abc.sst x.log", None),
        ];
        for (message, want) in cases {
            assert_eq!(damaged_file(message).as_deref(), want, "{message}");
        }
    }

    #[test]
    fn a_damage_error_says_what_to_do() {
        let e = Error::Damaged {
            file: Some("/d/db/000004.log".into()),
            detail: "Corruption: checksum mismatch".into(),
        };
        let text = e.to_string();
        assert!(e.is_damage());
        assert!(text.contains("(/d/db/000004.log)"), "{text}");
        assert!(
            text.contains("Replace a node whose disk was lost"),
            "{text}"
        );
        assert!(!Error::Poisoned.is_damage());
    }
}
