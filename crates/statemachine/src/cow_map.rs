//! An ordered map whose copy is cheap: the table's big maps (resources and
//! remembered acquires) live in one, so a snapshot can take a consistent
//! copy in microseconds and encode it on another thread while the table
//! keeps changing (issue 19: a 6 MB snapshot took 10–50 ms to copy *or*
//! to encode on a busy store loop; either is a stall).
//!
//! The entries are spread over [`COW_BUCKETS`] small `BTreeMap`s by a
//! stable hash of the key, each behind an `Arc`. A clone shares every
//! bucket. A write to a shared bucket copies that bucket only (about
//! `len / COW_BUCKETS` entries), so after a snapshot is taken the copying
//! is spread over the next writes instead of paid at once. Iteration
//! ([`CowMap::iter`]) merges the buckets back into key order, so
//! everything that reads the map in order (the snapshot encoding, the
//! waiter listing) sees exactly what a single `BTreeMap` would show.

use std::cmp::Ordering;
use std::collections::{btree_map, BTreeMap, BinaryHeap};
use std::fmt;
use std::ops::Bound;
use std::sync::Arc;

/// Most buckets a map grows to. With 60,000 remembered acquires in a shard
/// (the top `saturate` steps) a bucket holds about 15, so a write after a
/// snapshot copies about 15 entries; an iteration that applies a few
/// hundred commands copies a few thousand at most.
pub(crate) const COW_BUCKETS: usize = 4096;

/// Average entries per bucket past which a map doubles its buckets (up to
/// [`COW_BUCKETS`]). Small maps keep few buckets, so whole-map passes
/// (the debug build's checks after every apply) stay as cheap as a
/// `BTreeMap`'s; a doubling re-spreads every entry once, so it happens
/// about a dozen times in a map's life.
const ENTRIES_PER_BUCKET: usize = 16;

/// A key's stable spread over the buckets. It must be a function of the
/// key's value only (never of an address or a per-process seed), so two
/// equal maps have equal buckets.
pub(crate) trait Spread {
    fn spread(&self) -> u64;
}

/// See the module docs.
pub(crate) struct CowMap<K, V> {
    /// Empty until the first insert, then a power of two long, at most
    /// `COW_BUCKETS`; `None` is an empty bucket.
    buckets: Vec<Option<Arc<BTreeMap<K, V>>>>,
    len: usize,
}

/// `buckets` is a power of two.
fn bucket_of<K: Spread>(key: &K, buckets: usize) -> usize {
    debug_assert!(buckets.is_power_of_two());
    // The high half: a slot is the low bits of the same FNV hash, and a
    // shard owns a subset of slots, so low bits would use only a few
    // buckets per shard.
    ((key.spread() >> 32) as usize) & (buckets - 1)
}

impl<K, V> CowMap<K, V> {
    pub(crate) fn new() -> CowMap<K, V> {
        CowMap {
            buckets: Vec::new(),
            len: 0,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn filled(&self) -> impl Iterator<Item = &BTreeMap<K, V>> {
        self.buckets.iter().flatten().map(|b| &**b)
    }

    /// Every entry, bucket by bucket: for readers that do not care about
    /// order (sums, checks), without the merge.
    pub(crate) fn iter_unordered(&self) -> impl Iterator<Item = (&K, &V)> {
        self.filled().flat_map(|b| b.iter())
    }

    pub(crate) fn values_unordered(&self) -> impl Iterator<Item = &V> {
        self.filled().flat_map(|b| b.values())
    }

    pub(crate) fn keys_unordered(&self) -> impl Iterator<Item = &K> {
        self.filled().flat_map(|b| b.keys())
    }
}

impl<K: Ord + Clone + Spread, V: Clone> CowMap<K, V> {
    /// The key's bucket (0 while there are none: every lookup misses).
    fn bucket(&self, key: &K) -> usize {
        if self.buckets.is_empty() {
            return 0;
        }
        bucket_of(key, self.buckets.len())
    }

    pub(crate) fn get(&self, key: &K) -> Option<&V> {
        self.buckets.get(self.bucket(key))?.as_ref()?.get(key)
    }

    pub(crate) fn contains_key(&self, key: &K) -> bool {
        self.get(key).is_some()
    }

    /// Copies the key's bucket first if a snapshot still shares it (and
    /// only if the key is there: a miss copies nothing).
    pub(crate) fn get_mut(&mut self, key: &K) -> Option<&mut V> {
        self.writable(key)?.get_mut(key)
    }

    /// The key's bucket, to write to: copied first if a snapshot still
    /// shares it and the key is there. An unshared bucket (the usual case)
    /// is returned without a second lookup; a shared one is looked into
    /// first, so a miss copies nothing.
    fn writable(&mut self, key: &K) -> Option<&mut BTreeMap<K, V>> {
        let at = self.bucket(key);
        open_for_write(self.buckets.get_mut(at)?.as_mut()?, key)
    }

    /// [`CowMap::get_mut`] with the stored key (so a caller can share its
    /// allocation rather than keep an equal copy).
    pub(crate) fn get_key_value_mut(&mut self, key: &K) -> Option<(&K, &mut V)> {
        let exact = (Bound::Included(key), Bound::Included(key));
        self.writable(key)?.range_mut::<K, _>(exact).next()
    }

    pub(crate) fn insert(&mut self, key: K, value: V) -> Option<V> {
        if self.len >= self.buckets.len() * ENTRIES_PER_BUCKET && self.buckets.len() < COW_BUCKETS {
            self.respread((self.buckets.len() * 2).max(1));
        }
        let at = self.bucket(&key);
        let bucket = self.buckets[at].get_or_insert_with(Default::default);
        let old = Arc::make_mut(bucket).insert(key, value);
        if old.is_none() {
            self.len += 1;
        }
        old
    }

    pub(crate) fn remove(&mut self, key: &K) -> Option<V> {
        let at = self.bucket(key);
        let slot = self.buckets.get_mut(at)?;
        let map = open_for_write(slot.as_mut()?, key)?;
        let old = map.remove(key)?;
        if map.is_empty() {
            *slot = None;
        }
        self.len -= 1;
        Some(old)
    }

    /// Moves every entry into `buckets` buckets.
    fn respread(&mut self, buckets: usize) {
        let old = std::mem::take(&mut self.buckets);
        self.buckets.resize_with(buckets, || None);
        for bucket in old.into_iter().flatten() {
            for (key, value) in Arc::unwrap_or_clone(bucket) {
                let at = bucket_of(&key, buckets);
                let fresh = self.buckets[at].get_or_insert_with(Default::default);
                Arc::make_mut(fresh).insert(key, value);
            }
        }
    }

    /// Every entry in key order (a merge of the buckets).
    pub(crate) fn iter(&self) -> Iter<'_, K, V> {
        let mut heads = BinaryHeap::with_capacity(self.buckets.len().min(self.len));
        for bucket in self.filled() {
            let mut rest = bucket.iter();
            if let Some((key, value)) = rest.next() {
                heads.push(Head { key, value, rest });
            }
        }
        Iter {
            heads,
            left: self.len,
        }
    }

    /// Every entry, bucket by bucket, by value (copied out of buckets a
    /// snapshot still shares).
    pub(crate) fn into_unordered(self) -> impl Iterator<Item = (K, V)> {
        (self.buckets.into_iter().flatten()).flat_map(|b| Arc::unwrap_or_clone(b).into_iter())
    }

    /// Every entry, mutably, bucket by bucket. Copies every bucket a
    /// snapshot still shares: for rare whole-table passes only.
    pub(crate) fn iter_mut_unordered(&mut self) -> impl Iterator<Item = (&K, &mut V)> {
        (self.buckets.iter_mut().flatten()).flat_map(|b| Arc::make_mut(b).iter_mut())
    }
}

/// [`CowMap::writable`] for one bucket.
fn open_for_write<'a, K: Ord + Clone, V: Clone>(
    bucket: &'a mut Arc<BTreeMap<K, V>>,
    key: &K,
) -> Option<&'a mut BTreeMap<K, V>> {
    if Arc::get_mut(bucket).is_none() && !bucket.contains_key(key) {
        return None;
    }
    Some(Arc::make_mut(bucket))
}

impl<K, V> Default for CowMap<K, V> {
    fn default() -> Self {
        CowMap::new()
    }
}

/// Shares every bucket: O(`COW_BUCKETS`), whatever the size.
impl<K, V> Clone for CowMap<K, V> {
    fn clone(&self) -> Self {
        CowMap {
            buckets: self.buckets.clone(),
            len: self.len,
        }
    }
}

/// With as many buckets, equal entries are in equal buckets (the spread
/// is a function of the key), so buckets compare pairwise, shared ones
/// without a look; otherwise (one map grew and shrank) in key order.
impl<K: Ord + Clone + Spread, V: Clone + PartialEq> PartialEq for CowMap<K, V> {
    fn eq(&self, other: &Self) -> bool {
        if self.len != other.len {
            return false;
        }
        if self.buckets.len() != other.buckets.len() {
            return self.iter().eq(other.iter());
        }
        (self.buckets.iter().zip(&other.buckets)).all(|pair| match pair {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b) || a == b,
            _ => false,
        })
    }
}

impl<K: Ord + Clone + Spread, V: Clone + Eq> Eq for CowMap<K, V> {}

impl<K: Ord + Clone + Spread + fmt::Debug, V: Clone + fmt::Debug> fmt::Debug for CowMap<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

/// [`CowMap::iter`]: the next entry of every bucket in a min-heap.
pub(crate) struct Iter<'a, K, V> {
    heads: BinaryHeap<Head<'a, K, V>>,
    left: usize,
}

struct Head<'a, K, V> {
    key: &'a K,
    value: &'a V,
    rest: btree_map::Iter<'a, K, V>,
}

impl<K: Ord, V> Ord for Head<'_, K, V> {
    fn cmp(&self, other: &Self) -> Ordering {
        // Reversed: `BinaryHeap` pops the greatest, the merge wants the
        // least key first.
        other.key.cmp(self.key)
    }
}

impl<K: Ord, V> PartialOrd for Head<'_, K, V> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<K: Ord, V> PartialEq for Head<'_, K, V> {
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key
    }
}

impl<K: Ord, V> Eq for Head<'_, K, V> {}

impl<'a, K: Ord, V> Iterator for Iter<'a, K, V> {
    type Item = (&'a K, &'a V);

    fn next(&mut self) -> Option<Self::Item> {
        let mut head = self.heads.pop()?;
        let out = (head.key, head.value);
        if let Some((key, value)) = head.rest.next() {
            head.key = key;
            head.value = value;
            self.heads.push(head);
        }
        self.left -= 1;
        Some(out)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl<K: Ord, V> ExactSizeIterator for Iter<'_, K, V> {}

#[cfg(test)]
mod tests {
    use super::*;

    impl Spread for u64 {
        fn spread(&self) -> u64 {
            crate::slots::fnv1a64(&self.to_be_bytes())
        }
    }

    fn filled(n: u64) -> CowMap<u64, u64> {
        let mut m = CowMap::new();
        for k in 0..n {
            assert_eq!(m.insert(k * 7 % n, k), None);
        }
        m
    }

    #[test]
    fn it_reads_like_a_btree_map_in_key_order() {
        let mut m = filled(10_000);
        let mut reference: BTreeMap<u64, u64> = m.iter().map(|(k, v)| (*k, *v)).collect();
        assert_eq!(m.len(), 10_000);
        assert!(m.iter().map(|(k, _)| *k).eq(0..10_000));
        for k in (0..10_000).step_by(3) {
            assert_eq!(m.remove(&k), reference.remove(&k));
        }
        assert_eq!(m.remove(&3), None, "removed already");
        *m.get_mut(&1).unwrap() = 98;
        let (stored, value) = m.get_key_value_mut(&1).unwrap();
        assert_eq!((*stored, *value), (1, 98));
        *value = 99;
        *reference.get_mut(&1).unwrap() = 99;
        assert_eq!(m.get_mut(&3), None);
        assert!(m.iter().eq(reference.iter()));
        assert_eq!(m.iter().len(), reference.len());
        assert_eq!(m.len(), reference.len());
        assert!(m.contains_key(&1) && !m.contains_key(&0));
        let mut sum: u64 = m.values_unordered().sum();
        assert_eq!(sum, reference.values().sum());
        for (_, v) in m.iter_mut_unordered() {
            *v += 1;
        }
        sum += reference.len() as u64;
        assert_eq!(m.iter_unordered().map(|(_, v)| *v).sum::<u64>(), sum);
        let kept = m.clone();
        let mut all: Vec<(u64, u64)> = m.into_unordered().collect();
        all.sort_unstable();
        assert!(all.iter().map(|(k, v)| (k, v)).eq(kept.iter()));
    }

    #[test]
    fn a_copy_keeps_what_it_saw_while_the_original_changes() {
        let mut live = filled(5_000);
        let frozen = live.clone();
        let before: Vec<(u64, u64)> = frozen.iter().map(|(k, v)| (*k, *v)).collect();
        for k in 0..2_500 {
            live.remove(&k);
        }
        *live.get_mut(&4_000).unwrap() = 0;
        live.insert(9_999, 1);
        assert!(frozen.iter().map(|(k, v)| (*k, *v)).eq(before));
        assert_eq!(frozen.len(), 5_000);
        assert_eq!(live.len(), 2_501);
        assert_ne!(live, frozen);
    }

    #[test]
    fn a_write_copies_only_its_own_bucket() {
        let mut live = filled(50_000);
        let frozen = live.clone();
        *live.get_mut(&17).unwrap() = 0;
        assert_eq!(live.buckets.len(), COW_BUCKETS);
        let shared = (0..COW_BUCKETS)
            .filter(|&i| match (&live.buckets[i], &frozen.buckets[i]) {
                (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                _ => false,
            })
            .count();
        let filled = frozen.buckets.iter().flatten().count();
        assert_eq!(shared, filled - 1, "only the written bucket was copied");
    }

    #[test]
    fn equal_maps_compare_equal_whatever_their_history() {
        let a = filled(1_000);
        let mut b = CowMap::new();
        for k in (0..2_000).rev() {
            b.insert(k, 0);
        }
        for k in 1_000..2_000 {
            b.remove(&k);
        }
        for (k, v) in a.iter() {
            *b.get_mut(k).unwrap() = *v;
        }
        assert!(
            b.buckets.len() > a.buckets.len(),
            "b grew further, then shrank"
        );
        assert_eq!(a, b);
        assert_eq!(CowMap::<u64, u64>::new(), filled(0));
        assert_eq!(filled(3).buckets.len(), 1, "a small map stays small");
        assert_ne!(a, CowMap::new());
    }
}
