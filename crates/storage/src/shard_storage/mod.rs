//! One shard's Raft storage over the node-wide [`Engine`].
//!
//! This module owns a shard's Raft log, hard state, conf state, log
//! truncation point, applied index and latest state-machine snapshot: their
//! encoding, their invariants, their in-memory cache, and their recovery after
//! a restart. [`ShardStorage`] implements [`raft::Storage`] for one shard's
//! `RawNode`; many of them share one engine.
//!
//! # Writes are staged, then flushed by the caller
//!
//! Every write method (`append`, `set_hard_state`, `apply_snapshot`,
//! `compact`, ...) *stages* its changes into a caller-provided
//! [`WriteBatch`] and writes nothing itself. The store loop stages every
//! shard's `Ready` into one batch and flushes it with one synced
//! [`Engine::write`] — one fsync for all shards (group commit).
//!
//! Each staging method either stages everything it has to or, on error,
//! leaves both the batch and the storage untouched.
//!
//! # What reads see, and when staged changes become durable
//!
//! Reads through [`raft::Storage`] (`entries`, `term`, `first_index`,
//! `last_index`) see the **staged** log: durable plus everything staged,
//! written or not. That is what raft-rs expects of an asynchronous write
//! path: `RawNode::advance_append_async` moves a `Ready`'s entries out of
//! raft-rs's own unstable buffer at once, and raft-rs then reads them
//! from storage (to send them to followers) while the write that holds
//! them is still in flight. So staged entries go into the entry cache when
//! they are staged, and the cache keeps every entry not yet durable (it
//! evicts only older ones): an entry the engine may not have yet, or may
//! be overwriting, is always read from memory, and the engine is read only
//! below the first entry any pending write touches.
//!
//! What is *durable* moves only when the caller says a write landed: each
//! staged op gets the next **mark**; take [`ShardStorage::staged_mark`]
//! when a batch is handed to the disk, and call
//! [`ShardStorage::on_persisted_through`] with it once that batch is
//! written. The durable accessors (`hard_state`, `applied_index`, `last`,
//! `truncated`, `snapshot_info`) move then, and the state-machine snapshot
//! served to raft-rs is always a durable one: while a snapshot save or
//! install is pending, `snapshot()` answers "temporarily unavailable"
//! (the engine may hold half of the old and half of the new otherwise).
//! Batches are written in the order they were staged, so durability
//! advances in mark order. [`ShardStorage::on_persisted`] is "through
//! everything staged so far", for callers that write synchronously.
//!
//! If a write fails the node stops (the store loop's fail-stop rule);
//! [`ShardStorage::abort_staged`] exists for callers that discard a batch:
//! it forgets every pending op and the cache, and the `RawNode` above it
//! must be recreated from storage.
//!
//! Staging validates against the staged view, so any number of batches
//! may be staged, in flight and written in order.
//!
//! # Log truncation and snapshots
//!
//! [`ShardStorage::compact`] deletes entries up to and including an index
//! and keeps that entry's term, so `term(truncated_index)` still answers
//! (raft needs it to match the entry before the first one it sends). It
//! refuses to compact past the latest saved state-machine snapshot: a
//! follower that needs a snapshot must be able to continue from the log
//! right after it, or the leader would send snapshots forever.

mod entry_cache;

pub use entry_cache::{ENTRY_CACHE_MAX_BYTES, ENTRY_CACHE_MAX_ENTRIES};

use std::cell::Cell;
use std::collections::VecDeque;
use std::sync::Arc;

use protobuf::Message;
use raft::prelude::{ConfState, Entry, HardState, Snapshot, SnapshotMetadata};
use raft::{GetEntriesContext, RaftState};

use crate::engine::{Cf, Engine, WriteBatch};
use crate::error::{Error, Result};
use crate::keys;
use entry_cache::EntryCache;

/// Largest encoded log entry accepted by [`ShardStorage::append`]. Lock
/// commands are a few hundred bytes; the API layer bounds proposals far below
/// this, so hitting it means a bug upstream, refused before it reaches disk.
pub const MAX_ENTRY_BYTES: usize = 8 << 20;

/// Largest state-machine snapshot blob accepted. The whole logical state is
/// ~50 MB before replication (design inputs) and a shard holds a fraction of
/// it; 256 MiB leaves headroom yet stays well under
/// [`crate::engine::MAX_WRITE_BATCH_BYTES`].
pub const MAX_SNAPSHOT_DATA_BYTES: usize = 256 << 20;

/// Version byte of the encoded log state; bump on any layout change.
const LOG_STATE_VERSION: u8 = 1;
/// version + truncated index + truncated term + last index.
const LOG_STATE_LEN: usize = 1 + 8 + 8 + 8;

/// Where a shard's log starts and ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct LogState {
    /// Every entry `<=` this index is gone; `first_index = truncated_index + 1`.
    truncated_index: u64,
    /// Term of the entry at `truncated_index` (0 for a fresh log).
    truncated_term: u64,
    /// Index of the last entry (`== truncated_index` when the log is empty).
    last_index: u64,
}

impl LogState {
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(LOG_STATE_LEN);
        out.push(LOG_STATE_VERSION);
        out.extend_from_slice(&self.truncated_index.to_be_bytes());
        out.extend_from_slice(&self.truncated_term.to_be_bytes());
        out.extend_from_slice(&self.last_index.to_be_bytes());
        out
    }

    fn decode(key: &[u8], bytes: &[u8]) -> Result<Self> {
        if bytes.len() != LOG_STATE_LEN {
            return Err(Error::corruption(
                Cf::Raft,
                key,
                format!(
                    "log state is {} bytes, expected {LOG_STATE_LEN}",
                    bytes.len()
                ),
            ));
        }
        if bytes[0] != LOG_STATE_VERSION {
            return Err(Error::corruption(
                Cf::Raft,
                key,
                format!("unknown log state version {}", bytes[0]),
            ));
        }
        let state = LogState {
            truncated_index: be_u64(&bytes[1..9]),
            truncated_term: be_u64(&bytes[9..17]),
            last_index: be_u64(&bytes[17..25]),
        };
        if state.last_index == u64::MAX {
            // Reserved (see `append`): `last_index + 1` must not overflow.
            return Err(Error::corruption(Cf::Raft, key, "last index is u64::MAX"));
        }
        if state.truncated_index > state.last_index {
            return Err(Error::corruption(
                Cf::Raft,
                key,
                format!(
                    "truncated index {} > last index {}",
                    state.truncated_index, state.last_index
                ),
            ));
        }
        Ok(state)
    }
}

/// Index and term of a saved state-machine snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotInfo {
    /// Last log index the snapshot reflects.
    pub index: u64,
    /// Term of that entry.
    pub term: u64,
}

/// Everything about a shard that is kept in memory; one copy for the durable
/// view and one for the staged view.
#[derive(Debug, Clone, Default, PartialEq)]
struct ShardState {
    hard_state: HardState,
    conf_state: ConfState,
    log: LogState,
    /// Term of the entry at `log.last_index`.
    last_term: u64,
    applied_index: u64,
    snapshot: Option<SnapshotInfo>,
}

impl ShardState {
    fn first_index(&self) -> u64 {
        self.log.truncated_index + 1
    }

    fn apply(&mut self, op: &StagedOp) {
        match op {
            StagedOp::Append(entries) => {
                if let Some(last) = entries.last() {
                    self.log.last_index = last.index;
                    self.last_term = last.term;
                }
            }
            StagedOp::HardState(hs) => self.hard_state = hs.clone(),
            StagedOp::ConfState(cs) => self.conf_state = cs.clone(),
            StagedOp::ApplySnapshot { info, conf_state } => {
                self.log = LogState {
                    truncated_index: info.index,
                    truncated_term: info.term,
                    last_index: info.index,
                };
                self.last_term = info.term;
                // As raft-rs's MemStorage: a snapshot implies everything up to
                // its index is committed, in a term at least its own.
                self.hard_state.commit = self.hard_state.commit.max(info.index);
                self.hard_state.term = self.hard_state.term.max(info.term);
                self.conf_state = conf_state.clone();
                self.applied_index = info.index;
                self.snapshot = Some(*info);
            }
            StagedOp::Compact { index, term } => {
                self.log.truncated_index = *index;
                self.log.truncated_term = *term;
            }
            StagedOp::Applied(index) => self.applied_index = *index,
            StagedOp::SaveSnapshot(info) => self.snapshot = Some(*info),
            StagedOp::Destroy => *self = ShardState::default(),
        }
    }
}

/// A change staged into a batch but not yet known to be durable.
#[derive(Debug, Clone)]
enum StagedOp {
    Append(Vec<Entry>),
    HardState(HardState),
    ConfState(ConfState),
    ApplySnapshot {
        info: SnapshotInfo,
        conf_state: ConfState,
    },
    Compact {
        index: u64,
        term: u64,
    },
    Applied(u64),
    SaveSnapshot(SnapshotInfo),
    Destroy,
}

/// Raft storage of one shard. See the module docs for the staging protocol.
///
/// `Send` but not `Sync`: it is owned by the store-loop thread that drives
/// the shard's `RawNode`; only the engine behind it is shared.
pub struct ShardStorage<E: Engine + ?Sized> {
    engine: Arc<E>,
    shard_id: u64,
    /// What is on disk (as far as the caller has reported).
    durable: ShardState,
    /// `durable` plus every pending op: staging validates against it and
    /// `raft::Storage` reads see it.
    staged: ShardState,
    /// Ops staged and not yet reported durable, in order, with their marks.
    pending: VecDeque<(u64, StagedOp)>,
    /// The mark the next staged op gets (see the module docs).
    next_mark: u64,
    /// Recent entries, every one not yet durable among them (see
    /// [`entry_cache`]).
    cache: EntryCache,
    /// Highest `request_index` for which `snapshot()` had nothing recent
    /// enough; the node polls it to know that a new snapshot is wanted.
    /// A `Cell` because `raft::Storage::snapshot` takes `&self`.
    snapshot_request: Cell<Option<u64>>,
}

impl<E: Engine + ?Sized> std::fmt::Debug for ShardStorage<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardStorage")
            .field("shard_id", &self.shard_id)
            .field("durable", &self.durable)
            .field("pending_ops", &self.pending.len())
            .finish()
    }
}

impl<E: Engine + ?Sized> ShardStorage<E> {
    /// Loads a shard's storage from the engine (after a restart, or for a
    /// shard never seen before, in which case everything is empty).
    ///
    /// Checks the invariants that tie the records together and reports any
    /// violation as [`Error::Corruption`].
    pub fn open(engine: Arc<E>, shard_id: u64) -> Result<Self> {
        let log_key = keys::shard_key(keys::TAG_LOG_STATE, shard_id);
        let log = match engine.get(Cf::Raft, &log_key)? {
            Some(bytes) => LogState::decode(&log_key, &bytes)?,
            None => LogState::default(),
        };
        let hs_key = keys::shard_key(keys::TAG_HARD_STATE, shard_id);
        let hard_state: HardState = load_message(&*engine, Cf::Raft, &hs_key)?.unwrap_or_default();
        let cs_key = keys::shard_key(keys::TAG_CONF_STATE, shard_id);
        let conf_state: ConfState = load_message(&*engine, Cf::Raft, &cs_key)?.unwrap_or_default();

        let applied_key = keys::shard_key(keys::TAG_APPLIED, shard_id);
        let applied_index = match engine.get(Cf::Apply, &applied_key)? {
            Some(bytes) if bytes.len() == 8 => be_u64(&bytes),
            Some(bytes) => {
                return Err(Error::corruption(
                    Cf::Apply,
                    &applied_key,
                    format!("applied index is {} bytes, expected 8", bytes.len()),
                ))
            }
            None => 0,
        };
        let meta_key = keys::shard_key(keys::TAG_SNAPSHOT_META, shard_id);
        let snapshot =
            load_message::<SnapshotMetadata, _>(&*engine, Cf::Apply, &meta_key)?.map(|m| {
                SnapshotInfo {
                    index: m.index,
                    term: m.term,
                }
            });

        let mut storage = ShardStorage {
            engine,
            shard_id,
            durable: ShardState {
                hard_state,
                conf_state,
                log,
                last_term: log.truncated_term,
                applied_index,
                snapshot,
            },
            staged: ShardState::default(),
            pending: VecDeque::new(),
            next_mark: 1,
            cache: EntryCache::default(),
            snapshot_request: Cell::new(None),
        };
        if log.last_index > log.truncated_index {
            storage.durable.last_term = storage.load_entry(log.last_index)?.term;
        }
        storage.check_recovered()?;
        storage.staged = storage.durable.clone();
        Ok(storage)
    }

    /// Cross-record invariants of a freshly loaded shard.
    fn check_recovered(&self) -> Result<()> {
        let s = &self.durable;
        let log_key = keys::shard_key(keys::TAG_LOG_STATE, self.shard_id);
        let corrupt = |reason: String| Err(Error::corruption(Cf::Raft, &log_key, reason));
        // Nothing may survive outside [first_index, last_index]: a leftover
        // would mean a truncation or compaction was half-applied.
        let (start, _) = keys::log_range(self.shard_id, 0, 0);
        let below = self.engine.scan(
            Cf::Raft,
            &start,
            &keys::log_key(self.shard_id, s.first_index()),
            1,
        )?;
        if !below.is_empty() {
            return corrupt(format!(
                "log entry found below first index {}",
                s.first_index()
            ));
        }
        let (_, end) = keys::log_range_all(self.shard_id);
        let above = self.engine.scan(
            Cf::Raft,
            &keys::log_key(self.shard_id, s.log.last_index.saturating_add(1)),
            &end,
            1,
        )?;
        if s.log.last_index < u64::MAX && !above.is_empty() {
            return corrupt(format!(
                "log entry found above last index {}",
                s.log.last_index
            ));
        }
        if s.hard_state.commit > s.log.last_index {
            return corrupt(format!(
                "commit {} > last index {}",
                s.hard_state.commit, s.log.last_index
            ));
        }
        if s.log.truncated_index > 0 {
            match s.snapshot {
                Some(snap) if snap.index >= s.log.truncated_index => {}
                _ => {
                    return corrupt(format!(
                        "log truncated at {} but no state-machine snapshot covers it (latest {:?})",
                        s.log.truncated_index, s.snapshot
                    ))
                }
            }
        }
        if let Some(snap) = s.snapshot {
            if snap.index > s.hard_state.commit {
                return corrupt(format!(
                    "snapshot index {} > commit {}",
                    snap.index, s.hard_state.commit
                ));
            }
        }
        Ok(())
    }

    /// The shard this storage belongs to.
    pub fn shard_id(&self) -> u64 {
        self.shard_id
    }

    /// The shared engine.
    pub fn engine(&self) -> &Arc<E> {
        &self.engine
    }

    /// Durable hard state.
    pub fn hard_state(&self) -> &HardState {
        &self.durable.hard_state
    }

    /// Hard state including staged, not yet durable changes. Use it to derive
    /// the next hard state (e.g. a commit-index update from a `LightReady`).
    pub fn staged_hard_state(&self) -> &HardState {
        &self.staged.hard_state
    }

    /// Durable conf state.
    pub fn conf_state(&self) -> &ConfState {
        &self.durable.conf_state
    }

    /// Durable applied index.
    pub fn applied_index(&self) -> u64 {
        self.durable.applied_index
    }

    /// Durable truncation point: `(index, term)` of the last compacted entry.
    pub fn truncated(&self) -> (u64, u64) {
        (
            self.durable.log.truncated_index,
            self.durable.log.truncated_term,
        )
    }

    /// Durable last log index and its term.
    pub fn last(&self) -> (u64, u64) {
        (self.durable.log.last_index, self.durable.last_term)
    }

    /// Index and term of the latest durable state-machine snapshot.
    pub fn snapshot_info(&self) -> Option<SnapshotInfo> {
        self.durable.snapshot
    }

    /// True if changes are staged and not yet reported durable.
    pub fn has_staged(&self) -> bool {
        !self.pending.is_empty()
    }

    /// The mark of everything staged so far: hand it to
    /// [`Self::on_persisted_through`] once the batch holding those ops is
    /// written.
    pub fn staged_mark(&self) -> u64 {
        self.next_mark - 1
    }

    /// First index of an entry staged and not yet durable: every entry
    /// from here on is read from the cache, and the cache keeps them.
    fn unpersisted_from(&self) -> Option<u64> {
        (self.pending.iter())
            .filter_map(|(_, op)| match op {
                StagedOp::Append(entries) => entries.first().map(|e| e.index),
                _ => None,
            })
            .min()
    }

    /// Whether a snapshot save or install is staged and not yet durable.
    fn snapshot_pending(&self) -> bool {
        (self.pending.iter()).any(|(_, op)| {
            matches!(
                op,
                StagedOp::SaveSnapshot(_) | StagedOp::ApplySnapshot { .. } | StagedOp::Destroy
            )
        })
    }

    /// Returns and clears the highest index for which raft asked for a
    /// snapshot that was not available. `Some(i)` means: save a state-machine
    /// snapshot at an index `>= i` (`i == 0` means any).
    pub fn take_snapshot_request(&self) -> Option<u64> {
        self.snapshot_request.take()
    }

    /// Records (again) that a snapshot at an index `>= index` is wanted.
    pub fn request_snapshot(&self, index: u64) {
        let wanted = self.snapshot_request.get().map_or(index, |w| w.max(index));
        self.snapshot_request.set(Some(wanted));
    }

    /// The latest durable state-machine snapshot, with its data; what a
    /// restarting node restores its state machine from.
    pub fn state_machine_snapshot(&self) -> Result<Option<Snapshot>> {
        match self.durable.snapshot {
            None => Ok(None),
            Some(info) => self.load_snapshot(info).map(Some),
        }
    }

    // ----- staging -------------------------------------------------------

    /// Stages `entries` at the end of the log, first deleting any staged or
    /// durable entries at or after `entries[0].index` (a conflicting suffix
    /// that the leader overwrote).
    ///
    /// Refused: non-consecutive indexes, decreasing terms, a gap after the
    /// last entry, overwriting compacted entries, index `u64::MAX`, or an
    /// entry larger than [`MAX_ENTRY_BYTES`].
    pub fn append(&mut self, entries: &[Entry], batch: &mut WriteBatch) -> Result<()> {
        let (Some(first), Some(last)) = (entries.first(), entries.last()) else {
            return Ok(());
        };
        let invalid = |reason: String| {
            Err(Error::InvalidAppend {
                shard_id: self.shard_id,
                reason,
            })
        };
        for pair in entries.windows(2) {
            if pair[0].index.checked_add(1) != Some(pair[1].index) {
                return invalid(format!(
                    "indexes not consecutive: {} then {}",
                    pair[0].index, pair[1].index
                ));
            }
            if pair[1].term < pair[0].term {
                return invalid(format!(
                    "term decreases at index {}: {} then {}",
                    pair[1].index, pair[0].term, pair[1].term
                ));
            }
        }
        if last.index == u64::MAX {
            // Reserved so that `last_index + 1` never overflows.
            return invalid("index u64::MAX is reserved".to_string());
        }
        let staged = &self.staged;
        if first.index < staged.first_index() {
            return invalid(format!(
                "first index {} would overwrite compacted log (first index {})",
                first.index,
                staged.first_index()
            ));
        }
        if first.index > staged.log.last_index + 1 {
            return invalid(format!(
                "gap: first index {} after last index {}",
                first.index, staged.log.last_index
            ));
        }
        let prev_term = self.view_term(first.index - 1)?;
        if first.term < prev_term {
            return invalid(format!(
                "term {} at index {} is below term {prev_term} of the entry before it",
                first.term, first.index
            ));
        }

        let mut local = WriteBatch::new();
        for entry in entries {
            let bytes = encode(entry)?;
            if bytes.len() > MAX_ENTRY_BYTES {
                return Err(Error::ValueTooLarge {
                    what: "log entry",
                    size_bytes: bytes.len(),
                    limit_bytes: MAX_ENTRY_BYTES,
                });
            }
            local.put(Cf::Raft, keys::log_key(self.shard_id, entry.index), bytes);
        }
        if last.index < staged.log.last_index {
            // The new entries end before the old log did: the old tail
            // conflicts with them and must go.
            let (start, end) =
                keys::log_range(self.shard_id, last.index + 1, staged.log.last_index + 1);
            local.delete_range(Cf::Raft, start, end);
        }
        self.stage(StagedOp::Append(entries.to_vec()), local, batch)
    }

    /// Stages a new hard state.
    ///
    /// Refused (a caller bug, caught before it reaches disk): a lower term, a
    /// changed vote within the same term, a lower commit index, or a commit
    /// index past the staged last index. Stage a `Ready`'s entries before its
    /// hard state.
    pub fn set_hard_state(&mut self, hs: &HardState, batch: &mut WriteBatch) -> Result<()> {
        let old = &self.staged.hard_state;
        let reason = if hs.term < old.term {
            Some(format!("term goes back from {} to {}", old.term, hs.term))
        } else if hs.term == old.term && old.vote != 0 && hs.vote != old.vote {
            Some(format!(
                "vote changes from {} to {} within term {}",
                old.vote, hs.vote, hs.term
            ))
        } else if hs.commit < old.commit {
            Some(format!(
                "commit goes back from {} to {}",
                old.commit, hs.commit
            ))
        } else if hs.commit > self.staged.log.last_index {
            Some(format!(
                "commit {} is past last index {}",
                hs.commit, self.staged.log.last_index
            ))
        } else {
            None
        };
        if let Some(reason) = reason {
            return Err(Error::InvalidState {
                shard_id: self.shard_id,
                reason,
            });
        }
        self.stage(StagedOp::HardState(hs.clone()), WriteBatch::new(), batch)
    }

    /// Stages a commit-index change, keeping term and vote (for a
    /// `LightReady::commit_index`).
    pub fn set_commit_index(&mut self, commit: u64, batch: &mut WriteBatch) -> Result<()> {
        let mut hs = self.staged.hard_state.clone();
        hs.commit = commit;
        self.set_hard_state(&hs, batch)
    }

    /// Stages a new conf state (after applying a conf change, or to
    /// bootstrap a new shard's initial voters on every initial replica).
    pub fn set_conf_state(&mut self, cs: &ConfState, batch: &mut WriteBatch) -> Result<()> {
        self.stage(StagedOp::ConfState(cs.clone()), WriteBatch::new(), batch)
    }

    /// Stages the applied index. Refused if past the staged commit index.
    pub fn set_applied_index(&mut self, index: u64, batch: &mut WriteBatch) -> Result<()> {
        if index > self.staged.hard_state.commit {
            return Err(Error::InvalidState {
                shard_id: self.shard_id,
                reason: format!(
                    "applied index {index} is past commit {}",
                    self.staged.hard_state.commit
                ),
            });
        }
        self.stage(StagedOp::Applied(index), WriteBatch::new(), batch)
    }

    /// Stages a snapshot received from the leader: the whole log is replaced
    /// by the snapshot's truncation point, the hard state's commit and term
    /// are raised to it, the conf state and applied index are set from it,
    /// and its data is saved as this shard's latest state-machine snapshot
    /// (so that the node can restore from it after a restart, and serve it
    /// to other peers).
    ///
    /// Refused as [`Error::SnapshotOutOfDate`] if it is not newer than the
    /// log's truncation point or the latest saved snapshot.
    pub fn apply_snapshot(&mut self, snapshot: &Snapshot, batch: &mut WriteBatch) -> Result<()> {
        let meta = snapshot.get_metadata();
        let info = SnapshotInfo {
            index: meta.index,
            term: meta.term,
        };
        let out_of_date = |reason: String| {
            Err(Error::SnapshotOutOfDate {
                shard_id: self.shard_id,
                snapshot_index: info.index,
                reason,
            })
        };
        if info.index == u64::MAX {
            return Err(Error::InvalidSnapshot {
                shard_id: self.shard_id,
                reason: "index u64::MAX is reserved".to_string(),
            });
        }
        if info.index <= self.staged.log.truncated_index {
            return out_of_date(format!(
                "log already truncated at {}",
                self.staged.log.truncated_index
            ));
        }
        if let Some(latest) = self.staged.snapshot {
            if info.index < latest.index {
                return out_of_date(format!("latest saved snapshot is at {}", latest.index));
            }
        }
        check_snapshot_size(snapshot.get_data().len())?;

        let mut local = WriteBatch::new();
        let (start, end) = keys::log_range_all(self.shard_id);
        local.delete_range(Cf::Raft, start, end);
        local.put(
            Cf::Apply,
            keys::shard_key(keys::TAG_SNAPSHOT_DATA, self.shard_id),
            snapshot.get_data().to_vec(),
        );
        let op = StagedOp::ApplySnapshot {
            info,
            conf_state: meta.get_conf_state().clone(),
        };
        self.stage(op, local, batch)
    }

    /// Stages deletion of every log entry with index `<= compact_index`,
    /// keeping that entry's term for `term(compact_index)`.
    ///
    /// A no-op if already compacted that far. Refused past the staged last
    /// index, or past the latest state-machine snapshot (see module docs).
    pub fn compact(&mut self, compact_index: u64, batch: &mut WriteBatch) -> Result<()> {
        if compact_index <= self.staged.log.truncated_index {
            return Ok(());
        }
        let invalid = |reason: String| {
            Err(Error::InvalidCompaction {
                shard_id: self.shard_id,
                reason,
            })
        };
        if compact_index > self.staged.log.last_index {
            return invalid(format!(
                "compact index {compact_index} is past last index {}",
                self.staged.log.last_index
            ));
        }
        match self.staged.snapshot {
            Some(snap) if snap.index >= compact_index => {}
            latest => {
                return invalid(format!(
                    "compact index {compact_index} is not covered by a state-machine snapshot \
                     (latest {latest:?})"
                ))
            }
        }
        let term = self.view_term(compact_index)?;
        let mut local = WriteBatch::new();
        let (start, end) = keys::log_range(
            self.shard_id,
            self.staged.log.truncated_index + 1,
            compact_index + 1,
        );
        local.delete_range(Cf::Raft, start, end);
        self.stage(
            StagedOp::Compact {
                index: compact_index,
                term,
            },
            local,
            batch,
        )
    }

    /// Stages a state-machine snapshot taken at `index` (the state after
    /// applying entry `index`), replacing the previous one. `data` is opaque
    /// to this crate; raft-rs sends it to peers that fell behind the log.
    ///
    /// Refused: index 0, index past the staged commit index, older than the
    /// previous snapshot or the log's truncation point, a `term` that does
    /// not match the log, or data larger than [`MAX_SNAPSHOT_DATA_BYTES`].
    pub fn save_state_machine_snapshot(
        &mut self,
        index: u64,
        term: u64,
        conf_state: &ConfState,
        data: &[u8],
        batch: &mut WriteBatch,
    ) -> Result<()> {
        let invalid = |reason: String| {
            Err(Error::InvalidSnapshot {
                shard_id: self.shard_id,
                reason,
            })
        };
        if index == 0 {
            return invalid("index 0 is the empty snapshot".to_string());
        }
        if index > self.staged.hard_state.commit {
            return invalid(format!(
                "index {index} is past commit {}",
                self.staged.hard_state.commit
            ));
        }
        let out_of_date = |reason: String| {
            Err(Error::SnapshotOutOfDate {
                shard_id: self.shard_id,
                snapshot_index: index,
                reason,
            })
        };
        if let Some(latest) = self.staged.snapshot {
            if index < latest.index {
                return out_of_date(format!("latest saved snapshot is at {}", latest.index));
            }
        }
        if index < self.staged.log.truncated_index {
            return out_of_date(format!(
                "log already truncated at {}",
                self.staged.log.truncated_index
            ));
        }
        let log_term = self.view_term(index)?;
        if log_term != term {
            return invalid(format!(
                "term {term} does not match term {log_term} of entry {index}"
            ));
        }
        check_snapshot_size(data.len())?;

        let info = SnapshotInfo { index, term };
        let mut local = WriteBatch::new();
        local.put(
            Cf::Apply,
            keys::shard_key(keys::TAG_SNAPSHOT_META, self.shard_id),
            encode(&snapshot_metadata(info, conf_state))?,
        );
        local.put(
            Cf::Apply,
            keys::shard_key(keys::TAG_SNAPSHOT_DATA, self.shard_id),
            data.to_vec(),
        );
        self.stage(StagedOp::SaveSnapshot(info), local, batch)
    }

    /// Stages deletion of everything this shard stored (log, states, applied
    /// index, snapshot), e.g. when its replica moves off this node. The
    /// storage is empty afterwards, like a never-seen shard.
    pub fn destroy(&mut self, batch: &mut WriteBatch) -> Result<()> {
        let mut local = WriteBatch::new();
        let (start, end) = keys::log_range_all(self.shard_id);
        local.delete_range(Cf::Raft, start, end);
        for tag in [
            keys::TAG_HARD_STATE,
            keys::TAG_CONF_STATE,
            keys::TAG_LOG_STATE,
        ] {
            local.delete(Cf::Raft, keys::shard_key(tag, self.shard_id));
        }
        for tag in [
            keys::TAG_APPLIED,
            keys::TAG_SNAPSHOT_META,
            keys::TAG_SNAPSHOT_DATA,
        ] {
            local.delete(Cf::Apply, keys::shard_key(tag, self.shard_id));
        }
        // `stage` re-puts records that changed; after Destroy every record is
        // at its default, so suppress those puts with a dedicated path.
        let op = StagedOp::Destroy;
        self.staged.apply(&op);
        self.cache.clear();
        self.push_pending(op);
        batch.append(&mut local);
        Ok(())
    }

    fn push_pending(&mut self, op: StagedOp) {
        self.pending.push_back((self.next_mark, op));
        self.next_mark += 1;
    }

    /// Reports everything staged so far durable: for callers that write
    /// each batch synchronously before staging the next.
    pub fn on_persisted(&mut self) {
        self.on_persisted_through(self.staged_mark());
    }

    /// Reports the ops staged up to `mark` (a [`Self::staged_mark`])
    /// durable: call once the batch holding them was written. Later ops
    /// stay pending.
    pub fn on_persisted_through(&mut self, mark: u64) {
        debug_assert!(
            mark <= self.staged_mark(),
            "mark {mark} was never handed out"
        );
        while self.pending.front().is_some_and(|(m, _)| *m <= mark) {
            if let Some((_, op)) = self.pending.pop_front() {
                self.durable.apply(&op);
            }
        }
        if self.pending.is_empty() {
            // Pair assertion: replaying every pending op on the durable
            // view must land exactly on the staged view validation used.
            debug_assert_eq!(self.durable, self.staged);
            // What was kept only because it was not durable may go now.
            self.cache.evict(None);
        }
        debug_assert!(self
            .cache
            .first_index()
            .is_none_or(|first| first >= self.staged.first_index()));
    }

    /// Forgets every staged change: call when the batch holding them was
    /// not written (or was discarded). The cache, which held staged
    /// entries too, starts again from the disk.
    pub fn abort_staged(&mut self) {
        self.pending.clear();
        self.staged = self.durable.clone();
        self.cache.clear();
    }

    /// Applies `op` to the staged view, then moves `local` plus the records
    /// whose value `op` changed into `batch`. Nothing fails after the first
    /// mutation, which is what makes staging all-or-nothing.
    fn stage(&mut self, op: StagedOp, mut local: WriteBatch, batch: &mut WriteBatch) -> Result<()> {
        let mut next = self.staged.clone();
        next.apply(&op);
        let id = self.shard_id;
        if next.log != self.staged.log {
            local.put(
                Cf::Raft,
                keys::shard_key(keys::TAG_LOG_STATE, id),
                next.log.encode(),
            );
        }
        if next.hard_state != self.staged.hard_state {
            local.put(
                Cf::Raft,
                keys::shard_key(keys::TAG_HARD_STATE, id),
                encode(&next.hard_state)?,
            );
        }
        if next.conf_state != self.staged.conf_state {
            local.put(
                Cf::Raft,
                keys::shard_key(keys::TAG_CONF_STATE, id),
                encode(&next.conf_state)?,
            );
        }
        if next.applied_index != self.staged.applied_index {
            local.put(
                Cf::Apply,
                keys::shard_key(keys::TAG_APPLIED, id),
                next.applied_index.to_be_bytes().to_vec(),
            );
        }
        if let StagedOp::ApplySnapshot { info, conf_state } = &op {
            // SaveSnapshot writes its own metadata; ApplySnapshot's comes from
            // the received snapshot.
            local.put(
                Cf::Apply,
                keys::shard_key(keys::TAG_SNAPSHOT_META, id),
                encode(&snapshot_metadata(*info, conf_state))?,
            );
        }
        self.staged = next;
        match &op {
            StagedOp::Append(entries) => {
                let keep_from = (self.unpersisted_from())
                    .into_iter()
                    .chain(entries.first().map(|e| e.index))
                    .min();
                self.cache.append(entries, keep_from);
            }
            StagedOp::Compact { index, .. } => self.cache.compact_to(*index),
            StagedOp::ApplySnapshot { .. } | StagedOp::Destroy => self.cache.clear(),
            StagedOp::HardState(_)
            | StagedOp::ConfState(_)
            | StagedOp::Applied(_)
            | StagedOp::SaveSnapshot(_) => {}
        }
        self.push_pending(op);
        batch.append(&mut local);
        Ok(())
    }

    // ----- reads ---------------------------------------------------------

    /// Term of entry `index` in the staged view (durable + pending): the
    /// log state's bounds, then the cache (which holds every entry not yet
    /// durable), then the engine (stable below the cache).
    fn view_term(&self, index: u64) -> Result<u64> {
        if let Some(term) = self.term_at_bounds(index, &self.staged)? {
            return Ok(term);
        }
        if let Some(e) = self.cache.get(index) {
            return Ok(e.term);
        }
        self.check_durable_read(index)?;
        Ok(self.load_entry(index)?.term)
    }

    /// Pair assertion of the cache rule: an entry read from the engine is
    /// below every entry a pending write touches.
    fn check_durable_read(&self, index: u64) -> Result<()> {
        match self.unpersisted_from() {
            Some(from) if index >= from => Err(Error::InvalidState {
                shard_id: self.shard_id,
                reason: format!(
                    "entry {index} is not durable yet (pending from {from}) and not cached"
                ),
            }),
            _ => Ok(()),
        }
    }

    /// The term of `index` when the log state alone answers it (the
    /// truncation point or the last entry), an error when `index` lies
    /// outside the log, `None` when the entry itself must be looked at.
    fn term_at_bounds(&self, index: u64, s: &ShardState) -> Result<Option<u64>> {
        if index == s.log.truncated_index {
            return Ok(Some(s.log.truncated_term));
        }
        if index < s.log.truncated_index {
            return Err(self.compacted(index, s));
        }
        if index > s.log.last_index {
            return Err(self.unavailable(index, s));
        }
        if index == s.log.last_index {
            return Ok(Some(s.last_term));
        }
        Ok(None)
    }

    fn compacted(&self, index: u64, s: &ShardState) -> Error {
        Error::Compacted {
            shard_id: self.shard_id,
            index,
            first_index: s.first_index(),
        }
    }

    fn unavailable(&self, index: u64, s: &ShardState) -> Error {
        Error::Unavailable {
            shard_id: self.shard_id,
            index,
            last_index: s.log.last_index,
        }
    }

    /// Reads one entry that the durable log state says exists.
    fn load_entry(&self, index: u64) -> Result<Entry> {
        let key = keys::log_key(self.shard_id, index);
        let Some(bytes) = self.engine.get(Cf::Raft, &key)? else {
            return Err(Error::corruption(
                Cf::Raft,
                &key,
                format!(
                    "entry missing inside log [{}, {}]",
                    self.durable.first_index(),
                    self.durable.log.last_index
                ),
            ));
        };
        decode_entry(&key, index, &bytes)
    }

    /// Entries `[low, high)` of the staged log, at most `max_size` bytes
    /// (but always at least one entry if the range is not empty), as
    /// raft-rs specifies.
    pub fn read_entries(&self, low: u64, high: u64, max_size: Option<u64>) -> Result<Vec<Entry>> {
        let s = &self.staged;
        if low > high {
            return Err(Error::InvalidRange(format!(
                "entries: low {low} > high {high}"
            )));
        }
        if low < s.first_index() {
            return Err(self.compacted(low, s));
        }
        if high > s.log.last_index + 1 {
            return Err(self.unavailable(high - 1, s));
        }
        if low == high {
            return Ok(Vec::new());
        }
        let mut limiter = SizeLimiter::new(max_size);
        let mut out = Vec::new();
        // [low, split) from the engine, [split, high) from the cache.
        let split = self
            .cache
            .first_index()
            .map_or(high, |first| first.clamp(low, high));

        if low < split {
            self.check_durable_read(split - 1)?;
            let (start, end) = keys::log_range(self.shard_id, low, split);
            let mut expected = low;
            let shard_id = self.shard_id;
            self.engine
                .iterate(Cf::Raft, &start, &end, &mut |key, value| {
                    match keys::parse_log_key(key) {
                        Some((sid, idx)) if sid == shard_id && idx == expected => {}
                        _ => {
                            return Err(Error::corruption(
                                Cf::Raft,
                                key,
                                format!("expected log entry {expected} of shard {shard_id}"),
                            ))
                        }
                    }
                    let entry = decode_entry(key, expected, value)?;
                    if !limiter.admit(&entry) {
                        return Ok(false);
                    }
                    out.push(entry);
                    expected += 1;
                    Ok(true)
                })?;
            if limiter.full {
                return Ok(out);
            }
            if expected != split {
                return Err(Error::corruption(
                    Cf::Raft,
                    &keys::log_key(shard_id, expected),
                    format!(
                        "entry missing inside log [{}, {}]",
                        s.first_index(),
                        s.log.last_index
                    ),
                ));
            }
        }
        let mut from_cache = 0u64;
        for entry in self.cache.range(split, high) {
            if !limiter.admit(entry) {
                return Ok(out);
            }
            out.push(entry.clone());
            from_cache += 1;
        }
        // Pair assertion for the cache invariant (contiguous up to last).
        if from_cache != high - split {
            return Err(Error::InvalidState {
                shard_id: self.shard_id,
                reason: format!("entry cache returned {from_cache} entries for [{split}, {high})"),
            });
        }
        Ok(out)
    }

    fn load_snapshot(&self, info: SnapshotInfo) -> Result<Snapshot> {
        let meta_key = keys::shard_key(keys::TAG_SNAPSHOT_META, self.shard_id);
        let Some(meta) = load_message::<SnapshotMetadata, _>(&*self.engine, Cf::Apply, &meta_key)?
        else {
            return Err(Error::corruption(
                Cf::Apply,
                &meta_key,
                "snapshot metadata missing",
            ));
        };
        if meta.index != info.index || meta.term != info.term {
            return Err(Error::corruption(
                Cf::Apply,
                &meta_key,
                format!(
                    "snapshot metadata is ({}, {}), expected ({}, {})",
                    meta.index, meta.term, info.index, info.term
                ),
            ));
        }
        let data_key = keys::shard_key(keys::TAG_SNAPSHOT_DATA, self.shard_id);
        let Some(data) = self.engine.get(Cf::Apply, &data_key)? else {
            return Err(Error::corruption(
                Cf::Apply,
                &data_key,
                "snapshot data missing",
            ));
        };
        let mut snapshot = Snapshot::default();
        snapshot.set_metadata(meta);
        snapshot.data = data.into();
        Ok(snapshot)
    }
}

impl<E: Engine + ?Sized> raft::Storage for ShardStorage<E> {
    fn initial_state(&self) -> raft::Result<RaftState> {
        Ok(RaftState::new(
            self.durable.hard_state.clone(),
            self.durable.conf_state.clone(),
        ))
    }

    /// Never fetches asynchronously: entries come from the cache or one
    /// RocksDB range scan, which is fast enough for the store loop.
    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        _context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        Ok(self.read_entries(low, high, max_size.into())?)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        Ok(self.view_term(idx)?)
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(self.staged.first_index())
    }

    fn last_index(&self) -> raft::Result<u64> {
        Ok(self.staged.log.last_index)
    }

    /// The latest durable state-machine snapshot (none while a save or
    /// install is pending) if its index is
    /// `>= request_index` and its configuration includes the recipient `to`;
    /// otherwise `SnapshotTemporarilyUnavailable` (raft retries later) and
    /// the request is recorded for [`ShardStorage::take_snapshot_request`].
    fn snapshot(&self, request_index: u64, to: u64) -> raft::Result<Snapshot> {
        if self.snapshot_pending() {
            // Its write may be landing right now: neither the old nor the
            // new one can be read whole. raft-rs asks again later.
            return Err(Error::SnapshotTemporarilyUnavailable {
                shard_id: self.shard_id,
                request_index,
                latest_index: self.durable.snapshot.map(|l| l.index),
            }
            .into());
        }
        match self.durable.snapshot {
            Some(info) if info.index >= request_index => {
                let snap = self.load_snapshot(info)?;
                // A replica added after the snapshot was taken is not in its
                // configuration, and raft-rs on that replica rejects it:
                // ask for a newer one (taken after the replica was added).
                let cs = snap.get_metadata().get_conf_state();
                let knows_to = cs.voters.contains(&to)
                    || cs.learners.contains(&to)
                    || cs.voters_outgoing.contains(&to)
                    || cs.learners_next.contains(&to);
                if to == 0 || knows_to || (cs.voters.is_empty() && cs.learners.is_empty()) {
                    return Ok(snap);
                }
                let wanted = info.index + 1;
                let wanted = self
                    .snapshot_request
                    .get()
                    .map_or(wanted, |w| w.max(wanted));
                self.snapshot_request.set(Some(wanted));
                Err(Error::SnapshotTemporarilyUnavailable {
                    shard_id: self.shard_id,
                    request_index: wanted,
                    latest_index: Some(info.index),
                }
                .into())
            }
            latest => {
                let wanted = self
                    .snapshot_request
                    .get()
                    .map_or(request_index, |w| w.max(request_index));
                self.snapshot_request.set(Some(wanted));
                Err(Error::SnapshotTemporarilyUnavailable {
                    shard_id: self.shard_id,
                    request_index,
                    latest_index: latest.map(|l| l.index),
                }
                .into())
            }
        }
    }
}

/// raft-rs's size rule: the first entry always, then more while the running
/// total stays within the limit.
struct SizeLimiter {
    max: u64,
    used: u64,
    count: usize,
    full: bool,
}

impl SizeLimiter {
    fn new(max: Option<u64>) -> Self {
        SizeLimiter {
            max: max.unwrap_or(raft::NO_LIMIT),
            used: 0,
            count: 0,
            full: false,
        }
    }

    fn admit(&mut self, entry: &Entry) -> bool {
        let size = u64::from(entry.compute_size());
        if self.count > 0 && self.used.saturating_add(size) > self.max {
            self.full = true;
            return false;
        }
        self.used = self.used.saturating_add(size);
        self.count += 1;
        true
    }
}

fn snapshot_metadata(info: SnapshotInfo, conf_state: &ConfState) -> SnapshotMetadata {
    let mut meta = SnapshotMetadata {
        index: info.index,
        term: info.term,
        ..Default::default()
    };
    meta.set_conf_state(conf_state.clone());
    meta
}

fn check_snapshot_size(len: usize) -> Result<()> {
    if len > MAX_SNAPSHOT_DATA_BYTES {
        return Err(Error::ValueTooLarge {
            what: "state-machine snapshot",
            size_bytes: len,
            limit_bytes: MAX_SNAPSHOT_DATA_BYTES,
        });
    }
    Ok(())
}

fn encode<M: Message>(message: &M) -> Result<Vec<u8>> {
    Ok(message.write_to_bytes()?)
}

fn decode_entry(key: &[u8], index: u64, bytes: &[u8]) -> Result<Entry> {
    let entry = Entry::parse_from_bytes(bytes)
        .map_err(|e| Error::corruption(Cf::Raft, key, format!("bad entry: {e}")))?;
    if entry.index != index {
        return Err(Error::corruption(
            Cf::Raft,
            key,
            format!("entry under index {index} says index {}", entry.index),
        ));
    }
    Ok(entry)
}

fn load_message<M: Message, E: Engine + ?Sized>(
    engine: &E,
    cf: Cf,
    key: &[u8],
) -> Result<Option<M>> {
    match engine.get(cf, key)? {
        None => Ok(None),
        Some(bytes) => M::parse_from_bytes(&bytes)
            .map(Some)
            .map_err(|e| Error::corruption(cf, key, format!("bad protobuf: {e}"))),
    }
}

/// Callers pass exactly 8 bytes.
fn be_u64(bytes: &[u8]) -> u64 {
    let mut buf = [0u8; 8];
    buf.copy_from_slice(&bytes[..8]);
    u64::from_be_bytes(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_state_round_trips_and_rejects_garbage() {
        let state = LogState {
            truncated_index: 5,
            truncated_term: 2,
            last_index: 9,
        };
        let key = b"k";
        assert_eq!(LogState::decode(key, &state.encode()).ok(), Some(state));
        assert!(matches!(
            LogState::decode(key, &[1, 2, 3]),
            Err(Error::Corruption { .. })
        ));
        let mut wrong_version = state.encode();
        wrong_version[0] = 99;
        assert!(matches!(
            LogState::decode(key, &wrong_version),
            Err(Error::Corruption { .. })
        ));
        let backwards = LogState {
            truncated_index: 10,
            truncated_term: 2,
            last_index: 9,
        };
        assert!(matches!(
            LogState::decode(key, &backwards.encode()),
            Err(Error::Corruption { .. })
        ));
    }
}
