//! The node-wide key-value engine that every shard's storage shares.
//!
//! This module owns the [`Engine`] trait, the engine-independent
//! [`WriteBatch`], the column families ([`Cf`]) and the batch limits. It knows
//! nothing about Raft: keys and values are opaque bytes here (their layout is
//! in [`crate::keys`]).
//!
//! Why a batch type of our own rather than `rocksdb::WriteBatch`: the store
//! loop stages every shard's `Ready` into *one* batch and flushes it with a
//! single synced write (group commit), and the same staging code must run
//! against [`MemEngine`] in tests. A plain list of operations is trivially
//! inspectable and engine-neutral; [`RocksEngine`] translates it into a native
//! batch at write time, which costs one copy of each key and value — small
//! next to the fsync the batch is waiting for.
//!
//! Two implementations exist, and both must pass the same conformance suite
//! (`testing::engine_suite`): [`RocksEngine`] for production and [`MemEngine`]
//! for fast tests of the layers above.

mod mem;
mod rocks;

pub use mem::MemEngine;
pub use rocks::{EngineMemory, RocksEngine};

use std::fmt;

use crate::error::{Error, Result};

/// Hard upper bound on the approximate size of one [`WriteBatch`].
///
/// A group commit carries every shard's new entries plus, occasionally, a
/// state-machine snapshot (~50 MB of logical state per the design inputs, far
/// less per shard). 512 MiB leaves room for that while stopping a runaway
/// batch from exhausting memory; the store loop should flush long before this
/// (see [`GROUP_COMMIT_TARGET_BYTES`]).
pub const MAX_WRITE_BATCH_BYTES: usize = 512 << 20;

/// Size at which the store loop should stop collecting `Ready`s and flush.
///
/// Bigger batches amortise the fsync better but delay every shard in the
/// batch; at ~6,000 commits/s of a few hundred bytes each, 4 MiB is never hit
/// in steady state and only bounds catch-up bursts.
pub const GROUP_COMMIT_TARGET_BYTES: usize = 4 << 20;

/// Per-operation bookkeeping bytes counted by [`WriteBatch::size_bytes`], so
/// that a batch of many tiny operations is not reported as nearly empty.
const OP_OVERHEAD_BYTES: usize = 16;

/// A column family: a separate keyspace with its own tuning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Cf {
    /// Raft log entries, hard state, conf state, log state — per shard.
    Raft,
    /// Applied index and state-machine snapshots — per shard.
    Apply,
    /// Node metadata: format version, node identity, shard list.
    Meta,
}

impl Cf {
    /// Every column family, in a fixed order.
    pub const ALL: [Cf; 3] = [Cf::Raft, Cf::Apply, Cf::Meta];

    /// Name of the column family in RocksDB.
    pub fn name(self) -> &'static str {
        match self {
            Cf::Raft => "raft",
            Cf::Apply => "apply",
            Cf::Meta => "meta",
        }
    }

    /// Position in [`Cf::ALL`]; used to index per-cf tables.
    pub fn ordinal(self) -> usize {
        match self {
            Cf::Raft => 0,
            Cf::Apply => 1,
            Cf::Meta => 2,
        }
    }
}

impl fmt::Display for Cf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One staged mutation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteOp {
    /// Set `key` to `value`.
    Put {
        /// Column family.
        cf: Cf,
        /// Key.
        key: Vec<u8>,
        /// Value.
        value: Vec<u8>,
    },
    /// Remove `key` (no error if absent).
    Delete {
        /// Column family.
        cf: Cf,
        /// Key.
        key: Vec<u8>,
    },
    /// Remove every key in `[start, end)`.
    DeleteRange {
        /// Column family.
        cf: Cf,
        /// Inclusive start.
        start: Vec<u8>,
        /// Exclusive end.
        end: Vec<u8>,
    },
}

/// An ordered list of mutations applied atomically by [`Engine::write`].
///
/// Operations apply in the order they were added: a put after a range delete
/// that covers its key survives, a delete after a put removes it. Both
/// engines guarantee this (RocksDB gives each operation of a batch its own,
/// increasing sequence number).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WriteBatch {
    ops: Vec<WriteOp>,
    size_bytes: usize,
}

impl WriteBatch {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    /// Stages `key = value` in `cf`.
    pub fn put(&mut self, cf: Cf, key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) {
        let (key, value) = (key.into(), value.into());
        self.size_bytes += key.len() + value.len() + OP_OVERHEAD_BYTES;
        self.ops.push(WriteOp::Put { cf, key, value });
    }

    /// Stages removal of `key` from `cf`.
    pub fn delete(&mut self, cf: Cf, key: impl Into<Vec<u8>>) {
        let key = key.into();
        self.size_bytes += key.len() + OP_OVERHEAD_BYTES;
        self.ops.push(WriteOp::Delete { cf, key });
    }

    /// Stages removal of every key in `[start, end)` of `cf`.
    ///
    /// `start > end` is rejected when the batch is written; `start == end` is
    /// a no-op.
    pub fn delete_range(&mut self, cf: Cf, start: impl Into<Vec<u8>>, end: impl Into<Vec<u8>>) {
        let (start, end) = (start.into(), end.into());
        self.size_bytes += start.len() + end.len() + OP_OVERHEAD_BYTES;
        self.ops.push(WriteOp::DeleteRange { cf, start, end });
    }

    /// Moves every operation of `other` to the end of this batch.
    pub fn append(&mut self, other: &mut WriteBatch) {
        self.size_bytes += other.size_bytes;
        self.ops.append(&mut other.ops);
        other.size_bytes = 0;
    }

    /// The staged operations, in order.
    pub fn ops(&self) -> &[WriteOp] {
        &self.ops
    }

    /// Number of staged operations.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// True if nothing is staged.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Approximate size: keys + values + a fixed per-operation overhead.
    pub fn size_bytes(&self) -> usize {
        self.size_bytes
    }

    /// Removes every operation, keeping the allocation for reuse.
    pub fn clear(&mut self) {
        self.ops.clear();
        self.size_bytes = 0;
    }

    /// Checks the whole batch before any of it is applied, so that an invalid
    /// batch is rejected atomically by every engine in the same way.
    pub(crate) fn validate(&self) -> Result<()> {
        if self.size_bytes > MAX_WRITE_BATCH_BYTES {
            return Err(Error::BatchTooLarge {
                size_bytes: self.size_bytes,
                limit_bytes: MAX_WRITE_BATCH_BYTES,
            });
        }
        for op in &self.ops {
            if let WriteOp::DeleteRange { cf, start, end } = op {
                if start > end {
                    return Err(Error::InvalidRange(format!(
                        "delete_range in cf {cf}: start > end"
                    )));
                }
            }
        }
        Ok(())
    }
}

/// Callback for [`Engine::iterate`]: receives each `(key, value)` in key
/// order and returns `Ok(true)` to continue or `Ok(false)` to stop.
pub type IterCallback<'a> = dyn FnMut(&[u8], &[u8]) -> Result<bool> + 'a;

/// The node-wide key-value engine.
///
/// Shared by all shards of the node (`Arc<E>`), hence `Send + Sync`.
/// Writes are atomic per batch; `sync = true` returns only once the batch is
/// durable (it survives a process crash and an OS crash).
pub trait Engine: Send + Sync {
    /// Reads one key.
    fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>>;

    /// Applies `batch` atomically. An empty batch is a no-op (nothing is
    /// synced). An invalid batch (see [`WriteBatch`]) is rejected whole.
    fn write(&self, batch: &WriteBatch, sync: bool) -> Result<()>;

    /// Calls `f` for every key in `[start, end)` of `cf`, in ascending key
    /// order, over a consistent view, until `f` returns `Ok(false)` or an
    /// error (which is returned).
    ///
    /// `f` must not call back into the engine: [`MemEngine`] holds its lock
    /// while iterating.
    fn iterate(&self, cf: Cf, start: &[u8], end: &[u8], f: &mut IterCallback<'_>) -> Result<()>;

    /// Collects at most `limit` pairs from `[start, end)` of `cf`.
    fn scan(
        &self,
        cf: Cf,
        start: &[u8],
        end: &[u8],
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut out = Vec::new();
        if limit == 0 {
            return Ok(out);
        }
        self.iterate(cf, start, end, &mut |k, v| {
            out.push((k.to_vec(), v.to_vec()));
            Ok(out.len() < limit)
        })?;
        Ok(out)
    }

    /// Removes every key in `[start, end)` of `cf` right away (a one-operation
    /// batch). Most callers should stage into a shared [`WriteBatch`] instead.
    fn delete_range(&self, cf: Cf, start: &[u8], end: &[u8], sync: bool) -> Result<()> {
        let mut batch = WriteBatch::new();
        batch.delete_range(cf, start, end);
        self.write(&batch, sync)
    }
}

/// Checks an iteration range the same way for every engine.
pub(crate) fn check_range(cf: Cf, start: &[u8], end: &[u8]) -> Result<()> {
    if start > end {
        return Err(Error::InvalidRange(format!(
            "iterate in cf {cf}: start > end"
        )));
    }
    Ok(())
}
