//! Acquires whose callers are gone must not leave a lease nobody holds
//! (docs/safety.md, "Waiting"). Three interleavings, forced step by step
//! on the real stores, each of which used to leave the lock held by nobody
//! for the orphan's full TTL:
//!
//! * a waiter's caller leaves in the step that moves leadership away: the
//!   old leader never proposes the cancel, and the new one knows no caller;
//! * a waiter's caller leaves just before the waiter's turn comes, and the
//!   grant applies before the leader's next tick notices;
//! * a waiter moves with a migration and its caller does not follow it to
//!   the target shard.
//!
//! In each, a third caller queued behind the orphan must get the lock
//! within a few seconds, far sooner than the orphan's 20 s lease would end.

use fencelock_multiraft::{AcquireResult, Responder, StoreMsg};
use fencelock_placement::PlacementMap;
use fencelock_statemachine::{
    slot_of, AcquireStatus, Command, LeaseId, Owner, Reply, RequestId, ResourceName, SlotSet,
};
use rand::rngs::StdRng;
use rand::SeedableRng;
use tokio::sync::oneshot;

use super::attempts::{propose, release_for};
use super::world::{Ev, World};

/// The orphan's lease: long enough that waiting it out fails the tests.
const ORPHAN_TTL_MS: u64 = 20_000;
/// How long the caller queued behind the orphan may wait for the lock:
/// the proposal timeout (2 s in the simulation's config), one sweep
/// interval and slack.
const THIRD_WAITS_MS: u64 = 4_000;

/// Runs the world's own events for `ms` simulated ms. Ticks of `hold` are
/// not run; the first one held is returned, to resume with
/// [`World::tick`].
fn drive(world: &mut World, ms: u64, hold: Option<u64>) -> Option<(u64, u64)> {
    let end = world.now_ms + ms;
    let mut held = None;
    while world.peek_time().is_some_and(|at| at <= end) {
        match world.pop() {
            Some(Ev::Deliver {
                from,
                to,
                envelopes,
            }) => world.deliver(from, to, envelopes),
            Some(Ev::Tick { node, generation }) if hold == Some(node) => {
                held.get_or_insert((node, generation));
            }
            Some(Ev::Tick { node, generation }) => world.tick(node, generation),
            Some(Ev::Restart { node }) => world.start(node),
            Some(Ev::Heal { links }) => world.heal(links),
            Some(Ev::WriteLands { node, generation }) => world.land_write(node, generation),
            Some(Ev::Request { node, msg }) => world.step(node, vec![*msg], false),
            Some(Ev::ClientWake { .. } | Ev::Nemesis | Ev::HealAll) | None => {}
        }
    }
    held
}

fn acquire(
    shard_id: u64,
    resource: &ResourceName,
    request_id: &str,
    lease: u8,
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
            lease_ttl_ms: ORPHAN_TTL_MS,
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

fn release(shard_id: u64, resource: &ResourceName, lease: u8) -> StoreMsg {
    release_for(shard_id, resource, lease).0
}

fn is_held(answer: &AcquireResult) -> bool {
    matches!(answer, Ok(a) if matches!(a.status, AcquireStatus::Held { .. }))
}

/// A world whose shards all lead, and the bootstrap map.
fn world(seed: u64) -> (World, PlacementMap) {
    let mut world = World::new(StdRng::seed_from_u64(seed), None);
    let config = World::bootstrap_config();
    let nodes: Vec<(u64, String)> = config.peer_map().into_iter().collect();
    let map = PlacementMap::bootstrap(
        &nodes,
        config.shard_count,
        config.replication_factor as usize,
    )
    .expect("bootstrap map");
    drive(&mut world, 3_000, None);
    (world, map)
}

fn leader_of(world: &World, shard_id: u64) -> u64 {
    *world
        .leaders()
        .get(&shard_id)
        .unwrap_or_else(|| panic!("shard {shard_id} has a ready leader"))
}

/// `holder` (lease 1) holds `resource` and `waiter` (lease 2) waits for it,
/// both on `node`; returns the waiter's answer channel.
fn held_and_queued(
    world: &mut World,
    node: u64,
    shard_id: u64,
    resource: &ResourceName,
) -> oneshot::Receiver<AcquireResult> {
    let (msg, mut holder) = acquire(shard_id, resource, "holder", 1, 0);
    world.step(node, vec![msg], false);
    drive(world, 300, None);
    let held = holder.try_recv().expect("the holder was answered");
    assert!(is_held(&held), "{held:?}");
    let (msg, mut waiter) = acquire(shard_id, resource, "waiter", 2, 15_000);
    world.step(node, vec![msg], false);
    drive(world, 300, None);
    assert!(waiter.try_recv().is_err(), "the waiter waits");
    waiter
}

/// The third caller queues behind the orphan on `node` and must be granted
/// well before the orphan's lease would end by itself.
fn third_caller_gets_the_lock(
    world: &mut World,
    node: u64,
    shard_id: u64,
    resource: &ResourceName,
) {
    let (msg, mut third) = acquire(shard_id, resource, "third", 3, 10_000);
    world.step(node, vec![msg], false);
    drive(world, THIRD_WAITS_MS, None);
    let answer = third.try_recv();
    assert!(
        matches!(&answer, Ok(a) if is_held(a)),
        "the caller behind the orphan was not granted within {THIRD_WAITS_MS} ms: {answer:?}"
    );
    let granted = answer.expect("checked").expect("checked");
    assert_eq!(granted.lease_id, LeaseId([3; 16]));
}

#[test]
fn a_waiter_whose_caller_left_as_leadership_moved_is_cancelled_by_the_next_leader() {
    let (mut world, map) = world(21);
    let resource = ResourceName::parse("sim/orphan/leader-change").expect("valid");
    let shard_id = map.shard_of_slot(slot_of(&resource));
    let old = leader_of(&world, shard_id);
    let waiter = held_and_queued(&mut world, old, shard_id, &resource);

    // The waiter's caller leaves, and in the same step (before any tick
    // could notice) the leader hands its leadership away.
    drop(waiter);
    let to = old % 3 + 1;
    let (tx, _rx) = oneshot::channel();
    world.step(
        old,
        vec![StoreMsg::TransferLeader { shard_id, to, tx }],
        false,
    );
    drive(&mut world, 500, None);
    let new = leader_of(&world, shard_id);
    assert_ne!(new, old, "leadership moved");

    // The holder leaves at once: the orphan's turn comes before any sweep
    // could cancel it as a waiter, so the new leader must end its lease.
    world.step(new, vec![release(shard_id, &resource, 1)], false);
    drive(&mut world, 100, None);
    third_caller_gets_the_lock(&mut world, new, shard_id, &resource);
}

#[test]
fn a_grant_whose_waiter_just_left_is_cancelled() {
    let (mut world, map) = world(22);
    let resource = ResourceName::parse("sim/orphan/grant").expect("valid");
    let shard_id = map.shard_of_slot(slot_of(&resource));
    let leader = leader_of(&world, shard_id);
    let waiter = held_and_queued(&mut world, leader, shard_id, &resource);

    // The waiter's caller leaves; the holder's release applies before the
    // leader's next tick (held back here) can notice and cancel the wait.
    drop(waiter);
    world.step(leader, vec![release(shard_id, &resource, 1)], false);
    let held = drive(&mut world, 40, Some(leader));
    if let Some((node, generation)) = held {
        world.tick(node, generation);
    }
    third_caller_gets_the_lock(&mut world, leader, shard_id, &resource);
}

#[test]
fn a_waiter_moved_by_a_migration_without_its_caller_is_cancelled_on_the_target() {
    let (mut world, map) = world(23);
    let resource = ResourceName::parse("sim/orphan/migration").expect("valid");
    let slot = slot_of(&resource);
    let source = map.shard_of_slot(slot);
    let target = (1..=3).find(|s| *s != source).expect("three data shards");
    let source_leader = leader_of(&world, source);
    let mut waiter = held_and_queued(&mut world, source_leader, source, &resource);

    // The slot moves (the steps `reshard move` proposes, driven directly):
    // the waiter's caller is told to go to the new owner and does not.
    let slots: SlotSet = [slot].into_iter().collect();
    let (msg, mut exported) = propose(
        source,
        Command::ExportSlots {
            migration_id: 1,
            slots,
        },
    );
    world.step(source_leader, vec![msg], false);
    drive(&mut world, 300, None);
    let (data, export_clock_ms) = match exported.try_recv() {
        Ok(Ok(Reply::Exported {
            data,
            resources,
            clock_ms,
        })) => {
            assert_eq!(resources, 1);
            (data, clock_ms)
        }
        other => panic!("export: {other:?}"),
    };
    assert!(
        matches!(waiter.try_recv(), Ok(Err(_))),
        "the waiter's caller was sent to the new owner"
    );
    drop(waiter);
    let target_leader = leader_of(&world, target);
    let (msg, mut imported) = propose(
        target,
        Command::ImportSlots {
            migration_id: 1,
            // Above every bootstrap epoch (the map hands out 1..=4 first).
            epoch: 100,
            slots,
            data,
            clock_offset_allowance_ms: 0,
            export_clock_ms: Some(export_clock_ms),
        },
    );
    world.step(target_leader, vec![msg], false);
    drive(&mut world, 300, None);
    assert!(
        matches!(
            imported.try_recv(),
            Ok(Ok(Reply::Imported { resources: 1 }))
        ),
        "the target imported the slot"
    );

    // The holder (whose lease moved with it) leaves on the target.
    let (msg, mut released) = propose(
        target,
        Command::Release {
            resource: resource.clone(),
            owner: Owner::anonymous(),
            lease_id: LeaseId([1; 16]),
        },
    );
    world.step(target_leader, vec![msg], false);
    drive(&mut world, 100, None);
    assert!(matches!(
        released.try_recv(),
        Ok(Ok(Reply::Released { released: true }))
    ));
    third_caller_gets_the_lock(&mut world, target_leader, target, &resource);
}

/// The chaos run that found it (windows checker: two holders): a client's
/// acquire and its retry by request id both reached the leader; the first
/// applied created the grant and was answered, the second applied as a
/// deduplicated answer for a caller already gone. Its failed delivery must
/// not cancel the lease: the original's caller was told it holds it.
#[test]
fn an_undelivered_duplicate_answer_never_ends_a_lease_its_original_was_told_of() {
    let (mut world, map) = world(24);
    let resource = ResourceName::parse("sim/orphan/duplicate").expect("valid");
    let shard_id = map.shard_of_slot(slot_of(&resource));
    let leader = leader_of(&world, shard_id);
    let (first, mut told) = acquire(shard_id, &resource, "dup", 1, 0);
    let (retry, gone) = acquire(shard_id, &resource, "dup", 2, 0);
    drop(gone);
    world.step(leader, vec![first, retry], false);
    drive(&mut world, 4_000, None);
    let answer = told.try_recv().expect("the original is answered");
    assert!(is_held(&answer), "{answer:?}");
    assert!(!answer.as_ref().expect("held").deduplicated);
    // The lease still holds: a different request is refused.
    let (other, mut refused) = acquire(shard_id, &resource, "other", 3, 0);
    world.step(leader, vec![other], false);
    drive(&mut world, 1_000, None);
    let other = refused.try_recv().expect("answered");
    assert!(
        matches!(&other, Err(e) if format!("{e:?}").contains("LockHeld")),
        "the told holder's lease was ended: {other:?}"
    );
}
