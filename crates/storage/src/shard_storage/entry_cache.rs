//! A small per-shard cache of the most recent log entries, staged or
//! durable.
//!
//! Entries enter when they are staged, so the leader sends them to
//! followers while their write is in flight, and applies them once
//! committed, from memory. Every entry not yet durable stays cached
//! (`keep_from`): the engine may not have it yet, or may be overwriting
//! an older one at its index, so memory is the only place to read it.
//!
//! Invariant: the cached entries are contiguous and, when the cache is not
//! empty, the last one is the shard's staged last entry. So a lookup is a
//! subtraction, and a read of `[low, high)` is "engine for the part before
//! the cache, cache for the rest".

use std::collections::VecDeque;

use protobuf::Message;
use raft::prelude::Entry;

/// Byte budget of one shard's cache. With tens to a few hundred shards per
/// node this stays in the tens of MiB; 256 KiB holds ~1,000 lock commands of
/// a few hundred bytes, far more than one round trip's worth.
pub const ENTRY_CACHE_MAX_BYTES: usize = 256 << 10;

/// Entry-count budget of one shard's cache (bounds per-entry overhead when
/// entries are tiny, e.g. empty leader-election entries).
pub const ENTRY_CACHE_MAX_ENTRIES: usize = 1024;

#[derive(Debug, Default)]
pub(crate) struct EntryCache {
    entries: VecDeque<Entry>,
    size_bytes: usize,
}

impl EntryCache {
    /// Index of the first cached entry.
    pub(crate) fn first_index(&self) -> Option<u64> {
        self.entries.front().map(|e| e.index)
    }

    pub(crate) fn get(&self, index: u64) -> Option<&Entry> {
        let first = self.first_index()?;
        let offset = usize::try_from(index.checked_sub(first)?).ok()?;
        self.entries.get(offset)
    }

    /// Entries `[low, high)`, all of which must be cached.
    pub(crate) fn range(&self, low: u64, high: u64) -> impl Iterator<Item = &Entry> {
        let first = self.first_index().unwrap_or(low);
        let skip = usize::try_from(low.saturating_sub(first)).unwrap_or(usize::MAX);
        let take = usize::try_from(high.saturating_sub(low)).unwrap_or(usize::MAX);
        self.entries.iter().skip(skip).take(take)
    }

    /// Records entries just staged. `entries` are consecutive; anything
    /// cached at or after their first index is replaced (the log was
    /// truncated there). If they do not connect to the cached ones, the cache
    /// restarts from them so it stays contiguous. Eviction keeps every entry
    /// from `keep_from` on (the first one not yet durable).
    pub(crate) fn append(&mut self, entries: &[Entry], keep_from: Option<u64>) {
        let Some(first_new) = entries.first().map(|e| e.index) else {
            return;
        };
        match (self.first_index(), self.entries.back().map(|e| e.index)) {
            (Some(first), Some(last)) if first < first_new && first_new <= last + 1 => {
                self.truncate_from(first_new);
            }
            _ => self.clear(),
        }
        for entry in entries {
            self.size_bytes += entry_size(entry);
            self.entries.push_back(entry.clone());
        }
        self.evict(keep_from);
    }

    /// Drops cached entries with index `<= index` (log compaction).
    pub(crate) fn compact_to(&mut self, index: u64) {
        while self.entries.front().is_some_and(|e| e.index <= index) {
            self.pop_front();
        }
    }

    pub(crate) fn clear(&mut self) {
        self.entries.clear();
        self.size_bytes = 0;
    }

    fn truncate_from(&mut self, index: u64) {
        while self.entries.back().is_some_and(|e| e.index >= index) {
            if let Some(e) = self.entries.pop_back() {
                self.size_bytes -= entry_size(&e);
            }
        }
    }

    /// Drops the oldest entries while over budget, never one at or after
    /// `keep_from` (not yet durable: over budget until its write lands).
    pub(crate) fn evict(&mut self, keep_from: Option<u64>) {
        while self.size_bytes > ENTRY_CACHE_MAX_BYTES
            || self.entries.len() > ENTRY_CACHE_MAX_ENTRIES
        {
            let front = self.first_index().unwrap_or(u64::MAX);
            if keep_from.is_some_and(|keep| front >= keep) {
                break;
            }
            self.pop_front();
        }
    }

    fn pop_front(&mut self) {
        if let Some(e) = self.entries.pop_front() {
            self.size_bytes -= entry_size(&e);
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

fn entry_size(entry: &Entry) -> usize {
    entry.compute_size() as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(index: u64, term: u64, payload_bytes: usize) -> Entry {
        Entry {
            index,
            term,
            data: vec![0u8; payload_bytes].into(),
            ..Default::default()
        }
    }

    #[test]
    fn append_truncates_conflicting_suffix_and_stays_contiguous() {
        let mut cache = EntryCache::default();
        cache.append(&[entry(1, 1, 1), entry(2, 1, 1), entry(3, 1, 1)], None);
        cache.append(&[entry(2, 2, 1)], None);
        assert_eq!(cache.len(), 2);
        assert_eq!(cache.get(2).map(|e| e.term), Some(2));
        assert!(cache.get(3).is_none());
        // A non-connecting append restarts the cache.
        cache.append(&[entry(10, 3, 1)], None);
        assert_eq!(cache.first_index(), Some(10));
        assert_eq!(cache.len(), 1);
    }

    #[test]
    fn eviction_keeps_the_newest_entries_within_budget() {
        let mut cache = EntryCache::default();
        let big = ENTRY_CACHE_MAX_BYTES / 4;
        for i in 1..=10 {
            cache.append(&[entry(i, 1, big)], None);
            assert!(cache.size_bytes <= ENTRY_CACHE_MAX_BYTES);
            assert_eq!(cache.entries.back().map(|e| e.index), Some(i));
        }
        assert!(cache.len() < 4);
        let many: Vec<Entry> = (11..11 + ENTRY_CACHE_MAX_ENTRIES as u64 + 5)
            .map(|i| entry(i, 1, 0))
            .collect();
        cache.append(&many, None);
        assert_eq!(cache.len(), ENTRY_CACHE_MAX_ENTRIES);
    }

    #[test]
    fn entries_not_yet_durable_stay_cached_over_budget_until_released() {
        let mut cache = EntryCache::default();
        let big = ENTRY_CACHE_MAX_BYTES / 4;
        cache.append(&[entry(1, 1, big), entry(2, 1, big)], None);
        // 3..=8 are staged, not durable: all of them stay, over budget.
        let staged: Vec<Entry> = (3..=8).map(|i| entry(i, 1, big)).collect();
        cache.append(&staged, Some(3));
        assert_eq!(cache.first_index(), Some(3), "only durable ones evicted");
        assert_eq!(cache.len(), 6);
        assert!(cache.size_bytes > ENTRY_CACHE_MAX_BYTES);
        // Durable now: back within budget, newest kept.
        cache.evict(None);
        assert!(cache.size_bytes <= ENTRY_CACHE_MAX_BYTES);
        assert_eq!(cache.entries.back().map(|e| e.index), Some(8));
    }

    #[test]
    fn compact_and_range() {
        let mut cache = EntryCache::default();
        cache.append(&(5..10).map(|i| entry(i, 1, 1)).collect::<Vec<_>>(), None);
        cache.compact_to(6);
        assert_eq!(cache.first_index(), Some(7));
        let got: Vec<u64> = cache.range(7, 9).map(|e| e.index).collect();
        assert_eq!(got, vec![7, 8]);
    }
}
