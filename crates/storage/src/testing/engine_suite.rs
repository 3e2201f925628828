//! Cases every [`Engine`] must pass. See [`super::engine_conformance`].

use super::{Case, EngineFactory};
use crate::engine::{Cf, Engine, WriteBatch};
use crate::error::{Error, Result};
use crate::keys;

/// Every engine case, in a fixed order.
pub fn cases<F: EngineFactory>() -> Vec<Case<F>> {
    vec![
        ("get_missing_is_none", get_missing_is_none::<F>),
        ("put_get_overwrite_delete", put_get_overwrite_delete::<F>),
        (
            "column_families_are_isolated",
            column_families_are_isolated::<F>,
        ),
        ("batch_applies_in_order", batch_applies_in_order::<F>),
        (
            "invalid_batch_is_rejected_whole",
            invalid_batch_is_rejected_whole::<F>,
        ),
        ("empty_batch_is_a_no_op", empty_batch_is_a_no_op::<F>),
        (
            "iterate_is_ordered_and_bounded",
            iterate_is_ordered_and_bounded::<F>,
        ),
        (
            "iterate_stops_and_propagates_errors",
            iterate_stops_and_propagates_errors::<F>,
        ),
        ("scan_respects_limit", scan_respects_limit::<F>),
        ("delete_range_is_half_open", delete_range_is_half_open::<F>),
        (
            "shard_log_ranges_do_not_overlap",
            shard_log_ranges_do_not_overlap::<F>,
        ),
        ("large_values_round_trip", large_values_round_trip::<F>),
        (
            "synced_writes_survive_reopen",
            synced_writes_survive_reopen::<F>,
        ),
    ]
}

fn kv(k: &[u8], v: &[u8]) -> (Vec<u8>, Vec<u8>) {
    (k.to_vec(), v.to_vec())
}

fn all<E: Engine>(engine: &E, cf: Cf) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
    engine.scan(cf, &[], &[0xff; 32], usize::MAX)
}

fn get_missing_is_none<F: EngineFactory>(f: &F) -> Result<()> {
    let e = f.open()?;
    for cf in Cf::ALL {
        assert_eq!(e.get(cf, b"nope")?, None);
        assert_eq!(e.get(cf, b"")?, None);
    }
    Ok(())
}

fn put_get_overwrite_delete<F: EngineFactory>(f: &F) -> Result<()> {
    let e = f.open()?;
    let mut b = WriteBatch::new();
    b.put(Cf::Raft, b"k".to_vec(), b"v1".to_vec());
    e.write(&b, true)?;
    assert_eq!(e.get(Cf::Raft, b"k")?, Some(b"v1".to_vec()));

    let mut b = WriteBatch::new();
    b.put(Cf::Raft, b"k".to_vec(), b"v2".to_vec());
    e.write(&b, false)?;
    assert_eq!(e.get(Cf::Raft, b"k")?, Some(b"v2".to_vec()));

    let mut b = WriteBatch::new();
    b.delete(Cf::Raft, b"k".to_vec());
    b.delete(Cf::Raft, b"never-existed".to_vec());
    e.write(&b, true)?;
    assert_eq!(e.get(Cf::Raft, b"k")?, None);

    // An empty value is a value, not an absence.
    let mut b = WriteBatch::new();
    b.put(Cf::Meta, b"empty".to_vec(), Vec::new());
    e.write(&b, true)?;
    assert_eq!(e.get(Cf::Meta, b"empty")?, Some(Vec::new()));
    Ok(())
}

fn column_families_are_isolated<F: EngineFactory>(f: &F) -> Result<()> {
    let e = f.open()?;
    let mut b = WriteBatch::new();
    b.put(Cf::Raft, b"k".to_vec(), b"raft".to_vec());
    b.put(Cf::Apply, b"k".to_vec(), b"apply".to_vec());
    b.put(Cf::Meta, b"k".to_vec(), b"meta".to_vec());
    e.write(&b, true)?;
    assert_eq!(e.get(Cf::Raft, b"k")?, Some(b"raft".to_vec()));
    assert_eq!(e.get(Cf::Apply, b"k")?, Some(b"apply".to_vec()));
    assert_eq!(e.get(Cf::Meta, b"k")?, Some(b"meta".to_vec()));

    e.delete_range(Cf::Apply, b"", b"\xff", true)?;
    assert_eq!(e.get(Cf::Apply, b"k")?, None);
    assert_eq!(e.get(Cf::Raft, b"k")?, Some(b"raft".to_vec()));
    assert_eq!(all(&e, Cf::Meta)?, vec![kv(b"k", b"meta")]);
    Ok(())
}

fn batch_applies_in_order<F: EngineFactory>(f: &F) -> Result<()> {
    let e = f.open()?;
    let mut seed = WriteBatch::new();
    for k in [b"a", b"b", b"c", b"d"] {
        seed.put(Cf::Raft, k.to_vec(), b"old".to_vec());
    }
    e.write(&seed, true)?;

    let mut b = WriteBatch::new();
    // Put after a covering range delete survives.
    b.delete_range(Cf::Raft, b"a".to_vec(), b"c".to_vec());
    b.put(Cf::Raft, b"b".to_vec(), b"new".to_vec());
    // Range delete after a put removes it.
    b.put(Cf::Raft, b"x".to_vec(), b"gone".to_vec());
    b.delete_range(Cf::Raft, b"x".to_vec(), b"y".to_vec());
    // Last write to a key wins; delete then put resurrects.
    b.put(Cf::Raft, b"c".to_vec(), b"1".to_vec());
    b.put(Cf::Raft, b"c".to_vec(), b"2".to_vec());
    b.delete(Cf::Raft, b"d".to_vec());
    b.put(Cf::Raft, b"d".to_vec(), b"back".to_vec());
    assert_eq!(b.len(), 8);
    assert!(b.size_bytes() > 0);
    e.write(&b, true)?;

    assert_eq!(
        all(&e, Cf::Raft)?,
        vec![kv(b"b", b"new"), kv(b"c", b"2"), kv(b"d", b"back")]
    );
    Ok(())
}

fn invalid_batch_is_rejected_whole<F: EngineFactory>(f: &F) -> Result<()> {
    let e = f.open()?;
    let mut b = WriteBatch::new();
    b.put(Cf::Raft, b"k".to_vec(), b"v".to_vec());
    b.delete_range(Cf::Raft, b"z".to_vec(), b"a".to_vec());
    match e.write(&b, true) {
        Err(Error::InvalidRange(_)) => {}
        other => panic!("expected InvalidRange, got {other:?}"),
    }
    assert_eq!(
        e.get(Cf::Raft, b"k")?,
        None,
        "no part of a rejected batch applies"
    );
    Ok(())
}

fn empty_batch_is_a_no_op<F: EngineFactory>(f: &F) -> Result<()> {
    let e = f.open()?;
    let b = WriteBatch::new();
    assert!(b.is_empty());
    e.write(&b, true)?;
    e.write(&b, false)?;
    // An empty range delete is a no-op too, not an error.
    e.delete_range(Cf::Raft, b"k", b"k", true)?;
    for cf in Cf::ALL {
        assert!(all(&e, cf)?.is_empty());
    }
    Ok(())
}

fn iterate_is_ordered_and_bounded<F: EngineFactory>(f: &F) -> Result<()> {
    let e = f.open()?;
    let keys: Vec<&[u8]> = vec![
        b"b",
        b"a\x00",
        b"a",
        b"ab",
        b"\xff",
        b"\xff\xff",
        b"\x00",
        b"a\xff",
    ];
    let mut b = WriteBatch::new();
    for k in &keys {
        b.put(Cf::Apply, k.to_vec(), k.to_vec());
    }
    e.write(&b, true)?;

    let mut sorted: Vec<Vec<u8>> = keys.iter().map(|k| k.to_vec()).collect();
    sorted.sort();
    let got: Vec<Vec<u8>> = all(&e, Cf::Apply)?.into_iter().map(|(k, _)| k).collect();
    assert_eq!(got, sorted, "byte-wise ascending order");

    // Start inclusive, end exclusive; prefixes sort before extensions.
    let got: Vec<Vec<u8>> = e
        .scan(Cf::Apply, b"a", b"ab", usize::MAX)?
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert_eq!(got, vec![b"a".to_vec(), b"a\x00".to_vec()]);

    assert!(e.scan(Cf::Apply, b"a", b"a", usize::MAX)?.is_empty());
    match e.scan(Cf::Apply, b"b", b"a", usize::MAX) {
        Err(Error::InvalidRange(_)) => {}
        other => panic!("expected InvalidRange, got {other:?}"),
    }
    // Other families see nothing.
    assert!(all(&e, Cf::Raft)?.is_empty());
    Ok(())
}

fn iterate_stops_and_propagates_errors<F: EngineFactory>(f: &F) -> Result<()> {
    let e = f.open()?;
    let mut b = WriteBatch::new();
    for i in 0u8..10 {
        b.put(Cf::Raft, vec![i], vec![i]);
    }
    e.write(&b, true)?;

    let mut seen = Vec::new();
    e.iterate(Cf::Raft, &[0], &[10], &mut |k, _| {
        seen.push(k[0]);
        Ok(seen.len() < 3)
    })?;
    assert_eq!(seen, vec![0, 1, 2]);

    let mut calls = 0;
    let res = e.iterate(Cf::Raft, &[0], &[10], &mut |k, _| {
        calls += 1;
        if k[0] == 4 {
            return Err(Error::InvalidRange("from callback".to_string()));
        }
        Ok(true)
    });
    assert!(matches!(res, Err(Error::InvalidRange(m)) if m == "from callback"));
    assert_eq!(calls, 5);
    Ok(())
}

fn scan_respects_limit<F: EngineFactory>(f: &F) -> Result<()> {
    let e = f.open()?;
    let mut b = WriteBatch::new();
    for i in 0u8..10 {
        b.put(Cf::Meta, vec![i], vec![]);
    }
    e.write(&b, true)?;
    assert_eq!(e.scan(Cf::Meta, &[0], &[255], 0)?.len(), 0);
    assert_eq!(e.scan(Cf::Meta, &[0], &[255], 4)?.len(), 4);
    assert_eq!(e.scan(Cf::Meta, &[0], &[255], 100)?.len(), 10);
    assert_eq!(
        e.scan(Cf::Meta, &[8], &[255], 100)?,
        vec![kv(&[8], &[]), kv(&[9], &[])]
    );
    Ok(())
}

fn delete_range_is_half_open<F: EngineFactory>(f: &F) -> Result<()> {
    let e = f.open()?;
    let mut b = WriteBatch::new();
    for i in 0u8..6 {
        b.put(Cf::Raft, vec![i], vec![i]);
    }
    e.write(&b, true)?;
    e.delete_range(Cf::Raft, &[1], &[4], true)?;
    let left: Vec<u8> = all(&e, Cf::Raft)?.into_iter().map(|(k, _)| k[0]).collect();
    assert_eq!(left, vec![0, 4, 5]);
    Ok(())
}

fn shard_log_ranges_do_not_overlap<F: EngineFactory>(f: &F) -> Result<()> {
    let e = f.open()?;
    let mut b = WriteBatch::new();
    for shard in [1u64, 2, 3, u64::MAX] {
        for index in [0u64, 1, 2, u64::MAX] {
            b.put(Cf::Raft, keys::log_key(shard, index), vec![]);
        }
        b.put(
            Cf::Raft,
            keys::shard_key(keys::TAG_HARD_STATE, shard),
            vec![],
        );
    }
    e.write(&b, true)?;
    for shard in [2u64, u64::MAX] {
        let (start, end) = keys::log_range_all(shard);
        e.delete_range(Cf::Raft, &start, &end, true)?;
    }
    for shard in [1u64, 2, 3, u64::MAX] {
        let (start, end) = keys::log_range_all(shard);
        let n = e.scan(Cf::Raft, &start, &end, usize::MAX)?.len();
        let expected = if shard == 2 || shard == u64::MAX {
            0
        } else {
            4
        };
        assert_eq!(n, expected, "shard {shard}");
        let hs = keys::shard_key(keys::TAG_HARD_STATE, shard);
        assert!(
            e.get(Cf::Raft, &hs)?.is_some(),
            "hard state of shard {shard} untouched"
        );
    }
    // A bounded slice of one shard's log.
    let (start, end) = keys::log_range(1, 1, 3);
    assert_eq!(e.scan(Cf::Raft, &start, &end, usize::MAX)?.len(), 2);
    Ok(())
}

fn large_values_round_trip<F: EngineFactory>(f: &F) -> Result<()> {
    let e = f.open()?;
    let value: Vec<u8> = (0..(4usize << 20)).map(|i| (i % 251) as u8).collect();
    let mut b = WriteBatch::new();
    b.put(Cf::Apply, b"big".to_vec(), value.clone());
    assert!(b.size_bytes() >= value.len());
    e.write(&b, true)?;
    assert_eq!(e.get(Cf::Apply, b"big")?, Some(value));
    Ok(())
}

fn synced_writes_survive_reopen<F: EngineFactory>(f: &F) -> Result<()> {
    {
        let e = f.open()?;
        let mut b = WriteBatch::new();
        b.put(Cf::Raft, b"r".to_vec(), b"1".to_vec());
        b.put(Cf::Apply, b"a".to_vec(), b"2".to_vec());
        b.put(Cf::Meta, b"m".to_vec(), b"3".to_vec());
        b.put(Cf::Meta, b"gone".to_vec(), b"4".to_vec());
        e.write(&b, true)?;
        let mut b = WriteBatch::new();
        b.delete(Cf::Meta, b"gone".to_vec());
        e.write(&b, true)?;
    }
    let e = f.open()?;
    assert_eq!(e.get(Cf::Raft, b"r")?, Some(b"1".to_vec()));
    assert_eq!(e.get(Cf::Apply, b"a")?, Some(b"2".to_vec()));
    assert_eq!(e.get(Cf::Meta, b"m")?, Some(b"3".to_vec()));
    assert_eq!(e.get(Cf::Meta, b"gone")?, None);
    Ok(())
}
