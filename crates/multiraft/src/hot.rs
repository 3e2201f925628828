//! The hottest resources of one shard: a bounded top-N counter.
//!
//! Owns the per-shard tally behind `fencelock admin hot`. Resource names
//! never become metric labels (unbounded cardinality); this keeps at most
//! [`HOT_TRACKED_PER_SHARD`] names per shard instead, with the
//! "space-saving" rule: a new name evicts the least counted one and inherits
//! its count as a possible overestimate (`overcount`), so a resource that is
//! truly hot always surfaces and the error of each count is known.
//!
//! Counts halve every [`HOT_DECAY_INTERVAL`], so the list shows what is hot
//! now rather than since the node started. Only the shard's leader counts
//! (it is where acquires apply with a caller waiting); the tally is not
//! replicated and starts empty on a new leader.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use fencelock_statemachine::ResourceName;

/// Names tracked per shard. A miss on a full table scans it for the least
/// counted entry: 64 entries keep that scan well under a microsecond.
pub const HOT_TRACKED_PER_SHARD: usize = 64;
/// Entries each shard publishes (in its status) per tick.
pub const HOT_REPORTED_PER_SHARD: usize = 16;
/// Every count halves this often.
pub const HOT_DECAY_INTERVAL: Duration = Duration::from_secs(60);

/// One resource's tally.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HotEntry {
    pub resource: String,
    /// Acquire attempts applied (granted, queued or refused).
    pub acquires: u64,
    /// Of those, attempts that found the lock held (queued or refused).
    pub contended: u64,
    /// How much `acquires` may overstate (inherited from an evicted entry).
    pub overcount: u64,
}

#[derive(Clone, Copy, Debug, Default)]
struct Tally {
    acquires: u64,
    contended: u64,
    overcount: u64,
}

/// See the module docs.
#[derive(Debug)]
pub struct HotCounter {
    tallies: HashMap<ResourceName, Tally>,
    last_decay: Instant,
}

impl HotCounter {
    pub fn new(now: Instant) -> HotCounter {
        HotCounter {
            tallies: HashMap::with_capacity(HOT_TRACKED_PER_SHARD),
            last_decay: now,
        }
    }

    /// Counts one acquire of `resource`.
    pub fn record(&mut self, resource: &ResourceName, contended: bool) {
        if let Some(t) = self.tallies.get_mut(resource) {
            t.acquires += 1;
            t.contended += u64::from(contended);
            return;
        }
        let mut tally = Tally {
            acquires: 1,
            contended: u64::from(contended),
            overcount: 0,
        };
        if self.tallies.len() >= HOT_TRACKED_PER_SHARD {
            let (victim, min) = self
                .tallies
                .iter()
                .min_by_key(|(_, t)| t.acquires)
                .map(|(name, t)| (name.clone(), t.acquires))
                .expect("table is full, so not empty");
            self.tallies.remove(&victim);
            tally.acquires += min;
            tally.overcount = min;
        }
        self.tallies.insert(resource.clone(), tally);
        debug_assert!(self.tallies.len() <= HOT_TRACKED_PER_SHARD);
    }

    /// Halves every count once per [`HOT_DECAY_INTERVAL`] passed; forgets
    /// names whose count reaches zero.
    pub fn decay(&mut self, now: Instant) {
        while now.duration_since(self.last_decay) >= HOT_DECAY_INTERVAL {
            self.last_decay += HOT_DECAY_INTERVAL;
            self.tallies.retain(|_, t| {
                t.acquires /= 2;
                t.contended = (t.contended / 2).min(t.acquires);
                t.overcount = (t.overcount / 2).min(t.acquires);
                t.acquires > 0
            });
        }
    }

    /// The `n` most acquired names, most first (ties by name).
    pub fn top(&self, n: usize) -> Vec<HotEntry> {
        let mut all: Vec<HotEntry> = self
            .tallies
            .iter()
            .map(|(name, t)| HotEntry {
                resource: name.as_str().to_owned(),
                acquires: t.acquires,
                contended: t.contended,
                overcount: t.overcount,
            })
            .collect();
        all.sort_by(|a, b| {
            b.acquires
                .cmp(&a.acquires)
                .then_with(|| a.resource.cmp(&b.resource))
        });
        all.truncate(n);
        all
    }

    /// Forgets everything (leadership lost).
    pub fn clear(&mut self) {
        self.tallies.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> ResourceName {
        ResourceName::parse(s).unwrap()
    }

    #[test]
    fn a_hot_resource_surfaces_among_many_cold_ones_and_the_table_stays_bounded() {
        let now = Instant::now();
        let mut hot = HotCounter::new(now);
        for i in 0..10_000 {
            hot.record(&name(&format!("acme/cold-{i}")), false);
            if i % 10 == 0 {
                hot.record(&name("acme/hot"), true);
            }
        }
        assert!(hot.tallies.len() <= HOT_TRACKED_PER_SHARD);
        let top = hot.top(3);
        assert_eq!(top[0].resource, "acme/hot");
        // Never undercounted; the overcount bounds the error.
        assert!(top[0].acquires >= 1_000);
        assert!(top[0].acquires - top[0].overcount <= 1_000);
        assert_eq!(top[0].contended, 1_000);
    }

    #[test]
    fn counts_halve_per_interval_and_vanish_at_zero() {
        let now = Instant::now();
        let mut hot = HotCounter::new(now);
        for _ in 0..4 {
            hot.record(&name("acme/a"), false);
        }
        hot.record(&name("acme/b"), false);
        hot.decay(now + HOT_DECAY_INTERVAL);
        assert_eq!(hot.top(5).len(), 1);
        assert_eq!(hot.top(5)[0].acquires, 2);
        hot.decay(now + HOT_DECAY_INTERVAL * 3);
        assert!(hot.top(5).is_empty());
    }
}
