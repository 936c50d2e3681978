//! A worker's registry announcement, as the orchestrator reads it from the
//! KV bucket: the manifest's schema is compiled, its retry policy applied.
#![no_main]

use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use toolfleet_proto::{RetryPolicy, WorkerAnnouncement};

fuzz_target!(|data: &[u8]| {
    let Ok(announcement) = serde_json::from_slice::<WorkerAnnouncement>(data) else {
        return;
    };
    let manifest = &announcement.manifest;
    let _ = jsonschema::validator_for(&manifest.parameters);
    let policy = manifest.retry_policy(RetryPolicy {
        initial_backoff_ms: 100,
        max_backoff_ms: 10_000,
        multiplier: 2.0,
        jitter: 0.2,
        max_attempts: 5,
    });
    for attempt in [0, 1, 2, 63, 64, 1025, u32::MAX] {
        let _ = policy.next_delay(attempt, None, 0.5);
        let _ = policy.next_delay(attempt, Some(Duration::from_millis(7)), f64::NAN);
    }
});
