//! Lease time as the holder is told it, forced step by step on the real
//! stores (docs/safety.md, "Time and leases"): every answer grants only the
//! time the lease really has left, so a holder that counts its stop-by from
//! the answer stops before the service hands the lock to someone else.
//!
//! * A retry by request id answered from the dedup table long after the
//!   grant, then renewals that fail (the leader's node dies): the next holder
//!   is granted only after the retry's stop-by. Before the fix the retry was
//!   told the full TTL again, and both held the lock for seconds.
//! * A renewal a few seconds before the hold cap grants only those seconds;
//!   the lock goes to the next holder at the cap, after the stop-by.

use fencelock_multiraft::StoreConfig;
use fencelock_placement::PlacementMap;
use fencelock_statemachine::{
    slot_of, AcquireStatus, Command, LeaseId, Owner, Reply, ResourceName,
};
use rand::rngs::StdRng;
use rand::SeedableRng;

use super::attempts::{acquire_for, propose, run_for, run_next};
use super::world::World;

/// The stop-by margin the simulated clients keep (the Rust client's
/// default is 5%); the checks below use none, the strictest reading.
const TTL_MS: u64 = 5_000;

pub(super) fn shard_of(world_config: &StoreConfig, resource: &ResourceName) -> u64 {
    let nodes: Vec<(u64, String)> = world_config.peer_map().into_iter().collect();
    let map = PlacementMap::bootstrap(
        &nodes,
        world_config.shard_count,
        world_config.replication_factor as usize,
    )
    .expect("bootstrap map");
    map.shard_of_slot(slot_of(resource))
}

pub(super) fn leader_of(world: &World, shard_id: u64) -> Option<u64> {
    world.leaders().get(&shard_id).copied()
}

/// The held lease's answered TTL, or a panic naming what came instead.
pub(super) fn granted_ttl_ms(status: &AcquireStatus) -> u64 {
    match status {
        AcquireStatus::Held { lease_ttl_ms, .. } => *lease_ttl_ms,
        other => panic!("not held: {other:?}"),
    }
}

#[test]
fn a_late_deduplicated_answer_then_failed_renewals_never_overlaps_the_next_holder() {
    let mut world = World::new(StdRng::seed_from_u64(17), None);
    let resource = ResourceName::parse("sim/late-retry").expect("valid");
    let shard_id = shard_of(&World::bootstrap_config(), &resource);
    run_for(&mut world, 3_000);
    let leader = leader_of(&world, shard_id).expect("the shard has a leader");

    // The first attempt is granted; its answer never reaches the caller.
    let (msg, _lost_answer) = acquire_for(shard_id, &resource, "job-1", 1, TTL_MS, 0);
    world.step(leader, vec![msg], false);
    run_for(&mut world, 3_000);

    // The caller retries with the same request id, 3 s after the grant.
    let retry_sent_ms = world.now_ms;
    let (msg, mut retry) = acquire_for(shard_id, &resource, "job-1", 2, TTL_MS, 0);
    world.step(leader, vec![msg], false);
    run_for(&mut world, 100);
    let answer = retry
        .try_recv()
        .expect("the retry was answered")
        .expect("held");
    assert!(answer.deduplicated, "{answer:?}");
    assert_eq!(answer.lease_id, LeaseId([1; 16]), "the original lease");
    let granted_ms = granted_ttl_ms(&answer.status);
    // The caller's deadline, counted from the retry's send, as the
    // contract says (no margin: the strictest reading).
    let stop_by_ms = retry_sent_ms + granted_ms;

    // Its renewals fail from now on: the leader's node dies.
    world.crash(leader);
    let (renew, mut renewed) = propose(
        shard_id,
        Command::Renew {
            resource: resource.clone(),
            owner: Owner::anonymous(),
            lease_id: LeaseId([1; 16]),
            lease_ttl_ms: TTL_MS,
        },
    );
    world.step(leader, vec![renew], false);

    // Someone else waits for the lock on the majority side, from the
    // moment it has a leader; it is granted when the lease ends there.
    let mut next = None;
    while next.is_none() {
        run_for(&mut world, 100);
        assert!(
            world.now_ms < retry_sent_ms + 20_000,
            "no leader on the majority side"
        );
        if let Some(new_leader) = leader_of(&world, shard_id).filter(|l| *l != leader) {
            let (msg, rx) = acquire_for(shard_id, &resource, "job-2", 3, TTL_MS, 15_000);
            world.step(new_leader, vec![msg], false);
            next = Some(rx);
        }
    }
    let mut next = next.expect("sent");
    // One event at a time: the answer appears in the step that granted it.
    let granted_at_ms = loop {
        run_next(&mut world);
        if let Ok(answer) = next.try_recv() {
            let answer = answer.expect("the next holder is granted");
            assert_eq!(answer.lease_id, LeaseId([3; 16]));
            break world.now_ms;
        }
        assert!(world.now_ms < retry_sent_ms + 25_000, "never granted");
    };
    assert!(
        !matches!(renewed.try_recv(), Ok(Ok(Reply::Renewed(_)))),
        "the dead leader cannot have renewed"
    );
    assert!(
        granted_at_ms >= stop_by_ms,
        "the next holder got the lock at {granted_at_ms} ms, while the retry's caller \
         was told it held it until {stop_by_ms} ms"
    );
    assert!(
        granted_ms < TTL_MS - 2_500,
        "a retry 3 s after the grant was told {granted_ms} ms"
    );
}

#[test]
fn a_renewal_before_the_hold_cap_grants_only_the_time_left_before_it() {
    const MAX_HOLD_MS: u64 = 600_000;
    let mut world = World::with_config(StdRng::seed_from_u64(23), None, |c| {
        c.limits.max_hold_ms = MAX_HOLD_MS;
        c.limits.max_lease_ttl_ms = 60_000;
    });
    let resource = ResourceName::parse("sim/hold-cap").expect("valid");
    let shard_id = shard_of(&World::bootstrap_config(), &resource);
    run_for(&mut world, 3_000);
    let leader = leader_of(&world, shard_id).expect("the shard has a leader");

    let ttl_ms = 60_000;
    let (msg, mut first) = acquire_for(shard_id, &resource, "long-job", 1, ttl_ms, 0);
    let sent_ms = world.now_ms;
    world.step(leader, vec![msg], false);
    run_for(&mut world, 100);
    first.try_recv().expect("answered").expect("granted");
    // The grant's apply time is after its send: the cap falls no earlier.
    let cap_at_least_ms = sent_ms + MAX_HOLD_MS;

    // Renew every 20 s, always asking for 60 s, until the cap.
    let mut stop_by_ms = sent_ms + ttl_ms;
    loop {
        run_for(&mut world, 20_000 - 100);
        let renew_sent_ms = world.now_ms;
        let (renew, mut renewed) = propose(
            shard_id,
            Command::Renew {
                resource: resource.clone(),
                owner: Owner::anonymous(),
                lease_id: LeaseId([1; 16]),
                lease_ttl_ms: ttl_ms,
            },
        );
        let leader = leader_of(&world, shard_id).expect("a leader");
        world.step(leader, vec![renew], false);
        run_for(&mut world, 100);
        match renewed.try_recv().expect("answered") {
            Ok(Reply::Renewed(r)) => {
                assert!(r.lease_ttl_ms <= ttl_ms);
                stop_by_ms = stop_by_ms.max(renew_sent_ms + r.lease_ttl_ms);
            }
            // At (or past) the cap: no more renewals.
            Err(_) => break,
            Ok(other) => panic!("unexpected {other:?}"),
        }
        assert!(
            world.now_ms < sent_ms + MAX_HOLD_MS + ttl_ms,
            "renewed past the cap"
        );
    }
    assert!(
        stop_by_ms <= cap_at_least_ms + 1_000,
        "the holder was told it may work until {stop_by_ms} ms, past the hold cap at \
         about {cap_at_least_ms} ms"
    );

    // The next holder waits and is granted at the cap, not before the
    // first holder's stop-by.
    let leader = leader_of(&world, shard_id).expect("a leader");
    let (msg, mut next) = acquire_for(shard_id, &resource, "next-job", 2, ttl_ms, 60_000);
    world.step(leader, vec![msg], false);
    let granted_at_ms = loop {
        run_next(&mut world);
        if let Ok(answer) = next.try_recv() {
            answer.expect("the next holder is granted");
            break world.now_ms;
        }
        assert!(world.now_ms < cap_at_least_ms + 120_000, "never granted");
    };
    assert!(
        granted_at_ms >= stop_by_ms,
        "next holder at {granted_at_ms} ms, first holder told {stop_by_ms} ms"
    );
}
