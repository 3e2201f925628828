//! The controller acting by itself: one round a second on the meta
//! shard's leader (the server's task checks who leads), in neon's
//! intent-vs-observed shape. The intent is the replicated map; a round
//! observes it and every node's status once, [`decide`]s (a pure function
//! of what it saw) at most one kind of work, and carries it out with the
//! same idempotent steps the `admin` commands use:
//!
//! 1. **Repair** (`repair`): while any member that may hold replicas does
//!    not answer, nothing but repair happens. A node unreachable for
//!    `node_down_after_ms` (see [`DownTracker`]) has its replicas replaced
//!    ([`plan_repair`]: learner, catch up, promote, then remove; a shard
//!    without a reachable majority is never touched).
//! 2. **Split by load** (`split_above_locks`, 0 = off): with everyone
//!    answering and no migration open, the busiest data shard holding that
//!    many locks is split ([`plan_split`]; the reshard protocol, so tokens
//!    keep rising for every moved resource).
//! 3. **Balance** (`balance`): otherwise replicas and leaderships even out
//!    with hysteresis ([`plan_rebalance`]), so the cluster settles instead
//!    of chasing every election.
//!
//! Nothing happens while the map says the scheduler is paused
//! (`fencelock admin scheduler pause`). What a leader remembers between
//! rounds is only since when each node has been unreachable: a new meta
//! leader starts that clock again (acting later, never sooner) and plans
//! from the replicated map, so a move cut short by a leader change is
//! finished or redone by the next round.

use std::collections::{BTreeMap, BTreeSet};

use fencelock_placement::{
    plan_rebalance, plan_repair, plan_split, Action, ClusterView, NodeState, ShardLoad,
    META_SHARD_ID,
};

use crate::error::ControllerError;
use crate::nodes::NodeApi;
use crate::ops::{view_of, Ops};
use crate::repair::DownTracker;

/// Default time a node must stay unreachable before its replicas are
/// replaced: long enough for a restart, a kernel upgrade or a short
/// network outage, short enough that a shard does not run on two of three
/// replicas for long.
pub const DEFAULT_NODE_DOWN_AFTER_MS: u64 = 300_000;
/// Default steps (replica moves, leader transfers) one round carries out.
pub const DEFAULT_MAX_MOVES_PER_ROUND: usize = 2;
/// Most steps one round may be configured to carry out.
pub const MAX_MOVES_PER_ROUND: usize = 16;
/// Default leadership spread (max − min over `UP` nodes) that starts a
/// rebalance: above the one or two an election moves.
pub const DEFAULT_LEADER_SPREAD: usize = 3;

/// What the controller does by itself (the server's `[controller]`
/// section).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ActConfig {
    /// Replace the replicas of nodes down for `node_down_after_ms`.
    pub repair: bool,
    /// A node unreachable for at least this long counts as down.
    pub node_down_after_ms: u64,
    /// Even out replicas and leaderships.
    pub balance: bool,
    /// Leadership counts this far apart start a rebalance (at least 2).
    pub leader_spread: usize,
    /// Split a data shard holding this many locks (0: never).
    pub split_above_locks: u64,
    /// At most this many steps a round, 1..=[`MAX_MOVES_PER_ROUND`].
    pub max_moves: usize,
}

impl Default for ActConfig {
    fn default() -> Self {
        ActConfig {
            repair: true,
            node_down_after_ms: DEFAULT_NODE_DOWN_AFTER_MS,
            balance: false,
            leader_spread: DEFAULT_LEADER_SPREAD,
            split_above_locks: 0,
            max_moves: DEFAULT_MAX_MOVES_PER_ROUND,
        }
    }
}

/// The work one round chose.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Work {
    /// Nothing to do (or not allowed to: paused, or someone unreachable
    /// but not down yet).
    #[default]
    Nothing,
    /// Replace replicas on down nodes.
    Repair(Vec<Action>),
    /// Split this data shard in two.
    Split { shard_id: u64 },
    /// Even out the `UP` nodes.
    Balance(Vec<Action>),
}

/// What one round saw and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Round {
    /// An operator paused the controller: the round did nothing.
    pub paused: bool,
    /// Members that did not answer (`Drained` nodes left out: they hold
    /// nothing, and a stopped one must not hold everything else up).
    pub unreachable: BTreeSet<u64>,
    /// Of those, the ones unreachable for `node_down_after_ms`.
    pub down: BTreeSet<u64>,
    /// The work chosen.
    pub work: Work,
    /// How many of its steps completed (a split counts as one).
    pub done: usize,
}

/// Members that did not answer and may matter: every node the view marks
/// down except `Drained` ones, which hold no replica and take none.
pub fn unreachable_members(view: &ClusterView) -> BTreeSet<u64> {
    view.down
        .iter()
        .copied()
        .filter(|n| view.nodes.get(n) != Some(&NodeState::Drained))
        .collect()
}

/// The one kind of work a round does, from what it observed: `view` (its
/// `down` set the members that did not answer), `down` (those down for
/// long enough), the data shards' `loads`, whether a migration is open.
/// Pure, so the order of priorities is unit-tested.
pub fn decide(
    config: &ActConfig,
    view: &ClusterView,
    down: &BTreeSet<u64>,
    loads: &BTreeMap<u64, ShardLoad>,
    migration_open: bool,
) -> Work {
    let max_moves = config.max_moves.clamp(1, MAX_MOVES_PER_ROUND);
    if !unreachable_members(view).is_empty() {
        if !config.repair || down.is_empty() {
            return Work::Nothing;
        }
        // Only nodes down for long enough count as down for planning; the
        // others may be restarting.
        let mut repairing = view.clone();
        repairing.down = down.clone();
        let plan = plan_repair(&repairing, max_moves);
        return if plan.is_empty() {
            Work::Nothing
        } else {
            Work::Repair(plan)
        };
    }
    if !migration_open {
        if let Some(shard_id) = plan_split(loads, config.split_above_locks, view.shards.len()) {
            return Work::Split { shard_id };
        }
    }
    if config.balance {
        let plan = plan_rebalance(view, max_moves, config.leader_spread);
        if !plan.is_empty() {
            return Work::Balance(plan);
        }
    }
    Work::Nothing
}

impl<N: NodeApi> Ops<N> {
    /// One round at `now_ms` (a monotonic clock's reading): observe once,
    /// update `tracker`, [`decide`], carry the work out step by step. A
    /// failed step ends the round with the error (and what got done); the
    /// next round decides again from the map.
    pub async fn act_round(
        &self,
        tracker: &mut DownTracker,
        now_ms: u64,
        config: &ActConfig,
    ) -> Result<Round, (Round, ControllerError)> {
        let mut round = Round::default();
        let (map, statuses) = match self.observe().await {
            Ok(observed) => observed,
            Err(e) => return Err((round, e)),
        };
        if map.scheduler_paused() {
            // Observe nothing, so the clock starts again on resume: a node
            // is replaced no sooner than `node_down_after_ms` after it.
            tracker.forget();
            round.paused = true;
            return Ok(round);
        }
        let view = view_of(&map, &statuses);
        round.unreachable = unreachable_members(&view);
        round.down = tracker.observe(now_ms, &round.unreachable, config.node_down_after_ms);
        let mut loads = BTreeMap::new();
        for status in statuses.values() {
            for r in status.replicas.iter() {
                if r.is_leader && r.shard_id != META_SHARD_ID {
                    let load = ShardLoad {
                        held_locks: r.held_locks,
                        owned_slots: r.owned_slots,
                    };
                    loads.insert(r.shard_id, load);
                }
            }
        }
        round.work = decide(
            config,
            &view,
            &round.down,
            &loads,
            map.migration().is_some(),
        );
        let steps = match &round.work {
            Work::Nothing => return Ok(round),
            Work::Split { shard_id } => {
                return match self.split(*shard_id, 0).await {
                    Ok(_) => {
                        round.done = 1;
                        Ok(round)
                    }
                    Err(e) => Err((round, e)),
                };
            }
            Work::Repair(plan) | Work::Balance(plan) => plan.clone(),
        };
        for action in steps {
            match self.execute(vec![action]).await {
                Ok(_) => round.done += 1,
                Err(e) => return Err((round, e)),
            }
        }
        Ok(round)
    }

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
    use fencelock_placement::ShardView;

    /// Five nodes, shards 0..=4 on nodes 1..=3, led by node 1.
    fn view() -> ClusterView {
        ClusterView {
            nodes: (1..=5).map(|n| (n, NodeState::Up)).collect(),
            down: BTreeSet::new(),
            shards: (0..=4)
                .map(|id| {
                    let shard = ShardView {
                        replicas: [1, 2, 3].into(),
                        leader: Some(1),
                    };
                    (id, shard)
                })
                .collect(),
            replication_factor: 3,
        }
    }

    fn busy() -> BTreeMap<u64, ShardLoad> {
        let load = ShardLoad {
            held_locks: 500,
            owned_slots: 256,
        };
        [(1, load)].into()
    }

    fn all_on() -> ActConfig {
        ActConfig {
            balance: true,
            split_above_locks: 100,
            ..ActConfig::default()
        }
    }

    #[test]
    fn an_unreachable_node_stops_everything_but_repair() {
        let mut v = view();
        v.down = [2].into();
        let none = BTreeSet::new();
        assert_eq!(decide(&all_on(), &v, &none, &busy(), false), Work::Nothing);
        let Work::Repair(plan) = decide(&all_on(), &v, &[2].into(), &busy(), false) else {
            panic!("down for long enough: repair");
        };
        assert!(plan.len() <= DEFAULT_MAX_MOVES_PER_ROUND && !plan.is_empty());
        let off = ActConfig {
            repair: false,
            ..all_on()
        };
        assert_eq!(decide(&off, &v, &[2].into(), &busy(), false), Work::Nothing);
    }

    #[test]
    fn a_stopped_drained_node_does_not_hold_the_cluster_up() {
        let mut v = view();
        v.nodes.insert(5, NodeState::Drained);
        v.down = [5].into();
        assert!(unreachable_members(&v).is_empty());
        assert_eq!(
            decide(&all_on(), &v, &BTreeSet::new(), &busy(), false),
            Work::Split { shard_id: 1 }
        );
    }

    #[test]
    fn a_split_comes_before_balance_and_waits_for_an_open_migration() {
        let v = view();
        let none = BTreeSet::new();
        assert_eq!(
            decide(&all_on(), &v, &none, &busy(), false),
            Work::Split { shard_id: 1 }
        );
        let Work::Balance(plan) = decide(&all_on(), &v, &none, &busy(), true) else {
            panic!("nodes 4 and 5 are empty: balance");
        };
        assert!(plan.len() <= DEFAULT_MAX_MOVES_PER_ROUND);
        let defaults = ActConfig::default();
        assert_eq!(decide(&defaults, &v, &none, &busy(), false), Work::Nothing);
    }
}
