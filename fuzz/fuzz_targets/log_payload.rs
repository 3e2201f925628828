#![no_main]
//! Target `log_payload`: see `fencelock_fuzz_targets::store::log_payload`.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| fencelock_fuzz_targets::store::log_payload(data));
