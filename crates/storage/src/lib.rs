//! Storage layer of the fencelock multi-Raft node.
//!
//! One node hosts many shard Raft groups (raft-rs `RawNode`s) in one process
//! over **one** key-value engine. The store loop collects every shard's
//! `Ready`, stages all of them into one [`WriteBatch`] and hands it to a
//! writer that syncs it once (group commit across shards) while the loop
//! keeps going; when the write lands it reports it to each shard
//! ([`ShardStorage::on_persisted_through`] with the batch's mark), and only
//! then sends the messages that need it durable.
//!
//! Modules and what each owns:
//!
//! - [`engine`]: the [`Engine`] trait, the engine-neutral [`WriteBatch`], the
//!   column families, and the two engines ([`RocksEngine`], [`MemEngine`]).
//! - [`keys`]: the on-disk key layout (shard-prefixed, big-endian).
//! - [`shard_storage`]: [`ShardStorage`], one shard's `raft::Storage` with its
//!   in-memory cache, staging protocol and recovery.
//! - [`meta`]: node-wide metadata (format version, node identity, shard list).
//! - [`error`]: the crate's single error type and its mapping to
//!   `raft::Error`.
//! - `testing` (feature `testing`, and in this crate's tests): conformance
//!   suites every engine and every `ShardStorage` setup must pass.

pub mod engine;
pub mod error;
pub mod keys;
pub mod meta;
pub mod shard_storage;

#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use engine::{Cf, Engine, EngineMemory, MemEngine, RocksEngine, WriteBatch, WriteOp};
pub use error::{Error, Result};
pub use shard_storage::{ShardStorage, SnapshotInfo};
