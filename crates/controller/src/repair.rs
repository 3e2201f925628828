//! Repair by itself: the controller replaces the replicas of a node that
//! stayed unreachable for `node_down_after_ms`, without an operator.
//!
//! Shape (neon's storage controller): the intent is the replicated map's
//! replica sets, the observation is which nodes answer; a round plans the
//! difference with the pure [`plan_repair`] and carries out at most
//! `max_moves` of the same idempotent replica moves `admin move-replica`
//! uses. Each move adds the new replica as a learner, waits for it to catch
//! up, promotes it and only then removes the one on the down node, so no
//! shard ever has fewer voters than before; a shard without a reachable
//! majority is never touched.
//!
//! Only the meta shard's leader runs rounds (the server's task checks), so
//! one controller acts at a time, and none while the replicated map says
//! the scheduler is paused (`fencelock admin scheduler pause`). What it remembers — since when each node
//! has been unreachable — is a soft observation: a new meta leader starts
//! the clock again (acting later, never sooner) and plans from the
//! replicated map, so a move cut short by a leader change is finished or
//! redone by the next round.
//!
//! [`DownTracker`] is pure (time comes in as a value), so the rule "down
//! after this long unreachable" is unit-tested without clocks.

use std::collections::{BTreeMap, BTreeSet};

use fencelock_placement::{plan_repair, Action};

use crate::error::ControllerError;
use crate::nodes::NodeApi;
use crate::ops::Ops;

/// Default time a node must stay unreachable before its replicas are
/// replaced: long enough for a restart, a kernel upgrade or a short
/// network outage, short enough that a shard does not run on two of three
/// replicas for long.
pub const DEFAULT_NODE_DOWN_AFTER_MS: u64 = 300_000;
/// Default replica moves one round carries out (one after another).
pub const DEFAULT_MAX_MOVES_PER_ROUND: usize = 2;
/// Most replica moves one round may be configured to carry out.
pub const MAX_MOVES_PER_ROUND: usize = 16;

/// The repair rule's knobs (the server's `[controller]` section).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RepairConfig {
    /// A node unreachable for at least this long counts as down.
    pub node_down_after_ms: u64,
    /// At most this many replica moves per round, 1..=[`MAX_MOVES_PER_ROUND`].
    pub max_moves: usize,
}

impl Default for RepairConfig {
    fn default() -> Self {
        RepairConfig {
            node_down_after_ms: DEFAULT_NODE_DOWN_AFTER_MS,
            max_moves: DEFAULT_MAX_MOVES_PER_ROUND,
        }
    }
}

/// Since when each node has been unreachable, from successive observations.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DownTracker {
    unreachable_since_ms: BTreeMap<u64, u64>,
}

impl DownTracker {
    /// Records that, at `now_ms`, the nodes in `unreachable` did not answer
    /// (every other node did), and returns the nodes unreachable without a
    /// break for at least `down_after_ms`. A node that answers once starts
    /// from zero the next time it does not.
    pub fn observe(
        &mut self,
        now_ms: u64,
        unreachable: &BTreeSet<u64>,
        down_after_ms: u64,
    ) -> BTreeSet<u64> {
        self.unreachable_since_ms
            .retain(|node, _| unreachable.contains(node));
        for &node in unreachable {
            self.unreachable_since_ms.entry(node).or_insert(now_ms);
        }
        self.unreachable_since_ms
            .iter()
            .filter(|(_, &since)| now_ms.saturating_sub(since) >= down_after_ms)
            .map(|(&node, _)| node)
            .collect()
    }

    /// Forgets every observation (this node stopped leading the meta shard:
    /// the next leader observes for itself).
    pub fn forget(&mut self) {
        self.unreachable_since_ms.clear();
    }
}

/// What one round saw and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RepairRound {
    /// An operator paused the controller (`admin scheduler pause`): the
    /// round did nothing.
    pub paused: bool,
    /// Nodes that did not answer this round.
    pub unreachable: BTreeSet<u64>,
    /// Nodes unreachable for at least `node_down_after_ms`.
    pub down: BTreeSet<u64>,
    /// The moves planned (at most `max_moves`).
    pub planned: Vec<Action>,
    /// How many of them completed.
    pub moved: usize,
}

impl<N: NodeApi> Ops<N> {
    /// One repair round at `now_ms` (a monotonic clock's reading): observe
    /// who answers, update `tracker`, plan the replacement of replicas on
    /// down nodes, and carry the plan out move by move. A failed move ends
    /// the round with the error; the next round plans again from the map.
    pub async fn repair_round(
        &self,
        tracker: &mut DownTracker,
        now_ms: u64,
        config: &RepairConfig,
    ) -> Result<RepairRound, (RepairRound, ControllerError)> {
        let mut round = RepairRound::default();
        match self.fresh_map().await {
            Ok(map) if map.scheduler_paused() => {
                // Paused by an operator: observe nothing, so the clock
                // starts again when resumed (a node is replaced no sooner
                // than `node_down_after_ms` after the resume).
                tracker.forget();
                round.paused = true;
                return Ok(round);
            }
            Ok(_) => {}
            Err(e) => return Err((round, e)),
        }
        let mut view = match self.view().await {
            Ok(view) => view,
            Err(e) => return Err((round, e)),
        };
        round.unreachable = view.down.clone();
        round.down = tracker.observe(now_ms, &view.down, config.node_down_after_ms);
        // Only nodes down for long enough count as down for planning; the
        // others may be restarting.
        view.down = round.down.clone();
        if round.down.is_empty() {
            return Ok(round);
        }
        round.planned = plan_repair(&view, config.max_moves.clamp(1, MAX_MOVES_PER_ROUND));
        for action in round.planned.clone() {
            match self.execute(vec![action]).await {
                Ok(_) => round.moved += 1,
                Err(e) => return Err((round, e)),
            }
        }
        Ok(round)
    }
}

impl<N: NodeApi> Ops<N> {
    /// Pauses (`Some(true)`), resumes (`Some(false)`) or only reads
    /// (`None`) the controller's own moves; returns whether they are paused
    /// and the map version that says so.
    pub async fn scheduler(&self, pause: Option<bool>) -> Result<(bool, u64), ControllerError> {
        if let Some(paused) = pause {
            self.propose_meta(fencelock_placement::PlacementCommand::SetSchedulerPaused { paused })
                .await?;
        }
        let map = self.fresh_map().await?;
        Ok((map.scheduler_paused(), map.version()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(nodes: &[u64]) -> BTreeSet<u64> {
        nodes.iter().copied().collect()
    }

    #[test]
    fn a_node_counts_as_down_only_after_being_unreachable_for_the_whole_bound() {
        let mut t = DownTracker::default();
        assert_eq!(t.observe(1_000, &set(&[3]), 5_000), set(&[]));
        assert_eq!(t.observe(5_999, &set(&[3]), 5_000), set(&[]));
        assert_eq!(t.observe(6_000, &set(&[3]), 5_000), set(&[3]));
        assert_eq!(t.observe(9_000, &set(&[3, 4]), 5_000), set(&[3]));
        assert_eq!(t.observe(14_000, &set(&[3, 4]), 5_000), set(&[3, 4]));
    }

    #[test]
    fn one_answer_starts_the_clock_again() {
        let mut t = DownTracker::default();
        t.observe(0, &set(&[2]), 5_000);
        assert_eq!(t.observe(4_000, &set(&[]), 5_000), set(&[]));
        assert_eq!(t.observe(6_000, &set(&[2]), 5_000), set(&[]));
        assert_eq!(t.observe(11_000, &set(&[2]), 5_000), set(&[2]));
    }

    #[test]
    fn a_new_meta_leader_observes_from_scratch() {
        let mut t = DownTracker::default();
        t.observe(0, &set(&[2]), 5_000);
        t.forget();
        assert_eq!(t.observe(6_000, &set(&[2]), 5_000), set(&[]));
        assert_eq!(t.observe(11_000, &set(&[2]), 5_000), set(&[2]));
    }
}
