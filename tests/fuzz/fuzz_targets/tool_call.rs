//! A tool call as a worker pulls it from the stream.
#![no_main]

use libfuzzer_sys::fuzz_target;
use toolfleet_proto::ToolCall;

fuzz_target!(|data: &[u8]| {
    let Ok(call) = serde_json::from_slice::<ToolCall>(data) else {
        return;
    };
    let _ = call.msg_id();
    let _ = ToolCall::default_idempotency_key(&call.job_id, &call.call_id);
    let json = serde_json::to_string(&call).expect("a call serializes");
    let back: ToolCall = serde_json::from_str(&json).expect("a call's JSON reads back");
    assert_eq!(serde_json::to_string(&back).unwrap(), json);
});
