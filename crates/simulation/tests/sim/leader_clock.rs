//! Lease time across a leader that restarted, forced step by step on the
//! real stores (docs/safety.md, "Time and leases"): the seeded runs reach
//! this interleaving only by chance.
//!
//! Node B leads the shard and stamps entries that every replica applies;
//! the shard then stays idle for longer than a lease. Node A restarts: it
//! can account only for the time since it replayed B's entries, so once
//! it takes the leadership over its lease clock runs behind B's by the
//! idle time (and behind every wall clock). A grants a lease and is cut
//! off the moment it answers. One of the others is elected next; it must
//! continue A's time, however far behind the wall clock that is, so the
//! next holder is granted only after the first holder's stop-by. A
//! successor that took the wall clock instead (the broken variant, armed
//! on the successors only) frees A's lease at once.

use fencelock_multiraft::{SimFault, StoreMsg};
use fencelock_statemachine::{LeaseId, ResourceName};
use rand::rngs::StdRng;
use rand::SeedableRng;

use super::attempts::{acquire_for, release_for, run_for, run_next};
use super::lease_time::{granted_ttl_ms, leader_of, shard_of};
use super::world::{World, NODES};

/// The lease the restarted leader grants.
const TTL_MS: u64 = 5_000;
/// How long the shard stays idle after B's entries: past a lease, so a
/// successor ahead of A's time by it frees the lease at once.
const IDLE_MS: u64 = 10_000;

/// The first holder's stop-by and when the next holder was granted,
/// simulated ms.
struct Outcome {
    stop_by_ms: u64,
    next_granted_ms: u64,
}

/// Runs until `shard_id` has a ready leader for which `pick` holds.
fn wait_for_leader(world: &mut World, shard_id: u64, pick: impl Fn(u64) -> bool) -> u64 {
    let give_up_ms = world.now_ms + 20_000;
    loop {
        run_for(world, 100);
        if let Some(leader) = leader_of(world, shard_id).filter(|l| pick(*l)) {
            return leader;
        }
        assert!(world.now_ms < give_up_ms, "no leader for shard {shard_id}");
    }
}

/// `successor_fault`: the bug the nodes other than A run (A restarts
/// without it).
fn scenario(seed: u64, successor_fault: Option<SimFault>) -> Outcome {
    let mut world = World::new(StdRng::seed_from_u64(seed), successor_fault);
    let resource = ResourceName::parse("sim/restarted-leader").expect("valid");
    let shard_id = shard_of(&World::bootstrap_config(), &resource);
    let b = wait_for_leader(&mut world, shard_id, |_| true);

    // B stamps entries (a grant and its release) that every replica
    // applies; then nothing happens on the shard for IDLE_MS.
    let (msg, mut first) = acquire_for(shard_id, &resource, "warm-up", 9, TTL_MS, 0);
    world.step(b, vec![msg], false);
    run_for(&mut world, 1_000);
    assert!(first.try_recv().is_ok_and(|a| a.is_ok()), "warm-up granted");
    let (msg, _released) = release_for(shard_id, &resource, 9);
    world.step(b, vec![msg], false);
    run_for(&mut world, IDLE_MS);

    // A restarts (running the correct code), replays B's entries, and
    // takes the leadership over.
    let a = b % NODES + 1;
    world.start_without_fault_from_now();
    world.crash(a);
    world.start(a);
    run_for(&mut world, 1_000);
    let (tx, _moved) = tokio::sync::oneshot::channel();
    world.step(
        b,
        vec![StoreMsg::TransferLeader {
            shard_id,
            to: a,
            tx,
        }],
        false,
    );
    wait_for_leader(&mut world, shard_id, |l| l == a);

    // A grants the lease and is cut off the moment it answers.
    let sent_ms = world.now_ms;
    let (msg, mut granted) = acquire_for(shard_id, &resource, "holder", 1, TTL_MS, 0);
    world.step(a, vec![msg], false);
    let answer = loop {
        run_next(&mut world);
        if let Ok(answer) = granted.try_recv() {
            break answer.expect("the holder is granted");
        }
        assert!(world.now_ms < sent_ms + 5_000, "A never answered");
    };
    let links: Vec<(u64, u64)> = (1..=NODES)
        .filter(|n| *n != a)
        .flat_map(|n| [(a, n), (n, a)])
        .collect();
    world.partition(links, world.now_ms + 60_000);
    // Counted from the send, without a margin: the strictest reading.
    let stop_by_ms = sent_ms + granted_ttl_ms(&answer.status);

    // The next holder waits on whichever of the others is elected.
    let next_leader = wait_for_leader(&mut world, shard_id, |l| l != a);
    let (msg, mut next) = acquire_for(shard_id, &resource, "next", 2, TTL_MS, 20_000);
    world.step(next_leader, vec![msg], false);
    let next_granted_ms = loop {
        run_next(&mut world);
        if let Ok(answer) = next.try_recv() {
            assert_eq!(answer.expect("granted").lease_id, LeaseId([2; 16]));
            break world.now_ms;
        }
        assert!(world.now_ms < stop_by_ms + 20_000, "never granted");
    };
    Outcome {
        stop_by_ms,
        next_granted_ms,
    }
}

/// Seeds of the world's network and tick timing (the steps are fixed).
const SEEDS: [u64; 3] = [1, 2, 3];

#[test]
fn the_successor_of_a_restarted_leader_continues_its_time_and_the_lease_is_not_freed_early() {
    for seed in SEEDS {
        let Outcome {
            stop_by_ms,
            next_granted_ms,
        } = scenario(seed, None);
        assert!(
            next_granted_ms >= stop_by_ms,
            "seed {seed}: the next holder got the lock at {next_granted_ms} ms, while the \
             first was told it held it until {stop_by_ms} ms"
        );
    }
}

#[test]
fn a_successor_that_takes_the_wall_clock_frees_the_restarted_leaders_lease_early() {
    for seed in SEEDS {
        let Outcome {
            stop_by_ms,
            next_granted_ms,
        } = scenario(seed, Some(SimFault::TrustWallClockOnNewLeader));
        assert!(
            next_granted_ms < stop_by_ms,
            "seed {seed}: the broken variant was not caught: the next holder got the lock at \
             {next_granted_ms} ms, after the first holder's stop-by at {stop_by_ms} ms"
        );
    }
}
