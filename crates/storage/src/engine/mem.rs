//! In-memory [`Engine`]: one `BTreeMap` per column family behind a mutex.
//!
//! Exists for fast tests of the layers above the engine. It passes the same
//! conformance suite as [`super::RocksEngine`], which is what makes tests run
//! on it meaningful. "Durable" here means "visible to every clone": a clone
//! plays the role of reopening the same database after a restart.
//!
//! **Crash mode** ([`MemEngine::with_crash_mode`]) additionally keeps what a
//! synced write made durable apart from what unsynced writes only made
//! visible, so [`MemEngine::crash`] can lose the unsynced writes the way a
//! power cut loses what RocksDB had not yet synced: all of them, or (as a
//! write-ahead log that reached the disk in part) the oldest few. A synced
//! write makes every earlier write durable too, as a synced RocksDB write
//! syncs the whole log before it.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::{Arc, Mutex, MutexGuard};

use super::{check_range, Cf, Engine, IterCallback, WriteBatch, WriteOp};
use crate::error::{Error, Result};

type Table = BTreeMap<Vec<u8>, Vec<u8>>;
type Tables = [Table; Cf::ALL.len()];

#[derive(Debug, Default)]
struct State {
    /// What reads see: every write so far.
    live: Tables,
    /// Crash mode only: the tables as of the last synced write, and the
    /// unsynced writes since, oldest first.
    durable: Option<(Tables, Vec<WriteBatch>)>,
}

/// In-memory engine. Clones share the same data.
#[derive(Debug, Clone, Default)]
pub struct MemEngine {
    state: Arc<Mutex<State>>,
}

impl MemEngine {
    /// An empty engine; every write counts as durable.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty engine in crash mode: only synced writes (and the writes
    /// before them) survive [`MemEngine::crash`].
    pub fn with_crash_mode() -> Self {
        MemEngine {
            state: Arc::new(Mutex::new(State {
                live: Tables::default(),
                durable: Some((Tables::default(), Vec::new())),
            })),
        }
    }

    /// Simulates a crash: the unsynced writes after the oldest
    /// `keep_unsynced` ones are lost, and reads see the durable state from
    /// now on. Returns how many writes were lost. Outside crash mode every
    /// write is durable and nothing is lost.
    pub fn crash(&self, keep_unsynced: usize) -> Result<usize> {
        let mut state = self.lock()?;
        let State { live, durable } = &mut *state;
        let Some((tables, unsynced)) = durable.as_mut() else {
            return Ok(0);
        };
        let keep = keep_unsynced.min(unsynced.len());
        let lost = unsynced.len() - keep;
        for batch in unsynced.drain(..).take(keep) {
            apply(tables, &batch);
        }
        *live = tables.clone();
        Ok(lost)
    }

    /// Unsynced writes a crash would lose now (0 outside crash mode).
    pub fn unsynced_writes(&self) -> Result<usize> {
        Ok(self
            .lock()?
            .durable
            .as_ref()
            .map_or(0, |(_, unsynced)| unsynced.len()))
    }

    /// What a read of `key` would return after a crash that lost every
    /// unsynced write: the durable value (the live one outside crash
    /// mode). For checks that something is on disk, not merely visible.
    pub fn durable_get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let state = self.lock()?;
        let tables = state.durable.as_ref().map_or(&state.live, |(t, _)| t);
        Ok(tables[cf.ordinal()].get(key).cloned())
    }

    /// Whether any key in `[start, end)` of `cf` is durable (see
    /// [`MemEngine::durable_get`]).
    pub fn durable_has_any(&self, cf: Cf, start: &[u8], end: &[u8]) -> Result<bool> {
        check_range(cf, start, end)?;
        let state = self.lock()?;
        let tables = state.durable.as_ref().map_or(&state.live, |(t, _)| t);
        Ok(tables[cf.ordinal()]
            .range::<[u8], _>((Bound::Included(start), Bound::Excluded(end)))
            .next()
            .is_some())
    }

    fn lock(&self) -> Result<MutexGuard<'_, State>> {
        // A poisoned lock means a panic happened mid-operation elsewhere; the
        // tables may be half-updated, so refuse rather than serve them.
        self.state.lock().map_err(|_| Error::Poisoned)
    }
}

/// Applies a validated batch in order. Nothing here can fail, so applying
/// in place is atomic.
fn apply(tables: &mut Tables, batch: &WriteBatch) {
    for op in batch.ops() {
        match op {
            WriteOp::Put { cf, key, value } => {
                tables[cf.ordinal()].insert(key.clone(), value.clone());
            }
            WriteOp::Delete { cf, key } => {
                tables[cf.ordinal()].remove(key);
            }
            WriteOp::DeleteRange { cf, start, end } => {
                let table = &mut tables[cf.ordinal()];
                let doomed: Vec<Vec<u8>> = table
                    .range::<[u8], _>((Bound::Included(&start[..]), Bound::Excluded(&end[..])))
                    .map(|(k, _)| k.clone())
                    .collect();
                for key in doomed {
                    table.remove(&key);
                }
            }
        }
    }
}

impl Engine for MemEngine {
    fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self.lock()?.live[cf.ordinal()].get(key).cloned())
    }

    fn write(&self, batch: &WriteBatch, sync: bool) -> Result<()> {
        batch.validate()?;
        if batch.is_empty() {
            return Ok(());
        }
        let mut state = self.lock()?;
        apply(&mut state.live, batch);
        if let Some((tables, unsynced)) = state.durable.as_mut() {
            if sync {
                for earlier in unsynced.drain(..) {
                    apply(tables, &earlier);
                }
                apply(tables, batch);
            } else {
                unsynced.push(batch.clone());
            }
        }
        Ok(())
    }

    fn iterate(&self, cf: Cf, start: &[u8], end: &[u8], f: &mut IterCallback<'_>) -> Result<()> {
        check_range(cf, start, end)?;
        let state = self.lock()?;
        let range = state.live[cf.ordinal()]
            .range::<[u8], _>((Bound::Included(start), Bound::Excluded(end)));
        for (key, value) in range {
            if !f(key, value)? {
                break;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(key: &str, value: &str) -> WriteBatch {
        let mut batch = WriteBatch::new();
        batch.put(Cf::Raft, key.as_bytes(), value.as_bytes());
        batch
    }

    fn get(engine: &MemEngine, key: &str) -> Option<String> {
        engine
            .get(Cf::Raft, key.as_bytes())
            .unwrap()
            .map(|v| String::from_utf8(v).unwrap())
    }

    #[test]
    fn a_crash_loses_the_unsynced_writes_and_keeps_the_synced_ones() {
        let engine = MemEngine::with_crash_mode();
        engine.write(&put("a", "1"), true).unwrap();
        engine.write(&put("b", "1"), false).unwrap();
        engine.write(&put("a", "2"), false).unwrap();
        assert_eq!(get(&engine, "a").as_deref(), Some("2"));
        assert_eq!(engine.unsynced_writes().unwrap(), 2);
        assert_eq!(engine.crash(0).unwrap(), 2);
        assert_eq!(get(&engine, "a").as_deref(), Some("1"));
        assert_eq!(get(&engine, "b"), None);
        assert_eq!(engine.unsynced_writes().unwrap(), 0);
    }

    #[test]
    fn a_synced_write_makes_the_unsynced_writes_before_it_durable() {
        let engine = MemEngine::with_crash_mode();
        engine.write(&put("a", "1"), false).unwrap();
        let mut range = WriteBatch::new();
        range.delete_range(Cf::Raft, b"a".to_vec(), b"b".to_vec());
        engine.write(&range, false).unwrap();
        engine.write(&put("c", "1"), true).unwrap();
        engine.write(&put("d", "1"), false).unwrap();
        assert_eq!(engine.crash(0).unwrap(), 1);
        assert_eq!(get(&engine, "a"), None);
        assert_eq!(get(&engine, "c").as_deref(), Some("1"));
        assert_eq!(get(&engine, "d"), None);
    }

    #[test]
    fn a_crash_can_keep_the_oldest_unsynced_writes_in_order() {
        let engine = MemEngine::with_crash_mode();
        engine.write(&put("a", "1"), false).unwrap();
        engine.write(&put("a", "2"), false).unwrap();
        engine.write(&put("b", "1"), false).unwrap();
        assert_eq!(engine.crash(1).unwrap(), 2);
        assert_eq!(get(&engine, "a").as_deref(), Some("1"));
        assert_eq!(get(&engine, "b"), None);
    }

    #[test]
    fn durable_reads_see_only_what_a_crash_would_keep() {
        let engine = MemEngine::with_crash_mode();
        engine.write(&put("a", "1"), true).unwrap();
        engine.write(&put("b", "2"), false).unwrap();
        let durable = |key: &str| engine.durable_get(Cf::Raft, key.as_bytes()).unwrap();
        assert_eq!(durable("a"), Some(b"1".to_vec()));
        assert_eq!(durable("b"), None, "visible but not synced");
        assert_eq!(get(&engine, "b").as_deref(), Some("2"));
        assert!(engine.durable_has_any(Cf::Raft, b"a", b"c").unwrap());
        assert!(!engine.durable_has_any(Cf::Raft, b"b", b"c").unwrap());
        engine.write(&put("c", "3"), true).unwrap();
        assert_eq!(
            durable("b"),
            Some(b"2".to_vec()),
            "synced by the later write"
        );
        let plain = MemEngine::new();
        plain.write(&put("a", "1"), false).unwrap();
        assert_eq!(
            plain.durable_get(Cf::Raft, b"a").unwrap(),
            Some(b"1".to_vec())
        );
    }

    #[test]
    fn without_crash_mode_every_write_survives_a_crash() {
        let engine = MemEngine::new();
        engine.write(&put("a", "1"), false).unwrap();
        assert_eq!(engine.crash(0).unwrap(), 0);
        assert_eq!(get(&engine, "a").as_deref(), Some("1"));
    }
}
