#![no_main]
//! Target `snapshot_decode`: see `fencelock_fuzz_targets::decode::snapshot_decode`.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| fencelock_fuzz_targets::decode::snapshot_decode(data));
