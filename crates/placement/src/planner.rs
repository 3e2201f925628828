//! What to move where: pure functions from an observed [`ClusterView`] to a
//! list of [`Action`]s.
//!
//! Every plan is built by applying its own actions to a working copy of the
//! view with the same checks as [`simulate`], so each emitted action is one
//! `simulate` accepts in sequence. Plans are deterministic (ties go to the
//! lowest id) and hold at most [`MAX_ACTIONS_PER_PLAN`] actions. Executing a
//! plan and planning again on the result yields nothing, unless the plan was
//! cut at the bound; then planning again continues the work.

use std::cmp::Reverse;
use std::collections::{BTreeMap, VecDeque};

pub use crate::view::{simulate, Action, ClusterView, ShardView};

use crate::error::PlacementError;
use crate::limits::MAX_ACTIONS_PER_PLAN;
use crate::types::NodeState;
use crate::view::apply_action;

/// Evens out the cluster among accepting nodes (`Up` and not down): first
/// replicas per node to within one of each other, then leaderships per node
/// to within one where leadership transfers can get there. Replicas on other
/// nodes stay where they are: moving them off is [`plan_drain`]'s job.
/// An invalid view (see [`ClusterView::validate`]) gets an empty plan.
pub fn plan_balance(view: &ClusterView) -> Vec<Action> {
    if view.validate().is_err() {
        return Vec::new();
    }
    let mut work = view.clone();
    let mut plan = Vec::new();
    if balance_replicas(&mut work, &mut plan) {
        balance_leaders(&mut work, &mut plan);
    }
    plan
}

/// Moves every replica (the meta shard's included) and every leadership off
/// `node_id`, each to the least-loaded accepting node that does not hold the
/// shard yet. Leaderships move first: a transfer is cheap and takes load off
/// the node at once, data moves follow.
///
/// All or nothing: if any shard has no possible destination the whole drain
/// is refused. Mark the node `Draining` in the map first, or the next
/// balance plan will fill it again.
pub fn plan_drain(view: &ClusterView, node_id: u64) -> Result<Vec<Action>, PlacementError> {
    view.validate()?;
    let mut work = view.clone();
    match work.nodes.get_mut(&node_id) {
        None => return Err(PlacementError::UnknownNode { node_id }),
        // Planning as if it were already draining keeps it from being
        // chosen as a destination.
        Some(state) if *state == NodeState::Up => *state = NodeState::Draining,
        Some(_) => {}
    }
    let up_nodes = work.replica_counts().len();
    for (&shard_id, shard) in &work.shards {
        if shard.replicas.contains(&node_id)
            && !work
                .nodes
                .keys()
                .any(|&n| work.accepts(n) && !shard.replicas.contains(&n))
        {
            return Err(PlacementError::CannotDrain {
                node_id,
                shard_id,
                up_nodes,
            });
        }
    }

    let mut plan = Vec::new();
    let led: Vec<u64> = shard_ids(&work, |s| s.leader == Some(node_id));
    for shard_id in led {
        let counts = work.leader_counts();
        let to = work.shards[&shard_id]
            .replicas
            .iter()
            .filter_map(|n| counts.get(n).map(|&c| (c, *n)))
            .min()
            .map(|(_, n)| n);
        // No accepting replica to take over: the replica move below hands
        // leadership to the new replica instead.
        if let Some(to) = to {
            push(
                &mut work,
                &mut plan,
                Action::TransferLeader { shard_id, to },
            );
        }
    }
    let held: Vec<u64> = shard_ids(&work, |s| s.replicas.contains(&node_id));
    for shard_id in held {
        let Some(to) = new_home(&work, shard_id) else {
            // Checked for every shard above; other shards' moves do not
            // change who is accepting.
            debug_assert!(false, "drain destination vanished");
            continue;
        };
        push(
            &mut work,
            &mut plan,
            Action::MoveReplica {
                shard_id,
                from: node_id,
                to,
            },
        );
    }
    // One transfer and one move per shard at most, which the bound allows.
    debug_assert!(work
        .shards
        .values()
        .all(|s| !s.replicas.contains(&node_id) && s.leader != Some(node_id)));
    Ok(plan)
}

/// Replaces replicas on nodes observed down: each becomes a replica on the
/// least-loaded accepting node that does not hold the shard yet (lowest id
/// on ties), lowest shard id first, at most `max_moves` moves (and never
/// more than [`MAX_ACTIONS_PER_PLAN`]).
///
/// A shard whose reachable replicas are not a majority of its voters is
/// left alone: its membership cannot change without a majority, and it is
/// the operator's call (restore the node, or recover from backup) — never
/// the controller's. Each move adds the new replica and promotes it before
/// the one on the down node is removed, so no step lowers a shard's count
/// of reachable voters. A down replica with nowhere to go stays until an
/// accepting node appears; planning again continues where this plan
/// stopped. An invalid view gets an empty plan.
pub fn plan_repair(view: &ClusterView, max_moves: usize) -> Vec<Action> {
    if view.validate().is_err() {
        return Vec::new();
    }
    let mut work = view.clone();
    let mut plan = Vec::new();
    let broken: Vec<u64> = shard_ids(&work, |s| s.replicas.iter().any(|n| view.down.contains(n)));
    for shard_id in broken {
        let replicas = work.shards[&shard_id].replicas.clone();
        let reachable = replicas.iter().filter(|n| !view.down.contains(n)).count();
        if reachable * 2 <= replicas.len() {
            continue;
        }
        for from in replicas.iter().copied().filter(|n| view.down.contains(n)) {
            if plan.len() >= max_moves {
                return plan;
            }
            let Some(to) = new_home(&work, shard_id) else {
                break;
            };
            if !push(
                &mut work,
                &mut plan,
                Action::MoveReplica { shard_id, from, to },
            ) {
                return plan;
            }
        }
    }
    plan
}

/// Default replica spread (max − min over accepting nodes) that starts a
/// rebalance; [`plan_balance`] then brings the counts within one, below
/// any threshold of 2 or more, so the next round plans nothing
/// (hysteresis).
pub const REBALANCE_REPLICA_SPREAD: usize = 2;

/// The controller's own balancing, with hysteresis: nothing unless the
/// replica counts of the accepting nodes differ by at least
/// `replica_spread` or their leadership counts by at least `leader_spread`
/// (each at least 2); then the first `max_moves` actions of
/// [`plan_balance`] (a prefix of a valid plan is valid). Leader elections
/// move single leaderships around all the time; a `leader_spread` above 2
/// keeps the controller from chasing them. An invalid view gets an empty
/// plan.
pub fn plan_rebalance(
    view: &ClusterView,
    max_moves: usize,
    replica_spread: usize,
    leader_spread: usize,
) -> Vec<Action> {
    let spread = |counts: BTreeMap<u64, usize>| {
        let max = counts.values().max().copied().unwrap_or(0);
        let min = counts.values().min().copied().unwrap_or(0);
        max - min
    };
    let replicas_off = spread(view.replica_counts()) >= replica_spread.max(2);
    let leaders_off = spread(view.leader_counts()) >= leader_spread.max(2);
    if !replicas_off && !leaders_off {
        return Vec::new();
    }
    let mut plan = plan_balance(view);
    plan.truncate(max_moves);
    plan
}

/// One data shard's load, as its leader reports it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShardLoad {
    /// Locks held in the shard now.
    pub held_locks: u64,
    /// Slots the shard owns.
    pub owned_slots: u32,
    /// Raft entries the shard applied per second lately (acquires,
    /// releases, renewals, expiries): the work its leader does.
    pub writes_per_sec: u64,
}

/// Held locks that weigh as much as one write a second: a held lock costs
/// its leader memory and an expiry check, far less than a request.
pub const HELD_LOCKS_PER_WRITE: u64 = 100;
/// Default [`LoadRule::min_weight`].
pub const DEFAULT_LOAD_MIN_WEIGHT: u64 = 50;
/// Default [`LoadRule::gain_percent`].
pub const DEFAULT_LOAD_GAIN_PERCENT: u64 = 25;

/// When [`plan_load_leaders`] moves a leadership.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadRule {
    /// No move puts leadership counts this far apart (at least 2), so
    /// [`plan_rebalance`] does not undo it.
    pub leader_spread: usize,
    /// A node leading less weight than this (writes a second) is never
    /// relieved: below it the counts are what matter.
    pub min_weight: u64,
    /// A move must lower the heaviest node's weight by at least this share
    /// (percent, 1..=100), so small swings in measured rates move nothing.
    pub gain_percent: u64,
}

impl ShardLoad {
    /// The weight [`plan_load_leaders`] balances.
    pub fn weight(&self) -> u64 {
        self.writes_per_sec
            .saturating_add(self.held_locks / HELD_LOCKS_PER_WRITE)
    }
}

/// Leadership transfers that even out the leaders' weights ([`ShardLoad::
/// weight`], summed over the shards each accepting node leads), at most
/// `max_moves`: from the heaviest node, the transfer to one of the shard's
/// accepting replicas that lowers the heaviest weight the most, only if it
/// lowers it by `rule.gain_percent` and the heaviest node carries at least
/// `rule.min_weight` — and never one that puts leadership counts
/// `rule.leader_spread` or more apart. Each transfer lowers the sum of squared weights, so planning
/// again on the result ends. Shards without a known load weigh nothing.
/// An invalid view gets an empty plan.
pub fn plan_load_leaders(
    view: &ClusterView,
    loads: &BTreeMap<u64, ShardLoad>,
    max_moves: usize,
    rule: &LoadRule,
) -> Vec<Action> {
    if view.validate().is_err() {
        return Vec::new();
    }
    let gain_percent = rule.gain_percent.clamp(1, 100);
    let weight = |shard_id: u64| loads.get(&shard_id).map_or(0, ShardLoad::weight);
    let mut work = view.clone();
    let mut plan = Vec::new();
    while plan.len() < max_moves.min(MAX_ACTIONS_PER_PLAN) {
        let counts = work.leader_counts();
        let mut weights: BTreeMap<u64, u64> = counts.keys().map(|&n| (n, 0)).collect();
        for (&id, shard) in &work.shards {
            if let Some(w) = shard.leader.and_then(|l| weights.get_mut(&l)) {
                *w = w.saturating_add(weight(id));
            }
        }
        let Some((&hi, &hi_weight)) = weights.iter().max_by_key(|(&n, &w)| (w, Reverse(n))) else {
            break;
        };
        if hi_weight < rule.min_weight.max(1) {
            break;
        }
        let mut best: Option<(u64, Reverse<u64>, Reverse<u64>)> = None;
        for (&id, shard) in &work.shards {
            let w = weight(id);
            if shard.leader != Some(hi) || w == 0 {
                continue;
            }
            for &to in shard.replicas.iter().filter(|&&n| n != hi) {
                let Some(&to_weight) = weights.get(&to) else {
                    continue;
                };
                let peak = (hi_weight - w).max(to_weight.saturating_add(w));
                let gain = hi_weight.saturating_sub(peak);
                let mut after = counts.clone();
                after.insert(hi, counts[&hi] - 1);
                after.insert(to, counts[&to] + 1);
                let max = after.values().max().copied().unwrap_or(0);
                let min = after.values().min().copied().unwrap_or(0);
                if gain.saturating_mul(100) < hi_weight.saturating_mul(gain_percent)
                    || max - min >= rule.leader_spread.max(2)
                {
                    continue;
                }
                let candidate = (gain, Reverse(id), Reverse(to));
                if best.is_none_or(|b| candidate > b) {
                    best = Some(candidate);
                }
            }
        }
        let Some((_, Reverse(shard_id), Reverse(to))) = best else {
            break;
        };
        if !push(
            &mut work,
            &mut plan,
            Action::TransferLeader { shard_id, to },
        ) {
            break;
        }
    }
    plan
}

/// The data shard to split by load, if any: among the shards owning two
/// slots or more (a single slot cannot be split) that hold at least
/// `split_above_locks` locks or write at least `split_above_writes_per_sec`
/// (each 0: not that way), the one furthest over its threshold (the
/// larger of its two ratios), lowest id on ties. None while `shards_in_map` is at [`MAX_SHARDS`]. One split at a
/// time: the caller does not ask while a migration is open. Splitting
/// halves a shard's slots, so the halves of a shard whose locks spread
/// over its slots fall below the threshold; one whose locks sit in a
/// single slot stops splitting once that slot is alone (and so does one
/// whose writes all go to one resource).
pub fn plan_split(
    loads: &BTreeMap<u64, ShardLoad>,
    split_above_locks: u64,
    split_above_writes_per_sec: u64,
    shards_in_map: usize,
) -> Option<u64> {
    if (split_above_locks == 0 && split_above_writes_per_sec == 0)
        || shards_in_map >= crate::limits::MAX_SHARDS
    {
        return None;
    }
    // How far over a threshold, in thousandths (0: not over it).
    let over = |value: u64, threshold: u64| {
        if threshold == 0 || value < threshold {
            0
        } else {
            value.saturating_mul(1_000) / threshold
        }
    };
    loads
        .iter()
        .filter(|(&id, load)| id != crate::limits::META_SHARD_ID && load.owned_slots >= 2)
        .map(|(&id, load)| {
            let ratio = over(load.held_locks, split_above_locks)
                .max(over(load.writes_per_sec, split_above_writes_per_sec));
            (Reverse(ratio), id)
        })
        .filter(|(Reverse(ratio), _)| *ratio > 0)
        .min()
        .map(|(_, id)| id)
}

/// Moves replicas from the most to the least loaded accepting node until
/// counts are within one. Returns false if the plan hit its bound.
fn balance_replicas(work: &mut ClusterView, plan: &mut Vec<Action>) -> bool {
    loop {
        let counts = work.replica_counts();
        let (Some((hi, hi_count)), Some((lo, lo_count))) =
            (most_loaded(&counts), least_loaded(&counts))
        else {
            return true;
        };
        if hi_count <= lo_count + 1 {
            return true;
        }
        // `hi` holds at least two more shards than `lo`, so at least one of
        // them is not on `lo`. Moving a follower avoids a leader change.
        let pick = work
            .shards
            .iter()
            .filter(|(_, s)| s.replicas.contains(&hi) && !s.replicas.contains(&lo))
            .map(|(&id, s)| (s.leader == Some(hi), id))
            .min();
        let Some((_, shard_id)) = pick else {
            debug_assert!(false, "no shard to move from {hi} to {lo}");
            return true;
        };
        let action = Action::MoveReplica {
            shard_id,
            from: hi,
            to: lo,
        };
        if !push(work, plan, action) {
            return false;
        }
    }
}

/// Moves leaderships along chains of replicas until no node leads two more
/// shards than another node it can reach: a transfer can only go to a
/// replica, so from an overloaded node the search walks "leads a shard that
/// has a replica on" edges to the nearest node with at least two fewer.
fn balance_leaders(work: &mut ClusterView, plan: &mut Vec<Action>) {
    loop {
        let counts = work.leader_counts();
        let Some((_, lowest)) = least_loaded(&counts) else {
            return;
        };
        let mut sources: Vec<(u64, usize)> = counts
            .iter()
            .filter(|(_, &c)| c >= lowest + 2)
            .map(|(&n, &c)| (n, c))
            .collect();
        sources.sort_by_key(|&(n, c)| (Reverse(c), n));
        let Some(path) = sources
            .iter()
            .find_map(|&(src, c)| leader_path(work, &counts, src, c))
        else {
            return;
        };
        // Each chain takes one leadership from a node and gives one to a node
        // with two fewer, so the sum of squared counts falls: this ends.
        for action in path {
            if !push(work, plan, action) {
                return;
            }
        }
    }
}

/// A chain of transfers from `src` to the least-loaded accepting node it can
/// reach that leads at most `src_count - 2` shards (ties: shorter chain, then
/// lowest id), target end first; `None` if there is no such node.
fn leader_path(
    work: &ClusterView,
    counts: &BTreeMap<u64, usize>,
    src: u64,
    src_count: usize,
) -> Option<Vec<Action>> {
    let mut led_by: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for (&id, shard) in &work.shards {
        if let Some(leader) = shard.leader {
            led_by.entry(leader).or_default().push(id);
        }
    }
    // Breadth-first, so each node's parent gives a shortest chain to it:
    // parent[node] = (previous node, shard whose leadership moves to node).
    let mut parent: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    let mut best: Option<(usize, usize, u64)> = None; // (count, depth, node)
    let mut queue = VecDeque::from([(src, 0usize)]);
    while let Some((u, depth)) = queue.pop_front() {
        for &shard_id in led_by.get(&u).map_or(&[][..], Vec::as_slice) {
            for &w in &work.shards[&shard_id].replicas {
                let Some(&w_count) = counts.get(&w) else {
                    continue; // not accepting
                };
                if w == src || parent.contains_key(&w) {
                    continue;
                }
                parent.insert(w, (u, shard_id));
                let candidate = (w_count, depth + 1, w);
                if w_count + 2 <= src_count && best.is_none_or(|b| candidate < b) {
                    best = Some(candidate);
                }
                queue.push_back((w, depth + 1));
            }
        }
    }
    let (_, _, target) = best?;
    let mut path = Vec::new();
    let mut at = target;
    while at != src {
        let (prev, shard_id) = parent[&at];
        path.push(Action::TransferLeader { shard_id, to: at });
        at = prev;
    }
    Some(path)
}

/// Where a new replica of `shard_id` goes: the accepting node with the
/// fewest replicas that does not hold the shard yet, lowest id on ties.
fn new_home(work: &ClusterView, shard_id: u64) -> Option<u64> {
    let holders = &work.shards[&shard_id].replicas;
    work.replica_counts()
        .into_iter()
        .filter(|(n, _)| !holders.contains(n))
        .map(|(n, c)| (c, n))
        .min()
        .map(|(_, n)| n)
}

/// The node with the most load, lowest id on ties.
fn most_loaded(counts: &BTreeMap<u64, usize>) -> Option<(u64, usize)> {
    let (Reverse(c), n) = counts.iter().map(|(&n, &c)| (Reverse(c), n)).min()?;
    Some((n, c))
}

/// The node with the least load, lowest id on ties.
fn least_loaded(counts: &BTreeMap<u64, usize>) -> Option<(u64, usize)> {
    let (c, n) = counts.iter().map(|(&n, &c)| (c, n)).min()?;
    Some((n, c))
}

fn shard_ids(view: &ClusterView, keep: impl Fn(&ShardView) -> bool) -> Vec<u64> {
    view.shards
        .iter()
        .filter(|(_, s)| keep(s))
        .map(|(&id, _)| id)
        .collect()
}

/// Applies `action` to the working view and records it, unless the plan is
/// full. Planners only build actions that pass, so a refusal is a bug.
fn push(work: &mut ClusterView, plan: &mut Vec<Action>, action: Action) -> bool {
    if plan.len() >= MAX_ACTIONS_PER_PLAN {
        return false;
    }
    match apply_action(work, &action) {
        Ok(()) => {
            plan.push(action);
            true
        }
        Err(e) => {
            debug_assert!(false, "planner built a refused action {action:?}: {e}");
            false
        }
    }
}
