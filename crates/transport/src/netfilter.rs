//! Fault rules for the links between nodes: isolation, partitions, one-way
//! blocks, random loss and delay.
//!
//! This module owns [`NetworkRules`], the single place that decides what
//! happens to a message sent from one node to another ([`Verdict`]). The
//! transport asks it once per outgoing Raft message, so in-process cluster
//! tests and fault-injection runs can cut and heal the network without
//! touching sockets. It only decides; the transport does the dropping and
//! delaying.
//!
//! Rules are keyed by node id and apply to every shard that travels over the
//! link, like a real network fault would.
//!
//! Random loss is deterministic: the drop decisions are a pure function of
//! the seed ([`NetworkRules::with_seed`]) and of the order in which
//! [`NetworkRules::verdict`] is called, so a single-threaded test replays
//! exactly.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::RwLock;
use std::time::Duration;

/// Seed of [`NetworkRules::default`]. Any fixed value keeps default runs
/// reproducible.
const DEFAULT_SEED: u64 = 0x5EED_F00D_CAFE_D00D;

/// The increment of the SplitMix64 sequence (the golden ratio in 64-bit
/// fixed point), which makes consecutive states decorrelated after mixing.
const SPLITMIX64_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// Number of random bits turned into a uniform `f64` in `[0, 1)`: the width
/// of an `f64` mantissa, so every value is exactly representable.
const UNIT_FLOAT_BITS: u32 = 53;

/// What the network does with one message from one node to another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Send it now.
    Deliver,
    /// Lose it.
    Drop,
    /// Send it after this long.
    Delay(Duration),
}

/// The current faults between nodes.
///
/// Cheap to query from many threads at once: when no fault is set (the
/// common case outside fault tests), [`verdict`](Self::verdict) is one atomic
/// load. Changing rules takes a write lock and is meant to be rare.
///
/// Semantics:
/// - A message from a node to itself is always delivered: it never crosses
///   the network.
/// - Cuts (isolation, partition, one-way blocks) are checked first, then the
///   random drop rate, then the delay: a delayed message has already
///   survived the cuts and the loss.
/// - Rules are checked when the message is sent, not again when a delay
///   ends.
#[derive(Debug)]
pub struct NetworkRules {
    /// True when any rule is set. Lets [`verdict`](Self::verdict) skip the
    /// lock and the random draw when the network is healthy.
    faulty: AtomicBool,
    /// State of the SplitMix64 generator behind the drop rate. Advanced with
    /// one atomic add per draw, so draws need no lock and, for a given
    /// seed, the n-th draw is always the same number.
    rng_state: AtomicU64,
    rules: RwLock<Rules>,
}

/// The rules themselves, behind [`NetworkRules::rules`].
#[derive(Debug, Default, Clone)]
struct Rules {
    /// Nodes that can neither send nor receive.
    isolated: BTreeSet<u64>,
    /// Partition group of each node named by the last
    /// [`NetworkRules::partition`]. Two nodes in different groups cannot
    /// talk; a node in no group is not affected by the partition.
    group_of: BTreeMap<u64, usize>,
    /// One-way cuts, `(from, to)`.
    blocked: BTreeSet<(u64, u64)>,
    /// Probability in `[0, 1]` that a message which passed the cuts is lost.
    drop_rate: f64,
    /// Added latency of every message that is delivered.
    delay: Duration,
}

impl Rules {
    /// True when these rules deliver everything at once.
    fn is_clear(&self) -> bool {
        self.isolated.is_empty()
            && self.group_of.is_empty()
            && self.blocked.is_empty()
            && self.drop_rate == 0.0
            && self.delay.is_zero()
    }

    /// True when a cut stops messages from `from` to `to`.
    fn is_cut(&self, from: u64, to: u64) -> bool {
        if self.isolated.contains(&from) || self.isolated.contains(&to) {
            return true;
        }
        if let (Some(a), Some(b)) = (self.group_of.get(&from), self.group_of.get(&to)) {
            if a != b {
                return true;
            }
        }
        self.blocked.contains(&(from, to))
    }
}

impl Default for NetworkRules {
    /// A healthy network: everything is delivered at once.
    fn default() -> Self {
        Self::with_seed(DEFAULT_SEED)
    }
}

impl NetworkRules {
    /// A healthy network whose random drops (once a drop rate is set) follow
    /// the sequence determined by `seed`.
    pub fn with_seed(seed: u64) -> Self {
        Self {
            faulty: AtomicBool::new(false),
            rng_state: AtomicU64::new(seed),
            rules: RwLock::new(Rules::default()),
        }
    }

    /// What happens to a message sent now from node `from` to node `to`.
    pub fn verdict(&self, from: u64, to: u64) -> Verdict {
        if from == to || !self.faulty.load(Ordering::Acquire) {
            return Verdict::Deliver;
        }
        let rules = self.read();
        if rules.is_cut(from, to) {
            return Verdict::Drop;
        }
        if rules.drop_rate > 0.0 && self.next_unit_f64() < rules.drop_rate {
            return Verdict::Drop;
        }
        if rules.delay.is_zero() {
            Verdict::Deliver
        } else {
            Verdict::Delay(rules.delay)
        }
    }

    /// Cuts `node` off from every other node, both ways, until
    /// [`heal`](Self::heal). Other cuts stay as they are.
    pub fn isolate(&self, node: u64) {
        self.update(|rules| {
            rules.isolated.insert(node);
        });
    }

    /// Splits the named nodes into `groups`: nodes in different groups can
    /// no longer talk, nodes in the same group still can. Nodes named in no
    /// group are not affected. Replaces the previous partition, if any;
    /// isolation and one-way blocks stay.
    ///
    /// # Panics
    /// If a node is named in more than one group: that partition has no
    /// meaning, and is a bug in the caller.
    pub fn partition(&self, groups: &[&[u64]]) {
        let mut group_of = BTreeMap::new();
        for (index, group) in groups.iter().enumerate() {
            for &node in group.iter() {
                let previous = group_of.insert(node, index);
                assert!(
                    previous.is_none_or(|p| p == index),
                    "node {node} named in two partition groups"
                );
            }
        }
        self.update(|rules| rules.group_of = group_of);
    }

    /// Stops messages from `from` to `to`; the other direction is not
    /// affected.
    pub fn block(&self, from: u64, to: u64) {
        self.update(|rules| {
            rules.blocked.insert((from, to));
        });
    }

    /// Removes every fault: isolation, partition, blocks, drop rate and
    /// delay. The random sequence continues where it was (it is not
    /// reseeded), so a run stays reproducible across heals.
    pub fn heal(&self) {
        self.update(|rules| *rules = Rules::default());
    }

    /// Loses each message that passes the cuts with probability `rate`.
    ///
    /// # Panics
    /// If `rate` is not within `0.0..=1.0` (NaN included).
    pub fn set_drop_rate(&self, rate: f64) {
        assert!(
            (0.0..=1.0).contains(&rate),
            "drop rate must be within 0..=1, got {rate}"
        );
        self.update(|rules| rules.drop_rate = rate);
    }

    /// Delivers every message `delay` late. `Duration::ZERO` removes the
    /// delay.
    pub fn set_delay(&self, delay: Duration) {
        self.update(|rules| rules.delay = delay);
    }

    /// Applies `change` and refreshes the fast-path flag, both under the
    /// write lock, so the flag never says "healthy" for rules that are not.
    fn update(&self, change: impl FnOnce(&mut Rules)) {
        let mut rules = self.rules.write().unwrap_or_else(|p| p.into_inner());
        change(&mut rules);
        self.faulty.store(!rules.is_clear(), Ordering::Release);
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Rules> {
        // The rules are plain data that every writer leaves consistent, so a
        // panic elsewhere while holding the lock does not corrupt them.
        self.rules.read().unwrap_or_else(|p| p.into_inner())
    }

    /// The next draw, uniform in `[0, 1)`.
    fn next_unit_f64(&self) -> f64 {
        let state = self
            .rng_state
            .fetch_add(SPLITMIX64_GAMMA, Ordering::Relaxed)
            .wrapping_add(SPLITMIX64_GAMMA);
        let bits = splitmix64_mix(state) >> (u64::BITS - UNIT_FLOAT_BITS);
        bits as f64 / (1u64 << UNIT_FLOAT_BITS) as f64
    }
}

/// The output function of SplitMix64 (Steele, Lea, Flood 2014): a bijective
/// mix of the state with good statistical quality for test randomness.
fn splitmix64_mix(state: u64) -> u64 {
    let mut z = state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODES: [u64; 5] = [1, 2, 3, 4, 5];

    /// Every ordered pair of distinct nodes whose verdict is `expected`.
    fn links_with(rules: &NetworkRules, expected: Verdict) -> Vec<(u64, u64)> {
        let mut links = Vec::new();
        for from in NODES {
            for to in NODES {
                if from != to && rules.verdict(from, to) == expected {
                    links.push((from, to));
                }
            }
        }
        links
    }

    #[test]
    fn default_delivers_everything() {
        let rules = NetworkRules::default();
        assert!(links_with(&rules, Verdict::Drop).is_empty());
        assert_eq!(links_with(&rules, Verdict::Deliver).len(), 20);
    }

    #[test]
    fn isolate_cuts_both_directions_only_for_that_node() {
        let rules = NetworkRules::default();
        rules.isolate(3);
        for other in [1, 2, 4, 5] {
            assert_eq!(rules.verdict(3, other), Verdict::Drop);
            assert_eq!(rules.verdict(other, 3), Verdict::Drop);
        }
        assert_eq!(rules.verdict(1, 2), Verdict::Deliver);
        assert_eq!(rules.verdict(3, 3), Verdict::Deliver, "self is not network");
    }

    #[test]
    fn partition_cuts_between_groups_not_within() {
        let rules = NetworkRules::default();
        rules.partition(&[&[1, 2], &[3, 4]]);
        assert_eq!(rules.verdict(1, 2), Verdict::Deliver);
        assert_eq!(rules.verdict(4, 3), Verdict::Deliver);
        assert_eq!(rules.verdict(1, 3), Verdict::Drop);
        assert_eq!(rules.verdict(4, 2), Verdict::Drop);
        // Node 5 is in no group: the partition does not touch it.
        assert_eq!(rules.verdict(5, 1), Verdict::Deliver);
        assert_eq!(rules.verdict(3, 5), Verdict::Deliver);
    }

    #[test]
    fn a_new_partition_replaces_the_old_one() {
        let rules = NetworkRules::default();
        rules.partition(&[&[1], &[2, 3]]);
        rules.partition(&[&[1, 2], &[3]]);
        assert_eq!(rules.verdict(1, 2), Verdict::Deliver);
        assert_eq!(rules.verdict(2, 3), Verdict::Drop);
    }

    #[test]
    #[should_panic(expected = "two partition groups")]
    fn a_node_in_two_groups_is_rejected() {
        NetworkRules::default().partition(&[&[1, 2], &[2, 3]]);
    }

    #[test]
    fn block_is_one_way() {
        let rules = NetworkRules::default();
        rules.block(1, 2);
        assert_eq!(links_with(&rules, Verdict::Drop), vec![(1, 2)]);
        assert_eq!(rules.verdict(2, 1), Verdict::Deliver);
    }

    #[test]
    fn heal_removes_every_fault() {
        let rules = NetworkRules::default();
        rules.isolate(1);
        rules.partition(&[&[2], &[3]]);
        rules.block(4, 5);
        rules.set_drop_rate(1.0);
        rules.set_delay(Duration::from_millis(5));
        assert_eq!(links_with(&rules, Verdict::Deliver), vec![]);

        rules.heal();
        assert!(links_with(&rules, Verdict::Drop).is_empty());
        assert_eq!(links_with(&rules, Verdict::Deliver).len(), 20);
    }

    #[test]
    fn delay_applies_to_delivered_messages_only() {
        let rules = NetworkRules::default();
        let delay = Duration::from_millis(30);
        rules.set_delay(delay);
        rules.block(1, 2);
        assert_eq!(rules.verdict(2, 1), Verdict::Delay(delay));
        assert_eq!(rules.verdict(1, 2), Verdict::Drop);
        rules.set_delay(Duration::ZERO);
        assert_eq!(rules.verdict(2, 1), Verdict::Deliver);
    }

    #[test]
    fn drop_rate_extremes() {
        let rules = NetworkRules::default();
        rules.set_drop_rate(1.0);
        assert_eq!(links_with(&rules, Verdict::Drop).len(), 20);
        rules.set_drop_rate(0.0);
        assert_eq!(links_with(&rules, Verdict::Deliver).len(), 20);
    }

    /// Draws this many verdicts for one link with the given seed and rate.
    fn draw(seed: u64, rate: f64, count: usize) -> Vec<Verdict> {
        let rules = NetworkRules::with_seed(seed);
        rules.set_drop_rate(rate);
        (0..count).map(|_| rules.verdict(1, 2)).collect()
    }

    #[test]
    fn drop_rate_is_deterministic_per_seed() {
        const DRAWS: usize = 1_000;
        assert_eq!(draw(7, 0.5, DRAWS), draw(7, 0.5, DRAWS));
        assert_ne!(draw(7, 0.5, DRAWS), draw(8, 0.5, DRAWS));
    }

    #[test]
    fn drop_rate_is_roughly_the_asked_fraction() {
        const DRAWS: usize = 20_000;
        for rate in [0.1, 0.5, 0.9] {
            let dropped = draw(42, rate, DRAWS)
                .iter()
                .filter(|v| **v == Verdict::Drop)
                .count();
            let observed = dropped as f64 / DRAWS as f64;
            // Binomial standard deviation at n = 20,000 is at most 0.0036;
            // 0.02 is more than five of them.
            assert!(
                (observed - rate).abs() < 0.02,
                "rate {rate}: observed {observed}"
            );
        }
    }

    #[test]
    #[should_panic(expected = "within 0..=1")]
    fn drop_rate_above_one_is_rejected() {
        NetworkRules::default().set_drop_rate(1.5);
    }

    #[test]
    #[should_panic(expected = "within 0..=1")]
    fn drop_rate_nan_is_rejected() {
        NetworkRules::default().set_drop_rate(f64::NAN);
    }

    #[test]
    fn rules_are_shared_across_threads() {
        let rules = std::sync::Arc::new(NetworkRules::default());
        let writer = {
            let rules = rules.clone();
            std::thread::spawn(move || rules.isolate(2))
        };
        writer.join().expect("writer thread");
        assert_eq!(rules.verdict(1, 2), Verdict::Drop);
    }
}
