//! One MCP server: its process (stdio) or endpoint (Streamable HTTP), the
//! connection to it, and the calls sent over it. Its supervision (reaching
//! it, listing its tools, following the connection) is `supervisor.rs`'s.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResult, CancelTaskParams,
    CancelledNotificationParam, ClientCapabilities, ClientConfig, ClientRequest, CreateTaskResult,
    ExtensionCapabilities, GetTaskParams, Implementation, JsonObject, ProgressNotificationParam,
    ProgressToken, ProtocolVersion, RequestId, ServerResult, TASKS_EXTENSION_ID,
};
use rmcp::service::RunningService;
use rmcp::service::{NotificationContext, PeerRequestOptions};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::{
    StreamableHttpClientTransportConfig, StreamableHttpError,
};
use rmcp::{
    ClientCacheConfig, ClientHandler, ClientLifecycleMode, ClientServiceExt, Peer, RoleClient,
    ServiceError,
};
use serde_json::Value;
use tokio::sync::{Notify, Semaphore, watch};
use tokio_util::sync::CancellationToken;
use toolfleet_proto::{Effects, ErrorCode};
use tracing::{debug, info, warn};

use super::McpHost;
use super::config::{Lifecycle, McpServerOptions};
use super::defect::{Defect, Defects};
use super::http::HttpClient;
use super::results;
use super::stdio;
use super::task::{self, Resume, Step};
use crate::progress::Progress;
use crate::tool::{Applied, ToolContext, ToolError};

/// A live connection to a server.
pub(super) type Client = RunningService<RoleClient, Handler>;

/// What the worker says of itself to a server, and hears from it.
#[derive(Clone, Default)]
pub(super) struct Handler {
    /// Told of each `notifications/tools/list_changed`.
    list_changed: Arc<Notify>,
    /// Where each call in flight reports its progress.
    progress: Arc<ProgressRoutes>,
}

impl ClientHandler for Handler {
    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        // Many notifications before the supervisor looks make one listing.
        self.list_changed.notify_one();
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        // A token of no call in flight (a late or made-up one) is ignored;
        // a flood costs a lookup each, and at most one report a second
        // reaches the bus (`Progress::report`).
        if let Some(progress) = self.progress.route(&params.progress_token) {
            progress.report(params.progress, params.total, params.message.as_deref());
        }
    }

    fn get_info(&self) -> ClientConfig {
        // The version offered in an `initialize` handshake: the newest that
        // has one (2026-07-28, which has none, is asked for by
        // `server/discover`, see `McpServer::lifecycle`).
        // Tasks are declared: a server may answer a call with one, and the
        // worker follows it (decision 0044). (rmcp's builder is behind its
        // server feature.)
        let mut capabilities = ClientCapabilities::default();
        capabilities.extensions = Some(ExtensionCapabilities::from([(
            TASKS_EXTENSION_ID.to_owned(),
            JsonObject::new(),
        )]));
        ClientConfig::new(
            capabilities,
            Implementation::new("toolfleet-worker", env!("CARGO_PKG_VERSION")),
        )
        .with_protocol_version(ProtocolVersion::LATEST_WITH_INITIALIZE)
    }
}

/// Why a `tools/call` got no answer.
enum Failed {
    /// rmcp's error: the server's, or the connection's.
    Service(ServiceError),
    /// What the connection found wrong with the answer ([`stdio`]).
    Defect(Defect),
}

/// An MCP server the worker serves tools of.
pub struct McpServer {
    pub(super) options: McpServerOptions,
    /// Where its process starts, over stdio, and how much of an answer is
    /// read.
    host: McpHost,
    /// Why calls in flight got no answer, told by a stdio connection.
    defects: Arc<Defects>,
    /// Where calls go while the connection is up; `None` while it is down
    /// (calls wait for it, for a while).
    pub(super) peer: watch::Sender<Option<Arc<Peer<RoleClient>>>>,
    /// Calls in flight to it, at most `concurrency`.
    slots: Semaphore,
    /// Told when the server says its tools changed.
    pub(super) list_changed: Arc<Notify>,
    /// Where its calls in flight report their progress.
    progress: Arc<ProgressRoutes>,
}

/// The progress of each call in flight to one server, by the token its
/// request carried (`_meta.progressToken`).
#[derive(Default)]
pub(super) struct ProgressRoutes {
    routes: std::sync::Mutex<HashMap<ProgressToken, Progress>>,
}

impl ProgressRoutes {
    /// Routes the reports of the request of `token` to `progress`, until
    /// the guard is dropped.
    fn open(self: &Arc<Self>, token: &ProgressToken, progress: Progress) -> RouteGuard {
        self.lock().insert(token.clone(), progress);
        RouteGuard {
            routes: self.clone(),
            token: token.clone(),
        }
    }

    fn route(&self, token: &ProgressToken) -> Option<Progress> {
        self.lock().get(token).cloned()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ProgressToken, Progress>> {
        self.routes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Cancels a request on the server when the call is dropped before its
/// answer (`id` still set).
struct CancelOnDrop {
    peer: Peer<RoleClient>,
    id: Option<RequestId>,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        let Some(id) = self.id.take() else {
            return;
        };
        let peer = self.peer.clone();
        let reason = "the call timed out or was abandoned".to_owned();
        tokio::spawn(async move {
            // A server that is gone cannot be told; nothing to do then.
            let cancelled = CancelledNotificationParam::new(Some(id), Some(reason));
            let _ = peer.notify_cancelled(cancelled).await;
        });
    }
}

/// How following a task ended.
enum Followed {
    /// The task ended: the call's answer.
    Answer(Result<Value, ToolError>),
    /// The server does not know the task.
    Forgotten,
}

/// Cancels a task on the server when the call following it is dropped
/// before its end (`id` still set), unless the drain handed the call back:
/// the worker that takes it over follows the same task.
struct CancelTaskOnDrop {
    peer: watch::Receiver<Option<Arc<Peer<RoleClient>>>>,
    id: Option<String>,
    handed_back: CancellationToken,
}

impl Drop for CancelTaskOnDrop {
    fn drop(&mut self) {
        let Some(id) = self.id.take() else {
            return;
        };
        if self.handed_back.is_cancelled() {
            debug!("the MCP server's task is left running for the worker that takes the call over");
            return;
        }
        let Some(peer) = self.peer.borrow().clone() else {
            return;
        };
        tokio::spawn(async move {
            // A server that is gone cannot be told; its task ends as the
            // server lets it.
            let _ = peer.cancel_task(CancelTaskParams::new(id)).await;
        });
    }
}

/// Ends a call's progress route when the call ends (or is dropped).
struct RouteGuard {
    routes: Arc<ProgressRoutes>,
    token: ProgressToken,
}

impl Drop for RouteGuard {
    fn drop(&mut self) {
        self.routes.lock().remove(&self.token);
    }
}

impl McpServer {
    /// The server of `options`, not connected yet; over stdio, its process
    /// starts in `host`'s sandbox.
    pub fn new(options: McpServerOptions, host: McpHost) -> Arc<Self> {
        let slots = Semaphore::new(options.concurrency);
        Arc::new(Self {
            options,
            host,
            defects: Arc::default(),
            peer: watch::Sender::new(None),
            slots,
            list_changed: Arc::default(),
            progress: Arc::default(),
        })
    }

    /// Its settings.
    pub fn options(&self) -> &McpServerOptions {
        &self.options
    }

    /// Calls its tool `mcp_name` with `args`, for a tool with `effects`, in
    /// the call `ctx`: the server's progress notifications go to its
    /// progress. A call the server answers with a task follows the task to
    /// its end, its id saved in the call's checkpoint first; a call that
    /// resumes from such a checkpoint follows that task rather than call
    /// the tool again (decision 0044).
    ///
    /// # Errors
    ///
    /// The [`ToolError`] the model gets (docs/tools/mcp.md, "Results and
    /// errors").
    pub async fn call(
        &self,
        mcp_name: &str,
        args: Value,
        effects: Effects,
        ctx: &ToolContext,
    ) -> Result<Value, ToolError> {
        let server = &self.options.name;
        let Value::Object(arguments) = args else {
            return Err(ToolError::InvalidArguments(
                "an MCP tool takes an object of arguments".into(),
            ));
        };
        let _slot = self
            .slots
            .acquire()
            .await
            .map_err(|_| results::not_running(server))?;
        if let Some(saved) = ctx.checkpoint.saved() {
            match task::resume(&saved, server) {
                Resume::Task(id) => {
                    info!(
                        server,
                        "resuming the call: following the MCP server's task an earlier execution saved"
                    );
                    match self.follow_task(&id, effects, ctx, Duration::ZERO).await {
                        Followed::Answer(answer) => return answer,
                        // Forgotten: a second run of this tool is harmless.
                        Followed::Forgotten if !effects.repeats_harm() => {}
                        Followed::Forgotten => return Err(task::forgotten(server)),
                    }
                }
                Resume::Foreign if effects.repeats_harm() => {
                    return Err(results::lost(server, effects));
                }
                Resume::Foreign => {}
            }
        }
        let client = self
            .peer_within(self.options.call_timeout / 2)
            .await
            .ok_or_else(|| results::not_running(server))?;
        let params = CallToolRequestParams::new(mcp_name.to_owned()).with_arguments(arguments);
        match self.call_once(&client, params, &ctx.progress).await {
            Err(failed) => Err(self.call_failed(&client, mcp_name, failed, effects)),
            Ok(ServerResult::CallToolResult(result)) => results::outcome(result),
            // An empty answer is a result without content.
            Ok(ServerResult::EmptyResult(_)) => results::outcome(CallToolResult::default()),
            Ok(ServerResult::InputRequiredResult(_)) => Err(ToolError::terminal(
                results::INPUT_REQUIRED,
                "the tool asked for more input, which a call through the fleet cannot give; \
                 call it with everything it needs in its arguments",
            )),
            Ok(ServerResult::CreateTaskResult(created)) => {
                self.task_made(created, effects, ctx).await
            }
            Ok(_) => Err(ToolError::terminal(
                ErrorCode::TOOL_EXECUTION_FAILED,
                format!("the MCP server {server} answered tools/call with something else"),
            )),
        }
    }

    /// Follows the task the server `created` for a call to its end, its id
    /// saved in the call's checkpoint first, so that a worker taking over
    /// the call follows it too. Unsaved (Redis down, the claim lost), the
    /// task is followed all the same; only a takeover would then not find
    /// it, and answer by the tool's effects (decision 0004).
    async fn task_made(
        &self,
        created: CreateTaskResult,
        effects: Effects,
        ctx: &ToolContext,
    ) -> Result<Value, ToolError> {
        let server = &self.options.name;
        let id = created.task.task_id;
        match ctx.checkpoint.save(&task::checkpoint(server, &id)).await {
            Ok(()) => debug!(
                server,
                "following the MCP server's task, saved in the call's checkpoint"
            ),
            Err(err) => {
                warn!(server, error = %err, "the MCP server's task could not be saved in the call's checkpoint; a worker taking the call over would not find it")
            }
        }
        let first = task::poll_interval(created.task.poll_interval_ms);
        match self.follow_task(&id, effects, ctx, first).await {
            Followed::Answer(answer) => answer,
            Followed::Forgotten if effects.repeats_harm() => Err(task::forgotten(server)),
            Followed::Forgotten => Err(results::lost(server, effects)),
        }
    }

    /// Asks the server about the task `id` each poll interval (the server's,
    /// within bounds; the first after `first`), until it ends. While the
    /// server is down the task is asked about again once it is back: the
    /// task lives on the server, not on the connection. Dropped before the
    /// end (the call's timeout), the task is cancelled with `tasks/cancel`,
    /// unless the drain handed the call back, for a worker that follows it
    /// next.
    async fn follow_task(
        &self,
        id: &str,
        effects: Effects,
        ctx: &ToolContext,
        first: Duration,
    ) -> Followed {
        let server = &self.options.name;
        let mut unfinished = CancelTaskOnDrop {
            peer: self.peer.subscribe(),
            id: Some(id.to_owned()),
            handed_back: ctx.handed_back.clone(),
        };
        let mut pause = first;
        loop {
            tokio::time::sleep(pause).await;
            let Some(peer) = self.peer_within(self.options.connect_timeout).await else {
                pause = task::MIN_POLL;
                continue;
            };
            let got = peer.get_task(GetTaskParams::new(id)).await;
            match task::after_get(got, server, effects, connection_failed) {
                Step::Wait(next) => pause = next,
                Step::Gone => {
                    self.gone(&peer);
                    pause = task::MIN_POLL;
                }
                Step::Retry(why) => {
                    warn!(
                        server,
                        why, "the MCP server's task could not be asked about; asking again"
                    );
                    pause = task::MAX_POLL;
                }
                Step::Answer(answer) => {
                    unfinished.id = None;
                    return Followed::Answer(answer);
                }
                Step::Forgotten => {
                    unfinished.id = None;
                    return Followed::Forgotten;
                }
                // Cancelled as `unfinished` drops.
                Step::GiveUp(err) => return Followed::Answer(Err(err)),
            }
        }
    }

    /// For a probe: what the task the call saved says now. A completed task
    /// is the call's result; one the server cannot be asked about now is
    /// asked about later; anything else is unknown.
    pub(super) async fn probe_task(&self, ctx: &ToolContext) -> Applied {
        let server = &self.options.name;
        let Some(Resume::Task(id)) = ctx
            .checkpoint
            .saved()
            .map(|saved| task::resume(&saved, server))
        else {
            return Applied::Unknown;
        };
        let Some(peer) = self.peer_within(self.options.connect_timeout).await else {
            return Applied::Unavailable;
        };
        let got = peer.get_task(GetTaskParams::new(id)).await;
        match task::after_get(got, server, Effects::NotIdempotent, connection_failed) {
            Step::Answer(Ok(data)) => Applied::Yes(data),
            Step::Gone | Step::Retry(_) => Applied::Unavailable,
            _ => Applied::Unknown,
        }
    }

    /// The error of a call of `tool` over `client` (for a tool with
    /// `effects`) that `failed`. A failed connection is dropped (the
    /// supervisor reaches the server anew); an answer too large is logged.
    fn call_failed(
        &self,
        client: &Arc<Peer<RoleClient>>,
        tool: &str,
        failed: Failed,
        effects: Effects,
    ) -> ToolError {
        let server = &self.options.name;
        let defect = match failed {
            Failed::Defect(defect) => defect,
            Failed::Service(err) => match too_large(&err) {
                Some(bound) => Defect::TooLarge(bound),
                None => {
                    debug!(server, error = %err, "MCP call failed");
                    if connection_failed(&err) {
                        self.gone(client);
                    }
                    if never_sent(&err) {
                        return results::not_running(server);
                    }
                    return results::failure(server, &err, effects);
                }
            },
        };
        if let Defect::TooLarge(bound) = defect {
            warn!(
                server,
                tool,
                bound,
                "the MCP server's answer is over the bound; the call fails PAYLOAD_TOO_LARGE"
            );
        }
        results::defect(server, &defect, effects)
    }

    /// Sends one `tools/call` over `peer` and waits for its answer, the
    /// server's progress notifications meanwhile going to `progress`.
    /// Dropped (a timeout, a drain), the request is cancelled on the
    /// server with `notifications/cancelled`. Not rmcp's `call_tool_once`,
    /// which does the same but keeps the request's progress token (rmcp
    /// sets its own on every request) to itself.
    async fn call_once(
        &self,
        peer: &Peer<RoleClient>,
        params: CallToolRequestParams,
        progress: &Progress,
    ) -> Result<ServerResult, Failed> {
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
        let handle = peer
            .send_request_with_option(request, PeerRequestOptions::no_options())
            .await
            .map_err(Failed::Service)?;
        let id = handle.id.clone();
        // A report the server sends before this line is dropped: it is
        // advisory, and the request has only just left.
        let _route = self.progress.open(&handle.progress_token, progress.clone());
        let mut unanswered = CancelOnDrop {
            peer: peer.clone(),
            id: Some(handle.id.clone()),
        };
        let answer = handle.await_response().await;
        unanswered.id = None;
        // A defect, told by the connection, is why the answer is an error.
        match (answer, self.defects.take(&id)) {
            (Err(_), Some(defect)) => Err(Failed::Defect(defect)),
            (answer, _) => answer.map_err(Failed::Service),
        }
    }

    /// The connection, waiting up to `wait` for one while the server is
    /// down. Within half the call's timeout: a call never sent must be
    /// answered "not running" (safe to retry), never time out (which, for
    /// a tool that is not idempotent, reads as an unknown outcome).
    async fn peer_within(&self, wait: Duration) -> Option<Arc<Peer<RoleClient>>> {
        let mut peer = self.peer.subscribe();
        let up = tokio::time::timeout(wait, peer.wait_for(Option::is_some)).await;
        up.ok()?.ok()?.clone()
    }

    /// A call found the connection `used` dead before the supervisor did:
    /// the next calls wait for a new one rather than meet the dead one.
    fn gone(&self, used: &Arc<Peer<RoleClient>>) {
        self.peer.send_if_modified(|peer| {
            let same = peer
                .as_ref()
                .is_some_and(|current| Arc::ptr_eq(current, used));
            if same {
                *peer = None;
            }
            same
        });
    }

    /// What the worker says of itself to this server, and hears from it.
    fn handler(&self) -> Handler {
        Handler {
            list_changed: self.list_changed.clone(),
            progress: self.progress.clone(),
        }
    }

    /// How the connection starts, as configured: 2026-07-28 is the only
    /// version asked for by `server/discover`; the handshake offers
    /// [`Handler::get_info`]'s.
    fn lifecycle(&self) -> ClientLifecycleMode {
        let stateless = vec![ProtocolVersion::V_2026_07_28];
        match self.options.lifecycle {
            Lifecycle::Auto => ClientLifecycleMode::Auto {
                preferred_versions: stateless,
                legacy_version: None,
            },
            Lifecycle::Initialize => ClientLifecycleMode::Initialize,
            Lifecycle::Discover => ClientLifecycleMode::Discover {
                preferred_versions: stateless,
            },
        }
    }

    /// Starts or reaches the server and makes the handshake (or the
    /// discovery), within `connect_timeout`.
    pub(super) async fn connect(&self) -> Result<Client, String> {
        let server = &self.options.name;
        let handshake = async {
            let client = match (&self.options.command, &self.options.url) {
                (Some(command), _) => {
                    let defects = self.defects.clone();
                    let process = stdio::start(&self.options, command, &self.host, defects).await?;
                    self.handler()
                        .serve_with_lifecycle(process, self.lifecycle())
                        .await
                }
                (None, Some(url)) => {
                    let transport = self.dial(url)?;
                    self.handler()
                        .serve_with_lifecycle(transport, self.lifecycle())
                        .await
                }
                (None, None) => return Err("neither command nor url".to_owned()),
            };
            client.map_err(|e| format!("handshake failed: {e}"))
        };
        let client = tokio::time::timeout(self.options.connect_timeout, handshake)
            .await
            .map_err(|_| {
                format!(
                    "no handshake within {}",
                    humantime::format_duration(self.options.connect_timeout)
                )
            })??;
        let version = client
            .peer_info()
            .map(|info| info.protocol_version.to_string())
            .unwrap_or_default();
        info!(server, protocol = version, "connected to the MCP server");
        // Each listing must say what the server offers now: rmcp would
        // otherwise keep a list for as long as the server's hint allows,
        // and serve it stale when a listing fails.
        client
            .peer()
            .set_response_cache_config(ClientCacheConfig::disabled())
            .await;
        Ok(client)
    }

    /// The Streamable HTTP transport to `url`, with the configured headers,
    /// reading each message (a JSON body, an SSE event) no further than a
    /// stdio server's line, and telling a call whose answer went past it.
    fn dial(&self, url: &str) -> Result<StreamableHttpClientTransport<HttpClient>, String> {
        let mut headers = HashMap::new();
        for (name, secret) in &self.options.headers {
            let name = reqwest::header::HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| format!("{name:?} is not a header name"))?;
            let mut value = reqwest::header::HeaderValue::from_str(&secret.read()?)
                .map_err(|_| format!("the value of header {name} is not a header value"))?;
            value.set_sensitive(true);
            headers.insert(name, value);
        }
        let client = reqwest::Client::builder()
            .connect_timeout(self.options.connect_timeout)
            .build()
            .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
        let answer = stdio::answer_bound(self.host.max_output_bytes);
        let bound = stdio::line_bound(answer, self.options.listing_bounds().bytes);
        let config = StreamableHttpClientTransportConfig::with_uri(url.to_owned())
            .custom_headers(headers)
            .max_sse_event_size(bound)
            .max_json_response_size(bound);
        let client = HttpClient {
            inner: client,
            defects: self.defects.clone(),
            answer_bound: answer,
        };
        Ok(StreamableHttpClientTransport::with_client(client, config))
    }
}

/// Whether `err` says the connection to the server failed (it closed, or
/// a request could not be sent or answered over it), rather than that the
/// server answered with an error.
pub(super) fn connection_failed(err: &ServiceError) -> bool {
    match err {
        ServiceError::TransportClosed => true,
        ServiceError::TransportSend(_) => too_large(err).is_none(),
        _ => false,
    }
}

/// The bound an HTTP answer went past (rmcp's, of a JSON body), if that is
/// why the request failed: the server answered, too much.
fn too_large(err: &ServiceError) -> Option<usize> {
    match http_error(err)? {
        StreamableHttpError::ResponseBodyTooLarge { max_size } => Some(*max_size),
        _ => None,
    }
}

/// The HTTP transport's own error under `err`.
fn http_error(err: &ServiceError) -> Option<&StreamableHttpError<reqwest::Error>> {
    let ServiceError::TransportSend(sent) = err else {
        return None;
    };
    sent.error.downcast_ref()
}

/// Whether `err` says the request never reached the server: its HTTP
/// connection could not be made (refused, unreachable, no TLS handshake).
/// Such a call did not run, whatever the tool does.
fn never_sent(err: &ServiceError) -> bool {
    matches!(http_error(err), Some(StreamableHttpError::Client(client)) if client.is_connect())
}
