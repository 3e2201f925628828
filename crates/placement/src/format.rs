//! Which placement-log format each command needs, so that nodes still
//! running an older build are never handed an entry they cannot read.
//!
//! Every meta-shard replica applies every placement command, and the map
//! snapshot other nodes fetch carries what the commands made. A command
//! (or a node state) added after the first release is encoded with a tag
//! an older build does not know: that build refuses the entry and stops
//! (it never guesses), which in a rolling upgrade would stop every node
//! not yet upgraded. So a command newer than format 1 is proposed only
//! when no member of the map that answers reports an older build
//! (`NodeStatus.placement_format`); the controller checks
//! ([`fencelock-controller`'s `formats`]) and refuses otherwise, naming the
//! node to upgrade.
//!
//! | format | adds |
//! |---|---|
//! | 1 | the first release: nodes, replicas, shards, migrations, splits, `AdvanceEpoch` |
//! | 2 | `SetNodeState { state: Down }` (the controller's own mark), `SetSchedulerPaused`, `RaiseEpochFloor` |
//! | 3 | a data shard's `ImportSlots` carrying the source's lease clock (not a placement command: the orchestrator sends it only when every replica of the importing shard reads it, else the older form) |
//! | 4 | `RaiseClusterFormat` and the map's `cluster_format` (snapshot version 3); on data shards, holder values (`Acquire` with a value, `Proclaim`; snapshot version 5, export version 4), accepted only once the map's `cluster_format` is 4 or more |
//! | 5 | on data shards, shared locks and semaphores (`Acquire` with a mode; lock snapshot version 6, export version 5), accepted only once the map's `cluster_format` is 5 or more; no new placement command |
//!
//! The map's `cluster_format` is the format the controller saw every
//! member read (`RaiseClusterFormat`, raised by itself each round it sees
//! it). A lock feature of a newer format is refused
//! (FEATURE_NOT_ENABLED) until the cluster format reaches it: data-shard
//! entries have no per-entry check like the placement commands above, so
//! the cluster-wide record is what keeps an older replica from meeting
//! one.

use crate::types::{NodeState, PlacementCommand};

/// The first release's placement format, which every build reads; also
/// what a node reporting no format (0, a build that predates the report)
/// reads.
pub const FIRST_PLACEMENT_FORMAT: u32 = 1;
/// The newest placement format this build reads and writes.
pub const PLACEMENT_FORMAT: u32 = 5;
/// The format that reads an `ImportSlots` with the source's lease clock.
pub const IMPORT_AT_CLOCK_FORMAT: u32 = 3;
/// The format that reads holder values on data shards and the map's
/// cluster format.
pub const VALUES_FORMAT: u32 = 4;
/// The format that reads acquire modes (shared locks, semaphores) on data
/// shards.
pub const MODES_FORMAT: u32 = 5;

impl PlacementCommand {
    /// The placement format a node needs to read this command.
    pub fn format(&self) -> u32 {
        match self {
            PlacementCommand::SetNodeState {
                state: NodeState::Down,
                ..
            }
            | PlacementCommand::SetSchedulerPaused { .. }
            | PlacementCommand::RaiseEpochFloor { .. } => 2,
            PlacementCommand::RaiseClusterFormat { .. } => VALUES_FORMAT,
            PlacementCommand::AddNode { .. }
            | PlacementCommand::RemoveNode { .. }
            | PlacementCommand::SetNodeState { .. }
            | PlacementCommand::SetReplicas { .. }
            | PlacementCommand::CreateShard { .. }
            | PlacementCommand::BeginMigration { .. }
            | PlacementCommand::CommitMigration { .. }
            | PlacementCommand::AbortMigration { .. }
            | PlacementCommand::RollBackMigration { .. }
            | PlacementCommand::BeginSplit { .. }
            | PlacementCommand::AdvanceEpoch { .. } => FIRST_PLACEMENT_FORMAT,
        }
    }
}

/// The format a node reads, from what it reported (0: it predates the
/// report and reads the first format only).
pub fn reads(reported: u32) -> u32 {
    reported.max(FIRST_PLACEMENT_FORMAT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_added_after_the_first_release_need_format_2_and_this_build_reads_them() {
        let newer = [
            PlacementCommand::SetNodeState {
                node_id: 1,
                state: NodeState::Down,
            },
            PlacementCommand::SetSchedulerPaused { paused: true },
            PlacementCommand::RaiseEpochFloor { above_epoch: 9 },
        ];
        for c in &newer {
            assert_eq!(c.format(), 2, "{c:?}");
            assert!(c.format() <= PLACEMENT_FORMAT);
        }
        for state in [NodeState::Up, NodeState::Draining, NodeState::Drained] {
            let c = PlacementCommand::SetNodeState { node_id: 1, state };
            assert_eq!(c.format(), FIRST_PLACEMENT_FORMAT, "{c:?}");
        }
        assert_eq!(
            PlacementCommand::AdvanceEpoch { shard_id: 3 }.format(),
            FIRST_PLACEMENT_FORMAT
        );
        assert_eq!(reads(0), 1, "a node that predates the report");
        assert_eq!(reads(2), 2);
    }
}
