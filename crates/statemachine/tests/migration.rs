//! Resharding at the state-machine level: slots and their lock state move
//! from one table to another through `ExportSlots` / `ImportSlots`.

use fencelock_statemachine::*;
use proptest::prelude::*;

const T0: u64 = 1_700_000_000_000;

/// One shard replica driven by hand. The epoch passed in every context is
/// the table's own (what the server does), so `ImportSlots` moves it.
struct Shard {
    table: LockTable,
    index: u64,
    now_ms: u64,
}

impl Shard {
    fn new(epoch: u64, slots: SlotSet) -> Shard {
        Shard::new_at(epoch, slots, T0)
    }

    /// A shard whose lease clock starts at `now_ms`.
    fn new_at(epoch: u64, slots: SlotSet, now_ms: u64) -> Shard {
        let mut s = Shard {
            table: LockTable::with_slots(Limits::default(), slots).unwrap(),
            index: 0,
            now_ms,
        };
        s.apply_at_epoch(
            Command::LeaderChanged {
                clock_offset_allowance_ms: 0,
            },
            epoch,
        )
        .reply
        .unwrap();
        s
    }

    fn apply_at_epoch(&mut self, c: Command, epoch: u64) -> Outcome {
        self.index += 1;
        let ctx = ApplyContext {
            index: self.index,
            term: 1,
            epoch,
            now_ms: self.now_ms,
        };
        self.table.apply(&c, &ctx)
    }

    fn apply_full(&mut self, c: Command) -> Outcome {
        let epoch = self.table.epoch();
        self.apply_at_epoch(c, epoch)
    }

    fn apply(&mut self, c: Command) -> Result<Reply, LockError> {
        self.apply_full(c).reply
    }

    fn acquire(
        &mut self,
        res: &ResourceName,
        req: &str,
        lease: u8,
        wait_ms: u64,
    ) -> Result<AcquireReply, LockError> {
        match self.apply(Command::Acquire {
            owner: Owner::anonymous(),
            resource: res.clone(),
            request_id: RequestId::new(req.as_bytes().to_vec()).unwrap(),
            lease_id: LeaseId([lease; 16]),
            lease_ttl_ms: 10_000,
            wait_timeout_ms: wait_ms,
            value: fencelock_statemachine::HolderValue::none(),
            mode: fencelock_statemachine::AcquireMode::Exclusive,
        })? {
            Reply::Acquire(a) => Ok(a),
            other => panic!("unexpected {other:?}"),
        }
    }

    fn export(&mut self, id: u64, slots: SlotSet) -> Result<Vec<u8>, LockError> {
        match self.apply(Command::ExportSlots {
            migration_id: id,
            slots,
        })? {
            Reply::Exported { data, .. } => Ok(data),
            other => panic!("unexpected {other:?}"),
        }
    }

    fn import(
        &mut self,
        id: u64,
        epoch: u64,
        slots: SlotSet,
        data: Vec<u8>,
    ) -> Result<Reply, LockError> {
        self.import_at(id, epoch, slots, data, None)
    }

    /// An import, with the source's lease clock at its export answer if
    /// given.
    fn import_at(
        &mut self,
        id: u64,
        epoch: u64,
        slots: SlotSet,
        data: Vec<u8>,
        export_clock_ms: Option<u64>,
    ) -> Result<Reply, LockError> {
        self.apply(Command::ImportSlots {
            migration_id: id,
            epoch,
            slots,
            data,
            clock_offset_allowance_ms: 500,
            export_clock_ms,
        })
    }

    /// The source's export and its lease clock at the answer.
    fn export_with_clock(&mut self, id: u64, slots: SlotSet) -> (Vec<u8>, u64) {
        match self.apply(Command::ExportSlots {
            migration_id: id,
            slots,
        }) {
            Ok(Reply::Exported { data, clock_ms, .. }) => (data, clock_ms),
            other => panic!("unexpected {other:?}"),
        }
    }

    /// Applies a `Tick` at `now_ms`; how many resources are held after.
    fn held_after_tick_at(&mut self, now_ms: u64) -> usize {
        self.now_ms = now_ms;
        self.apply(Command::Tick).unwrap();
        self.table.held_count()
    }
}

fn name(s: &str) -> ResourceName {
    ResourceName::parse(s).unwrap()
}

fn token_of(a: &AcquireReply) -> FencingToken {
    match a.status {
        AcquireStatus::Held { token, .. } => token,
        other => panic!("not held: {other:?}"),
    }
}

fn only(slot: u32) -> SlotSet {
    [slot].into_iter().collect()
}

/// Source owns every slot at epoch 1; the target owns none at epoch 2.
fn pair() -> (Shard, Shard) {
    (
        Shard::new(1, SlotSet::full()),
        Shard::new(2, SlotSet::EMPTY),
    )
}

#[test]
fn held_lock_moves_with_its_lease_and_the_next_grant_gets_a_higher_epoch() {
    let (mut src, mut dst) = pair();
    let r = name("acme/jobs/a");
    let held = src.acquire(&r, "q1", 1, 0).unwrap();
    let t1 = token_of(&held);
    let data = src.export(7, only(slot_of(&r))).unwrap();

    // The source no longer serves the slot: a stale route is refused.
    let err = src.acquire(&r, "q2", 2, 0).unwrap_err();
    assert!(matches!(err, LockError::WrongShard { .. }), "{err:?}");
    // The target does not serve it before the import either.
    assert!(matches!(
        dst.acquire(&r, "q2", 2, 0).unwrap_err(),
        LockError::WrongShard { .. }
    ));

    dst.import(7, 3, only(slot_of(&r)), data).unwrap();
    assert_eq!(dst.table.epoch(), 3);
    // The holder keeps its lease there: renew and release by lease id work.
    dst.apply(Command::Renew {
        owner: Owner::anonymous(),
        resource: r.clone(),
        lease_id: LeaseId([1; 16]),
        lease_ttl_ms: 10_000,
    })
    .unwrap();
    assert_eq!(dst.table.view(&r).unwrap().token, t1);
    dst.apply(Command::Release {
        owner: Owner::anonymous(),
        resource: r.clone(),
        lease_id: LeaseId([1; 16]),
    })
    .unwrap();
    let next = dst.acquire(&r, "q3", 3, 0).unwrap();
    let t2 = token_of(&next);
    assert!(t2 > t1 && t2.epoch() == 3, "{t1} then {t2}");
}

#[test]
fn retried_acquire_after_a_move_finds_the_same_lease() {
    let (mut src, mut dst) = pair();
    let r = name("acme/jobs/b");
    let first = src.acquire(&r, "retry-me", 4, 0).unwrap();
    let data = src.export(1, only(slot_of(&r))).unwrap();
    dst.import(1, 9, only(slot_of(&r)), data).unwrap();
    let again = dst.acquire(&r, "retry-me", 5, 0).unwrap();
    assert!(again.deduplicated);
    assert_eq!(again.lease_id, first.lease_id);
    assert_eq!(token_of(&again), token_of(&first));
}

#[test]
fn waiters_move_in_order_and_are_told_their_wait_moved() {
    let (mut src, mut dst) = pair();
    let r = name("acme/jobs/c");
    src.acquire(&r, "h", 1, 0).unwrap();
    src.acquire(&r, "w1", 2, 60_000).unwrap();
    src.acquire(&r, "w2", 3, 60_000).unwrap();
    let out = src.apply_full(Command::ExportSlots {
        migration_id: 1,
        slots: only(slot_of(&r)),
    });
    let moved: Vec<LeaseId> = out
        .events
        .iter()
        .filter_map(|e| match e {
            Event::WaitMoved { lease_id, .. } => Some(*lease_id),
            _ => None,
        })
        .collect();
    assert_eq!(moved, vec![LeaseId([2; 16]), LeaseId([3; 16])]);
    assert_eq!(src.table.waiter_count(), 0);
    let Ok(Reply::Exported {
        data, resources, ..
    }) = out.reply
    else {
        panic!("{:?}", out.reply)
    };
    assert_eq!(resources, 1);
    dst.import(1, 5, only(slot_of(&r)), data).unwrap();
    assert_eq!(dst.table.waiter_count(), 2);
    let out = dst.apply_full(Command::Release {
        owner: Owner::anonymous(),
        resource: r.clone(),
        lease_id: LeaseId([1; 16]),
    });
    let granted: Vec<(LeaseId, FencingToken)> = out
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Granted {
                lease_id, token, ..
            } => Some((*lease_id, *token)),
            _ => None,
        })
        .collect();
    assert_eq!(granted.len(), 1);
    assert_eq!(
        granted[0].0,
        LeaseId([2; 16]),
        "FIFO order survives the move"
    );
    assert_eq!(granted[0].1.epoch(), 5);
}

/// A retry attached to a lease or a wait before the move: after it, the
/// target still knows which attempt is the latest, so the gone first
/// caller's `Cancel` (proposed by the target's leader) cannot end a lease or
/// a wait the retry was told of, and the retry's own still can.
#[test]
fn attempts_of_holders_and_waiters_survive_a_move() {
    let (mut src, mut dst) = pair();
    let r = name("acme/jobs/attempts");
    src.acquire(&r, "h", 1, 0).unwrap();
    let held_retry = src.acquire(&r, "h", 1, 0).unwrap();
    src.acquire(&r, "w", 2, 60_000).unwrap();
    let wait_retry = src.acquire(&r, "w", 2, 60_000).unwrap();
    assert_eq!(held_retry.attempt, FIRST_ATTEMPT + 1);
    assert_eq!(wait_retry.attempt, FIRST_ATTEMPT + 1);
    let data = src.export(3, only(slot_of(&r))).unwrap();
    dst.import(3, 4, only(slot_of(&r)), data).unwrap();

    let cancel = |dst: &mut Shard, lease: u8, attempt: u32| {
        dst.apply(Command::Cancel {
            resource: r.clone(),
            lease_id: LeaseId([lease; 16]),
            attempt,
        })
    };
    for lease in [1, 2] {
        assert_eq!(
            cancel(&mut dst, lease, FIRST_ATTEMPT),
            Ok(Reply::Cancelled { removed: false })
        );
    }
    assert_eq!(dst.table.view(&r).unwrap().lease_id, LeaseId([1; 16]));
    assert_eq!(dst.table.waiter_count(), 1);
    assert_eq!(
        cancel(&mut dst, 2, wait_retry.attempt),
        Ok(Reply::Cancelled { removed: true })
    );
    assert_eq!(dst.table.waiter_count(), 0);
    assert_eq!(
        cancel(&mut dst, 1, held_retry.attempt),
        Ok(Reply::Cancelled { removed: true })
    );
    assert!(dst.table.view(&r).is_none());
}

#[test]
fn export_and_import_are_idempotent_by_migration_id() {
    let (mut src, mut dst) = pair();
    let r = name("acme/jobs/d");
    src.acquire(&r, "h", 1, 0).unwrap();
    let a = src.export(3, only(slot_of(&r))).unwrap();
    let b = src.export(3, only(slot_of(&r))).unwrap();
    assert_eq!(a, b, "a new leader asking again gets the same export");
    assert!(src.export(3, only(slot_of(&r) ^ 1)).is_err());
    dst.import(3, 4, only(slot_of(&r)), a.clone()).unwrap();
    let before = dst.table.snapshot();
    assert_eq!(
        dst.import(3, 4, only(slot_of(&r)), a).unwrap(),
        Reply::Imported { resources: 0 }
    );
    // Only the position moved (a new entry was applied); the lock state is
    // unchanged.
    assert_eq!(dst.table.held_count(), 1);
    assert_eq!(LockTable::restore(&before).unwrap().held_count(), 1);
    assert_eq!(
        src.apply(Command::DropExport { migration_id: 3 }).unwrap(),
        Reply::ExportDropped { existed: true }
    );
    assert!(src.table.pending_exports().is_empty());
}

fn close(shard: &mut Shard, id: u64, slots: SlotSet) -> (Option<SlotSet>, bool) {
    match shard.apply(Command::CloseMigration {
        migration_id: id,
        slots,
    }) {
        Ok(Reply::MigrationClosed {
            pending_export,
            owns_slots,
            ..
        }) => (pending_export, owns_slots),
        other => panic!("unexpected {other:?}"),
    }
}

/// A target closed for a migration it has not imported never imports it
/// afterwards (a delayed or repeated import cannot make two owners), and the
/// source can then take its kept export back.
#[test]
fn a_target_closed_before_the_import_refuses_it_for_good_and_the_source_takes_it_back() {
    let (mut src, mut dst) = pair();
    let r = name("acme/jobs/closed");
    let slot = only(slot_of(&r));
    src.acquire(&r, "h", 1, 0).unwrap();
    let data = src.export(7, slot).unwrap();
    assert_eq!(close(&mut dst, 7, slot), (None, false));
    let err = dst.import(7, 9, slot, data.clone()).unwrap_err();
    assert!(matches!(err, LockError::MigrationRefused { .. }), "{err:?}");
    assert!(!dst.table.owns(&r));
    // Closing again answers the same.
    assert_eq!(close(&mut dst, 7, slot), (None, false));
    // The source's export is still there; the source takes it back at the
    // migration's epoch and is the only owner, with the lease intact.
    assert_eq!(close(&mut src, 7, slot), (Some(slot), false));
    src.import(7, 9, slot, data.clone()).unwrap();
    assert!(src.table.owns(&r));
    assert_eq!(src.table.epoch(), 9);
    assert_eq!(src.table.view(&r).unwrap().lease_id, LeaseId([1; 16]));
    // Repeating the take-back changes nothing; a new export of the closed
    // migration is refused.
    assert_eq!(
        src.import(7, 9, slot, data).unwrap(),
        Reply::Imported { resources: 0 }
    );
    src.apply(Command::DropExport { migration_id: 7 }).unwrap();
    let err = src.export(7, slot).unwrap_err();
    assert!(matches!(err, LockError::MigrationRefused { .. }), "{err:?}");
    assert!(src.table.owns(&r));
}

/// docs/safety.md 7d: a source left keeping the export of a migration an
/// older orchestrator abandoned takes it back even after it took part in
/// later migrations of other slots (which settle every older id on it).
#[test]
fn a_source_takes_its_kept_export_back_after_later_migrations_of_other_slots() {
    let (mut src, mut dst) = pair();
    let r = name("acme/jobs/left-behind");
    let slot = only(slot_of(&r));
    src.acquire(&r, "h", 1, 0).unwrap();
    let data = src.export(5, slot).unwrap();
    // Later migrations on the source: one out, one back in, of other slots.
    let other = only(slot_of(&r) ^ 1);
    let out = src.export(6, other).unwrap();
    dst.import(6, 7, other, out).unwrap();
    let back = dst.export(8, other).unwrap();
    src.import(8, 9, other, back).unwrap();
    src.apply(Command::DropExport { migration_id: 6 }).unwrap();
    assert_eq!(close(&mut src, 5, slot), (Some(slot), false));
    // The take-back at a fresh epoch goes through, with the lease intact.
    src.import(5, 10, slot, data.clone()).unwrap();
    assert!(src.table.owns(&r));
    assert_eq!(src.table.epoch(), 10);
    assert_eq!(src.table.view(&r).unwrap().lease_id, LeaseId([1; 16]));
    // Repeating it changes nothing; nobody else may import migration 5.
    assert_eq!(
        src.import(5, 10, slot, data.clone()).unwrap(),
        Reply::Imported { resources: 0 }
    );
    let err = dst.import(5, 11, slot, data).unwrap_err();
    assert!(matches!(err, LockError::MigrationRefused { .. }), "{err:?}");
}

/// A source closed before it exported never exports that migration, and an
/// import closed after it applied reports the slots as served.
#[test]
fn close_freezes_what_a_shard_did_for_a_migration() {
    let (mut src, mut dst) = pair();
    let r = name("acme/jobs/frozen");
    let slot = only(slot_of(&r));
    src.acquire(&r, "h", 1, 0).unwrap();
    assert_eq!(close(&mut src, 4, slot), (None, true));
    let err = src.export(4, slot).unwrap_err();
    assert!(matches!(err, LockError::MigrationRefused { .. }), "{err:?}");
    assert!(src.table.owns(&r));
    assert!(src.table.pending_exports().is_empty());
    // A later migration of the same slots goes through.
    let data = src.export(5, slot).unwrap();
    dst.import(5, 6, slot, data.clone()).unwrap();
    assert_eq!(close(&mut dst, 5, slot), (None, true));
    assert_eq!(close(&mut src, 5, slot), (Some(slot), false));
    // The import is still answered as done after the close.
    assert_eq!(
        dst.import(5, 6, slot, data).unwrap(),
        Reply::Imported { resources: 0 }
    );
    // An import of an older migration into a shard settled past it is
    // refused, not answered as done.
    let other = only(slot_of(&r) ^ 1);
    let err = dst.import(3, 8, other, Vec::new()).unwrap_err();
    assert!(matches!(err, LockError::MigrationRefused { .. }), "{err:?}");
}

/// Once a shard finished a migration (the import applied, or the export
/// was dropped), a stale orchestrator's steps of it are refused, and a
/// close of an older migration says that a later one happened here.
#[test]
fn a_finished_migration_refuses_stale_steps_and_close_reports_later_ones() {
    let (mut src, mut dst) = pair();
    let r = name("acme/jobs/stale");
    let slot = only(slot_of(&r));
    src.acquire(&r, "h", 1, 0).unwrap();
    let data = src.export(5, slot).unwrap();
    dst.import(5, 6, slot, data.clone()).unwrap();
    src.apply(Command::DropExport { migration_id: 5 }).unwrap();
    // The slots come back to the source in a later migration.
    let back = dst.export(6, slot).unwrap();
    src.import(6, 7, slot, back).unwrap();
    // A stale export of migration 5 would take them away again: refused.
    let err = src.export(5, slot).unwrap_err();
    assert!(matches!(err, LockError::MigrationRefused { .. }), "{err:?}");
    assert!(src.table.owns(&r));
    let later = |shard: &mut Shard, id: u64| match shard.apply(Command::CloseMigration {
        migration_id: id,
        slots: slot,
    }) {
        Ok(Reply::MigrationClosed {
            later_migration, ..
        }) => later_migration,
        other => panic!("unexpected {other:?}"),
    };
    assert!(later(&mut src, 5), "the source imported migration 6");
    assert!(later(&mut dst, 5), "the target keeps migration 6's export");
    assert!(!later(&mut src, 6));
}

/// The close travels in the log like every command.
#[test]
fn close_migration_round_trips_through_the_codec() {
    let c = Command::CloseMigration {
        migration_id: 12,
        slots: only(77),
    };
    assert_eq!(Command::decode(&c.encode()).unwrap(), c);
}

#[test]
fn imports_that_would_break_token_order_or_ownership_are_refused_and_change_nothing() {
    let (mut src, mut dst) = pair();
    let r = name("acme/jobs/e");
    src.acquire(&r, "h", 1, 0).unwrap();
    let slot = slot_of(&r);
    let data = src.export(1, only(slot)).unwrap();
    let before = dst.table.clone();
    // Not above the target's epoch.
    let err = dst.import(1, 2, only(slot), data.clone()).unwrap_err();
    assert!(matches!(err, LockError::StaleEpoch { .. }), "{err:?}");
    // An epoch below the target's (the source's own, here).
    let err = dst.import(1, 1, only(slot), data.clone()).unwrap_err();
    assert!(matches!(err, LockError::StaleEpoch { .. }), "{err:?}");
    // Data outside the slots.
    let err = dst.import(1, 6, only(slot ^ 1), data.clone()).unwrap_err();
    assert!(matches!(err, LockError::MigrationRefused { .. }), "{err:?}");
    // Garbage.
    let err = dst.import(1, 6, only(slot), vec![1, 2, 3]).unwrap_err();
    assert!(matches!(err, LockError::MigrationRefused { .. }), "{err:?}");
    let after = dst.table.clone();
    // The refused entries still advanced the applied index; compare the rest.
    assert_eq!(after.owned_slots(), before.owned_slots());
    assert_eq!(after.epoch(), before.epoch());
    assert_eq!(after.held_count(), 0);
    // Slots the source does not own cannot be exported.
    let err = src.export(2, only(slot)).unwrap_err();
    assert!(matches!(err, LockError::MigrationRefused { .. }), "{err:?}");
    after.check_invariants().unwrap();
}

#[test]
fn snapshots_carry_ownership_and_pending_exports() {
    let (mut src, _) = pair();
    let r = name("acme/jobs/f");
    src.acquire(&r, "h", 1, 0).unwrap();
    src.export(1, only(slot_of(&r))).unwrap();
    let bytes = src.table.snapshot();
    let restored = LockTable::restore(&bytes).unwrap();
    assert_eq!(restored.snapshot(), bytes);
    assert!(!restored.owns(&r));
    assert_eq!(restored.pending_exports(), vec![1]);
    assert_eq!(restored.owned_slots().len(), SLOT_COUNT - 1);
}

/// One step of a random history over two shards.
#[derive(Clone, Debug)]
enum Op {
    Acquire {
        shard: usize,
        res: usize,
        wait: bool,
    },
    Release {
        shard: usize,
        res: usize,
    },
    Move {
        res: usize,
    },
    Advance {
        ms: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..2usize, 0..6usize, any::<bool>()).prop_map(|(shard, res, wait)| Op::Acquire { shard, res, wait }),
        3 => (0..2usize, 0..6usize).prop_map(|(shard, res)| Op::Release { shard, res }),
        1 => (0..6usize).prop_map(|res| Op::Move { res }),
        1 => (1..20_000u64).prop_map(|ms| Op::Advance { ms }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Whatever routes requests and however slots move back and forth, a
    /// resource has at most one holder across both shards and its tokens
    /// strictly increase.
    #[test]
    fn tokens_rise_and_holders_stay_single_across_random_moves(ops in proptest::collection::vec(op(), 1..120)) {
        let names: Vec<ResourceName> = (0..6).map(|i| name(&format!("acme/r{i}"))).collect();
        let mut shards = [Shard::new(1, SlotSet::full()), Shard::new(2, SlotSet::EMPTY)];
        let mut next_epoch = 3u64;
        let mut next_migration = 1u64;
        let mut highest: std::collections::BTreeMap<usize, FencingToken> = Default::default();
        let mut holder: std::collections::BTreeMap<usize, LeaseId> = Default::default();
        let mut lease = 0u8;
        for op in ops {
            let mut events = Vec::new();
            match op {
                Op::Acquire { shard, res, wait } => {
                    lease = lease.wrapping_add(1);
                    let out = shards[shard].apply_full(Command::Acquire {
                        owner: Owner::anonymous(),
                        resource: names[res].clone(),
                        request_id: RequestId::new(vec![lease]).unwrap(),
                        lease_id: LeaseId([lease; 16]),
                        lease_ttl_ms: 5_000,
                        wait_timeout_ms: if wait { 30_000 } else { 0 },
                        value: fencelock_statemachine::HolderValue::none(), mode: fencelock_statemachine::AcquireMode::Exclusive,
                    });
                    events = out.events;
                }
                Op::Release { shard, res } => {
                    if let Some(l) = holder.get(&res) {
                        let out = shards[shard].apply_full(Command::Release { resource: names[res].clone(), owner: Owner::anonymous(), lease_id: *l });
                        events = out.events;
                    }
                }
                Op::Move { res } => {
                    let slot = slot_of(&names[res]);
                    let (from, to) = if shards[0].table.owns(&names[res]) { (0, 1) } else { (1, 0) };
                    let id = next_migration;
                    next_migration += 1;
                    let out = shards[from].apply_full(Command::ExportSlots { migration_id: id, slots: only(slot) });
                    let Ok(Reply::Exported { data, .. }) = out.reply else { panic!("{:?}", out.reply) };
                    shards[to].import(id, next_epoch, only(slot), data).unwrap();
                    next_epoch += 1;
                    shards[from].apply(Command::DropExport { migration_id: id }).unwrap();
                }
                Op::Advance { ms } => {
                    for s in shards.iter_mut() {
                        s.now_ms += ms;
                        events.extend(s.apply_full(Command::Tick).events);
                    }
                }
            }
            for e in events {
                match e {
                    Event::Granted { resource, lease_id, token, .. } => {
                        let res = names.iter().position(|n| *n == resource).unwrap();
                        prop_assert!(!holder.contains_key(&res), "two holders of {}", resource);
                        let prev = highest.get(&res).copied().unwrap_or(FencingToken::NONE);
                        prop_assert!(token > prev, "token {} after {} on {}", token, prev, resource);
                        highest.insert(res, token);
                        holder.insert(res, lease_id);
                    }
                    Event::LeaseEnded { resource, .. } => {
                        let res = names.iter().position(|n| *n == resource).unwrap();
                        holder.remove(&res);
                    }
                    _ => {}
                }
            }
            for s in &shards {
                s.table.check_invariants().map_err(TestCaseError::fail)?;
            }
            // Every slot of these resources is served by exactly one shard.
            for n in &names {
                prop_assert!(shards[0].table.owns(n) != shards[1].table.owns(n));
            }
        }
    }
}

#[test]
fn an_inconsistent_export_is_refused_whole() {
    let (mut src, mut dst) = pair();
    let r = name("acme/jobs/g");
    src.acquire(&r, "holder-req", 1, 0).unwrap();
    let mut data = src.export(1, only(slot_of(&r))).unwrap();
    // Damage the holder's copy of its request id (the first occurrence; the
    // dedup entry keeps the original): the holder then has no dedup entry.
    let needle = b"holder-req";
    let at = data
        .windows(needle.len())
        .position(|w| w == needle)
        .unwrap();
    data[at] = b'X';
    let err = dst.import(1, 3, only(slot_of(&r)), data).unwrap_err();
    assert!(matches!(err, LockError::MigrationRefused { .. }), "{err:?}");
    assert_eq!(dst.table.held_count(), 0);
    assert!(!dst.table.owns(&r), "a refused import takes no slots");
    dst.table.check_invariants().unwrap();
}

/// Two shards' lease clocks need not agree: each starts from a wall clock
/// once and then runs on leaders' monotonic clocks. An import that carries
/// the source's clock keeps what was left of each lease, measured from the
/// import, whether the target's clock reads a minute behind or ahead.
#[test]
fn an_imported_lease_keeps_the_time_it_had_left_whatever_the_two_lease_clocks_read() {
    let r = name("acme/clocks");
    let slot = slot_of(&r);
    for target_offset_ms in [-60_000i64, 0, 60_000] {
        let mut src = Shard::new(1, SlotSet::full());
        src.acquire(&r, "a", 1, 0).unwrap(); // TTL 10 s at T0
        src.now_ms = T0 + 4_000; // 6 s left at the export
        let (data, clock_ms) = src.export_with_clock(1, only(slot));
        assert_eq!(clock_ms, T0 + 4_000);

        let target_t0 = T0.saturating_add_signed(target_offset_ms);
        let mut dst = Shard::new_at(2, SlotSet::EMPTY, target_t0);
        let import_at = target_t0 + 4_100;
        dst.now_ms = import_at;
        dst.import_at(1, 5, only(slot), data, Some(clock_ms))
            .unwrap();
        // 6 s left (plus the 500 ms allowance) from the import, on the
        // target's clock.
        assert_eq!(
            dst.held_after_tick_at(import_at + 5_900),
            1,
            "{target_offset_ms}"
        );
        assert_eq!(
            dst.held_after_tick_at(import_at + 6_400),
            1,
            "{target_offset_ms}"
        );
        assert_eq!(
            dst.held_after_tick_at(import_at + 6_600),
            0,
            "{target_offset_ms}"
        );
    }
}

/// Without the source's clock (the form a node of the previous release
/// sends) times are taken as they are: a target whose lease clock reads a
/// minute ahead would end the lease at once. This is why the orchestrator
/// sends the clock whenever the target's replicas read it.
#[test]
fn an_import_without_the_source_clock_takes_times_as_they_are() {
    let r = name("acme/clocks");
    let slot = slot_of(&r);
    let mut src = Shard::new(1, SlotSet::full());
    src.acquire(&r, "a", 1, 0).unwrap();
    src.now_ms = T0 + 4_000;
    let data = src.export(1, only(slot)).unwrap();
    let mut dst = Shard::new(2, SlotSet::EMPTY);
    dst.now_ms = T0 + 64_000;
    dst.import(1, 5, only(slot), data).unwrap();
    assert_eq!(dst.held_after_tick_at(T0 + 64_001), 0);
}
