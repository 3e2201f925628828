//! The cluster as the admin API reports it, shaped for the status page and
//! `/status.json`: the same numbers as `fencelock admin nodes|shards|hot`.

use fencelock_api::v1::{
    HotResourcesResponse, ListNodesResponse, ListShardsResponse, NodeState, ReplicaRole,
};
use serde::Serialize;

#[derive(Clone, Debug, Serialize)]
pub struct ClusterView {
    pub served_by: u64,
    /// Running without TLS: the page shows a warning banner.
    pub insecure: bool,
    pub generated_at_ms: u64,
    pub map_version: u64,
    /// The migration in progress (0 = none).
    pub migration_id: u64,
    /// Nodes that did not answer the listing in time.
    pub unreachable_node_ids: Vec<u64>,
    pub totals: Totals,
    pub nodes: Vec<NodeRow>,
    pub shards: Vec<ShardRow>,
    pub hot: Vec<HotRow>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Totals {
    pub held_locks: u64,
    pub waiters: u64,
    pub shards: usize,
    pub nodes: usize,
}

#[derive(Clone, Debug, Serialize)]
pub struct NodeRow {
    pub node_id: u64,
    pub address: String,
    /// `up`, `down`, `draining`, `drained` or `unknown`.
    pub state: &'static str,
    pub replicas: u32,
    pub leaders: u32,
}

#[derive(Clone, Debug, Serialize)]
pub struct ShardRow {
    pub shard_id: u64,
    pub epoch: u64,
    /// 0 = no known leader.
    pub leader: u64,
    pub replicas: Vec<ReplicaRow>,
    /// `start-end` slot ranges.
    pub slots: Vec<String>,
    pub held_locks: u64,
    pub waiters: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct ReplicaRow {
    pub node_id: u64,
    /// `voter` or `learner`.
    pub role: &'static str,
    /// 0 when its node did not answer.
    pub applied_index: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct HotRow {
    pub resource: String,
    pub shard_id: u64,
    pub acquires: u64,
    pub contended: u64,
}

pub fn node_state_name(state: i32) -> &'static str {
    match NodeState::try_from(state).unwrap_or(NodeState::Unspecified) {
        NodeState::Up => "up",
        NodeState::Down => "down",
        NodeState::Draining => "draining",
        NodeState::Drained => "drained",
        NodeState::Unspecified => "unknown",
    }
}

/// Who answers and when, besides the admin API's three answers.
pub struct Served {
    pub by_node: u64,
    pub insecure: bool,
    pub at_ms: u64,
}

impl ClusterView {
    pub fn from_admin(
        served: Served,
        nodes: &ListNodesResponse,
        shards: &ListShardsResponse,
        hot: &HotResourcesResponse,
    ) -> ClusterView {
        let nodes: Vec<NodeRow> = nodes
            .nodes
            .iter()
            .map(|n| NodeRow {
                node_id: n.node_id,
                address: n.address.clone(),
                state: node_state_name(n.state),
                replicas: n.replica_count,
                leaders: n.leader_count,
            })
            .collect();
        let shard_rows: Vec<ShardRow> = shards
            .shards
            .iter()
            .map(|s| ShardRow {
                shard_id: s.shard_id,
                epoch: s.epoch,
                leader: s.leader_node_id,
                replicas: s
                    .replicas
                    .iter()
                    .map(|r| ReplicaRow {
                        node_id: r.node_id,
                        role: match ReplicaRole::try_from(r.role) {
                            Ok(ReplicaRole::Learner) => "learner",
                            _ => "voter",
                        },
                        applied_index: r.applied_index,
                    })
                    .collect(),
                slots: s
                    .slot_ranges
                    .iter()
                    .map(|r| format!("{}-{}", r.start, r.end))
                    .collect(),
                held_locks: s.held_locks,
                waiters: s.waiters,
            })
            .collect();
        let hot = hot
            .resources
            .iter()
            .map(|h| HotRow {
                resource: h.resource.clone(),
                shard_id: h.shard_id,
                acquires: h.acquires,
                contended: h.contended,
            })
            .collect();
        ClusterView {
            served_by: served.by_node,
            insecure: served.insecure,
            generated_at_ms: served.at_ms,
            map_version: shards.map_version,
            migration_id: shards.migration_id,
            unreachable_node_ids: shards.unreachable_node_ids.clone(),
            totals: Totals {
                held_locks: shard_rows.iter().map(|s| s.held_locks).sum(),
                waiters: shard_rows.iter().map(|s| s.waiters).sum(),
                shards: shard_rows.len(),
                nodes: nodes.len(),
            },
            nodes,
            shards: shard_rows,
            hot,
        }
    }
}
