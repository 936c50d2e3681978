//! The argument check both sides run: a tool's schema (from the registry)
//! and a model's arguments, split at the first NUL byte.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let split = data.iter().position(|b| *b == 0).unwrap_or(data.len());
    let (schema, arguments) = data.split_at(split);
    let Ok(schema) = serde_json::from_slice::<serde_json::Value>(schema) else {
        return;
    };
    let Ok(validator) = jsonschema::validator_for(&schema) else {
        return;
    };
    let arguments = String::from_utf8_lossy(arguments.get(1..).unwrap_or_default());
    let _ = toolfleet_proto::check_arguments("fuzz", &validator, &arguments);
});
