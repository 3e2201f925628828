//! Encodings: round trips are bit-identical, only the canonical form decodes,
//! and no byte input makes decoding panic.

use std::collections::BTreeSet;

use fencelock_placement::*;
use proptest::prelude::*;

fn nodes(n: u64) -> Vec<(u64, String)> {
    (1..=n)
        .map(|i| (i, format!("node-{i}.zone-{}:7000", i % 3)))
        .collect()
}

/// A map that uses every part of the format: several node states, a created
/// shard, a committed and an in-progress migration.
fn rich_map() -> PlacementMap {
    use PlacementCommand::*;
    let mut map = PlacementMap::bootstrap(&nodes(5), 4, 3).unwrap();
    let cmds = [
        AddNode {
            node_id: 9,
            addr: "[::1]:7009".into(),
        },
        SetNodeState {
            node_id: 9,
            state: NodeState::Drained,
        },
        SetNodeState {
            node_id: 5,
            state: NodeState::Draining,
        },
        CreateShard {
            replicas: [1, 2, 3].into(),
        },
        BeginMigration {
            from_shard: 1,
            to_shard: 5,
            slots: vec![0, 4, 8],
        },
        CommitMigration { migration_id: 1 },
        AdvanceEpoch { shard_id: 2 },
        BeginMigration {
            from_shard: 3,
            to_shard: 1,
            slots: vec![520, 524],
        },
    ];
    for cmd in cmds {
        map.apply(&cmd).unwrap();
    }
    map
}

fn every_command() -> Vec<PlacementCommand> {
    use PlacementCommand::*;
    vec![
        AddNode {
            node_id: 7,
            addr: "h:1".into(),
        },
        RemoveNode { node_id: 7 },
        SetNodeState {
            node_id: 7,
            state: NodeState::Up,
        },
        SetNodeState {
            node_id: 7,
            state: NodeState::Draining,
        },
        SetNodeState {
            node_id: 7,
            state: NodeState::Drained,
        },
        SetReplicas {
            shard_id: 3,
            replicas: [1, 2, 5].into(),
        },
        CreateShard {
            replicas: BTreeSet::new(),
        },
        BeginMigration {
            from_shard: 1,
            to_shard: 2,
            slots: vec![9, 3],
        },
        CommitMigration { migration_id: 4 },
        AbortMigration { migration_id: 4 },
        AdvanceEpoch { shard_id: 2 },
        RollBackMigration { migration_id: 4 },
        BeginSplit {
            from_shard: 1,
            slots: vec![9, 3],
        },
        SetSchedulerPaused { paused: true },
        SetSchedulerPaused { paused: false },
        RaiseEpochFloor { above_epoch: 4_000 },
    ]
}

#[test]
fn snapshot_round_trip_is_bit_identical() {
    let map = rich_map();
    assert!(map.migration().is_some());
    let bytes = map.snapshot();
    let restored = PlacementMap::restore(&bytes).unwrap();
    assert_eq!(restored, map);
    assert_eq!(restored.snapshot(), bytes);
    let fresh = PlacementMap::bootstrap(&nodes(1), 1, 1).unwrap();
    assert_eq!(PlacementMap::restore(&fresh.snapshot()).unwrap(), fresh);
}

#[test]
fn every_command_round_trips() {
    for cmd in every_command() {
        assert_eq!(PlacementCommand::decode(&cmd.encode()), Ok(cmd.clone()));
    }
}

#[test]
fn trailing_bytes_are_refused() {
    for cmd in every_command() {
        let mut bytes = cmd.encode();
        bytes.push(0);
        assert_eq!(
            PlacementCommand::decode(&bytes),
            Err(DecodeError::TrailingBytes(1))
        );
    }
    let mut snapshot = rich_map().snapshot();
    snapshot.extend_from_slice(&[1, 2]);
    assert_eq!(
        PlacementMap::restore(&snapshot),
        Err(DecodeError::TrailingBytes(2))
    );
}

#[test]
fn unknown_versions_magic_and_tags_are_refused() {
    let mut cmd = PlacementCommand::RemoveNode { node_id: 1 }.encode();
    cmd[0] = 2;
    assert_eq!(
        PlacementCommand::decode(&cmd),
        Err(DecodeError::UnsupportedVersion(2))
    );
    cmd[0] = 1;
    cmd[1] = 200;
    assert_eq!(
        PlacementCommand::decode(&cmd),
        Err(DecodeError::BadTag {
            what: "command",
            tag: 200
        })
    );
    let snapshot = rich_map().snapshot();
    let mut bad_version = snapshot.clone();
    bad_version[5] = 9;
    assert_eq!(
        PlacementMap::restore(&bad_version),
        Err(DecodeError::UnsupportedVersion(9))
    );
    let mut bad_magic = snapshot;
    bad_magic[0] = b'X';
    assert_eq!(
        PlacementMap::restore(&bad_magic),
        Err(DecodeError::BadMagic)
    );
    assert_eq!(PlacementCommand::decode(&[]), Err(DecodeError::Truncated));
    assert_eq!(PlacementMap::restore(&[]), Err(DecodeError::Truncated));
}

#[test]
fn a_replica_set_has_exactly_one_encoding() {
    let cmd = PlacementCommand::CreateShard {
        replicas: [1, 2].into(),
    };
    let mut bytes = cmd.encode();
    // Swap the two ids: same set, non-canonical order.
    let end = bytes.len();
    let (first, second) = (bytes[end - 16..end - 8].to_vec(), bytes[end - 8..].to_vec());
    bytes[end - 16..end - 8].copy_from_slice(&second);
    bytes[end - 8..].copy_from_slice(&first);
    assert!(matches!(
        PlacementCommand::decode(&bytes),
        Err(DecodeError::Invalid(_))
    ));
}

#[test]
fn every_truncation_of_a_snapshot_is_refused() {
    let bytes = rich_map().snapshot();
    for len in 0..bytes.len() {
        assert!(
            PlacementMap::restore(&bytes[..len]).is_err(),
            "prefix of {len} bytes"
        );
    }
}

#[test]
fn a_snapshot_that_breaks_an_invariant_is_refused() {
    // Slot 0's owner is the first u64 after the shard table; pointing it at
    // the meta shard breaks "every slot belongs to a data shard".
    let map = PlacementMap::bootstrap(&nodes(3), 2, 3).unwrap();
    let mut bytes = map.snapshot();
    let slot_table_at = bytes.len() - 1 - 8 * SLOT_COUNT as usize;
    bytes[slot_table_at..slot_table_at + 8].copy_from_slice(&META_SHARD_ID.to_be_bytes());
    assert!(matches!(
        PlacementMap::restore(&bytes),
        Err(DecodeError::Invalid(_))
    ));
}

fn arbitrary_command() -> impl Strategy<Value = PlacementCommand> {
    use PlacementCommand::*;
    let state = prop_oneof![
        Just(NodeState::Up),
        Just(NodeState::Draining),
        Just(NodeState::Drained),
        Just(NodeState::Down)
    ];
    let ids = proptest::collection::btree_set(any::<u64>(), 0..10);
    prop_oneof![
        (any::<u64>(), ".{0,300}").prop_map(|(node_id, addr)| AddNode { node_id, addr }),
        any::<u64>().prop_map(|node_id| RemoveNode { node_id }),
        (any::<u64>(), state).prop_map(|(node_id, state)| SetNodeState { node_id, state }),
        (any::<u64>(), ids.clone())
            .prop_map(|(shard_id, replicas)| SetReplicas { shard_id, replicas }),
        ids.prop_map(|replicas| CreateShard { replicas }),
        (
            any::<u64>(),
            any::<u64>(),
            proptest::collection::vec(any::<u32>(), 0..40)
        )
            .prop_map(|(from_shard, to_shard, slots)| BeginMigration {
                from_shard,
                to_shard,
                slots
            }),
        any::<u64>().prop_map(|migration_id| CommitMigration { migration_id }),
        any::<u64>().prop_map(|migration_id| AbortMigration { migration_id }),
        any::<u64>().prop_map(|shard_id| AdvanceEpoch { shard_id }),
        any::<u64>().prop_map(|migration_id| RollBackMigration { migration_id }),
        (any::<u64>(), proptest::collection::vec(any::<u32>(), 0..40))
            .prop_map(|(from_shard, slots)| BeginSplit { from_shard, slots }),
        any::<bool>().prop_map(|paused| SetSchedulerPaused { paused }),
        any::<u64>().prop_map(|above_epoch| RaiseEpochFloor { above_epoch }),
    ]
}

#[test]
fn a_paused_scheduler_survives_a_snapshot_and_an_unpaused_map_keeps_the_old_format() {
    let mut map = rich_map();
    let unpaused = map.snapshot();
    assert_eq!(
        &unpaused[4..6],
        &1u16.to_be_bytes(),
        "never paused: version 1"
    );
    assert_eq!(
        map.apply(&PlacementCommand::SetSchedulerPaused { paused: true }),
        Ok(PlacementReply::Updated)
    );
    assert!(map.scheduler_paused());
    let paused = map.snapshot();
    assert_eq!(&paused[4..6], &2u16.to_be_bytes());
    let restored = PlacementMap::restore(&paused).expect("restores");
    assert!(restored.scheduler_paused());
    assert_eq!(restored, map);
    // Non-canonical: version 2 saying "not paused", or any other flag byte.
    let mut bad = paused.clone();
    *bad.last_mut().unwrap() = 0;
    assert!(PlacementMap::restore(&bad).is_err());
    // Resumed, the map is written as version 1 again.
    map.apply(&PlacementCommand::SetSchedulerPaused { paused: false })
        .unwrap();
    assert_eq!(&map.snapshot()[4..6], &1u16.to_be_bytes());
    assert_eq!(
        PlacementCommand::decode(&[1, 12, 2]),
        Err(DecodeError::BadTag {
            what: "scheduler flag",
            tag: 2
        })
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2_000, ..ProptestConfig::default() })]

    #[test]
    fn any_command_round_trips(cmd in arbitrary_command()) {
        prop_assert_eq!(PlacementCommand::decode(&cmd.encode()), Ok(cmd));
    }

    /// Whatever the bytes, decoding returns; what decodes is canonical.
    #[test]
    fn random_bytes_never_panic_and_only_canonical_bytes_decode(
        bytes in proptest::collection::vec(any::<u8>(), 0..200),
    ) {
        if let Ok(cmd) = PlacementCommand::decode(&bytes) {
            prop_assert_eq!(cmd.encode(), bytes.clone());
        }
        if let Ok(map) = PlacementMap::restore(&bytes) {
            prop_assert_eq!(map.snapshot(), bytes);
        }
    }

    /// Commands that start like real ones reach deeper into the decoder.
    #[test]
    fn corrupted_commands_never_panic(
        which in 0usize..11,
        flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..4),
        cut in any::<usize>(),
    ) {
        let mut bytes = every_command()[which].encode();
        for (at, value) in flips {
            let at = at % bytes.len();
            bytes[at] = value;
        }
        bytes.truncate(cut % (bytes.len() + 1));
        if let Ok(cmd) = PlacementCommand::decode(&bytes) {
            prop_assert_eq!(cmd.encode(), bytes);
        }
    }

    /// Snapshots with a few bytes changed either fail to restore or restore
    /// to a map that keeps every invariant and re-encodes to the same bytes.
    #[test]
    fn corrupted_snapshots_never_panic(
        flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..4),
    ) {
        let mut bytes = rich_map().snapshot();
        for (at, value) in flips {
            let at = at % bytes.len();
            bytes[at] = value;
        }
        if let Ok(map) = PlacementMap::restore(&bytes) {
            prop_assert_eq!(map.check_invariants(), Ok(()));
            prop_assert_eq!(map.snapshot(), bytes);
        }
    }
}
