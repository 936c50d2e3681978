//! The optional model of the knowledge-graph tools (`kg.model`): any server
//! that speaks OpenAI's Chat Completions. It maps a word to a predicate when
//! no rule does, and writes trend summaries.
//!
//! This is a plain text completion, one request and one answer. The
//! orchestrator's providers run tool-calling conversations with stored state;
//! sharing them would make the worker depend on the orchestrator for a
//! twenty-line request.

use std::time::Duration;

use reqwest::Url;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// Largest answer read from the model server; a longer one is an error.
const MAX_ANSWER_BYTES: usize = 1024 * 1024;

/// The `kg.model` settings: an OpenAI-compatible Chat Completions server.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelOptions {
    /// Base URL of the server, up to and including `/v1`, e.g.
    /// `https://api.openai.com/v1`. Default: empty, which means no model:
    /// predicates are matched by rules only and trend summaries are computed.
    pub base_url: String,
    /// The model name sent with each request. Default: `gpt-4.1-mini`.
    pub name: String,
    /// The environment variable that holds the API key, sent as a bearer
    /// token. Empty: no key (local servers). Default: `OPENAI_API_KEY`.
    pub api_key_env: String,
    /// How long one request may take. Default: 20s.
    #[serde(with = "toolfleet_service::config::duration")]
    pub timeout: Duration,
}

impl Default for ModelOptions {
    fn default() -> Self {
        Self {
            base_url: String::new(),
            name: "gpt-4.1-mini".into(),
            api_key_env: "OPENAI_API_KEY".into(),
            timeout: Duration::from_secs(20),
        }
    }
}

/// Why the model could not be set up. Fix the named `kg.model` key.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// `kg.model.base_url` is not an http(s) URL.
    #[error("kg.model.base_url is not an http(s) URL: {0:?}")]
    InvalidUrl(String),
    /// `kg.model.api_key_env` names a variable that is not set.
    #[error(
        "kg.model.api_key_env names {0}, which is not set; export it, or set kg.model.api_key_env = \"\" for a server without keys"
    )]
    MissingKey(String),
    /// The HTTP client could not be built.
    #[error("cannot build the kg.model HTTP client")]
    HttpClient(#[source] reqwest::Error),
}

/// Why one completion failed. Never contains the key or the prompt.
#[derive(Debug, thiserror::Error)]
pub enum CompletionError {
    /// No answer within `kg.model.timeout`.
    #[error("the model did not answer within {0:?}")]
    Timeout(Duration),
    /// The server could not be reached, or answered with an error status.
    #[error("the model server failed: {0}")]
    Server(String),
    /// The answer was not a completion with text.
    #[error("the model's answer is not a chat completion: {0}")]
    Malformed(String),
}

/// A configured model.
#[derive(Debug)]
pub struct Model {
    client: reqwest::Client,
    url: Url,
    name: String,
    api_key: Option<String>,
    timeout: Duration,
}

impl Model {
    /// The model of these options; `None` when `base_url` is empty.
    ///
    /// # Errors
    ///
    /// [`SetupError`] naming the setting to fix.
    pub fn new(options: &ModelOptions) -> Result<Option<Self>, SetupError> {
        Self::with_environment(options, |variable| std::env::var(variable).ok())
    }

    /// [`Model::new`], reading variables through `environment`.
    fn with_environment(
        options: &ModelOptions,
        environment: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<Self>, SetupError> {
        if options.base_url.trim().is_empty() {
            return Ok(None);
        }
        let base = options.base_url.trim().trim_end_matches('/');
        let url = Url::parse(&format!("{base}/chat/completions"))
            .ok()
            .filter(|url| matches!(url.scheme(), "http" | "https"))
            .ok_or_else(|| {
                SetupError::InvalidUrl(toolfleet_service::config::redact_url(&options.base_url))
            })?;
        let api_key = match options.api_key_env.trim() {
            "" => None,
            variable => Some(
                environment(variable)
                    .filter(|key| !key.is_empty())
                    .ok_or_else(|| SetupError::MissingKey(variable.to_owned()))?,
            ),
        };
        let client = reqwest::Client::builder()
            .connect_timeout(options.timeout)
            .timeout(options.timeout)
            .build()
            .map_err(SetupError::HttpClient)?;
        Ok(Some(Self {
            client,
            url,
            name: options.name.clone(),
            api_key,
            timeout: options.timeout,
        }))
    }

    /// The longest one completion may take.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The model's text answer to `instructions` (the system message) and
    /// `input` (the user message).
    ///
    /// # Errors
    ///
    /// [`CompletionError`]; the caller decides what to do without an answer.
    pub async fn complete(
        &self,
        instructions: &str,
        input: &str,
    ) -> Result<String, CompletionError> {
        let body = json!({
            "model": self.name,
            "temperature": 0,
            "messages": [
                {"role": "system", "content": instructions},
                {"role": "user", "content": input},
            ],
        });
        let mut request = self.client.post(self.url.clone()).json(&body);
        if let Some(key) = &self.api_key {
            request = request.bearer_auth(key);
        }
        let describe = |err: reqwest::Error| describe(err, self.timeout);
        let answer = tokio::time::timeout(self.timeout, async {
            let mut response = request.send().await.map_err(describe)?;
            let status = response.status();
            let mut bytes = Vec::new();
            while let Some(chunk) = response.chunk().await.map_err(describe)? {
                if bytes.len() + chunk.len() > MAX_ANSWER_BYTES {
                    return Err(CompletionError::Malformed(format!(
                        "longer than {MAX_ANSWER_BYTES} bytes"
                    )));
                }
                bytes.extend_from_slice(&chunk);
            }
            if !status.is_success() {
                return Err(CompletionError::Server(format!("HTTP {status}")));
            }
            Ok(bytes)
        })
        .await
        .map_err(|_| CompletionError::Timeout(self.timeout))??;
        text_of(&answer)
    }
}

fn describe(err: reqwest::Error, timeout: Duration) -> CompletionError {
    // Without the URL: it may carry credentials.
    let err = err.without_url();
    if err.is_timeout() {
        CompletionError::Timeout(timeout)
    } else if err.is_connect() {
        CompletionError::Server("cannot connect".into())
    } else {
        CompletionError::Server(err.to_string())
    }
}

#[derive(Deserialize)]
struct Completion {
    choices: Vec<Choice>,
}

#[derive(Deserialize)]
struct Choice {
    message: Message,
}

#[derive(Deserialize)]
struct Message {
    #[serde(default)]
    content: Option<String>,
}

fn text_of(answer: &[u8]) -> Result<String, CompletionError> {
    let completion: Completion = serde_json::from_slice(answer)
        .map_err(|err| CompletionError::Malformed(err.to_string()))?;
    completion
        .choices
        .into_iter()
        .next()
        .and_then(|choice| choice.message.content)
        .filter(|text| !text.trim().is_empty())
        .ok_or_else(|| CompletionError::Malformed("no text in the first choice".into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use wiremock::matchers::{body_partial_json, header, method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};

    fn options(base_url: &str) -> ModelOptions {
        ModelOptions {
            base_url: base_url.into(),
            api_key_env: String::new(),
            timeout: Duration::from_millis(500),
            ..ModelOptions::default()
        }
    }

    #[tokio::test]
    async fn sends_a_chat_completion_and_reads_the_first_choice() {
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .and(path("/v1/chat/completions"))
            .and(header("authorization", "Bearer sk-test-key"))
            .and(body_partial_json(json!({"model": "m", "temperature": 0})))
            .respond_with(ResponseTemplate::new(200).set_body_json(json!({
                "choices": [{"message": {"role": "assistant", "content": "LAUNCHED"}}]
            })))
            .mount(&server)
            .await;
        let model = Model::with_environment(
            &ModelOptions {
                name: "m".into(),
                api_key_env: "KG_KEY".into(),
                ..options(&format!("{}/v1/", server.uri()))
            },
            |variable| (variable == "KG_KEY").then(|| "sk-test-key".to_owned()),
        )
        .unwrap()
        .unwrap();
        assert_eq!(model.complete("sys", "user").await.unwrap(), "LAUNCHED");
    }

    #[tokio::test]
    async fn failures_are_errors_that_name_no_secret() {
        let server = MockServer::start().await;
        Mock::given(path("/err/chat/completions"))
            .respond_with(ResponseTemplate::new(503))
            .mount(&server)
            .await;
        Mock::given(path("/slow/chat/completions"))
            .respond_with(ResponseTemplate::new(200).set_delay(Duration::from_secs(3)))
            .mount(&server)
            .await;
        Mock::given(path("/junk/chat/completions"))
            .respond_with(ResponseTemplate::new(200).set_body_string("<html>"))
            .mount(&server)
            .await;
        Mock::given(path("/empty/chat/completions"))
            .respond_with(
                ResponseTemplate::new(200).set_body_json(json!({"choices": [{"message": {}}]})),
            )
            .mount(&server)
            .await;
        for (prefix, expected) in [
            ("err", "HTTP 503"),
            ("slow", "did not answer within"),
            ("junk", "not a chat completion"),
            ("empty", "no text in the first choice"),
        ] {
            let model = Model::new(&options(&format!("{}/{prefix}", server.uri())))
                .unwrap()
                .unwrap();
            let err = model.complete("s", "u").await.unwrap_err().to_string();
            assert!(err.contains(expected), "{prefix}: {err}");
        }
        let closed = Model::new(&options("http://127.0.0.1:9")).unwrap().unwrap();
        let err = closed.complete("s", "u").await.unwrap_err().to_string();
        assert!(err.contains("cannot connect"), "{err}");
    }

    #[test]
    fn setup_names_the_setting_to_fix() {
        assert!(Model::new(&ModelOptions::default()).unwrap().is_none());
        let err = Model::new(&options("ftp://x")).unwrap_err().to_string();
        assert!(err.contains("kg.model.base_url"), "{err}");
        let err = Model::new(&options("https://user:secret@host/v1?x"))
            .map(|_| ())
            .map_or_else(|e| e.to_string(), |()| String::new());
        assert!(!err.contains("secret"), "{err}");
        let err = Model::with_environment(
            &ModelOptions {
                api_key_env: "KG_KEY".into(),
                ..options("http://127.0.0.1:9")
            },
            |_| Some(String::new()),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("KG_KEY, which is not set"), "{err}");
    }
}
