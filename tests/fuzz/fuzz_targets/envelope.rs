//! A result envelope as a worker (or anyone on the bus) publishes it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use toolfleet_proto::Envelope;

fuzz_target!(|data: &[u8]| {
    let Ok(envelope) = serde_json::from_slice::<Envelope>(data) else {
        return;
    };
    let _ = (envelope.is_ok(), envelope.error().map(|e| e.code.as_str().len()));
    // What the orchestrator stores must read back as the same envelope.
    let json = envelope.to_json();
    let back: Envelope = serde_json::from_str(&json).expect("an envelope's JSON reads back");
    assert_eq!(back.to_json(), json);
});
