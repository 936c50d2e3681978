//! The one HTTP exchange every model provider makes: POST a JSON body,
//! retry what is transient, and turn everything else into a [`ModelError`]
//! the runner can act on. A provider brings its [`Wire`]: its credentials
//! and version headers, and its section's retry policy; and its wire
//! format, nothing else. A non-2xx answer, to a plain request or a
//! streamed one, is judged in one place ([`judge`]).
//!
//! The policy follows OpenAI's error guide and its Python SDK, which
//! Anthropic's agrees with: retry 408, 409, 429, 5xx (Anthropic's 529
//! included), timeouts and connection errors with capped, jittered
//! exponential backoff; let `retry-after-ms` / `Retry-After` override the
//! schedule; never retry a 429 that reports an exhausted quota, nor any
//! other 4xx.

use std::error::Error as StdError;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use reqwest::StatusCode;
use reqwest::header::{ACCEPT, HeaderMap, HeaderName, HeaderValue};
use serde_json::Value;

use super::api_key::ApiKey;
use super::mask::Mask;
use super::{DeltaOut, DeltaSink, ModelError};

/// 429 codes that need a human (credit, budget, spend limit): retrying only
/// burns the budget and delays the failure. From OpenAI's error-code guide and
/// a later revision of it (see `model-apis.md` §1.6).
const QUOTA_CODES: &[&str] = &[
    "insufficient_quota",
    "billing_hard_limit_reached",
    "credit_balance_exhausted",
    "organization_spend_limit_exceeded",
    "project_spend_limit_exceeded",
    "organization_usage_limit_exceeded",
];

/// In-band error codes of a 200 response that mean "try again later", the
/// same as a 5xx or a 429 would.
const TRANSIENT_CODES: &[&str] = &["server_error", "rate_limit_exceeded"];

/// How much of a non-JSON error body (an HTML page from a proxy, say) is
/// quoted in an error message.
const MAX_QUOTED_BODY: usize = 300;

/// How a provider's requests are retried and bounded: the keys of its
/// configuration section.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Policy {
    /// The section (`openai`, `anthropic`), named in errors.
    pub(crate) section: &'static str,
    pub(crate) request_timeout: Duration,
    pub(crate) max_retries: u32,
    pub(crate) initial_backoff: Duration,
    pub(crate) max_backoff: Duration,
    pub(crate) max_response_bytes: usize,
    /// Longest silence of a streamed answer before the attempt is given up.
    pub(crate) stream_idle_timeout: Duration,
}

/// Why a provider could not be built: its configuration, not the model
/// API, is at fault, and no request was sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BuildError {
    /// The API key and its file are both set, or the file cannot be read
    /// or is empty, or the key is not a header value: fix the section's
    /// key (the message names it).
    #[error("{0}")]
    ApiKey(String),
    /// A configured header (`anthropic.version`) is not a header value:
    /// fix the key.
    #[error("{section}: the value of {name} is not a header value")]
    Header {
        /// The configuration section.
        section: &'static str,
        /// The header.
        name: &'static str,
    },
    /// The HTTP client could not be built (the TLS backend failed to
    /// load): no model API can be reached from this process.
    #[error("cannot build the HTTP client: {0}")]
    Client(String),
}

/// One provider's side of the exchange: its connection pool, the headers
/// every request carries, and its policy.
pub(crate) struct Wire {
    client: reqwest::Client,
    /// Version headers.
    headers: HeaderMap,
    /// The credential: sent in its header (marked sensitive, so never
    /// printed), and cut out of everything the answer says (`Mask`).
    key: Option<ApiKey>,
    policy: Policy,
}

impl Wire {
    /// POSTs `body` to `url` with the wire's headers and its key as it is
    /// now, asking for `accept`; the answer, and the mask of the key it was
    /// sent with.
    ///
    /// A redirect is final: it is never followed, so the key goes to no
    /// other address than the configured one.
    async fn send(
        &self,
        url: &str,
        body: &Value,
        accept: &str,
    ) -> Result<(reqwest::Response, Mask), Failure> {
        let mut request = self
            .client
            .post(url)
            .headers(self.headers.clone())
            .header(ACCEPT, accept);
        let mut sent_key = None;
        if let Some(key) = &self.key {
            let loaded = key.current();
            request = request.header(key.header().clone(), loaded.header);
            sent_key = Some(loaded.key);
        }
        let response = request.json(body).send().await.map_err(send_failure)?;
        Ok((response, Mask::of(sent_key)))
    }

    /// A wire with `headers` and `key` on every request.
    ///
    /// # Errors
    ///
    /// [`BuildError::Client`] when the HTTP client cannot be built (the TLS
    /// backend failed to load); [`BuildError::Header`] when a header is not
    /// a valid header.
    pub(crate) fn new(
        policy: Policy,
        headers: &[(&'static str, String)],
        key: Option<ApiKey>,
    ) -> Result<Self, BuildError> {
        // No redirects: reqwest drops `authorization` on a redirect to
        // another origin, but not `x-api-key` (Anthropic's); a model API
        // that moved is a configuration to change, not to follow.
        let client = reqwest::Client::builder()
            .timeout(policy.request_timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|err| BuildError::Client(err.to_string()))?;
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            let mut value = HeaderValue::from_str(value).map_err(|_| BuildError::Header {
                section: policy.section,
                name,
            })?;
            value.set_sensitive(true);
            map.insert(HeaderName::from_static(name), value);
        }
        Ok(Self {
            client,
            headers: map,
            key,
            policy,
        })
    }
}

/// `{base_url}/{path}`, whether or not the base URL ends with a slash.
pub(crate) fn endpoint(base_url: &str, path: &str) -> String {
    format!("{}/{path}", base_url.trim_end_matches('/'))
}

/// What reads a streamed answer, one server-sent event at a time, into
/// the answer a plain request would have had.
pub(crate) trait StreamReader {
    /// A new attempt starts: whatever the last one read is forgotten.
    fn restart(&mut self);
    /// One event (`name` is the SSE `event:` field, empty when absent),
    /// its pieces of the turn sent to `deltas`; the whole answer once the
    /// stream is complete.
    ///
    /// # Errors
    ///
    /// [`StreamError::Transient`] for what another attempt may cure (an
    /// `overloaded_error` event, malformed data); [`StreamError::Fatal`]
    /// for what it would not.
    fn event(
        &mut self,
        name: &str,
        data: &str,
        deltas: &mut DeltaOut<'_>,
    ) -> Result<Option<Value>, StreamError>;
}

/// Why a stream's event could not be read.
pub(crate) enum StreamError {
    /// Worth another attempt; the reason, with the provider's text
    /// excerpted.
    Transient(String),
    /// Final.
    Fatal(ModelError),
}

impl StreamError {
    /// An event that is an `error` object, judged as [`in_band_error`]
    /// judges one in a 2xx body: transient errors are worth another
    /// attempt.
    pub(crate) fn in_band(error: &Value) -> Self {
        match in_band_error(error) {
            ModelError::Unavailable(reason) => Self::Transient(reason),
            other => Self::Fatal(other),
        }
    }
}

/// POSTs `body` (which asks for a stream) to `url` over `wire` and reads
/// the answer's server-sent events with `reader` until it says the stream
/// is complete, the pieces it reads sent to `sink`. Failures before and
/// during the stream are retried as [`post_json`] retries them: a stream
/// that breaks, stalls for the policy's `stream_idle_timeout`, ends before
/// its last event, or carries malformed events is a transient failure, and
/// the next attempt starts the answer again (`reader.restart()`, and a
/// [`Delta::Restart`](super::Delta::Restart) for the sink). The answer,
/// its deltas and its errors are masked of the key, as `post_json`'s.
///
/// # Errors
///
/// As [`post_json`]; and [`StreamError::Fatal`]'s error.
pub(crate) async fn post_sse(
    wire: &Wire,
    url: &str,
    body: &Value,
    reader: &mut impl StreamReader,
    sink: DeltaSink<'_>,
) -> Result<Value, ModelError> {
    let mut retries = Retries::new(&wire.policy);
    let mut deltas = DeltaOut::new(sink);
    loop {
        match stream_once(wire, url, body, reader, &mut deltas).await {
            Ok(output) => return Ok(output),
            Err(Failure::Fatal(err)) => return Err(err),
            Err(Failure::Transient(transient)) => retries.after(transient).await?,
        }
    }
}

/// One attempt of [`post_sse`].
async fn stream_once(
    wire: &Wire,
    url: &str,
    body: &Value,
    reader: &mut impl StreamReader,
    deltas: &mut DeltaOut<'_>,
) -> Result<Value, Failure> {
    let (response, mask) = wire.send(url, body, "text/event-stream").await?;
    if !response.status().is_success() {
        // An error is a JSON body, read and judged as post_json's is.
        return Err(error_answer(wire, response, &mask).await);
    }
    reader.restart();
    deltas.restart(mask.clone());
    match read_stream(wire, response, reader, deltas).await {
        Ok(mut answer) => {
            deltas.flush();
            mask.value(&mut answer);
            Ok(answer)
        }
        Err(failure) => Err(failure.masked(&mask)),
    }
}

/// The events of one streamed answer, read to its end.
async fn read_stream(
    wire: &Wire,
    response: reqwest::Response,
    reader: &mut impl StreamReader,
    deltas: &mut DeltaOut<'_>,
) -> Result<Value, Failure> {
    use futures::StreamExt as _;
    let options = &wire.policy;
    let status = response.status();
    let transient = |reason: String| {
        Failure::Transient(Transient {
            reason,
            status: Some(status.as_u16()),
            retry_after: None,
            request_id: None,
        })
    };
    let limit = options.max_response_bytes;
    let chunks = bounded_chunks(response, limit);
    let mut events = std::pin::pin!(sse_stream::SseStream::from_bytes_stream(chunks));
    loop {
        let next = tokio::time::timeout(options.stream_idle_timeout, events.next()).await;
        let event = match next {
            Err(_) => {
                return Err(transient(format!(
                    "the stream was silent for {} ({}.stream_idle_timeout)",
                    humantime::format_duration(options.stream_idle_timeout),
                    options.section
                )));
            }
            Ok(None) => {
                return Err(transient(
                    "the stream ended before its last event".to_owned(),
                ));
            }
            Ok(Some(Err(sse_stream::Error::Body(err))))
                if matches!(err.downcast_ref(), Some(StreamBroken::TooLarge)) =>
            {
                return Err(Failure::Fatal(ModelError::InvalidResponse(format!(
                    "the stream is over {limit} bytes ({}.max_response_bytes)",
                    options.section
                ))));
            }
            Ok(Some(Err(err))) => {
                return Err(transient(format!(
                    "the stream broke: {}",
                    quote(&err.to_string())
                )));
            }
            Ok(Some(Ok(event))) => event,
        };
        // Comments and retry hints carry no data.
        let Some(data) = event.data else { continue };
        let name = event.event.as_deref().unwrap_or_default();
        match reader.event(name, &data, deltas) {
            Ok(Some(output)) => return Ok(output),
            Ok(None) => {}
            Err(StreamError::Transient(reason)) => return Err(transient(reason)),
            Err(StreamError::Fatal(err)) => return Err(Failure::Fatal(err)),
        }
    }
}

/// The body of `response`, chunk by chunk, ended by an error past `limit`
/// bytes: a stream is bounded as a body is, so a line that never ends
/// costs at most `limit`.
fn bounded_chunks(
    response: reqwest::Response,
    limit: usize,
) -> impl futures::Stream<Item = Result<bytes::Bytes, StreamBroken>> {
    futures::stream::unfold((response, 0usize), move |(mut response, read)| async move {
        match response.chunk().await {
            Ok(Some(chunk)) if read + chunk.len() > limit => {
                Some((Err(StreamBroken::TooLarge), (response, read)))
            }
            Ok(Some(chunk)) => {
                let read = read + chunk.len();
                Some((Ok(chunk), (response, read)))
            }
            Ok(None) => None,
            Err(err) => Some((Err(StreamBroken::Read(err.without_url())), (response, read))),
        }
    })
}

/// Why the bytes of a stream stopped.
#[derive(Debug)]
enum StreamBroken {
    Read(reqwest::Error),
    TooLarge,
}

impl std::fmt::Display for StreamBroken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Read(err) => write!(f, "{}", error_chain(err)),
            Self::TooLarge => f.write_str("the stream grew past its limit"),
        }
    }
}

impl StdError for StreamBroken {}

/// A provider's text in an error: at most [`MAX_QUOTED_BODY`] characters.
pub(crate) fn quote(text: &str) -> String {
    quote_body(text.as_bytes())
}

/// The server's id of the request (`x-request-id`), for the log: visible
/// ASCII only (`to_str`), and cut to a bound, as it is the server's text.
fn request_id(headers: &HeaderMap) -> Option<String> {
    const MAX_CHARS: usize = 128;
    let id = headers.get("x-request-id")?.to_str().ok()?;
    Some(id.chars().take(MAX_CHARS).collect())
}

/// A non-2xx answer, to a plain request or a streamed one, read and
/// [`judge`]d; its text masked.
async fn error_answer(wire: &Wire, response: reqwest::Response, mask: &Mask) -> Failure {
    let status = response.status();
    let retry_after = retry_after(response.headers());
    let request_id = request_id(response.headers());
    // An error body that cannot be read (cut off, or over the bound) still
    // has its status to judge by.
    let bytes = read_body(response, wire.policy.max_response_bytes)
        .await
        .unwrap_or_default();
    let answer = ErrorAnswer {
        status,
        retry_after,
        request_id: request_id.clone(),
        details: ErrorDetails::parse(&bytes, mask),
    };
    let failure = judge(answer, wire.policy.section);
    if let Failure::Fatal(ModelError::Rejected { status, code, .. }) = &failure {
        tracing::debug!(
            status,
            code = code.as_deref(),
            request_id = request_id.as_deref(),
            "model request rejected"
        );
    }
    failure
}

/// A non-2xx answer as read: its status, what the server asked us to
/// wait and its id of the request, and what its body says.
struct ErrorAnswer {
    status: StatusCode,
    retry_after: Option<Duration>,
    request_id: Option<String>,
    details: ErrorDetails,
}

/// What a non-2xx answer comes to, whichever provider gave it: 408, 409,
/// 429 and 5xx (Anthropic's 529 included) are worth another attempt,
/// unless the body reports an exhausted quota; a redirect, which is never
/// followed (the key goes to the configured address only), and every
/// other status are final, with the provider's code and message.
fn judge(answer: ErrorAnswer, section: &str) -> Failure {
    let ErrorAnswer {
        status,
        retry_after,
        request_id,
        details,
    } = answer;
    let code = status.as_u16();
    if status.is_redirection() {
        return Failure::Fatal(ModelError::Rejected {
            status: code,
            code: None,
            message: format!(
                "the server answered with a redirect, which is not followed (the key goes \
                 to the configured address only): set {section}.base_url to the address it names"
            ),
        });
    }
    if is_retryable_status(status) && !details.is_quota() {
        return Failure::Transient(Transient {
            reason: format!("HTTP {code}: {}", details.message),
            status: Some(code),
            retry_after,
            request_id,
        });
    }
    Failure::Fatal(ModelError::Rejected {
        status: code,
        code: details.code(),
        message: details.message,
    })
}

/// POSTs `body` to `url` over `wire` and returns the parsed JSON of a 2xx
/// answer, retrying transient failures up to the policy's `max_retries`
/// times.
///
/// # Errors
///
/// - [`ModelError::Rejected`] for a 4xx other than 408/409/429, or a 429
///   reporting an exhausted quota: the provider's code and message, the API
///   key redacted.
/// - [`ModelError::Unavailable`] when transient failures outlast the retries,
///   or the request could not be built at all.
/// - [`ModelError::InvalidResponse`] when a 2xx body is not JSON.
pub(crate) async fn post_json(wire: &Wire, url: &str, body: &Value) -> Result<Value, ModelError> {
    let mut retries = Retries::new(&wire.policy);
    loop {
        match send_once(wire, url, body).await {
            Ok(value) => return Ok(value),
            Err(Failure::Fatal(err)) => return Err(err),
            Err(Failure::Transient(transient)) => retries.after(transient).await?,
        }
    }
}

/// The retries of one request, by its policy: capped, jittered
/// exponential backoff, a server's wait honoured within `max_backoff`.
struct Retries<'a> {
    policy: &'a Policy,
    delays: backon::ExponentialBackoff,
    attempt: u32,
}

impl<'a> Retries<'a> {
    fn new(policy: &'a Policy) -> Self {
        let delays = ExponentialBuilder::new()
            .with_min_delay(policy.initial_backoff)
            .with_max_delay(policy.max_backoff)
            .with_max_times(usize::try_from(policy.max_retries).unwrap_or(usize::MAX))
            .with_jitter()
            .build();
        Self {
            policy,
            delays,
            attempt: 1,
        }
    }

    /// Waits before the next attempt after `transient`.
    ///
    /// # Errors
    ///
    /// [`ModelError::Unavailable`] once the retries are spent.
    async fn after(&mut self, transient: Transient) -> Result<(), ModelError> {
        let attempt = self.attempt;
        let Some(backoff) = self.delays.next() else {
            return Err(ModelError::Unavailable(format!(
                "{} (gave up after {attempt} attempts)",
                transient.reason
            )));
        };
        // The server knows its load better than our schedule does, but an
        // hour-long Retry-After must not park the job: max_backoff bounds both
        // (and trims backon's jitter, which can reach twice the delay).
        let delay = transient
            .retry_after
            .unwrap_or(backoff)
            .min(self.policy.max_backoff);
        tracing::warn!(
            status = transient.status,
            attempt,
            delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
            request_id = transient.request_id.as_deref(),
            reason = %transient.reason,
            "retrying model request"
        );
        tokio::time::sleep(delay).await;
        self.attempt += 1;
        Ok(())
    }
}

/// Why one attempt failed.
#[derive(Debug)]
enum Failure {
    /// Worth another attempt.
    Transient(Transient),
    /// Final: another attempt would fail the same way.
    Fatal(ModelError),
}

impl Failure {
    /// The failure with the provider's text masked, before it is logged
    /// (a retry) or returned.
    fn masked(self, mask: &Mask) -> Self {
        match self {
            Self::Transient(transient) => Self::Transient(Transient {
                reason: mask.text(transient.reason),
                ..transient
            }),
            Self::Fatal(err) => Self::Fatal(mask.error(err)),
        }
    }
}

#[derive(Debug)]
struct Transient {
    /// For the log and, once retries run out, the error message.
    reason: String,
    status: Option<u16>,
    /// What the server asked us to wait, if it said.
    retry_after: Option<Duration>,
    request_id: Option<String>,
}

/// One attempt of [`post_json`]: the answer, or why it failed, masked of
/// the key it was sent with.
async fn send_once(wire: &Wire, url: &str, body: &Value) -> Result<Value, Failure> {
    let (response, mask) = wire.send(url, body, "application/json").await?;
    match answer(wire, response, &mask).await {
        Ok(mut value) => {
            mask.value(&mut value);
            Ok(value)
        }
        Err(failure) => Err(failure.masked(&mask)),
    }
}

/// The JSON of a 2xx answer, or a non-2xx one judged.
async fn answer(wire: &Wire, response: reqwest::Response, mask: &Mask) -> Result<Value, Failure> {
    let options = &wire.policy;
    let status = response.status();
    if !status.is_success() {
        return Err(error_answer(wire, response, mask).await);
    }
    let retry_after = retry_after(response.headers());
    let request_id = request_id(response.headers());
    // A body cut off by a dropped connection or the timeout is as transient
    // as a failed send.
    let bytes = read_body(response, options.max_response_bytes)
        .await
        .map_err(|failure| match failure {
            BodyError::Read(err) => Failure::Transient(Transient {
                reason: format!(
                    "reading the response failed: {}",
                    error_chain(&err.without_url())
                ),
                status: Some(status.as_u16()),
                retry_after,
                request_id,
            }),
            BodyError::TooLarge => Failure::Fatal(ModelError::InvalidResponse(format!(
                "the response is over {} bytes ({}.max_response_bytes)",
                options.max_response_bytes, options.section
            ))),
        })?;

    serde_json::from_slice(&bytes).map_err(|err| {
        Failure::Fatal(ModelError::InvalidResponse(format!(
            "response body is not JSON: {err}"
        )))
    })
}

/// What a request that got no response means: worth another attempt, or a
/// request no server ever saw (a bad URL or similar).
fn send_failure(err: reqwest::Error) -> Failure {
    // Without the URL: its query string may hold a key, and the reason
    // reaches the job's error, which clients read.
    let err = err.without_url();
    let reason = format!("request failed: {}", error_chain(&err));
    if is_transient(&err) {
        Failure::Transient(Transient {
            reason,
            status: None,
            retry_after: None,
            request_id: None,
        })
    } else {
        Failure::Fatal(ModelError::Unavailable(reason))
    }
}

fn is_retryable_status(status: StatusCode) -> bool {
    matches!(
        status,
        StatusCode::REQUEST_TIMEOUT | StatusCode::CONFLICT | StatusCode::TOO_MANY_REQUESTS
    ) || status.is_server_error()
}

/// Connection refused or reset, timeouts, and errors while the request was
/// in flight; not builder errors (bad URL) nor redirect loops.
fn is_transient(err: &reqwest::Error) -> bool {
    err.is_timeout() || err.is_connect() || err.is_request() || err.is_body()
}

/// The server-requested wait: `retry-after-ms` (OpenAI's, fractional
/// milliseconds) first, then `Retry-After` in seconds. An HTTP-date
/// `Retry-After`, zero, or garbage falls back to our own schedule.
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let read = |name: &str, seconds_per_unit: f64| {
        let value: f64 = headers.get(name)?.to_str().ok()?.trim().parse().ok()?;
        (value.is_finite() && value > 0.0)
            .then(|| Duration::try_from_secs_f64(value * seconds_per_unit).ok())
            .flatten()
    };
    read("retry-after-ms", 0.001).or_else(|| read("retry-after", 1.0))
}

/// The parts of an error body we use. OpenAI sends
/// `{"error":{"message","type","param","code"}}`; compatible servers send
/// `{"error":"text"}` (Ollama), `{"object":"error","message",..}` (vLLM) or
/// `{"detail":..}` (FastAPI-based gateways).
#[derive(Debug, PartialEq)]
pub(crate) struct ErrorDetails {
    code: Option<String>,
    kind: Option<String>,
    message: String,
}

impl ErrorDetails {
    pub(crate) fn parse(body: &[u8], mask: &Mask) -> Self {
        let Ok(json) = serde_json::from_slice::<Value>(body) else {
            return Self {
                code: None,
                kind: None,
                message: mask.text(quote_body(body)),
            };
        };
        // The fields sit under `error` on OpenAI, at the top level on vLLM.
        let source = json
            .get("error")
            .filter(|error| error.is_object())
            .unwrap_or(&json);
        let message = source
            .get("message")
            .and_then(Value::as_str)
            .or_else(|| json.get("error").and_then(Value::as_str))
            .or_else(|| json.get("detail").and_then(Value::as_str))
            .map_or_else(|| quote_body(body), str::to_owned);
        Self {
            code: source.get("code").and_then(code_text),
            kind: source
                .get("type")
                .and_then(Value::as_str)
                .map(str::to_owned),
            message: mask.text(message),
        }
    }

    /// OpenAI has put the quota marker in `code` and, in older answers, in
    /// `type`; either one makes the 429 final.
    fn is_quota(&self) -> bool {
        [&self.code, &self.kind]
            .into_iter()
            .flatten()
            .any(|value| QUOTA_CODES.contains(&value.as_str()))
    }

    /// The provider's `code`, else its `type`: OpenAI leaves `code` null on
    /// most 400s, where `type` (`invalid_request_error`) still says something.
    fn code(&self) -> Option<String> {
        self.code.clone().or_else(|| self.kind.clone())
    }
}

/// Error codes are strings on OpenAI but numbers on some gateways.
fn code_text(code: &Value) -> Option<String> {
    match code {
        Value::String(text) => Some(text.clone()),
        Value::Number(number) => Some(number.to_string()),
        _ => None,
    }
}

fn quote_body(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    if text.is_empty() {
        return "no error message".to_owned();
    }
    match text.char_indices().nth(MAX_QUOTED_BODY) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

/// An `error` object inside a 2xx body (a failed Responses run, or a gateway
/// that reports upstream failures with HTTP 200).
pub(crate) fn in_band_error(error: &Value) -> ModelError {
    let code = error.get("code").and_then(code_text);
    let message = error
        .get("message")
        .and_then(Value::as_str)
        .or_else(|| error.as_str())
        .unwrap_or("no error message")
        .to_owned();
    let transient = code.as_deref().is_some_and(|code| {
        TRANSIENT_CODES.contains(&code)
            || code
                .parse::<u16>()
                .is_ok_and(|status| status == 429 || status >= 500)
    });
    if transient {
        // Not retried here: post_json has already returned. The runner sees
        // the same error a 5xx storm would have produced.
        ModelError::Unavailable(format!("{}: {message}", code.unwrap_or_default()))
    } else {
        ModelError::Rejected {
            status: 200,
            code,
            message,
        }
    }
}

/// Why a response body was not read.
enum BodyError {
    Read(reqwest::Error),
    TooLarge,
}

/// The whole body, read a chunk at a time so that no more than `limit`
/// bytes are ever held.
async fn read_body(mut response: reqwest::Response, limit: usize) -> Result<Vec<u8>, BodyError> {
    if response
        .content_length()
        .is_some_and(|length| length > limit as u64)
    {
        return Err(BodyError::TooLarge);
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(BodyError::Read)? {
        if body.len() + chunk.len() > limit {
            return Err(BodyError::TooLarge);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// The error and its sources, so "error sending request" says why.
fn error_chain(err: &(dyn StdError + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(inner) = source {
        let inner_text = inner.to_string();
        // hyper and reqwest often repeat their source's text in their own.
        if !text.contains(&inner_text) {
            text.push_str(": ");
            text.push_str(&inner_text);
        }
        source = inner.source();
    }
    text
}

/// Test support shared by the provider modules: options pointing at a
/// [`wiremock::MockServer`], request-body validation against OpenAI's own
/// schema, and the error-policy story every provider must pass.
#[cfg(test)]
pub(crate) mod testing {
    use std::path::Path;
    use std::sync::LazyLock;
    use std::time::{Duration, Instant};

    use jsonschema::Validator;
    use serde_json::{Value, json};
    use wiremock::matchers::{header, method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};

    use crate::model::{ModelError, OpenAiOptions, Provider, TurnRequest};

    /// Which request schema a body must satisfy.
    #[derive(Debug, Clone, Copy)]
    pub(crate) enum RequestKind {
        Responses,
        ChatCompletions,
    }

    /// Fast-retrying options for a provider talking to `server`.
    pub(crate) fn options(server: &MockServer) -> OpenAiOptions {
        options_at(&server.uri())
    }

    /// [`options_at`] with the key [`ECHOED_KEY`].
    pub(crate) fn echoed_key_options(uri: &str) -> OpenAiOptions {
        OpenAiOptions::for_tests(format!("{uri}/v1"), ECHOED_KEY)
    }

    /// Fast-retrying options for a provider talking to the server at `uri`.
    pub(crate) fn options_at(uri: &str) -> OpenAiOptions {
        OpenAiOptions::for_tests(format!("{uri}/v1"), "sk-test")
    }

    fn compile(root: &str) -> Validator {
        // A vendored copy (MIT, see its README), so the tests need nothing
        // outside the repository.
        let file = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/openai/openai-tool-calling-subset.schema.json");
        let text = std::fs::read_to_string(&file)
            .unwrap_or_else(|err| panic!("cannot read {}: {err}", file.display()));
        let mut schema: Value = serde_json::from_str(&text).expect("the schema bundle is JSON");
        // The bundle has no root schema; its README says to add one.
        schema["$ref"] = json!(format!("#/$defs/{root}"));
        jsonschema::options()
            .with_draft(jsonschema::Draft::Draft202012)
            .build(&schema)
            .unwrap_or_else(|err| panic!("cannot compile the {root} schema: {err}"))
    }

    static RESPONSES: LazyLock<Validator> = LazyLock::new(|| compile("CreateResponse"));
    static CHAT_COMPLETIONS: LazyLock<Validator> =
        LazyLock::new(|| compile("CreateChatCompletionRequest"));

    /// Panics, listing every violation, unless `body` is a valid request of
    /// `kind` per OpenAI's published schema.
    pub(crate) fn assert_valid_request(kind: RequestKind, body: &Value) {
        let validator = match kind {
            RequestKind::Responses => &*RESPONSES,
            RequestKind::ChatCompletions => &*CHAT_COMPLETIONS,
        };
        let errors: Vec<String> = validator
            .iter_errors(body)
            .map(|err| format!("- at {:?}: {err}", err.instance_path().to_string()))
            .collect();
        assert!(
            errors.is_empty(),
            "{kind:?} request violates the OpenAI schema:\n{}\nbody: {}",
            errors.join("\n"),
            serde_json::to_string_pretty(body).unwrap_or_default()
        );
    }

    /// Every request body `server` received, in order, each one checked
    /// against the schema of `kind`.
    pub(crate) async fn request_bodies(server: &MockServer, kind: RequestKind) -> Vec<Value> {
        let requests = server
            .received_requests()
            .await
            .expect("request recording is on");
        requests
            .iter()
            .map(|request| {
                let body: Value = request.body_json().expect("requests carry JSON");
                assert_valid_request(kind, &body);
                body
            })
            .collect()
    }

    /// An OpenAI error body.
    pub(crate) fn error_body(message: &str, kind: &str, code: Option<&str>) -> Value {
        json!({"error": {"message": message, "type": kind, "param": null, "code": code}})
    }

    /// The key the servers of [`check_the_key_never_comes_back`] echo.
    pub(crate) const ECHOED_KEY: &str = "sk-echoed-5f1d";

    /// How one provider's server writes the answers of the key story.
    pub(crate) struct KeyAnswers {
        /// The endpoint's path (`/v1/responses`).
        pub(crate) path: &'static str,
        /// A plain answer whose text is the argument.
        pub(crate) text: fn(&str) -> Value,
        /// A 200 whose body is an error quoting the argument.
        pub(crate) in_band_error: fn(&str) -> Value,
        /// The SSE body of a streamed answer whose text comes in the pieces
        /// given.
        pub(crate) stream: fn(&[&str]) -> String,
        /// The SSE body of a stream ended by a final error event quoting
        /// the argument.
        pub(crate) stream_error: fn(&str) -> String,
    }

    /// A provider made by `make` (its base URL the argument and `/v1`, its
    /// key [`ECHOED_KEY`]) never passes the key on, whichever way its server
    /// echoes it: a plain answer's text, an in-band error of a 200, a
    /// non-2xx body, a transient failure retried until the retries run
    /// out, a stream's deltas (the key split across them) and its answer,
    /// a stream's error event; and it follows no redirect, so the key
    /// reaches no other origin.
    pub(crate) async fn check_the_key_never_comes_back<P: Provider>(
        make: impl Fn(String) -> P,
        answers: &KeyAnswers,
        request: TurnRequest<'_>,
    ) {
        let quoting = format!("Incorrect API key provided: {ECHOED_KEY}.");
        let sse = |body: String| {
            ResponseTemplate::new(200)
                .insert_header("content-type", "text/event-stream")
                .set_body_string(body)
        };
        let answering = |response: ResponseTemplate| async move {
            let server = MockServer::start().await;
            Mock::given(method("POST"))
                .and(path(answers.path))
                .respond_with(response)
                .mount(&server)
                .await;
            server
        };
        let masked = |text: &str| {
            assert!(!text.contains(ECHOED_KEY), "the key came back: {text}");
            assert!(text.contains("***"), "{text}");
        };

        let text = format!("your key is {ECHOED_KEY}, keep it");
        let server =
            answering(ResponseTemplate::new(200).set_body_json((answers.text)(&text))).await;
        let turn = make(server.uri()).turn(request).await.expect("an answer");
        assert_eq!(turn.text(), "your key is ***, keep it", "a plain answer");

        for (case, response) in [
            (
                "an in-band error",
                ResponseTemplate::new(200).set_body_json((answers.in_band_error)(&quoting)),
            ),
            (
                "a 401",
                ResponseTemplate::new(401).set_body_json(error_body(&quoting, "auth", None)),
            ),
            (
                "a 503 retried",
                ResponseTemplate::new(503).set_body_string(quoting.clone()),
            ),
            (
                "a stream's error event",
                sse((answers.stream_error)(&quoting)),
            ),
        ] {
            let server = answering(response).await;
            let mut streamed = request;
            let sink = |_: super::super::Delta| {};
            if case.contains("stream") {
                streamed.deltas = Some(&sink);
            }
            let err = make(server.uri()).turn(streamed).await.expect_err(case);
            masked(&format!("{case}: {err} {err:?}"));
        }

        let pieces = ["your key is sk-ec", "hoed", "-5f1d", ", keep it"];
        let server = answering(sse((answers.stream)(&pieces))).await;
        let seen = std::sync::Mutex::new(Vec::new());
        let sink = |delta: super::super::Delta| {
            seen.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(delta);
        };
        let mut streamed = request;
        streamed.deltas = Some(&sink);
        let turn = make(server.uri())
            .turn(streamed)
            .await
            .expect("a streamed answer");
        assert_eq!(turn.text(), "your key is ***, keep it", "a streamed answer");
        let deltas = seen
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut sent = String::new();
        for delta in &deltas {
            if let super::super::Delta::Text(piece) = delta {
                for part in ["sk-ec", "hoed", "5f1d"] {
                    assert!(
                        !piece.contains(part),
                        "a part of the key was sent: {deltas:?}"
                    );
                }
                sent.push_str(piece);
            }
        }
        assert_eq!(sent, "your key is ***, keep it", "{deltas:?}");

        // A redirect to another origin: followed, it would carry the key.
        let elsewhere = MockServer::start().await;
        let moved = ResponseTemplate::new(307).insert_header(
            "location",
            format!("{}{}", elsewhere.uri(), answers.path).as_str(),
        );
        let server = answering(moved).await;
        let err = make(server.uri())
            .turn(request)
            .await
            .expect_err("a redirect");
        assert!(
            matches!(&err, ModelError::Rejected { status: 307, message, .. }
                if message.contains("redirect, which is not followed")),
            "{err:?}"
        );
        let followed = elsewhere.received_requests().await.expect("recording");
        assert!(
            followed.is_empty(),
            "the redirect was followed: {followed:?}"
        );
    }

    /// The retry policy, seen through a provider: transient failures are
    /// retried (honouring the server's wait, capped), final ones are not,
    /// and exhaustion reports the provider unavailable.
    pub(crate) async fn check_error_policy<P: Provider>(
        make: impl Fn(OpenAiOptions) -> P,
        endpoint: &str,
        kind: RequestKind,
        request: TurnRequest<'_>,
        success: Value,
    ) {
        // 429 with retry-after-ms, then 503 with Retry-After: 1 (longer than
        // max_backoff, so capped at 200ms), then success.
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .and(path(endpoint))
            .respond_with(
                ResponseTemplate::new(429)
                    .insert_header("retry-after-ms", "50")
                    .set_body_json(error_body(
                        "Rate limit reached for requests",
                        "requests",
                        Some("rate_limit_exceeded"),
                    )),
            )
            .up_to_n_times(1)
            .mount(&server)
            .await;
        Mock::given(method("POST"))
            .and(path(endpoint))
            .respond_with(
                ResponseTemplate::new(503)
                    .insert_header("retry-after", "1")
                    .set_body_string("upstream overloaded"),
            )
            .up_to_n_times(1)
            .mount(&server)
            .await;
        Mock::given(method("POST"))
            .and(path(endpoint))
            .and(header("authorization", "Bearer sk-test"))
            .respond_with(ResponseTemplate::new(200).set_body_json(&success))
            .mount(&server)
            .await;
        let provider = make(options(&server));
        let started = Instant::now();
        let turn = provider.turn(request).await.expect("retries succeed");
        let elapsed = started.elapsed();
        assert!(!turn.items.is_empty(), "the success body became items");
        let bodies = request_bodies(&server, kind).await;
        assert_eq!(bodies.len(), 3, "429, 503, then success");
        assert!(
            bodies.windows(2).all(|pair| pair[0] == pair[1]),
            "a retry resends the same body"
        );
        // Our own backoff would have waited 10-20ms then 20-40ms.
        assert!(
            elapsed >= Duration::from_millis(250),
            "server-given waits were honoured: {elapsed:?}"
        );
        assert!(
            elapsed < Duration::from_millis(1_000),
            "Retry-After: 1 was capped at max_backoff, not slept in full: {elapsed:?}"
        );

        // An exhausted quota needs a human: one request, no retry.
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .and(path(endpoint))
            .respond_with(ResponseTemplate::new(429).set_body_json(error_body(
                "You exceeded your current quota, please check your plan and billing details.",
                "insufficient_quota",
                Some("insufficient_quota"),
            )))
            .mount(&server)
            .await;
        let err = make(options(&server))
            .turn(request)
            .await
            .expect_err("quota errors are final");
        match &err {
            ModelError::Rejected {
                status: 429,
                code: Some(code),
                message,
            } if code == "insufficient_quota" && message.starts_with("You exceeded") => {}
            other => panic!("expected a quota rejection, got {other:?}"),
        }
        assert_eq!(request_bodies(&server, kind).await.len(), 1);

        // A 400 is final; the provider's message comes through.
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .and(path(endpoint))
            .respond_with(ResponseTemplate::new(400).set_body_json(error_body(
                "No tool output found for function call call_1.",
                "invalid_request_error",
                None,
            )))
            .mount(&server)
            .await;
        let err = make(options(&server))
            .turn(request)
            .await
            .expect_err("a 400 is final");
        match &err {
            ModelError::Rejected {
                status: 400,
                code,
                message,
            } => {
                assert_eq!(code.as_deref(), Some("invalid_request_error"));
                assert_eq!(message, "No tool output found for function call call_1.");
            }
            other => panic!("expected a 400 rejection, got {other:?}"),
        }
        assert_eq!(err.code().as_str(), "MODEL_REJECTED");
        assert_eq!(request_bodies(&server, kind).await.len(), 1);

        // 500s beyond the budget: the first attempt plus max_retries (2).
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .and(path(endpoint))
            .respond_with(ResponseTemplate::new(500).set_body_json(error_body(
                "The server had an error while processing your request.",
                "server_error",
                None,
            )))
            .mount(&server)
            .await;
        let err = make(options(&server))
            .turn(request)
            .await
            .expect_err("500s exhaust the retries");
        match &err {
            ModelError::Unavailable(reason) => assert!(
                reason.contains("HTTP 500") && reason.contains("3 attempts"),
                "{reason}"
            ),
            other => panic!("expected Unavailable, got {other:?}"),
        }
        assert_eq!(request_bodies(&server, kind).await.len(), 3);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use reqwest::header::{HeaderMap, HeaderValue};
    use serde_json::json;
    use wiremock::matchers::method;
    use wiremock::{Mock, MockServer, ResponseTemplate};

    use super::testing::{RequestKind, options, request_bodies};
    use super::*;
    use crate::model::OpenAiOptions;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_str(value).unwrap());
        }
        map
    }

    #[test]
    fn retry_after_prefers_milliseconds_and_ignores_dates_and_garbage() {
        let ms = Duration::from_millis;
        assert_eq!(
            retry_after(&headers(&[("retry-after-ms", "50"), ("retry-after", "3")])),
            Some(ms(50))
        );
        assert_eq!(
            retry_after(&headers(&[("retry-after", "2")])),
            Some(ms(2000))
        );
        assert_eq!(
            retry_after(&headers(&[("retry-after", "0.5")])),
            Some(ms(500))
        );
        assert_eq!(
            retry_after(&headers(&[(
                "retry-after",
                "Wed, 21 Oct 2015 07:28:00 GMT"
            )])),
            None
        );
        assert_eq!(retry_after(&headers(&[("retry-after", "0")])), None);
        assert_eq!(retry_after(&headers(&[("retry-after-ms", "-5")])), None);
        assert_eq!(retry_after(&headers(&[("retry-after", "1e300")])), None);
        assert_eq!(retry_after(&HeaderMap::new()), None);
    }

    #[test]
    fn a_servers_request_id_is_bounded_and_printable() {
        let with = |value: HeaderValue| {
            let mut headers = HeaderMap::new();
            headers.insert("x-request-id", value);
            request_id(&headers)
        };
        assert_eq!(
            with(HeaderValue::from_static("req_1")).as_deref(),
            Some("req_1")
        );
        let long = "r".repeat(10_000);
        assert_eq!(
            with(HeaderValue::from_str(&long).unwrap()).map(|id| id.len()),
            Some(128)
        );
        let bytes = HeaderValue::from_bytes(b"req\xff").unwrap();
        assert_eq!(with(bytes), None, "not visible ASCII");
        assert_eq!(request_id(&HeaderMap::new()), None);
    }

    #[test]
    fn error_details_read_openai_and_compatible_shapes() {
        let parse =
            |body: &str| ErrorDetails::parse(body.as_bytes(), &Mask::of(Some("sk-secret".into())));

        let openai = parse(
            r#"{"error":{"message":"Incorrect API key provided: sk-secret.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}"#,
        );
        assert_eq!(openai.code().as_deref(), Some("invalid_api_key"));
        assert_eq!(openai.message, "Incorrect API key provided: ***.");
        assert!(!openai.is_quota());

        let old_quota =
            parse(r#"{"error":{"message":"quota","type":"insufficient_quota","code":null}}"#);
        assert!(old_quota.is_quota(), "the marker may sit in `type`");
        assert!(
            parse(r#"{"error":{"message":"m","code":"billing_hard_limit_reached"}}"#).is_quota()
        );

        let ollama = parse(r#"{"error":"model \"llama9\" not found"}"#);
        assert_eq!(ollama.message, "model \"llama9\" not found");
        assert_eq!(ollama.code(), None);

        let vllm =
            parse(r#"{"object":"error","message":"bad tool","type":"BadRequestError","code":400}"#);
        assert_eq!(vllm.message, "bad tool");
        assert_eq!(vllm.code.as_deref(), Some("400"));

        assert_eq!(parse(r#"{"detail":"Not Found"}"#).message, "Not Found");
        assert_eq!(parse("").message, "no error message");
        let html = parse(&format!("<html>{}</html>", "x".repeat(1000)));
        assert_eq!(html.message.chars().count(), MAX_QUOTED_BODY + 1);
        assert!(html.message.ends_with('…'));
    }

    /// Every provider's non-2xx answers, plain or streamed, come to this.
    #[test]
    fn a_non_2xx_answer_is_judged_by_its_status_and_its_quota() {
        let wait = Some(Duration::from_millis(50));
        let body = |code: &str| {
            let json = format!(r#"{{"error":{{"message":"m","code":"{code}"}}}}"#);
            ErrorDetails::parse(json.as_bytes(), &Mask::of(None))
        };
        let old_quota = || {
            ErrorDetails::parse(
                br#"{"error":{"message":"m","type":"insufficient_quota"}}"#,
                &Mask::of(None),
            )
        };
        let plain = |text: &str| ErrorDetails::parse(text.as_bytes(), &Mask::of(None));
        // (status, body, retried?, the final error's code)
        let cases = [
            (408, plain("timeout"), true, None),
            (409, plain("conflict"), true, None),
            (429, body("rate_limit_exceeded"), true, None),
            (
                429,
                body("insufficient_quota"),
                false,
                Some("insufficient_quota"),
            ),
            (429, old_quota(), false, Some("insufficient_quota")),
            (
                429,
                body("organization_spend_limit_exceeded"),
                false,
                Some("organization_spend_limit_exceeded"),
            ),
            (500, plain("<html>oops</html>"), true, None),
            (
                503,
                body("insufficient_quota"),
                false,
                Some("insufficient_quota"),
            ),
            (
                529,
                plain(r#"{"type":"error","error":{"type":"overloaded_error"}}"#),
                true,
                None,
            ),
            (
                400,
                body("invalid_request_error"),
                false,
                Some("invalid_request_error"),
            ),
            (401, body("invalid_api_key"), false, Some("invalid_api_key")),
            (404, plain(""), false, None),
            (307, plain(""), false, None),
        ];
        for (status, details, retried, code) in cases {
            let answer = ErrorAnswer {
                status: StatusCode::from_u16(status).unwrap(),
                retry_after: wait,
                request_id: Some("req_1".into()),
                details,
            };
            match judge(answer, "anthropic") {
                Failure::Transient(transient) => {
                    assert!(retried, "{status} was retried");
                    assert_eq!(transient.status, Some(status));
                    assert_eq!(
                        transient.retry_after, wait,
                        "{status}: the server's wait is kept"
                    );
                    assert_eq!(transient.request_id.as_deref(), Some("req_1"));
                    assert!(
                        transient.reason.starts_with(&format!("HTTP {status}: ")),
                        "{transient:?}"
                    );
                }
                Failure::Fatal(ModelError::Rejected {
                    status: rejected,
                    code: got,
                    message,
                }) => {
                    assert!(!retried, "{status} is final");
                    assert_eq!(rejected, status);
                    assert_eq!(got.as_deref(), code, "{status}");
                    if status == 307 {
                        assert!(message.contains("set anthropic.base_url"), "{message}");
                    }
                }
                Failure::Fatal(other) => panic!("{status}: {other:?}"),
            }
        }
    }

    #[test]
    fn in_band_errors_split_into_transient_and_final() {
        let err = in_band_error(&json!({"code": "server_error", "message": "boom"}));
        assert!(
            matches!(&err, ModelError::Unavailable(m) if m == "server_error: boom"),
            "{err:?}"
        );
        let err = in_band_error(&json!({"code": 502, "message": "upstream"}));
        assert!(matches!(err, ModelError::Unavailable(_)), "{err:?}");
        let err = in_band_error(&json!({"code": "invalid_prompt", "message": "no"}));
        assert!(
            matches!(&err, ModelError::Rejected { status: 200, code: Some(c), message } if c == "invalid_prompt" && message == "no"),
            "{err:?}"
        );
    }

    /// Guards the guard: a schema that silently accepted everything (a
    /// broken `$ref`, say) would make every provider test vacuous.
    #[test]
    fn the_schema_check_catches_known_mistakes() {
        use super::testing::assert_valid_request;
        use RequestKind::{ChatCompletions, Responses};

        let accepted = |kind, body: Value| {
            std::panic::catch_unwind(|| assert_valid_request(kind, &body)).is_ok()
        };
        let call = json!({"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"});
        assert!(accepted(Responses, json!({"model": "m", "input": [call]})));
        let mut object_arguments = call.clone();
        object_arguments["arguments"] = json!({});
        assert!(!accepted(
            Responses,
            json!({"model": "m", "input": [object_arguments]})
        ));
        assert!(!accepted(
            Responses,
            json!({"model": "m", "input": "hi", "tools": [{"type": "function", "name": "f"}]})
        ));
        assert!(!accepted(
            Responses,
            json!({"model": "m", "input": [{"type": "function_call_output", "call_id": "c", "output": {}}]})
        ));

        let tool_call =
            json!({"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}});
        let with_call = |call: Value| {
            json!({"model": "m", "messages": [
                {"role": "assistant", "content": null, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c", "content": "ok"},
            ]})
        };
        assert!(accepted(ChatCompletions, with_call(tool_call.clone())));
        let mut no_id = tool_call.clone();
        no_id.as_object_mut().unwrap().remove("id");
        assert!(!accepted(ChatCompletions, with_call(no_id)));
        let mut object_arguments = tool_call;
        object_arguments["function"]["arguments"] = json!({});
        assert!(!accepted(ChatCompletions, with_call(object_arguments)));
        assert!(!accepted(
            ChatCompletions,
            json!({"model": "m", "messages": [{"role": "tool", "content": "ok"}]})
        ));
    }

    #[tokio::test]
    async fn timeouts_and_refused_connections_are_retried_then_unavailable() {
        let body = json!({"model": "gpt-test", "input": "hi"});
        let wire = |options: &OpenAiOptions| options.wire(&[]).unwrap();

        // Each attempt outlives the request timeout.
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .respond_with(
                ResponseTemplate::new(200)
                    .set_body_json(json!({}))
                    .set_delay(Duration::from_secs(2)),
            )
            .mount(&server)
            .await;
        let mut opts = options(&server);
        opts.request_timeout = Duration::from_millis(100);
        let url = endpoint(&opts.base_url, "responses");
        let err = post_json(&wire(&opts), &url, &body)
            .await
            .expect_err("every attempt times out");
        assert!(
            matches!(&err, ModelError::Unavailable(m) if m.contains("3 attempts")),
            "{err:?}"
        );
        assert_eq!(
            request_bodies(&server, RequestKind::Responses).await.len(),
            3
        );

        // Nothing listens on the port any more.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut opts = opts.clone();
        opts.base_url = format!("http://127.0.0.1:{port}/v1/");
        let url = endpoint(&opts.base_url, "responses");
        assert_eq!(url, format!("http://127.0.0.1:{port}/v1/responses"));
        let err = post_json(&wire(&opts), &url, &body)
            .await
            .expect_err("connection refused");
        assert!(
            matches!(&err, ModelError::Unavailable(m) if m.contains("3 attempts") && !m.contains("sk-test")),
            "{err:?}"
        );
    }

    #[tokio::test]
    async fn a_success_that_is_not_json_is_an_invalid_response() {
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .respond_with(ResponseTemplate::new(200).set_body_string("<html>hello</html>"))
            .mount(&server)
            .await;
        let opts = options(&server);
        let body = json!({"model": "gpt-test", "input": "hi"});
        let url = endpoint(&opts.base_url, "responses");
        let err = post_json(&opts.wire(&[]).unwrap(), &url, &body)
            .await
            .expect_err("not JSON");
        assert!(matches!(err, ModelError::InvalidResponse(_)), "{err:?}");
        assert_eq!(
            request_bodies(&server, RequestKind::Responses).await.len(),
            1
        );
    }

    #[tokio::test]
    async fn bodies_are_capped_and_errors_never_show_the_endpoint() {
        let body = json!({"model": "gpt-test", "input": "hi"});
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .respond_with(ResponseTemplate::new(200).set_body_string("x".repeat(100 * 1024)))
            .mount(&server)
            .await;
        let opts = options(&server);
        let url = endpoint(&opts.base_url, "responses");
        let err = post_json(&opts.wire(&[]).unwrap(), &url, &body)
            .await
            .expect_err("over the cap");
        assert!(
            matches!(&err, ModelError::InvalidResponse(m) if m.contains("openai.max_response_bytes")),
            "{err:?}"
        );

        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut opts = options(&server);
        opts.max_retries = 0;
        let url = format!("http://127.0.0.1:{port}/v1/responses?api-key=sk-in-the-query");
        let err = post_json(&opts.wire(&[]).unwrap(), &url, &body)
            .await
            .expect_err("nothing listens");
        let text = err.to_string();
        assert!(
            !text.contains("sk-in-the-query") && !text.contains("127.0.0.1"),
            "{text}"
        );
    }
}
