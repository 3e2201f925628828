//! Since when each node has been unreachable: the one thing the
//! controller remembers between its rounds ([`crate::act`]). Pure — time
//! comes in as a value — so the rule "down after this long unreachable"
//! is unit-tested without clocks.

use std::collections::{BTreeMap, BTreeSet};

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
