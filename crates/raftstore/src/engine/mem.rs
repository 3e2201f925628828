//! In-memory [`Engine`]: one `BTreeMap` per column family behind a mutex.
//!
//! Exists for fast tests of the layers above the engine. It passes the same
//! conformance suite as [`super::RocksEngine`], which is what makes tests run
//! on it meaningful. "Durable" here means "visible to every clone": a clone
//! plays the role of reopening the same database after a restart.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::{Arc, Mutex, MutexGuard};

use super::{check_range, Cf, Engine, IterCallback, WriteBatch, WriteOp};
use crate::error::{Error, Result};

type Table = BTreeMap<Vec<u8>, Vec<u8>>;

/// In-memory engine. Clones share the same data.
#[derive(Debug, Clone, Default)]
pub struct MemEngine {
    tables: Arc<Mutex<[Table; Cf::ALL.len()]>>,
}

impl MemEngine {
    /// An empty engine.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> Result<MutexGuard<'_, [Table; Cf::ALL.len()]>> {
        // A poisoned lock means a panic happened mid-operation elsewhere; the
        // tables may be half-updated, so refuse rather than serve them.
        self.tables.lock().map_err(|_| Error::Poisoned)
    }
}

impl Engine for MemEngine {
    fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self.lock()?[cf.ordinal()].get(key).cloned())
    }

    fn write(&self, batch: &WriteBatch, _sync: bool) -> Result<()> {
        batch.validate()?;
        if batch.is_empty() {
            return Ok(());
        }
        let mut tables = self.lock()?;
        // Validation above is the only failure point, so applying in place is
        // atomic: nothing below can fail half-way.
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
        Ok(())
    }

    fn iterate(&self, cf: Cf, start: &[u8], end: &[u8], f: &mut IterCallback<'_>) -> Result<()> {
        check_range(cf, start, end)?;
        let tables = self.lock()?;
        let range =
            tables[cf.ordinal()].range::<[u8], _>((Bound::Included(start), Bound::Excluded(end)));
        for (key, value) in range {
            if !f(key, value)? {
                break;
            }
        }
        Ok(())
    }
}
