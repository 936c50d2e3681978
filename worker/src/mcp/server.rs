//! One MCP server: its process (stdio) or endpoint (Streamable HTTP), the
//! connection to it, and the calls sent over it. A connection found closed
//! is made again at the next use, one attempt at a time.

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::Arc;

use futures::StreamExt;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ClientCapabilities, ClientConfig, Implementation,
    ProtocolVersion, Tool as McpToolInfo,
};
use rmcp::service::RunningService;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use serde_json::Value;
use tokio::process::ChildStderr;
use tokio::sync::{Mutex, Semaphore};
use tokio_util::codec::{FramedRead, LinesCodec};
use toolfleet_proto::envelope::excerpt;
use toolfleet_proto::{Effects, ErrorCode};
use tracing::{debug, info, warn};

use super::config::McpServerOptions;
use super::results;
use crate::tool::ToolError;

/// A live connection to a server.
type Client = RunningService<RoleClient, Handler>;

/// What the worker says of itself to a server, and hears from it.
#[derive(Debug, Clone, Copy, Default)]
struct Handler;

impl ClientHandler for Handler {
    fn get_info(&self) -> ClientConfig {
        // The newest version with an `initialize` handshake, which this
        // worker makes (the stateless 2026-07-28 has none).
        ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("toolfleet-worker", env!("CARGO_PKG_VERSION")),
        )
        .with_protocol_version(ProtocolVersion::LATEST_WITH_INITIALIZE)
    }
}

/// The variables a stdio server inherits from the worker; everything else
/// it gets is configured (`env`). The worker's own environment holds its
/// NATS and Redis credentials, which no tool backend may read.
const INHERITED: [&str; 5] = ["PATH", "HOME", "LANG", "LC_ALL", "TZ"];

/// Longest line of a server's stderr that is logged, in characters.
const STDERR_LINE_CHARS: usize = 1_000;

/// An MCP server the worker serves tools of.
pub struct McpServer {
    options: McpServerOptions,
    /// The connection, when one was made and has not closed.
    connection: Mutex<Option<Arc<Client>>>,
    /// Calls in flight to it, at most `concurrency`.
    slots: Semaphore,
}

impl McpServer {
    /// The server of `options`, not connected yet.
    pub fn new(options: McpServerOptions) -> Arc<Self> {
        let slots = Semaphore::new(options.concurrency);
        Arc::new(Self {
            options,
            connection: Mutex::new(None),
            slots,
        })
    }

    /// Its settings.
    pub fn options(&self) -> &McpServerOptions {
        &self.options
    }

    /// Its tools, every page of `tools/list`.
    ///
    /// # Errors
    ///
    /// Why the server could not be reached or listed.
    pub async fn list_tools(&self) -> Result<Vec<McpToolInfo>, String> {
        let client = self.client().await?;
        let listed = tokio::time::timeout(self.options.connect_timeout, client.list_all_tools())
            .await
            .map_err(|_| "tools/list timed out".to_owned())?;
        listed.map_err(|err| format!("tools/list failed: {err}"))
    }

    /// Calls its tool `mcp_name` with `args`, for a tool with `effects`.
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
        let client = self.client().await.map_err(|why| {
            warn!(
                server,
                why, "MCP server not reachable; the call was not sent"
            );
            results::not_running(server)
        })?;
        let params = CallToolRequestParams::new(mcp_name.to_owned()).with_arguments(arguments);
        // Dropped (a timeout, a drain), the request is cancelled on the
        // server with `notifications/cancelled`.
        match client.call_tool_once(params).await {
            Ok(CallToolResponse::Complete(result)) => results::outcome(result),
            Ok(CallToolResponse::InputRequired(_)) => Err(ToolError::terminal(
                results::INPUT_REQUIRED,
                "the tool asked for more input, which a call through the fleet cannot give; \
                 call it with everything it needs in its arguments",
            )),
            Ok(_) => Err(ToolError::terminal(
                ErrorCode::TOOL_EXECUTION_FAILED,
                format!(
                    "the MCP server {server} answered with a task, which the fleet does not follow"
                ),
            )),
            Err(err) => {
                debug!(server, error = %err, "MCP call failed");
                Err(results::failure(server, &err, effects))
            }
        }
    }

    /// The live connection, made again if the last one closed.
    async fn client(&self) -> Result<Arc<Client>, String> {
        let mut connection = self.connection.lock().await;
        // A server that died leaves `is_closed` false: its transport tells.
        let live = |client: &&Arc<Client>| !client.is_closed() && !client.is_transport_closed();
        if let Some(client) = connection.as_ref().filter(live) {
            return Ok(client.clone());
        }
        let client = Arc::new(self.connect().await?);
        *connection = Some(client.clone());
        Ok(client)
    }

    /// Starts or reaches the server and makes the handshake, within
    /// `connect_timeout`.
    async fn connect(&self) -> Result<Client, String> {
        let server = &self.options.name;
        let handshake = async {
            match (&self.options.command, &self.options.url) {
                (Some(command), _) => {
                    let process = self.spawn(command)?;
                    Handler
                        .serve(process)
                        .await
                        .map_err(|e| format!("handshake failed: {e}"))
                }
                (None, Some(url)) => {
                    let transport = self.dial(url)?;
                    Handler
                        .serve(transport)
                        .await
                        .map_err(|e| format!("handshake failed: {e}"))
                }
                (None, None) => Err("neither command nor url".to_owned()),
            }
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
        Ok(client)
    }

    /// Starts the stdio server: its command in a minimal environment
    /// ([`INHERITED`] and `env`), its stderr logged line by line.
    fn spawn(&self, command: &str) -> Result<TokioChildProcess, String> {
        let mut program = tokio::process::Command::new(command);
        // Killed with the worker should rmcp's own shutdown not run.
        program
            .args(&self.options.args)
            .env_clear()
            .kill_on_drop(true);
        for name in INHERITED {
            if let Some(value) = std::env::var_os(name) {
                program.env(name, value);
            }
        }
        for (name, value) in &self.options.env {
            program.env(name, value.read()?);
        }
        if let Some(cwd) = &self.options.cwd {
            program.current_dir(cwd);
        }
        let (process, stderr) = TokioChildProcess::builder(program)
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start {command:?}: {e}"))?;
        if let Some(stderr) = stderr {
            tokio::spawn(log_stderr(self.options.name.clone(), stderr));
        }
        Ok(process)
    }

    /// The Streamable HTTP transport to `url`, with the configured headers.
    fn dial(&self, url: &str) -> Result<StreamableHttpClientTransport<reqwest::Client>, String> {
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
        let config =
            StreamableHttpClientTransportConfig::with_uri(url.to_owned()).custom_headers(headers);
        Ok(StreamableHttpClientTransport::with_client(client, config))
    }
}

/// Logs a stdio server's stderr, a bounded line at a time, until it closes.
async fn log_stderr(server: String, stderr: ChildStderr) {
    let mut lines = FramedRead::new(stderr, LinesCodec::new_with_max_length(16 * 1024));
    while let Some(line) = lines.next().await {
        match line {
            Ok(line) => info!(
                server,
                line = excerpt(&line, STDERR_LINE_CHARS),
                "MCP server stderr"
            ),
            // Too long a line, or not UTF-8: said once, then skipped.
            Err(err) => debug!(server, error = %err, "MCP server stderr unreadable"),
        }
    }
}
