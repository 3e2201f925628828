//! A leader whose disk stalls, forced on the real stores (docs/safety.md,
//! "Sending before persisting, and not waiting for the write"): its
//! appends leave before its own write, its two followers write and
//! acknowledge them, and each entry is committed by their majority. The
//! leader applies it and answers while its own write is still in flight —
//! request after request, though that write never lands — and when its
//! disk comes back, the write lands and nothing is lost (the durability
//! property is checked after every step all along).

use fencelock_statemachine::{AcquireStatus, Reply, ResourceName};
use rand::rngs::StdRng;
use rand::SeedableRng;
use tokio::sync::oneshot;

use super::attempts::{acquire_for, release_for, run_for};
use super::lease_time::{leader_of, shard_of};
use super::world::World;

/// How long each answer may take: past the simulated network's drops and
/// long delays (a follower's lost acknowledgement is sent again), far
/// short of the stall, which never ends on its own.
const ANSWER_WITHIN_MS: u64 = 2_000;

/// Runs the world until `rx` has an answer (or the budget is spent).
fn answered<T>(world: &mut World, rx: &mut oneshot::Receiver<T>) -> Option<T> {
    let give_up_ms = world.now_ms + ANSWER_WITHIN_MS;
    while world.now_ms < give_up_ms {
        run_for(world, 20);
        if let Ok(answer) = rx.try_recv() {
            return Some(answer);
        }
    }
    None
}

#[test]
fn a_leader_whose_disk_stalls_answers_through_its_followers_majority() {
    for seed in [1, 2, 3] {
        let mut world = World::new(StdRng::seed_from_u64(seed), None);
        let resource = ResourceName::parse("sim/stalled-leader-disk").expect("valid");
        let shard_id = shard_of(&World::bootstrap_config(), &resource);
        run_for(&mut world, 3_000);
        let leader = leader_of(&world, shard_id).expect("the shard has a leader");

        world.stall_disk(leader, true);
        for round in 0..5u8 {
            let lease = round + 1;
            let (msg, mut granted) = acquire_for(
                shard_id,
                &resource,
                &format!("stalled-{round}"),
                lease,
                5_000,
                0,
            );
            world.step(leader, vec![msg], false);
            let answer = answered(&mut world, &mut granted)
                .unwrap_or_else(|| panic!("seed {seed} round {round}: the acquire got no answer"))
                .expect("granted");
            assert!(
                matches!(answer.status, AcquireStatus::Held { .. }),
                "seed {seed} round {round}: {answer:?}"
            );
            assert!(
                world.write_in_flight(leader),
                "seed {seed} round {round}: the leader's own write landed"
            );
            let (msg, mut released) = release_for(shard_id, &resource, lease);
            world.step(leader, vec![msg], false);
            let got = answered(&mut world, &mut released);
            assert!(
                matches!(got, Some(Ok(Reply::Released { released: true }))),
                "seed {seed} round {round}: the release was answered {got:?}"
            );
        }
        assert_eq!(
            leader_of(&world, shard_id),
            Some(leader),
            "seed {seed}: the stalled leader kept leading"
        );

        // The disk comes back: its writes land and the shard goes on.
        world.stall_disk(leader, false);
        run_for(&mut world, 500);
        let now_leader = leader_of(&world, shard_id).expect("a leader");
        let (msg, mut last) = acquire_for(shard_id, &resource, "after", 9, 5_000, 0);
        world.step(now_leader, vec![msg], false);
        let got = answered(&mut world, &mut last);
        assert!(
            matches!(got, Some(Ok(ref a)) if matches!(a.status, AcquireStatus::Held { .. })),
            "seed {seed}: after the disk came back: {got:?}"
        );
    }
}
