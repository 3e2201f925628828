//! Shared locks and semaphores at the state-machine level: who may hold
//! beside whom, FIFO across modes, hand-offs on release and expiry, the
//! fixed kind of a resource, and the encodings that keep a table of
//! exclusive locks readable by the previous release.

mod common;

use common::{name, snapshot_version, Shard, T0};
use fencelock_statemachine::limits::MAX_HOLDERS_PER_RESOURCE;
use fencelock_statemachine::*;
const TTL_MS: u64 = 10_000;
/// Longer than a lease: waiters outlive the holders they wait for.
const WAIT_MS: u64 = 25_000;

const EXCL: AcquireMode = AcquireMode::Exclusive;
const SHARED: AcquireMode = AcquireMode::Shared;

fn sem(permits: u32) -> AcquireMode {
    AcquireMode::Semaphore { permits }
}

impl Shard {
    /// Acquires `res` in `mode` as lease `lease`, waiting up to `wait_ms`.
    fn acquire(
        &mut self,
        res: &str,
        lease: u8,
        mode: AcquireMode,
        wait_ms: u64,
    ) -> Result<AcquireStatus, LockError> {
        match self.apply(acquire_cmd(res, lease, mode, wait_ms))? {
            Reply::Acquire(a) => Ok(a.status),
            other => panic!("unexpected {other:?}"),
        }
    }

    fn holds(&mut self, res: &str, lease: u8, mode: AcquireMode) -> FencingToken {
        match self.acquire(res, lease, mode, 5_000) {
            Ok(AcquireStatus::Held { token, .. }) => token,
            other => panic!("lease {lease} in {mode:?} not granted: {other:?}"),
        }
    }

    fn waits(&mut self, res: &str, lease: u8, mode: AcquireMode) {
        match self.acquire(res, lease, mode, WAIT_MS) {
            Ok(AcquireStatus::Queued { .. }) => {}
            other => panic!("lease {lease} in {mode:?} does not wait: {other:?}"),
        }
    }

    fn release(&mut self, res: &str, lease: u8) -> Outcome {
        let out = self.apply_full(Command::Release {
            owner: Owner::anonymous(),
            resource: name(res),
            lease_id: LeaseId([lease; 16]),
        });
        assert_eq!(out.reply, Ok(Reply::Released { released: true }));
        out
    }

    /// The leases holding `res`, oldest grant first.
    fn holders(&self, res: &str) -> Vec<u8> {
        match self.table.view(&name(res)) {
            Some(view) => view.holders.iter().map(|h| h.lease_id.0[0]).collect(),
            None => Vec::new(),
        }
    }
}

fn acquire_cmd(res: &str, lease: u8, mode: AcquireMode, wait_ms: u64) -> Command {
    Command::Acquire {
        resource: name(res),
        owner: Owner::anonymous(),
        request_id: RequestId::new(vec![b'r', lease]).unwrap(),
        lease_id: LeaseId([lease; 16]),
        lease_ttl_ms: TTL_MS,
        wait_timeout_ms: wait_ms,
        value: HolderValue::none(),
        mode,
    }
}

/// The leases granted by `out`, in event order.
fn granted(out: &Outcome) -> Vec<u8> {
    (out.events.iter())
        .filter_map(|e| match e {
            Event::Granted { lease_id, .. } => Some(lease_id.0[0]),
            _ => None,
        })
        .collect()
}

#[test]
fn shared_holders_hold_together_and_an_exclusive_waits_for_all_of_them() {
    let mut s = Shard::new();
    let t1 = s.holds("acme/table", 1, SHARED);
    let t2 = s.holds("acme/table", 2, SHARED);
    assert!(t1 < t2, "every shared grant has its own, rising token");
    s.waits("acme/table", 3, EXCL);
    assert_eq!(s.holders("acme/table"), [1, 2]);

    assert!(granted(&s.release("acme/table", 1)).is_empty());
    let out = s.release("acme/table", 2);
    assert_eq!(granted(&out), [3], "the last reader out lets the writer in");
    let view = s.table.view(&name("acme/table")).unwrap();
    assert_eq!(view.mode, EXCL);
    assert!(view.token > t2);
}

#[test]
fn a_waiting_exclusive_is_not_overtaken_by_later_shared_acquires() {
    let mut s = Shard::new();
    s.holds("acme/table", 1, SHARED);
    s.waits("acme/table", 2, EXCL);
    // The lock is shared and a shared acquire would fit beside the holder,
    // but the writer came first: readers that came later queue behind it.
    s.waits("acme/table", 3, SHARED);
    assert_eq!(
        s.acquire("acme/table", 4, SHARED, 0),
        Err(LockError::LockHeld {
            holder_expires_at_ms: T0 + TTL_MS,
            queue_len: 2,
        })
    );
    s.release("acme/table", 1);
    assert_eq!(s.holders("acme/table"), [2]);
    s.release("acme/table", 2);
    assert_eq!(s.holders("acme/table"), [3]);
}

#[test]
fn an_exclusive_release_grants_every_shared_waiter_at_the_head_and_stops_at_the_next_writer() {
    let mut s = Shard::new();
    s.holds("acme/table", 1, EXCL);
    s.waits("acme/table", 2, SHARED);
    s.waits("acme/table", 3, SHARED);
    s.waits("acme/table", 4, EXCL);
    s.waits("acme/table", 5, SHARED);
    let out = s.release("acme/table", 1);
    assert_eq!(granted(&out), [2, 3]);
    assert_eq!(s.table.view(&name("acme/table")).unwrap().queue_len, 2);
    // Tokens rise in grant order, and the view lists holders oldest first.
    let view = s.table.view(&name("acme/table")).unwrap();
    assert!(view.holders[0].token < view.holders[1].token);
    assert_eq!(view.token, view.holders[0].token);
}

#[test]
fn a_semaphore_holds_at_most_its_permits_and_hands_a_freed_permit_to_the_head() {
    let mut s = Shard::new();
    s.holds("acme/pool", 1, sem(2));
    s.holds("acme/pool", 2, sem(2));
    s.waits("acme/pool", 3, sem(2));
    s.waits("acme/pool", 4, sem(2));
    assert_eq!(s.holders("acme/pool"), [1, 2]);
    let out = s.release("acme/pool", 2);
    assert_eq!(granted(&out), [3], "one permit freed, one waiter in");
    assert_eq!(s.holders("acme/pool"), [1, 3]);
    s.release("acme/pool", 1);
    s.release("acme/pool", 3);
    assert_eq!(s.holders("acme/pool"), [4]);
    s.release("acme/pool", 4);
    assert!(
        s.table.view(&name("acme/pool")).is_none(),
        "free: no record"
    );
}

#[test]
fn a_resource_keeps_its_kind_until_free_and_a_mismatch_is_refused_with_the_kind() {
    let mut s = Shard::new();
    s.holds("acme/pool", 1, sem(3));
    assert_eq!(
        s.acquire("acme/pool", 2, sem(4), 5_000),
        Err(LockError::ModeMismatch { permits: 3 })
    );
    assert_eq!(
        s.acquire("acme/pool", 2, EXCL, 5_000),
        Err(LockError::ModeMismatch { permits: 3 })
    );
    s.holds("acme/lock", 3, SHARED);
    assert_eq!(
        s.acquire("acme/lock", 4, sem(1), 5_000),
        Err(LockError::ModeMismatch { permits: 0 })
    );
    // Exclusive and shared are two modes of one kind: no mismatch.
    s.waits("acme/lock", 4, EXCL);
    // Once free, the next acquire decides the kind again.
    s.release("acme/pool", 1);
    s.holds("acme/pool", 5, EXCL);
}

#[test]
fn a_permit_count_out_of_range_is_refused_with_the_bound() {
    let mut s = Shard::new();
    for permits in [0, MAX_HOLDERS_PER_RESOURCE + 1, u32::MAX] {
        assert_eq!(
            s.acquire("acme/pool", 1, sem(permits), 0),
            Err(LockError::InvalidPermits {
                permits,
                max: MAX_HOLDERS_PER_RESOURCE
            })
        );
    }
    s.holds("acme/pool", 1, sem(MAX_HOLDERS_PER_RESOURCE));
}

#[test]
fn expired_readers_hand_the_lock_to_the_waiting_writer_on_the_next_command() {
    let mut s = Shard::new();
    s.holds("acme/table", 1, SHARED);
    s.now_ms += 1_000;
    s.holds("acme/table", 2, SHARED);
    s.waits("acme/table", 3, EXCL);
    s.now_ms = T0 + TTL_MS + 1_000;
    // Both readers are past their expiry; a command touching the resource
    // retires both before anyone is granted.
    let out = s.apply_full(acquire_cmd("acme/table", 4, SHARED, 5_000));
    let expired = (out.events.iter())
        .filter(|e| {
            matches!(
                e,
                Event::LeaseEnded {
                    ended: LeaseEnd::Expired,
                    ..
                }
            )
        })
        .count();
    assert_eq!(expired, 2);
    assert_eq!(granted(&out), [3], "the writer first, the new reader waits");
    assert_eq!(s.holders("acme/table"), [3]);
}

#[test]
fn the_tick_retires_expired_readers_one_by_one_and_then_grants_the_writer() {
    let mut s = Shard::new();
    s.holds("acme/table", 1, SHARED);
    s.holds("acme/table", 2, SHARED);
    s.waits("acme/table", 3, EXCL);
    s.now_ms += TTL_MS;
    let out = s.apply_full(Command::Tick);
    assert_eq!(granted(&out), [3]);
    assert_eq!(s.holders("acme/table"), [3]);
}

#[test]
fn the_tenant_hold_count_counts_every_holding() {
    let limits = Limits {
        max_held_per_tenant: 2,
        ..Limits::default()
    };
    let mut s = Shard::with_limits(limits);
    s.holds("acme/table", 1, SHARED);
    s.holds("acme/table", 2, SHARED);
    assert_eq!(
        s.acquire("acme/table", 3, SHARED, 5_000),
        Err(LockError::TenantQuotaExceeded { limit: 2 })
    );
}

#[test]
fn a_table_of_exclusive_locks_encodes_as_the_previous_release_wrote_it() {
    let mut s = Shard::new();
    s.holds("acme/a", 1, EXCL);
    s.waits("acme/a", 2, EXCL);
    assert_eq!(snapshot_version(&s.table), 4, "no mode: the old version");
    // An exclusive acquire without a value is still the first release's
    // command tag (the byte after the command version).
    assert_eq!(acquire_cmd("acme/a", 1, EXCL, 0).encode()[1], 1);

    s.waits("acme/a", 3, SHARED);
    assert_eq!(snapshot_version(&s.table), 6, "a shared waiter");
    s.release("acme/a", 1);
    s.release("acme/a", 2);
    assert_eq!(snapshot_version(&s.table), 6, "a shared holder");
    s.release("acme/a", 3);
    assert_eq!(snapshot_version(&s.table), 4, "the last mode gone");
}

#[test]
fn a_snapshot_restores_every_holder_waiter_and_mode() {
    let mut s = Shard::new();
    s.holds("acme/table", 1, SHARED);
    s.holds("acme/table", 2, SHARED);
    s.waits("acme/table", 3, EXCL);
    s.holds("acme/pool", 4, sem(7));
    let restored = LockTable::restore(&s.table.snapshot()).unwrap();
    for res in ["acme/table", "acme/pool"] {
        assert_eq!(restored.view(&name(res)), s.table.view(&name(res)));
    }
    assert_eq!(restored.view(&name("acme/pool")).unwrap().mode, sem(7));
    assert_eq!(restored.check_invariants(), Ok(()));
}

#[test]
fn shared_holders_and_their_waiters_move_between_shards() {
    let mut source = Shard::new();
    let t1 = source.holds("acme/table", 1, SHARED);
    let t2 = source.holds("acme/table", 2, SHARED);
    source.waits("acme/table", 3, EXCL);
    let mut target = source.move_slot_of("acme/table");
    let view = target.table.view(&name("acme/table")).unwrap();
    let tokens: Vec<FencingToken> = view.holders.iter().map(|h| h.token).collect();
    assert_eq!(tokens, [t1, t2]);
    assert_eq!(view.queue_len, 1);
    // The target's next grant is above every token the source gave.
    target.release("acme/table", 1);
    let out = target.release("acme/table", 2);
    assert_eq!(granted(&out), [3]);
    assert!(target.table.view(&name("acme/table")).unwrap().token > t2);
}

#[test]
fn the_last_token_stays_the_newest_grant_when_a_newer_reader_leaves_first() {
    let mut s = Shard::new();
    let t1 = s.holds("acme/table", 1, SHARED);
    let t2 = s.holds("acme/table", 2, SHARED);
    s.release("acme/table", 2);
    let view = s.table.view(&name("acme/table")).unwrap();
    assert_eq!(view.token, t1);
    assert_eq!(
        view.last_token, t2,
        "Get must not report a token below one granted"
    );
    // Kept by the snapshot (apply_full round-trips it) and by a slot move.
    let restored = LockTable::restore(&s.table.snapshot()).unwrap();
    assert_eq!(restored.view(&name("acme/table")).unwrap().last_token, t2);
    let target = s.move_slot_of("acme/table");
    let view = target.table.view(&name("acme/table")).unwrap();
    assert_eq!(view.last_token, t2);
}
