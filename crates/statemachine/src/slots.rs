//! Which slot a resource lives in, and sets of slots.
//!
//! A resource name hashes (64-bit FNV-1a: stable across versions and
//! platforms, unlike `std`'s hasher) into a fixed space of [`SLOT_COUNT`]
//! slots. A shard owns a set of slots; the placement controller moves slots
//! between shards. The hash lives here, in the pure core, because the lock
//! table checks ownership at apply time: a request routed by a stale map is
//! refused by the shard that no longer (or not yet) owns the slot, never
//! applied by it.

use crate::name::ResourceName;

/// Size of the slot space. Fixed forever: changing it would move resources.
pub const SLOT_COUNT: u32 = 1024;
const WORDS: usize = (SLOT_COUNT as usize).div_ceil(64);

/// Stable 64-bit FNV-1a hash.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// The slot of a resource.
pub fn slot_of(resource: &ResourceName) -> u32 {
    slot_of_name(resource.as_str().as_bytes())
}

/// The slot of a resource name already validated elsewhere (the dedup
/// table's packed keys): the one formula [`slot_of`] uses.
pub(crate) fn slot_of_name(name: &[u8]) -> u32 {
    (fnv1a64(name) % u64::from(SLOT_COUNT)) as u32
}

/// A set of slots (a fixed-size bitmap: every set encodes to the same size).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SlotSet([u64; WORDS]);

impl SlotSet {
    /// No slots.
    pub const EMPTY: SlotSet = SlotSet([0; WORDS]);

    /// Every slot.
    pub fn full() -> SlotSet {
        (0..SLOT_COUNT).collect()
    }

    /// Whether `slot` is in the set (slots past the space never are).
    pub fn contains(&self, slot: u32) -> bool {
        slot < SLOT_COUNT && self.0[(slot / 64) as usize] & (1 << (slot % 64)) != 0
    }

    /// Adds `slot`; returns whether it was new.
    ///
    /// # Panics
    /// If `slot >= SLOT_COUNT` (callers validate input first).
    pub fn insert(&mut self, slot: u32) -> bool {
        assert!(slot < SLOT_COUNT, "slot {slot} out of range");
        let had = self.contains(slot);
        self.0[(slot / 64) as usize] |= 1 << (slot % 64);
        !had
    }

    pub fn len(&self) -> u32 {
        self.0.iter().map(|w| w.count_ones()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.0.iter().all(|&w| w == 0)
    }

    pub fn union(&self, other: &SlotSet) -> SlotSet {
        let mut out = *self;
        for (a, b) in out.0.iter_mut().zip(other.0.iter()) {
            *a |= b;
        }
        out
    }

    pub fn difference(&self, other: &SlotSet) -> SlotSet {
        let mut out = *self;
        for (a, b) in out.0.iter_mut().zip(other.0.iter()) {
            *a &= !b;
        }
        out
    }

    pub fn is_subset(&self, other: &SlotSet) -> bool {
        self.difference(other).is_empty()
    }

    pub fn is_disjoint(&self, other: &SlotSet) -> bool {
        self.0.iter().zip(other.0.iter()).all(|(a, b)| a & b == 0)
    }

    /// The slots in increasing order.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        (0..SLOT_COUNT).filter(|&s| self.contains(s))
    }

    /// Inclusive ranges of consecutive slots, in order.
    pub fn ranges(&self) -> Vec<(u32, u32)> {
        let mut out: Vec<(u32, u32)> = Vec::new();
        for s in self.iter() {
            match out.last_mut() {
                Some((_, end)) if *end + 1 == s => *end = s,
                _ => out.push((s, s)),
            }
        }
        out
    }

    /// The bitmap words, for encoders.
    pub fn words(&self) -> &[u64; WORDS] {
        &self.0
    }

    /// Rebuilds a set from [`SlotSet::words`]; refuses bits past the space.
    pub fn from_words(words: [u64; WORDS]) -> Option<SlotSet> {
        let set = SlotSet(words);
        (set.iter().count() as u32 == set.len()).then_some(set)
    }
}

impl FromIterator<u32> for SlotSet {
    /// # Panics
    /// If an item is `>= SLOT_COUNT`.
    fn from_iter<I: IntoIterator<Item = u32>>(iter: I) -> SlotSet {
        let mut set = SlotSet::EMPTY;
        for s in iter {
            set.insert(s);
        }
        set
    }
}

impl std::fmt::Debug for SlotSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SlotSet{self}")
    }
}

impl std::fmt::Display for SlotSet {
    /// `[0-3,8,10-12]`
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "[")?;
        for (i, (a, b)) in self.ranges().into_iter().enumerate() {
            if i > 0 {
                write!(f, ",")?;
            }
            if a == b {
                write!(f, "{a}")?;
            } else {
                write!(f, "{a}-{b}")?;
            }
        }
        write!(f, "]")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_is_the_published_fnv1a() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
    }

    #[test]
    fn slot_sets_behave_like_sets_of_integers() {
        let a: SlotSet = [1, 2, 3, 64, 1023].into_iter().collect();
        let b: SlotSet = [3, 64, 100].into_iter().collect();
        assert_eq!(a.len(), 5);
        assert!(a.contains(1023) && !a.contains(1024) && !a.contains(0));
        assert_eq!(a.union(&b).len(), 6);
        assert_eq!(
            a.difference(&b).iter().collect::<Vec<_>>(),
            vec![1, 2, 1023]
        );
        assert!(!a.is_disjoint(&b));
        assert!([3, 64].into_iter().collect::<SlotSet>().is_subset(&b));
        assert_eq!(a.ranges(), vec![(1, 3), (64, 64), (1023, 1023)]);
        assert_eq!(a.to_string(), "[1-3,64,1023]");
        assert_eq!(SlotSet::full().len(), SLOT_COUNT);
        assert_eq!(SlotSet::from_words(*a.words()), Some(a));
    }
}
