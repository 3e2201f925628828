//! When a shard takes its periodic snapshot (and compacts its log behind
//! it): a pure decision on log indexes, so it can be tested on its own.
//!
//! Every shard snapshots once per `raft.snapshot_interval_entries` applied
//! entries. The shards of one node usually start together at the same index
//! and take the same share of the load, so if each counted from its own
//! last snapshot they would all reach the interval in the same moment,
//! forever: every table encoded on the one store thread and written through
//! one synced write, a latency spike for every shard at once. Instead each
//! shard snapshots when its applied index crosses a multiple of the
//! interval *shifted by a phase of its own*, and the phases of shards
//! 0, 1, 2, … spread evenly over the interval (golden-ratio steps, so any
//! number of consecutive shard ids stays spread).

/// `2^64 / φ`: multiplying by it and keeping the high bits steps through
/// the interval by the golden ratio.
const GOLDEN_STEP: u64 = 0x9E37_79B9_7F4A_7C15;

/// Shard `shard_id`'s offset into the snapshot interval, `0..interval`.
fn phase(shard_id: u64, interval: u64) -> u64 {
    let frac = u128::from(shard_id.wrapping_mul(GOLDEN_STEP));
    ((frac * u128::from(interval)) >> 64) as u64
}

/// Whether a shard that took its last snapshot at `last` (its bootstrap or
/// installed snapshot counts) and has applied through `applied` is due for
/// its periodic snapshot: `applied` reached the next multiple of `interval`
/// past `last`, shifted by the shard's phase. Between two due points there
/// are exactly `interval` entries; the first after a start, or after a
/// snapshot taken early (a replica needed one), comes sooner.
pub(crate) fn snapshot_due(shard_id: u64, applied: u64, last: u64, interval: u64) -> bool {
    debug_assert!(interval > 0, "validated by the config");
    if applied <= last || interval == 0 {
        return false;
    }
    let shift = phase(shard_id, interval);
    (applied + shift) / interval > (last + shift) / interval
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Applies `steps` entries one at a time to shards `0..shards` in
    /// lockstep and returns, per shard, the indexes it snapshotted at.
    fn run(shards: u64, steps: u64, interval: u64) -> Vec<Vec<u64>> {
        let mut last = vec![1u64; shards as usize];
        let mut taken = vec![Vec::new(); shards as usize];
        for applied in 2..=steps {
            for id in 0..shards {
                let l = &mut last[id as usize];
                if snapshot_due(id, applied, *l, interval) {
                    *l = applied;
                    taken[id as usize].push(applied);
                }
            }
        }
        taken
    }

    #[test]
    fn a_shard_snapshots_once_per_interval() {
        let taken = run(1, 100_000, 10_000);
        for pair in taken[0].windows(2) {
            assert_eq!(pair[1] - pair[0], 10_000, "{:?}", taken[0]);
        }
        assert!((9..=10).contains(&taken[0].len()), "{:?}", taken[0]);
    }

    #[test]
    fn nothing_applied_since_the_last_snapshot_is_never_due() {
        for id in 0..20 {
            assert!(!snapshot_due(id, 5_000, 5_000, 100));
            assert!(!snapshot_due(id, 4_000, 5_000, 100));
        }
    }

    #[test]
    fn shards_in_lockstep_snapshot_at_spread_out_moments() {
        let interval = 10_000;
        for shards in [2u64, 5, 8, 9, 16] {
            let taken = run(shards, 5 * interval, interval);
            let mut all: Vec<u64> = taken.iter().flatten().copied().collect();
            all.sort_unstable();
            let closest = all
                .windows(2)
                .map(|w| w[1] - w[0])
                .min()
                .unwrap_or(interval);
            // Evenly spread would be interval / shards; golden-ratio steps
            // stay within a small factor of it.
            assert!(
                closest * shards * 3 >= interval,
                "{shards} shards: two snapshots {closest} entries apart: {all:?}"
            );
            for t in &taken {
                assert!(t.len() >= 4, "{taken:?}");
            }
        }
    }

    #[test]
    fn an_early_snapshot_does_not_delay_the_next_due_point() {
        // A forced snapshot at 12_345 (a new replica needed one): the next
        // periodic one still comes at the shard's usual point.
        let interval = 10_000;
        let shift = phase(3, interval);
        let next_usual = (12_345 + shift) / interval * interval + interval - shift;
        assert!(!snapshot_due(3, next_usual - 1, 12_345, interval));
        assert!(snapshot_due(3, next_usual, 12_345, interval));
    }
}
