//! How fast each shard writes: Raft entries applied per second, from the
//! applied indexes successive controller rounds observe ([`crate::act`]).
//! Pure — time comes in as a value — like [`crate::repair::DownTracker`].
//! A rate covers at least [`RATE_WINDOW_MS`], so one busy second does not
//! move a leadership.

use std::collections::BTreeMap;

/// The shortest span a rate is measured over.
pub const RATE_WINDOW_MS: u64 = 5_000;

/// Per shard: where the current window started, and the last rate.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RateTracker {
    window_start: BTreeMap<u64, (u64, u64)>,
    rates: BTreeMap<u64, u64>,
}

impl RateTracker {
    /// Records the shards' applied indexes at `now_ms` and returns the
    /// writes per second of every shard measured over a whole window so
    /// far (shards not in `applied` are forgotten). An index that went
    /// back (a restored replica reporting) starts its window again.
    pub fn observe(&mut self, now_ms: u64, applied: &BTreeMap<u64, u64>) -> BTreeMap<u64, u64> {
        self.window_start.retain(|id, _| applied.contains_key(id));
        self.rates.retain(|id, _| applied.contains_key(id));
        for (&id, &index) in applied {
            let (start_index, start_ms) = *self.window_start.entry(id).or_insert((index, now_ms));
            if index < start_index {
                self.window_start.insert(id, (index, now_ms));
                continue;
            }
            let span_ms = now_ms.saturating_sub(start_ms);
            if span_ms >= RATE_WINDOW_MS {
                let rate = (index - start_index).saturating_mul(1_000) / span_ms;
                self.rates.insert(id, rate);
                self.window_start.insert(id, (index, now_ms));
            }
        }
        self.rates.clone()
    }

    /// Forgets everything (this node stopped leading the meta shard).
    pub fn forget(&mut self) {
        self.window_start.clear();
        self.rates.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rate_is_reported_once_a_whole_window_passed() {
        let mut t = RateTracker::default();
        assert!(t.observe(0, &[(1, 100)].into()).is_empty());
        assert!(t.observe(4_999, &[(1, 600)].into()).is_empty());
        assert_eq!(t.observe(5_000, &[(1, 1_100)].into()), [(1, 200)].into());
        // The rate holds until the next window ends.
        assert_eq!(t.observe(6_000, &[(1, 1_100)].into()), [(1, 200)].into());
        assert_eq!(t.observe(10_000, &[(1, 1_100)].into()), [(1, 0)].into());
    }

    #[test]
    fn a_shard_gone_is_forgotten_and_an_index_going_back_restarts_its_window() {
        let mut t = RateTracker::default();
        t.observe(0, &[(1, 10), (2, 10)].into());
        assert_eq!(t.observe(5_000, &[(1, 60)].into()), [(1, 10)].into());
        assert_eq!(t.observe(6_000, &[(1, 5)].into()), [(1, 10)].into());
        assert_eq!(t.observe(11_000, &[(1, 505)].into()), [(1, 100)].into());
    }
}
