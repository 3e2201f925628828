//! Balance by itself: when every node answers and nothing is paused, the
//! meta leader evens out replicas and leaderships over the `UP` nodes — a
//! node added to the cluster fills up without `admin balance`.
//!
//! The plan is [`plan_rebalance`]'s: nothing until the replica counts
//! differ by [`REBALANCE_REPLICA_SPREAD`] or the leadership counts by
//! `leader_spread`, then at most `max_moves` steps of the same plan
//! `admin balance` carries out. That plan ends within one of even, below
//! both thresholds, so the cluster settles instead of chasing every
//! election (hysteresis). A round with any node unreachable does nothing:
//! repair comes first, and a restarting node is not emptied.
//!
//! [`REBALANCE_REPLICA_SPREAD`]: fencelock_placement::REBALANCE_REPLICA_SPREAD

use fencelock_placement::{plan_rebalance, Action};

use crate::error::ControllerError;
use crate::nodes::NodeApi;
use crate::ops::Ops;

/// Default leadership spread (max − min over `UP` nodes) that starts a
/// rebalance: above the one or two an election moves.
pub const DEFAULT_LEADER_SPREAD: usize = 3;

/// The balancing rule's knobs (the server's `[controller]` section).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BalanceConfig {
    /// At most this many steps (replica moves or leader transfers) a round.
    pub max_moves: usize,
    /// Leadership counts this far apart start a rebalance (at least 2).
    pub leader_spread: usize,
}

/// What one balance round did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BalanceRound {
    /// The steps planned.
    pub planned: Vec<Action>,
    /// How many of them completed.
    pub done: usize,
}

impl<N: NodeApi> Ops<N> {
    /// One balance round: plan with hysteresis and carry the plan out step
    /// by step. Nothing while paused or while any node is unreachable. A
    /// failed step ends the round with the error; the next round plans
    /// again.
    pub async fn balance_round(
        &self,
        config: &BalanceConfig,
    ) -> Result<BalanceRound, (BalanceRound, ControllerError)> {
        let mut round = BalanceRound::default();
        match self.fresh_map().await {
            Ok(map) if map.scheduler_paused() => return Ok(round),
            Ok(_) => {}
            Err(e) => return Err((round, e)),
        }
        let view = match self.view().await {
            Ok(view) => view,
            Err(e) => return Err((round, e)),
        };
        if !view.down.is_empty() {
            return Ok(round);
        }
        round.planned = plan_rebalance(&view, config.max_moves, config.leader_spread);
        for action in round.planned.clone() {
            match self.execute(vec![action]).await {
                Ok(_) => round.done += 1,
                Err(e) => return Err((round, e)),
            }
        }
        Ok(round)
    }
}
