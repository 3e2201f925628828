//! The observed cluster as the planner sees it, the actions it can take, and
//! [`simulate`], which applies one action to a view or refuses it.
//!
//! A view joins the intent (node states and replica sets from the
//! [`PlacementMap`]) with what the server observed (current leaders, nodes
//! that do not answer). It is plain data: the server builds one, the planner
//! reads it, and nothing here is replicated.

use std::collections::{BTreeMap, BTreeSet};

use crate::error::PlacementError;
use crate::limits::{MAX_NODES, MAX_REPLICAS_PER_SHARD, MAX_REPLICATION_FACTOR, MAX_SHARDS};
use crate::map::PlacementMap;
use crate::types::NodeState;

/// One shard as observed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardView {
    /// Node ids of the shard's voters.
    pub replicas: BTreeSet<u64>,
    /// The leader last reported, if it is one of the replicas.
    pub leader: Option<u64>,
}

/// The cluster as observed: the input of every plan.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ClusterView {
    /// Declared state of every node.
    pub nodes: BTreeMap<u64, NodeState>,
    /// Nodes observed unreachable. Down is an observation, not a declared
    /// state: such a node receives nothing and its replicas do not count as
    /// live, whatever its declared state.
    pub down: BTreeSet<u64>,
    pub shards: BTreeMap<u64, ShardView>,
    pub replication_factor: usize,
}

/// One step of a plan, executed by the server against the shard's Raft group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Action {
    /// Add `to` as a learner, let it catch up, promote it, move leadership
    /// away if `from` leads (to `to`), then remove `from`. The voter count
    /// never drops below its current value on the way.
    MoveReplica { shard_id: u64, from: u64, to: u64 },
    /// Ask the shard's leader to hand leadership to the replica `to`.
    TransferLeader { shard_id: u64, to: u64 },
}

impl ClusterView {
    /// A view of `map` with the observed `leaders` (shard id → node id).
    /// A reported leader that is not a replica in the map is stale news and
    /// is dropped. No node is marked down; set [`ClusterView::down`] from
    /// the server's health checks.
    pub fn from_map(map: &PlacementMap, leaders: &BTreeMap<u64, u64>) -> ClusterView {
        ClusterView {
            nodes: map.nodes().map(|n| (n.node_id, n.state)).collect(),
            down: BTreeSet::new(),
            shards: map
                .shards()
                .map(|s| {
                    let leader = leaders
                        .get(&s.shard_id)
                        .copied()
                        .filter(|l| s.replicas.contains(l));
                    let view = ShardView {
                        replicas: s.replicas.clone(),
                        leader,
                    };
                    (s.shard_id, view)
                })
                .collect(),
            replication_factor: map.replication_factor(),
        }
    }

    /// Whether the node may receive replicas and leaderships: declared `Up`
    /// and not observed down.
    pub fn accepts(&self, node_id: u64) -> bool {
        self.nodes.get(&node_id) == Some(&NodeState::Up) && !self.down.contains(&node_id)
    }

    /// Replicas a shard needs on accepting nodes to keep a majority of its
    /// replication factor.
    pub fn majority(&self) -> usize {
        self.replication_factor / 2 + 1
    }

    /// Replicas of `shard_id` on accepting nodes (0 for an unknown shard).
    pub fn live_replicas(&self, shard_id: u64) -> usize {
        self.shards.get(&shard_id).map_or(0, |s| {
            s.replicas.iter().filter(|&&n| self.accepts(n)).count()
        })
    }

    /// Replicas held by every accepting node (zero included).
    pub fn replica_counts(&self) -> BTreeMap<u64, usize> {
        let mut counts = self.accepting_nodes();
        for shard in self.shards.values() {
            for node in &shard.replicas {
                if let Some(c) = counts.get_mut(node) {
                    *c += 1;
                }
            }
        }
        counts
    }

    /// Leaderships held by every accepting node (zero included).
    pub fn leader_counts(&self) -> BTreeMap<u64, usize> {
        let mut counts = self.accepting_nodes();
        for leader in self.shards.values().filter_map(|s| s.leader) {
            if let Some(c) = counts.get_mut(&leader) {
                *c += 1;
            }
        }
        counts
    }

    fn accepting_nodes(&self) -> BTreeMap<u64, usize> {
        self.nodes
            .keys()
            .filter(|&&n| self.accepts(n))
            .map(|&n| (n, 0))
            .collect()
    }

    /// Checks that the view is within the limits and consistent: replicas
    /// and down nodes are known nodes, leaders are replicas. Plans are only
    /// made for views that pass.
    pub fn validate(&self) -> Result<(), PlacementError> {
        let bad = |reason: String| Err(PlacementError::InvalidView { reason });
        if !(1..=MAX_REPLICATION_FACTOR).contains(&self.replication_factor) {
            return bad(format!("replication factor {}", self.replication_factor));
        }
        if self.nodes.len() > MAX_NODES || self.shards.len() > MAX_SHARDS {
            return bad(format!(
                "{} nodes and {} shards exceed the limits",
                self.nodes.len(),
                self.shards.len()
            ));
        }
        if self.nodes.contains_key(&0) {
            return bad("node id 0".into());
        }
        if let Some(n) = self.down.iter().find(|n| !self.nodes.contains_key(n)) {
            return bad(format!("unknown node {n} marked down"));
        }
        for (id, shard) in &self.shards {
            if shard.replicas.is_empty() || shard.replicas.len() > MAX_REPLICAS_PER_SHARD {
                return bad(format!("shard {id} has {} replicas", shard.replicas.len()));
            }
            if let Some(n) = shard.replicas.iter().find(|n| !self.nodes.contains_key(n)) {
                return bad(format!("shard {id} on unknown node {n}"));
            }
            if let Some(leader) = shard.leader.filter(|l| !shard.replicas.contains(l)) {
                return bad(format!("shard {id} led by non-replica {leader}"));
            }
        }
        Ok(())
    }
}

/// The view after `action`, or why the action is unsafe: a replica may only
/// go to an accepting node that does not hold the shard yet, and leadership
/// only to an accepting replica.
pub fn simulate(view: &ClusterView, action: &Action) -> Result<ClusterView, PlacementError> {
    let mut next = view.clone();
    apply_action(&mut next, action)?;
    Ok(next)
}

/// [`simulate`] in place: checks everything first, so a refusal leaves the
/// view untouched.
pub(crate) fn apply_action(view: &mut ClusterView, action: &Action) -> Result<(), PlacementError> {
    match *action {
        Action::MoveReplica { shard_id, from, to } => {
            let shard = view
                .shards
                .get(&shard_id)
                .ok_or(PlacementError::UnknownShard { shard_id })?;
            if !shard.replicas.contains(&from) {
                return Err(PlacementError::NotAReplica {
                    shard_id,
                    node_id: from,
                });
            }
            if shard.replicas.contains(&to) {
                return Err(PlacementError::AlreadyAReplica {
                    shard_id,
                    node_id: to,
                });
            }
            check_receiver(view, to)?;
            let live_before = view.live_replicas(shard_id);
            if let Some(shard) = view.shards.get_mut(&shard_id) {
                shard.replicas.remove(&from);
                shard.replicas.insert(to);
                if shard.leader == Some(from) {
                    // The executor hands leadership to the new, caught-up
                    // replica before removing the old one.
                    shard.leader = Some(to);
                }
            }
            // The majority rule holds by construction: the move adds an
            // accepting replica for at most one it takes away.
            debug_assert!(view.live_replicas(shard_id) >= live_before);
            Ok(())
        }
        Action::TransferLeader { shard_id, to } => {
            let shard = view
                .shards
                .get(&shard_id)
                .ok_or(PlacementError::UnknownShard { shard_id })?;
            let leader = shard.leader.ok_or(PlacementError::NoLeader { shard_id })?;
            if leader == to {
                return Err(PlacementError::AlreadyLeader {
                    shard_id,
                    node_id: to,
                });
            }
            if !shard.replicas.contains(&to) {
                return Err(PlacementError::NotAReplica {
                    shard_id,
                    node_id: to,
                });
            }
            check_receiver(view, to)?;
            if let Some(shard) = view.shards.get_mut(&shard_id) {
                shard.leader = Some(to);
            }
            Ok(())
        }
    }
}

fn check_receiver(view: &ClusterView, node_id: u64) -> Result<(), PlacementError> {
    let state = *view
        .nodes
        .get(&node_id)
        .ok_or(PlacementError::UnknownNode { node_id })?;
    if state != NodeState::Up {
        return Err(PlacementError::NodeNotUp { node_id, state });
    }
    if view.down.contains(&node_id) {
        return Err(PlacementError::NodeDown { node_id });
    }
    Ok(())
}
