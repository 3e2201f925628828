//! [`Engine`] on RocksDB: one database per node, one column family per [`Cf`].
//!
//! All shards share this one instance so that a single synced write covers
//! every shard's `Ready` (group commit): one fsync per store-loop iteration
//! instead of one per shard.

use std::path::{Path, PathBuf};

use rocksdb::{
    BlockBasedOptions, Cache, ColumnFamily, ColumnFamilyDescriptor, DBCompressionType,
    DBRecoveryMode, Options, ReadOptions, DB,
};

use super::{check_range, Cf, Engine, IterCallback, WriteBatch, WriteOp};
use crate::error::{Error, Result};

/// Background flush/compaction threads. The node has 2 cores shared with the
/// Raft loop and gRPC; RocksDB's default (2) is right, set explicitly so that
/// a RocksDB upgrade does not change it silently.
const MAX_BACKGROUND_JOBS: i32 = 2;

/// Cap on the total WAL size before RocksDB flushes the memtables that pin
/// the oldest log file. A log file is only deleted once every column family
/// has flushed what it holds, and the rarely-written `meta` and `apply` cfs
/// fill their memtables slowly, so without a low cap the node keeps every
/// log file up to the cap: the first 1-hour soak saw a node that never
/// restarted carry 220 MiB of log files (all of it replayed at a restart).
/// 64 MiB is about 20 minutes of the `seed` load's writes on this machine.
const MAX_TOTAL_WAL_BYTES: u64 = 64 << 20;

/// One block cache shared by every column family. RocksDB's default today is
/// the same (one 32 MiB cache the cfs share); set here so that a RocksDB
/// upgrade cannot change it silently, and so that the metrics count it once
/// (they summed it per cf, three times its size). Reads are rare: the entry
/// cache and the in-memory tables serve the hot path. (A cap on all
/// memtables together is deliberately not set: with 16 MiB cfs it coincided
/// with flush stalls, docs/benchmarks.md.)
const BLOCK_CACHE_BYTES: usize = 32 << 20;

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
        let cache = Cache::new_lru_cache(BLOCK_CACHE_BYTES);
        let mut db_opts = base_options(&cache);
        db_opts.create_if_missing(true);
        db_opts.create_missing_column_families(true);
        db_opts.set_max_background_jobs(MAX_BACKGROUND_JOBS);
        db_opts.set_max_total_wal_size(MAX_TOTAL_WAL_BYTES);
        db_opts.set_keep_log_file_num(KEEP_INFO_LOG_FILES);
        // RocksDB's default (point-in-time) recovery stops replaying the log
        // at the first broken record and opens anyway, silently without
        // every synced write after it: for a Raft replica, votes and log
        // entries it acknowledged (tokens could be handed out twice). Only
        // a torn record at the very end, a write a crash cut short and so
        // never acknowledged, may be dropped; anything else refuses to open
        // as damage (`Error::Damaged`).
        db_opts.set_wal_recovery_mode(DBRecoveryMode::TolerateCorruptedTailRecords);
        // Check every table file against the manifest at open (the default
        // today; set so that an upgrade cannot turn it off).
        db_opts.set_paranoid_checks(true);

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
            let opts = cf_options(&name, &cache);
            ColumnFamilyDescriptor::new(name, opts)
        });
        let db = DB::open_cf_descriptors(&db_opts, &path, descriptors)
            .map_err(|e| name_the_damaged_file(Error::from(e), &path))?;
        Ok(RocksEngine { db, path })
    }

    /// Directory of the database.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Memory RocksDB holds for this database now: memtables and table
    /// readers summed over the column families, the block cache once (every
    /// cf reports the one shared cache). Properties RocksDB cannot report
    /// count as 0: this feeds metrics, not decisions.
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
            m.block_cache_bytes = m.block_cache_bytes.max(prop("rocksdb.block-cache-usage"));
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

/// Most of RocksDB's info log read back to find a damaged file's name.
const INFO_LOG_TAIL_BYTES: u64 = 1 << 20;

/// Fills in the file of an [`Error::Damaged`] RocksDB's message did not name
/// (a broken log record says only "checksum mismatch"), from the warning
/// its info log (`LOG` in the database directory) wrote when it found it.
fn name_the_damaged_file(e: Error, dir: &Path) -> Error {
    let Error::Damaged { file: None, detail } = e else {
        return e;
    };
    let file = read_tail(&dir.join("LOG"), INFO_LOG_TAIL_BYTES).and_then(|log| {
        log.lines()
            .rev()
            .filter(|line| line.contains("Corruption"))
            .find_map(crate::error::damaged_file)
    });
    Error::Damaged { file, detail }
}

/// The last `max_bytes` of the file at `path` (lossily as text), if it
/// can be read.
fn read_tail(path: &Path, max_bytes: u64) -> Option<String> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(path).ok()?;
    let len = f.metadata().ok()?.len();
    f.seek(SeekFrom::Start(len.saturating_sub(max_bytes)))
        .ok()?;
    let mut bytes = Vec::new();
    f.take(max_bytes).read_to_end(&mut bytes).ok()?;
    Some(String::from_utf8_lossy(&bytes).into_owned())
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

/// Memtable size of the `meta` cf and of any cf this version does not know:
/// a few small records written rarely. RocksDB's 64 MiB default would only
/// ever be reached by the WAL cap, never by the data.
const SMALL_CF_WRITE_BUFFER_BYTES: usize = 4 << 20;

/// Options of the column family named `name`: [`base_options`] plus the
/// memtable size of the [`Cf`] it is.
fn cf_options(name: &str, cache: &Cache) -> Options {
    let mut opts = base_options(cache);
    let buffer = if name == Cf::Raft.name() {
        RAFT_CF_WRITE_BUFFER_BYTES
    } else if name == Cf::Apply.name() {
        APPLY_CF_WRITE_BUFFER_BYTES
    } else {
        SMALL_CF_WRITE_BUFFER_BYTES
    };
    debug_assert!(
        buffer as u64 <= MAX_TOTAL_WAL_BYTES,
        "a memtable fits in the WAL cap"
    );
    opts.set_write_buffer_size(buffer);
    opts
}

/// Options shared by the database and every column family: compression and
/// the node's one block cache.
fn base_options(cache: &Cache) -> Options {
    let mut opts = Options::default();
    // Only lz4 is compiled in (see the workspace manifest); RocksDB's default
    // (snappy) would make open fail with "not linked".
    opts.set_compression_type(DBCompressionType::Lz4);
    let mut table = BlockBasedOptions::default();
    table.set_block_cache(cache);
    opts.set_block_based_table_factory(&table);
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

    /// Bytes of the WAL files (`*.log`) in `dir`.
    fn wal_bytes(dir: &Path) -> u64 {
        std::fs::read_dir(dir)
            .expect("read db dir")
            .filter_map(|e| e.ok())
            .filter(|e| e.path().extension().is_some_and(|x| x == "log"))
            .map(|e| e.metadata().map(|m| m.len()).unwrap_or(0))
            .sum()
    }

    /// The soak's disk growth: a busy `raft` cf beside a `meta` cf written a
    /// little in every batch. Log files must be released at the WAL cap,
    /// not kept until the rarely-written cf fills its memtable.
    #[test]
    fn log_files_are_released_when_a_rarely_written_cf_would_pin_them() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("db");
        let engine = RocksEngine::open(&path).expect("open");
        let mut peak = 0;
        for round in 0u64..192 {
            let mut batch = WriteBatch::new();
            for i in 0u64..64 {
                let key = (round * 64 + i).to_be_bytes().to_vec();
                batch.put(Cf::Raft, key, vec![round as u8; 16 << 10]);
            }
            batch.put(Cf::Meta, b"applied".to_vec(), round.to_be_bytes().to_vec());
            if round >= 8 {
                // The log behind a snapshot is range-deleted, as the store does.
                let end = ((round - 8) * 64).to_be_bytes().to_vec();
                batch.delete_range(Cf::Raft, 0u64.to_be_bytes().to_vec(), end);
            }
            engine.write(&batch, false).expect("write");
            peak = peak.max(wal_bytes(&path));
        }
        // 192 MiB went through the log; what stays is bounded by the cap
        // plus the file being written when a flush was due. A fixed figure,
        // not one derived from the cap: raising the cap must fail here.
        let bound: u64 = 128 << 20;
        assert!(
            peak <= bound,
            "log files peaked at {peak} bytes, bound {bound}"
        );
    }

    #[test]
    fn every_column_family_shares_one_bounded_block_cache() {
        let dir = tempfile::tempdir().expect("tempdir");
        let engine = RocksEngine::open(dir.path().join("db")).expect("open");
        let mut batch = WriteBatch::new();
        for cf in Cf::ALL {
            for i in 0u32..4096 {
                batch.put(cf, i.to_be_bytes().to_vec(), vec![cf.ordinal() as u8; 4096]);
            }
        }
        engine.write(&batch, false).expect("write");
        engine
            .db
            .flush_cf(engine.cf(Cf::Raft).unwrap())
            .expect("flush");
        engine
            .db
            .flush_cf(engine.cf(Cf::Apply).unwrap())
            .expect("flush");
        engine
            .db
            .flush_cf(engine.cf(Cf::Meta).unwrap())
            .expect("flush");
        for cf in Cf::ALL {
            let mut n = 0;
            engine
                .iterate(cf, &[0], &[255], &mut |_, _| {
                    n += 1;
                    Ok(true)
                })
                .expect("scan");
            assert_eq!(n, 4096);
        }
        // A shared cache is one figure, whichever cf is asked.
        let usage: Vec<u64> = Cf::ALL
            .iter()
            .map(|cf| {
                let handle = engine.cf(*cf).unwrap();
                engine
                    .db
                    .property_int_value_cf(handle, "rocksdb.block-cache-usage")
                    .unwrap()
                    .unwrap()
            })
            .collect();
        assert!(usage.windows(2).all(|w| w[0] == w[1]), "{usage:?}");
        let m = engine.memory();
        // The cfs read 48 MiB of blocks (more than the cache) through the cache; one shared cache
        // holds at most its capacity, and is counted once.
        assert!(m.block_cache_bytes > 0, "{m:?}");
        assert!(m.block_cache_bytes <= BLOCK_CACHE_BYTES as u64, "{m:?}");
    }

    /// Files in `dir` whose name ends with `.ext`, oldest first.
    fn files(dir: &Path, ext: &str) -> Vec<PathBuf> {
        let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
            .expect("read db dir")
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == ext))
            .collect();
        found.sort();
        found
    }

    /// Writes `n` synced batches of one 1 KiB record each to the `raft` cf.
    fn write_records(engine: &RocksEngine, n: u32) {
        for i in 0..n {
            let mut batch = WriteBatch::new();
            batch.put(Cf::Raft, i.to_be_bytes().to_vec(), vec![i as u8; 1024]);
            engine.write(&batch, true).expect("write");
        }
    }

    fn overwrite(path: &Path, offset: u64, bytes: &[u8]) {
        use std::io::{Seek, SeekFrom, Write};
        let mut f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
        f.seek(SeekFrom::Start(offset)).unwrap();
        f.write_all(bytes).unwrap();
        f.sync_all().unwrap();
    }

    fn expect_damage_naming(result: Result<RocksEngine>, ext: &str) -> String {
        match result {
            Err(e @ Error::Damaged { .. }) => {
                let Error::Damaged { file, .. } = &e else {
                    unreachable!()
                };
                let file = file.clone().unwrap_or_default();
                assert!(file.ends_with(ext), "names {file:?}: {e}");
                e.to_string()
            }
            Err(e) => panic!("opened with a non-damage error: {e}"),
            Ok(_) => panic!("a damaged directory opened"),
        }
    }

    /// RocksDB's default recovery would open here without every write
    /// after the broken record: a replica forgetting what it acknowledged.
    #[test]
    fn a_broken_record_inside_the_log_refuses_to_open_naming_the_log() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("db");
        write_records(&RocksEngine::open(&path).expect("open"), 64);
        let log = files(&path, "log").pop().expect("a log file");
        overwrite(&log, 20 * 1024, &[0xff; 8]);
        let text = expect_damage_naming(RocksEngine::open(&path), ".log");
        assert!(
            text.contains("Replace a node whose disk was lost"),
            "{text}"
        );
    }

    /// A crash in the middle of a write leaves a torn last record: that
    /// write was never acknowledged (it was not synced), so it may go, and
    /// everything before it stays.
    #[test]
    fn a_torn_last_record_opens_with_every_complete_write() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("db");
        write_records(&RocksEngine::open(&path).expect("open"), 64);
        let log = files(&path, "log").pop().expect("a log file");
        let len = std::fs::metadata(&log).unwrap().len();
        let f = std::fs::OpenOptions::new().write(true).open(&log).unwrap();
        f.set_len(len - 100).unwrap();
        drop(f);
        let engine = RocksEngine::open(&path).expect("a torn tail opens");
        for i in 0u32..63 {
            let value = engine.get(Cf::Raft, &i.to_be_bytes()).expect("read");
            assert_eq!(value, Some(vec![i as u8; 1024]), "record {i}");
        }
        assert_eq!(engine.get(Cf::Raft, &63u32.to_be_bytes()).unwrap(), None);
    }

    /// Writes 64 records and flushes them into a table file.
    fn flushed_db(path: &Path) -> PathBuf {
        let engine = RocksEngine::open(path).expect("open");
        write_records(&engine, 64);
        engine
            .db
            .flush_cf(engine.cf(Cf::Raft).unwrap())
            .expect("flush");
        drop(engine);
        files(path, "sst").pop().expect("a table file")
    }

    #[test]
    fn a_truncated_table_file_refuses_to_open_naming_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("db");
        let table = flushed_db(&path);
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&table)
            .unwrap();
        f.set_len(1000).unwrap();
        drop(f);
        expect_damage_naming(RocksEngine::open(&path), ".sst");
    }

    /// A flipped byte inside a table is found by the block checksum when
    /// the block is read (a node reads every shard's state at start).
    #[test]
    fn a_garbled_table_block_is_damage_naming_the_table_when_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("db");
        let table = flushed_db(&path);
        overwrite(&table, 100, &[0x5a; 16]);
        let engine = RocksEngine::open(&path).expect("opens: blocks are checked when read");
        let mut failed = None;
        for i in 0u32..64 {
            if let Err(e) = engine.get(Cf::Raft, &i.to_be_bytes()) {
                failed = Some(e);
                break;
            }
        }
        let e = failed.expect("a read of the garbled block fails");
        assert!(e.is_damage(), "{e}");
        let Error::Damaged { file, .. } = &e else {
            panic!("{e}")
        };
        assert!(file.as_deref().is_some_and(|f| f.ends_with(".sst")), "{e}");
    }
}
