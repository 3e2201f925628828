#![no_main]
//! Target `export_import`: see `fencelock_fuzz_targets::decode::export_import`.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| fencelock_fuzz_targets::decode::export_import(data));
