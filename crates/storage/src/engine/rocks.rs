//! [`Engine`] on RocksDB: one database per node, one column family per [`Cf`].
//!
//! All shards share this one instance so that a single synced write covers
//! every shard's `Ready` (group commit): one fsync per store-loop iteration
//! instead of one per shard.

use std::path::{Path, PathBuf};

use rocksdb::{ColumnFamily, ColumnFamilyDescriptor, DBCompressionType, Options, ReadOptions, DB};

use super::{check_range, Cf, Engine, IterCallback, WriteBatch, WriteOp};
use crate::error::{Error, Result};

/// Background flush/compaction threads. The node has 2 cores shared with the
/// Raft loop and gRPC; RocksDB's default (2) is right, set explicitly so that
/// a RocksDB upgrade does not change it silently.
const MAX_BACKGROUND_JOBS: i32 = 2;

/// Cap on the total WAL size before RocksDB forces memtable flushes. Raft-log
/// writes are dense and short-lived; without a cap the WAL can grow with the
/// memtables of the rarely-written `meta` cf pinning old log files.
const MAX_TOTAL_WAL_BYTES: u64 = 256 << 20;

/// Info LOG files RocksDB keeps in the data directory.
const KEEP_INFO_LOG_FILES: usize = 4;

/// What [`RocksEngine::memory`] reports, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineMemory {
    /// Active and immutable memtables (written, not yet flushed).
    pub memtable_bytes: u64,
    /// Blocks cached for reads.
    pub block_cache_bytes: u64,
    /// Index and filter blocks of open SST files held outside the cache.
    pub table_readers_bytes: u64,
}

/// RocksDB-backed engine.
pub struct RocksEngine {
    db: DB,
    path: PathBuf,
}

impl std::fmt::Debug for RocksEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RocksEngine")
            .field("path", &self.path)
            .finish()
    }
}

impl RocksEngine {
    /// Opens (creating if needed) the database at `path` with every [`Cf`].
    ///
    /// Column families found on disk that this version does not know are
    /// opened too (RocksDB refuses to open a database otherwise) and left
    /// untouched, so that a downgrade after an upgrade that added one still
    /// starts.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let mut db_opts = base_options();
        db_opts.create_if_missing(true);
        db_opts.create_missing_column_families(true);
        db_opts.set_max_background_jobs(MAX_BACKGROUND_JOBS);
        db_opts.set_max_total_wal_size(MAX_TOTAL_WAL_BYTES);
        db_opts.set_keep_log_file_num(KEEP_INFO_LOG_FILES);

        let mut names: Vec<String> = Cf::ALL.iter().map(|cf| cf.name().to_string()).collect();
        // A missing database has no CF list yet: that is the "create" case,
        // not an error. A real I/O problem resurfaces in `open` below.
        if let Ok(existing) = DB::list_cf(&db_opts, &path) {
            for name in existing {
                if name != rocksdb::DEFAULT_COLUMN_FAMILY_NAME && !names.contains(&name) {
                    names.push(name);
                }
            }
        }
        let descriptors = names.into_iter().map(|name| {
            let opts = cf_options(&name);
            ColumnFamilyDescriptor::new(name, opts)
        });
        let db = DB::open_cf_descriptors(&db_opts, &path, descriptors)?;
        Ok(RocksEngine { db, path })
    }

    /// Directory of the database.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Memory RocksDB holds for this database now, summed over the column
    /// families (each has its own block cache). Properties RocksDB cannot
    /// report count as 0: this feeds metrics, not decisions.
    pub fn memory(&self) -> EngineMemory {
        let mut m = EngineMemory::default();
        for cf in Cf::ALL {
            let Ok(handle) = self.cf(cf) else { continue };
            let prop = |name: &str| {
                self.db
                    .property_int_value_cf(handle, name)
                    .ok()
                    .flatten()
                    .unwrap_or(0)
            };
            m.memtable_bytes += prop("rocksdb.cur-size-all-mem-tables");
            m.block_cache_bytes += prop("rocksdb.block-cache-usage");
            m.table_readers_bytes += prop("rocksdb.estimate-table-readers-mem");
        }
        m
    }

    fn cf(&self, cf: Cf) -> Result<&ColumnFamily> {
        // Every Cf is created at open, so this only fails if the process
        // dropped one behind our back: report it rather than panic.
        self.db
            .cf_handle(cf.name())
            .ok_or_else(|| Error::corruption(cf, &[], "column family missing"))
    }
}

/// Memtable size of the `raft` cf. Log entries there are short-lived: they
/// are range-deleted once a snapshot covers them, and a flush drops what the
/// deletion covers. RocksDB's 64 MiB default held a minute or more of the
/// `seed` load's log per memtable (two of them) for no read benefit: the
/// entries just written are served from each shard's entry cache.
const RAFT_CF_WRITE_BUFFER_BYTES: usize = 32 << 20;

/// Memtable size of the `apply` cf: applied indexes and, mostly, snapshots
/// (a few MiB per shard, each replacing the previous one). A smaller
/// memtable flushes after a handful of snapshots instead of holding dozens.
const APPLY_CF_WRITE_BUFFER_BYTES: usize = 16 << 20;

/// Options of the column family named `name`: [`base_options`] plus the
/// memtable size of the [`Cf`] it is (unknown ones keep RocksDB's default).
fn cf_options(name: &str) -> Options {
    let mut opts = base_options();
    if name == Cf::Raft.name() {
        opts.set_write_buffer_size(RAFT_CF_WRITE_BUFFER_BYTES);
    } else if name == Cf::Apply.name() {
        opts.set_write_buffer_size(APPLY_CF_WRITE_BUFFER_BYTES);
    }
    opts
}

/// Options shared by the database and every column family.
fn base_options() -> Options {
    let mut opts = Options::default();
    // Only lz4 is compiled in (see the workspace manifest); RocksDB's default
    // (snappy) would make open fail with "not linked".
    opts.set_compression_type(DBCompressionType::Lz4);
    opts
}

impl Engine for RocksEngine {
    fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let handle = self.cf(cf)?;
        Ok(self.db.get_pinned_cf(handle, key)?.map(|v| v.to_vec()))
    }

    fn write(&self, batch: &WriteBatch, sync: bool) -> Result<()> {
        batch.validate()?;
        if batch.is_empty() {
            return Ok(());
        }
        let mut native = rocksdb::WriteBatch::default();
        for op in batch.ops() {
            match op {
                WriteOp::Put { cf, key, value } => native.put_cf(self.cf(*cf)?, key, value),
                WriteOp::Delete { cf, key } => native.delete_cf(self.cf(*cf)?, key),
                WriteOp::DeleteRange { cf, start, end } => {
                    // RocksDB rejects an empty range delete outright; for us it
                    // is a legitimate no-op.
                    if start < end {
                        native.delete_range_cf(self.cf(*cf)?, start, end);
                    }
                }
            }
        }
        let mut opts = rocksdb::WriteOptions::default();
        opts.set_sync(sync);
        self.db.write_opt(native, &opts)?;
        Ok(())
    }

    fn iterate(&self, cf: Cf, start: &[u8], end: &[u8], f: &mut IterCallback<'_>) -> Result<()> {
        check_range(cf, start, end)?;
        if start == end {
            return Ok(());
        }
        let handle = self.cf(cf)?;
        let mut opts = ReadOptions::default();
        opts.set_iterate_lower_bound(start);
        opts.set_iterate_upper_bound(end);
        // No prefix extractor is configured, but be explicit: a range scan
        // must see every key in the range.
        opts.set_total_order_seek(true);
        let mut iter = self.db.raw_iterator_cf_opt(handle, opts);
        iter.seek(start);
        while iter.valid() {
            let (Some(key), Some(value)) = (iter.key(), iter.value()) else {
                break;
            };
            if !f(key, value)? {
                return Ok(());
            }
            iter.next();
        }
        // `valid() == false` means either the end or an error: tell them apart.
        iter.status()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_reports_unflushed_writes_as_memtable_bytes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let engine = RocksEngine::open(dir.path().join("db")).expect("open");
        let before = engine.memory();
        let mut batch = WriteBatch::new();
        for i in 0u32..256 {
            batch.put(Cf::Apply, i.to_be_bytes().to_vec(), vec![7u8; 4096]);
        }
        engine.write(&batch, false).expect("write");
        let after = engine.memory();
        assert!(
            after.memtable_bytes >= before.memtable_bytes + 256 * 4096,
            "{before:?} -> {after:?}"
        );
    }
}
