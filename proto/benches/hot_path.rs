//! The per-call work toolfleet does in its own code, one function at a
//! time, so that a regression shows up here before it shows up in
//! `toolfleet bench` (where it drowns in the noise of a 2-core machine):
//!
//! - the call's JSON on the bus: encoded by the orchestrator, decoded and
//!   checked by the worker;
//! - the argument check, which both sides run (a valid call, and an invalid
//!   one, which must stay cheap too);
//! - the stored result: encoded by the worker, read back and matched to its
//!   call by the orchestrator;
//! - a `tool_call_result` event's data, as every result commit writes it.
//!
//! `cargo bench -p toolfleet-proto --bench hot_path`

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::json;
use toolfleet_proto::envelope::StoredResult;
use toolfleet_proto::{Envelope, JobEvent, JobId, ToolCall, check_arguments, names};

/// A call as the bench's agent workload makes it, with a weather-like
/// schema (a required string and an enum).
fn call() -> ToolCall {
    ToolCall {
        job_id: "default-01a2331609e7c45b15842200694f".into(),
        call_id: "c7b085858d03e411dff618421".into(),
        attempt: 1,
        tool: "get_current_weather".into(),
        arguments: r#"{"location":"Boston, MA","unit":"celsius"}"#.into(),
        deadline_ms: Some(1_796_153_412_076),
        idempotency_key: "default-01a2331609e7c45b15842200694f:c7b085858d03e411dff618421".into(),
        reply_to: Some(names::reply_subject(
            &JobId::parse("default-01a2331609e7c45b15842200694f").expect("a job id"),
        )),
    }
}

fn validator() -> jsonschema::Validator {
    let schema = json!({
        "type": "object",
        "properties": {
            "location": {"type": "string", "minLength": 1},
            "unit": {"enum": ["celsius", "fahrenheit"]}
        },
        "required": ["location"],
        "additionalProperties": false
    });
    jsonschema::validator_for(&schema).expect("the schema compiles")
}

fn envelope() -> Envelope {
    Envelope::Ok(json!({"location": "Boston, MA", "temperature": 22, "unit": "celsius"}))
}

fn hot_path(c: &mut Criterion) {
    let call = call();
    let wire = serde_json::to_vec(&call).expect("a call encodes");
    c.bench_function("call/encode", |b| {
        b.iter(|| serde_json::to_vec(black_box(&call)))
    });
    c.bench_function("call/decode_and_check", |b| {
        b.iter(|| {
            let call: ToolCall = serde_json::from_slice(black_box(&wire)).expect("decodes");
            call.check().expect("a valid call");
            call
        })
    });

    let validator = validator();
    c.bench_function("arguments/valid", |b| {
        b.iter(|| {
            check_arguments(
                "get_current_weather",
                &validator,
                black_box(&call.arguments),
            )
        })
    });
    let invalid = r#"{"location":"","unit":"kelvin","extra":1}"#;
    c.bench_function("arguments/invalid", |b| {
        b.iter(|| check_arguments("get_current_weather", &validator, black_box(invalid)))
    });

    let stored = StoredResult::new(&call, envelope()).worked(Duration::from_micros(420));
    let text = stored.to_json();
    c.bench_function("result/encode", |b| {
        b.iter(|| {
            StoredResult::new(black_box(&call), envelope())
                .worked(Duration::from_micros(420))
                .to_json()
        })
    });
    c.bench_function("result/read_and_match", |b| {
        b.iter(|| {
            let record =
                StoredResult::read(black_box(&text), &call.tool, &call.arguments).expect("reads");
            assert!(record.answers(&call.tool, &call.arguments));
            record
        })
    });

    let event = JobEvent::ToolCallResult {
        attempts: 1,
        call_id: "call_0_1".into(),
        code: None,
        name: "get_current_weather".into(),
        ok: true,
        round_trip_us: Some(1830),
        source: None,
        worked_us: Some(420),
        tool_version: Some(
            "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08".into(),
        ),
    };
    c.bench_function("event/tool_call_result_data", |b| {
        b.iter(|| black_box(&event).data_json())
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = hot_path
}
criterion_main!(benches);
