//! The `order_status` tool: one GET to the order service per call.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use toolfleet_worker::{Effects, ErrorCode, Tool, ToolContext, ToolError, ToolManifest};

/// A business rule the model can act on (ask the user for another id):
/// terminal, the same call would fail again.
const ORDER_NOT_FOUND: ErrorCode = ErrorCode::from_static("ORDER_NOT_FOUND");
/// The order service is down or failing: retryable, the orchestrator calls
/// again after a backoff (the manifest's retry policy, or its own).
const ORDERS_UNAVAILABLE: ErrorCode = ErrorCode::from_static("ORDERS_UNAVAILABLE");
/// The order service answered something this tool cannot use: terminal, a
/// retry would get the same.
const ORDERS_UNREADABLE: ErrorCode = ErrorCode::from_static("ORDERS_UNREADABLE");

/// The most of an answer read: the service is trusted to be ours, not to be
/// right, and a model's context has no room for more.
const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// Looks up an order's status.
pub struct OrderStatus {
    http: reqwest::Client,
    orders: reqwest::Url,
}

impl OrderStatus {
    /// A tool that asks the order service at `orders`.
    pub fn new(orders: reqwest::Url) -> Result<Self, String> {
        if !matches!(orders.scheme(), "http" | "https") {
            return Err(format!("--orders-url {orders}: use an http or https URL"));
        }
        let http = reqwest::Client::builder()
            // Less than the tool's timeout (below), so that a slow service is
            // an UpstreamTimeout (retryable) with this tool's own message.
            .timeout(Duration::from_secs(5))
            .build()
            .map_err(|err| format!("cannot make an HTTP client: {err}"))?;
        Ok(Self { http, orders })
    }
}

impl Tool for OrderStatus {
    fn manifest(&self) -> ToolManifest {
        ToolManifest::new(
            "order_status",
            "The status of a customer's order (placed, shipped, delivered) and its expected \
             delivery date, by order id. Use it when the user asks where an order is.",
            // Strict: the model's arguments are checked against it before
            // `call` runs, so `call` may trust their shape. The pattern also
            // keeps the id a single, harmless path segment.
            json!({
                "type": "object",
                "additionalProperties": false,
                "required": ["order_id"],
                "properties": {
                    "order_id": {
                        "type": "string",
                        "pattern": "^[A-Za-z0-9-]{1,32}$",
                        "description": "The order id, as on the receipt: A-1042"
                    }
                }
            }),
        )
        .with_timeout(Duration::from_secs(10))
        // It only reads the order service: a call may run again after a
        // crash or a timeout. A tool that changes something says
        // `Idempotent` or leaves the default, `NotIdempotent` (decision 0037).
        .with_effects(Effects::ReadOnly)
    }

    async fn call(&self, args: Value, _ctx: ToolContext) -> Result<Value, ToolError> {
        let id = args["order_id"].as_str().unwrap_or_default(); // the schema made it a string
        let mut url = self.orders.clone();
        url.path_segments_mut()
            .map_err(|()| {
                ToolError::terminal(ORDERS_UNREADABLE, "the order service URL has no path")
            })?
            .pop_if_empty()
            .extend(["orders", id]);
        let response = self.http.get(url).send().await.map_err(unreachable)?;
        match response.status() {
            status if status.is_success() => read_order(response).await,
            StatusCode::NOT_FOUND => Err(ToolError::terminal(
                ORDER_NOT_FOUND,
                format!("there is no order {id}; ask the user to check the id"),
            )),
            StatusCode::TOO_MANY_REQUESTS => Err(ToolError::RateLimited {
                retry_after: retry_after(&response),
            }),
            status if status.is_server_error() => Err(ToolError::retryable(
                ORDERS_UNAVAILABLE,
                format!("the order service answered {status}"),
            )),
            status => Err(ToolError::terminal(
                ORDERS_UNREADABLE,
                format!("the order service refused the request ({status})"),
            )),
        }
    }
}

/// A request that got no answer: retryable, and its text (which names the
/// service's address) stays out of what the model sees.
fn unreachable(err: reqwest::Error) -> ToolError {
    if err.is_timeout() {
        return ToolError::UpstreamTimeout(Duration::from_secs(5));
    }
    ToolError::retryable(ORDERS_UNAVAILABLE, "the order service did not answer")
}

/// The answer's JSON, read no further than [`MAX_ANSWER_BYTES`].
async fn read_order(mut response: reqwest::Response) -> Result<Value, ToolError> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(unreachable)? {
        if body.len() + chunk.len() > MAX_ANSWER_BYTES {
            return Err(ToolError::terminal(
                ORDERS_UNREADABLE,
                format!("the order service's answer is over {MAX_ANSWER_BYTES} bytes"),
            ));
        }
        body.extend_from_slice(&chunk);
    }
    serde_json::from_slice(&body).map_err(|_| {
        ToolError::terminal(ORDERS_UNREADABLE, "the order service's answer is not JSON")
    })
}

/// The `Retry-After` seconds of a 429, if it has them.
fn retry_after(response: &reqwest::Response) -> Option<Duration> {
    let seconds = response.headers().get("retry-after")?.to_str().ok()?;
    seconds.trim().parse().ok().map(Duration::from_secs)
}
