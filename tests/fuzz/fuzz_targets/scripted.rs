//! See `toolfleet_orchestrator::fuzzing::scripted`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| toolfleet_orchestrator::fuzzing::scripted(data));
