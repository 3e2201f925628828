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
        let descriptors = names
            .into_iter()
            .map(|name| ColumnFamilyDescriptor::new(name, base_options()));
        let db = DB::open_cf_descriptors(&db_opts, &path, descriptors)?;
        Ok(RocksEngine { db, path })
    }

    /// Directory of the database.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn cf(&self, cf: Cf) -> Result<&ColumnFamily> {
        // Every Cf is created at open, so this only fails if the process
        // dropped one behind our back: report it rather than panic.
        self.db
            .cf_handle(cf.name())
            .ok_or_else(|| Error::corruption(cf, &[], "column family missing"))
    }
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
