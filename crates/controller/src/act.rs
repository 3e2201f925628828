//! The controller acting by itself: one round a second on the meta
//! shard's leader (the server's task checks who leads), in neon's
//! intent-vs-observed shape. The intent is the replicated map; a round
//! observes it and every node's status once, [`decide`]s (a pure function
//! of what it saw) at most one kind of work, and carries it out with the
//! same idempotent steps the `admin` commands use:
//!
//! 1. **Mark down** (`repair`): a node unreachable for
//!    `node_down_after_ms` (see [`DownTracker`]) is marked `Down` in the
//!    map — the verdict a new meta leader resumes from.
//! 2. **Return**: a `Down` node that answers and holds nothing is `Up`
//!    again, an empty node.
//! 3. **Repair**: replicas on `Down` nodes are replaced ([`plan_repair`]:
//!    learner, catch up, promote, then remove; a shard without a reachable
//!    majority is never touched). While any other member holding replicas
//!    does not answer, nothing else happens.
//! 4. **Split by load** (`split_above_locks`, `split_above_writes_per_sec`,
//!    0 = off): with no migration open, the data shard furthest over one
//!    of them is split
//!    ([`plan_split`]; the reshard protocol, so tokens keep rising for
//!    every moved resource).
//! 5. **Balance** (`balance`): replicas and leaderships even out by count
//!    with hysteresis ([`plan_rebalance`]), then leaderships by the
//!    shards' measured write rates and lock counts ([`plan_load_leaders`],
//!    rates from [`RateTracker`]), so the cluster settles instead of
//!    chasing every election.
//!
//! Nothing happens while the map says the scheduler is paused
//! (`fencelock admin scheduler pause`). What a leader remembers between
//! rounds ([`Memory`]) is since when each node has been unreachable and
//! the shards' write rates: a new meta leader starts both again (marking
//! later, never sooner) and plans from the replicated map, so a move cut
//! short by a leader change is finished or redone by the next round.

use std::collections::{BTreeMap, BTreeSet};

use fencelock_placement::{
    plan_load_leaders, plan_rebalance, plan_repair, plan_split, Action, ClusterView, LoadRule,
    NodeState, PlacementCommand, ShardLoad, META_SHARD_ID,
};

use crate::error::ControllerError;
use fencelock_api::internal::NodeStatus;

use crate::nodes::NodeApi;
use crate::ops::{view_of, Ops};
use crate::rates::RateTracker;
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
    /// Replica counts this far apart start a rebalance (at least 2).
    pub replica_spread: usize,
    /// Split a data shard holding this many locks (0: never).
    pub split_above_locks: u64,
    /// Split a data shard writing this many entries a second (0: never).
    pub split_above_writes_per_sec: u64,
    /// Leaderships move by load only off a node leading this much weight.
    pub load_min_weight: u64,
    /// ... and only when that lowers its weight by this many percent.
    pub load_gain_percent: u64,
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
            replica_spread: fencelock_placement::REBALANCE_REPLICA_SPREAD,
            split_above_locks: 0,
            split_above_writes_per_sec: 0,
            load_min_weight: fencelock_placement::DEFAULT_LOAD_MIN_WEIGHT,
            load_gain_percent: fencelock_placement::DEFAULT_LOAD_GAIN_PERCENT,
            max_moves: DEFAULT_MAX_MOVES_PER_ROUND,
        }
    }
}

/// What the controller remembers between rounds, and nothing else: since
/// when each node has been unreachable, and the shards' write rates. A new
/// meta leader starts from an empty one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Memory {
    pub down: DownTracker,
    pub rates: RateTracker,
}

impl Memory {
    pub fn forget(&mut self) {
        self.down.forget();
        self.rates.forget();
    }
}

/// The work one round chose.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Work {
    /// Nothing to do (or not allowed to: paused, or someone unreachable
    /// but not down yet).
    #[default]
    Nothing,
    /// Record in the map that these nodes are `Down` (unreachable for
    /// `node_down_after_ms`): from then on every meta leader replaces
    /// their replicas without waiting again.
    MarkDown(Vec<u64>),
    /// These `Down` nodes answer again and hold nothing: make them `Up`,
    /// empty nodes the balancer may fill.
    Return(Vec<u64>),
    /// Replace replicas on down nodes.
    Repair(Vec<Action>),
    /// Split this data shard in two.
    Split { shard_id: u64 },
    /// Even out the `UP` nodes.
    Balance(Vec<Action>),
}

impl Work {
    /// The kind, as logs, metrics and the audit log name it.
    pub fn kind(&self) -> &'static str {
        match self {
            Work::Nothing => "nothing",
            Work::MarkDown(_) => "mark_down",
            Work::Return(_) => "return",
            Work::Repair(_) => "repair",
            Work::Split { .. } => "split",
            Work::Balance(_) => "balance",
        }
    }

    /// How many steps the work has (a split is one).
    pub fn steps(&self) -> usize {
        match self {
            Work::Nothing => 0,
            Work::MarkDown(nodes) | Work::Return(nodes) => nodes.len(),
            Work::Repair(plan) | Work::Balance(plan) => plan.len(),
            Work::Split { .. } => 1,
        }
    }

    /// Step `i` in words, for logs, the audit log and the dry run.
    pub fn describe_step(&self, i: usize) -> Option<String> {
        let action = |a: &Action| match *a {
            Action::MoveReplica { shard_id, from, to } => {
                format!("move the replica of shard {shard_id} from node {from} to node {to}")
            }
            Action::TransferLeader { shard_id, to } => {
                format!("move the leadership of shard {shard_id} to node {to}")
            }
        };
        match self {
            Work::Nothing => None,
            Work::MarkDown(nodes) => nodes.get(i).map(|n| format!("mark node {n} DOWN")),
            Work::Return(nodes) => nodes.get(i).map(|n| format!("mark node {n} UP again")),
            Work::Repair(plan) | Work::Balance(plan) => plan.get(i).map(action),
            Work::Split { shard_id } => (i == 0).then(|| format!("split shard {shard_id}")),
        }
    }
}

/// Why a round chose its work, in words (logs, the audit log, the dry run).
pub fn reason(config: &ActConfig, work: &Work) -> String {
    match work {
        Work::Nothing => "nothing to do".into(),
        Work::MarkDown(_) => format!(
            "unreachable for controller.node_down_after_ms ({} ms)",
            config.node_down_after_ms
        ),
        Work::Return(_) => "a DOWN node answers again and holds no replica".into(),
        Work::Repair(_) => "replicas on DOWN nodes are replaced".into(),
        Work::Split { .. } => format!(
            "the busiest data shard holds controller.split_above_locks ({}) locks or more, \
             or writes controller.split_above_writes_per_sec ({}) entries a second or more",
            config.split_above_locks, config.split_above_writes_per_sec
        ),
        Work::Balance(_) => format!(
            "replica counts controller.balance_replica_spread ({}) or more apart, leaderships controller.balance_leader_spread ({}) or more, \
             or a leadership move lowering the heaviest node's load by controller.balance_load_gain_percent ({}%)",
            config.replica_spread,
            config.leader_spread,
            config.load_gain_percent,
        ),
    }
}

/// What one round saw and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Round {
    /// An operator paused the controller: the round did nothing.
    pub paused: bool,
    /// Members that did not answer and may matter (see
    /// [`unreachable_members`]).
    pub unreachable: BTreeSet<u64>,
    /// Nodes counted as down: unreachable for `node_down_after_ms`, or
    /// marked `Down` in the map.
    pub down: BTreeSet<u64>,
    /// The work chosen.
    pub work: Work,
    /// How many of its steps completed.
    pub done: usize,
    /// The round recorded that every member reads this placement format
    /// (`RaiseClusterFormat`).
    pub cluster_format_raised_to: Option<u32>,
}

/// Whether any shard of the view has a replica on `node_id`.
fn holds_replicas(view: &ClusterView, node_id: u64) -> bool {
    view.shards.values().any(|s| s.replicas.contains(&node_id))
}

/// Members that did not answer and may matter: every node the view marks
/// unreachable except those that hold no replica and take none (`Drained`
/// ones, and `Down` ones already emptied), so a stopped one does not hold
/// the rest of the cluster up.
pub fn unreachable_members(view: &ClusterView) -> BTreeSet<u64> {
    view.down
        .iter()
        .copied()
        .filter(|&n| match view.nodes.get(&n) {
            Some(NodeState::Drained) => false,
            Some(NodeState::Down) => holds_replicas(view, n),
            _ => true,
        })
        .collect()
}

/// The nodes a round counts as down: those unreachable for long enough
/// (`long_unreachable`) and those the map already says are `Down` — the
/// replicated verdict a new meta leader resumes from.
pub fn counted_down(view: &ClusterView, long_unreachable: &BTreeSet<u64>) -> BTreeSet<u64> {
    let declared = view
        .nodes
        .iter()
        .filter(|(_, &state)| state == NodeState::Down)
        .map(|(&n, _)| n);
    long_unreachable.iter().copied().chain(declared).collect()
}

/// The one kind of work a round does, from what it observed: `view` (its
/// `down` set the members that did not answer), `long_unreachable` (those
/// unreachable for `node_down_after_ms`), the data shards' `loads`,
/// whether a migration is open. In order: mark long-unreachable nodes
/// `Down`; return emptied `Down` nodes that answer; replace replicas on
/// `Down` nodes; wait while anyone else that matters is unreachable;
/// split; balance. Pure, so the order of priorities is unit-tested.
pub fn decide(
    config: &ActConfig,
    view: &ClusterView,
    long_unreachable: &BTreeSet<u64>,
    loads: &BTreeMap<u64, ShardLoad>,
    migration_open: bool,
) -> Work {
    let max_moves = config.max_moves.clamp(1, MAX_MOVES_PER_ROUND);
    if config.repair {
        let mark: Vec<u64> = long_unreachable
            .iter()
            .copied()
            .filter(|n| matches!(view.nodes.get(n), Some(NodeState::Up | NodeState::Draining)))
            .take(max_moves)
            .collect();
        if !mark.is_empty() {
            return Work::MarkDown(mark);
        }
        let down = counted_down(view, long_unreachable);
        let back: Vec<u64> = down
            .iter()
            .copied()
            .filter(|&n| {
                view.nodes.get(&n) == Some(&NodeState::Down)
                    && !view.down.contains(&n)
                    && !holds_replicas(view, n)
            })
            .take(max_moves)
            .collect();
        if !back.is_empty() {
            return Work::Return(back);
        }
        if down.iter().any(|&n| holds_replicas(view, n)) {
            // Replicas on `down` are replaced, even those of a `Down` node
            // answering again. A member unreachable for a short while is
            // no destination (planned as if draining) and its replicas
            // stay: it may be restarting.
            let mut repairing = view.clone();
            for n in view.down.difference(&down) {
                if let Some(state @ NodeState::Up) = repairing.nodes.get_mut(n) {
                    *state = NodeState::Draining;
                }
            }
            repairing.down = down;
            let plan = plan_repair(&repairing, max_moves);
            if !plan.is_empty() {
                return Work::Repair(plan);
            }
        }
    }
    if !unreachable_members(view).is_empty() {
        return Work::Nothing;
    }
    if !migration_open {
        if let Some(shard_id) = plan_split(
            loads,
            config.split_above_locks,
            config.split_above_writes_per_sec,
            view.shards.len(),
        ) {
            return Work::Split { shard_id };
        }
    }
    if config.balance {
        // Counts first; then the leaders' load, within the counts' bounds.
        let plan = plan_rebalance(view, max_moves, config.replica_spread, config.leader_spread);
        if !plan.is_empty() {
            return Work::Balance(plan);
        }
        let rule = LoadRule {
            leader_spread: config.leader_spread,
            min_weight: config.load_min_weight,
            gain_percent: config.load_gain_percent,
        };
        let plan = plan_load_leaders(view, loads, max_moves, &rule);
        if !plan.is_empty() {
            return Work::Balance(plan);
        }
    }
    Work::Nothing
}

/// The data shards' loads as their leaders report them, with the write
/// rates measured so far.
fn loads_of(
    statuses: &BTreeMap<u64, NodeStatus>,
    rates: &BTreeMap<u64, u64>,
) -> BTreeMap<u64, ShardLoad> {
    let mut loads = BTreeMap::new();
    for status in statuses.values() {
        for r in status.replicas.iter() {
            if r.is_leader && r.shard_id != META_SHARD_ID {
                let load = ShardLoad {
                    held_locks: r.held_locks,
                    owned_slots: r.owned_slots,
                    writes_per_sec: rates.get(&r.shard_id).copied().unwrap_or(0),
                };
                loads.insert(r.shard_id, load);
            }
        }
    }
    loads
}

/// Each data shard's applied index, from its leader.
fn applied_of(statuses: &BTreeMap<u64, NodeStatus>) -> BTreeMap<u64, u64> {
    statuses
        .values()
        .flat_map(|s| s.replicas.iter())
        .filter(|r| r.is_leader && r.shard_id != META_SHARD_ID)
        .map(|r| (r.shard_id, r.applied_index))
        .collect()
}

impl<N: NodeApi> Ops<N> {
    /// One round at `now_ms` (a monotonic clock's reading): observe once,
    /// update `memory`, [`decide`], carry the work out step by step. A
    /// failed step ends the round with the error (and what got done); the
    /// next round decides again from the map.
    pub async fn act_round(
        &self,
        memory: &mut Memory,
        now_ms: u64,
        config: &ActConfig,
    ) -> Result<Round, (Round, ControllerError)> {
        let mut round = Round::default();
        let (map, statuses) = match self.observe().await {
            Ok(observed) => observed,
            Err(e) => return Err((round, e)),
        };
        // Not a move, so also while paused: features of a newer format
        // turn on once every member reads it (`formats`).
        let reported = statuses
            .iter()
            .map(|(&node_id, s)| (node_id, s.placement_format))
            .collect();
        if let Some(format) = crate::formats::cluster_format_to_raise(&map, &reported) {
            if let Err(e) = self
                .propose_meta(PlacementCommand::RaiseClusterFormat { format })
                .await
            {
                return Err((round, e));
            }
            round.cluster_format_raised_to = Some(format);
        }
        if map.scheduler_paused() {
            // Observe nothing, so the clock starts again on resume: a node
            // is marked down no sooner than `node_down_after_ms` after it.
            memory.forget();
            round.paused = true;
            return Ok(round);
        }
        let view = view_of(&map, &statuses);
        round.unreachable = unreachable_members(&view);
        let long_unreachable =
            memory
                .down
                .observe(now_ms, &round.unreachable, config.node_down_after_ms);
        round.down = counted_down(&view, &long_unreachable);
        let rates = memory.rates.observe(now_ms, &applied_of(&statuses));
        round.work = decide(
            config,
            &view,
            &long_unreachable,
            &loads_of(&statuses, &rates),
            map.migration().is_some(),
        );
        let work = round.work.clone();
        let done = match &work {
            Work::Nothing => Ok(()),
            Work::MarkDown(nodes) => self.set_states(nodes, NodeState::Down, &mut round).await,
            Work::Return(nodes) => self.set_states(nodes, NodeState::Up, &mut round).await,
            Work::Split { shard_id } => self.split(*shard_id, 0).await.map(|_| round.done = 1),
            Work::Repair(plan) | Work::Balance(plan) => {
                let mut result = Ok(());
                for action in plan {
                    if let Err(e) = self.execute(vec![*action]).await {
                        result = Err(e);
                        break;
                    }
                    round.done += 1;
                }
                result
            }
        };
        match done {
            Ok(()) => Ok(round),
            Err(e) => Err((round, e)),
        }
    }

    async fn set_states(
        &self,
        nodes: &[u64],
        state: NodeState,
        round: &mut Round,
    ) -> Result<(), ControllerError> {
        for &node_id in nodes {
            self.propose_meta(PlacementCommand::SetNodeState { node_id, state })
                .await?;
            round.done += 1;
        }
        Ok(())
    }

    /// The dry run (`fencelock admin scheduler plan`): what a round would
    /// do now, carried out by no one. How long a node has been unreachable
    /// is known only to the meta leader's controller, so here only nodes
    /// the map marks `Down` count as down; the members unreachable right
    /// now come back in [`Round::unreachable`]. Write rates, too, are
    /// measured across rounds: the dry run weighs held locks only.
    /// Answers with the map version the plan was made from.
    pub async fn plan_round(&self, config: &ActConfig) -> Result<(Round, u64), ControllerError> {
        let (map, statuses) = self.observe().await?;
        let view = view_of(&map, &statuses);
        let mut round = Round {
            paused: map.scheduler_paused(),
            unreachable: unreachable_members(&view),
            down: counted_down(&view, &BTreeSet::new()),
            ..Round::default()
        };
        round.work = decide(
            config,
            &view,
            &BTreeSet::new(),
            &loads_of(&statuses, &BTreeMap::new()),
            map.migration().is_some(),
        );
        Ok((round, map.version()))
    }

    /// Pauses (`Some(true)`), resumes (`Some(false)`) or only reads
    /// (`None`) the controller's own moves; returns whether they are paused
    /// and the map version that says so.
    pub async fn scheduler(&self, pause: Option<bool>) -> Result<(bool, u64), ControllerError> {
        if let Some(paused) = pause {
            self.propose_meta(PlacementCommand::SetSchedulerPaused { paused })
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
            writes_per_sec: 0,
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
    fn an_unreachable_node_stops_everything_and_is_marked_down_after_the_bound() {
        let mut v = view();
        v.down = [2].into();
        let none = BTreeSet::new();
        assert_eq!(decide(&all_on(), &v, &none, &busy(), false), Work::Nothing);
        assert_eq!(
            decide(&all_on(), &v, &[2].into(), &busy(), false),
            Work::MarkDown(vec![2])
        );
        let off = ActConfig {
            repair: false,
            ..all_on()
        };
        assert_eq!(decide(&off, &v, &[2].into(), &busy(), false), Work::Nothing);
    }

    #[test]
    fn a_node_marked_down_in_the_map_is_repaired_without_waiting_again() {
        // A new meta leader: its clock knows nothing, the map says DOWN.
        let mut v = view();
        v.down = [2].into();
        v.nodes.insert(2, NodeState::Down);
        let Work::Repair(plan) = decide(&all_on(), &v, &BTreeSet::new(), &busy(), false) else {
            panic!("marked down: repair");
        };
        assert!(!plan.is_empty() && plan.len() <= DEFAULT_MAX_MOVES_PER_ROUND);
        for step in &plan {
            let Action::MoveReplica { from, to, .. } = *step else {
                panic!("repair moves replicas: {step:?}");
            };
            assert_eq!(from, 2);
            assert!(to == 4 || to == 5, "to a node without the shard: {step:?}");
        }
        // Answering again does not make it the voter it was.
        v.down.clear();
        assert!(matches!(
            decide(&all_on(), &v, &BTreeSet::new(), &busy(), false),
            Work::Repair(_)
        ));
    }

    #[test]
    fn an_emptied_down_node_that_answers_comes_back_up_and_one_that_does_not_holds_nothing_up() {
        let mut v = view();
        for shard in v.shards.values_mut() {
            shard.replicas = [1, 3, 4].into();
        }
        v.nodes.insert(2, NodeState::Down);
        v.down = [2].into();
        assert!(unreachable_members(&v).is_empty());
        assert_eq!(
            decide(&all_on(), &v, &BTreeSet::new(), &busy(), false),
            Work::Split { shard_id: 1 }
        );
        v.down.clear();
        assert_eq!(
            decide(&all_on(), &v, &BTreeSet::new(), &busy(), false),
            Work::Return(vec![2])
        );
    }

    #[test]
    fn a_node_unreachable_for_a_short_while_receives_no_repaired_replica() {
        let mut v = view();
        v.nodes.insert(2, NodeState::Down);
        v.down = [2, 4].into();
        let Work::Repair(plan) = decide(&all_on(), &v, &BTreeSet::new(), &busy(), false) else {
            panic!("marked down: repair");
        };
        assert!(plan
            .iter()
            .all(|a| matches!(a, Action::MoveReplica { from: 2, to: 5, .. })));
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
    fn a_shard_writing_over_the_rate_threshold_splits_and_balance_follows_load() {
        let v = view();
        let rate = ActConfig {
            split_above_writes_per_sec: 300,
            ..ActConfig::default()
        };
        let writing = |writes_per_sec| ShardLoad {
            owned_slots: 128,
            writes_per_sec,
            ..ShardLoad::default()
        };
        let loads: BTreeMap<u64, ShardLoad> = [(1, writing(100)), (2, writing(400))].into();
        let none = BTreeSet::new();
        assert_eq!(
            decide(&rate, &v, &none, &loads, false),
            Work::Split { shard_id: 2 }
        );
        // Three even nodes, node 1 leading two busy shards: with balance on
        // and no split threshold, one leadership moves off node 1.
        let mut even = view();
        even.nodes.retain(|n, _| *n <= 3);
        for (id, shard) in even.shards.iter_mut() {
            shard.leader = Some(1 + (*id % 3));
        }
        let busy: BTreeMap<u64, ShardLoad> = [(0, writing(500)), (3, writing(500))].into();
        let balance = ActConfig {
            balance: true,
            ..ActConfig::default()
        };
        let Work::Balance(plan) = decide(&balance, &even, &none, &busy, false) else {
            panic!("node 1 leads both busy shards: a load move");
        };
        assert!(matches!(plan[..], [Action::TransferLeader { shard_id: 0 | 3, to }] if to != 1));
        let strict = ActConfig {
            load_min_weight: 2_000,
            ..balance
        };
        assert_eq!(decide(&strict, &even, &none, &busy, false), Work::Nothing);
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

    /// A small seeded generator: the test's cases are the same every run.
    struct Lcg(u64);
    impl Lcg {
        fn below(&mut self, n: u64) -> u64 {
            self.0 = self
                .0
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (self.0 >> 33) % n.max(1)
        }
    }

    /// 3–7 nodes (some drained, some unreachable), 1–10 shards of three
    /// replicas on nodes that are not drained, a leader each.
    fn random_view(rng: &mut Lcg) -> ClusterView {
        let n = 3 + rng.below(5);
        let mut nodes = BTreeMap::new();
        for id in 1..=n {
            let state = if id > 3 && rng.below(6) == 0 {
                NodeState::Drained
            } else {
                NodeState::Up
            };
            nodes.insert(id, state);
        }
        let holders: Vec<u64> = nodes
            .iter()
            .filter(|(_, s)| **s != NodeState::Drained)
            .map(|(id, _)| *id)
            .collect();
        let mut shards = BTreeMap::new();
        for id in 0..(1 + rng.below(10)) {
            let mut replicas = BTreeSet::new();
            while replicas.len() < 3.min(holders.len()) {
                replicas.insert(holders[rng.below(holders.len() as u64) as usize]);
            }
            let leader = replicas.iter().nth(rng.below(3) as usize).copied();
            shards.insert(id, fencelock_placement::ShardView { replicas, leader });
        }
        let down = (1..=n).filter(|_| rng.below(4) == 0).collect();
        ClusterView {
            nodes,
            down,
            shards,
            replication_factor: 3,
        }
    }

    /// Replicas of `shard` on nodes that answer.
    fn live(view: &ClusterView, shard: u64) -> usize {
        view.shards[&shard]
            .replicas
            .iter()
            .filter(|n| !view.down.contains(n))
            .count()
    }

    /// Rounds of `decide` applied to a view (every unreachable node counted
    /// as down for long enough, the worst case): each round's work stays
    /// within `max_moves`, every move is one the planner's own checks
    /// accept, no step lowers a shard's count of answering replicas, a
    /// shard without an answering majority is never touched, and the
    /// rounds reach a fixed point where no answering node holds the
    /// cluster up and no shard with a majority keeps a replica on a down
    /// node while an accepting node is free for it.
    #[test]
    fn controller_rounds_are_bounded_safe_and_reach_a_fixed_point() {
        let mut rng = Lcg(0x00f3_9c1d);
        for case in 0..400 {
            let config = ActConfig {
                balance: rng.below(2) == 0,
                max_moves: 1 + rng.below(4) as usize,
                ..ActConfig::default()
            };
            let start = random_view(&mut rng);
            let mut view = start.clone();
            let mut rounds = 0;
            loop {
                let long = view.down.clone();
                let work = decide(&config, &view, &long, &BTreeMap::new(), false);
                assert!(work.steps() <= config.max_moves, "case {case}: {work:?}");
                match &work {
                    Work::Nothing => break,
                    Work::MarkDown(nodes) => {
                        for n in nodes {
                            assert!(view.down.contains(n), "case {case}: marks answering {n}");
                            view.nodes.insert(*n, NodeState::Down);
                        }
                    }
                    Work::Return(nodes) => {
                        for n in nodes {
                            assert!(!view.down.contains(n), "case {case}: returns silent {n}");
                            view.nodes.insert(*n, NodeState::Up);
                        }
                    }
                    Work::Split { .. } => panic!("case {case}: splits are off"),
                    Work::Repair(plan) | Work::Balance(plan) => {
                        for action in plan {
                            let shard = match *action {
                                Action::MoveReplica { shard_id, .. }
                                | Action::TransferLeader { shard_id, .. } => shard_id,
                            };
                            let before = live(&view, shard);
                            assert!(
                                before * 2 > view.shards[&shard].replicas.len(),
                                "case {case}: {action:?} on a shard without a majority"
                            );
                            view = fencelock_placement::simulate(&view, action)
                                .unwrap_or_else(|e| panic!("case {case}: {action:?}: {e}"));
                            assert!(live(&view, shard) >= before, "case {case}: {action:?}");
                        }
                    }
                }
                rounds += 1;
                assert!(rounds < 200, "case {case}: no fixed point from {start:?}");
            }
            for (&id, shard) in &view.shards {
                if live(&view, id) * 2 <= shard.replicas.len() {
                    continue;
                }
                let stuck = shard
                    .replicas
                    .iter()
                    .any(|n| view.down.contains(n) || view.nodes[n] == NodeState::Down);
                let room = view
                    .nodes
                    .keys()
                    .any(|&n| view.accepts(n) && !shard.replicas.contains(&n));
                assert!(
                    !(stuck && room),
                    "case {case}: shard {id} left on a down node"
                );
            }
        }
    }
}
