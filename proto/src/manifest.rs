//! What a worker announces about each tool it serves.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The description of a tool: what the model sees (name, description, JSON
/// Schema) and how the fleet treats its calls.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolManifest {
    /// `verb_object`, matching `^[a-zA-Z0-9_-]{1,64}$` (the OpenAI function name rule).
    pub name: String,
    /// When to use the tool and when not; shown to the model.
    pub description: String,
    /// JSON Schema of the arguments object.
    pub parameters: Value,
    /// Whether the schema is strict (OpenAI structured outputs): every property
    /// required and `additionalProperties: false`.
    pub strict: bool,
    /// How long one attempt may run, in milliseconds.
    pub timeout_ms: u64,
    /// How many attempts the orchestrator makes for a retryable failure.
    pub max_attempts: u32,
    /// Whether a call changes something outside the worker. Such a call whose
    /// outcome is unknown is never re-executed blindly.
    pub side_effects: bool,
    /// Version of the tool's implementation, free-form.
    pub version: String,
}

impl ToolManifest {
    /// A manifest with the defaults: strict schema, 10 s timeout, 3 attempts,
    /// no side effects, version "1".
    pub fn new(name: impl Into<String>, description: impl Into<String>, parameters: Value) -> Self {
        Self {
            name: name.into(),
            description: description.into(),
            parameters,
            strict: true,
            timeout_ms: 10_000,
            max_attempts: 3,
            side_effects: false,
            version: "1".into(),
        }
    }

    /// Sets the per-attempt timeout.
    #[must_use]
    pub fn with_timeout(mut self, timeout: std::time::Duration) -> Self {
        self.timeout_ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        self
    }

    /// Sets how many attempts a retryable failure gets.
    #[must_use]
    pub fn with_max_attempts(mut self, max_attempts: u32) -> Self {
        self.max_attempts = max_attempts.max(1);
        self
    }

    /// Marks the tool as changing something outside the worker.
    #[must_use]
    pub fn with_side_effects(mut self) -> Self {
        self.side_effects = true;
        self
    }

    /// Marks the schema as not strict (optional properties allowed).
    #[must_use]
    pub fn non_strict(mut self) -> Self {
        self.strict = false;
        self
    }
}

/// A tool name is valid when it is 1 to 64 ASCII letters, digits, `_` or `-`.
/// The same rule keeps it safe as a NATS subject token and a consumer name.
pub fn is_valid_tool_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The registry entry a worker keeps alive for each tool it serves.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerAnnouncement {
    /// The announcing worker process.
    pub worker_id: String,
    /// The tool it serves.
    pub manifest: ToolManifest,
    /// Unix epoch milliseconds of the heartbeat that wrote this entry.
    pub heartbeat_ms: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_names_follow_the_openai_rule() {
        assert!(is_valid_tool_name("get_current_weather"));
        assert!(is_valid_tool_name("a-b_9"));
        for bad in ["", "run.shell", "x>", "a b", "é", &"x".repeat(65)] {
            assert!(!is_valid_tool_name(bad), "{bad:?}");
        }
    }
}
