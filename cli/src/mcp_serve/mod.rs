//! `toolfleet mcp-serve`: the fleet as one MCP server (decision 0039), for
//! MCP clients (IDEs, desktop assistants, other agent runtimes). A gateway
//! in front of the API, over stdio or Streamable HTTP:
//!
//! - `tools/list` is `ListTools` as the client's tenant sees it: each live
//!   tool with its schema, its effects as annotations;
//! - `tools/call` is a call job (`SubmitJobRequest.call`): queued, checked,
//!   held for approval, deduplicated, retried, traced and counted against
//!   the tenant's quotas like any call; its envelope is the result
//!   (`isError` for an error envelope), and its progress events become the
//!   client's `notifications/progress`;
//! - authentication is the API's: over stdio, `--token`; over HTTP, each
//!   client's own `Authorization: Bearer` token (a static token or a JWT),
//!   checked by the orchestrator before the request reaches the MCP server
//!   (401 otherwise). Behind mutual TLS the gateway's own certificate is
//!   listed as a gateway's (`[gateways.<name>]`), which proves the hop and
//!   names no tenant: the client's token alone does. With
//!   `--resource-url`, the gateway is an OAuth protected resource (module
//!   `oauth`): clients find there who signs them in;
//! - a request from a web page (an `Origin` header) is served only from
//!   the origins `--allowed-origin` lists (403 otherwise);
//! - a client that declares the MCP Tasks extension gets a call that has
//!   not ended within `--task-after` as a task, which is the call job
//!   (module `task`).

mod oauth;
mod task;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Args;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams, ContentBlock,
    GetTaskParams, GetTaskResult, Implementation, ListToolsResult, PaginatedRequestParams,
    ProgressNotificationParam, ServerCapabilities, ServerConfig, Tool, ToolAnnotations,
    UpdateTaskParams,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler, ServiceExt};
use serde_json::Value;
use tonic::Code;
use tonic::transport::Channel;
use toolfleet_proto::envelope::excerpt;
use toolfleet_proto::v1;

use crate::client::{self, ApiClient, Server};
pub use oauth::ProtectedResource;
pub use task::TaskOptions;

/// How long a client's token, once the orchestrator accepted it, is taken
/// without asking again.
const TOKEN_TRUST: Duration = Duration::from_secs(30);

/// Most tokens remembered as accepted; past it, all are forgotten.
const TRUSTED_TOKENS: usize = 1024;

/// Serve the fleet's tools as one MCP server, over stdio (an IDE starts
/// it) or Streamable HTTP (--listen).
#[derive(Debug, Args)]
pub(crate) struct McpServeArgs {
    #[command(flatten)]
    server: Server,
    /// Serve Streamable HTTP at this address (path `/mcp`) instead of
    /// stdio. Each client sends its own `Authorization: Bearer <token>`,
    /// which the orchestrator checks; --token is not used for them.
    #[arg(long, value_name = "ADDR")]
    listen: Option<SocketAddr>,
    /// A `Host` the HTTP endpoint answers to, besides localhost (repeat
    /// for each): the name clients reach it by. Other hosts are refused,
    /// against DNS rebinding.
    #[arg(long = "allowed-host", value_name = "HOST")]
    allowed_hosts: Vec<String>,
    /// A browser origin the HTTP endpoint answers (repeat for each), as
    /// `scheme://host[:port]` (`http://localhost:*` for any port), for MCP
    /// clients that run in a web page. A request with any other `Origin`
    /// header gets 403; by default every origin is refused (clients outside
    /// a browser send none).
    #[arg(long = "allowed-origin", value_name = "ORIGIN")]
    allowed_origins: Vec<String>,
    /// For a client that declares the MCP Tasks extension: how long a call
    /// is waited for before it is answered with a task (the call job),
    /// which the client polls with `tasks/get`.
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = humantime::parse_duration)]
    task_after: Duration,
    /// How long a task stays readable, as the tasks say (`ttlMs`): set it
    /// to the orchestrators' `store.job_retention`.
    #[arg(long, value_name = "DURATION", default_value = "24h", value_parser = humantime::parse_duration)]
    task_ttl: Duration,
    /// The gateway's URL as clients reach it (`https://mcp.example.com/mcp`):
    /// with it, the gateway is an OAuth protected resource, its metadata
    /// at `/.well-known/oauth-protected-resource`, and the audience of the
    /// JWTs its clients sign in for (the orchestrator's tokens file names
    /// it as the gateway's `resource`).
    #[arg(long, value_name = "URL", requires_all = ["authorization_servers", "listen"])]
    resource_url: Option<String>,
    /// An issuer that signs the gateway's clients in (repeat for each),
    /// as its tokens' `iss` names it; with --resource-url.
    #[arg(
        long = "authorization-server",
        value_name = "URL",
        requires = "resource_url"
    )]
    authorization_servers: Vec<String>,
    /// A scope clients ask for (repeat for each), as the orchestrator's
    /// issuer maps scopes to roles; with --resource-url.
    #[arg(long = "scope", value_name = "SCOPE", requires = "resource_url")]
    scopes: Vec<String>,
}

/// How the HTTP endpoint answers: the `Host` names it is reached by
/// besides localhost (against DNS rebinding), the browser origins it
/// serves (against cross-site requests), and what it says of itself as a
/// protected resource.
#[derive(Debug, Default, Clone)]
pub struct HttpOptions {
    /// `Host` names, besides localhost's.
    pub hosts: Vec<String>,
    /// `Origin` values; none by default.
    pub origins: Vec<String>,
    /// Its OAuth protected resource metadata; `None`: it publishes none.
    pub resource: Option<ProtectedResource>,
}

pub(crate) async fn run(args: McpServeArgs) -> anyhow::Result<ExitCode> {
    let channel = args.server.channel().await?;
    let tasks = TaskOptions {
        after: args.task_after,
        ttl: args.task_ttl,
    };
    match args.listen {
        None => {
            let gateway = Gateway {
                channel,
                token: Token::Fixed(args.server.token().map(str::to_owned)),
                tasks,
            };
            let running = gateway
                .serve(rmcp::transport::stdio())
                .await
                .context("the MCP client did not complete the handshake")?;
            running.waiting().await?;
            Ok(ExitCode::SUCCESS)
        }
        Some(address) => {
            let resource = args
                .resource_url
                .map(|url| ProtectedResource::new(&url, args.authorization_servers, args.scopes))
                .transpose()?;
            let options = HttpOptions {
                hosts: args.allowed_hosts,
                origins: args.allowed_origins,
                resource,
            };
            http(channel, address, options, tasks).await
        }
    }
}

/// Serves Streamable HTTP at `address` until Ctrl-C or SIGTERM.
async fn http(
    channel: Channel,
    address: SocketAddr,
    options: HttpOptions,
    tasks: TaskOptions,
) -> anyhow::Result<ExitCode> {
    let stop = tokio_util::sync::CancellationToken::new();
    tokio::spawn(crate::watch_signals(stop.clone()));
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .with_context(|| format!("cannot listen on {address}"))?;
    eprintln!(
        "toolfleet mcp-serve: MCP over Streamable HTTP at http://{}/mcp",
        listener.local_addr()?
    );
    serve_http(channel, listener, options, tasks, stop).await?;
    Ok(ExitCode::SUCCESS)
}

/// Serves the fleet of `channel` as an MCP server over Streamable HTTP on
/// `listener` (path `/mcp`) until `stop`, answering the `Host` names of
/// localhost and those `options` allows, only the browser origins it
/// allows, with its protected resource metadata, its tasks as `tasks`
/// says. `toolfleet bench --mcp` runs it in its process.
///
/// # Errors
///
/// When serving fails.
pub async fn serve_http(
    channel: Channel,
    listener: tokio::net::TcpListener,
    options: HttpOptions,
    tasks: TaskOptions,
    stop: tokio_util::sync::CancellationToken,
) -> anyhow::Result<()> {
    use rmcp::transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
    };
    let mut hosts = vec![
        "localhost".to_owned(),
        "127.0.0.1".to_owned(),
        "::1".to_owned(),
    ];
    hosts.extend(options.hosts);
    // The MCP transport asks a server to validate `Origin`: a web page the
    // user visits must not reach a gateway on their machine. rmcp checks
    // it only once told to, and refuses every origin on an empty list.
    let config = StreamableHttpServerConfig::default()
        .with_allowed_hosts(hosts)
        .with_allowed_origins(options.origins)
        .enforce_origin_validation()
        .with_cancellation_token(stop.child_token());
    let gateway = Gateway {
        channel: channel.clone(),
        token: Token::PerRequest,
        tasks,
    };
    let mcp = StreamableHttpService::new(
        move || Ok(gateway.clone()),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    let doorman = Doorman {
        channel,
        trusted: Arc::default(),
        resource: options.resource.clone().map(Arc::new),
    };
    // The doorman is the outer layer: a request is admitted before its body
    // is read. The metadata, added after it, is public.
    let mut app = axum::Router::new()
        .nest_service("/mcp", mcp)
        .layer(axum::middleware::from_fn(name_the_task))
        .layer(axum::middleware::from_fn_with_state(
            doorman,
            Doorman::admit,
        ));
    if let Some(resource) = options.resource {
        for path in resource.metadata_paths() {
            let resource = resource.clone();
            app = app.route(
                &path,
                axum::routing::get(move || async move { resource.metadata() }),
            );
        }
    }
    // Without TCP_NODELAY each answer, an SSE stream of a few small
    // writes, waits for the client's delayed ACK: 40 ms a call on Linux.
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        if let Err(err) = tcp.set_nodelay(true) {
            eprintln!("toolfleet mcp-serve: cannot set TCP_NODELAY: {err}");
        }
    });
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { stop.cancelled().await })
        .await?;
    Ok(())
}

/// The largest body of a `tasks/*` request read for its task id.
const MAX_TASK_REQUEST: usize = 64 * 1024;

/// Gives a `tasks/*` request without an `Mcp-Name` header the one SEP-2243
/// asks for, from its body's `taskId`: fastmcp-tasks 4.1.4's client, the
/// extension's first, sends none, and rmcp refuses such a request
/// (`-32020`). Any other request passes untouched, its body unread; a
/// body over [`MAX_TASK_REQUEST`] is refused (413), and one without a task
/// id that can be a header passes on for rmcp to refuse.
async fn name_the_task(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let headers = request.headers();
    let is_task = headers
        .get("mcp-method")
        .and_then(|method| method.to_str().ok())
        .is_some_and(|method| method.starts_with("tasks/"));
    if !is_task || headers.contains_key("mcp-name") {
        return next.run(request).await;
    }
    let (mut parts, body) = request.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, MAX_TASK_REQUEST).await else {
        return axum::http::StatusCode::PAYLOAD_TOO_LARGE.into_response();
    };
    let id = serde_json::from_slice::<Value>(&bytes)
        .ok()
        .and_then(|body| body["params"]["taskId"].as_str().map(str::to_owned));
    if let Some(name) = id.and_then(|id| axum::http::HeaderValue::from_str(&id).ok()) {
        parts.headers.insert("mcp-name", name);
    }
    next.run(axum::extract::Request::from_parts(parts, bytes.into()))
        .await
}

/// Lets in the HTTP requests whose bearer token the orchestrator accepts.
#[derive(Clone)]
struct Doorman {
    channel: Channel,
    /// Tokens accepted lately, and when.
    trusted: Arc<Mutex<HashMap<String, Instant>>>,
    /// What a 401 points the client to.
    resource: Option<Arc<ProtectedResource>>,
}

impl Doorman {
    async fn admit(
        axum::extract::State(doorman): axum::extract::State<Self>,
        request: axum::extract::Request,
        next: axum::middleware::Next,
    ) -> axum::response::Response {
        use axum::http::StatusCode;
        use axum::response::IntoResponse;
        let resource = doorman.resource.as_deref();
        let Some(token) = bearer(request.headers()) else {
            let why = "an Authorization: Bearer token is required".to_owned();
            return oauth::unauthorized(resource, false, why);
        };
        match doorman.check(&token).await {
            Ok(()) => next.run(request).await,
            Err(status) if status.code() == Code::Unauthenticated => {
                oauth::unauthorized(resource, true, status.message().to_owned())
            }
            Err(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "the orchestrator did not answer",
            )
                .into_response(),
        }
    }

    /// Whether the orchestrator accepts `token` (asked at most every
    /// [`TOKEN_TRUST`] per token).
    async fn check(&self, token: &str) -> Result<(), tonic::Status> {
        let lock = || self.trusted.lock().unwrap_or_else(PoisonError::into_inner);
        if lock()
            .get(token)
            .is_some_and(|at| at.elapsed() < TOKEN_TRUST)
        {
            return Ok(());
        }
        let mut api = client::with_token(self.channel.clone(), Some(token))
            .map_err(|_| tonic::Status::unauthenticated("the token cannot be sent in a header"))?;
        // WhoAmI needs no role: the door lets in anyone the orchestrator
        // knows, and each call then checks its own role.
        api.who_am_i(v1::WhoAmIRequest {}).await?;
        let mut trusted = lock();
        if trusted.len() >= TRUSTED_TOKENS {
            trusted.clear();
        }
        trusted.insert(token.to_owned(), Instant::now());
        Ok(())
    }
}

/// The token of an HTTP request's `Authorization: Bearer` header.
fn bearer(headers: &axum::http::HeaderMap) -> Option<String> {
    let value = headers
        .get(axum::http::header::AUTHORIZATION)?
        .to_str()
        .ok()?;
    value.strip_prefix("Bearer ").map(str::to_owned)
}

/// Whose token a request goes to the API with.
#[derive(Clone)]
enum Token {
    /// Every request's: `--token` (stdio).
    Fixed(Option<String>),
    /// Each HTTP request's own `Authorization` header.
    PerRequest,
}

/// The MCP server: each request a call of the API.
#[derive(Clone)]
struct Gateway {
    channel: Channel,
    token: Token,
    tasks: TaskOptions,
}

impl Gateway {
    /// A client of the API as the sender of the request of `context`.
    fn api(&self, context: &RequestContext<RoleServer>) -> Result<ApiClient, McpError> {
        let token = match &self.token {
            Token::Fixed(token) => token.clone(),
            Token::PerRequest => context
                .extensions
                .get::<axum::http::request::Parts>()
                .and_then(|parts| bearer(&parts.headers)),
        };
        client::with_token(self.channel.clone(), token.as_deref())
            .map_err(|_| McpError::invalid_request("the token cannot be sent", None))
    }
}

impl ServerHandler for Gateway {
    fn get_info(&self) -> ServerConfig {
        let capabilities = ServerCapabilities::builder()
            .enable_tools()
            .enable_tasks()
            .build();
        ServerConfig::new(capabilities)
            .with_server_info(Implementation::new("toolfleet", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "The tools of a toolfleet: each call runs through the fleet's queue, \
                 with its retries, approvals and quotas.",
            )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let listed = self
            .api(&context)?
            .list_tools(v1::ListToolsRequest::default())
            .await
            .map_err(|status| api_error("ListTools", &status))?;
        let tools = listed
            .into_inner()
            .tools
            .into_iter()
            .filter_map(mcp_tool)
            .collect();
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let mut api = self.api(&context)?;
        let arguments = Value::Object(request.arguments.unwrap_or_default()).to_string();
        let submitted = api
            .submit_job(v1::SubmitJobRequest {
                call: Some(v1::ToolCallRequest {
                    tool: request.name.to_string(),
                    arguments,
                }),
                metadata: HashMap::from([(task::MARK.0.to_owned(), task::MARK.1.to_owned())]),
                ..Default::default()
            })
            .await;
        let job_id = match submitted {
            Ok(submitted) => submitted.into_inner().job_id,
            // Refused (a quota, a tool the tenant may not use): the
            // client's model can act on why.
            Err(status) if is_refusal(status.code()) => {
                return Ok(CallToolResponse::Complete(refusal(&status)));
            }
            Err(status) => return Err(api_error("SubmitJob", &status)),
        };
        let tasks = context
            .client_capabilities()
            .is_some_and(|capabilities| capabilities.supports_tasks());
        // Without tasks the request waits for the end, however long.
        let wait = if tasks {
            self.tasks.after
        } else {
            Duration::MAX
        };
        let result = tokio::select! {
            result = follow(&mut api, &job_id, &context) => result?,
            () = tokio::time::sleep(wait) => {
                let created = task::created(&job_id, std::time::SystemTime::now(), &self.tasks);
                return Ok(CallToolResponse::Task(created));
            }
            () = context.ct.cancelled() => {
                // The client cancelled its request: so is the job.
                let _ = api.cancel_job(v1::CancelJobRequest { job_id }).await;
                return Err(McpError::internal_error("cancelled by the client", None));
            }
        };
        Ok(CallToolResponse::Complete(result))
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, McpError> {
        let job = self.task_job(&request.task_id, &context).await?;
        let now = std::time::SystemTime::now();
        let task = task::detailed(&job, now, &self.tasks, call_result);
        Ok(GetTaskResult::new(task))
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let job = self.task_job(&request.task_id, &context).await?;
        self.api(&context)?
            .cancel_job(v1::CancelJobRequest { job_id: job.job_id })
            .await
            .map_err(|status| api_error("CancelJob", &status))?;
        Ok(())
    }

    async fn update_task(
        &self,
        _request: UpdateTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        // A held call waits for an approver or an operator, never for the
        // client: no task of the fleet asks the client for input.
        Err(McpError::invalid_params(
            "the fleet's tasks ask for no input",
            None,
        ))
    }
}

impl Gateway {
    /// The call job a client's task `id` names, read with the client's own
    /// token: a job of another tenant, or one the gateway did not make, is
    /// a task that does not exist (`-32602`, as the extension says).
    async fn task_job(
        &self,
        id: &str,
        context: &RequestContext<RoleServer>,
    ) -> Result<v1::Job, McpError> {
        let unknown = || McpError::invalid_params("no such task", None);
        let got = self
            .api(context)?
            .get_job(v1::GetJobRequest {
                job_id: id.to_owned(),
            })
            .await;
        let job = match got {
            Ok(job) => job.into_inner(),
            Err(status) if matches!(status.code(), Code::NotFound | Code::InvalidArgument) => {
                return Err(unknown());
            }
            Err(status) => return Err(api_error("GetJob", &status)),
        };
        if task::is_ours(&job) {
            Ok(job)
        } else {
            Err(unknown())
        }
    }
}

/// A live tool of the API as an MCP tool; `None` for a schema that is not
/// a JSON object (which the API never sends).
fn mcp_tool(tool: v1::Tool) -> Option<Tool> {
    let Ok(Value::Object(schema)) = serde_json::from_str::<Value>(&tool.parameters) else {
        return None;
    };
    let annotations = match tool.effects.as_str() {
        "read_only" => ToolAnnotations::from_raw(None, Some(true), Some(false), Some(true), None),
        "idempotent" => ToolAnnotations::from_raw(None, Some(false), None, Some(true), None),
        _ => ToolAnnotations::from_raw(None, Some(false), None, Some(false), None),
    };
    Some(Tool::new(tool.name, tool.description, Arc::new(schema)).with_annotations(annotations))
}

/// Follows the call job `job_id` to its end, its progress sent to the
/// client when it asked for it; returns the call's result.
async fn follow(
    api: &mut ApiClient,
    job_id: &str,
    context: &RequestContext<RoleServer>,
) -> Result<CallToolResult, McpError> {
    let mut from_offset = 0;
    let mut replicas_gone = 0;
    // An orchestrator that shuts down ends its streams with UNAVAILABLE:
    // another replica serves the rest (the job runs on regardless, and a
    // client that saw an error would call again: a second job).
    while let Err(status) = watch_to_end(api, job_id, &mut from_offset, context).await {
        replicas_gone += 1;
        if status.code() != Code::Unavailable || replicas_gone > WATCH_RETRIES {
            return Err(api_error("WatchJob", &status));
        }
        tokio::time::sleep(Duration::from_millis(200) * replicas_gone).await;
    }
    let job = api
        .get_job(v1::GetJobRequest {
            job_id: job_id.to_owned(),
        })
        .await
        .map_err(|status| api_error("GetJob", &status))?
        .into_inner();
    Ok(call_result(&job))
}

/// How often a watch that ended with UNAVAILABLE is started again.
const WATCH_RETRIES: u32 = 5;

/// Streams the job's events from `from_offset` (kept past each event
/// seen) to its final one, passing progress on.
async fn watch_to_end(
    api: &mut ApiClient,
    job_id: &str,
    from_offset: &mut u64,
    context: &RequestContext<RoleServer>,
) -> Result<(), tonic::Status> {
    let progress_token = context.meta.get_progress_token();
    let request = v1::WatchJobRequest {
        job_id: job_id.to_owned(),
        from_offset: *from_offset,
    };
    let mut events = api.watch_job(request).await?.into_inner();
    while let Some(event) = events.message().await? {
        *from_offset = event.offset + 1;
        if let (Some(token), "tool_call_progress") = (&progress_token, event.kind.as_str())
            && let Ok(data) = serde_json::from_str::<Value>(&event.data)
            && let Some(progress) = data["progress"].as_f64()
        {
            let mut report = ProgressNotificationParam::new(token.clone(), progress);
            report.total = data["total"].as_f64();
            report.message = data["message"].as_str().map(str::to_owned);
            let _ = context.peer.notify_progress(report).await;
        }
        if event.r#final {
            // The server ends the stream after it: read that end, rather
            // than reset the stream by dropping it (docs/api.md).
            let _ = events.message().await;
            return Ok(());
        }
    }
    Err(tonic::Status::unavailable(
        "the stream ended before the job's end",
    ))
}

/// The MCP result of a finished call job: its envelope's data, or its
/// error (`isError`) as the model would read it.
fn call_result(job: &v1::Job) -> CallToolResult {
    if job.status() != v1::JobStatus::Succeeded {
        let (code, message) = job.error.as_ref().map_or(("JOB_FAILED", ""), |e| {
            (e.code.as_str(), e.message.as_str())
        });
        return CallToolResult::error(vec![ContentBlock::text(format!("{code}: {message}"))]);
    }
    let Ok(envelope) = serde_json::from_str::<Value>(&job.output_text) else {
        return CallToolResult::error(vec![ContentBlock::text("the call's result was unreadable")]);
    };
    if envelope["ok"] == Value::Bool(true) {
        let data = envelope["data"].clone();
        return match data {
            Value::Object(_) => CallToolResult::structured(data),
            other => CallToolResult::success(vec![ContentBlock::text(other.to_string())]),
        };
    }
    let error = &envelope["error"];
    let text = format!(
        "{}: {}",
        error["code"].as_str().unwrap_or("TOOL_EXECUTION_FAILED"),
        error["message"].as_str().unwrap_or_default()
    );
    CallToolResult::error(vec![ContentBlock::text(text)])
}

/// Whether the API refused a submission for a reason the caller's model
/// can act on.
fn is_refusal(code: Code) -> bool {
    matches!(
        code,
        Code::ResourceExhausted | Code::PermissionDenied | Code::InvalidArgument
    )
}

/// A refused submission as an error result.
fn refusal(status: &tonic::Status) -> CallToolResult {
    let text = format!("{:?}: {}", status.code(), excerpt(status.message(), 1_000));
    CallToolResult::error(vec![ContentBlock::text(text)])
}

/// An error of the API as an MCP error: the client's own fault (its
/// token) or the fleet's.
fn api_error(rpc: &str, status: &tonic::Status) -> McpError {
    let message = format!("{rpc}: {}", excerpt(status.message(), 1_000));
    match status.code() {
        Code::Unauthenticated | Code::PermissionDenied | Code::InvalidArgument => {
            McpError::invalid_request(message, None)
        }
        _ => McpError::internal_error(message, None),
    }
}
