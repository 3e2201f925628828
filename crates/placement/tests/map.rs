//! The placement map: bootstrap layout and the rules of each command,
//! including that a refused command changes nothing. Counter ends and random
//! command sequences are in `map_epochs.rs`.

use std::collections::{BTreeMap, BTreeSet};

use fencelock_placement::*;

fn nodes(n: u64) -> Vec<(u64, String)> {
    (1..=n).map(|i| (i, format!("10.0.0.{i}:7000"))).collect()
}

fn set(ids: &[u64]) -> BTreeSet<u64> {
    ids.iter().copied().collect()
}

/// Applies a command that must succeed, checking the version rule.
fn ok(map: &mut PlacementMap, cmd: PlacementCommand) -> PlacementReply {
    let before = map.version();
    let reply = map
        .apply(&cmd)
        .unwrap_or_else(|e| panic!("{cmd:?} refused: {e}"));
    assert_eq!(map.version(), before + 1, "{cmd:?}");
    reply
}

/// Applies a command that must be refused, checking that nothing changed.
fn refused(map: &mut PlacementMap, cmd: PlacementCommand) -> PlacementError {
    let before = map.clone();
    let bytes = map.snapshot();
    let err = map.apply(&cmd).expect_err(&format!("{cmd:?} accepted"));
    assert_eq!(*map, before, "{cmd:?} changed the map");
    assert_eq!(map.snapshot(), bytes);
    err
}

#[test]
fn bootstrap_cuts_the_slots_into_one_contiguous_range_per_shard() {
    for shard_count in [1u32, 2, 3, 7, 8, 64, 1000, MAX_BOOTSTRAP_SHARDS] {
        let map = PlacementMap::bootstrap(&nodes(3), shard_count, 3).unwrap();
        for slot in 0..SLOT_COUNT {
            assert_eq!(
                map.shard_of_slot(slot),
                u64::from(slot) * u64::from(shard_count) / 1024 + 1
            );
        }
        for shard in 1..=u64::from(shard_count) {
            assert_eq!(
                map.slot_ranges_of(shard).len(),
                1,
                "shard {shard} of {shard_count}"
            );
        }
        let mut all: Vec<u32> = (1..=u64::from(shard_count))
            .flat_map(|s| map.slots_of(s))
            .collect();
        all.sort_unstable();
        assert_eq!(all, (0..SLOT_COUNT).collect::<Vec<_>>());
        assert!(map.slots_of(META_SHARD_ID).is_empty());
        assert_eq!(map.shard(META_SHARD_ID).unwrap().epoch, 0);
        for shard in 1..=u64::from(shard_count) {
            assert_eq!(map.shard(shard).unwrap().epoch, shard);
        }
        assert_eq!(map.shards().count(), shard_count as usize + 1);
        assert_eq!(map.next_epoch(), u64::from(shard_count) + 1);
        assert_eq!(map.next_shard_id(), u64::from(shard_count) + 1);
        assert_eq!(map.version(), 1);
        assert!(map.migration().is_none());
        assert_eq!(map.check_invariants(), Ok(()));
    }
}

#[test]
fn bootstrap_with_three_nodes_and_factor_three_puts_every_shard_on_every_node() {
    let map = PlacementMap::bootstrap(&nodes(3), 8, 3).unwrap();
    assert!(map.shards().all(|s| s.replicas == set(&[1, 2, 3])));
    assert!(map.nodes().all(|n| n.state == NodeState::Up));
    assert_eq!(map.replication_factor(), 3);
}

#[test]
fn bootstrap_rotates_replicas_so_nodes_hold_equal_shares() {
    let map = PlacementMap::bootstrap(&nodes(5), 9, 3).unwrap();
    let mut per_node: BTreeMap<u64, usize> = BTreeMap::new();
    for shard in map.shards() {
        assert_eq!(shard.replicas.len(), 3);
        for &n in &shard.replicas {
            *per_node.entry(n).or_default() += 1;
        }
    }
    // 10 shards x 3 replicas over 5 nodes.
    assert!(per_node.values().all(|&c| c == 6), "{per_node:?}");
    // Fewer nodes than the factor: every shard on every node.
    let small = PlacementMap::bootstrap(&nodes(2), 4, 3).unwrap();
    assert!(small.shards().all(|s| s.replicas == set(&[1, 2])));
    // Same input, same map.
    assert_eq!(
        PlacementMap::bootstrap(&nodes(5), 9, 3).unwrap().snapshot(),
        map.snapshot()
    );
}

#[test]
fn bootstrap_refuses_impossible_clusters() {
    let e = |nodes: &[(u64, String)], shards, rf| {
        PlacementMap::bootstrap(nodes, shards, rf).unwrap_err()
    };
    assert_eq!(e(&[], 4, 3), PlacementError::NoNodes);
    assert!(matches!(
        e(&nodes(3), 0, 3),
        PlacementError::InvalidShardCount { .. }
    ));
    assert!(matches!(
        e(&nodes(3), MAX_BOOTSTRAP_SHARDS + 1, 3),
        PlacementError::InvalidShardCount { .. }
    ));
    assert!(matches!(
        e(&nodes(3), 4, 0),
        PlacementError::InvalidReplicationFactor { .. }
    ));
    assert!(matches!(
        e(&nodes(3), 4, MAX_REPLICATION_FACTOR + 1),
        PlacementError::InvalidReplicationFactor { .. }
    ));
    let mut dup = nodes(3);
    dup.push((2, "other:1".into()));
    assert_eq!(e(&dup, 4, 3), PlacementError::DuplicateNode { node_id: 2 });
    let mut dup_addr = nodes(3);
    dup_addr.push((9, "10.0.0.1:7000".into()));
    assert_eq!(
        e(&dup_addr, 4, 3),
        PlacementError::DuplicateAddr { owner: 1 }
    );
    assert_eq!(
        e(&[(0, "a:1".into())], 4, 3),
        PlacementError::InvalidNodeId { node_id: 0 }
    );
    assert!(matches!(
        e(&[(1, String::new())], 4, 3),
        PlacementError::InvalidAddr { .. }
    ));
    assert_eq!(
        e(&nodes(MAX_NODES as u64 + 1), 4, 3),
        PlacementError::TooManyNodes { limit: MAX_NODES }
    );
}

#[test]
fn slot_ranges_are_maximal_inclusive_runs() {
    let one = PlacementMap::bootstrap(&nodes(3), 1, 3).unwrap();
    assert_eq!(one.slot_ranges_of(1), vec![(0, SLOT_COUNT - 1)]);
    let mut map = PlacementMap::bootstrap(&nodes(3), 2, 3).unwrap();
    assert_eq!(map.slot_ranges_of(1), vec![(0, 511)]);
    assert_eq!(map.slot_ranges_of(2), vec![(512, 1023)]);
    // Give shard 1 the slots 513 and 515: it then owns two runs, 0..=511
    // plus 513 and 515 alone; shard 2 keeps 512, 514 and 516..=1023.
    let m = match ok(
        &mut map,
        PlacementCommand::BeginMigration {
            from_shard: 2,
            to_shard: 1,
            slots: vec![513, 515],
        },
    ) {
        PlacementReply::MigrationBegun { migration_id, .. } => migration_id,
        other => panic!("{other:?}"),
    };
    ok(
        &mut map,
        PlacementCommand::CommitMigration { migration_id: m },
    );
    assert_eq!(
        map.slot_ranges_of(1),
        vec![(0, 511), (513, 513), (515, 515)]
    );
    assert_eq!(
        map.slot_ranges_of(2),
        vec![(512, 512), (514, 514), (516, 1023)]
    );
}

#[test]
fn committed_migration_moves_slots_and_gives_the_target_a_fresh_epoch() {
    let mut map = PlacementMap::bootstrap(&nodes(3), 2, 3).unwrap();
    let created = ok(
        &mut map,
        PlacementCommand::CreateShard {
            replicas: set(&[1, 2, 3]),
        },
    );
    assert_eq!(
        created,
        PlacementReply::ShardCreated {
            shard_id: 3,
            epoch: 3
        }
    );
    assert!(map.slots_of(3).is_empty());
    let begun = ok(
        &mut map,
        PlacementCommand::BeginMigration {
            from_shard: 1,
            to_shard: 3,
            slots: vec![0, 2, 4],
        },
    );
    assert_eq!(
        begun,
        PlacementReply::MigrationBegun {
            migration_id: 1,
            epoch: 4
        }
    );
    // Routing changes only on commit.
    assert_eq!(map.shard_of_slot(2), 1);
    assert_eq!(map.shard(3).unwrap().epoch, 3);
    let committed = ok(
        &mut map,
        PlacementCommand::CommitMigration { migration_id: 1 },
    );
    assert_eq!(
        committed,
        PlacementReply::MigrationCommitted {
            migration_id: 1,
            to_shard: 3,
            epoch: 4
        }
    );
    assert_eq!(map.slots_of(3), vec![0, 2, 4]);
    assert_eq!(map.shard(3).unwrap().epoch, 4);
    assert!(map.shard(3).unwrap().epoch > map.shard(1).unwrap().epoch);
    assert_eq!(map.next_epoch(), 5);
    assert!(map.migration().is_none());
}

#[test]
fn aborted_migration_keeps_the_slots_and_never_reuses_its_epoch() {
    let mut map = PlacementMap::bootstrap(&nodes(3), 2, 3).unwrap();
    ok(
        &mut map,
        PlacementCommand::BeginMigration {
            from_shard: 1,
            to_shard: 2,
            slots: vec![0],
        },
    );
    let aborted = ok(
        &mut map,
        PlacementCommand::AbortMigration { migration_id: 1 },
    );
    assert_eq!(
        aborted,
        PlacementReply::MigrationAborted { migration_id: 1 }
    );
    assert_eq!(map.shard_of_slot(0), 1);
    assert_eq!(map.shard(2).unwrap().epoch, 2);
    let again = ok(
        &mut map,
        PlacementCommand::BeginMigration {
            from_shard: 1,
            to_shard: 2,
            slots: vec![0],
        },
    );
    assert_eq!(
        again,
        PlacementReply::MigrationBegun {
            migration_id: 2,
            epoch: 4
        }
    );
}

/// A roll-back: the source took its export back at the migration's epoch,
/// so the slots stay and the source's epoch becomes the migration's (which
/// nobody else ever holds).
#[test]
fn rolled_back_migration_keeps_the_slots_at_the_migration_epoch() {
    let mut map = PlacementMap::bootstrap(&nodes(3), 2, 3).unwrap();
    ok(
        &mut map,
        PlacementCommand::BeginMigration {
            from_shard: 1,
            to_shard: 2,
            slots: vec![0],
        },
    );
    let rolled = ok(
        &mut map,
        PlacementCommand::RollBackMigration { migration_id: 1 },
    );
    assert_eq!(
        rolled,
        PlacementReply::MigrationRolledBack {
            migration_id: 1,
            from_shard: 1,
            epoch: 3
        }
    );
    assert!(map.migration().is_none());
    assert_eq!(map.shard_of_slot(0), 1);
    assert_eq!(map.shard(1).unwrap().epoch, 3);
    assert_eq!(map.shard(2).unwrap().epoch, 2);
    assert_eq!(
        refused(
            &mut map,
            PlacementCommand::RollBackMigration { migration_id: 1 }
        ),
        PlacementError::NoSuchMigration {
            migration_id: 1,
            current: None
        }
    );
}

/// A split is one decision: the new shard exists only together with the
/// open migration to it, which names it as new.
#[test]
fn a_split_creates_its_shard_and_opens_the_migration_in_one_command() {
    let mut map = PlacementMap::bootstrap(&nodes(3), 2, 3).unwrap();
    let begun = ok(
        &mut map,
        PlacementCommand::BeginSplit {
            from_shard: 1,
            slots: vec![10, 11],
        },
    );
    assert_eq!(
        begun,
        PlacementReply::SplitBegun {
            shard_id: 3,
            migration_id: 1,
            epoch: 4
        }
    );
    let shard = map.shard(3).unwrap();
    assert_eq!(shard.epoch, 3);
    assert_eq!(shard.replicas, map.shard(1).unwrap().replicas);
    let m = map.migration().unwrap();
    assert!(m.new_shard);
    assert_eq!((m.from_shard, m.to_shard, m.epoch), (1, 3, 4));
    // Refused as a whole: nothing is created while a migration is open.
    let before = map.clone();
    assert_eq!(
        refused(
            &mut map,
            PlacementCommand::BeginSplit {
                from_shard: 2,
                slots: vec![600],
            }
        ),
        PlacementError::MigrationInProgress { migration_id: 1 }
    );
    assert_eq!(map, before);
    ok(
        &mut map,
        PlacementCommand::CommitMigration { migration_id: 1 },
    );
    assert_eq!(map.slots_of(3), vec![10, 11]);
    assert_eq!(map.shard(3).unwrap().epoch, 4);
    // Slots the source does not own refuse the whole split.
    let before = map.clone();
    assert!(matches!(
        refused(
            &mut map,
            PlacementCommand::BeginSplit {
                from_shard: 1,
                slots: vec![10],
            }
        ),
        PlacementError::SlotNotOwned { slot: 10, owner: 3 }
    ));
    assert_eq!(map, before);
    let bytes = map.snapshot();
    assert_eq!(PlacementMap::restore(&bytes).unwrap(), map);
}

#[test]
fn one_migration_at_a_time_and_its_shards_keep_their_epochs() {
    let mut map = PlacementMap::bootstrap(&nodes(3), 3, 3).unwrap();
    ok(
        &mut map,
        PlacementCommand::BeginMigration {
            from_shard: 1,
            to_shard: 2,
            slots: vec![0],
        },
    );
    let busy = PlacementError::MigrationInProgress { migration_id: 1 };
    let second = PlacementCommand::BeginMigration {
        from_shard: 3,
        to_shard: 2,
        slots: vec![2],
    };
    assert_eq!(refused(&mut map, second), busy);
    assert_eq!(
        refused(&mut map, PlacementCommand::AdvanceEpoch { shard_id: 1 }),
        busy
    );
    assert_eq!(
        refused(&mut map, PlacementCommand::AdvanceEpoch { shard_id: 2 }),
        busy
    );
    assert_eq!(
        ok(&mut map, PlacementCommand::AdvanceEpoch { shard_id: 3 }),
        PlacementReply::EpochAdvanced {
            shard_id: 3,
            epoch: 5
        }
    );
    assert_eq!(
        refused(
            &mut map,
            PlacementCommand::CommitMigration { migration_id: 7 }
        ),
        PlacementError::NoSuchMigration {
            migration_id: 7,
            current: Some(1)
        }
    );
}

#[test]
fn a_node_is_drained_only_when_empty_and_removed_only_when_drained() {
    let mut map = PlacementMap::bootstrap(&nodes(4), 4, 3).unwrap();
    ok(
        &mut map,
        PlacementCommand::SetNodeState {
            node_id: 4,
            state: NodeState::Draining,
        },
    );
    let held = map.shards_on_node(4);
    assert!(!held.is_empty());
    assert_eq!(
        refused(
            &mut map,
            PlacementCommand::SetNodeState {
                node_id: 4,
                state: NodeState::Drained
            }
        ),
        PlacementError::NodeHoldsReplicas {
            node_id: 4,
            shard_id: held[0],
            count: held.len()
        }
    );
    assert_eq!(
        refused(&mut map, PlacementCommand::RemoveNode { node_id: 4 }),
        PlacementError::NodeNotDrained {
            node_id: 4,
            state: NodeState::Draining
        }
    );
    // A draining node receives no new shard.
    assert!(matches!(
        refused(
            &mut map,
            PlacementCommand::CreateShard {
                replicas: set(&[1, 4])
            }
        ),
        PlacementError::NodeNotUp { node_id: 4, .. }
    ));
    for shard_id in held {
        let replicas: BTreeSet<u64> = map
            .shard(shard_id)
            .unwrap()
            .replicas
            .iter()
            .copied()
            .filter(|&n| n != 4)
            .collect();
        ok(
            &mut map,
            PlacementCommand::SetReplicas { shard_id, replicas },
        );
    }
    ok(
        &mut map,
        PlacementCommand::SetNodeState {
            node_id: 4,
            state: NodeState::Drained,
        },
    );
    assert!(matches!(
        refused(
            &mut map,
            PlacementCommand::SetReplicas {
                shard_id: 1,
                replicas: set(&[1, 4])
            }
        ),
        PlacementError::NodeNotUp {
            node_id: 4,
            state: NodeState::Drained
        }
    ));
    assert_eq!(
        ok(&mut map, PlacementCommand::RemoveNode { node_id: 4 }),
        PlacementReply::NodeRemoved
    );
    assert!(map.node(4).is_none());
    // Its address is free again.
    ok(
        &mut map,
        PlacementCommand::AddNode {
            node_id: 5,
            addr: "10.0.0.4:7000".into(),
        },
    );
}

#[test]
fn refused_commands_change_nothing() {
    use PlacementCommand::*;
    let mut map = PlacementMap::bootstrap(&nodes(3), 2, 3).unwrap();
    ok(
        &mut map,
        BeginMigration {
            from_shard: 1,
            to_shard: 2,
            slots: vec![0],
        },
    );
    let long_addr = "a".repeat(MAX_ADDR_LEN + 1);
    let cases: Vec<(PlacementCommand, &str)> = vec![
        (
            AddNode {
                node_id: 0,
                addr: "x:1".into(),
            },
            "invalid_node_id",
        ),
        (
            AddNode {
                node_id: 1,
                addr: "x:1".into(),
            },
            "duplicate_node",
        ),
        (
            AddNode {
                node_id: 9,
                addr: "10.0.0.2:7000".into(),
            },
            "duplicate_addr",
        ),
        (
            AddNode {
                node_id: 9,
                addr: String::new(),
            },
            "invalid_addr",
        ),
        (
            AddNode {
                node_id: 9,
                addr: long_addr,
            },
            "invalid_addr",
        ),
        (
            AddNode {
                node_id: 9,
                addr: "has space:1".into(),
            },
            "invalid_addr",
        ),
        (RemoveNode { node_id: 9 }, "unknown_node"),
        (
            SetNodeState {
                node_id: 9,
                state: NodeState::Up,
            },
            "unknown_node",
        ),
        (
            SetReplicas {
                shard_id: 9,
                replicas: set(&[1]),
            },
            "unknown_shard",
        ),
        (
            SetReplicas {
                shard_id: 1,
                replicas: set(&[]),
            },
            "no_replicas",
        ),
        (
            SetReplicas {
                shard_id: 1,
                replicas: set(&[1, 9]),
            },
            "unknown_node",
        ),
        (
            SetReplicas {
                shard_id: 1,
                replicas: (1..=8).collect(),
            },
            "too_many_replicas",
        ),
        (CreateShard { replicas: set(&[]) }, "no_replicas"),
        (
            BeginMigration {
                from_shard: 2,
                to_shard: 1,
                slots: vec![1],
            },
            "migration_in_progress",
        ),
        (CommitMigration { migration_id: 2 }, "no_such_migration"),
        (AbortMigration { migration_id: 0 }, "no_such_migration"),
        (
            AdvanceEpoch {
                shard_id: META_SHARD_ID,
            },
            "not_a_data_shard",
        ),
        (AdvanceEpoch { shard_id: 1 }, "migration_in_progress"),
        (AdvanceEpoch { shard_id: 9 }, "unknown_shard"),
    ];
    for (cmd, code) in cases {
        assert_eq!(refused(&mut map, cmd.clone()).code(), code, "{cmd:?}");
    }
    ok(&mut map, AbortMigration { migration_id: 1 });
    let migration_cases: Vec<(PlacementCommand, PlacementError)> = vec![
        (
            BeginMigration {
                from_shard: 1,
                to_shard: 1,
                slots: vec![0],
            },
            PlacementError::SameShard { shard_id: 1 },
        ),
        (
            BeginMigration {
                from_shard: 0,
                to_shard: 1,
                slots: vec![0],
            },
            PlacementError::NotADataShard { shard_id: 0 },
        ),
        (
            BeginMigration {
                from_shard: 1,
                to_shard: 2,
                slots: vec![],
            },
            PlacementError::InvalidSlotCount {
                count: 0,
                max: MAX_SLOTS_PER_MIGRATION,
            },
        ),
        (
            BeginMigration {
                from_shard: 1,
                to_shard: 2,
                slots: (0..SLOT_COUNT).step_by(2).chain([SLOT_COUNT]).collect(),
            },
            PlacementError::InvalidSlotCount {
                count: MAX_SLOTS_PER_MIGRATION + 1,
                max: MAX_SLOTS_PER_MIGRATION,
            },
        ),
        (
            BeginMigration {
                from_shard: 1,
                to_shard: 2,
                slots: vec![0, SLOT_COUNT],
            },
            PlacementError::SlotOutOfRange { slot: SLOT_COUNT },
        ),
        (
            BeginMigration {
                from_shard: 1,
                to_shard: 2,
                slots: vec![2, 0],
            },
            PlacementError::SlotsNotSorted { slot: 0 },
        ),
        (
            BeginMigration {
                from_shard: 1,
                to_shard: 2,
                slots: vec![0, 0],
            },
            PlacementError::SlotsNotSorted { slot: 0 },
        ),
        (
            BeginMigration {
                from_shard: 1,
                to_shard: 2,
                slots: vec![0, 600],
            },
            PlacementError::SlotNotOwned {
                slot: 600,
                owner: 2,
            },
        ),
    ];
    for (cmd, err) in migration_cases {
        assert_eq!(refused(&mut map, cmd.clone()), err, "{cmd:?}");
    }
}
