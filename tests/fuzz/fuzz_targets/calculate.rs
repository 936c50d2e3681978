//! See `toolfleet_worker::fuzzing::calculate`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| toolfleet_worker::fuzzing::calculate(data));
