//! The on-disk key layout: the one place that knows how keys are spelled.
//!
//! Every key starts with a one-byte *kind* tag; per-shard keys continue with
//! the shard id as a big-endian `u64`, and log-entry keys end with the entry
//! index as a big-endian `u64`. Big-endian makes the byte order equal to the
//! numeric order, so:
//!
//! - one shard's log is one contiguous key range (`[LOG, shard]` prefix),
//!   which makes "delete everything up to index i" a single range delete and
//!   "read entries [lo, hi)" a single forward scan;
//! - different shards' logs never interleave.
//!
//! | cf      | key                                   | value                                  |
//! |---------|---------------------------------------|----------------------------------------|
//! | `raft`  | `'l' shard_id index`                  | `eraftpb::Entry` (protobuf)            |
//! | `raft`  | `'h' shard_id`                        | `eraftpb::HardState` (protobuf)        |
//! | `raft`  | `'c' shard_id`                        | `eraftpb::ConfState` (protobuf)        |
//! | `raft`  | `'s' shard_id`                        | [`crate::shard_storage`] log state (fixed 25 bytes) |
//! | `apply` | `'a' shard_id`                        | applied index (`u64` big-endian)       |
//! | `apply` | `'m' shard_id`                        | `eraftpb::SnapshotMetadata` (protobuf) |
//! | `apply` | `'d' shard_id`                        | state-machine snapshot blob (opaque)   |
//! | `meta`  | `'v'`                                 | layout format version                  |
//! | `meta`  | `'i'`                                 | node identity (node id, cluster id)    |
//! | `meta`  | `'r' shard_id`                        | shard registration (empty value)       |
//!
//! The tags are distinct across column families on purpose: a key found in
//! the wrong family is then recognisably corrupt rather than silently
//! misread.

/// Log entry, `raft` cf.
pub const TAG_LOG: u8 = b'l';
/// Hard state, `raft` cf.
pub const TAG_HARD_STATE: u8 = b'h';
/// Conf state, `raft` cf.
pub const TAG_CONF_STATE: u8 = b'c';
/// Log state (truncated index/term, last index), `raft` cf.
pub const TAG_LOG_STATE: u8 = b's';
/// Applied index, `apply` cf.
pub const TAG_APPLIED: u8 = b'a';
/// State-machine snapshot metadata, `apply` cf.
pub const TAG_SNAPSHOT_META: u8 = b'm';
/// State-machine snapshot data, `apply` cf.
pub const TAG_SNAPSHOT_DATA: u8 = b'd';
/// Layout format version, `meta` cf.
pub const TAG_FORMAT_VERSION: u8 = b'v';
/// Node identity, `meta` cf.
pub const TAG_NODE_IDENT: u8 = b'i';
/// Shard registration, `meta` cf.
pub const TAG_SHARD: u8 = b'r';

/// Length of a per-shard key without a suffix: tag + shard id.
pub const SHARD_KEY_LEN: usize = 1 + 8;
/// Length of a log-entry key: tag + shard id + index.
pub const LOG_KEY_LEN: usize = 1 + 8 + 8;

/// `tag shard_id` — the key of a per-shard singleton record.
pub fn shard_key(tag: u8, shard_id: u64) -> Vec<u8> {
    let mut key = Vec::with_capacity(SHARD_KEY_LEN);
    key.push(tag);
    key.extend_from_slice(&shard_id.to_be_bytes());
    key
}

/// `'l' shard_id index` — the key of one log entry.
pub fn log_key(shard_id: u64, index: u64) -> Vec<u8> {
    let mut key = Vec::with_capacity(LOG_KEY_LEN);
    key.push(TAG_LOG);
    key.extend_from_slice(&shard_id.to_be_bytes());
    key.extend_from_slice(&index.to_be_bytes());
    key
}

/// Parses a log-entry key back into `(shard_id, index)`; `None` if `key` is
/// not a well-formed log key.
pub fn parse_log_key(key: &[u8]) -> Option<(u64, u64)> {
    if key.len() != LOG_KEY_LEN || key[0] != TAG_LOG {
        return None;
    }
    let shard_id = u64::from_be_bytes(key[1..9].try_into().ok()?);
    let index = u64::from_be_bytes(key[9..17].try_into().ok()?);
    Some((shard_id, index))
}

/// The half-open key range `[start, end)` covering log entries with index in
/// `[low, high)` of one shard.
pub fn log_range(shard_id: u64, low: u64, high: u64) -> (Vec<u8>, Vec<u8>) {
    (log_key(shard_id, low), log_key(shard_id, high))
}

/// The half-open key range covering *every* possible log entry of a shard,
/// including index `u64::MAX`.
///
/// The end key is the shard prefix followed by nine `0xff` bytes: longer than
/// any log key of the shard, so it sorts after all of them, and it still
/// sorts before any key of shard `shard_id + 1` (whose prefix is greater).
pub fn log_range_all(shard_id: u64) -> (Vec<u8>, Vec<u8>) {
    let start = log_key(shard_id, 0);
    let mut end = shard_key(TAG_LOG, shard_id);
    end.extend_from_slice(&[0xff; 9]);
    (start, end)
}

/// Single-byte key of a node-wide `meta` record.
pub fn meta_key(tag: u8) -> Vec<u8> {
    vec![tag]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_keys_sort_by_shard_then_index() {
        let mut keys = vec![
            log_key(2, 1),
            log_key(1, 256),
            log_key(1, 255),
            log_key(1, u64::MAX),
            log_key(0, 7),
        ];
        keys.sort();
        assert_eq!(
            keys,
            vec![
                log_key(0, 7),
                log_key(1, 255),
                log_key(1, 256),
                log_key(1, u64::MAX),
                log_key(2, 1),
            ]
        );
    }

    #[test]
    fn log_key_round_trips() {
        for (shard, index) in [(0, 0), (1, 2), (u64::MAX, u64::MAX), (7, 1 << 40)] {
            assert_eq!(parse_log_key(&log_key(shard, index)), Some((shard, index)));
        }
        assert_eq!(parse_log_key(&shard_key(TAG_LOG, 1)), None);
        assert_eq!(parse_log_key(&shard_key(TAG_HARD_STATE, 1)), None);
    }

    #[test]
    fn full_log_range_covers_all_indexes_of_one_shard_only() {
        let (start, end) = log_range_all(5);
        for index in [0, 1, u64::MAX - 1, u64::MAX] {
            let key = log_key(5, index);
            assert!(start <= key && key < end, "index {index}");
        }
        assert!(log_key(4, u64::MAX) < start);
        assert!(log_key(6, 0) >= end);
        // Shard u64::MAX has no successor prefix; the range must still be sane.
        let (start, end) = log_range_all(u64::MAX);
        assert!(start < end);
        assert!(log_key(u64::MAX, u64::MAX) < end);
    }
}
