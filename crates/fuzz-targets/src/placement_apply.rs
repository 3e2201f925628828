//! The placement map on arbitrary command sequences: a bootstrap map from
//! the first bytes, then commands on small node, shard and migration ids
//! (so they hit real entries) with raw values mixed in. After every
//! command: a success bumps the version by one, a refusal changes nothing,
//! the invariants hold and the snapshot round-trips.

use std::collections::BTreeSet;

use fencelock_placement::{NodeState, PlacementCommand, PlacementMap, SLOT_COUNT};

use crate::input::Input;

pub const MAX_STEPS: usize = 64;

fn small_id(input: &mut Input) -> u64 {
    input.pick_or_raw(&[0, 1, 2, 3, 4, 5, 6, 7, 8, 9])
}

fn ids(input: &mut Input) -> BTreeSet<u64> {
    let n = input.below(6);
    (0..n).map(|_| u64::from(input.u8() % 10)).collect()
}

fn command(input: &mut Input) -> PlacementCommand {
    match input.u8() % 10 {
        0 => {
            let node_id = small_id(input);
            let addr = match input.u8() % 4 {
                0 => String::from_utf8_lossy(input.bytes(300)).into_owned(),
                n => format!("10.0.0.{n}:7000"),
            };
            PlacementCommand::AddNode { node_id, addr }
        }
        1 => PlacementCommand::RemoveNode {
            node_id: small_id(input),
        },
        2 => PlacementCommand::SetNodeState {
            node_id: small_id(input),
            state: match input.u8() % 4 {
                0 => NodeState::Up,
                1 => NodeState::Draining,
                2 => NodeState::Down,
                _ => NodeState::Drained,
            },
        },
        3 => PlacementCommand::SetReplicas {
            shard_id: small_id(input),
            replicas: ids(input),
        },
        4 => PlacementCommand::CreateShard {
            replicas: ids(input),
        },
        5 | 6 => {
            let from_shard = small_id(input);
            let to_shard = small_id(input);
            let n = input.below(8);
            let start = u32::from(input.u16()) % SLOT_COUNT;
            let slots = (0..n)
                .map(|i| match input.u8() {
                    0xff => input.u32(),
                    step => (start + i as u32 * u32::from(step % 4)) % SLOT_COUNT,
                })
                .collect();
            if input.u8().is_multiple_of(4) {
                PlacementCommand::BeginSplit { from_shard, slots }
            } else {
                PlacementCommand::BeginMigration {
                    from_shard,
                    to_shard,
                    slots,
                }
            }
        }
        7 => PlacementCommand::CommitMigration {
            migration_id: small_id(input),
        },
        8 => {
            let migration_id = small_id(input);
            if input.u8().is_multiple_of(2) {
                PlacementCommand::AbortMigration { migration_id }
            } else {
                PlacementCommand::RollBackMigration { migration_id }
            }
        }
        9 if input.u8().is_multiple_of(4) => PlacementCommand::SetSchedulerPaused {
            paused: input.u8().is_multiple_of(2),
        },
        9 if input.u8().is_multiple_of(8) => PlacementCommand::RaiseEpochFloor {
            above_epoch: input.u64() % (fencelock_placement::MAX_EPOCH + 2),
        },
        9 if input.u8().is_multiple_of(8) => PlacementCommand::RaiseClusterFormat {
            format: u32::from(input.u8() % 8),
        },
        _ => PlacementCommand::AdvanceEpoch {
            shard_id: small_id(input),
        },
    }
}

/// Applies `command` and checks the map's promises about it (the snapshot
/// round trip too when `round_trip`).
pub fn apply_checked(map: &mut PlacementMap, command: &PlacementCommand) {
    apply_and_check(map, command, true);
}

fn apply_and_check(map: &mut PlacementMap, command: &PlacementCommand, round_trip: bool) {
    let before = map.clone();
    match map.apply(command) {
        Ok(_) => assert_eq!(
            map.version(),
            before.version() + 1,
            "a success bumps the version by one: {command:?}"
        ),
        Err(_) => assert_eq!(*map, before, "a refused {command:?} changed the map"),
    }
    if let Err(broken) = map.check_invariants() {
        panic!("placement invariant broken after {command:?}: {broken}");
    }
    if !round_trip {
        return;
    }
    let bytes = map.snapshot();
    match PlacementMap::restore(&bytes) {
        Ok(restored) => assert_eq!(restored, *map, "restored map differs"),
        Err(e) => panic!("snapshot of a live map does not restore: {e}"),
    }
}

/// The target: see the module documentation.
pub fn placement_apply(data: &[u8]) {
    let mut input = Input::new(data);
    let nodes: Vec<(u64, String)> = (1..=1 + u64::from(input.u8() % 6))
        .map(|i| (i, format!("node-{i}:7000")))
        .collect();
    let shard_count = 1 + u32::from(input.u8() % 8);
    let replication = 1 + input.below(3);
    let Ok(mut map) = PlacementMap::bootstrap(&nodes, shard_count, replication) else {
        return;
    };
    let mut steps = 0;
    while !input.is_empty() && steps < MAX_STEPS {
        let command = command(&mut input);
        steps += 1;
        // Commands travel encoded and replicas apply what decodes; the
        // codec may refuse what no valid proposer sends (an overlong
        // address), but what it takes must be the command that was sent.
        let Ok(decoded) = PlacementCommand::decode(&command.encode()) else {
            continue;
        };
        assert_eq!(decoded, command, "placement command does not round-trip");
        // The snapshot holds the whole slot table: check its round trip
        // every few steps and at the end, not after every command.
        let round_trip = steps.is_multiple_of(8) || input.is_empty() || steps == MAX_STEPS;
        apply_and_check(&mut map, &command, round_trip);
    }
}
