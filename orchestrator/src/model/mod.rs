//! Model providers behind one provider-neutral conversation model.
//!
//! The runner keeps a job's conversation as a list of [`Item`]s, stored in
//! Redis. Each provider module translates that list into its wire format and
//! the model's answer back into items:
//! - `openai_responses`: the OpenAI Responses API;
//! - `chat_completions`: OpenAI Chat Completions, also spoken by vLLM,
//!   Ollama, llama.cpp server and most gateways;
//! - `anthropic_messages`: Anthropic's Messages API;
//! - `scripted`: a deterministic model that plays a script from the job spec;
//! - `one_call`: no model, the one call of a call job.

pub(crate) mod anthropic_messages;
pub(crate) mod api_key;
pub(crate) mod chat_completions;
pub(crate) mod http;
pub(crate) mod mask;
pub(crate) mod one_call;
pub(crate) mod openai_responses;
mod options;
pub(crate) mod scripted;

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub(crate) use crate::job::Usage;
pub(crate) use anthropic_messages::AnthropicOptions;
pub(crate) use http::BuildError;
pub(crate) use options::{Api, HttpOptions};

use crate::job::{Item, JobErrorCode, JobSpec, ProviderKind, assistant_text};
use mask::Mask;

/// A tool as the model is told about it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct ToolSpec {
    /// Function name.
    pub name: String,
    /// When to use it.
    pub description: String,
    /// JSON Schema of the arguments object.
    pub parameters: Value,
    /// Strict schema adherence (sent explicitly, never left to defaults).
    pub strict: bool,
}

/// Everything a provider needs for one model turn.
#[derive(Clone, Copy)]
pub(crate) struct TurnRequest<'a> {
    /// The provider's model name.
    pub model: &'a str,
    /// System / developer instructions; resent on every turn.
    pub instructions: &'a str,
    /// The conversation so far.
    pub items: &'a [Item],
    /// The tools the model may call.
    pub tools: &'a [ToolSpec],
    /// Whether the model may make several calls in one turn.
    pub parallel_tool_calls: bool,
    /// 0-based index of this turn within the job.
    pub turn: u32,
    /// The most tokens the model may write in this turn, when the job says.
    pub max_tokens: Option<u32>,
    /// Where the turn's deltas go as the model writes it: set for a
    /// streamed job, whose provider then asks for a streamed answer.
    pub deltas: Option<DeltaSink<'a>>,
}

// By hand: a sink has no Debug.
impl std::fmt::Debug for TurnRequest<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TurnRequest")
            .field("model", &self.model)
            .field("items", &self.items.len())
            .field("tools", &self.tools.len())
            .field("parallel_tool_calls", &self.parallel_tool_calls)
            .field("turn", &self.turn)
            .field("max_tokens", &self.max_tokens)
            .field("streamed", &self.deltas.is_some())
            .finish_non_exhaustive()
    }
}

/// A piece of a turn as the model writes it, before the turn is whole and
/// checkpointed (a streamed job's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Delta {
    /// More of the answer's text.
    Text(String),
    /// A tool call, named as soon as the model names it; `index` is its
    /// position among the turn's calls.
    ToolCall {
        /// 0-based, in the turn's order.
        index: usize,
        /// The tool's name as the model wrote it.
        name: String,
    },
    /// The provider asks the model again (its answer broke off): what was
    /// sent of the turn so far is void.
    Restart,
}

/// Where a streamed turn's deltas go.
pub(crate) type DeltaSink<'a> = &'a (dyn Fn(Delta) + Send + Sync);

/// A streamed turn's deltas as a provider's attempts send them, masked of
/// the key each attempt was sent with: a new attempt after one that sent
/// anything first says [`Delta::Restart`]; text that could begin the key
/// waits for the next piece (or the end) before it is sent.
pub(crate) struct DeltaOut<'a> {
    sink: DeltaSink<'a>,
    /// Whether this attempt sent a delta.
    sent: bool,
    mask: Mask,
    /// The end of the text so far that could be the start of the key.
    held: String,
}

impl<'a> DeltaOut<'a> {
    pub(crate) fn new(sink: DeltaSink<'a>) -> Self {
        Self {
            sink,
            sent: false,
            mask: Mask::default(),
            held: String::new(),
        }
    }

    pub(crate) fn send(&mut self, delta: Delta) {
        let delta = match delta {
            Delta::Text(piece) => {
                let (now, held) = self.mask.stream(&self.held, &piece);
                self.held = held;
                if now.is_empty() {
                    return;
                }
                Delta::Text(now)
            }
            Delta::ToolCall { index, name } => {
                self.flush();
                Delta::ToolCall {
                    index,
                    name: self.mask.text(name),
                }
            }
            Delta::Restart => Delta::Restart,
        };
        self.sent = true;
        (self.sink)(delta);
    }

    /// The text held back, sent: the answer is whole.
    pub(crate) fn flush(&mut self) {
        let held = std::mem::take(&mut self.held);
        if !held.is_empty() {
            self.sent = true;
            (self.sink)(Delta::Text(held));
        }
    }

    /// A new attempt starts, sent with the key `mask` masks: what the last
    /// one sent is void.
    pub(crate) fn restart(&mut self, mask: Mask) {
        self.mask = mask;
        self.held.clear();
        if std::mem::take(&mut self.sent) {
            (self.sink)(Delta::Restart);
        }
    }
}

/// What the model produced in one turn: assistant text, tool calls and
/// reasoning items, in the provider's order.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Turn {
    /// The output items.
    pub items: Vec<Item>,
    /// The tokens the turn used, when the provider said.
    pub usage: Option<Usage>,
    /// What the provider said of its answer beside it, for the turn's span.
    pub answered: Answered,
}

/// What a provider said of an answer beside the answer itself, each in its
/// own words and when it said it: for the GenAI conventions' attributes of
/// the turn's span, and nothing else.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Answered {
    /// The model that answered (`gen_ai.response.model`).
    pub model: Option<String>,
    /// The provider's id of the answer (`gen_ai.response.id`).
    pub id: Option<String>,
    /// Why the model stopped (`gen_ai.response.finish_reasons`).
    pub finish_reason: Option<String>,
}

/// The longest of the provider's words an [`Answered`] keeps: a model
/// name, an id or a reason is short, and anything longer is not one.
const MAX_ANSWERED_LEN: usize = 256;

impl Answered {
    /// The `model` and `id` of `response`, and the first of the
    /// `finish_reason` pointers it has: each a string of at most 256
    /// bytes, else none.
    pub(crate) fn read(response: &Value, finish_reason: &[&str]) -> Self {
        let text = |pointer: &str| {
            response
                .pointer(pointer)
                .and_then(Value::as_str)
                .filter(|text| !text.is_empty() && text.len() <= MAX_ANSWERED_LEN)
                .map(str::to_owned)
        };
        Self {
            model: text("/model"),
            id: text("/id"),
            finish_reason: finish_reason.iter().find_map(|pointer| text(pointer)),
        }
    }
}

/// The usage of an OpenAI response, with the two names OpenAI's APIs use
/// (`input_tokens`/`output_tokens` in Responses, `prompt_tokens`/
/// `completion_tokens` in Chat Completions), and the cached tokens of their
/// `*_tokens_details`. Absent or malformed: none.
pub(crate) fn openai_usage(response: &Value) -> Option<Usage> {
    let usage = response.get("usage")?;
    let count = |names: [&str; 2]| {
        names
            .iter()
            .find_map(|name| usage.get(*name).and_then(Value::as_u64))
    };
    let details = ["input_tokens_details", "prompt_tokens_details"]
        .iter()
        .find_map(|name| usage.get(*name));
    let cache_read_tokens = details
        .and_then(|details| details.get("cached_tokens"))
        .and_then(Value::as_u64)
        .unwrap_or(0);
    Some(Usage {
        input_tokens: count(["input_tokens", "prompt_tokens"])?,
        output_tokens: count(["output_tokens", "completion_tokens"])?,
        cache_read_tokens,
        cache_write_tokens: 0,
    })
}

/// The usage of a Messages response. Anthropic counts cached prompt tokens
/// apart from `input_tokens`; here they are part of it, as in OpenAI's
/// counts. Absent or malformed: none.
pub(crate) fn anthropic_usage(response: &Value) -> Option<Usage> {
    let usage = response.get("usage")?;
    let count = |name: &str| usage.get(name).and_then(Value::as_u64);
    let cache_read_tokens = count("cache_read_input_tokens").unwrap_or(0);
    let cache_write_tokens = count("cache_creation_input_tokens").unwrap_or(0);
    Some(Usage {
        input_tokens: count("input_tokens")? + cache_read_tokens + cache_write_tokens,
        output_tokens: count("output_tokens")?,
        cache_read_tokens,
        cache_write_tokens,
    })
}

impl Turn {
    /// The tool calls of the turn, in order.
    pub(crate) fn tool_calls(&self) -> impl Iterator<Item = &Item> {
        self.items
            .iter()
            .filter(|item| matches!(item, Item::ToolCall { .. }))
    }

    /// The concatenated assistant text of the turn.
    pub(crate) fn text(&self) -> String {
        assistant_text(&self.items)
    }
}

/// Why a model turn failed after the provider's own retries.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The provider refused the request (a 4xx other than 408/409/429, or a
    /// quota error). Retrying won't help: fail the job.
    #[error("the model API rejected the request (HTTP {status}): {message}")]
    Rejected {
        /// HTTP status.
        status: u16,
        /// The provider's error code, e.g. `insufficient_quota`.
        code: Option<String>,
        /// The provider's message.
        message: String,
    },
    /// Transient failures (429, 5xx, timeouts, connection errors) outlasted the
    /// retry budget.
    #[error("the model API is unavailable: {0}")]
    Unavailable(String),
    /// The response could not be understood.
    #[error("the model API sent an invalid response: {0}")]
    InvalidResponse(String),
    /// The scripted model's script is invalid or has no turn left.
    #[error("script error: {0}")]
    Script(String),
    /// The provider could not be built from its configuration (its key
    /// file, a header, the HTTP client): no request was sent. Retrying
    /// won't help until the configuration is fixed: fail the job.
    // The build error's text is the job's message, so it is formatted in
    // rather than kept as a source only the log would show.
    #[error("the model provider cannot be built: {0}")]
    Unbuilt(BuildError),
}

impl ModelError {
    /// The job error code for this failure.
    pub fn code(&self) -> JobErrorCode {
        match self {
            // Unbuilt as the model API's refusal was, before it had a
            // variant of its own: the job's code is unchanged.
            Self::Rejected { .. } | Self::Unbuilt(_) => JobErrorCode::ModelRejected,
            Self::Unavailable(_) => JobErrorCode::ModelUnavailable,
            Self::InvalidResponse(_) => JobErrorCode::ModelInvalidResponse,
            Self::Script(_) => JobErrorCode::ScriptError,
        }
    }
}

/// A model behind some wire format.
pub(crate) trait Provider: Send + Sync {
    /// Runs one model turn.
    fn turn<'a>(&'a self, request: TurnRequest<'a>) -> BoxFuture<'a, Result<Turn, ModelError>>;
}

/// A provider built on first use, or why it could not be.
type Lazy<P> = std::sync::OnceLock<Result<Arc<P>, BuildError>>;

/// The providers of this process, built once and shared by all jobs.
pub(crate) struct Providers {
    openai: OpenAiOptions,
    anthropic: AnthropicOptions,
    responses: Lazy<openai_responses::OpenAiResponses>,
    chat: Lazy<chat_completions::ChatCompletions>,
    messages: Lazy<anthropic_messages::AnthropicMessages>,
}

impl Providers {
    /// Providers configured with `openai` and `anthropic`; HTTP clients
    /// are built on first use.
    pub(crate) fn new(openai: OpenAiOptions, anthropic: AnthropicOptions) -> Self {
        Self {
            openai,
            anthropic,
            responses: Lazy::new(),
            chat: Lazy::new(),
            messages: Lazy::new(),
        }
    }

    /// Whether the API key `provider` needs is configured; `None` when it
    /// needs none.
    pub(crate) fn has_api_key(&self, provider: &ProviderKind) -> Option<bool> {
        match provider {
            ProviderKind::OpenaiResponses | ProviderKind::OpenaiChat => {
                Some(self.openai.has_api_key())
            }
            ProviderKind::AnthropicMessages => Some(self.anthropic.has_api_key()),
            ProviderKind::Scripted | ProviderKind::Call => None,
        }
    }

    /// The provider of a job.
    ///
    /// # Errors
    ///
    /// [`ModelError::Script`] for an invalid script, [`ModelError::Unbuilt`]
    /// when a provider cannot be built from its configuration.
    pub(crate) fn for_job(&self, spec: &JobSpec) -> Result<Arc<dyn Provider>, ModelError> {
        match spec.provider {
            ProviderKind::Scripted => {
                let script = spec.script.as_deref().unwrap_or_default();
                let scripted = scripted::Scripted::parse(script)?
                    .with_answer_limit(spec.limits.max_scripted_answer_bytes);
                Ok(Arc::new(scripted))
            }
            ProviderKind::Call => {
                let call = spec
                    .call
                    .clone()
                    .ok_or(ModelError::Script("a call job without its call".to_owned()))?;
                Ok(Arc::new(one_call::OneCall::new(call)))
            }
            ProviderKind::OpenaiResponses => shared(&self.responses, || {
                openai_responses::OpenAiResponses::new(&self.openai)
            }),
            ProviderKind::OpenaiChat => shared(&self.chat, || {
                chat_completions::ChatCompletions::new(&self.openai)
            }),
            ProviderKind::AnthropicMessages => shared(&self.messages, || {
                anthropic_messages::AnthropicMessages::new(&self.anthropic)
            }),
        }
    }
}

/// The provider in `cell`, built by `build` on first use.
fn shared<P: Provider + 'static>(
    cell: &Lazy<P>,
    build: impl FnOnce() -> Result<P, BuildError>,
) -> Result<Arc<dyn Provider>, ModelError> {
    cell.get_or_init(|| build().map(Arc::new))
        .clone()
        .map(|provider| provider as Arc<dyn Provider>)
        .map_err(ModelError::Unbuilt)
}

/// The OpenAI-compatible APIs: the `openai` section's defaults and key.
#[derive(Debug, Clone, Copy)]
pub struct OpenAi;

impl Api for OpenAi {
    const SECTION: &'static str = "openai";
    const BASE_URL: &'static str = "https://api.openai.com/v1";
    const BASE_URL_VAR: &'static str = "OPENAI_BASE_URL";
    const API_KEY_VAR: &'static str = "OPENAI_API_KEY";
    const KEY_HEADER: &'static str = "authorization";
    const BEARER: bool = true;
    const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);
}

/// Settings of the OpenAI-compatible providers (the `openai` section):
/// only the keys every HTTP provider has.
pub(crate) type OpenAiOptions = HttpOptions<OpenAi>;

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::json;

    use super::*;

    #[test]
    fn what_a_provider_said_of_its_answer_is_kept_when_it_is_short_text() {
        let response = json!({
            "id": "resp_1", "model": "gpt-test", "status": "incomplete",
            "incomplete_details": {"reason": "max_output_tokens"},
        });
        let pointers = ["/incomplete_details/reason", "/status"];
        assert_eq!(
            Answered::read(&response, &pointers),
            Answered {
                model: Some("gpt-test".into()),
                id: Some("resp_1".into()),
                finish_reason: Some("max_output_tokens".into()),
            }
        );
        // The first pointer there is, and nothing for what is not text,
        // empty or too long to be a name.
        let odd = json!({
            "id": 7, "model": "m".repeat(MAX_ANSWERED_LEN + 1), "status": "completed",
            "incomplete_details": null,
        });
        assert_eq!(
            Answered::read(&odd, &pointers),
            Answered {
                finish_reason: Some("completed".into()),
                ..Answered::default()
            }
        );
        assert_eq!(
            Answered::read(&json!({"model": ""}), &pointers),
            Answered::default()
        );
    }

    /// A job's provider whose key file cannot be read fails the job as
    /// the model API's refusal did (`MODEL_REJECTED`), saying why; and so
    /// does the next job, from the one build.
    #[test]
    fn a_provider_that_cannot_be_built_fails_its_jobs_with_the_reason() {
        let mut anthropic = AnthropicOptions::default();
        anthropic.http.api_key = None;
        anthropic.http.api_key_file = Some("/nonexistent/toolfleet/key".into());
        let providers = Providers::new(OpenAiOptions::default(), anthropic);
        let spec = JobSpec {
            input: "hi".into(),
            instructions: String::new(),
            provider: ProviderKind::AnthropicMessages,
            model: "claude-test".into(),
            script: None,
            max_tokens: None,
            stream: false,
            no_result_cache: false,
            call: None,
            tools: Vec::new(),
            max_tool_rounds: 2,
            parallel_tool_calls: true,
            deadline_ms: 1_000,
            metadata: BTreeMap::new(),
            tenant: "default".into(),
            submitter: None,
            approval: Default::default(),
            limits: Default::default(),
            budget: Default::default(),
        };
        for _ in 0..2 {
            let Err(err) = providers.for_job(&spec) else {
                panic!("built without its key file");
            };
            assert!(
                matches!(&err, ModelError::Unbuilt(BuildError::ApiKey(m)) if m.contains("anthropic.api_key_file")),
                "{err:?}"
            );
            assert_eq!(err.code(), JobErrorCode::ModelRejected);
            assert!(
                err.to_string()
                    .starts_with("the model provider cannot be built: anthropic.api_key_file"),
                "{err}"
            );
        }
    }

    #[test]
    fn usage_is_read_in_both_apis_spellings_and_malformed_usage_is_none() {
        let responses = serde_json::json!({"usage": {"input_tokens": 12, "output_tokens": 5}});
        let chat = serde_json::json!({"usage": {"prompt_tokens": 7, "completion_tokens": 3}});
        assert_eq!(
            openai_usage(&responses),
            Some(Usage {
                input_tokens: 12,
                output_tokens: 5,
                ..Usage::default()
            })
        );
        assert_eq!(
            openai_usage(&chat),
            Some(Usage {
                input_tokens: 7,
                output_tokens: 3,
                ..Usage::default()
            })
        );
        for bad in [
            serde_json::json!({}),
            serde_json::json!({"usage": null}),
            serde_json::json!({"usage": {"input_tokens": -1, "output_tokens": 2}}),
            serde_json::json!({"usage": {"input_tokens": "12", "output_tokens": 2}}),
        ] {
            assert_eq!(openai_usage(&bad), None, "{bad}");
        }
    }
}
