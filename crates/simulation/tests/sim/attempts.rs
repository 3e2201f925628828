//! One interleaving the seeded runs reach only by chance, forced step by
//! step on the real stores: a waiting acquire's caller goes away, its retry
//! (same request id) is proposed, and the leader's tick — which sees the
//! first caller gone and proposes `Cancel` for it — runs before the retry
//! applies. The cancel lands after the retry in the log and must leave the
//! acquire the retry attached to alone (docs/safety.md, "Waiting").

use fencelock_multiraft::{AcquireResult, ReplyResult, Responder, StoreMsg};
use fencelock_placement::PlacementMap;
use fencelock_statemachine::{
    slot_of, AcquireStatus, Command, LeaseId, Owner, Reply, RequestId, ResourceName,
};
use rand::rngs::StdRng;
use rand::SeedableRng;
use tokio::sync::oneshot;

use super::world::{Ev, World, NODES};

/// Runs the world's own events (deliveries, ticks) for `ms` simulated ms.
pub(super) fn run_for(world: &mut World, ms: u64) {
    let end = world.now_ms + ms;
    while world.peek_time().is_some_and(|at| at <= end) {
        run_next(world);
    }
}

/// Runs the world's next event (time moves to it).
pub(super) fn run_next(world: &mut World) {
    match world.pop() {
        Some(Ev::Deliver {
            from,
            to,
            envelopes,
        }) => world.deliver(from, to, envelopes),
        Some(Ev::Tick { node, generation }) => world.tick(node, generation),
        Some(Ev::Restart { node }) => world.start(node),
        Some(Ev::Heal { links }) => world.heal(links),
        Some(Ev::WriteLands { node, generation }) => world.land_write(node, generation),
        Some(Ev::Request { node, msg }) => world.step(node, vec![*msg], false),
        Some(Ev::ClientWake { .. } | Ev::Nemesis | Ev::HealAll) | None => {}
    }
}

fn acquire(
    shard_id: u64,
    resource: &ResourceName,
    request_id: &str,
    lease: u8,
    wait_timeout_ms: u64,
) -> (StoreMsg, oneshot::Receiver<AcquireResult>) {
    acquire_for(
        shard_id,
        resource,
        request_id,
        lease,
        5_000,
        wait_timeout_ms,
    )
}

/// An acquire of `resource` for `lease_ttl_ms`, answered on the receiver.
pub(super) fn acquire_for(
    shard_id: u64,
    resource: &ResourceName,
    request_id: &str,
    lease: u8,
    lease_ttl_ms: u64,
    wait_timeout_ms: u64,
) -> (StoreMsg, oneshot::Receiver<AcquireResult>) {
    let (tx, rx) = oneshot::channel();
    let msg = StoreMsg::Propose {
        shard_id,
        command: Command::Acquire {
            resource: resource.clone(),
            owner: Owner::anonymous(),
            request_id: RequestId::new(request_id.as_bytes().to_vec()).expect("valid"),
            lease_id: LeaseId([lease; 16]),
            lease_ttl_ms,
            wait_timeout_ms,
            value: fencelock_statemachine::HolderValue::none(),
            mode: fencelock_statemachine::AcquireMode::Exclusive,
        },
        responder: Responder::Acquire {
            resource: resource.clone(),
            tx,
        },
        caller: None,
    };
    (msg, rx)
}

/// A command answered with a plain reply (release, renew).
pub(super) fn propose(
    shard_id: u64,
    command: Command,
) -> (StoreMsg, oneshot::Receiver<ReplyResult>) {
    let (tx, rx) = oneshot::channel();
    let msg = StoreMsg::Propose {
        shard_id,
        command,
        responder: Responder::Reply(tx),
        caller: None,
    };
    (msg, rx)
}

/// A release of `lease` by the anonymous owner, answered on the receiver.
pub(super) fn release_for(
    shard_id: u64,
    resource: &ResourceName,
    lease: u8,
) -> (StoreMsg, oneshot::Receiver<ReplyResult>) {
    propose(
        shard_id,
        Command::Release {
            resource: resource.clone(),
            owner: Owner::anonymous(),
            lease_id: LeaseId([lease; 16]),
        },
    )
}

#[test]
fn a_cancel_for_a_gone_first_attempt_spares_the_retry_that_attached() {
    let mut world = World::new(StdRng::seed_from_u64(11), None);
    let config = World::bootstrap_config();
    let nodes: Vec<(u64, String)> = config.peer_map().into_iter().collect();
    let map = PlacementMap::bootstrap(
        &nodes,
        config.shard_count,
        config.replication_factor as usize,
    )
    .expect("bootstrap map");
    let resource = ResourceName::parse("sim/attempts").expect("valid");
    let shard_id = map.shard_of_slot(slot_of(&resource));
    // Every shard elects a leader and applies its LeaderChanged.
    run_for(&mut world, 3_000);
    let leader = *world
        .leaders()
        .get(&shard_id)
        .expect("the shard has a leader");
    assert!((1..=NODES).contains(&leader));

    let (msg, mut holder) = acquire(shard_id, &resource, "holder", 1, 0);
    world.step(leader, vec![msg], false);
    run_for(&mut world, 500);
    let held = holder.try_recv().expect("answered").expect("granted");
    assert!(
        matches!(held.status, AcquireStatus::Held { .. }),
        "{held:?}"
    );

    let (msg, first) = acquire(shard_id, &resource, "waiter", 2, 4_000);
    world.step(leader, vec![msg], false);
    run_for(&mut world, 500);
    // The first attempt's caller goes away while it waits; in the very step
    // that takes its retry, the leader's tick notices and queues the cancel.
    drop(first);
    let (msg, mut retry) = acquire(shard_id, &resource, "waiter", 3, 4_000);
    world.step(leader, vec![msg], true);
    run_for(&mut world, 500);
    assert!(
        retry.try_recv().is_err(),
        "the retry still waits (attached to the first attempt's place)"
    );

    let (release, mut released) = propose(
        shard_id,
        Command::Release {
            resource: resource.clone(),
            owner: Owner::anonymous(),
            lease_id: LeaseId([1; 16]),
        },
    );
    world.step(leader, vec![release], false);
    run_for(&mut world, 500);
    assert!(matches!(
        released.try_recv(),
        Ok(Ok(Reply::Released { released: true }))
    ));
    let granted = retry
        .try_recv()
        .expect("the retry was answered")
        .expect("the retry was granted, not cancelled");
    assert_eq!(granted.lease_id, LeaseId([2; 16]), "the original lease");
    assert!(matches!(granted.status, AcquireStatus::Held { .. }));
    // And the grant it was told of stands after the cancel applied.
    run_for(&mut world, 1_000);
    let (renew, mut renewed) = propose(
        shard_id,
        Command::Renew {
            resource: resource.clone(),
            owner: Owner::anonymous(),
            lease_id: LeaseId([2; 16]),
            lease_ttl_ms: 5_000,
        },
    );
    world.step(leader, vec![renew], false);
    run_for(&mut world, 500);
    assert!(
        matches!(renewed.try_recv(), Ok(Ok(Reply::Renewed(_)))),
        "the retry's lease still holds"
    );
}
