//! A Streamable HTTP server's transport: rmcp's, over reqwest, with the
//! bounds of a stdio server's lines (decision 0043). rmcp reads no further
//! than its bounds, but an answer streamed as one SSE event past the bound
//! only ends its stream, and the call gets "stream closed" with no word of
//! why. This client tells the call, as the stdio transport does: an answer
//! too large is [`Defect::TooLarge`], `PAYLOAD_TOO_LARGE` at once. And as
//! on stdio, the answer to a call is read no further than its own bound
//! (`runtime.max_output_bytes` and a margin), tighter than the transport's
//! for every other message (a page of `tools/list`).

use std::collections::HashMap;
use std::sync::Arc;

use futures::StreamExt;
use futures::stream::BoxStream;
use reqwest::header::{HeaderName, HeaderValue};
use rmcp::model::{ClientJsonRpcMessage, ClientRequest, JsonRpcMessage, RequestId};
use rmcp::transport::streamable_http_client::{
    StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse,
    StreamableHttpResponseLimits,
};
use sse_stream::{Error as SseError, Sse};

use super::defect::{Defect, Defects};

/// How rmcp's bounded SSE reader says an event went past its bound: its
/// error type is private, so its message is what tells it from a dropped
/// connection (tests/tests/mcp.rs checks it on every rmcp upgrade).
const EVENT_TOO_LARGE: &str = "SSE event exceeded the maximum size";

/// reqwest's client for rmcp, telling each request's defects to `defects`.
#[derive(Clone)]
pub(super) struct HttpClient {
    pub(super) inner: reqwest::Client,
    pub(super) defects: Arc<Defects>,
    /// The most of an answer to a call that is read, in bytes.
    pub(super) answer_bound: usize,
}

type Result<T> = std::result::Result<T, StreamableHttpError<reqwest::Error>>;
type Events = BoxStream<'static, std::result::Result<Sse, SseError>>;

impl StreamableHttpClient for HttpClient {
    type Error = reqwest::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse> {
        self.inner
            .post_message(uri, message, session_id, auth_header, custom_headers)
            .await
    }

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> Result<StreamableHttpPostResponse> {
        let (id, is_call) = match &message {
            JsonRpcMessage::Request(request) => (
                Some(request.id.clone()),
                matches!(request.request, ClientRequest::CallToolRequest(_)),
            ),
            _ => (None, false),
        };
        let mut limits = limits;
        if is_call {
            limits.max_sse_event_size = limits.max_sse_event_size.min(self.answer_bound);
            limits.max_json_response_size = limits.max_json_response_size.min(self.answer_bound);
        }
        let bound = limits.max_sse_event_size;
        let response = self
            .inner
            .post_message_with_response_limits(
                uri,
                message,
                session_id,
                auth_header,
                custom_headers,
                limits,
            )
            .await?;
        Ok(match (response, id) {
            (StreamableHttpPostResponse::Sse(events, session), Some(id)) => {
                let told = tell_too_large(events, id, bound, self.defects.clone());
                StreamableHttpPostResponse::Sse(told, session)
            }
            (response, _) => response,
        })
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<()> {
        self.inner
            .delete_session(uri, session_id, auth_header, custom_headers)
            .await
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<Events> {
        self.inner
            .get_stream(uri, session_id, last_event_id, auth_header, custom_headers)
            .await
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<Events> {
        self.inner
            .get_stream_with_max_sse_event_size(
                uri,
                session_id,
                last_event_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await
    }
}

/// `events`, the answer to request `id`, with an event past `bound` told
/// to the request's call before the stream ends with it.
fn tell_too_large(events: Events, id: RequestId, bound: usize, defects: Arc<Defects>) -> Events {
    events
        .inspect(move |event| {
            if let Err(err) = event
                && is_too_large(err)
            {
                defects.put(id.clone(), Defect::TooLarge(bound));
            }
        })
        .boxed()
}

/// Whether `err` is rmcp's bounded reader refusing an event too large.
fn is_too_large(err: &SseError) -> bool {
    matches!(err, SseError::Body(body) if body.to_string().starts_with(EVENT_TOO_LARGE))
}
