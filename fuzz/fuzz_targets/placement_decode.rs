#![no_main]
//! Target `placement_decode`: see `fencelock_fuzz_targets::decode::placement_decode`.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| fencelock_fuzz_targets::decode::placement_decode(data));
