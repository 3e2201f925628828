#![no_main]
//! Target `api_requests`: see `fencelock_fuzz_targets::requests::api_requests`.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| fencelock_fuzz_targets::requests::api_requests(data));
