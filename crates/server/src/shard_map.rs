//! Which shard a resource belongs to.
//!
//! A resource name hashes (FNV-1a, 64 bit: stable across versions and
//! platforms, unlike `std`'s hasher) into a fixed space of slots; slots are
//! spread over the shards round-robin. The placement controller (sharding
//! issue) will own a stored slot → shard table; until then the assignment is
//! this fixed function of the shard count, identical on every node.

use fencelock_statemachine::ResourceName;

/// Size of the slot space. Fixed forever: changing it would move resources.
pub const SLOT_COUNT: u32 = 1024;

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
    (fnv1a64(resource.as_str().as_bytes()) % u64::from(SLOT_COUNT)) as u32
}

/// Maps resources to shard ids `1..=shard_count`.
#[derive(Clone, Copy, Debug)]
pub struct ShardMap {
    shard_count: u32,
}

impl ShardMap {
    pub fn new(shard_count: u32) -> ShardMap {
        assert!((1..=SLOT_COUNT).contains(&shard_count));
        ShardMap { shard_count }
    }

    pub fn shard_count(&self) -> u32 {
        self.shard_count
    }

    pub fn shard_of(&self, resource: &ResourceName) -> u64 {
        u64::from(slot_of(resource) % self.shard_count) + 1
    }

    /// The epoch a shard starts with. Until the placement controller hands out
    /// epochs from its replicated counter, shard `n` starts at epoch `n`:
    /// distinct per shard, so tokens of different shards never collide.
    pub fn initial_epoch(shard_id: u64) -> u64 {
        shard_id
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
    fn resources_spread_over_every_shard() {
        let map = ShardMap::new(8);
        let mut seen = [0u32; 8];
        for i in 0..1000 {
            let r = ResourceName::parse(&format!("acme/job-{i}")).unwrap();
            let s = map.shard_of(&r);
            assert!((1..=8).contains(&s));
            seen[(s - 1) as usize] += 1;
        }
        assert!(seen.iter().all(|&n| n > 60), "{seen:?}");
    }
}
