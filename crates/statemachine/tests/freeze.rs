//! A frozen table (what the store's snapshot thread encodes while the loop
//! goes on applying) keeps the state it was frozen with, however the table
//! changes after: records and remembered acquires added, changed and
//! removed.

#[allow(dead_code)] // this file needs only some of the helpers
mod common;
use common::*;
use fencelock_statemachine::*;

fn acquire(s: &mut Shard, i: u32) -> Result<Reply, LockError> {
    s.apply(Command::Acquire {
        resource: name(&format!("acme/r{}", i % 3_000)),
        owner: Owner::new("acme/worker").unwrap(),
        request_id: RequestId::new(format!("q{i}").into_bytes()).unwrap(),
        lease_id: LeaseId((u128::from(i) + 1).to_be_bytes()),
        lease_ttl_ms: 10_000,
        wait_timeout_ms: 0,
        value: HolderValue::default(),
        mode: AcquireMode::Exclusive,
    })
}

fn release(s: &mut Shard, i: u32) {
    let _ = s.apply(Command::Release {
        owner: Owner::new("acme/worker").unwrap(),
        resource: name(&format!("acme/r{}", i % 3_000)),
        lease_id: LeaseId((u128::from(i) + 1).to_be_bytes()),
    });
}

#[test]
fn a_frozen_table_encodes_the_state_it_was_frozen_with() {
    let mut s = Shard::new();
    s.check_each_step = false;
    for i in 0..6_000 {
        let _ = acquire(&mut s, i);
        if i % 2 == 0 {
            release(&mut s, i);
        }
    }
    let before = s.table.snapshot();
    let frozen = s.table.freeze();
    assert_eq!(frozen.applied_index(), s.index);
    // Every kind of change after the freeze: releases (records removed,
    // remembered acquires ended), new grants, and time passing far enough
    // that leases expire and ended acquires are forgotten.
    for i in 6_000..9_000 {
        let _ = acquire(&mut s, i);
        release(&mut s, i - 5_999);
    }
    s.now_ms += 120_000;
    for _ in 0..50 {
        let _ = s.apply(Command::Tick);
    }
    assert_ne!(s.table.snapshot(), before, "the table moved on");
    assert_eq!(frozen.encode(), before, "the frozen copy did not");
    assert_eq!(s.table.check_invariants(), Ok(()));
    let restored = LockTable::restore(&frozen.encode()).unwrap();
    assert_eq!(restored.snapshot(), before);
}
