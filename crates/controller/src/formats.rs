//! Placement commands newer than the first release's format are proposed
//! only when every member reads them (`fencelock_placement::format`): a
//! node still on an older build would refuse such an entry and stop, so in
//! a rolling upgrade one `raise-epochs` could stop every node not yet
//! upgraded. Pure: the caller observes the members' reported formats.

use std::collections::BTreeMap;

use fencelock_placement::format::reads;
use fencelock_placement::{
    NodeState, PlacementCommand, PlacementMap, FIRST_PLACEMENT_FORMAT, VALUES_FORMAT,
};

use crate::error::{ControllerError, Result};

/// Whether every one of `reported` (a node's `placement_format`; `None`:
/// it did not answer) reads format `needs`. A node that does not answer
/// counts as one that does not: used where an older form exists to fall
/// back on, so nothing waits for it.
pub fn all_read(reported: impl IntoIterator<Item = Option<u32>>, needs: u32) -> bool {
    reported
        .into_iter()
        .all(|r| r.is_some_and(|r| reads(r) >= needs))
}

/// Refuses `command` unless every member that will apply it or fetch the
/// map reads its format. `reported` is each answering member's
/// `NodeStatus.placement_format` (absent: it did not answer).
///
/// Not asked: nodes the map has `Down` (they are being emptied), the node
/// a `Down` mark is for, and members that do not answer. The commands of
/// format 2 are what an operator reaches for during an incident (pause the
/// scheduler, mark a dead node down, raise epochs after a restore), when a
/// member is often unreachable; waiting for it would block them. A member
/// that does not answer and returns on an older build stops at the entry
/// with a message naming it (it never misreads it): upgrade it and it
/// catches up. Every member that answers must read the format.
pub fn check_readable(
    command: &PlacementCommand,
    map: &PlacementMap,
    reported: &BTreeMap<u64, u32>,
) -> Result<()> {
    let needs = command.format();
    if needs <= FIRST_PLACEMENT_FORMAT {
        return Ok(());
    }
    let marked = match command {
        PlacementCommand::SetNodeState {
            node_id,
            state: NodeState::Down,
        } => Some(*node_id),
        _ => None,
    };
    for node in map.nodes() {
        if node.state == NodeState::Down || marked == Some(node.node_id) {
            continue;
        }
        match reported.get(&node.node_id).copied().map(reads) {
            Some(r) if r < needs => {
                return Err(ControllerError::FormatNotRead {
                    node_id: node.node_id,
                    reads: r,
                    needs,
                    command: command_name(command),
                })
            }
            Some(_) | None => {}
        }
    }
    Ok(())
}

/// The cluster format to record (`RaiseClusterFormat`), if it can rise:
/// the lowest format the members read, when every member of the map
/// answered (`reported`: each answering node's `placement_format`) and
/// that is above the map's (and at least [`VALUES_FORMAT`], the first
/// format the cluster format turns anything on for). Unlike [`check_readable`], a member that does
/// not answer holds it back, whatever its state: the cluster format turns
/// on features for every shard's log at once, and a replica that returns
/// on an older build would stop at the first entry it cannot read. Pure.
pub fn cluster_format_to_raise(map: &PlacementMap, reported: &BTreeMap<u64, u32>) -> Option<u32> {
    let lowest = map
        .nodes()
        .map(|node| reported.get(&node.node_id).copied().map(reads))
        .collect::<Option<Vec<u32>>>()?
        .into_iter()
        .min()?;
    // The record itself is a format-4 command: below that there is
    // nothing to turn on, and no way to say it.
    (lowest >= VALUES_FORMAT && lowest > map.cluster_format()).then_some(lowest)
}

/// What the refusal calls the command (the operator's word for it).
fn command_name(command: &PlacementCommand) -> &'static str {
    match command {
        PlacementCommand::SetNodeState { .. } => "marking a node DOWN",
        PlacementCommand::SetSchedulerPaused { .. } => "pausing or resuming the scheduler",
        PlacementCommand::RaiseEpochFloor { .. } => "raising the epoch floor",
        _ => "this placement command",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fencelock_api::v1::Reason;

    #[test]
    fn an_import_at_the_source_clock_needs_every_replica_to_answer_that_it_reads_it() {
        let needs = fencelock_placement::IMPORT_AT_CLOCK_FORMAT;
        assert!(all_read([Some(3), Some(3), Some(4)], needs));
        // One replica of the previous release (format 2), one that predates
        // the report (0), or one that does not answer: the older form.
        assert!(!all_read([Some(3), Some(2), Some(3)], needs));
        assert!(!all_read([Some(3), Some(0), Some(3)], needs));
        assert!(!all_read([Some(3), None, Some(3)], needs));
    }

    fn map_of(nodes: &[(u64, NodeState)]) -> PlacementMap {
        let ids: Vec<u64> = nodes.iter().map(|n| n.0).collect();
        let mut map = PlacementMap::bootstrap(
            &ids.iter()
                .map(|&id| (id, format!("10.0.0.{id}:7000")))
                .collect::<Vec<_>>(),
            2,
            3,
        )
        .unwrap();
        for &(node_id, state) in nodes {
            if state != NodeState::Up {
                map.apply(&PlacementCommand::SetNodeState { node_id, state })
                    .unwrap();
            }
        }
        map
    }

    const RAISE: PlacementCommand = PlacementCommand::RaiseEpochFloor { above_epoch: 7 };

    #[test]
    fn the_cluster_format_rises_to_what_every_member_reads_and_never_past_a_silent_one() {
        let mut map = map_of(&[(1, NodeState::Up), (2, NodeState::Up), (3, NodeState::Down)]);
        assert_eq!(map.cluster_format(), FIRST_PLACEMENT_FORMAT);
        // Every member reads 4: raise to 4.
        let all = BTreeMap::from([(1, 4), (2, 4), (3, 4)]);
        assert_eq!(cluster_format_to_raise(&map, &all), Some(4));
        // One member on the previous release (3), one that predates the
        // report (0), or one that does not answer (even a DOWN one): the
        // lowest, or nothing.
        let one_old = BTreeMap::from([(1, 4), (2, 3), (3, 4)]);
        assert_eq!(cluster_format_to_raise(&map, &one_old), None);
        let newer = BTreeMap::from([(1, 5), (2, 4), (3, 6)]);
        assert_eq!(cluster_format_to_raise(&map, &newer), Some(4));
        let unreported = BTreeMap::from([(1, 4), (2, 0), (3, 4)]);
        assert_eq!(cluster_format_to_raise(&map, &unreported), None);
        let silent = BTreeMap::from([(1, 4), (2, 4)]);
        assert_eq!(cluster_format_to_raise(&map, &silent), None);
        // Raised once, it is not proposed again; a newer build reporting
        // more does not lower it.
        map.apply(&PlacementCommand::RaiseClusterFormat { format: 4 })
            .unwrap();
        assert_eq!(cluster_format_to_raise(&map, &all), None);
        assert_eq!(cluster_format_to_raise(&map, &one_old), None);
        map.apply(&PlacementCommand::RaiseClusterFormat { format: 2 })
            .unwrap();
        assert_eq!(map.cluster_format(), 4, "never lowered");
        // The map survives its snapshot with the format.
        let restored = PlacementMap::restore(&map.snapshot()).unwrap();
        assert_eq!(restored.cluster_format(), 4);
    }

    #[test]
    fn a_newer_command_waits_for_every_member_to_read_it() {
        let map = map_of(&[(1, NodeState::Up), (2, NodeState::Up), (3, NodeState::Up)]);
        let all_new = BTreeMap::from([(1, 2), (2, 2), (3, 2)]);
        assert_eq!(check_readable(&RAISE, &map, &all_new), Ok(()));
        // Node 3 still runs the previous release (it reports nothing).
        let one_old = BTreeMap::from([(1, 2), (2, 2), (3, 0)]);
        let err = check_readable(&RAISE, &map, &one_old).unwrap_err();
        assert_eq!(
            err,
            ControllerError::FormatNotRead {
                node_id: 3,
                reads: 1,
                needs: 2,
                command: "raising the epoch floor"
            }
        );
        assert_eq!(err.reason(), Reason::PlacementConflict);
        assert!(err.to_string().contains("upgrade node 3"), "{err}");
        assert!(
            !err.is_retriable(),
            "retrying cannot help until the upgrade"
        );
        // A member that does not answer is not waited for (an incident).
        let silent = BTreeMap::from([(1, 2), (2, 2)]);
        assert_eq!(check_readable(&RAISE, &map, &silent), Ok(()));
        // A member pinned to format 1 (`max_placement_format = 1`).
        let pinned = BTreeMap::from([(1, 1), (2, 2), (3, 2)]);
        assert!(check_readable(&RAISE, &map, &pinned).is_err());
        // First-release commands never wait.
        let add = PlacementCommand::AddNode {
            node_id: 9,
            addr: "10.0.0.9:7000".into(),
        };
        assert_eq!(check_readable(&add, &map, &BTreeMap::new()), Ok(()));
    }

    #[test]
    fn only_the_members_that_answer_are_asked() {
        let map = map_of(&[
            (1, NodeState::Up),
            (2, NodeState::Up),
            (3, NodeState::Up),
            (4, NodeState::Up),
            (5, NodeState::Down),
        ]);
        let mark = |node_id| PlacementCommand::SetNodeState {
            node_id,
            state: NodeState::Down,
        };
        // Nodes 3 and 4 are both gone; 5 is already DOWN.
        let reported = BTreeMap::from([(1, 2), (2, 2)]);
        assert_eq!(check_readable(&mark(3), &map, &reported), Ok(()));
        // An answering member on the previous release still refuses it.
        let old = BTreeMap::from([(1, 2), (2, 0)]);
        let err = check_readable(&mark(3), &map, &old).unwrap_err();
        assert!(matches!(
            err,
            ControllerError::FormatNotRead { node_id: 2, .. }
        ));
        assert!(err.to_string().contains("marking a node DOWN"), "{err}");
        // Pausing while two nodes are gone: the ones that answer decide.
        let pause = PlacementCommand::SetSchedulerPaused { paused: true };
        assert_eq!(check_readable(&pause, &map, &reported), Ok(()));
        assert!(check_readable(&pause, &map, &old).is_err());
    }
}
