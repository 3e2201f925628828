//! Epoch and version discipline of the placement map: the counters' ends,
//! and random command sequences checked after every step (epochs strictly
//! increase and are unique, slots only move to a higher epoch, the version
//! counts successes, refusals change nothing, snapshots round-trip, a replay
//! is identical).

use std::collections::BTreeSet;

use fencelock_placement::*;
use proptest::prelude::*;

fn nodes(n: u64) -> Vec<(u64, String)> {
    (1..=n).map(|i| (i, format!("10.0.0.{i}:7000"))).collect()
}

fn set(ids: &[u64]) -> BTreeSet<u64> {
    ids.iter().copied().collect()
}

fn ok(map: &mut PlacementMap, cmd: PlacementCommand) -> PlacementReply {
    let before = map.version();
    let reply = map
        .apply(&cmd)
        .unwrap_or_else(|e| panic!("{cmd:?} refused: {e}"));
    assert_eq!(map.version(), before + 1, "{cmd:?}");
    reply
}

fn refused(map: &mut PlacementMap, cmd: PlacementCommand) -> PlacementError {
    let before = map.clone();
    let err = map.apply(&cmd).expect_err(&format!("{cmd:?} accepted"));
    assert_eq!(*map, before, "{cmd:?} changed the map");
    err
}

/// The snapshot with one big-endian `u64` field replaced.
fn patched(map: &PlacementMap, offset: usize, value: u64) -> PlacementMap {
    let mut bytes = map.snapshot();
    bytes[offset..offset + 8].copy_from_slice(&value.to_be_bytes());
    PlacementMap::restore(&bytes).unwrap()
}
// Layout: magic (4), format version (2), map version (8), factor (4), next epoch (8).
const VERSION_AT: usize = 6;
const NEXT_EPOCH_AT: usize = 18;

#[test]
fn the_last_epoch_that_fits_a_token_is_handed_out_and_then_refused() {
    let map = PlacementMap::bootstrap(&nodes(3), 2, 3).unwrap();
    let mut map = patched(&map, NEXT_EPOCH_AT, MAX_EPOCH);
    assert_eq!(
        ok(&mut map, PlacementCommand::AdvanceEpoch { shard_id: 1 }),
        PlacementReply::EpochAdvanced {
            shard_id: 1,
            epoch: MAX_EPOCH
        }
    );
    let exhausted = PlacementError::EpochsExhausted {
        max_epoch: MAX_EPOCH,
    };
    assert_eq!(
        refused(&mut map, PlacementCommand::AdvanceEpoch { shard_id: 2 }),
        exhausted
    );
    assert_eq!(
        refused(
            &mut map,
            PlacementCommand::CreateShard {
                replicas: set(&[1])
            }
        ),
        exhausted
    );
    assert_eq!(
        refused(
            &mut map,
            PlacementCommand::BeginMigration {
                from_shard: 2,
                to_shard: 1,
                slots: vec![600]
            }
        ),
        exhausted
    );
}

#[test]
fn an_exhausted_version_counter_refuses_instead_of_wrapping() {
    let map = PlacementMap::bootstrap(&nodes(3), 2, 3).unwrap();
    let mut map = patched(&map, VERSION_AT, u64::MAX);
    assert_eq!(
        refused(
            &mut map,
            PlacementCommand::AddNode {
                node_id: 9,
                addr: "x:1".into()
            }
        ),
        PlacementError::CounterExhausted { counter: "version" }
    );
}

#[test]
fn max_epoch_matches_the_fencing_token_layout() {
    assert_eq!(MAX_EPOCH, fencelock_statemachine::token::MAX_EPOCH);
}

// ----------------------------------------------------- random sequences

/// A command chosen relative to the current map, so that a fair share of
/// random commands are valid.
#[derive(Clone, Debug)]
enum Op {
    Raw(PlacementCommand),
    /// Migrate some of a data shard's own slots (shards and slots picked by
    /// index), optionally spoiled by one foreign slot.
    MigrateOwned {
        from: u8,
        to: u8,
        picks: Vec<u16>,
        spoil: bool,
    },
    /// The next step of taking a node out: record one of its replicas moved
    /// to `to` (or dropped), then mark it drained, then remove it.
    Decommission {
        node: u64,
        to: u64,
    },
    /// Split a data shard (picked by index) at some of its own slots.
    SplitOwned {
        from: u8,
        picks: Vec<u16>,
    },
    CommitCurrent,
    AbortCurrent,
    RollBackCurrent,
}

fn state() -> impl Strategy<Value = NodeState> {
    prop_oneof![
        Just(NodeState::Up),
        Just(NodeState::Draining),
        Just(NodeState::Drained),
        Just(NodeState::Down)
    ]
}

fn replicas() -> impl Strategy<Value = BTreeSet<u64>> {
    proptest::collection::btree_set(0u64..=7, 0..=4)
}

fn op() -> impl Strategy<Value = Op> {
    use PlacementCommand::*;
    prop_oneof![
        1 => (0u64..=7, 0u8..6).prop_map(|(node_id, a)| Op::Raw(AddNode { node_id, addr: format!("n{a}:1") })),
        1 => (1u64..=7).prop_map(|node_id| Op::Raw(RemoveNode { node_id })),
        1 => (1u64..=7, state()).prop_map(|(node_id, state)| Op::Raw(SetNodeState { node_id, state })),
        1 => (0u64..=7, replicas()).prop_map(|(shard_id, replicas)| Op::Raw(SetReplicas { shard_id, replicas })),
        1 => replicas().prop_map(|replicas| Op::Raw(CreateShard { replicas })),
        1 => (0u64..=7).prop_map(|shard_id| Op::Raw(AdvanceEpoch { shard_id })),
        1 => (0u64..=4).prop_map(|migration_id| Op::Raw(CommitMigration { migration_id })),
        1 => (0u64..=7, 0u64..=7, proptest::collection::vec(0u32..40, 0..4))
            .prop_map(|(from_shard, to_shard, slots)| Op::Raw(BeginMigration { from_shard, to_shard, slots })),
        3 => (any::<u8>(), any::<u8>(), proptest::collection::vec(any::<u16>(), 1..6), proptest::bool::weighted(0.2))
            .prop_map(|(from, to, picks, spoil)| Op::MigrateOwned { from, to, picks, spoil }),
        1 => (any::<u8>(), proptest::collection::vec(any::<u16>(), 1..6))
            .prop_map(|(from, picks)| Op::SplitOwned { from, picks }),
        3 => Just(Op::CommitCurrent),
        1 => Just(Op::AbortCurrent),
        1 => Just(Op::RollBackCurrent),
        3 => (1u64..=7, 0u64..=7).prop_map(|(node, to)| Op::Decommission { node, to }),
    ]
}

fn resolve(map: &PlacementMap, op: &Op) -> PlacementCommand {
    match op {
        Op::Raw(cmd) => cmd.clone(),
        Op::MigrateOwned {
            from,
            to,
            picks,
            spoil,
        } => {
            let data: Vec<u64> = map
                .shards()
                .map(|s| s.shard_id)
                .filter(|&s| s != META_SHARD_ID)
                .collect();
            let (from, to) = (
                &data[*from as usize % data.len()],
                &data[*to as usize % data.len()],
            );
            let owned = map.slots_of(*from);
            let mut slots: Vec<u32> = if owned.is_empty() {
                vec![0]
            } else {
                picks
                    .iter()
                    .map(|&p| owned[p as usize % owned.len()])
                    .collect()
            };
            if *spoil {
                slots.push((slots[0] + 1) % SLOT_COUNT);
            }
            slots.sort_unstable();
            slots.dedup();
            PlacementCommand::BeginMigration {
                from_shard: *from,
                to_shard: *to,
                slots,
            }
        }
        Op::Decommission { node, to } => {
            let held = map.shards_on_node(*node);
            if let Some(&shard_id) = held.first() {
                let mut replicas = map.shard(shard_id).unwrap().replicas.clone();
                replicas.remove(node);
                if *to != 0 {
                    replicas.insert(*to);
                }
                PlacementCommand::SetReplicas { shard_id, replicas }
            } else if map
                .node(*node)
                .is_some_and(|n| n.state != NodeState::Drained)
            {
                PlacementCommand::SetNodeState {
                    node_id: *node,
                    state: NodeState::Drained,
                }
            } else {
                PlacementCommand::RemoveNode { node_id: *node }
            }
        }
        Op::CommitCurrent => PlacementCommand::CommitMigration {
            migration_id: map.migration().map_or(1, |m| m.id),
        },
        Op::AbortCurrent => PlacementCommand::AbortMigration {
            migration_id: map.migration().map_or(1, |m| m.id),
        },
        Op::RollBackCurrent => PlacementCommand::RollBackMigration {
            migration_id: map.migration().map_or(1, |m| m.id),
        },
        Op::SplitOwned { from, picks } => {
            let data: Vec<u64> = map
                .shards()
                .map(|s| s.shard_id)
                .filter(|&s| s != META_SHARD_ID)
                .collect();
            let from = data[*from as usize % data.len()];
            let owned = map.slots_of(from);
            let mut slots: Vec<u32> = if owned.is_empty() {
                vec![0]
            } else {
                picks
                    .iter()
                    .map(|&p| owned[p as usize % owned.len()])
                    .collect()
            };
            slots.sort_unstable();
            slots.dedup();
            PlacementCommand::BeginSplit {
                from_shard: from,
                slots,
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// Epochs strictly increase and are unique, slots only ever move to a
    /// shard at a higher epoch, the version counts successes, refusals
    /// change nothing, snapshots round-trip, and a replay is identical.
    #[test]
    fn random_command_sequences_keep_epochs_and_versions_sound(
        shard_count in 1u32..=4,
        ops in proptest::collection::vec(op(), 1..150),
    ) {
        let start = PlacementMap::bootstrap(&nodes(3), shard_count, 3).unwrap();
        let mut map = start.clone();
        let mut log = Vec::new();
        // Every epoch ever handed out or held, to check uniqueness.
        let mut seen_epochs: BTreeSet<u64> = map.shards().map(|s| s.epoch).collect();
        for op in &ops {
            let cmd = resolve(&map, op);
            prop_assert_eq!(PlacementCommand::decode(&cmd.encode()), Ok(cmd.clone()));
            let before = map.clone();
            match map.apply(&cmd) {
                Err(_) => prop_assert_eq!(&map, &before),
                Ok(reply) => {
                    log.push(cmd.clone());
                    prop_assert_eq!(map.version(), before.version() + 1);
                    if let Some(epoch) = reply.new_epoch() {
                        prop_assert!(epoch > *seen_epochs.last().unwrap(), "{:?} reused an epoch", reply);
                        seen_epochs.insert(epoch);
                    }
                    prop_assert!(map.next_epoch() > *seen_epochs.last().unwrap());
                    for shard in before.shards() {
                        let after = map.shard(shard.shard_id).unwrap();
                        prop_assert!(after.epoch >= shard.epoch, "shard {} epoch fell", shard.shard_id);
                    }
                    for slot in 0..SLOT_COUNT {
                        let (old, new) = (before.shard_of_slot(slot), map.shard_of_slot(slot));
                        if old != new {
                            let new_epoch = map.shard(new).unwrap().epoch;
                            prop_assert!(new_epoch > before.shard(old).unwrap().epoch);
                            prop_assert!(new_epoch > before.shard(new).unwrap().epoch);
                        }
                    }
                }
            }
            prop_assert_eq!(map.check_invariants(), Ok(()));
            let bytes = map.snapshot();
            let restored = PlacementMap::restore(&bytes).unwrap();
            prop_assert_eq!(&restored, &map);
            prop_assert_eq!(restored.snapshot(), bytes);
        }
        let mut replica = start;
        for cmd in &log {
            replica.apply(cmd).unwrap();
        }
        prop_assert_eq!(replica.snapshot(), map.snapshot());
    }
}

#[test]
fn a_raised_floor_puts_every_later_epoch_above_it_and_is_refused_without_room() {
    let mut map = PlacementMap::bootstrap(&nodes(3), 2, 3).unwrap();
    let before: Vec<u64> = map.shards().map(|s| s.epoch).collect();
    ok(
        &mut map,
        PlacementCommand::RaiseEpochFloor { above_epoch: 5_000 },
    );
    // No shard changed its epoch; the next hand-out is above the floor.
    assert_eq!(map.shards().map(|s| s.epoch).collect::<Vec<_>>(), before);
    let PlacementReply::EpochAdvanced { epoch, .. } =
        ok(&mut map, PlacementCommand::AdvanceEpoch { shard_id: 1 })
    else {
        panic!("an epoch");
    };
    assert_eq!(epoch, 5_001);
    // A lower floor changes nothing further.
    ok(
        &mut map,
        PlacementCommand::RaiseEpochFloor { above_epoch: 10 },
    );
    let PlacementReply::EpochAdvanced { epoch, .. } =
        ok(&mut map, PlacementCommand::AdvanceEpoch { shard_id: 2 })
    else {
        panic!("an epoch");
    };
    assert_eq!(epoch, 5_002);
    // Two data shards need two epochs above the floor.
    assert!(matches!(
        refused(
            &mut map,
            PlacementCommand::RaiseEpochFloor {
                above_epoch: MAX_EPOCH - 1
            }
        ),
        PlacementError::EpochsExhausted { .. }
    ));
    ok(
        &mut map,
        PlacementCommand::RaiseEpochFloor {
            above_epoch: MAX_EPOCH - 2,
        },
    );
    // Not while a migration is open: its epoch lies below the floor.
    let mut moving = PlacementMap::bootstrap(&nodes(3), 2, 3).unwrap();
    let slot = moving.slots_of(1).first().copied().unwrap();
    ok(
        &mut moving,
        PlacementCommand::BeginMigration {
            from_shard: 1,
            to_shard: 2,
            slots: vec![slot],
        },
    );
    assert!(matches!(
        refused(
            &mut moving,
            PlacementCommand::RaiseEpochFloor { above_epoch: 100 }
        ),
        PlacementError::MigrationInProgress { .. }
    ));
}
