//! The controller's own rounds, as this node made them while leading the
//! meta shard (crates/controller/src/act.rs): repair moves, balance steps
//! and splits by outcome, and the node states it recorded.

use prometheus::{IntCounter, IntGauge, Registry};

use super::gauge;
use crate::store::metrics::counter_vec;

/// The controller's own rounds (crates/controller/src/act.rs).
#[derive(Clone)]
pub struct ControllerMetrics {
    /// Repair moves, balance steps and splits begun (each ends done or
    /// failed).
    pub moves_started: IntCounter,
    pub balance_started: IntCounter,
    pub splits_started: IntCounter,
    /// Repair moves that completed.
    pub moves_done: IntCounter,
    /// Repair moves that failed (the next round plans again).
    pub moves_failed: IntCounter,
    /// Balance steps (replica moves, leader transfers) that completed.
    pub balance_done: IntCounter,
    /// Balance steps that failed (the next round plans again).
    pub balance_failed: IntCounter,
    /// Shards split by load that completed.
    pub splits_done: IntCounter,
    /// Splits by load that failed (the next round chooses again).
    pub splits_failed: IntCounter,
    /// Nodes the controller marked `DOWN` in the map.
    pub marked_down: IntCounter,
    /// `DOWN` nodes the controller made `UP` again (emptied, answering).
    pub returned_up: IntCounter,
    /// Nodes counted as down (unreachable for at least
    /// `controller.node_down_after_ms`, or marked `DOWN`), as of the last
    /// round (0 when this node does not lead the meta shard).
    pub nodes_down: IntGauge,
}

impl ControllerMetrics {
    /// Registers the controller families in `r`.
    pub(super) fn register(r: &Registry) -> ControllerMetrics {
        let repair_moves = counter_vec(
            r,
            "fencelock_controller_repair_moves_total",
            "Replica moves the controller made by itself to replace replicas on down nodes, by outcome: started, done, failed.",
            &["outcome"],
        );
        let balance_steps = counter_vec(
            r,
            "fencelock_controller_balance_steps_total",
            "Replica moves and leader transfers the controller made by itself to even out the UP nodes (controller.balance), by outcome: started, done, failed.",
            &["outcome"],
        );
        let splits = counter_vec(
            r,
            "fencelock_controller_splits_total",
            "Data shards the controller split by itself for holding controller.split_above_locks locks or writing controller.split_above_writes_per_sec, by outcome: started, done, failed.",
            &["outcome"],
        );
        let marks = counter_vec(
            r,
            "fencelock_controller_node_marks_total",
            "Node states the controller recorded by itself, by state: down (unreachable for controller.node_down_after_ms), up (a DOWN node answering again with no replica left).",
            &["state"],
        );
        ControllerMetrics {
            moves_started: repair_moves.with_label_values(&["started"]),
            balance_started: balance_steps.with_label_values(&["started"]),
            splits_started: splits.with_label_values(&["started"]),
            marked_down: marks.with_label_values(&["down"]),
            returned_up: marks.with_label_values(&["up"]),
            splits_done: splits.with_label_values(&["done"]),
            splits_failed: splits.with_label_values(&["failed"]),
            moves_done: repair_moves.with_label_values(&["done"]),
            moves_failed: repair_moves.with_label_values(&["failed"]),
            balance_done: balance_steps.with_label_values(&["done"]),
            balance_failed: balance_steps.with_label_values(&["failed"]),
            nodes_down: gauge(
                r,
                "fencelock_controller_nodes_down",
                "Nodes the controller counts as down (unreachable for controller.node_down_after_ms, or marked DOWN); reported by the meta shard's leader, 0 elsewhere.",
            ),
        }
    }
}
