#![no_main]
//! Target `placement_apply`: see `fencelock_fuzz_targets::placement_apply::placement_apply`.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| fencelock_fuzz_targets::placement_apply::placement_apply(data));
