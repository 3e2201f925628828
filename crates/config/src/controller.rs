//! The `[controller]` section: what the placement controller does by
//! itself. May differ between nodes; the meta shard's leader uses its own.

use serde::{Deserialize, Serialize};

use fencelock_controller::act::{
    ActConfig, DEFAULT_LEADER_SPREAD, DEFAULT_MAX_MOVES_PER_ROUND, DEFAULT_NODE_DOWN_AFTER_MS,
    MAX_MOVES_PER_ROUND,
};

use super::{check_range, ConfigError};

/// Shortest `controller.node_down_after_ms`: below it a node restart (or
/// one slow health check) would already move replicas.
pub const MIN_NODE_DOWN_AFTER_MS: u64 = 1_000;
/// Longest `controller.node_down_after_ms` (a day).
pub const MAX_NODE_DOWN_AFTER_MS: u64 = 86_400_000;

/// The `[controller]` section.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ControllerConfig {
    /// Replace the replicas of a node that stays unreachable for
    /// `node_down_after_ms` (default true). Off, only operators move
    /// replicas (`fencelock admin drain`).
    pub repair: bool,
    /// How long a node must stay unreachable before its replicas are
    /// replaced, 1000..=86400000 ms (default 300000).
    pub node_down_after_ms: u64,
    /// Replica moves (and, balancing, leader transfers) per round, one
    /// after another, 1..=16 (default 2).
    pub max_moves_per_round: usize,
    /// Even out replicas and leaderships over the `UP` nodes by itself when
    /// every node answers (default false: `fencelock admin balance`).
    pub balance: bool,
    /// Leadership counts this far apart (max − min) start a rebalance,
    /// 2..=64 (default 3).
    pub balance_leader_spread: usize,
    /// Replica counts this far apart (max − min) start a rebalance,
    /// 2..=64 (default 2).
    pub balance_replica_spread: usize,
    /// Split a data shard by itself once it holds this many locks (the
    /// busiest first, one split at a time), 0..=1000000000; 0 (default)
    /// never splits.
    pub split_above_locks: u64,
    /// Split a data shard by itself once it writes this many Raft entries
    /// a second (measured over 5 s), 0..=1000000; 0 (default) never.
    pub split_above_writes_per_sec: u64,
    /// With `balance`: a leadership moves by load only off a node leading
    /// at least this weight (writes a second + held locks / 100),
    /// 1..=1000000 (default 50).
    pub balance_load_min_writes_per_sec: u64,
    /// ... and only when the move lowers that node's weight by at least
    /// this many percent, 1..=100 (default 25).
    pub balance_load_gain_percent: u64,
}

/// Largest `controller.split_above_writes_per_sec` and
/// `controller.balance_load_min_writes_per_sec`.
pub const MAX_WRITES_PER_SEC: u64 = 1_000_000;

/// Largest `controller.split_above_locks`.
pub const MAX_SPLIT_ABOVE_LOCKS: u64 = 1_000_000_000;

/// Largest `controller.balance_leader_spread` and
/// `controller.balance_replica_spread`.
pub const MAX_BALANCE_LEADER_SPREAD: usize = 64;

impl Default for ControllerConfig {
    fn default() -> Self {
        ControllerConfig {
            repair: true,
            node_down_after_ms: DEFAULT_NODE_DOWN_AFTER_MS,
            max_moves_per_round: DEFAULT_MAX_MOVES_PER_ROUND,
            balance: false,
            balance_leader_spread: DEFAULT_LEADER_SPREAD,
            balance_replica_spread: fencelock_placement::REBALANCE_REPLICA_SPREAD,
            split_above_locks: 0,
            split_above_writes_per_sec: 0,
            balance_load_min_writes_per_sec: fencelock_placement::DEFAULT_LOAD_MIN_WEIGHT,
            balance_load_gain_percent: fencelock_placement::DEFAULT_LOAD_GAIN_PERCENT,
        }
    }
}

impl ControllerConfig {
    /// What the controller does by itself, for its rounds.
    pub fn act_config(&self) -> ActConfig {
        ActConfig {
            repair: self.repair,
            node_down_after_ms: self.node_down_after_ms,
            balance: self.balance,
            leader_spread: self.balance_leader_spread,
            replica_spread: self.balance_replica_spread,
            split_above_locks: self.split_above_locks,
            split_above_writes_per_sec: self.split_above_writes_per_sec,
            load_min_weight: self.balance_load_min_writes_per_sec,
            load_gain_percent: self.balance_load_gain_percent,
            max_moves: self.max_moves_per_round,
        }
    }

    /// Whether the controller does anything by itself.
    pub fn acts(&self) -> bool {
        self.repair
            || self.balance
            || self.split_above_locks > 0
            || self.split_above_writes_per_sec > 0
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        check_range(
            "controller.node_down_after_ms",
            self.node_down_after_ms,
            MIN_NODE_DOWN_AFTER_MS,
            MAX_NODE_DOWN_AFTER_MS,
        )?;
        check_range(
            "controller.max_moves_per_round",
            self.max_moves_per_round,
            1,
            MAX_MOVES_PER_ROUND,
        )?;
        check_range(
            "controller.balance_leader_spread",
            self.balance_leader_spread,
            2,
            MAX_BALANCE_LEADER_SPREAD,
        )?;
        check_range(
            "controller.balance_replica_spread",
            self.balance_replica_spread,
            2,
            MAX_BALANCE_LEADER_SPREAD,
        )?;
        check_range(
            "controller.split_above_locks",
            self.split_above_locks,
            0,
            MAX_SPLIT_ABOVE_LOCKS,
        )?;
        check_range(
            "controller.split_above_writes_per_sec",
            self.split_above_writes_per_sec,
            0,
            MAX_WRITES_PER_SEC,
        )?;
        check_range(
            "controller.balance_load_min_writes_per_sec",
            self.balance_load_min_writes_per_sec,
            1,
            MAX_WRITES_PER_SEC,
        )?;
        check_range(
            "controller.balance_load_gain_percent",
            self.balance_load_gain_percent,
            1,
            100,
        )
    }
}
