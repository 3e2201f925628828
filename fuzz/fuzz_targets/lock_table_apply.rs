#![no_main]
//! Target `lock_table_apply`: see `fencelock_fuzz_targets::apply::lock_table_apply`.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| fencelock_fuzz_targets::apply::lock_table_apply(data));
