//! The API's limits and defaults (`api.*`).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::auth::AuthMode;
use crate::auth::jwt::IdentityOptions;

/// Limits and defaults of the API.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ApiOptions {
    /// Largest `input` (and `instructions`), in bytes. Default: 262144.
    pub max_input_bytes: usize,
    /// Largest `model.script`, in bytes. Default: 1048576.
    pub max_script_bytes: usize,
    /// `max_tool_rounds` when a request gives 0. Default: 8.
    pub default_max_tool_rounds: u32,
    /// Largest `max_tool_rounds` accepted. Default: 64.
    pub max_tool_rounds_limit: u32,
    /// Job deadline when a request gives 0. Default: 10m.
    #[serde(with = "toolfleet_service::config::duration")]
    pub default_deadline: Duration,
    /// Longest deadline accepted. Default: 24h.
    #[serde(with = "toolfleet_service::config::duration")]
    pub max_deadline: Duration,
    /// The model of a request that names none. Default: none, and such a
    /// request is rejected with a message naming what to set.
    pub default_model: DefaultModel,
    /// How callers authenticate: `tokens` (bearer tokens from
    /// `api.tokens_file`) or `none` (every caller is the tenant `default`).
    /// The orchestrator refuses to start with `tokens` and no file.
    /// Default: `tokens`.
    pub auth: AuthMode,
    /// The tokens file: per tenant, the SHA-256 of its tokens and the tools
    /// its jobs may use (docs/security.md). Reloaded when it changes.
    /// Default: none.
    pub tokens_file: Option<std::path::PathBuf>,
    /// The issuers whose JWT access tokens the API accepts beside the
    /// tokens file, and how their claims map to tenants, people and roles
    /// (docs/security.md, "Identity and roles"). Default: none.
    pub identity: IdentityOptions,
    /// How often the tokens file is checked for changes. Default: 2s.
    #[serde(with = "toolfleet_service::config::duration")]
    pub tokens_reload_interval: Duration,
    /// A tenant's jobs queued or running at once, unless its entry in the
    /// tokens file says otherwise; 0: no limit. Default: 1000.
    pub default_max_active_jobs: u32,
    /// A tenant's sustained submissions per second, unless its entry says
    /// otherwise; 0: no limit. Default: 100.
    pub default_submissions_per_second: f64,
    /// A tenant's tool calls in flight at once, unless its entry says
    /// otherwise; 0: no limit. Default: 1000.
    pub default_max_calls_in_flight: u32,
    /// Accept jobs for the scripted model, which plays a client-supplied
    /// script: for demos and tests, never for production traffic. Default:
    /// false (on in `toolfleet dev` and the test harness).
    #[serde(deserialize_with = "figment::util::bool_from_str_or_int")]
    pub allow_scripted: bool,
    /// Most `metadata` entries of a job. Default: 32.
    pub max_metadata_entries: usize,
    /// Longest `metadata` key, in bytes. Default: 64.
    pub max_metadata_key_bytes: usize,
    /// Longest `metadata` value, in bytes. Default: 512.
    pub max_metadata_value_bytes: usize,
    /// Longest `idempotency_key`, in bytes (letters, digits and `-_.:/=+`).
    /// Default: 128.
    pub max_idempotency_key_bytes: usize,
    /// Most names in `tools`. Default: 128.
    pub max_tools: usize,
    /// Longest `model.name`, in bytes. Default: 128.
    pub max_model_name_bytes: usize,
    /// Calls of one model turn that run; each call beyond it is answered
    /// with a terminal `TOO_MANY_CALLS` envelope and the job goes on.
    /// Default: 64.
    pub max_calls_per_turn: u32,
    /// Largest answer of the scripted model once it has quoted tool outputs;
    /// a longer one fails the job with `SCRIPT_ERROR`. Default: 1048576.
    pub max_scripted_answer_bytes: u64,
}

/// The model a request without one gets (`api.default_model`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DefaultModel {
    /// `openai-responses` or `openai-chat`. Default: empty (no default model).
    pub provider: String,
    /// The model name, e.g. `gpt-4.1-mini`. Default: empty.
    pub name: String,
}

impl Default for ApiOptions {
    fn default() -> Self {
        Self {
            max_input_bytes: 256 * 1024,
            max_script_bytes: 1024 * 1024,
            default_max_tool_rounds: 8,
            max_tool_rounds_limit: 64,
            default_deadline: Duration::from_secs(600),
            max_deadline: Duration::from_secs(24 * 3600),
            default_model: DefaultModel::default(),
            auth: AuthMode::Tokens,
            tokens_file: None,
            identity: IdentityOptions::default(),
            tokens_reload_interval: Duration::from_secs(2),
            default_max_active_jobs: 1000,
            default_submissions_per_second: 100.0,
            default_max_calls_in_flight: 1000,
            allow_scripted: false,
            max_metadata_entries: 32,
            max_metadata_key_bytes: 64,
            max_metadata_value_bytes: 512,
            max_idempotency_key_bytes: 128,
            max_tools: 128,
            max_model_name_bytes: 128,
            max_calls_per_turn: 64,
            max_scripted_answer_bytes: 1024 * 1024,
        }
    }
}
