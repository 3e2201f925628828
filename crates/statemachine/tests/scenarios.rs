//! Named scenarios from the brief, and one test per error path.

use fencelock_statemachine::limits::{MAX_CLOCK_OFFSET_ALLOWANCE_MS, MAX_RENEW_BATCH};
use fencelock_statemachine::token::{MAX_POSITION, POSITION_SOFT_LIMIT};
use fencelock_statemachine::*;

const T0: u64 = 1_700_000_000_000;

/// A shard replica driven by hand: one entry per command unless told
/// otherwise, leader term 1, epoch 1.
struct Shard {
    table: LockTable,
    index: u64,
    term: u64,
    epoch: u64,
    now_ms: u64,
}

impl Shard {
    fn new() -> Shard {
        Shard::with_limits(Limits::default())
    }

    fn with_limits(limits: Limits) -> Shard {
        let mut s = Shard {
            table: LockTable::new(limits).unwrap(),
            index: 0,
            term: 1,
            epoch: 1,
            now_ms: T0,
        };
        s.apply(Command::LeaderChanged {
            clock_offset_allowance_ms: 0,
        })
        .unwrap();
        s
    }

    fn ctx(&self) -> ApplyContext {
        ApplyContext {
            index: self.index,
            term: self.term,
            epoch: self.epoch,
            now_ms: self.now_ms,
        }
    }

    fn apply_full(&mut self, c: Command) -> Outcome {
        self.index += 1;
        let ctx = self.ctx();
        self.table.apply(&c, &ctx)
    }

    fn apply(&mut self, c: Command) -> Result<Reply, LockError> {
        self.apply_full(c).reply
    }

    fn advance(&mut self, ms: u64) {
        self.now_ms += ms;
    }

    fn acquire(
        &mut self,
        res: &str,
        req: &str,
        lease: u8,
        ttl: u64,
        wait: u64,
    ) -> Result<AcquireReply, LockError> {
        match self.apply(acquire(res, req, lease, ttl, wait))? {
            Reply::Acquire(a) => Ok(a),
            other => panic!("unexpected {other:?}"),
        }
    }

    fn renew(&mut self, res: &str, lease: u8, ttl: u64) -> Result<Renewed, LockError> {
        match self.apply(Command::Renew {
            owner: Owner::anonymous(),
            resource: name(res),
            lease_id: LeaseId([lease; 16]),
            lease_ttl_ms: ttl,
        })? {
            Reply::Renewed(r) => Ok(r),
            other => panic!("unexpected {other:?}"),
        }
    }

    fn release(&mut self, res: &str, lease: u8) -> bool {
        match self.apply(Command::Release {
            owner: Owner::anonymous(),
            resource: name(res),
            lease_id: LeaseId([lease; 16]),
        }) {
            Ok(Reply::Released { released }) => released,
            other => panic!("unexpected {other:?}"),
        }
    }

    fn cancel(&mut self, res: &str, lease: u8, attempt: u32) -> Result<Reply, LockError> {
        self.apply(Command::Cancel {
            resource: name(res),
            lease_id: LeaseId([lease; 16]),
            attempt,
        })
    }

    fn holder(&self, res: &str) -> Option<LeaseId> {
        self.table.view(&name(res)).map(|v| v.lease_id)
    }
}

fn name(s: &str) -> ResourceName {
    ResourceName::parse(s).unwrap()
}

fn acquire(res: &str, req: &str, lease: u8, ttl: u64, wait: u64) -> Command {
    Command::Acquire {
        owner: Owner::anonymous(),
        resource: name(res),
        request_id: RequestId::new(req.as_bytes()).unwrap(),
        lease_id: LeaseId([lease; 16]),
        lease_ttl_ms: ttl,
        wait_timeout_ms: wait,
        value: fencelock_statemachine::HolderValue::none(),
        mode: fencelock_statemachine::AcquireMode::Exclusive,
    }
}

fn token_of(a: &AcquireReply) -> FencingToken {
    match a.status {
        AcquireStatus::Held { token, .. } | AcquireStatus::Ended { token, .. } => token,
        other => panic!("not granted: {other:?}"),
    }
}

// ------------------------------------------------------------ scenarios

#[test]
fn stale_lease_release_never_touches_the_current_holder() {
    let mut s = Shard::new();
    s.acquire("acme/job", "a", 1, 10_000, 0).unwrap();
    s.advance(10_000);
    s.apply(Command::Tick).unwrap();
    let b = s.acquire("acme/job", "b", 2, 10_000, 0).unwrap();
    assert!(!s.release("acme/job", 1), "old lease released nothing");
    assert_eq!(s.renew("acme/job", 1, 10_000), Err(LockError::LeaseNotHeld));
    assert_eq!(s.holder("acme/job"), Some(b.lease_id));
}

#[test]
fn release_is_idempotent() {
    let mut s = Shard::new();
    s.acquire("acme/job", "a", 1, 10_000, 0).unwrap();
    assert!(s.release("acme/job", 1));
    assert!(!s.release("acme/job", 1));
    assert!(!s.release("acme/never-held", 1));
    assert_eq!(s.holder("acme/job"), None);
}

#[test]
fn every_new_grant_gets_a_larger_token_even_after_the_record_is_deleted() {
    let mut s = Shard::new();
    let first = token_of(&s.acquire("acme/job", "a", 1, 10_000, 0).unwrap());
    assert!(s.release("acme/job", 1));
    assert_eq!(s.table.held_count(), 0, "idle record deleted");
    let second = token_of(&s.acquire("acme/job", "b", 2, 10_000, 0).unwrap());
    assert!(second > first);
    // A new epoch restarts positions but still beats every older token.
    s.epoch = 2;
    s.release("acme/job", 2);
    let third = token_of(&s.acquire("acme/job", "c", 3, 10_000, 0).unwrap());
    assert!(third > second);
    assert_eq!(third.epoch(), 2);
    assert_eq!(third.position(), 2, "release took position 1 of epoch 2");
}

#[test]
fn tokens_of_commands_coalesced_into_one_entry_still_increase() {
    let mut s = Shard::new();
    s.index += 1;
    let ctx = s.ctx();
    let mut tokens = Vec::new();
    for (i, lease) in [1u8, 2, 3].into_iter().enumerate() {
        let out = s.table.apply(
            &acquire("acme/job", &format!("r{i}"), lease, 10_000, 0),
            &ctx,
        );
        let Ok(Reply::Acquire(a)) = out.reply else {
            panic!("{out:?}")
        };
        tokens.push(token_of(&a));
        s.table.apply(
            &Command::Release {
                owner: Owner::anonymous(),
                resource: name("acme/job"),
                lease_id: LeaseId([lease; 16]),
            },
            &ctx,
        );
    }
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
}

#[test]
fn release_hands_the_lock_to_the_next_waiter_only() {
    let mut s = Shard::new();
    s.acquire("acme/hot", "a", 1, 10_000, 0).unwrap();
    let b = s.acquire("acme/hot", "b", 2, 10_000, 5_000).unwrap();
    let c = s.acquire("acme/hot", "c", 3, 10_000, 5_000).unwrap();
    assert!(matches!(
        b.status,
        AcquireStatus::Queued { position: 1, .. }
    ));
    assert!(matches!(
        c.status,
        AcquireStatus::Queued { position: 2, .. }
    ));
    let out = s.apply_full(Command::Release {
        owner: Owner::anonymous(),
        resource: name("acme/hot"),
        lease_id: LeaseId([1; 16]),
    });
    let granted: Vec<_> = out
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Granted {
                lease_id,
                from_queue: true,
                ..
            } => Some(*lease_id),
            _ => None,
        })
        .collect();
    assert_eq!(
        granted,
        vec![LeaseId([2; 16])],
        "exactly the head waiter is woken"
    );
    assert_eq!(s.holder("acme/hot"), Some(LeaseId([2; 16])));
    assert_eq!(s.table.view(&name("acme/hot")).unwrap().queue_len, 1);
}

#[test]
fn expired_waiter_is_skipped_when_its_turn_comes() {
    let mut s = Shard::new();
    s.acquire("acme/hot", "a", 1, 20_000, 0).unwrap();
    s.acquire("acme/hot", "b", 2, 10_000, 1_000).unwrap();
    s.acquire("acme/hot", "c", 3, 10_000, 30_000).unwrap();
    s.advance(2_000);
    s.release("acme/hot", 1);
    assert_eq!(s.holder("acme/hot"), Some(LeaseId([3; 16])));
    let retry = s.acquire("acme/hot", "b", 9, 10_000, 1_000).unwrap();
    assert_eq!(retry.status, AcquireStatus::WaitEnded(WaitEnd::TimedOut));
    assert_eq!(retry.lease_id, LeaseId([2; 16]));
}

#[test]
fn cancelled_waiter_leaves_the_queue_and_a_granted_one_releases() {
    let mut s = Shard::new();
    s.acquire("acme/hot", "a", 1, 10_000, 0).unwrap();
    s.acquire("acme/hot", "b", 2, 10_000, 5_000).unwrap();
    let r = s.cancel("acme/hot", 2, FIRST_ATTEMPT);
    assert_eq!(r, Ok(Reply::Cancelled { removed: true }));
    assert_eq!(s.table.waiter_count(), 0);
    // Granted before the cancel was applied: the caller never learned of it.
    let r = s.cancel("acme/hot", 1, FIRST_ATTEMPT);
    assert_eq!(r, Ok(Reply::Cancelled { removed: true }));
    assert_eq!(s.holder("acme/hot"), None);
}

/// A request id names one acquire and its outcome is final: an acquire the
/// server cancelled because its caller went away (a grant it could not
/// deliver, a wait nobody was left for) answers its retries "cancelled",
/// under its original lease id — never a second lease for the same id, and
/// never a new place at the back of a queue under an id that was queued
/// earlier. The lock itself is free for a new acquire (a new request id),
/// which the Rust client starts at once for ids it made up.
#[test]
fn a_retry_of_an_acquire_cancelled_for_its_gone_caller_learns_it_was_cancelled() {
    let mut s = Shard::new();
    // A grant whose caller left before it was told.
    let first = s.acquire("acme/hot", "a", 1, 10_000, 0).unwrap();
    let r = s.cancel("acme/hot", 1, first.attempt);
    assert_eq!(r, Ok(Reply::Cancelled { removed: true }));
    let retry = s.acquire("acme/hot", "a", 7, 10_000, 0).unwrap();
    assert!(retry.deduplicated, "{retry:?}");
    assert_eq!(retry.lease_id, LeaseId([1; 16]));
    assert!(
        matches!(
            retry.status,
            AcquireStatus::Ended {
                ended: LeaseEnd::Cancelled,
                ..
            }
        ),
        "{retry:?}"
    );
    assert_eq!(s.holder("acme/hot"), None, "no second lease for the id");
    // A new request id takes the free lock, with a larger token.
    let fresh = s.acquire("acme/hot", "a-2", 8, 10_000, 0).unwrap();
    let (AcquireStatus::Held { token, .. }, AcquireStatus::Held { token: old, .. }) =
        (fresh.status, first.status)
    else {
        panic!("{fresh:?} {first:?}");
    };
    assert!(token > old);

    // A wait whose caller left: its retry learns the wait was cancelled.
    let waiting = s.acquire("acme/hot", "b", 2, 10_000, 5_000).unwrap();
    s.cancel("acme/hot", 2, waiting.attempt).unwrap();
    let retry = s.acquire("acme/hot", "b", 3, 10_000, 5_000).unwrap();
    assert!(retry.deduplicated);
    assert_eq!(retry.status, AcquireStatus::WaitEnded(WaitEnd::Cancelled));
    assert_eq!(s.table.waiter_count(), 0);
}

/// The chaos run that found it: a waiting acquire's caller went away, so the
/// server proposed a cancel; meanwhile the lease was granted and the
/// caller's retry (same request id) was answered "held" from the dedup
/// table. The cancel, applied after that answer, must not end the lease.
#[test]
fn cancel_of_a_gone_attempt_spares_a_lease_its_retry_was_told_it_holds() {
    let mut s = Shard::new();
    s.acquire("acme/hot", "a", 1, 10_000, 0).unwrap();
    let first = s.acquire("acme/hot", "b", 2, 10_000, 5_000).unwrap();
    assert_eq!(first.attempt, FIRST_ATTEMPT);
    s.release("acme/hot", 1);
    assert_eq!(s.holder("acme/hot"), Some(LeaseId([2; 16])));
    let retry = s.acquire("acme/hot", "b", 9, 10_000, 5_000).unwrap();
    assert!(retry.deduplicated);
    assert!(matches!(retry.status, AcquireStatus::Held { .. }));
    assert_eq!(retry.attempt, FIRST_ATTEMPT + 1);
    let r = s.cancel("acme/hot", 2, first.attempt);
    assert_eq!(r, Ok(Reply::Cancelled { removed: false }));
    assert_eq!(s.holder("acme/hot"), Some(LeaseId([2; 16])));
    // The retry's own caller going away still cancels it.
    let r = s.cancel("acme/hot", 2, retry.attempt);
    assert_eq!(r, Ok(Reply::Cancelled { removed: true }));
    assert_eq!(s.holder("acme/hot"), None);
}

/// The same race one step earlier: the retry attached while the acquire
/// still waited, and is the caller the grant will be told to.
#[test]
fn cancel_of_a_gone_attempt_spares_a_waiter_its_retry_attached_to() {
    let mut s = Shard::new();
    s.acquire("acme/hot", "a", 1, 10_000, 0).unwrap();
    let first = s.acquire("acme/hot", "b", 2, 10_000, 5_000).unwrap();
    let retry = s.acquire("acme/hot", "b", 9, 10_000, 5_000).unwrap();
    assert!(matches!(
        retry.status,
        AcquireStatus::Queued { position: 1, .. }
    ));
    assert_eq!(retry.attempt, first.attempt + 1);
    let r = s.cancel("acme/hot", 2, first.attempt);
    assert_eq!(r, Ok(Reply::Cancelled { removed: false }));
    assert_eq!(s.table.waiter_count(), 1);
    s.release("acme/hot", 1);
    assert_eq!(s.holder("acme/hot"), Some(LeaseId([2; 16])));
    // The attempt survives a snapshot (a new leader cancels by it too).
    let restored = LockTable::restore(&s.table.snapshot()).unwrap();
    assert_eq!(restored, s.table);
}

#[test]
fn committed_acquire_retried_after_a_lost_reply_returns_the_original_lease() {
    let mut s = Shard::new();
    let first = s.acquire("acme/job", "req-1", 1, 10_000, 0).unwrap();
    // The retry arrives through another proposal with a new random lease id.
    let retry = s.acquire("acme/job", "req-1", 2, 10_000, 0).unwrap();
    assert!(retry.deduplicated);
    assert_eq!(retry.lease_id, first.lease_id);
    assert_eq!(token_of(&retry), token_of(&first));
    // Still the original after a release, with its end state.
    s.release("acme/job", 1);
    let late = s.acquire("acme/job", "req-1", 3, 10_000, 0).unwrap();
    assert_eq!(late.lease_id, first.lease_id);
    assert_eq!(
        late.status,
        AcquireStatus::Ended {
            token: token_of(&first),
            ended: LeaseEnd::Released
        }
    );
}

#[test]
fn queued_acquire_retried_keeps_its_place() {
    let mut s = Shard::new();
    s.acquire("acme/hot", "a", 1, 10_000, 0).unwrap();
    s.acquire("acme/hot", "b", 2, 10_000, 9_000).unwrap();
    let again = s.acquire("acme/hot", "b", 5, 10_000, 9_000).unwrap();
    assert!(again.deduplicated);
    assert_eq!(again.lease_id, LeaseId([2; 16]));
    assert!(matches!(
        again.status,
        AcquireStatus::Queued { position: 1, .. }
    ));
    assert_eq!(s.table.waiter_count(), 1, "never queued twice");
}

#[test]
fn dedup_entries_are_forgotten_after_the_retention_window() {
    let mut s = Shard::new();
    let retention = s.table.limits().dedup_retention_ms;
    s.acquire("acme/job", "req", 1, 10_000, 0).unwrap();
    s.release("acme/job", 1);
    s.advance(retention - 1);
    s.apply(Command::Tick).unwrap();
    assert_eq!(s.table.dedup_count(), 1, "kept for the whole window");
    s.advance(1);
    s.apply(Command::Tick).unwrap();
    assert_eq!(s.table.dedup_count(), 0);
    let fresh = s.acquire("acme/job", "req", 2, 10_000, 0).unwrap();
    assert!(!fresh.deduplicated);
}

/// The retention only starts when the lease ends: a lease held longer than
/// the window keeps its entry, so a late retry gets the same lease, never a
/// second one (docs/safety.md, "Deduplication").
#[test]
fn a_lease_held_longer_than_the_retention_keeps_its_dedup_entry() {
    let mut s = Shard::new();
    let retention = s.table.limits().dedup_retention_ms;
    let ttl = 3 * retention;
    s.acquire("acme/long", "req", 1, ttl, 0).unwrap();
    s.advance(2 * retention);
    s.apply(Command::Tick).unwrap();
    let retry = s.acquire("acme/long", "req", 2, ttl, 0).unwrap();
    assert!(retry.deduplicated);
    assert_eq!(retry.lease_id, LeaseId([1; 16]));
    assert!(matches!(retry.status, AcquireStatus::Held { .. }));
}

#[test]
fn leases_expire_only_through_commands_carrying_time() {
    let mut s = Shard::new();
    s.acquire("acme/job", "a", 1, 10_000, 0).unwrap();
    assert_eq!(s.table.next_due_ms(), Some(T0 + 10_000));
    s.advance(60_000);
    // Nothing has been applied: the lease is still in the table.
    assert_eq!(s.holder("acme/job"), Some(LeaseId([1; 16])));
    let out = s.apply_full(Command::Tick);
    assert!(matches!(
        out.reply,
        Ok(Reply::Ticked(TickReport {
            leases_expired: 1,
            ..
        }))
    ));
    assert!(matches!(
        out.events[0],
        Event::LeaseEnded {
            ended: LeaseEnd::Expired,
            ..
        }
    ));
    assert_eq!(s.holder("acme/job"), None);
}

#[test]
fn touching_an_expired_lease_expires_it_first() {
    let mut s = Shard::new();
    s.acquire("acme/job", "a", 1, 10_000, 0).unwrap();
    s.advance(10_000);
    assert_eq!(s.renew("acme/job", 1, 10_000), Err(LockError::LeaseNotHeld));
    assert!(s.acquire("acme/job", "b", 2, 10_000, 0).is_ok());
}

#[test]
fn tick_work_is_bounded_and_reports_more_due() {
    let mut s = Shard::with_limits(Limits {
        max_retired_per_tick: 2,
        ..Limits::default()
    });
    for i in 0..5u8 {
        s.acquire(&format!("acme/j{i}"), "a", i, 1_000, 0).unwrap();
    }
    s.advance(1_000);
    let Ok(Reply::Ticked(report)) = s.apply(Command::Tick) else {
        panic!()
    };
    assert_eq!((report.leases_expired, report.more_due), (2, true));
    s.apply(Command::Tick).unwrap();
    let Ok(Reply::Ticked(report)) = s.apply(Command::Tick) else {
        panic!()
    };
    assert_eq!((report.leases_expired, report.more_due), (1, false));
    assert_eq!(s.table.held_count(), 0);
}

#[test]
fn renewal_never_shortens_a_lease() {
    let mut s = Shard::new();
    s.acquire("acme/job", "a", 1, 60_000, 0).unwrap();
    s.advance(1_000);
    let r = s.renew("acme/job", 1, 5_000).unwrap();
    assert_eq!(r.expires_at_ms, T0 + 60_000);
    // The answer is the time the holder may count on: the longer grant's.
    assert_eq!(r.lease_ttl_ms, 59_000);
    s.now_ms = T0 + 58_000;
    let r = s.renew("acme/job", 1, 0).unwrap();
    assert_eq!(r.lease_ttl_ms, 5_000, "0 keeps the current ttl");
    assert_eq!(r.expires_at_ms, T0 + 63_000);
}

#[test]
fn renewal_near_the_hold_cap_answers_only_the_time_left_before_the_cap() {
    let mut s = Shard::with_limits(Limits {
        max_hold_ms: 60_000,
        max_lease_ttl_ms: 30_000,
        ..Limits::default()
    });
    s.acquire("acme/job", "a", 1, 30_000, 0).unwrap();
    s.now_ms = T0 + 25_000;
    s.renew("acme/job", 1, 30_000).unwrap();
    // 6 s before the cap a 30 s renewal grants 6 s: a holder told 30 s
    // would work on for 24 s after the lock went to someone else.
    s.now_ms = T0 + 54_000;
    let r = s.renew("acme/job", 1, 30_000).unwrap();
    assert_eq!(r.expires_at_ms, T0 + 60_000);
    assert_eq!(r.lease_ttl_ms, 6_000);
    s.now_ms = T0 + 60_000;
    let b = s.acquire("acme/job", "b", 2, 30_000, 0).unwrap();
    assert!(matches!(b.status, AcquireStatus::Held { .. }));
}

#[test]
fn a_deduplicated_answer_gives_only_what_is_left_of_the_original_grant() {
    let mut s = Shard::new();
    s.acquire("acme/job", "req-1", 1, 30_000, 0).unwrap();
    // The reply was lost; the caller retries 10 s later with the same id.
    s.advance(10_000);
    let retry = s.acquire("acme/job", "req-1", 2, 30_000, 0).unwrap();
    assert!(retry.deduplicated);
    let AcquireStatus::Held {
        expires_at_ms,
        lease_ttl_ms,
        ..
    } = retry.status
    else {
        panic!("still held: {retry:?}")
    };
    assert_eq!(expires_at_ms, T0 + 30_000);
    // Counted from the retry's send, 30 s would outlast the lease by 10 s.
    assert_eq!(lease_ttl_ms, 20_000);
    // A renewal restores a full deadline.
    assert_eq!(s.renew("acme/job", 1, 0).unwrap().lease_ttl_ms, 30_000);
}

#[test]
fn a_deduplicated_answer_during_a_leader_allowance_gives_no_time() {
    let mut s = Shard::new();
    s.acquire("acme/job", "req-1", 1, 10_000, 0).unwrap();
    s.term = 2;
    s.apply(Command::LeaderChanged {
        clock_offset_allowance_ms: 2_000,
    })
    .unwrap();
    // Past the stamp, inside the allowance: the lease lives only to cover
    // the leaders' clocks, and the holder must renew before relying on it.
    s.now_ms = T0 + 11_000;
    let retry = s.acquire("acme/job", "req-1", 2, 10_000, 0).unwrap();
    let AcquireStatus::Held { lease_ttl_ms, .. } = retry.status else {
        panic!("still held: {retry:?}")
    };
    assert_eq!(lease_ttl_ms, 0);
}

#[test]
fn leader_change_extends_leases_once_and_not_forever() {
    let mut s = Shard::new();
    s.acquire("acme/job", "a", 1, 10_000, 0).unwrap();
    let stamped = T0 + 10_000;
    for term in 2..10 {
        s.term = term;
        s.advance(1_000);
        s.apply(Command::LeaderChanged {
            clock_offset_allowance_ms: 2_000,
        })
        .unwrap();
        assert_eq!(
            s.table.view(&name("acme/job")).unwrap().expires_at_ms,
            stamped + 2_000
        );
    }
    // Eight elections later the lease still ends at its stamp + one allowance.
    s.now_ms = stamped + 1_999;
    s.apply(Command::Tick).unwrap();
    assert!(
        s.holder("acme/job").is_some(),
        "not freed before the old leader could have"
    );
    s.now_ms = stamped + 2_000;
    s.apply(Command::Tick).unwrap();
    assert!(s.holder("acme/job").is_none());
}

#[test]
fn a_new_leader_with_a_clock_ahead_frees_no_lock_early() {
    // Old leader granted at T0 by its clock; the new leader's clock runs
    // 1.5 s ahead, inside the 2 s allowance.
    let mut s = Shard::new();
    s.acquire("acme/job", "a", 1, 10_000, 0).unwrap();
    s.term = 2;
    s.now_ms = T0 + 1_500;
    s.apply(Command::LeaderChanged {
        clock_offset_allowance_ms: 2_000,
    })
    .unwrap();
    // Real time T0 + 10 s reads T0 + 11.5 s on the new leader's clock.
    s.now_ms = T0 + 11_500;
    s.apply(Command::Tick).unwrap();
    assert!(s.holder("acme/job").is_some());
    assert_eq!(
        s.acquire("acme/job", "b", 2, 10_000, 0).unwrap_err().code(),
        "lock_held"
    );
}

#[test]
fn the_clock_never_goes_back() {
    let mut s = Shard::new();
    s.acquire("acme/job", "a", 1, 10_000, 0).unwrap();
    s.now_ms = T0 + 20_000;
    s.apply(Command::Tick).unwrap();
    s.now_ms = T0; // a leader whose clock is behind
    let b = s.acquire("acme/job", "b", 2, 10_000, 0).unwrap();
    let AcquireStatus::Held { expires_at_ms, .. } = b.status else {
        panic!()
    };
    assert_eq!(expires_at_ms, T0 + 30_000);
    assert_eq!(s.table.clock_ms(), T0 + 20_000);
}

#[test]
fn token_fits_a_signed_bigint_and_is_positive() {
    let mut s = Shard::new();
    let a = s.acquire("acme/job", "a", 1, 10_000, 0).unwrap();
    let t = token_of(&a).as_i64();
    assert!(t > 0);
    assert_eq!(t >> 40, 1);
}

#[test]
fn queued_waiters_still_get_their_turn_after_the_soft_token_limit() {
    let mut s = Shard::new();
    s.acquire("acme/hot", "a", 1, 10_000, 0).unwrap();
    s.acquire("acme/hot", "b", 2, 10_000, 60_000).unwrap();
    s.index = POSITION_SOFT_LIMIT + 10;
    assert_eq!(
        s.acquire("acme/other", "x", 3, 10_000, 0),
        Err(LockError::TokenSpaceExhausted { epoch: 1 })
    );
    assert!(s.table.token_positions_left() == 0);
    s.release("acme/hot", 1);
    assert_eq!(s.holder("acme/hot"), Some(LeaseId([2; 16])));
}

#[test]
fn waiter_turn_past_the_hard_token_limit_ends_the_wait_instead_of_wrapping() {
    let mut s = Shard::new();
    s.acquire("acme/hot", "a", 1, 10_000, 0).unwrap();
    s.acquire("acme/hot", "b", 2, 10_000, 60_000).unwrap();
    s.index = MAX_POSITION + 5;
    let out = s.apply_full(Command::Release {
        owner: Owner::anonymous(),
        resource: name("acme/hot"),
        lease_id: LeaseId([1; 16]),
    });
    assert!(out.events.iter().any(|e| matches!(
        e,
        Event::WaitEnded {
            ended: WaitEnd::TokenSpaceExhausted,
            ..
        }
    )));
    assert_eq!(s.holder("acme/hot"), None);
    // A new epoch from placement makes room again.
    s.epoch = 2;
    let t = token_of(&s.acquire("acme/hot", "c", 3, 10_000, 0).unwrap());
    assert_eq!((t.epoch(), t.position()), (2, 1));
}

#[test]
fn hold_time_is_capped_even_with_renewals() {
    let mut s = Shard::with_limits(Limits {
        max_hold_ms: 60_000,
        max_lease_ttl_ms: 30_000,
        ..Limits::default()
    });
    s.acquire("acme/job", "a", 1, 30_000, 0).unwrap();
    s.advance(25_000);
    s.renew("acme/job", 1, 30_000).unwrap();
    s.advance(20_000);
    let r = s.renew("acme/job", 1, 30_000).unwrap();
    assert_eq!(r.expires_at_ms, T0 + 60_000, "capped at the hold limit");
    s.advance(15_000);
    // The lease is expired at the cap, so the renewal finds no lease.
    assert_eq!(s.renew("acme/job", 1, 30_000), Err(LockError::LeaseNotHeld));
}

// ------------------------------------------------------- one per error

#[test]
fn invalid_resource_name_is_refused_with_the_reason() {
    assert!(matches!(
        ResourceName::parse("no-tenant"),
        Err(NameError::MissingTenant)
    ));
    // A log entry carrying a bad name (corruption, old binary) is refused at decode.
    let mut bytes = acquire("acme/x", "r", 1, 1_000, 0).encode();
    let pos = bytes.iter().position(|&b| b == b'x').unwrap();
    bytes[pos] = b' ';
    assert!(matches!(
        Command::decode(&bytes),
        Err(DecodeError::Invalid(_))
    ));
}

#[test]
fn invalid_request_id_is_refused() {
    assert_eq!(
        RequestId::new(vec![]),
        Err(LockError::InvalidRequestId { len: 0, max: 64 })
    );
    assert_eq!(
        RequestId::new(vec![1; 65]),
        Err(LockError::InvalidRequestId { len: 65, max: 64 })
    );
    assert!(RequestId::new(vec![1; 64]).is_ok());
}

#[test]
fn ttl_out_of_range_is_refused() {
    let mut s = Shard::new();
    let l = s.table.limits().clone();
    for ttl in [0, l.min_lease_ttl_ms - 1, l.max_lease_ttl_ms + 1] {
        assert_eq!(
            s.acquire("acme/job", "a", 1, ttl, 0),
            Err(LockError::TtlOutOfRange {
                ttl_ms: ttl,
                min_ms: l.min_lease_ttl_ms,
                max_ms: l.max_lease_ttl_ms
            })
        );
    }
    s.acquire("acme/job", "a", 1, l.max_lease_ttl_ms, 0)
        .unwrap();
    assert!(matches!(
        s.renew("acme/job", 1, l.max_lease_ttl_ms + 1),
        Err(LockError::TtlOutOfRange { .. })
    ));
}

#[test]
fn wait_timeout_out_of_range_is_refused() {
    let mut s = Shard::new();
    let max = s.table.limits().max_wait_timeout_ms;
    assert_eq!(
        s.acquire("acme/job", "a", 1, 10_000, max + 1),
        Err(LockError::WaitTimeoutOutOfRange {
            wait_timeout_ms: max + 1,
            max_ms: max
        })
    );
}

#[test]
fn renew_batch_too_large_is_refused() {
    let mut s = Shard::new();
    let item = RenewItem {
        resource: name("acme/job"),
        lease_id: LeaseId([1; 16]),
        lease_ttl_ms: 0,
    };
    let r = s.apply(Command::RenewBatch {
        owner: Owner::anonymous(),
        items: vec![item; MAX_RENEW_BATCH + 1],
    });
    assert_eq!(
        r,
        Err(LockError::BatchTooLarge {
            len: MAX_RENEW_BATCH + 1,
            max: MAX_RENEW_BATCH
        })
    );
}

#[test]
fn renew_batch_gives_each_lease_its_own_result() {
    let mut s = Shard::new();
    s.acquire("acme/a", "a", 1, 10_000, 0).unwrap();
    s.acquire("acme/b", "b", 2, 10_000, 0).unwrap();
    let items = vec![
        RenewItem {
            resource: name("acme/a"),
            lease_id: LeaseId([1; 16]),
            lease_ttl_ms: 0,
        },
        RenewItem {
            resource: name("acme/b"),
            lease_id: LeaseId([9; 16]),
            lease_ttl_ms: 0,
        },
    ];
    let Ok(Reply::RenewedBatch(results)) = s.apply(Command::RenewBatch {
        owner: Owner::anonymous(),
        items,
    }) else {
        panic!()
    };
    assert!(results[0].is_ok());
    assert_eq!(results[1], Err(LockError::LeaseNotHeld));
}

#[test]
fn acquire_without_wait_on_a_held_lock_is_refused_with_the_holder_expiry() {
    let mut s = Shard::new();
    s.acquire("acme/job", "a", 1, 10_000, 0).unwrap();
    let e = s.acquire("acme/job", "b", 2, 10_000, 0).unwrap_err();
    assert_eq!(
        e,
        LockError::LockHeld {
            holder_expires_at_ms: T0 + 10_000,
            queue_len: 0
        }
    );
    assert_eq!(e.retry(), Retry::Backoff);
}

#[test]
fn queue_full_is_refused() {
    let mut s = Shard::with_limits(Limits {
        max_waiters_per_resource: 2,
        ..Limits::default()
    });
    s.acquire("acme/hot", "a", 1, 10_000, 0).unwrap();
    s.acquire("acme/hot", "b", 2, 10_000, 1_000).unwrap();
    s.acquire("acme/hot", "c", 3, 10_000, 1_000).unwrap();
    assert_eq!(
        s.acquire("acme/hot", "d", 4, 10_000, 1_000),
        Err(LockError::QueueFull { limit: 2 })
    );
}

#[test]
fn tenant_waiter_cap_is_refused() {
    let mut s = Shard::with_limits(Limits {
        max_waiters_per_tenant: 2,
        ..Limits::default()
    });
    for r in ["acme/x", "acme/y", "acme/z", "beta/x"] {
        s.acquire(r, "holder", 1, 10_000, 0).unwrap();
    }
    s.acquire("acme/x", "w1", 2, 10_000, 1_000).unwrap();
    s.acquire("acme/y", "w2", 2, 10_000, 1_000).unwrap();
    assert_eq!(
        s.acquire("acme/z", "w3", 2, 10_000, 1_000),
        Err(LockError::TenantWaitersExceeded { limit: 2 })
    );
    // Another tenant is unaffected.
    assert!(s.acquire("beta/x", "w4", 2, 10_000, 1_000).is_ok());
}

#[test]
fn dedup_table_full_is_refused() {
    let mut s = Shard::with_limits(Limits {
        max_dedup_entries: 2,
        ..Limits::default()
    });
    s.acquire("acme/a", "a", 1, 10_000, 0).unwrap();
    s.acquire("acme/b", "b", 1, 10_000, 0).unwrap();
    assert_eq!(
        s.acquire("acme/c", "c", 1, 10_000, 0),
        Err(LockError::DedupTableFull { limit: 2 })
    );
}

#[test]
fn table_full_is_refused() {
    let mut s = Shard::with_limits(Limits {
        max_records: 1,
        ..Limits::default()
    });
    s.acquire("acme/a", "a", 1, 10_000, 0).unwrap();
    assert_eq!(
        s.acquire("acme/b", "b", 1, 10_000, 0),
        Err(LockError::TableFull { limit: 1 })
    );
}

#[test]
fn request_id_reused_with_other_parameters_is_refused() {
    let mut s = Shard::new();
    s.acquire("acme/job", "r", 1, 10_000, 0).unwrap();
    assert_eq!(
        s.acquire("acme/job", "r", 2, 20_000, 0),
        Err(LockError::RequestIdReused {
            original_ttl_ms: 10_000
        })
    );
}

#[test]
fn renew_with_a_stale_lease_is_refused() {
    let mut s = Shard::new();
    assert_eq!(s.renew("acme/job", 1, 0), Err(LockError::LeaseNotHeld));
    s.acquire("acme/job", "a", 1, 10_000, 0).unwrap();
    assert_eq!(s.renew("acme/job", 2, 0), Err(LockError::LeaseNotHeld));
    assert_eq!(LockError::LeaseNotHeld.retry(), Retry::Never);
}

#[test]
fn lease_id_collision_is_refused() {
    let mut s = Shard::new();
    s.acquire("acme/job", "a", 1, 10_000, 0).unwrap();
    assert_eq!(
        s.acquire("acme/job", "b", 1, 10_000, 1_000),
        Err(LockError::LeaseIdCollision)
    );
    assert_eq!(LockError::LeaseIdCollision.retry(), Retry::Immediately);
}

#[test]
fn renew_past_the_hold_limit_is_refused() {
    let mut s = Shard::with_limits(Limits {
        max_hold_ms: 60_000,
        max_lease_ttl_ms: 60_000,
        ..Limits::default()
    });
    s.acquire("acme/job", "a", 1, 60_000, 0).unwrap();
    s.advance(59_999);
    s.renew("acme/job", 1, 60_000).unwrap();
    // Extend the lease past the cap by a leader change allowance, then renew.
    s.term = 2;
    s.apply(Command::LeaderChanged {
        clock_offset_allowance_ms: 5_000,
    })
    .unwrap();
    s.advance(1);
    assert_eq!(
        s.renew("acme/job", 1, 60_000),
        Err(LockError::HoldLimitReached {
            max_hold_ms: 60_000,
            granted_at_ms: T0
        })
    );
}

#[test]
fn acquire_past_the_soft_token_limit_is_refused() {
    let mut s = Shard::new();
    s.index = POSITION_SOFT_LIMIT;
    assert_eq!(
        s.acquire("acme/job", "a", 1, 10_000, 0),
        Err(LockError::TokenSpaceExhausted { epoch: 1 })
    );
    assert_eq!(
        LockError::TokenSpaceExhausted { epoch: 1 }.retry(),
        Retry::Backoff
    );
}

#[test]
fn commands_before_the_leader_changed_entry_are_refused() {
    let mut s = Shard::new();
    s.term = 2;
    assert_eq!(
        s.acquire("acme/job", "a", 1, 10_000, 0),
        Err(LockError::LeaderNotReady {
            entry_term: 2,
            leader_term: 1
        })
    );
    s.apply(Command::LeaderChanged {
        clock_offset_allowance_ms: 0,
    })
    .unwrap();
    assert!(s.acquire("acme/job", "a", 1, 10_000, 0).is_ok());
    // A fresh table refuses everything until its first leader commits one.
    let mut fresh = LockTable::new(Limits::default()).unwrap();
    let ctx = ApplyContext {
        index: 1,
        term: 1,
        epoch: 1,
        now_ms: T0,
    };
    assert!(matches!(
        fresh.apply(&Command::Tick, &ctx).reply,
        Err(LockError::LeaderNotReady { .. })
    ));
}

#[test]
fn entries_with_a_stale_epoch_are_refused() {
    let mut s = Shard::new();
    s.epoch = 3;
    s.apply(Command::Tick).unwrap();
    s.epoch = 2;
    assert_eq!(
        s.apply(Command::Tick),
        Err(LockError::StaleEpoch {
            entry_epoch: 2,
            current_epoch: 3
        })
    );
}

#[test]
fn malformed_internal_commands_are_refused() {
    let mut s = Shard::new();
    assert!(matches!(
        s.apply(Command::LeaderChanged {
            clock_offset_allowance_ms: MAX_CLOCK_OFFSET_ALLOWANCE_MS + 1
        }),
        Err(LockError::InvalidCommand { .. })
    ));
    s.term = 0;
    assert!(matches!(
        s.apply(Command::LeaderChanged {
            clock_offset_allowance_ms: 0
        }),
        Err(LockError::InvalidCommand { .. })
    ));
    s.term = 1;
    let ctx = ApplyContext {
        index: 1,
        term: 1,
        epoch: 1,
        now_ms: T0,
    };
    assert!(
        matches!(
            s.table.apply(&Command::Tick, &ctx).reply,
            Err(LockError::InvalidCommand { .. })
        ),
        "index went back"
    );
    let ctx = ApplyContext {
        index: 100,
        term: 1,
        epoch: 0,
        now_ms: T0,
    };
    assert!(
        matches!(
            s.table.apply(&Command::Tick, &ctx).reply,
            Err(LockError::InvalidCommand { .. })
        ),
        "epoch 0"
    );
}

#[test]
fn invalid_limits_are_refused_naming_the_field() {
    let e = LockTable::new(Limits {
        min_lease_ttl_ms: 0,
        ..Limits::default()
    })
    .unwrap_err();
    assert_eq!(e.field, "min_lease_ttl_ms");
    let e = LockTable::new(Limits {
        max_hold_ms: 1,
        ..Limits::default()
    })
    .unwrap_err();
    assert_eq!(e.field, "max_hold_ms");
}

// ------------------------------------------------------- snapshots

#[test]
fn snapshot_round_trip_is_bit_identical() {
    let mut s = Shard::new();
    s.acquire("acme/a", "a", 1, 10_000, 0).unwrap();
    s.acquire("acme/a", "b", 2, 10_000, 5_000).unwrap();
    s.acquire("beta/b", "c", 3, 10_000, 0).unwrap();
    s.release("beta/b", 3);
    let bytes = s.table.snapshot();
    let restored = LockTable::restore(&bytes).unwrap();
    assert_eq!(restored, s.table);
    assert_eq!(restored.snapshot(), bytes);
}

#[test]
fn corrupt_snapshots_are_refused_without_panicking() {
    let mut s = Shard::new();
    s.acquire("acme/a", "a", 1, 10_000, 0).unwrap();
    s.acquire("acme/a", "b", 2, 10_000, 5_000).unwrap();
    let bytes = s.table.snapshot();
    assert_eq!(LockTable::restore(b"nope"), Err(DecodeError::BadMagic));
    let mut v9 = bytes.clone();
    v9[5] = 9;
    assert_eq!(
        LockTable::restore(&v9),
        Err(DecodeError::UnsupportedVersion(9))
    );
    let mut long = bytes.clone();
    long.push(0);
    assert_eq!(
        LockTable::restore(&long),
        Err(DecodeError::TrailingBytes(1))
    );
    for cut in 0..bytes.len() {
        assert!(
            LockTable::restore(&bytes[..cut]).is_err(),
            "truncated at {cut}"
        );
    }
    // Every single-byte corruption either fails to decode or yields a
    // table that passes every invariant check.
    for i in 0..bytes.len() {
        let mut b = bytes.clone();
        b[i] ^= 0xff;
        if let Ok(t) = LockTable::restore(&b) {
            assert_eq!(t.check_invariants(), Ok(()));
        }
    }
}

#[test]
fn corrupt_commands_are_refused_without_panicking() {
    let cmd = Command::RenewBatch {
        owner: Owner::anonymous(),
        items: vec![RenewItem {
            resource: name("acme/a"),
            lease_id: LeaseId([1; 16]),
            lease_ttl_ms: 5,
        }],
    };
    let bytes = cmd.encode();
    assert_eq!(Command::decode(&bytes), Ok(cmd));
    for cut in 0..bytes.len() {
        assert!(Command::decode(&bytes[..cut]).is_err());
    }
    assert!(matches!(
        Command::decode(&[9, 1]),
        Err(DecodeError::UnsupportedVersion(9))
    ));
    // Older versions (1: before lease owners; 2: before cancel attempts)
    // are refused, not guessed at.
    for old in [1, 2] {
        assert!(matches!(
            Command::decode(&[old, 6]),
            Err(DecodeError::UnsupportedVersion(v)) if v == u32::from(old)
        ));
    }
    assert!(matches!(
        Command::decode(&[3, 99]),
        Err(DecodeError::BadTag { .. })
    ));
    // A huge item count with no data behind it does not allocate.
    assert!(Command::decode(&[3, 3, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff]).is_err());
}

// ------------------------------------------------------------ owners and tenants

fn owner(s: &str) -> Owner {
    Owner::new(s).unwrap()
}

fn acquire_as(who: &Owner, res: &str, req: &str, lease: u8, wait: u64) -> Command {
    Command::Acquire {
        owner: who.clone(),
        resource: name(res),
        request_id: RequestId::new(req.as_bytes()).unwrap(),
        lease_id: LeaseId([lease; 16]),
        lease_ttl_ms: 10_000,
        wait_timeout_ms: wait,
        value: fencelock_statemachine::HolderValue::none(),
        mode: fencelock_statemachine::AcquireMode::Exclusive,
    }
}

#[test]
fn only_the_owner_may_renew_or_release_a_lease() {
    let mut s = Shard::new();
    let alice = owner("spiffe://fencelock/tenant/acme/alice");
    let mallory = owner("spiffe://fencelock/tenant/acme/mallory");
    s.apply(acquire_as(&alice, "acme/x", "r1", 1, 0)).unwrap();
    // The stolen lease id is useless to another identity.
    let renew = |who: &Owner| Command::Renew {
        resource: name("acme/x"),
        owner: who.clone(),
        lease_id: LeaseId([1; 16]),
        lease_ttl_ms: 0,
    };
    let release = |who: &Owner| Command::Release {
        resource: name("acme/x"),
        owner: who.clone(),
        lease_id: LeaseId([1; 16]),
    };
    assert_eq!(s.apply(renew(&mallory)), Err(LockError::PermissionDenied));
    assert_eq!(s.apply(release(&mallory)), Err(LockError::PermissionDenied));
    let batch = s
        .apply(Command::RenewBatch {
            owner: mallory.clone(),
            items: vec![RenewItem {
                resource: name("acme/x"),
                lease_id: LeaseId([1; 16]),
                lease_ttl_ms: 0,
            }],
        })
        .unwrap();
    assert_eq!(
        batch,
        Reply::RenewedBatch(vec![Err(LockError::PermissionDenied)])
    );
    assert_eq!(s.holder("acme/x"), Some(LeaseId([1; 16])));
    // The anonymous owner is just another identity.
    assert_eq!(
        s.apply(renew(&Owner::anonymous())),
        Err(LockError::PermissionDenied)
    );
    assert!(matches!(s.apply(renew(&alice)), Ok(Reply::Renewed(_))));
    assert_eq!(
        s.apply(release(&alice)),
        Ok(Reply::Released { released: true })
    );
}

#[test]
fn only_the_owner_may_cancel_a_queued_wait() {
    let mut s = Shard::new();
    let alice = owner("spiffe://fencelock/tenant/acme/alice");
    let bob = owner("spiffe://fencelock/tenant/acme/bob");
    s.apply(acquire_as(&alice, "acme/x", "r1", 1, 0)).unwrap();
    s.apply(acquire_as(&bob, "acme/x", "r2", 2, 5_000)).unwrap();
    let release = |who: &Owner| Command::Release {
        resource: name("acme/x"),
        owner: who.clone(),
        lease_id: LeaseId([2; 16]),
    };
    assert_eq!(s.apply(release(&alice)), Err(LockError::PermissionDenied));
    assert_eq!(s.table.view(&name("acme/x")).unwrap().queue_len, 1);
    assert_eq!(
        s.apply(release(&bob)),
        Ok(Reply::Released { released: true })
    );
}

#[test]
fn a_handed_off_lease_belongs_to_the_waiter_that_got_it() {
    let mut s = Shard::new();
    let alice = owner("spiffe://fencelock/tenant/acme/alice");
    let bob = owner("spiffe://fencelock/tenant/acme/bob");
    s.apply(acquire_as(&alice, "acme/x", "r1", 1, 0)).unwrap();
    s.apply(acquire_as(&bob, "acme/x", "r2", 2, 5_000)).unwrap();
    s.apply(Command::Release {
        resource: name("acme/x"),
        owner: alice.clone(),
        lease_id: LeaseId([1; 16]),
    })
    .unwrap();
    let renew = |who: &Owner| Command::Renew {
        resource: name("acme/x"),
        owner: who.clone(),
        lease_id: LeaseId([2; 16]),
        lease_ttl_ms: 0,
    };
    assert_eq!(s.apply(renew(&alice)), Err(LockError::PermissionDenied));
    assert!(matches!(s.apply(renew(&bob)), Ok(Reply::Renewed(_))));
}

#[test]
fn request_ids_are_deduplicated_per_owner() {
    let mut s = Shard::new();
    let alice = owner("spiffe://fencelock/tenant/acme/alice");
    let bob = owner("spiffe://fencelock/tenant/acme/bob");
    let first = s.apply(acquire_as(&alice, "acme/x", "same-id", 1, 0));
    assert!(matches!(first, Ok(Reply::Acquire(a)) if !a.deduplicated));
    // Alice's retry gets her original lease back.
    let retry = s.apply(acquire_as(&alice, "acme/x", "same-id", 9, 0));
    assert!(
        matches!(retry, Ok(Reply::Acquire(a)) if a.deduplicated && a.lease_id == LeaseId([1; 16]))
    );
    // Bob using the same request id is a different acquire: he never sees
    // Alice's lease id, he finds the lock held.
    let other = s.apply(acquire_as(&bob, "acme/x", "same-id", 2, 0));
    assert!(
        matches!(other, Err(LockError::LockHeld { .. })),
        "{other:?}"
    );
    assert_eq!(s.table.dedup_count(), 1);
}

#[test]
fn tenant_hold_quota_is_refused_without_touching_other_tenants() {
    let mut s = Shard::with_limits(Limits {
        max_held_per_tenant: 2,
        ..Limits::default()
    });
    s.acquire("acme/a", "1", 1, 10_000, 0).unwrap();
    s.acquire("acme/b", "2", 2, 10_000, 0).unwrap();
    assert_eq!(
        s.acquire("acme/c", "3", 3, 10_000, 0),
        Err(LockError::TenantQuotaExceeded { limit: 2 })
    );
    // Another tenant is unaffected.
    s.acquire("beta/a", "4", 4, 10_000, 0).unwrap();
    // A hand-off to a waiter keeps the tenant's count.
    s.acquire("acme/a", "5", 5, 10_000, 5_000).unwrap();
    assert!(s.release("acme/a", 1));
    assert_eq!(s.holder("acme/a"), Some(LeaseId([5; 16])));
    assert_eq!(
        s.acquire("acme/c", "6", 6, 10_000, 0),
        Err(LockError::TenantQuotaExceeded { limit: 2 })
    );
    // A release frees a place.
    assert!(s.release("acme/b", 2));
    s.acquire("acme/c", "7", 7, 10_000, 0).unwrap();
    // The counts survive a snapshot.
    let restored = LockTable::restore(&s.table.snapshot()).unwrap();
    assert_eq!(restored, s.table);
}

#[test]
fn owners_survive_a_snapshot() {
    let mut s = Shard::new();
    let alice = owner("spiffe://fencelock/tenant/acme/alice");
    s.apply(acquire_as(&alice, "acme/x", "r1", 1, 0)).unwrap();
    let restored = LockTable::restore(&s.table.snapshot()).unwrap();
    assert_eq!(restored, s.table);
    let mut s2 = Shard {
        table: restored,
        ..Shard::new()
    };
    s2.index = s.index;
    assert_eq!(s2.renew("acme/x", 1, 0), Err(LockError::PermissionDenied));
}

#[test]
fn owner_identity_is_bounded_printable_ascii() {
    assert!(Owner::new("spiffe://fencelock/tenant/acme/a").is_ok());
    assert!(Owner::new("x".repeat(limits::MAX_OWNER_LEN)).is_ok());
    assert!(matches!(
        Owner::new("x".repeat(limits::MAX_OWNER_LEN + 1)),
        Err(LockError::InvalidOwner { .. })
    ));
    assert!(Owner::new("has space").is_err());
    assert!(Owner::new("é").is_err());
}
