#![no_main]
//! Target `command_decode`: see `fencelock_fuzz_targets::decode::command_decode`.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| fencelock_fuzz_targets::decode::command_decode(data));
