//! Holder values at the state-machine level: what a lease publishes, who
//! may replace it, the per-shard budget, and the encodings that keep a
//! table without values readable by the previous release.

mod common;

use common::{name, snapshot_version, Shard};
use fencelock_statemachine::limits::{MAX_HOLDER_VALUE_BYTES, MAX_VALUE_BYTES_PER_SHARD};
use fencelock_statemachine::*;

impl Shard {
    fn acquire(
        &mut self,
        res: &str,
        owner: &Owner,
        lease: u8,
        wait_ms: u64,
        value: &[u8],
    ) -> Result<AcquireReply, LockError> {
        match self.apply(acquire_cmd(res, owner, lease, wait_ms, value))? {
            Reply::Acquire(a) => Ok(a),
            other => panic!("unexpected {other:?}"),
        }
    }

    fn proclaim(
        &mut self,
        res: &str,
        owner: &Owner,
        lease: u8,
        value: &[u8],
    ) -> Result<Reply, LockError> {
        self.apply(Command::Proclaim {
            resource: name(res),
            owner: owner.clone(),
            lease_id: LeaseId([lease; 16]),
            value: HolderValue::new(value.to_vec()).unwrap(),
        })
    }

    fn value(&self, res: &str) -> Option<Vec<u8>> {
        self.table
            .view(&name(res))
            .map(|v| v.value.as_bytes().to_vec())
    }
}

fn acquire_cmd(res: &str, owner: &Owner, lease: u8, wait_ms: u64, value: &[u8]) -> Command {
    Command::Acquire {
        resource: name(res),
        owner: owner.clone(),
        request_id: RequestId::new(vec![b'r', lease]).unwrap(),
        lease_id: LeaseId([lease; 16]),
        lease_ttl_ms: 10_000,
        wait_timeout_ms: wait_ms,
        value: HolderValue::new(value.to_vec()).unwrap(),
        mode: fencelock_statemachine::AcquireMode::Exclusive,
    }
}

#[test]
fn a_waiter_publishes_its_own_value_from_its_grant_and_a_release_clears_it() {
    let mut s = Shard::new();
    let me = Owner::anonymous();
    s.acquire("acme/leader", &me, 1, 0, b"10.0.0.1:7000")
        .unwrap();
    assert_eq!(s.value("acme/leader").unwrap(), b"10.0.0.1:7000");
    s.acquire("acme/leader", &me, 2, 5_000, b"10.0.0.2:7000")
        .unwrap();
    // Queued: the holder's value is what is published.
    assert_eq!(s.value("acme/leader").unwrap(), b"10.0.0.1:7000");
    assert_eq!(s.table.value_bytes(), 26);
    s.apply(Command::Release {
        resource: name("acme/leader"),
        owner: me.clone(),
        lease_id: LeaseId([1; 16]),
    })
    .unwrap();
    assert_eq!(s.value("acme/leader").unwrap(), b"10.0.0.2:7000");
    assert_eq!(s.table.value_bytes(), 13);
    s.apply(Command::Release {
        resource: name("acme/leader"),
        owner: me,
        lease_id: LeaseId([2; 16]),
    })
    .unwrap();
    assert_eq!(s.value("acme/leader"), None);
    assert_eq!(s.table.value_bytes(), 0);
    assert_eq!(s.table.check_invariants(), Ok(()));
}

#[test]
fn only_the_holding_lease_of_its_own_owner_proclaims_and_the_token_stays() {
    let mut s = Shard::new();
    let alice = Owner::new("spiffe://fencelock/tenant/acme/alice").unwrap();
    let mallory = Owner::new("spiffe://fencelock/tenant/acme/mallory").unwrap();
    let granted = s.acquire("acme/leader", &alice, 1, 0, b"a1").unwrap();
    let AcquireStatus::Held { token, .. } = granted.status else {
        panic!("{granted:?}")
    };
    s.acquire("acme/leader", &alice, 2, 20_000, b"").unwrap();

    let out = s.apply_full(Command::Proclaim {
        resource: name("acme/leader"),
        owner: alice.clone(),
        lease_id: LeaseId([1; 16]),
        value: HolderValue::new(b"a2".to_vec()).unwrap(),
    });
    assert_eq!(out.reply, Ok(Reply::Proclaimed { token }));
    assert_eq!(
        out.events,
        vec![Event::ValueChanged {
            resource: name("acme/leader"),
            lease_id: LeaseId([1; 16]),
            token,
        }]
    );
    assert_eq!(s.value("acme/leader").unwrap(), b"a2");
    // Another identity, a waiter, a lease never granted: refused, nothing
    // changes.
    assert_eq!(
        s.proclaim("acme/leader", &mallory, 1, b"m"),
        Err(LockError::PermissionDenied)
    );
    assert_eq!(
        s.proclaim("acme/leader", &alice, 2, b"w"),
        Err(LockError::LeaseNotHeld)
    );
    assert_eq!(
        s.proclaim("acme/other", &alice, 1, b"x"),
        Err(LockError::LeaseNotHeld)
    );
    assert_eq!(s.value("acme/leader").unwrap(), b"a2");
    // An expired lease cannot publish: settled first, then refused; the
    // waiter took over.
    s.now_ms += 10_001;
    assert_eq!(
        s.proclaim("acme/leader", &alice, 1, b"late"),
        Err(LockError::LeaseNotHeld)
    );
    assert_eq!(s.value("acme/leader").unwrap(), b"");
    // Clearing a value is a proclaim of nothing.
    assert!(s.proclaim("acme/leader", &alice, 2, b"w2").is_ok());
    assert!(s.proclaim("acme/leader", &alice, 2, b"").is_ok());
    assert_eq!(s.table.value_bytes(), 0);
}

#[test]
fn values_past_the_limits_are_refused_with_the_bound() {
    assert_eq!(
        HolderValue::new(vec![0; MAX_HOLDER_VALUE_BYTES + 1]),
        Err(LockError::ValueTooLarge {
            len: MAX_HOLDER_VALUE_BYTES + 1,
            max: MAX_HOLDER_VALUE_BYTES
        })
    );
    assert!(HolderValue::new(vec![0; MAX_HOLDER_VALUE_BYTES]).is_ok());

    // The shard's budget: full, a value is refused, none is not.
    let mut s = Shard::new();
    s.check_each_step = false;
    let me = Owner::anonymous();
    let big = vec![b'v'; MAX_HOLDER_VALUE_BYTES];
    let fits = (MAX_VALUE_BYTES_PER_SHARD / MAX_HOLDER_VALUE_BYTES as u64) as usize;
    for i in 0..fits {
        let res = format!("acme/r{i}");
        let out = s.apply(Command::Acquire {
            resource: name(&res),
            owner: me.clone(),
            request_id: RequestId::new(format!("q{i}")).unwrap(),
            lease_id: LeaseId([1; 16]),
            lease_ttl_ms: 10_000,
            wait_timeout_ms: 0,
            value: HolderValue::new(big.clone()).unwrap(),
            mode: fencelock_statemachine::AcquireMode::Exclusive,
        });
        assert!(out.is_ok(), "{i}: {out:?}");
    }
    assert_eq!(s.table.value_bytes(), MAX_VALUE_BYTES_PER_SHARD);
    let full = s.acquire("acme/one-more", &me, 9, 0, b"x");
    assert_eq!(
        full,
        Err(LockError::ValuesFull {
            limit_bytes: MAX_VALUE_BYTES_PER_SHARD
        })
    );
    assert_eq!(full.unwrap_err().retry(), Retry::Backoff);
    assert!(s.acquire("acme/one-more", &me, 9, 0, b"").is_ok());
    // A holder may still swap its value for one no larger.
    assert!(s.proclaim("acme/r0", &me, 1, b"small").is_ok());
    assert!(s.proclaim("acme/r1", &me, 1, &big).is_ok());
    assert_eq!(s.table.check_invariants(), Ok(()));
}

#[test]
fn a_table_without_values_encodes_as_the_previous_release_wrote_it() {
    let me = Owner::anonymous();
    // An acquire without a value keeps the first acquire tag (1), one with
    // a value has its own (13): an older build refuses that entry rather
    // than drop the value.
    assert_eq!(acquire_cmd("acme/a", &me, 1, 0, b"").encode()[1], 1);
    assert_eq!(acquire_cmd("acme/a", &me, 1, 0, b"v").encode()[1], 13);
    // The value tag never carries an empty value (one command, one
    // encoding).
    let mut bytes = acquire_cmd("acme/a", &me, 1, 0, b"v").encode();
    let len = bytes.len();
    bytes[len - 5..len - 1].copy_from_slice(&0u32.to_be_bytes());
    bytes.truncate(len - 1);
    assert!(matches!(
        Command::decode(&bytes),
        Err(DecodeError::Invalid(_))
    ));

    let mut s = Shard::new();
    s.acquire("acme/a", &me, 1, 0, b"").unwrap();
    assert_eq!(snapshot_version(&s.table), 4, "no value: the old version");
    s.acquire("acme/b", &me, 2, 0, b"addr").unwrap();
    assert_eq!(snapshot_version(&s.table), 5);
    let restored = LockTable::restore(&s.table.snapshot()).unwrap();
    assert_eq!(restored, s.table);
    assert_eq!(
        restored.view(&name("acme/b")).unwrap().value.as_bytes(),
        b"addr"
    );
    s.apply(Command::Release {
        resource: name("acme/b"),
        owner: me,
        lease_id: LeaseId([2; 16]),
    })
    .unwrap();
    assert_eq!(snapshot_version(&s.table), 4, "the last value gone");
}

#[test]
fn values_move_with_their_leases_between_shards() {
    let me = Owner::anonymous();
    let mut source = Shard::new();
    source
        .acquire("acme/leader", &me, 1, 0, b"10.0.0.1:7000")
        .unwrap();
    source.acquire("acme/leader", &me, 2, 5_000, b"w").unwrap();
    let target = source.move_slot_of("acme/leader");
    assert_eq!(
        source.table.value_bytes(),
        0,
        "the values left with the slot"
    );
    assert_eq!(target.value("acme/leader").unwrap(), b"10.0.0.1:7000");
    assert_eq!(target.table.value_bytes(), 14);
    assert_eq!(target.table.check_invariants(), Ok(()));
}
