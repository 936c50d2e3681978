//! The argument check both sides run: the orchestrator before it dispatches
//! a call (a bad call costs no round trip), the worker before it executes one
//! (it never trusts the wire). One implementation, so the model gets the same
//! envelope from either.

use crate::envelope::{Envelope, ErrorCode};

/// Parses `arguments` and validates them against a tool's compiled schema.
///
/// # Errors
///
/// The `INVALID_TOOL_ARGUMENTS` envelope to answer with, naming up to five
/// problems with their JSON paths.
pub fn check_arguments(
    tool: &str,
    validator: &jsonschema::Validator,
    arguments: &str,
) -> Result<serde_json::Value, Envelope> {
    let args: serde_json::Value = serde_json::from_str(arguments).map_err(|err| {
        Envelope::terminal(
            ErrorCode::INVALID_TOOL_ARGUMENTS,
            format!("arguments are not valid JSON: {err}"),
        )
    })?;
    let problems: Vec<String> = validator
        .iter_errors(&args)
        .take(5)
        .map(|e| {
            let path = e.instance_path().to_string();
            if path.is_empty() {
                e.to_string()
            } else {
                format!("{path}: {e}")
            }
        })
        .collect();
    if problems.is_empty() {
        Ok(args)
    } else {
        Err(Envelope::terminal(
            ErrorCode::INVALID_TOOL_ARGUMENTS,
            format!(
                "arguments do not match the schema of {tool}: {}",
                problems.join("; ")
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn bad_json_and_schema_violations_become_invalid_tool_arguments() {
        let schema = json!({"type": "object", "additionalProperties": false,
                            "required": ["location"],
                            "properties": {"location": {"type": "string", "minLength": 2}}});
        let validator = jsonschema::validator_for(&schema).unwrap();
        assert_eq!(
            check_arguments("w", &validator, r#"{"location":"Boston"}"#).unwrap(),
            json!({"location": "Boston"})
        );
        for (arguments, says) in [
            ("{not json", "not valid JSON"),
            (r#"{"location":"B"}"#, "/location"),
            (r#"{"location":"Boston","unit":"k"}"#, "unit"),
            ("[]", "schema of w"),
        ] {
            let envelope = check_arguments("w", &validator, arguments).unwrap_err();
            let error = envelope.error().expect("an error envelope");
            assert_eq!(error.code, ErrorCode::INVALID_TOOL_ARGUMENTS, "{arguments}");
            assert!(!error.retryable);
            assert!(
                error.message.contains(says),
                "{arguments}: {}",
                error.message
            );
        }
    }
}
