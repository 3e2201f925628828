//! Cases [`ShardStorage`] must pass over every engine. See
//! [`super::storage_conformance`].
//!
//! `raft::Storage` semantics follow raft-rs's own `MemStorage` where they
//! overlap (staged entries are readable at once, as there); where
//! fencelock is stricter (durability reported per batch mark, no snapshot
//! served while a newer one is being written, compaction bounded by the
//! latest state-machine snapshot, typed errors instead of panics) the cases
//! say so.

use std::sync::Arc;

use protobuf::Message;
use raft::prelude::{ConfState, Entry, HardState, Snapshot};
use raft::{GetEntriesContext, Storage, StorageError};

use super::{Case, EngineFactory};
use crate::engine::{Cf, Engine, WriteBatch};
use crate::error::{Error, Result};
use crate::keys;
use crate::meta;
use crate::shard_storage::{ShardStorage, SnapshotInfo, MAX_ENTRY_BYTES};

/// Every storage case, in a fixed order.
pub fn cases<F: EngineFactory>() -> Vec<Case<F>> {
    vec![
        ("fresh_storage_is_empty", fresh_storage_is_empty::<F>),
        ("append_then_read_back", append_then_read_back::<F>),
        (
            "staged_entries_are_readable_at_once_and_durable_through_their_mark",
            staged_entries_are_readable_at_once_and_durable_through_their_mark::<F>,
        ),
        (
            "a_pending_snapshot_is_not_served_until_durable",
            a_pending_snapshot_is_not_served_until_durable::<F>,
        ),
        (
            "append_truncates_conflicting_suffix",
            append_truncates_conflicting_suffix::<F>,
        ),
        (
            "append_refuses_invalid_input_atomically",
            append_refuses_invalid_input_atomically::<F>,
        ),
        ("entries_respect_max_size", entries_respect_max_size::<F>),
        (
            "entries_and_term_report_compacted_and_unavailable",
            entries_and_term_report_compacted_and_unavailable::<F>,
        ),
        (
            "compact_keeps_term_and_needs_snapshot",
            compact_keeps_term_and_needs_snapshot::<F>,
        ),
        (
            "snapshot_serves_latest_saved_state_machine_snapshot",
            snapshot_serves_latest_saved_state_machine_snapshot::<F>,
        ),
        (
            "apply_snapshot_replaces_log",
            apply_snapshot_replaces_log::<F>,
        ),
        (
            "hard_state_updates_are_checked",
            hard_state_updates_are_checked::<F>,
        ),
        (
            "applied_index_and_conf_state_persist",
            applied_index_and_conf_state_persist::<F>,
        ),
        (
            "several_rounds_staged_before_one_flush",
            several_rounds_staged_before_one_flush::<F>,
        ),
        (
            "destroy_leaves_other_shards_untouched",
            destroy_leaves_other_shards_untouched::<F>,
        ),
        (
            "many_shards_share_one_synced_batch",
            many_shards_share_one_synced_batch::<F>,
        ),
        (
            "corrupt_records_are_reported_not_panicked",
            corrupt_records_are_reported_not_panicked::<F>,
        ),
    ]
}

type Shard<F> = ShardStorage<<F as EngineFactory>::Engine>;

/// An entry whose payload names its index and term, so that a read-back
/// proves *which* entry came back, not just that one did.
pub fn ent(index: u64, term: u64) -> Entry {
    Entry {
        index,
        term,
        data: format!("entry {index} of term {term}").into_bytes().into(),
        ..Default::default()
    }
}

fn ents(range: std::ops::RangeInclusive<u64>, term: u64) -> Vec<Entry> {
    range.map(|i| ent(i, term)).collect()
}

fn hs(term: u64, vote: u64, commit: u64) -> HardState {
    HardState {
        term,
        vote,
        commit,
        ..Default::default()
    }
}

fn voters(ids: &[u64]) -> ConfState {
    ConfState {
        voters: ids.to_vec(),
        ..Default::default()
    }
}

fn index_terms(entries: &[Entry]) -> Vec<(u64, u64)> {
    entries.iter().map(|e| (e.index, e.term)).collect()
}

fn read<E: Engine + ?Sized>(
    s: &ShardStorage<E>,
    low: u64,
    high: u64,
    max_size: Option<u64>,
) -> raft::Result<Vec<Entry>> {
    s.entries(low, high, max_size, GetEntriesContext::empty(false))
}

fn is_store_err<T: std::fmt::Debug>(res: raft::Result<T>, expected: StorageError) -> bool {
    matches!(res, Err(raft::Error::Store(ref e)) if *e == expected)
}

/// Stages with `f`, writes the batch synced, reports it persisted.
fn persist<E: Engine + ?Sized>(
    s: &mut ShardStorage<E>,
    f: impl FnOnce(&mut ShardStorage<E>, &mut WriteBatch) -> Result<()>,
) -> Result<()> {
    let mut batch = WriteBatch::new();
    f(s, &mut batch)?;
    s.engine().write(&batch, true)?;
    s.on_persisted();
    Ok(())
}

fn open<F: EngineFactory>(f: &F, shard_id: u64) -> Result<Shard<F>> {
    ShardStorage::open(Arc::new(f.open()?), shard_id)
}

/// Simulates a restart: every handle on the engine is dropped before the
/// engine is opened again (RocksDB refuses a second open otherwise).
fn reopen<F: EngineFactory>(f: &F, s: Shard<F>) -> Result<Shard<F>> {
    let id = s.shard_id();
    drop(s);
    open(f, id)
}

/// The durable view raft-rs sees, in one comparable value.
fn view<E: Engine + ?Sized>(s: &ShardStorage<E>) -> raft::Result<(u64, u64, HardState, ConfState)> {
    let state = s.initial_state()?;
    Ok((
        s.first_index()?,
        s.last_index()?,
        state.hard_state,
        state.conf_state,
    ))
}

fn fresh_storage_is_empty<F: EngineFactory>(f: &F) -> Result<()> {
    let s = open(f, 1)?;
    let state = s.initial_state()?;
    assert!(!state.initialized());
    assert_eq!(state.hard_state, HardState::default());
    assert_eq!(s.first_index()?, 1);
    assert_eq!(s.last_index()?, 0);
    assert_eq!(s.term(0)?, 0);
    assert!(is_store_err(s.term(1), StorageError::Unavailable));
    assert!(read(&s, 1, 1, None)?.is_empty());
    assert!(is_store_err(
        read(&s, 1, 2, None),
        StorageError::Unavailable
    ));
    assert!(is_store_err(
        s.snapshot(0, 2),
        StorageError::SnapshotTemporarilyUnavailable
    ));
    assert_eq!(s.take_snapshot_request(), Some(0));
    assert_eq!(s.state_machine_snapshot()?, None);
    assert_eq!(s.applied_index(), 0);
    assert!(!s.has_staged());
    Ok(())
}

fn append_then_read_back<F: EngineFactory>(f: &F) -> Result<()> {
    let mut s = open(f, 7)?;
    let mut log = ents(1..=3, 1);
    log.extend(ents(4..=6, 2));
    persist(&mut s, |s, b| s.append(&log, b))?;
    assert_eq!((s.first_index()?, s.last_index()?), (1, 6));
    assert_eq!(s.last(), (6, 2));
    for e in &log {
        assert_eq!(s.term(e.index)?, e.term);
    }
    assert_eq!(read(&s, 1, 7, None)?, log);
    assert_eq!(read(&s, 2, 5, None)?, log[1..4].to_vec());

    // Appending right after the last entry extends the log.
    persist(&mut s, |s, b| s.append(&ents(7..=8, 2), b))?;
    assert_eq!(s.last_index()?, 8);

    let s = reopen(f, s)?;
    assert_eq!((s.first_index()?, s.last_index()?), (1, 8));
    assert_eq!(s.last(), (8, 2));
    let mut all = log.clone();
    all.extend(ents(7..=8, 2));
    assert_eq!(read(&s, 1, 9, None)?, all);
    Ok(())
}

fn staged_entries_are_readable_at_once_and_durable_through_their_mark<F: EngineFactory>(
    f: &F,
) -> Result<()> {
    let mut s = open(f, 1)?;
    persist(&mut s, |s, b| s.append(&ents(1..=2, 1), b))?;

    // A batch handed to the disk: raft-rs reads its entries while the
    // write is in flight (asynchronous writes).
    let mut first = WriteBatch::new();
    s.append(&ents(3..=5, 1), &mut first)?;
    s.set_hard_state(&hs(1, 1, 4), &mut first)?;
    let first_mark = s.staged_mark();
    assert!(s.has_staged());
    assert_eq!(s.staged_hard_state().commit, 4);
    assert_eq!(s.last_index()?, 5);
    assert_eq!(s.term(4)?, 1);
    assert_eq!(
        index_terms(&read(&s, 1, 6, None)?),
        vec![(1, 1), (2, 1), (3, 1), (4, 1), (5, 1)]
    );
    // What is durable has not moved.
    assert_eq!(s.last(), (2, 1));
    assert_eq!(s.hard_state().commit, 0);

    // A second batch, staged while the first is in flight, overwrites 5.
    let mut second = WriteBatch::new();
    s.append(&ents(5..=6, 2), &mut second)?;
    assert_eq!(
        index_terms(&read(&s, 4, 7, None)?),
        vec![(4, 1), (5, 2), (6, 2)]
    );

    // The first lands: durable through its mark, the second still pending.
    s.engine().write(&first, true)?;
    s.on_persisted_through(first_mark);
    assert!(s.has_staged(), "the second batch is still pending");
    assert_eq!(s.last(), (5, 1));
    assert_eq!(s.hard_state().commit, 4);
    assert_eq!(
        index_terms(&read(&s, 4, 7, None)?),
        vec![(4, 1), (5, 2), (6, 2)],
        "reads still see the second batch"
    );
    // What a restart right now would find: the first batch only.
    {
        let restarted = ShardStorage::open(s.engine().clone(), 1)?;
        assert_eq!(restarted.last(), (5, 1));
        assert_eq!(restarted.term(5)?, 1);
    }

    s.engine().write(&second, true)?;
    s.on_persisted_through(s.staged_mark());
    assert!(!s.has_staged());
    assert_eq!(s.last(), (6, 2));

    // An aborted stage leaves no trace, and staging can resume from the
    // durable state.
    let mut dropped = WriteBatch::new();
    s.append(&ents(7..=9, 2), &mut dropped)?;
    s.abort_staged();
    assert!(!s.has_staged());
    assert_eq!(s.last_index()?, 6);
    assert!(is_store_err(s.term(7), StorageError::Unavailable));
    persist(&mut s, |s, b| s.append(&ents(7..=7, 3), b))?;
    assert_eq!(s.last(), (7, 3));
    let s = reopen(f, s)?;
    assert_eq!(s.last(), (7, 3));
    assert_eq!(
        index_terms(&read(&s, 5, 8, None)?),
        vec![(5, 2), (6, 2), (7, 3)]
    );
    Ok(())
}

fn a_pending_snapshot_is_not_served_until_durable<F: EngineFactory>(f: &F) -> Result<()> {
    let mut s = open(f, 1)?;
    persist(&mut s, |s, b| {
        s.append(&ents(1..=4, 1), b)?;
        s.set_hard_state(&hs(1, 1, 4), b)
    })?;
    persist(&mut s, |s, b| {
        s.save_state_machine_snapshot(2, 1, &voters(&[1]), b"two", b)
    })?;
    assert_eq!(s.snapshot(0, 1)?.get_metadata().index, 2);

    // A newer one in flight: the engine may hold half of each, so none is
    // served until it lands, and then the new one.
    let mut batch = WriteBatch::new();
    s.save_state_machine_snapshot(4, 1, &voters(&[1]), b"four", &mut batch)?;
    s.compact(3, &mut batch)?;
    assert!(is_store_err(
        s.snapshot(0, 1),
        StorageError::SnapshotTemporarilyUnavailable
    ));
    assert_eq!(
        s.take_snapshot_request(),
        None,
        "not a request for a new one"
    );
    s.engine().write(&batch, true)?;
    s.on_persisted_through(s.staged_mark());
    let snap = s.snapshot(0, 1)?;
    assert_eq!(snap.get_metadata().index, 4);
    assert_eq!(&snap.data[..], b"four");
    Ok(())
}

fn append_truncates_conflicting_suffix<F: EngineFactory>(f: &F) -> Result<()> {
    let mut s = open(f, 3)?;
    persist(&mut s, |s, b| s.append(&ents(1..=5, 1), b))?;

    // Shorter conflicting append: 4 and 5 must disappear.
    persist(&mut s, |s, b| s.append(&[ent(3, 2)], b))?;
    assert_eq!(s.last_index()?, 3);
    assert_eq!(
        index_terms(&read(&s, 1, 4, None)?),
        vec![(1, 1), (2, 1), (3, 2)]
    );
    assert!(is_store_err(s.term(4), StorageError::Unavailable));
    let (start, end) = keys::log_range_all(3);
    assert_eq!(
        s.engine().scan(Cf::Raft, &start, &end, usize::MAX)?.len(),
        3,
        "the conflicting tail is deleted on disk, not just hidden"
    );
    let mut s = reopen(f, s)?;
    assert_eq!(s.last(), (3, 2));

    // Longer conflicting append replaces and extends.
    persist(&mut s, |s, b| s.append(&ents(2..=6, 3), b))?;
    assert_eq!(s.last(), (6, 3));
    assert_eq!(read(&s, 1, 7, None)?, {
        let mut v = vec![ent(1, 1)];
        v.extend(ents(2..=6, 3));
        v
    });

    let s = reopen(f, s)?;
    assert_eq!(s.last(), (6, 3));
    assert_eq!(read(&s, 2, 7, None)?, ents(2..=6, 3));
    // Nothing of the old tail survives on disk (reopen also checks this).
    assert_eq!(
        s.engine().scan(Cf::Raft, &start, &end, usize::MAX)?.len(),
        6
    );
    Ok(())
}

fn append_refuses_invalid_input_atomically<F: EngineFactory>(f: &F) -> Result<()> {
    let mut s = open(f, 1)?;
    persist(&mut s, |s, b| s.append(&ents(1..=5, 2), b))?;
    persist(&mut s, |s, b| s.set_hard_state(&hs(2, 1, 5), b))?;
    persist(&mut s, |s, b| {
        s.save_state_machine_snapshot(3, 2, &voters(&[1]), b"sm", b)?;
        s.compact(3, b)
    })?;

    let bad: Vec<(&str, Vec<Entry>)> = vec![
        ("gap", vec![ent(7, 2)]),
        ("not consecutive", vec![ent(6, 2), ent(8, 2)]),
        ("term decreases inside", vec![ent(6, 3), ent(7, 2)]),
        ("term below previous entry", vec![ent(6, 1)]),
        ("overwrites compacted", vec![ent(3, 2), ent(4, 2)]),
        ("reserved index", vec![ent(u64::MAX, 9)]),
        ("index overflow", vec![ent(u64::MAX, 9), ent(0, 9)]),
    ];
    for (what, entries) in bad {
        let mut batch = WriteBatch::new();
        match s.append(&entries, &mut batch) {
            Err(Error::InvalidAppend { shard_id: 1, .. }) => {}
            other => panic!("{what}: expected InvalidAppend, got {other:?}"),
        }
        assert!(batch.is_empty(), "{what}: nothing staged");
        assert!(!s.has_staged(), "{what}: nothing pending");
    }

    let mut huge = ent(7, 2);
    huge.data = vec![0u8; MAX_ENTRY_BYTES + 1].into();
    let mut batch = WriteBatch::new();
    match s.append(&[ent(6, 2), huge], &mut batch) {
        Err(Error::ValueTooLarge { .. }) => {}
        other => panic!("expected ValueTooLarge, got {other:?}"),
    }
    assert!(batch.is_empty() && !s.has_staged());

    // Empty append is a no-op; the storage still works.
    let mut batch = WriteBatch::new();
    s.append(&[], &mut batch)?;
    assert!(batch.is_empty());
    persist(&mut s, |s, b| s.append(&ents(6..=6, 2), b))?;
    assert_eq!(s.last(), (6, 2));
    Ok(())
}

fn entries_respect_max_size<F: EngineFactory>(f: &F) -> Result<()> {
    let mut s = open(f, 2)?;
    let log = ents(1..=50, 1);
    persist(&mut s, |s, b| s.append(&log, b))?;
    let one = u64::from(log[10].compute_size());

    let check = |s: &Shard<F>, phase: &str| -> Result<()> {
        let lows_highs = [(1, 51), (1, 2), (10, 40), (25, 51), (50, 51)];
        let maxes = [
            None,
            Some(raft::NO_LIMIT),
            Some(0),
            Some(one - 1),
            Some(one),
            Some(one + 1),
            Some(2 * one),
            Some(7 * one + 3),
        ];
        for (low, high) in lows_highs {
            for max in maxes {
                let got = read(s, low, high, max)?;
                // raft-rs's own size rule is the oracle.
                let mut want = log[(low - 1) as usize..(high - 1) as usize].to_vec();
                raft::util::limit_size(&mut want, max);
                assert_eq!(got, want, "{phase}: [{low}, {high}) max {max:?}");
                assert!(!got.is_empty(), "{phase}: at least one entry");
            }
        }
        Ok(())
    };
    check(&s, "fresh appends (cache)")?;
    let mut s = reopen(f, s)?;
    check(&s, "after reopen (engine)")?;
    // Engine for old entries, cache for new ones: a read across the seam.
    let more = ents(51..=60, 1);
    persist(&mut s, |s, b| s.append(&more, b))?;
    let mut all = log.clone();
    all.extend(more);
    assert_eq!(read(&s, 45, 61, None)?, all[44..60].to_vec());
    let mut want = all[44..60].to_vec();
    raft::util::limit_size(&mut want, Some(8 * one));
    assert_eq!(read(&s, 45, 61, Some(8 * one))?, want);

    // Longer than the cache holds: part engine, part cache.
    let long = ents(61..=2060, 1);
    persist(&mut s, |s, b| s.append(&long, b))?;
    all.extend(long);
    assert_eq!(read(&s, 1, 2061, None)?, all);
    Ok(())
}

fn entries_and_term_report_compacted_and_unavailable<F: EngineFactory>(f: &F) -> Result<()> {
    let mut s = open(f, 1)?;
    persist(&mut s, |s, b| {
        s.append(&ents(1..=10, 1), b)?;
        s.set_hard_state(&hs(1, 0, 8), b)?;
        s.save_state_machine_snapshot(5, 1, &voters(&[1]), b"x", b)?;
        s.compact(4, b)
    })?;
    assert_eq!((s.first_index()?, s.last_index()?), (5, 10));

    assert!(is_store_err(read(&s, 4, 6, None), StorageError::Compacted));
    assert!(is_store_err(read(&s, 1, 3, None), StorageError::Compacted));
    assert!(is_store_err(
        read(&s, 5, 12, None),
        StorageError::Unavailable
    ));
    assert!(is_store_err(s.term(3), StorageError::Compacted));
    assert!(is_store_err(s.term(11), StorageError::Unavailable));
    assert_eq!(s.term(4)?, 1, "term of the truncated entry is kept");
    assert_eq!(s.term(10)?, 1);
    assert_eq!(read(&s, 5, 11, None)?.len(), 6);
    assert!(read(&s, 11, 11, None)?.is_empty());
    // low > high is an error, never a panic.
    assert!(read(&s, 7, 6, None).is_err());
    // The typed errors carry the detail.
    match s.read_entries(2, 6, None) {
        Err(Error::Compacted {
            shard_id: 1,
            index: 2,
            first_index: 5,
        }) => {}
        other => panic!("expected Compacted, got {other:?}"),
    }
    Ok(())
}

fn compact_keeps_term_and_needs_snapshot<F: EngineFactory>(f: &F) -> Result<()> {
    let mut s = open(f, 4)?;
    let mut log = ents(1..=5, 1);
    log.extend(ents(6..=10, 2));
    persist(&mut s, |s, b| {
        s.append(&log, b)?;
        s.set_hard_state(&hs(2, 1, 10), b)
    })?;

    let mut batch = WriteBatch::new();
    match s.compact(3, &mut batch) {
        Err(Error::InvalidCompaction { .. }) => {}
        other => panic!("compaction without snapshot: {other:?}"),
    }
    assert!(batch.is_empty());

    persist(&mut s, |s, b| {
        s.save_state_machine_snapshot(6, 2, &voters(&[1]), b"six", b)
    })?;
    match s.compact(7, &mut batch) {
        Err(Error::InvalidCompaction { .. }) => {}
        other => panic!("compaction past snapshot: {other:?}"),
    }
    persist(&mut s, |s, b| s.compact(6, b))?;
    assert_eq!(s.first_index()?, 7);
    assert_eq!(s.truncated(), (6, 2));
    assert_eq!(s.term(6)?, 2);
    assert!(is_store_err(s.term(5), StorageError::Compacted));
    assert_eq!(read(&s, 7, 11, None)?, log[6..].to_vec());

    // Compacting to or below the truncation point is a no-op.
    let mut batch = WriteBatch::new();
    s.compact(4, &mut batch)?;
    s.compact(6, &mut batch)?;
    assert!(batch.is_empty() && !s.has_staged());

    // Past the last index is refused even with a snapshot covering it.
    persist(&mut s, |s, b| {
        s.save_state_machine_snapshot(10, 2, &voters(&[1]), b"ten", b)
    })?;
    match s.compact(11, &mut batch) {
        Err(Error::InvalidCompaction { .. }) => {}
        other => panic!("compaction past last index: {other:?}"),
    }
    // Compacting everything leaves an empty log that still knows its term.
    persist(&mut s, |s, b| s.compact(10, b))?;
    assert_eq!((s.first_index()?, s.last_index()?), (11, 10));
    assert_eq!(s.term(10)?, 2);

    let mut s = reopen(f, s)?;
    assert_eq!((s.first_index()?, s.last_index()?), (11, 10));
    assert_eq!(s.truncated(), (10, 2));
    assert_eq!(s.term(10)?, 2);
    let (start, end) = keys::log_range_all(4);
    assert!(s.engine().scan(Cf::Raft, &start, &end, 1)?.is_empty());
    persist(&mut s, |s, b| s.append(&ents(11..=12, 3), b))?;
    assert_eq!(s.last(), (12, 3));
    Ok(())
}

fn snapshot_serves_latest_saved_state_machine_snapshot<F: EngineFactory>(f: &F) -> Result<()> {
    let mut s = open(f, 5)?;
    assert!(is_store_err(
        s.snapshot(0, 2),
        StorageError::SnapshotTemporarilyUnavailable
    ));
    persist(&mut s, |s, b| {
        s.append(&ents(1..=5, 1), b)?;
        s.set_hard_state(&hs(1, 1, 5), b)
    })?;
    persist(&mut s, |s, b| {
        s.save_state_machine_snapshot(3, 1, &voters(&[1, 2, 3]), b"state@3", b)
    })?;
    assert_eq!(
        s.take_snapshot_request(),
        Some(0),
        "the early request was recorded"
    );

    let snap = s.snapshot(0, 2)?;
    assert_eq!(snap.get_metadata().index, 3);
    assert_eq!(snap.get_metadata().term, 1);
    assert_eq!(snap.get_metadata().get_conf_state(), &voters(&[1, 2, 3]));
    assert_eq!(snap.get_data(), b"state@3");
    assert_eq!(s.snapshot(3, 2)?, snap);

    assert!(is_store_err(
        s.snapshot(4, 2),
        StorageError::SnapshotTemporarilyUnavailable
    ));
    assert!(is_store_err(
        s.snapshot(5, 3),
        StorageError::SnapshotTemporarilyUnavailable
    ));
    assert!(is_store_err(
        s.snapshot(4, 3),
        StorageError::SnapshotTemporarilyUnavailable
    ));
    assert_eq!(
        s.take_snapshot_request(),
        Some(5),
        "the highest request wins"
    );
    assert_eq!(s.take_snapshot_request(), None);

    // Refused saves, none of which stage anything.
    let refused: Vec<(&str, u64, u64)> = vec![
        ("older than latest", 2, 1),
        ("index 0", 0, 0),
        ("past commit", 6, 1),
        ("term mismatch", 4, 2),
    ];
    for (what, index, term) in refused {
        let mut batch = WriteBatch::new();
        let res = s.save_state_machine_snapshot(index, term, &voters(&[1]), b"x", &mut batch);
        match res {
            Err(Error::SnapshotOutOfDate { .. }) | Err(Error::InvalidSnapshot { .. }) => {}
            other => panic!("{what}: {other:?}"),
        }
        assert!(batch.is_empty() && !s.has_staged(), "{what}");
    }

    // A staged snapshot is not served before it is persisted.
    let mut batch = WriteBatch::new();
    s.save_state_machine_snapshot(5, 1, &voters(&[1, 2, 3]), b"state@5", &mut batch)?;
    assert!(is_store_err(
        s.snapshot(4, 2),
        StorageError::SnapshotTemporarilyUnavailable
    ));
    s.engine().write(&batch, true)?;
    s.on_persisted();
    assert_eq!(s.snapshot(4, 2)?.get_data(), b"state@5");
    assert_eq!(s.snapshot_info(), Some(SnapshotInfo { index: 5, term: 1 }));

    let s = reopen(f, s)?;
    let restored = s.state_machine_snapshot()?.map(|snap| {
        let m = snap.get_metadata();
        (m.index, m.term, snap.get_data().to_vec())
    });
    assert_eq!(restored, Some((5, 1, b"state@5".to_vec())));
    assert_eq!(s.snapshot_info(), Some(SnapshotInfo { index: 5, term: 1 }));
    Ok(())
}

fn snapshot_at(index: u64, term: u64, cs: ConfState, data: &[u8]) -> Snapshot {
    let mut snap = Snapshot::default();
    snap.mut_metadata().index = index;
    snap.mut_metadata().term = term;
    snap.mut_metadata().set_conf_state(cs);
    snap.data = data.to_vec().into();
    snap
}

fn apply_snapshot_replaces_log<F: EngineFactory>(f: &F) -> Result<()> {
    let mut s = open(f, 6)?;
    persist(&mut s, |s, b| {
        s.append(&ents(1..=5, 1), b)?;
        s.set_hard_state(&hs(1, 2, 3), b)
    })?;
    let snap = snapshot_at(10, 3, voters(&[1, 2, 3]), b"state@10");
    persist(&mut s, |s, b| s.apply_snapshot(&snap, b))?;

    let check = |s: &Shard<F>| -> Result<()> {
        assert_eq!((s.first_index()?, s.last_index()?), (11, 10));
        assert_eq!(s.term(10)?, 3);
        assert!(is_store_err(s.term(9), StorageError::Compacted));
        assert!(is_store_err(read(s, 5, 6, None), StorageError::Compacted));
        assert!(read(s, 11, 11, None)?.is_empty());
        assert_eq!(s.hard_state().commit, 10);
        assert_eq!(s.hard_state().term, 3);
        assert_eq!(s.conf_state(), &voters(&[1, 2, 3]));
        assert_eq!(s.applied_index(), 10);
        assert_eq!(s.snapshot(0, 1)?, snap);
        assert_eq!(s.snapshot_info(), Some(SnapshotInfo { index: 10, term: 3 }));
        Ok(())
    };
    check(&s)?;
    let (start, end) = keys::log_range_all(6);
    assert!(
        s.engine().scan(Cf::Raft, &start, &end, 1)?.is_empty(),
        "old log deleted"
    );

    let mut s = reopen(f, s)?;
    check(&s)?;

    let mut batch = WriteBatch::new();
    match s.apply_snapshot(&snapshot_at(u64::MAX, 3, voters(&[1]), b"x"), &mut batch) {
        Err(Error::InvalidSnapshot { .. }) => {}
        other => panic!("snapshot at u64::MAX: {other:?}"),
    }
    for stale in [5u64, 10] {
        let mut batch = WriteBatch::new();
        match s.apply_snapshot(&snapshot_at(stale, 3, voters(&[1]), b"old"), &mut batch) {
            Err(Error::SnapshotOutOfDate { .. }) => {}
            other => panic!("snapshot at {stale}: {other:?}"),
        }
        assert!(batch.is_empty());
    }

    persist(&mut s, |s, b| s.append(&ents(11..=12, 3), b))?;
    assert_eq!(
        index_terms(&read(&s, 11, 13, None)?),
        vec![(11, 3), (12, 3)]
    );
    Ok(())
}

fn hard_state_updates_are_checked<F: EngineFactory>(f: &F) -> Result<()> {
    let mut s = open(f, 1)?;
    persist(&mut s, |s, b| s.set_hard_state(&hs(2, 1, 0), b))?;
    persist(&mut s, |s, b| s.append(&ents(1..=3, 2), b))?;

    let refused = [
        ("term goes back", hs(1, 1, 0)),
        ("vote changes within a term", hs(2, 3, 0)),
        ("commit past last index", hs(2, 1, 4)),
    ];
    for (what, bad) in refused {
        let mut batch = WriteBatch::new();
        match s.set_hard_state(&bad, &mut batch) {
            Err(Error::InvalidState { .. }) => {}
            other => panic!("{what}: {other:?}"),
        }
        assert!(batch.is_empty() && !s.has_staged(), "{what}");
    }
    // Same vote in the same term, and a new vote in a new term, are fine.
    persist(&mut s, |s, b| s.set_hard_state(&hs(2, 1, 2), b))?;
    let mut batch = WriteBatch::new();
    assert!(
        s.set_commit_index(1, &mut batch).is_err(),
        "commit goes back"
    );
    assert!(batch.is_empty());
    persist(&mut s, |s, b| s.set_hard_state(&hs(3, 2, 2), b))?;
    persist(&mut s, |s, b| s.set_commit_index(3, b))?;
    assert_eq!(s.hard_state(), &hs(3, 2, 3));

    let s = reopen(f, s)?;
    assert_eq!(s.initial_state()?.hard_state, hs(3, 2, 3));
    Ok(())
}

fn applied_index_and_conf_state_persist<F: EngineFactory>(f: &F) -> Result<()> {
    let mut s = open(f, 9)?;
    let mut cs = voters(&[1, 2, 3]);
    cs.learners = vec![4];
    persist(&mut s, |s, b| s.set_conf_state(&cs, b))?;
    assert!(s.initial_state()?.initialized());

    let mut batch = WriteBatch::new();
    match s.set_applied_index(1, &mut batch) {
        Err(Error::InvalidState { .. }) => {}
        other => panic!("applied past commit: {other:?}"),
    }
    persist(&mut s, |s, b| {
        s.append(&ents(1..=3, 1), b)?;
        s.set_hard_state(&hs(1, 1, 3), b)?;
        s.set_applied_index(2, b)
    })?;
    assert_eq!(s.applied_index(), 2);

    let s = reopen(f, s)?;
    assert_eq!(s.applied_index(), 2);
    assert_eq!(s.conf_state(), &cs);
    assert_eq!(s.initial_state()?.conf_state, cs);
    Ok(())
}

fn several_rounds_staged_before_one_flush<F: EngineFactory>(f: &F) -> Result<()> {
    let mut s = open(f, 1)?;
    let mut batch = WriteBatch::new();
    s.append(&ents(1..=5, 1), &mut batch)?;
    s.set_hard_state(&hs(1, 1, 0), &mut batch)?;
    // A second round conflicts with the first, still unflushed, round.
    s.append(&ents(4..=6, 2), &mut batch)?;
    s.set_hard_state(&hs(2, 1, 5), &mut batch)?;
    // Both checks below need the term of staged entries: 5 and 4 are term 2
    // (from the second round), not term 1.
    s.save_state_machine_snapshot(5, 2, &voters(&[1]), b"five", &mut batch)?;
    s.compact(4, &mut batch)?;
    assert!(s
        .save_state_machine_snapshot(5, 1, &voters(&[1]), b"x", &mut WriteBatch::new())
        .is_err());
    // Entry 5 after entry 4 of term 2 (only staged so far) cannot be term 1.
    let mut scratch = WriteBatch::new();
    match s.append(&[ent(5, 1)], &mut scratch) {
        Err(Error::InvalidAppend { .. }) => {}
        other => panic!("term below a staged predecessor: {other:?}"),
    }
    assert!(scratch.is_empty());
    assert_eq!(s.last_index()?, 6, "raft-rs reads the staged log");
    assert_eq!(s.last(), (0, 0), "nothing durable yet");

    s.engine().write(&batch, true)?;
    s.on_persisted();
    let check = |s: &Shard<F>| -> Result<()> {
        assert_eq!((s.first_index()?, s.last_index()?), (5, 6));
        assert_eq!(s.truncated(), (4, 2));
        assert_eq!(index_terms(&read(s, 5, 7, None)?), vec![(5, 2), (6, 2)]);
        assert_eq!(s.hard_state(), &hs(2, 1, 5));
        assert_eq!(s.snapshot_info(), Some(SnapshotInfo { index: 5, term: 2 }));
        Ok(())
    };
    check(&s)?;
    let s = reopen(f, s)?;
    check(&s)?;
    Ok(())
}

fn destroy_leaves_other_shards_untouched<F: EngineFactory>(f: &F) -> Result<()> {
    let engine = Arc::new(f.open()?);
    let mut a = ShardStorage::open(Arc::clone(&engine), 1)?;
    let mut b = ShardStorage::open(Arc::clone(&engine), 2)?;
    for s in [&mut a, &mut b] {
        persist(s, |s, wb| {
            s.append(&ents(1..=4, 1), wb)?;
            s.set_hard_state(&hs(1, 1, 4), wb)?;
            s.set_conf_state(&voters(&[1, 2, 3]), wb)?;
            s.set_applied_index(4, wb)?;
            s.save_state_machine_snapshot(3, 1, &voters(&[1, 2, 3]), b"three", wb)?;
            s.compact(2, wb)
        })?;
    }
    let b_view = view(&b)?;
    persist(&mut a, |s, wb| {
        meta::unregister_shard(wb, 1);
        s.destroy(wb)
    })?;
    assert_eq!(
        view(&a)?,
        (1, 0, HardState::default(), ConfState::default())
    );
    assert_eq!(a.snapshot_info(), None);
    assert_eq!(a.applied_index(), 0);
    assert_eq!(view(&b)?, b_view);

    drop((a, b, engine));
    let a = open(f, 1)?;
    assert_eq!(
        view(&a)?,
        (1, 0, HardState::default(), ConfState::default())
    );
    assert_eq!(a.state_machine_snapshot()?, None);
    // Every key of shard 1 is gone, in both families.
    for cf in [Cf::Raft, Cf::Apply] {
        for (key, _) in a.engine().scan(cf, &[], &[0xff], usize::MAX)? {
            assert_ne!(&key[1..9], &1u64.to_be_bytes(), "leftover key in {cf}");
        }
    }
    drop(a);
    let b = open(f, 2)?;
    assert_eq!(view(&b)?, b_view);
    assert_eq!(index_terms(&read(&b, 3, 5, None)?), vec![(3, 1), (4, 1)]);
    Ok(())
}

fn many_shards_share_one_synced_batch<F: EngineFactory>(f: &F) -> Result<()> {
    const SHARDS: u64 = 16;
    let engine = Arc::new(f.open()?);
    meta::init_store(
        &*engine,
        meta::NodeIdent {
            cluster_id: 7,
            node_id: 1,
        },
    )?;
    let mut shards = Vec::new();
    for id in 1..=SHARDS {
        shards.push(ShardStorage::open(Arc::clone(&engine), id * 10)?);
    }

    // One store-loop iteration: every shard stages, one synced write.
    let mut batch = WriteBatch::new();
    for s in &mut shards {
        let id = s.shard_id();
        let n = id / 10 + 2;
        meta::register_shard(&mut batch, id);
        s.set_conf_state(&voters(&[1, 2, 3]), &mut batch)?;
        s.append(&ents(1..=n, id), &mut batch)?;
        s.set_hard_state(&hs(id, 1, n - 1), &mut batch)?;
        if id % 30 == 0 {
            s.save_state_machine_snapshot(
                n - 1,
                id,
                &voters(&[1, 2, 3]),
                &id.to_be_bytes(),
                &mut batch,
            )?;
            s.compact(n - 2, &mut batch)?;
        }
        if id == 50 {
            let snap = snapshot_at(100, id, voters(&[1, 2, 3]), b"received");
            s.apply_snapshot(&snap, &mut batch)?;
        }
    }
    assert!(
        shards.iter().all(|s| s.last().0 == 0),
        "nothing durable before the write"
    );
    engine.write(&batch, true)?;
    for s in &mut shards {
        s.on_persisted();
    }
    let views: Vec<_> = shards.iter().map(view).collect::<raft::Result<_>>()?;
    drop((shards, engine));

    let engine = Arc::new(f.open()?);
    assert_eq!(
        meta::load_ident(&*engine)?,
        Some(meta::NodeIdent {
            cluster_id: 7,
            node_id: 1
        })
    );
    let ids = meta::registered_shards(&*engine)?;
    assert_eq!(ids, (1..=SHARDS).map(|i| i * 10).collect::<Vec<_>>());
    for (id, before) in ids.into_iter().zip(views) {
        let s = ShardStorage::open(Arc::clone(&engine), id)?;
        assert_eq!(view(&s)?, before, "shard {id}");
        let n = id / 10 + 2;
        if id == 50 {
            assert_eq!(s.last(), (100, id));
            assert_eq!(s.snapshot(0, 1)?.get_data(), b"received");
        } else {
            assert_eq!(s.last(), (n, id));
            let first = if id % 30 == 0 { n - 1 } else { 1 };
            assert_eq!(read(&s, first, n + 1, None)?, ents(first..=n, id));
        }
        if id % 30 == 0 && id != 50 {
            assert_eq!(s.snapshot(0, 1)?.get_data(), &id.to_be_bytes());
        }
    }
    Ok(())
}

fn expect_corruption<T: std::fmt::Debug>(what: &str, res: Result<T>) {
    match res {
        Err(Error::Corruption { .. }) => {}
        other => panic!("{what}: expected Corruption, got {other:?}"),
    }
}

/// A value to write over a record (`None` deletes it).
type Poke<'a> = Option<&'a [u8]>;

fn corrupt_records_are_reported_not_panicked<F: EngineFactory>(f: &F) -> Result<()> {
    let setup = |id: u64| -> Result<()> {
        let mut s = open(f, id)?;
        persist(&mut s, |s, b| {
            s.append(&ents(1..=5, 1), b)?;
            s.set_hard_state(&hs(1, 1, 5), b)?;
            s.set_applied_index(5, b)
        })
    };
    let poke = |cf: Cf, key: Vec<u8>, value: Option<&[u8]>| -> Result<()> {
        let engine = f.open()?;
        let mut b = WriteBatch::new();
        match value {
            Some(v) => b.put(cf, key, v.to_vec()),
            None => b.delete(cf, key),
        }
        engine.write(&b, true)
    };
    let garbage: &[u8] = b"\xff\xff\xff\xff\xff";

    // Records read at open.
    let cases: Vec<(&str, u64, Cf, Vec<u8>, Poke)> = vec![
        (
            "log state",
            1,
            Cf::Raft,
            keys::shard_key(keys::TAG_LOG_STATE, 1),
            Some(garbage),
        ),
        (
            "hard state",
            2,
            Cf::Raft,
            keys::shard_key(keys::TAG_HARD_STATE, 2),
            Some(garbage),
        ),
        (
            "conf state",
            3,
            Cf::Raft,
            keys::shard_key(keys::TAG_CONF_STATE, 3),
            Some(garbage),
        ),
        (
            "applied index",
            4,
            Cf::Apply,
            keys::shard_key(keys::TAG_APPLIED, 4),
            Some(&b"abc"[..]),
        ),
        ("last entry missing", 5, Cf::Raft, keys::log_key(5, 5), None),
        (
            "last entry garbage",
            6,
            Cf::Raft,
            keys::log_key(6, 5),
            Some(garbage),
        ),
        (
            "entry above last",
            7,
            Cf::Raft,
            keys::log_key(7, 9),
            Some(&b""[..]),
        ),
        (
            "snapshot metadata",
            8,
            Cf::Apply,
            keys::shard_key(keys::TAG_SNAPSHOT_META, 8),
            Some(garbage),
        ),
    ];
    for (what, id, cf, key, value) in cases {
        setup(id)?;
        poke(cf, key, value)?;
        expect_corruption(what, open(f, id).map(|_| ()));
    }

    // Records read later: the error surfaces from the read, typed.
    setup(20)?;
    poke(Cf::Raft, keys::log_key(20, 2), Some(garbage))?;
    let s = open(f, 20)?;
    expect_corruption("entry garbage", s.read_entries(1, 6, None));
    assert!(s.term(2).is_err());
    assert!(read(&s, 1, 6, None).is_err());
    drop(s);

    setup(21)?;
    poke(Cf::Raft, keys::log_key(21, 3), None)?;
    let s = open(f, 21)?;
    expect_corruption("entry missing in the middle", s.read_entries(1, 6, None));
    drop(s);

    setup(22)?;
    let moved = ent(4, 1).write_to_bytes()?;
    poke(Cf::Raft, keys::log_key(22, 2), Some(moved.as_slice()))?;
    let s = open(f, 22)?;
    expect_corruption("entry under the wrong index", s.read_entries(1, 3, None));
    drop(s);

    // A log state that claims truncation with no snapshot to back it.
    setup(23)?;
    let mut s = open(f, 23)?;
    persist(&mut s, |s, b| {
        s.save_state_machine_snapshot(3, 1, &voters(&[1]), b"s", b)?;
        s.compact(2, b)
    })?;
    drop(s);
    poke(
        Cf::Apply,
        keys::shard_key(keys::TAG_SNAPSHOT_META, 23),
        None,
    )?;
    expect_corruption("truncation without snapshot", open(f, 23).map(|_| ()));

    // Snapshot data lost: served as corruption, not as an empty snapshot.
    setup(24)?;
    let mut s = open(f, 24)?;
    persist(&mut s, |s, b| {
        s.save_state_machine_snapshot(3, 1, &voters(&[1]), b"s", b)
    })?;
    drop(s);
    poke(
        Cf::Apply,
        keys::shard_key(keys::TAG_SNAPSHOT_DATA, 24),
        None,
    )?;
    let s = open(f, 24)?;
    expect_corruption("snapshot data missing", s.state_machine_snapshot());
    assert!(s.snapshot(0, 1).is_err());
    Ok(())
}
