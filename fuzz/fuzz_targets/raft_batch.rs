#![no_main]
//! Target `raft_batch`: see `fencelock_fuzz_targets::store::raft_batch`.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| fencelock_fuzz_targets::store::raft_batch(data));
