//! Partitions as sets of cut links (a "grudge", in Jepsen's word): which
//! node stops hearing from which. Pure, so the shapes are unit-tested.

use std::collections::BTreeSet;

/// Directed links `(from, to)` whose packets are dropped.
pub type Grudge = BTreeSet<(u64, u64)>;

fn both_ways(a: u64, b: u64, g: &mut Grudge) {
    g.insert((a, b));
    g.insert((b, a));
}

/// `node` hears nobody and nobody hears it.
pub fn isolate(nodes: &[u64], node: u64) -> Grudge {
    let mut g = Grudge::new();
    for &other in nodes.iter().filter(|&&n| n != node) {
        both_ways(node, other, &mut g);
    }
    g
}

/// Every node alone: no group of two or more can talk.
pub fn all_alone(nodes: &[u64]) -> Grudge {
    let mut g = Grudge::new();
    for (i, &a) in nodes.iter().enumerate() {
        for &b in &nodes[i + 1..] {
            both_ways(a, b, &mut g);
        }
    }
    g
}

/// Nodes in a ring (in the order given), each reaching only its two
/// neighbours: every node sees a different majority.
pub fn ring(nodes: &[u64]) -> Grudge {
    let n = nodes.len();
    let mut g = Grudge::new();
    for i in 0..n {
        for j in i + 1..n {
            let distance = (j - i).min(n - (j - i));
            if distance > 1 {
                both_ways(nodes[i], nodes[j], &mut g);
            }
        }
    }
    g
}

/// The sources `node` must drop packets from.
pub fn dropped_at(grudge: &Grudge, node: u64) -> Vec<u64> {
    grudge
        .iter()
        .filter(|(_, to)| *to == node)
        .map(|(from, _)| *from)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn isolating_a_node_cuts_exactly_its_links() {
        let g = isolate(&[1, 2, 3, 4], 2);
        assert_eq!(g.len(), 6);
        assert!(g.iter().all(|(a, b)| *a == 2 || *b == 2));
        assert_eq!(dropped_at(&g, 2), vec![1, 3, 4]);
        assert_eq!(dropped_at(&g, 1), vec![2]);
    }

    #[test]
    fn all_alone_cuts_every_link() {
        assert_eq!(all_alone(&[1, 2, 3]).len(), 6);
    }

    #[test]
    fn a_ring_keeps_only_neighbours() {
        let g = ring(&[1, 2, 3, 4, 5]);
        for (a, b) in [(1, 2), (2, 3), (3, 4), (4, 5), (5, 1)] {
            assert!(!g.contains(&(a, b)) && !g.contains(&(b, a)));
        }
        assert!(g.contains(&(1, 3)) && g.contains(&(2, 5)));
        // Four nodes: each misses only the one opposite it.
        assert_eq!(ring(&[1, 2, 3, 4]).len(), 4);
        // Three nodes are all neighbours: a ring cuts nothing.
        assert!(ring(&[1, 2, 3]).is_empty());
    }
}
